"""The automatic plan's policy as pure tables: which backends to prefer for a problem, and why."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from .backends import BackendId
from .errors import ConvError
from .problem import Problem

# Preference order per place the tensors live. Each backend may still reject a problem, with its reason. Torch
# tensors on a GPU or the CPU follow gpu_policy / cpu_policy instead; this order is their last resort, and the
# order of cupy and pyopencl arrays.
ORDER = {
    "pyopencl": (BackendId.OPENCL,),
    "cpu": (BackendId.ATEN, BackendId.OPENCL),
    "cuda": (BackendId.CUDNN, BackendId.CUDA, BackendId.MIOPEN, BackendId.HIP, BackendId.ATEN),
}
DEFAULT_ORDER = (BackendId.ATEN,)


def candidates(problem: Problem) -> tuple[BackendId, ...]:
    key = "pyopencl" if problem.input.kind == "pyopencl" else problem.input.device_type
    return ORDER.get(key, DEFAULT_ORDER)


@dataclasses.dataclass(frozen=True)
class OwnKernelWin:
    """A problem class where portconv's own kernels (backend) beat what ATen runs (one of ``replaces``)."""

    backend: BackendId  # BackendId.CUDA on NVIDIA, BackendId.HIP on ROCm
    replaces: tuple[str, ...]  # ATen ConvBackend names, e.g. ('CudaDepthwise2d',)
    applies: Callable[[Problem], bool]  # pure predicate on the problem
    what: str  # the class in words
    evidence: str  # the measured speed-up, in one line, and where it is recorded
    compiled: str = ""  # evidence that the win holds in compiled graphs too (Note [own kernel wins compiled]); ""
    # (unmeasured there): Inductor compiles the class as ATen's convolution


# Output elements from which the depthwise row applies (Note [own kernel wins])
OWN_DEPTHWISE_MIN_OUTPUTS = {2: 1024 * 1024, 3: 2 * 1024 * 1024}


def _large_dense_depthwise(problem: Problem, fmt: str) -> bool:
    """Depthwise, not transposed, 2-D or 3-D, dense in ``fmt`` (also the layout ATen sees), dilation 1, with at least
    OWN_DEPTHWISE_MIN_OUTPUTS[rank] output elements."""
    p, x = problem.params, problem.input
    return (problem.is_depthwise and not p.transposed and p.rank in OWN_DEPTHWISE_MIN_OUTPUTS
            and x.memory_format == fmt and x.is_contiguous(fmt) and set(p.dilation) == {1}
            and math.prod(problem.output_shape) >= OWN_DEPTHWISE_MIN_OUTPUTS[p.rank])


def _large_dense_depthwise_3tap(problem: Problem) -> bool:
    """NCHW/NCDHW-contiguous (_large_dense_depthwise), every kernel dim 3, stride 1 (or 2 in 2-D)."""
    p = problem.params
    stride_ok = set(p.stride) == {1} or (p.rank == 2 and set(p.stride) == {2})
    return _large_dense_depthwise(problem, "contiguous") and all(k == 3 for k in _kernel(problem)) and stride_ok


def _depthwise_plain(problem: Problem, rank: int, fmt: str) -> bool:
    """_large_dense_depthwise of this rank with stride 1."""
    return problem.params.rank == rank and set(problem.params.stride) == {1} and _large_dense_depthwise(problem, fmt)


def _kernel(problem: Problem) -> tuple[int, ...]:
    return tuple(problem.weight.shape[2:])


def _channels_last_3d_cube(problem: Problem) -> bool:
    return _depthwise_plain(problem, 3, "channels_last_3d") and _kernel(problem) in ((3, 3, 3), (5, 5, 5))


def _ncdhw_5tap(problem: Problem) -> bool:
    return _depthwise_plain(problem, 3, "contiguous") and _kernel(problem) == (5, 5, 5)


def _large_kernel_nchw(problem: Problem) -> bool:
    """NCHW 2-D with a kernel >= 5 on both axes at stride 1, or 5x5 at stride 2 (EfficientNet's 5x5, ConvNeXt's 7x7
    at every stage, RepLKNet's 13x13 and 31x31): the 'bands' kernels (Note [depthwise bands]) in all three
    directions, where ATen's CudaDepthwise2d is slowest."""
    p = problem.params
    return (p.rank == 2 and _large_dense_depthwise(problem, "contiguous") and all(k >= 5 for k in _kernel(problem))
            and (set(p.stride) == {1} or (set(p.stride) == {2} and _kernel(problem) == (5, 5))))


def _channels_last_large_kernel(problem: Problem) -> bool:
    return _depthwise_plain(problem, 2, "channels_last") and all(k >= 13 for k in _kernel(problem))


