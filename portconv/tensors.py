"""TensorSpec: what the planner knows of a tensor (shape, strides, dtype, device), read without vendor imports."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

# numpy/cupy/pyopencl dtype names -> torch dtype names (the names portconv uses everywhere)
_NUMPY_TO_TORCH = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
                   "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
                   "bool": "bool", "complex64": "complex64", "complex128": "complex128"}
FLOATING = ("float32", "float64", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str  # torch dtype name without the 'torch.' prefix
    device_type: str  # 'cpu', 'cuda', 'opencl', 'mps', 'xpu', 'meta', ...
    device_index: int | None = None
    kind: str = "torch"  # 'torch', 'pyopencl', 'cupy'

    @property
    def dim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def device(self) -> str:
        return self.device_type if self.device_index is None else f"{self.device_type}:{self.device_index}"

    @property
    def memory_format(self) -> str:
        """c10 ``suggest_memory_format``: 'channels_last', 'channels_last_3d' or 'contiguous'."""
        return suggest_memory_format(self.shape, self.strides)

    def is_contiguous(self, memory_format: str = "contiguous") -> bool:
        """torch.Tensor.is_contiguous: strides of size-1 dims are ignored; an empty tensor is contiguous."""
        return is_contiguous(self.shape, self.strides, memory_format)

    def with_shape(self, shape: Sequence[int], strides: Sequence[int] | None = None) -> TensorSpec:
        shape = tuple(shape)
        return dataclasses.replace(self, shape=shape, strides=tuple(strides or dense_strides(shape)))


def _dim_order(n: int, memory_format: str) -> list[int]:
    if memory_format in ("channels_last", "channels_last_3d") and n >= 3:
        return [0] + list(range(2, n)) + [1]  # outermost first, C innermost
    return list(range(n))


def dense_strides(shape: Sequence[int], memory_format: str = "contiguous") -> tuple[int, ...]:
    """The strides torch gives a new tensor of ``shape`` in ``memory_format`` (channels-last puts C innermost).

    Contiguous strides treat a size-0 dim as 1; channels-last strides do not (c10 get_channels_last_strides_2d:
    ``torch.empty(2, 0, 3, 3, memory_format=torch.channels_last).stride() == (0, 1, 0, 0)``).
    """
    n = len(shape)
    channels_last = memory_format in ("channels_last", "channels_last_3d") and n >= 3
    strides = [0] * n
    acc = 1
    for d in reversed(_dim_order(n, memory_format)):
        strides[d] = acc
        acc *= shape[d] if channels_last else max(shape[d], 1)
    return tuple(strides)


def is_contiguous(shape: Sequence[int], strides: Sequence[int], memory_format: str = "contiguous") -> bool:
    """c10 compute_contiguous / compute_channels_last_contiguous_2d/3d (size-1 dims may have any stride)."""
    if memory_format == "contiguous" and any(s == 0 for s in shape):
        return True
    expected = 1
    for d in reversed(_dim_order(len(shape), memory_format)):
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def _strides_like_channels_last(sizes: Sequence[int], strides: Sequence[int], order: Sequence[int]) -> bool:
    # c10/core/MemoryFormat.h is_channels_last_strides_2d_s4 / _3d_s5
    if strides[1] == 0:
        return False
    lo = 0
    for d in order:
        if sizes[d] == 0 or strides[d] < lo:
            return False
        if d == 0 and lo == strides[1]:
            return False
        lo = strides[d]
        if sizes[d] > 1:
            lo *= sizes[d]
    return True


def suggest_memory_format(shape: Sequence[int], strides: Sequence[int]) -> str:
    if len(shape) == 4 and _strides_like_channels_last(shape, strides, (1, 3, 2, 0)):
        return "channels_last"
    if len(shape) == 5 and _strides_like_channels_last(shape, strides, (1, 4, 3, 2, 0)):
        return "channels_last_3d"
    return "contiguous"


def torch_dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


ARRAY_DEVICE_TYPES = {"pyopencl": "opencl", "cupy": "cuda"}  # TensorSpec.device_type of each array kind
KINDS = ("torch", "pyopencl", "cupy")


def kind_of(x) -> str | None:
    """'torch', 'pyopencl' or 'cupy' by the object's defining package (no import of any of them); None otherwise.
    The one test of what a tensor is: every module asks this."""
    kind = (type(x).__module__ or "").partition(".")[0]
    return kind if kind in KINDS else None


def is_torch(x) -> bool:
    return kind_of(x) == "torch"


def _opencl_device(x):
    """A pyopencl array's device: its queue's, else its context's first (pyopencl is loaded: x is an array)."""
    return x.queue.device if x.queue is not None else x.context.devices[0]


def _opencl_index(x) -> int:
    """A pyopencl array's device as its position among all OpenCL devices."""
    from .device import opencl_flat_index

    return opencl_flat_index(_opencl_device(x))


def array_key(x) -> tuple | None:
    """Everything spec_of reads of a pyopencl or cupy array, hashable and cheap (Note [fast path] in functional.py):
    (kind, type, shape, byte strides, dtype, the device's OpenCL handle or CUDA ordinal); None for anything else."""
    kind = kind_of(x)
    if kind == "pyopencl":
        return kind, type(x), x.shape, x.strides, x.dtype, _opencl_device(x).int_ptr
    if kind == "cupy":
        return kind, type(x), x.shape, x.strides, x.dtype, x.device.id
    return None


def spec_of(x) -> TensorSpec:
    """Describe a torch tensor, pyopencl array or cupy array; raises TypeError for anything else."""
    kind = kind_of(x)
    if kind == "torch":
        dev = x.device
        return TensorSpec(tuple(x.shape), tuple(x.stride()), torch_dtype_name(x.dtype), dev.type, dev.index, "torch")
    if kind == "pyopencl":
        item = x.dtype.itemsize
        dt = _NUMPY_TO_TORCH.get(x.dtype.name, x.dtype.name)
        return TensorSpec(tuple(x.shape), tuple(s // item for s in x.strides), dt, ARRAY_DEVICE_TYPES["pyopencl"],
                          _opencl_index(x), "pyopencl")
    if kind == "cupy":
        item = x.dtype.itemsize
        dt = _NUMPY_TO_TORCH.get(x.dtype.name, x.dtype.name)
        return TensorSpec(tuple(x.shape), tuple(s // item for s in x.strides), dt, ARRAY_DEVICE_TYPES["cupy"],
                          x.device.id, "cupy")
    raise TypeError(f"portconv takes torch tensors, pyopencl arrays or cupy arrays, not {type(x).__name__}")
