"""The miopen backend: MIOpen reached through PyTorch for ROCm (aten.miopen_* ops and convolution_backward)."""
from __future__ import annotations

import dataclasses
import os

from ..device import Availability, DeviceInfo
from ..errors import Unsupported
from ..problem import Problem
from . import Backend, BackendId, Choice
from .torchlib import library_kernels, pad_extra, torch_format, unpad

MIOPEN_DTYPES = ("float32", "float16", "bfloat16")
_MIOPEN_BACKENDS = {"Miopen": "miopen_convolution", "MiopenDepthwise": "miopen_depthwise_convolution",
                    "MiopenTranspose": "miopen_convolution_transpose"}

# Note [MIOpen knobs]: MIOpen reads these itself (PyTorch passes none of them through), so portconv only reports
# them: `portconv devices` prints miopen_settings(), docs/kernels/hip.md explains them.
MIOPEN_VARIABLES = {
    "MIOPEN_FIND_MODE": ("how MIOpen's Find picks a solution: NORMAL/1 (full benchmark), FAST/2 (find-db, else "
                         "immediate fallback), HYBRID/3, DYNAMIC_HYBRID/5 (MIOpen's default)"),
    "MIOPEN_FIND_ENFORCE": "NONE/1, DB_UPDATE/2, SEARCH/3, SEARCH_DB_UPDATE/4, DB_CLEAN/5: tuning behaviour",
    "MIOPEN_USER_DB_PATH": "directory of the user find-db and perf-db (default ~/.config/miopen/)",
    "MIOPEN_CUSTOM_CACHE_DIR": "directory of compiled kernel binaries (default ~/.cache/miopen/)",
    "MIOPEN_DISABLE_CACHE": "1: never keep compiled kernels on disk (every process compiles again)",
    "MIOPEN_ENABLE_LOGGING_CMD": "1: log each convolution as an MIOpenDriver command line",
    "MIOPEN_LOG_LEVEL": "0-7: MIOpen's log verbosity (5 shows the chosen solvers)",
    "PYTORCH_MIOPEN_SUGGEST_NHWC": "1/0: PyTorch hands MIOpen channels-last tensors (NHWC) or not (see rules)",
}


def miopen_settings() -> list[tuple[str, str, str]]:
    """(name, value or '(unset)', meaning) of every MIOpen knob, plus PyTorch's MIOpen flags when torch is ROCm."""
    rows = [(k, os.environ.get(k, "(unset)"), v) for k, v in MIOPEN_VARIABLES.items()]
    import torch

    mi = getattr(torch.backends, "miopen", None)
    if mi is not None and hasattr(mi, "immediate"):
        rows.append(("torch.backends.miopen.immediate", str(bool(mi.immediate)),
                     "True: PyTorch asks MIOpen for its immediate-mode solution instead of running Find"))
    rows.append(("torch.backends.cudnn.benchmark", str(bool(torch.backends.cudnn.benchmark)),
                 "passed to the aten.miopen_* ops as 'benchmark' (MIOpen's exhaustive Find on ROCm)"))
    rows.append(("torch.backends.cudnn.enabled", str(bool(torch.backends.cudnn.enabled)),
                 "False switches MIOpen off in PyTorch for ROCm"))
    return rows


def choose_rules(problem: Problem, device: DeviceInfo, ctx) -> Choice:
    """The miopen backend's rule: a pure function of (problem, DeviceInfo, rules.TorchContext).

    It takes what ATen would send to MIOpen and nothing else, so the op it calls, the layout it computes in and
    the gradients' route are PyTorch's own: use_miopen (dtype, rank, groups with dilation, 64-bit indexing),
    _select_conv_backend for the op, miopen_conv_suggest_memory_format for NHWC.
    """
    from ..rules import aten_view, determine_backend_memory_format, select_view, use_miopen

    if not ctx.is_hip:
        raise Unsupported("PyTorch here is not a ROCm build (torch.version.hip is None): MIOpen is reached "
                          "through PyTorch for ROCm only")
    if problem.input.kind != "torch" or problem.input.device_type != "cuda":
        raise Unsupported(f"MIOpen is reached through PyTorch: it takes torch tensors on a ROCm GPU, not "
                          f"{problem.input.kind} data on {problem.input.device}")
    if device.vendor != "amd":
        raise Unsupported(f"MIOpen runs on AMD GPUs, not {device.vendor} ({device.name})")
    if problem.dtype == "float64":
        raise Unsupported("MIOpen has no float64 convolution (ATen's use_miopen takes float32, float16 and "
                          "bfloat16; ROCm PyTorch runs float64 on its slow native kernels)")
    if problem.dtype not in MIOPEN_DTYPES:
        raise Unsupported(f"MIOpen convolutions take {', '.join(MIOPEN_DTYPES)}, not {problem.dtype}")
    p = problem.params
    ok = use_miopen(problem.input, problem.weight, p, ctx)
    if not ok:
        raise Unsupported(f"ATen's use_miopen says no: {ok.reason}")
    bias = ((problem.weight.shape[1] * p.groups if p.transposed else problem.weight.shape[0]),)
    fwd_view = aten_view(problem.input, problem.weight, p, None, bias if problem.has_bias else None)
    fwd = select_view(fwd_view, ctx)
    bwd = select_view(aten_view(problem.input, problem.weight, p, None, bias, need_backward=True), ctx)
    if fwd not in _MIOPEN_BACKENDS:
        raise Unsupported(f"ATen would run this problem on {fwd}, not MIOpen")
    if bwd not in _MIOPEN_BACKENDS:
        raise Unsupported(f"ATen would run this problem's gradients on {bwd}, not MIOpen")
    if p.rank == 1:  # ATen makes a 1-d input contiguous before viewing it as 2-d
        fmt = "contiguous"
    else:
        fmt = determine_backend_memory_format(fwd_view.input, fwd_view.weight, fwd, ctx)
    src = ("PYTORCH_MIOPEN_SUGGEST_NHWC=" + ctx.miopen_suggest_nhwc if ctx.miopen_suggest_nhwc is not None
           else f"the build's default for MIOpen {_version(ctx.miopen_version)} on {ctx.gpu_arch or device.arch}")
    if not ctx.miopen_nhwc:
        nhwc = f"NHWC off ({src})"
    elif fmt == "contiguous":
        nhwc = f"neither tensor is channels-last (NHWC allowed: {src})"
    else:
        nhwc = f"NHWC on ({src})"
    op = _MIOPEN_BACKENDS[fwd]
    math = "fp32-accumulate" if problem.dtype in ("float16", "bfloat16") else "ieee"
    return Choice(op, fmt, f"MIOpen {_version(ctx.miopen_version)} via aten.{op} (ATen selects {fwd}); gradients "
                           f"via aten.convolution_backward, which ATen routes to {bwd}; {fmt}: {nhwc}", math)