def _channels_last_7x7_float32(problem: Problem) -> bool:
    """Channels-last 2-D float32 with a kernel of 7 to 12 on both axes (ConvNeXt's 7x7, which torchvision's ConvNeXt
    runs channels-last in NCHW models too): cuDNN's float32 NHWC kernels are slowest there (the weight gradient 4.6 ms
    on convnext-dw7x7-st1-cl against the 'clw' kernels' 0.26 ms); in bfloat16 cuDNN's kernels win as a whole."""
    return (_depthwise_plain(problem, 2, "channels_last") and problem.dtype == "float32"
            and all(7 <= k < 13 for k in _kernel(problem)))


def _channels_last_5x5_stride2(problem: Problem) -> bool:
    """Channels-last 2-D 5x5 at stride 2 (EfficientNet's downsampling depthwise layers): the 'clw' kernels with the
    backward-data by phases (Note [clw phases]), where cuDNN's NHWC backward-data is slowest."""
    p = problem.params
    return (p.rank == 2 and set(p.stride) == {2} and _kernel(problem) == (5, 5)
            and _large_dense_depthwise(problem, "channels_last"))


# Note [own kernel wins]
# portconv's own kernels replace ATen's choice only for a problem class measured faster per call (forward + both
# gradients, same process as PyTorch, against the faster of PyTorch's default and cudnn.benchmark). Smaller
# depthwise problems are host-bound: under 1M outputs (mbv2-dw3x3-b1) the own plan measured 0.81x-1.32x per call,
# so 2-D starts at 1M; 3-D keeps 2M, the smallest 3-D size measured. Each row's evidence is the sum of the three
# directions' device times on the suite rows it names (docs/performance/h100/depthwise.md); the classes that
# measured slower stay with ATen (channels-last 2-D 3x3 and 5x5 at stride 1, and 7x7 in 16-bit types).
OWN_KERNEL_WINS: tuple[OwnKernelWin, ...] = (
    OwnKernelWin(BackendId.CUDA, ("CudaDepthwise2d", "CudaDepthwise3d"), _large_dense_depthwise_3tap,
                 "depthwise 3x3 (>= 1M outputs) / 3x3x3 (>= 2M), stride 1 (or 2 in 2-D), NCHW",
                 "1.15x-3.9x PyTorch per call on an H100 (docs/kernels/depthwise.md)"),
    OwnKernelWin(BackendId.CUDA, ("Cudnn",), _channels_last_3d_cube,
                 "depthwise 3x3x3 or 5x5x5, stride 1, channels-last 3-D (>= 2M outputs)",
                 "2.1x-82x PyTorch (cuDNN) on an H100, x3d-dw3x3x3-cl, x3d-dw5x5x5-cl (float32, bfloat16)"),
    OwnKernelWin(BackendId.CUDA, ("CudaDepthwise3d",), _ncdhw_5tap,
                 "depthwise 5x5x5, stride 1, NCDHW (>= 2M outputs)",
                 "1.55x-1.62x PyTorch on an H100, x3d-dw5x5x5 and -bf16"),
    OwnKernelWin(BackendId.CUDA, ("CudaDepthwise2d",), _large_kernel_nchw,
                 "depthwise kernel >= 5x5 at stride 1 or 5x5 at stride 2, NCHW (>= 1M outputs)",
                 "1.48x-7.9x PyTorch on an H100, effnet-dw5x5, effnet-dw5x5-s2, convnext-dw7x7-st1..st4, "
                 "replk-dw13x13, replk-dw31x31 (float32, bfloat16; docs/performance/h100/depthwise.md)"),
    OwnKernelWin(BackendId.CUDA, ("Cudnn",), _channels_last_7x7_float32,
                 "depthwise kernel 7x7 to 12x12, stride 1, channels-last, float32 (>= 1M outputs)",
                 "6.27x-9.74x PyTorch (cuDNN) on an H100, convnext-dw7x7-st1..st4-cl (float32, each direction "
                 ">= 1.73x; docs/performance/h100/depthwise.md)",
                 compiled="convnext_tiny float32 training step compiled: 2.00x PyTorch's compiled step on an H100 "
                          "(docs/performance/h100/models.md)"),
    OwnKernelWin(BackendId.CUDA, ("Cudnn",), _channels_last_5x5_stride2,
                 "depthwise 5x5, stride 2, channels-last (>= 1M outputs)",
                 "1.74x (float32) and 1.08x (bfloat16) PyTorch (cuDNN) on an H100, effnet-dw5x5-s2-cl and -bf16-cl "
                 "(backward-data 2.2x-2.7x; docs/performance/h100/depthwise.md)"),
    OwnKernelWin(BackendId.CUDA, ("Cudnn",), _channels_last_large_kernel,
                 "depthwise kernel >= 13x13, stride 1, channels-last (>= 1M outputs)",
                 "4.37x-52.9x PyTorch (cuDNN) on an H100, replk-dw13x13-cl and replk-dw31x31-cl (float32, bfloat16; "
                 "docs/performance/h100/depthwise.md)"),
)

