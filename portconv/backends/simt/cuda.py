"""The cuda backend: portconv's CUDA kernel set (cuda/*.cu) by NVRTC, on torch CUDA tensors and CuPy arrays."""
from __future__ import annotations

from ... import rules
from ...device import Availability, DeviceInfo
from ...errors import BackendUnavailable, Unsupported, VendorImportError
from ...knobs import Options
from ...problem import Problem
from .. import BackendId, Choice
from . import base, compile, nvidia, runtime


class CudaBackend(base.SimtBackend):
    """portconv's own CUDA kernels."""

    id = BackendId.CUDA
    pip_hint = compile.CUDA_PIP_HINT
    kernel_set_name = "CUDA"

    def kernels(self) -> compile.KernelSet:
        if self._kernels is None:
            self._kernels = compile.KernelSet(pip_hint=self.pip_hint)
        return self._kernels

    def probe(self) -> Availability:
        try:
            if compile.platform(self.pip_hint) == "amd":
                return Availability.no("this machine's GPU runtime is ROCm: AMD GPUs are the hip backend's")
        except (VendorImportError, BackendUnavailable) as e:  # BackendUnavailable: a forked child (Note [fork])
            return Availability.no(str(e))
        ok, text = nvidia.availability()
        return Availability.yes(text) if ok else Availability.no(text)

    def device_for(self, problem: Problem) -> DeviceInfo:
        base.gpu_tensors(problem, "CUDA", "CUDA tensors and CuPy arrays")
        spec = problem.input
        if spec.kind == "cupy":
            return runtime.device_info("cupy", spec.device_index or 0)
        import torch

        if getattr(torch.version, "hip", None):
            raise Unsupported("this PyTorch is built for ROCm: its 'cuda' tensors are AMD GPU memory (hip backend)")
        return runtime.device_info("torch", spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo, options: Options) -> Choice:
        if device.vendor != "nvidia":
            raise Unsupported(f"the cuda backend runs on NVIDIA GPUs, not {device.vendor} ({device.name})")
        tf32 = (False, "")
        if problem.dtype == "float32" and problem.input.kind == "torch":  # Note [TF32 policy]
            import torch

            tf32 = rules.conv_tf32(torch)
        return self.choose_for(problem, device, options, tf32)