def _version(v: int | None) -> str:
    return "?" if not v else f"{v // 10000}.{v // 100 % 100}.{v % 100}"


class MiopenBackend(Backend):
    id = BackendId.MIOPEN
    pip_hint = "pip install torch from the ROCm index (https://pytorch.org/get-started/locally/, ROCm)"

    def probe(self) -> Availability:
        import torch

        if not getattr(torch.version, "hip", None):
            return Availability.no(f"PyTorch {torch.__version__} is not a ROCm build (torch.version.hip is None): "
                                   f"MIOpen is reached through PyTorch for ROCm; {self.pip_hint}")
        if not torch.cuda.is_available():
            return Availability.no(f"PyTorch {torch.__version__} (HIP {torch.version.hip}) sees no AMD GPU")
        if not torch.backends.cudnn.enabled:
            return Availability.no("torch.backends.cudnn.enabled is False (it switches MIOpen off on ROCm)")
        return Availability.yes(f"MIOpen {_version(torch.backends.cudnn.version())} through PyTorch "
                                f"{torch.__version__} (HIP {torch.version.hip})")

    def device_for(self, problem: Problem) -> DeviceInfo:
        from .. import device as _device

        spec = problem.input
        if spec.kind != "torch" or spec.device_type != "cuda":
            raise Unsupported(f"MIOpen is reached through PyTorch: it takes torch tensors on a ROCm GPU, not "
                              f"{spec.kind} data on {spec.device}")
        return _device.torch_cuda(spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo, options) -> Choice:
        from ..rules import TorchContext

        choice = choose_rules(problem, device, TorchContext.from_torch(problem.input.device))
        mode = os.environ.get("MIOPEN_FIND_MODE", "unset: DYNAMIC_HYBRID")  # MIOpen's own knob, reported
        return dataclasses.replace(choice, reason=f"{choice.reason}; MIOPEN_FIND_MODE {mode}")

    def prepare(self, problem: Problem, device: DeviceInfo, choice: Choice, options):
        kernels = library_kernels(f"aten.{choice.algorithm}", "aten.convolution_backward (MIOpen)", problem.has_bias)
        return kernels, MiopenRunner(problem, choice)

    def devices(self) -> list[DeviceInfo]:
        import torch

        from .. import device as _device

        if not self.probe():
            return []
        return [_device.torch_cuda(i) for i in range(torch.cuda.device_count())]


class MiopenRunner:
    """aten.miopen_* forward and aten.convolution_backward, in the plan's memory format."""

    native = None

    def __init__(self, problem: Problem, choice: Choice):
        import torch

        self.torch, self.problem, self.algorithm = torch, problem, choice.algorithm
        self.fmt = torch_format(torch, choice.memory_format)

    def forward(self, input, weight, bias):
        torch = self.torch
        p = self.problem.params
        x = pad_extra(input, p) if any(p.padding_extra) else input
        w = weight
        one_d = p.rank == 1
        if one_d:  # ATen's view1d_as_2d: contiguous input, both viewed as 2-d at dim 2
            x, w = x.contiguous().unsqueeze(2), w.unsqueeze(2)
            p = p.as_2d(with_extra=False)
        x, w = x.contiguous(memory_format=self.fmt), w.contiguous(memory_format=self.fmt)
        bench = bool(torch.backends.cudnn.benchmark)
        det = bool(torch.backends.cudnn.deterministic or torch.are_deterministic_algorithms_enabled())
        op = _op(self.algorithm)
        if self.algorithm == "miopen_convolution_transpose":
            out = op(x, w, bias, list(p.padding), list(p.output_padding), list(p.stride), list(p.dilation), p.groups,
                     bench, det)
        else:
            out = op(x, w, bias, list(p.padding), list(p.stride), list(p.dilation), p.groups, bench, det)
        return out.squeeze(2) if one_d else out

    def backward(self, grad_output, input, weight, output_mask):
        p = self.problem.params
        x = pad_extra(input, p) if any(p.padding_extra) else input
        w, go = weight, grad_output
        if p.rank > 1:
            x, w, go = (t.contiguous(memory_format=self.fmt) for t in (x, w, go))
        gi, gw, gb = self.torch.ops.aten.convolution_backward(go, x, w, [go.shape[1]], **p.as_aten(),
                                                              output_mask=list(output_mask))
        if gi is not None and any(p.padding_extra):
            gi = unpad(gi, input.shape)
        return gi, gw, gb


def _op(name: str):
    """The aten op of an algorithm name (a seam: the CPU tests substitute emulations of the ROCm-only ops)."""
    import torch

    return getattr(torch.ops.aten, name)