# Note [own kernel wins compiled]
# Inductor compiles an unforced plan as ATen's convolution (Note [ATen's plans in compiled graphs]): a compiled graph
# takes an OWN_KERNEL_WINS row's kernels only where the row has evidence that the win holds there too (its
# `compiled` field), for the graph's fusions and layouts differ from eager's (mobilenet_v2 float32 with its NCHW 3x3
# depthwise convolutions as portconv ops ran 0.73x compiled, while eager it wins). compiled_win() is that row.
def compiled_win(problem: Problem, ctx, wins: tuple[OwnKernelWin, ...] | None = None) -> OwnKernelWin | None:
    """The OWN_KERNEL_WINS row that gpu_policy takes for this problem, where it holds in compiled graphs too."""
    from .rules import aten_answer

    try:
        fwd = aten_answer(problem, ctx)[0]
    except ConvError:
        return None
    win = _win(problem, BackendId.HIP if ctx.is_hip else BackendId.CUDA, fwd, OWN_KERNEL_WINS if wins is None else wins)
    return win if win is not None and win.compiled else None


def _win(problem: Problem, own: BackendId, fwd: str, wins: tuple[OwnKernelWin, ...]) -> OwnKernelWin | None:
    """The first row of ``wins`` for this problem, whose ATen forward would be ``fwd``, on the place's own backend
    (a depthwise problem only: Note [ATen's modules])."""
    if not problem.is_depthwise:
        return None
    return next((w for w in wins if w.backend == own and fwd in w.replaces and w.applies(problem)), None)


# Note [ATen's modules]
# The rows of OWN_KERNEL_WINS and OWN_KERNEL_WINS_CPU take depthwise problems only (_win, which gpu_policy and
# cpu_policy ask, tests that before any row), and ATen's is_depthwise needs groups == C_in > 1 and no transposition.
# So the automatic plan of a transposed or single-group convolution is ATen's for every shape, dtype, layout, device
# and torch flag: there an eager call under the automatic plan (planner.automatic) is torch.nn.functional's own
# call, with no key, memo or plan to consult (a ResNet-50 bfloat16 step on the H100's host spent 2 ms in those
# checks).
def never_own(transposed: bool, groups: int) -> bool:
    """Whether the automatic plan is ATen's for every problem of a convolution with these arguments."""
    return transposed or groups == 1


# Where forcing the vendor library measured slower than ATen's own native kernel (the old default did that).
VENDOR_VIA_ATEN = "the same call through ATen's dispatch, least host time"
NATIVE_EVIDENCE = {
    "CudaDepthwise3d": "forcing cuDNN measured 0.18x PyTorch on dw3d-3x3x3",
    "CudaDepthwise2d": "forcing cuDNN measured 0.46x-1.32x PyTorch on the mbv2-dw3x3 rows",
}
_VENDOR_NAMES = {BackendId.CUDNN: ("Cudnn", "CudnnTranspose"),
                 BackendId.MIOPEN: ("Miopen", "MiopenTranspose", "MiopenDepthwise")}

Prefs = tuple[tuple[BackendId, str], ...]


