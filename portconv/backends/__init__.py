"""The backend interface, the enum of backend ids and the lazy registry (no vendor module is imported here)."""
from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import ClassVar, Protocol

from ..device import Availability, DeviceInfo
from ..knobs import Options
from ..problem import Problem
from .program import KernelPlan


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
class Choice:
    """What a backend would do with a problem: its algorithm, the memory format it computes in, and why."""

    algorithm: str
    memory_format: str  # 'contiguous', 'channels_last', 'channels_last_3d'
    reason: str
    math: str = "ieee"  # 'ieee', 'tf32', 'fp32-accumulate' ... (the conformance tolerance reads it)


class Runner(Protocol):
    """A plan's calls: aten::convolution and aten::convolution_backward on its problem.

    ``aten_autograd`` (Note [ATen-recorded plans]): forward is made of differentiable ATen calls whose recorded
    backward is exactly backward() (the same ATen call with the same arguments), so eager autograd may record
    forward as it is, at PyTorch's own host cost, instead of through portconv's autograd.Function.
    ``native``: the native executor's Runner that runs the calls instead, once the plan has one (ProgramRunner only:
    Note [native executor]).
    """

    aten_autograd: bool = False
    native = None

    def forward(self, input, weight, bias):
        """The output, in the caller's tensor type."""

    def backward(self, grad_output, input, weight, output_mask):
        """(grad_input, grad_weight, grad_bias), None where the mask is False."""


class Backend:
    """A backend: probe, device_for, choose, prepare. Subclasses import their vendor modules lazily."""

    id: ClassVar[BackendId]
    pip_hint: ClassVar[str] = ""

    def probe(self) -> Availability:
        """Is the runtime present at all (modules, driver, a device)? Never raises."""
        raise NotImplementedError

    def device_for(self, problem: Problem) -> DeviceInfo:
        """The device that would run ``problem``; raises Unsupported with the reason if none."""
        raise NotImplementedError

    def choose(self, problem: Problem, device: DeviceInfo, options: Options) -> Choice:
        """The kernel family for ``problem`` on ``device``, its result layout, math and one-line reason; raises
        Unsupported(reason) when it cannot run it. Pure in its arguments and the torch flags of the plan's key."""
        raise NotImplementedError

    def prepare(self, problem: Problem, device: DeviceInfo, choice: Choice,
                options: Options) -> tuple[tuple[KernelPlan, ...], Runner]:
        """What the plan runs (a KernelPlan per result, for the layouts the problem implies) and the Runner that
        runs its calls. Decides everything the calls need; the Runner only binds tensors and launches."""
        raise NotImplementedError

    def devices(self) -> list[DeviceInfo]:
        """Every device this backend can run on (for ``portconv devices``)."""
        return []


_REGISTRY = {
    BackendId.OPENCL: "portconv.backends.opencl:OpenCLBackend",
    BackendId.CUDA: "portconv.backends.simt.cuda:CudaBackend",
    BackendId.HIP: "portconv.backends.simt.hip:HipBackend",
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


def unavailable(name: BackendId | str) -> str:
    """"backend 'NAME' is unavailable: why" when the named backend's probe says no, else ''; ValueError for a name
    that is not a backend (the CLI's exit 3 and 2)."""
    avail = get(name).probe()
    return "" if avail else f"backend '{BackendId.parse(name)}' is unavailable: {avail.reason}"
