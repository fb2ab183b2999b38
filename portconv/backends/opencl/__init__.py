"""The opencl backend: portconv's OpenCL kernel set (opencl/*.cl) on any OpenCL device, PoCL on the CPU included."""
from __future__ import annotations

from ... import knobs
from ...device import Availability, DeviceInfo
from ...errors import Unsupported
from ...knobs import Options
from ...problem import Problem
from .. import Backend, BackendId, Choice
from ..program import KernelPlan, ProgramRunner
from . import runtime
from .launch import Loader
from .select import Facts, build, implied_layouts, wants_tf32
from .select import choose as choose_pure

__all__ = ["OpenCLBackend"]


class OpenCLBackend(Backend):
    """probe, device_for and devices read the OpenCL runtime; choose and prepare are select.py's pure functions."""

    id = BackendId.OPENCL
    pip_hint = runtime.PIP_HINT

    def probe(self) -> Availability:
        return runtime.select(knobs.env().opencl_device)[0]

    def device_for(self, problem: Problem) -> DeviceInfo:
        ispec, wspec = problem.input, problem.weight
        for name, spec in (("input", ispec), ("weight", wspec)):
            if spec.kind == "torch" and spec.device_type != "cpu" or spec.kind not in ("torch", "pyopencl"):
                where = f"{spec.kind} arrays" if spec.kind != "torch" else f"tensors on {spec.device}"
                raise Unsupported(f"the OpenCL backend takes CPU tensors or pyopencl arrays (the {name} is {where})")
        if ispec.kind != wspec.kind:
            raise Unsupported(f"the input is a {ispec.kind} {'array' if ispec.kind == 'pyopencl' else 'tensor'} "
                              f"but the weight is a {wspec.kind} one; pass both as the same type")
        if ispec.kind == "pyopencl" and ispec.device_index is not None and ispec.device_index >= 0:
            return runtime.info_of_flat(ispec.device_index)
        return runtime.info(*runtime.default_index())

    def choose(self, problem: Problem, device: DeviceInfo, options: Options) -> Choice:
        return choose_pure(problem, device, options, facts(problem, device, options))

    def prepare(self, problem: Problem, device: DeviceInfo, choice: Choice,
                options: Options) -> tuple[tuple[KernelPlan, ...], ProgramRunner]:
        fwd, bwd = implied_layouts(problem, choice.memory_format)
        kernels = (build(problem, device, options, choice, "forward", (), fwd)
                   + build(problem, device, options, choice, "backward", (True, True, problem.has_bias), bwd))
        loader = Loader(problem, device, options, choice)
        return kernels, ProgramRunner(loader.build, loader)

    def devices(self) -> list[DeviceInfo]:
        if not self.probe() and runtime.select(None)[1] is None:
            return []
        return [runtime.info(p, d) for p, d, _ in runtime.all_devices()]


def facts(problem: Problem, device: DeviceInfo, options: Options) -> Facts:
    """What choose() reads of torch: the CPU route's context for torch tensors' result layout, the TF32 rule."""
    if problem.input.kind != "torch" and not wants_tf32(problem, device, options):
        return Facts()
    import torch

    from ...rules import TorchContext, conv_tf32

    ctx = TorchContext.from_torch("cpu") if problem.input.kind == "torch" else None
    return Facts(ctx, conv_tf32(torch) if wants_tf32(problem, device, options) else Facts.tf32)