# Note [default plan on GPUs]
# For torch tensors on a CUDA (or ROCm) GPU the automatic plan asks the ATen model (portconv.rules) where PyTorch
# itself would send the problem and its gradients, and runs exactly that through the aten backend: the same library
# call made by ATen's C++ dispatch costs the least host time (H100, tiny conv2d: aten +1.8 us, cudnn +9.7 us over
# F.conv2d). The cudnn/miopen backend is its fallback. portconv's own kernels replace ATen's choice only where
# OWN_KERNEL_WINS has a row for the problem. portconv.tune() times every candidate instead.
def gpu_policy(problem: Problem, ctx, wins: tuple[OwnKernelWin, ...] | None = None) -> tuple[Prefs, Prefs]:
    """The default plan for torch tensors on a GPU, pure: ((backend, why preferred), ...) in order, and
    ((backend, why not preferred), ...) for the others. ``ctx`` is a portconv.rules.TorchContext."""
    from .rules import aten_answer

    wins = OWN_KERNEL_WINS if wins is None else wins
    lib = BackendId.MIOPEN if ctx.is_hip else BackendId.CUDNN
    own = BackendId.HIP if ctx.is_hip else BackendId.CUDA
    lib_label = "MIOpen" if ctx.is_hip else "cuDNN"
    try:
        fwd = aten_answer(problem, ctx)[0]
        bwd = aten_answer(problem, ctx, need_backward=True)[0]
    except ConvError as e:
        return ((BackendId.ATEN, f"ATen refuses this problem ({e})"),), ()
    routed = fwd if fwd == bwd else f"{fwd} (gradients: {bwd})"
    win = _win(problem, own, fwd, wins)
    if win is not None:
        prefer = ((own, f"OWN_KERNEL_WINS: {win.what}: {win.evidence}; ATen would run {routed}"),
                  (BackendId.ATEN, f"fallback: ATen runs it as {routed}"))
        return prefer, ((lib, f"OWN_KERNEL_WINS prefers portconv's {own} kernels"),)
    if fwd in _VENDOR_NAMES[lib] and bwd in _VENDOR_NAMES[lib]:
        why = f"ATen routes it to {lib_label} ({routed}): {VENDOR_VIA_ATEN}"
        return ((BackendId.ATEN, why), (lib, f"fallback: the {lib} backend makes the same library call")), \
            ((own, f"ATen routes it to {lib_label} and OWN_KERNEL_WINS has no row for it"),)
    why = f"ATen routes it to {routed}, not {lib_label}"
    evidence = NATIVE_EVIDENCE.get(fwd)
    if evidence:
        why += f"; {evidence}"
    return ((BackendId.ATEN, f"{why}; the aten backend runs PyTorch's own kernel"),), \
        ((lib, why), (own, f"{why}; OWN_KERNEL_WINS has no row for it"))


# Output elements from which the CPU row applies: below it a call is host-bound (PoCL's launches and copies), and
# ATen's CPU path is the faster. 2-core Xeon, PoCL 3.1, forward + backward of a depthwise 3x3x3 through autograd:
# 0.42x-0.74x PyTorch at 32-4096 outputs, 0.89x-1.21x at 8K-16K, 1.17x-1.37x at 25K, 1.56x-1.92x at 32K, 3.5x at 2.7M.
OWN_CPU_MIN_OUTPUTS = 32 * 1024


def _depthwise_3d_3tap(problem: Problem) -> bool:
    """Depthwise 3x3x3, NCDHW-contiguous, stride and dilation 1, not transposed, float32 or float64, with at least
    OWN_CPU_MIN_OUTPUTS output elements."""
    p, x = problem.params, problem.input
    return (problem.is_depthwise and not p.transposed and p.rank == 3 and x.is_contiguous()
            and all(k == 3 for k in problem.weight.shape[2:]) and set(p.stride) == {1} and set(p.dilation) == {1}
            and problem.dtype in ("float32", "float64") and math.prod(problem.output_shape) >= OWN_CPU_MIN_OUTPUTS)


# Note [CPU wins]
# On torch CPU tensors the default plan is ATen's own CPU path (oneDNN or the slow kernels): PoCL's OpenCL kernels
# lose to it on dense problems (the README's example ran 8.5x slower) and on most 2-D depthwise rows. They replace
# ATen's choice only for a problem class measured faster per call on a CPU, host copies included, as on the GPU.
OWN_KERNEL_WINS_CPU: tuple[OwnKernelWin, ...] = (
    OwnKernelWin(BackendId.OPENCL, ("Mkldnn", "Slow3d"), _depthwise_3d_3tap,
                 "depthwise 3x3x3, stride 1, NCDHW, float32/float64 (>= 32K outputs)",
                 "4.6x-21x PyTorch per direction on dw3d-3x3x3 (2-core Xeon, PoCL; docs/performance/cpu-pocl)"),
)


def cpu_policy(problem: Problem, ctx, wins: tuple[OwnKernelWin, ...] | None = None) -> tuple[Prefs, Prefs]:
    """The default plan for torch CPU tensors, pure (as gpu_policy): ATen's CPU route unless a measured
    OWN_KERNEL_WINS_CPU row takes the problem. ``ctx`` is a portconv.rules.TorchContext read on the CPU."""
    from .rules import aten_answer

    wins = OWN_KERNEL_WINS_CPU if wins is None else wins
    try:
        fwd = aten_answer(problem, ctx)[0]
    except ConvError as e:
        return ((BackendId.ATEN, f"ATen refuses this problem ({e})"),), ()
    win = _win(problem, BackendId.OPENCL, fwd, wins)  # the CPU's own kernels are the OpenCL set's
    if win is not None:
        return ((win.backend, f"OWN_KERNEL_WINS_CPU: {win.what}: {win.evidence}; ATen would run {fwd}"),
                (BackendId.ATEN, f"fallback: ATen runs it as {fwd}")), ()
    return ((BackendId.ATEN, f"ATen's CPU route ({fwd}): faster than PoCL here (Note [CPU wins])"),), \
        ((BackendId.OPENCL, "OWN_KERNEL_WINS_CPU has no row for this problem"),)
