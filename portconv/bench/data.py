"""Benchmark data: rotated sets of fresh random tensors in a row's layout, as torch tensors or pyopencl arrays."""
from __future__ import annotations

import dataclasses
import math
import zlib

from ..conformance.cases import Case
from ..errors import Unsupported
from ..tensors import dense_strides
from .roofline import ITEMSIZE

ALIGN_BYTES = 512  # every tensor of a set starts on this boundary (as torch's caching allocator gives)
ROLES = ("input", "weight", "bias", "grad_output")


@dataclasses.dataclass(frozen=True)
class View:
    """One tensor inside a flat buffer: shape, element strides, element offset from the tensor's slot start."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage: int  # elements the slot needs


def layout_view(shape: tuple[int, ...], layout: str) -> View:
    """The conformance suite's layouts: contiguous, channels-last for any rank, or a strided view with an offset.

    'strided' (as portconv.conformance.reference): batch and channels swapped in storage, the last dim stepped by 2,
    storage offset 1; a 1-D tensor takes every other element from offset 1.
    """
    n = math.prod(shape)
    if layout == "contig" or (layout == "chlast" and len(shape) < 3):
        return View(shape, dense_strides(shape), 0, n)
    if layout == "chlast":
        order = [0, *range(2, len(shape)), 1]  # storage (N, *spatial, C)
        strides = [0] * len(shape)
        acc = 1
        for d in reversed(order):
            strides[d] = acc
            acc *= shape[d]
        return View(shape, tuple(strides), 0, n)
    if layout == "strided":
        if len(shape) == 1:
            return View(shape, (2,), 1, 2 * shape[0] + 1)
        buf = (shape[1], shape[0], *shape[2:-1], 2 * shape[-1] + 1)
        bs = dense_strides(buf)
        return View(shape, (bs[1], bs[0], *bs[2:-1], 2 * bs[-1]), 1, math.prod(buf))
    raise ValueError(f"unknown layout {layout!r}")


@dataclasses.dataclass
class Layout:
    """Where each role's tensor lies in set i of one flat buffer (element offsets)."""

    views: dict[str, View]
    slots: dict[str, int]  # role -> element offset of its slot inside a set
    set_elems: int
    dtype: str

    @property
    def set_bytes(self) -> int:
        return self.set_elems * ITEMSIZE[self.dtype]

    def start(self, role: str, index: int) -> int:
        return index * self.set_elems + self.slots[role] + self.views[role].offset


def plan_layout(case: Case, dtype: str) -> Layout:
    item = ITEMSIZE[dtype]
    align = ALIGN_BYTES // item
    shapes = {"input": case.input_shape, "weight": case.weight_shape, "bias": (case.k,) if case.bias else None,
              "grad_output": case.output_shape}
    views, slots, pos = {}, {}, 0
    for role in ROLES:
        if shapes[role] is None:
            continue
        v = layout_view(tuple(shapes[role]), case.layout)
        views[role], slots[role] = v, pos
        pos += -(-v.storage // align) * align
    return Layout(views, slots, pos, dtype)


def row_seed(name: str, seed: int) -> int:
    return (zlib.crc32(name.encode()) + 1_000_003 * seed) % (2**63)


def host_random(layout: Layout, sets: int, seed: int):
    """A flat CPU tensor of ``sets`` sets, uniform in [-1, 1) (fresh random data, never zeros)."""
    import torch

    from ..conformance.reference import torch_dtype

    gen = torch.Generator().manual_seed(seed)
    return torch.empty(layout.set_elems * sets, dtype=torch_dtype(layout.dtype)).uniform_(-1, 1, generator=gen)


@dataclasses.dataclass
class BufferSet:
    input: object
    weight: object
    bias: object
    grad_output: object


def torch_sets(layout: Layout, flat, sets: int, device) -> list[BufferSet]:
    """Views into one device copy of the first ``sets`` sets of ``flat``."""
    dev = flat[: layout.set_elems * sets].to(device)

    def view(role, i):
        if role not in layout.views:
            return None
        v = layout.views[role]
        return dev.as_strided(v.shape, v.strides, layout.start(role, i))

    return [BufferSet(*(view(r, i) for r in ROLES)) for i in range(sets)]


def numpy_dtype(dtype: str):
    import numpy as np

    if dtype != "bfloat16":
        return np.dtype(dtype)
    try:
        import ml_dtypes
    except ImportError:
        raise Unsupported("bfloat16 pyopencl arrays need numpy's bfloat16 from the ml_dtypes package "
                          "(pip install ml_dtypes); without it the OpenCL kernels cannot be timed on device "
                          "arrays") from None
    return np.dtype(ml_dtypes.bfloat16)


def _numpy_bits(flat):
    import torch

    return (flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat).numpy()


def opencl_sets(layout: Layout, flat, sets: int, queue) -> list[BufferSet]:
    """pyopencl arrays (views of one device buffer) over the first ``sets`` sets of ``flat``."""
    import pyopencl as cl
    import pyopencl.array as cla

    dt = numpy_dtype(layout.dtype)
    item = dt.itemsize
    host = _numpy_bits(flat[: layout.set_elems * sets].contiguous())
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)

    def view(role, i):
        if role not in layout.views:
            return None
        v = layout.views[role]
        return cla.Array(queue, v.shape, dt, data=buf, offset=layout.start(role, i) * item,
                         strides=tuple(s * item for s in v.strides))

    queue.finish()
    return [BufferSet(*(view(r, i) for r in ROLES)) for i in range(sets)]


def to_torch(x, device=None):
    """A torch tensor with the values of a torch tensor or pyopencl array (copied for arrays)."""
    import torch

    if (type(x).__module__ or "").startswith("torch"):
        return x if device is None else x.to(device)
    import numpy as np
    import pyopencl as cl

    from ..conformance.reference import torch_dtype
    from ..tensors import spec_of

    spec = spec_of(x)
    item = x.dtype.itemsize
    base = x.offset // item
    span = base + 1 + sum((s - 1) * st for s, st in zip(spec.shape, spec.strides) if s > 0)
    host = np.empty(span * item, dtype=np.uint8)
    cl.enqueue_copy(x.queue, host, x.base_data, is_blocking=True)  # the whole span from the buffer's start
    raw = torch.frombuffer(bytearray(host.tobytes()), dtype=torch.uint8)
    flat = raw.view(torch_dtype(spec.dtype))
    t = flat.as_strided(spec.shape, spec.strides, base).clone()
    return t if device is None else t.to(device)
