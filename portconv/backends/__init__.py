"""The backend interface, the enum of backend ids and the lazy registry (no vendor module is imported here)."""
from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import ClassVar

from ..device import Availability, DeviceInfo
from ..params import ConvParams
from ..tensors import TensorSpec


class BackendId(str, enum.Enum):
    OPENCL = "opencl"  # portconv's OpenCL kernel set (opencl/*.cl), PoCL on the CPU included
    CUDA = "cuda"  # portconv's CUDA kernel set (cuda/*.cu) through CuPy/NVRTC
    HIP = "hip"  # portconv's HIP kernel set (hip/*.hip): hiprtc on AMD, NVRTC through the HIP->CUDA prelude on NVIDIA
    CUDNN = "cudnn"  # cuDNN reached through PyTorch
    MIOPEN = "miopen"  # MIOpen reached through PyTorch for ROCm
    ATEN = "aten"  # PyTorch's own convolution on the tensors' device (whatever ATen picks)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: str | BackendId) -> BackendId:
        try:
            return cls(str(name).lower())
        except ValueError:
            raise ValueError(f"unknown portconv backend {name!r}; known: {', '.join(b.value for b in cls)}") from None


@dataclasses.dataclass(frozen=True)
class Problem:
    """One convolution problem as the planner sees it: parameters plus tensor descriptions."""

    params: ConvParams
    input: TensorSpec  # batched (N, C, *spatial)
    weight: TensorSpec
    has_bias: bool

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.params.output_shape(self.input.shape, self.weight.shape)

    @property
    def dtype(self) -> str:
        return self.input.dtype

    @property
    def is_depthwise(self) -> bool:
        return self.params.is_depthwise(self.input.shape, self.weight.shape)

    def describe(self) -> str:
        return (f"input {list(self.input.shape)} {self.input.dtype} {self.input.memory_format} on {self.input.device}, "
                f"weight {list(self.weight.shape)}, bias={'yes' if self.has_bias else 'no'}, {self.params.describe()}")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a backend would do with a problem: its algorithm, the memory format it computes in, and why."""

    algorithm: str
    memory_format: str  # 'contiguous', 'channels_last', 'channels_last_3d'
    reason: str
    math: str = "ieee"  # 'ieee', 'tf32', 'fp32-accumulate' ... (the conformance tolerance reads it)


class Backend:
    """A backend: probe, choose, forward, backward. Subclasses import their vendor modules lazily."""

    id: ClassVar[BackendId]
    pip_hint: ClassVar[str] = ""

    def probe(self) -> Availability:
        """Is the runtime present at all (modules, driver, a device)? Never raises."""
        raise NotImplementedError

    def device_for(self, problem: Problem) -> DeviceInfo:
        """The device that would run ``problem``; raises Unsupported with the reason if none."""
        raise NotImplementedError

    def choose(self, problem: Problem, device: DeviceInfo) -> Choice:
        """The algorithm for ``problem`` on ``device``; raises Unsupported(reason) when it cannot run it."""
        raise NotImplementedError

    def forward(self, plan, input, weight, bias):
        """aten::convolution for the plan's problem; returns the output in the caller's tensor type."""
        raise NotImplementedError

    def backward(self, plan, grad_output, input, weight, output_mask):
        """aten::convolution_backward; returns (grad_input, grad_weight, grad_bias), None where the mask is False."""
        raise NotImplementedError

    def devices(self) -> list[DeviceInfo]:
        """Every device this backend can run on (for ``portconv devices``)."""
        return []


_REGISTRY = {
    BackendId.OPENCL: "portconv.backends.opencl:OpenCLBackend",
    BackendId.CUDA: "portconv.backends.cuda:CudaBackend",
    BackendId.HIP: "portconv.backends.hip:HipBackend",
    BackendId.CUDNN: "portconv.backends.cudnn:CudnnBackend",
    BackendId.MIOPEN: "portconv.backends.miopen:MiopenBackend",
    BackendId.ATEN: "portconv.backends.aten:AtenBackend",
}
_INSTANCES: dict[BackendId, Backend] = {}


class _Missing(Backend):
    """Stands in for a backend whose module is not written or fails to import; its probe says why."""

    def __init__(self, bid: BackendId, why: str):
        self.id = bid  # type: ignore[misc]
        self._why = why

    def probe(self) -> Availability:
        return Availability.no(self._why)


def get(bid: BackendId | str) -> Backend:
    bid = BackendId.parse(bid)
    if bid not in _INSTANCES:
        mod_name, cls_name = _REGISTRY[bid].split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                _INSTANCES[bid] = _Missing(bid, f"the {bid} backend is not part of this portconv build")
                return _INSTANCES[bid]
            raise
        _INSTANCES[bid] = getattr(mod, cls_name)()
    return _INSTANCES[bid]


def all_ids() -> list[BackendId]:
    return list(BackendId)
