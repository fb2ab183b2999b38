"""What the cuda and hip backends share: prepare() (the plan's KernelPlans and its ProgramRunner) and the context."""
from __future__ import annotations

from typing import ClassVar

from ... import rules
from ...device import DeviceInfo
from ...errors import Unsupported
from ...knobs import Options
from ...problem import Layout, Problem
from ...tensors import dense_strides
from ...validate import is_empty_problem
from .. import Backend, Choice
from ..program import EmptyRunner, KernelPlan, ProgramRunner, empty_kernels
from . import select


class SimtBackend(Backend):
    """A backend of the simt kernel set; a subclass names its kernel set, entry files, vendor checks and loader."""

    kernel_set_name: ClassVar[str] = "CUDA"
    entries: ClassVar[dict] = select.ENTRY
    dependent_waits: ClassVar[bool] = True  # Note [dependent launch]: the prelude's pc_grid_dependency_wait waits

    def __init__(self):
        self._kernels = None

    def kernels(self):
        """The kernel set (compiled modules, cached in memory and on disk)."""
        raise NotImplementedError

    def devices(self) -> list[DeviceInfo]:
        if not self.probe():
            return []
        from . import compile, runtime

        torch = compile.torch_with_gpu()
        if torch is not None:  # Note [ctypes toolchain]: torch describes its GPUs, no CuPy
            return [runtime.device_info("torch", i) for i in range(torch.cuda.device_count())]
        cupy = compile.import_cupy(self.pip_hint)
        return [runtime.device_info("cupy", i) for i in range(cupy.cuda.runtime.getDeviceCount())]

    def loader(self, problem: Problem):
        """The program.Loader of this problem's tensors (torch tensors or CuPy arrays)."""
        from .runtime import Loader

        return Loader(self.kernels(), "cupy" if problem.input.kind == "cupy" else "torch")

    def context(self, problem: Problem, device: DeviceInfo) -> rules.TorchContext:
        """The torch context of the result-layout rule (Note [own kernels' result layout]): read from torch for torch
        tensors on AMD (MIOpen's rule reads its NHWC setting), a default one otherwise (cuDNN's rule reads none)."""
        amd = device.vendor == "amd"
        if amd and problem.input.kind == "torch":
            return rules.TorchContext.from_torch(problem.input.device)
        return rules.TorchContext(device_type="cuda", is_hip=amd)

    def choose_for(self, problem: Problem, device: DeviceInfo, options: Options,
                   tf32: tuple[bool, str] = (False, "")) -> Choice:
        return select.choose(problem, device, options, self.context(problem, device), self.kernel_set_name, tf32)

    def prepare(self, problem: Problem, device: DeviceInfo, choice: Choice,
                options: Options) -> tuple[tuple[KernelPlan, ...], ProgramRunner | EmptyRunner]:
        if is_empty_problem(problem):
            return empty_kernels(problem), EmptyRunner(problem)
        entries = self.entries

        def build(call: str, mask: tuple, layouts: tuple) -> tuple[KernelPlan, ...]:
            return select.build(problem, device, options, choice, entries, call, mask, layouts,
                                self.dependent_waits)

        kernels = implied_plans(problem, choice, build)
        return kernels, ProgramRunner(build, self.loader(problem), ahead=kernels)


def implied_plans(problem: Problem, choice: Choice, build) -> tuple[KernelPlan, ...]:
    """The KernelPlans of the layouts the problem implies: inputs as described, a dense bias, grad_output dense in the
    result format, aligned addresses; the bias gradient where the problem has a bias."""
    x = Layout(problem.input.shape, problem.input.strides)
    w = Layout(problem.weight.shape, problem.weight.strides)
    bias = Layout((problem.bias_size,), (1,)) if problem.has_bias else None
    out = problem.output_shape
    go = Layout(out, dense_strides(out, choice.memory_format))
    return build("forward", (), (x, w, bias)) + build("backward", (True, True, problem.has_bias), (go, x, w))


def gpu_tensors(problem: Problem, kernel_set: str, what: str) -> None:
    """Raise Unsupported unless the problem's tensors are GPU tensors: torch 'cuda' tensors or CuPy arrays."""
    spec = problem.input
    if spec.kind == "cupy" or (spec.kind == "torch" and spec.device_type == "cuda"):
        return
    raise Unsupported(f"portconv's {kernel_set} kernels take {what}, not {spec.kind} data on {spec.device}")
