"""portconv's own selection: plan(...) -> Plan with the backend, algorithm, memory format and every reason."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import threading
from collections.abc import Callable

from . import backends as _backends
from . import knobs
from .backends import BackendId, Choice, Problem
from .device import DeviceInfo
from .errors import BackendUnavailable, ConvError, Unsupported

# Preference order per place the tensors live. Each backend may still reject a problem, with its reason.
# Torch tensors on a CUDA/ROCm GPU follow the ATen model instead (Note [default plan on GPUs]); this order is their
# last resort and the order for cupy arrays.
_ORDER = {
    "pyopencl": (BackendId.OPENCL,),
    "cpu": (BackendId.OPENCL, BackendId.ATEN),  # the OpenCL kernel set is the project's CPU path by design
    "cuda": (BackendId.CUDNN, BackendId.CUDA, BackendId.MIOPEN, BackendId.HIP, BackendId.ATEN),
}
_DEFAULT_ORDER = (BackendId.ATEN,)

_forced: contextvars.ContextVar[BackendId | None] = contextvars.ContextVar("portconv_forced", default=None)
_tuning: contextvars.ContextVar[bool | None] = contextvars.ContextVar("portconv_tuning", default=None)


@contextlib.contextmanager
def use_backend(name: str | BackendId | None):
    """Within the block, every call without an explicit ``backend=`` uses this backend (None: auto)."""
    token = _forced.set(None if name is None else BackendId.parse(name))
    try:
        yield
    finally:
        _forced.reset(token)


def tuning() -> bool:
    """Is tuning on: portconv.tune() in this context, else PORTCONV_TUNE."""
    on = _tuning.get()
    return knobs.tune() if on is None else on


@dataclasses.dataclass(frozen=True)
class Plan:
    problem: Problem
    backend: BackendId
    algorithm: str
    memory_format: str
    reason: str
    device: DeviceInfo
    math: str = "ieee"
    rejected: tuple[tuple[str, str], ...] = ()
    forced: bool = False
    # Per-plan memo for the backend's hot path (precomputed call arguments); not part of the plan's identity.
    state: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def impl(self) -> _backends.Backend:
        impl = self.state.get("impl")
        if impl is None:
            impl = self.state["impl"] = _backends.get(self.backend)
        return impl

    def forward(self, input, weight, bias=None):
        return self.impl.forward(self, input, weight, bias)

    def backward(self, grad_output, input, weight, output_mask=(True, True, True)):
        gi, gw, gb = output_mask  # three flags, as aten::convolution_backward takes
        return self.impl.backward(self, grad_output, input, weight, (bool(gi), bool(gw), bool(gb)))

    def explain(self) -> str:
        lines = [
            f"problem:       {self.problem.describe()}",
            f"output:        {list(self.problem.output_shape)}",
            f"backend:       {self.backend}{' (forced)' if self.forced else ''}",
            f"algorithm:     {self.algorithm}",
            f"memory format: {self.memory_format}",
            f"math:          {self.math}",
            f"device:        {self.device.describe()}",
            f"reason:        {self.reason}",
        ]
        if self.rejected:
            lines.append("rejected:")
            lines += [f"  {b:<8} {why}" for b, why in self.rejected]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"backend": str(self.backend), "algorithm": self.algorithm, "memory_format": self.memory_format,
                "math": self.math, "reason": self.reason, "forced": self.forced,
                "rejected": [list(r) for r in self.rejected], "device": self.device.as_dict()}


def candidates(problem: Problem) -> tuple[BackendId, ...]:
    key = "pyopencl" if problem.input.kind == "pyopencl" else problem.input.device_type
    return _ORDER.get(key, _DEFAULT_ORDER)


# Note [default plan on GPUs]
# For torch tensors on a CUDA (or ROCm) GPU the automatic plan asks the ATen model (portconv.rules) where PyTorch
# itself would send the problem and its gradients. If that is the vendor library (cuDNN, or MIOpen on ROCm), the
# aten backend makes that same library call (Note [vendor library via ATen]), the cudnn/miopen backend is its
# fallback. Otherwise PyTorch runs a native kernel of its own
# (CudaDepthwise2d/3d, the Slow* fallbacks) and the aten backend runs exactly that: forcing cuDNN there was the old
# default and measured 0.18x PyTorch on dw3d-3x3x3 and 0.46x-0.65x on the small mbv2 depthwise rows
# (docs/performance/h200-2026-11-22). portconv's own kernels replace ATen's choice only where OWN_KERNEL_WINS has a
# row for the problem class, each with its measured evidence. portconv.tune() times all candidates instead.
EVIDENCE = "docs/performance/h200-2026-11-22"
_VENDOR_NAMES = {BackendId.CUDNN: ("Cudnn", "CudnnTranspose"),
                 BackendId.MIOPEN: ("Miopen", "MiopenTranspose", "MiopenDepthwise")}
# Note [vendor library via ATen]: where ATen itself sends a problem and its gradients to the vendor library, the
# default plan is the aten backend: the same library call, made by ATen's C++ dispatch. The cudnn/miopen backends
# make it from Python (argument checks, layout and TF32 decisions per call) and measured more host time per call.
VENDOR_VIA_ATEN = ("the same library kernels with the least host work per call (H100, tiny conv2d, cached plan: "
                   "aten +1.8 us, cudnn +9.7 us over F.conv2d; docs/performance/h100-2026-11-22)")
# What forcing the vendor library measured where ATen runs a native kernel (the old default did that).
_NATIVE_EVIDENCE = {
    "CudaDepthwise3d": "forcing cuDNN here measured 0.18x PyTorch on dw3d-3x3x3 (forward + both gradients)",
    "CudaDepthwise2d": ("forcing cuDNN here measured 0.46x-1.32x PyTorch over the mbv2-dw3x3* rows (forward + both "
                        "gradients, the gradients on channels-last copies): a loss on mbv2-dw3x3-s2, -last and -b1"),
}


@dataclasses.dataclass(frozen=True)
class OwnKernelWin:
    """A problem class where portconv's own kernels (backend) beat what ATen runs (one of ``replaces``)."""

    backend: BackendId  # BackendId.CUDA on NVIDIA, BackendId.HIP on ROCm
    replaces: tuple[str, ...]  # ATen ConvBackend names, e.g. ('CudaDepthwise2d',)
    applies: Callable[[Problem], bool]  # pure predicate on the problem
    what: str  # the class in words
    evidence: str  # the measured speed-up and where it is recorded


# Output elements from which the row applies: 2-D from 1M (mbv2-dw3x3-last, 1,505,280, measured winning per call;
# mbv2-dw3x3-b1, 401,408, not: Note [own kernel wins]), 3-D from 2M (only dw3d-3x3x3, 51M, is measured in 3-D)
OWN_DEPTHWISE_MIN_OUTPUTS = {2: 1024 * 1024, 3: 2 * 1024 * 1024}


def _large_dense_depthwise_3tap(problem: Problem) -> bool:
    """Depthwise, NCHW/NCDHW-contiguous, every kernel dim 3, stride 1 (or 2 in 2-D), dilation 1, at least
    OWN_DEPTHWISE_MIN_OUTPUTS[rank] output elements."""
    p, x = problem.params, problem.input
    out = 1
    for s in problem.output_shape:
        out *= s
    stride_ok = set(p.stride) == {1} or (p.rank == 2 and set(p.stride) == {2})
    return (problem.is_depthwise and not p.transposed and x.memory_format == "contiguous" and x.is_contiguous()
            and p.rank >= 2 and all(k == 3 for k in problem.weight.shape[2:]) and stride_ok
            and set(p.dilation) == {1} and out >= OWN_DEPTHWISE_MIN_OUTPUTS[p.rank])


# Note [own kernel wins]: each row needs a measurement. The first H200 run measured the first depthwise kernels at
# 0.38x-0.62x PyTorch; the 'rows' kernels (cuda/conv_depthwise_rows.cuh) then 2.4x-2.7x in kernel time; the v3
# 'tile' kernels (cuda/conv_depthwise_tile.cuh, H100, docs/performance/notes-depthwise-v3.md), forward + both
# gradients, kernel / per call: mbv2-dw3x3 2.99x / 2.28x, -bf16 2.96x / 2.20x, dw3d-3x3x3 3.58x / 3.34x, and with
# the stride-2 backward-data window mbv2-dw3x3-s2 (3.6M outputs) 1.69x / 1.35x. The small rows were host-bound
# (mbv2-dw3x3-last 1.16x per call, -b1 0.78x) until replayed launches and the launch-argument change: four H100 runs
# since (docs/performance/h100-2026-11-22b, its with-opencl/ and small-rows-rerun/) measured -last 1.29x-1.66x and
# -b1 1.11x-1.55x per call, against 1.04x-1.20x and 0.69x-1.17x for ATen's own call (the aten / auto->aten entries of
# the same runs), so in 2-D the row started at the size of -b1 (3-D keeps 2M: only dw3d-3x3x3 is measured there).
# Those runs timed PyTorch through torch.ops.aten.convolution, 11-17 us a call slower than the binding the bench uses
# since 2026-11-24 (Note [PyTorch's fastest binding]). Measured fairly, with entries in turns
# (docs/performance/h100-2026-11-24, auto-t5a-d), -b1's own-kernel plan measured 1.32x, 0.98x, 0.87x and 0.81x per call
# (3.05x in device time): its calls are host-bound and portconv's host path is the slower one half the time. So 2-D
# starts at 1M outputs: -b1 goes to PyTorch's call, and -last (1.17x-2.5x) stays on portconv's kernels.
# Channels-last stays with cuDNN's NHWC kernels (the v3.1 kernels measured 0.91x-1.06x there).
OWN_KERNEL_WINS: tuple[OwnKernelWin, ...] = (
    OwnKernelWin(BackendId.CUDA, ("CudaDepthwise2d", "CudaDepthwise3d"), _large_dense_depthwise_3tap,
                 "depthwise 3x3 (>= 1M outputs) / 3x3x3 (>= 2M outputs), stride 1 (or 2 in 2-D), NCHW",
                 "portconv's depthwise kernels measured 1.15x-3.9x PyTorch per call (forward + both gradients) on "
                 "mbv2-dw3x3, -bf16, -s2, -last and dw3d-3x3x3 on an H100 (docs/performance/h100-2026-11-24, "
                 "notes-depthwise-v3.md)"),
)


def gpu_policy(problem: Problem, ctx, wins: tuple[OwnKernelWin, ...] | None = None
               ) -> tuple[tuple[tuple[BackendId, str], ...], tuple[tuple[BackendId, str], ...]]:
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
    for win in wins:
        if win.backend == own and fwd in win.replaces and win.applies(problem):
            why = f"OWN_KERNEL_WINS: {win.what}: {win.evidence}"
            prefer = ((own, f"{why}; ATen would run {routed}"), (BackendId.ATEN, f"fallback: ATen runs it as {routed}"))
            return prefer, ((lib, f"OWN_KERNEL_WINS row '{win.what}' prefers portconv's {own} kernels"),)
    if fwd in _VENDOR_NAMES[lib] and bwd in _VENDOR_NAMES[lib]:
        why = (f"ATen routes this problem and its gradients to {lib_label} ({routed}): the aten backend makes that "
               f"{lib_label} call through ATen's own dispatch, {VENDOR_VIA_ATEN}")
        return ((BackendId.ATEN, why), (lib, f"fallback: the {lib} backend makes the same library call")), \
            ((own, f"ATen routes it to {lib_label} and OWN_KERNEL_WINS has no row for it"),)
    evidence = _NATIVE_EVIDENCE.get(fwd)
    why = f"ATen routes this problem{' and its gradients' if fwd == bwd else ''} to {routed}, not {lib_label}"
    if evidence:
        why += f"; {evidence} ({EVIDENCE})"
    return ((BackendId.ATEN, f"{why}: the aten backend runs PyTorch's own kernel"),), \
        ((lib, why), (own, f"{why}; OWN_KERNEL_WINS has no row for it"))


def _try(bid: BackendId, problem: Problem) -> tuple[DeviceInfo, Choice]:
    impl = _backends.get(bid)
    avail = impl.probe()
    if not avail:
        raise Unsupported(avail.reason)
    device = impl.device_for(problem)
    return device, impl.choose(problem, device)


_cache: dict[tuple, Plan] = {}
_cache_lock = threading.Lock()
_clear_hooks: list[Callable[[], None]] = []  # other caches keyed on plans (functional's fast path)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
    for hook in _clear_hooks:
        hook()


# Note [call state]
# Everything outside the tensors and arguments that can change a plan or the checks before it: the PORTCONV_*
# variables, use_backend(), tune(), and the torch flags that ATen's selection and validation read (cuDNN on/off,
# determinism, TF32 precision, the depthwise-kernel switch; oneDNN/NNPACK and the thread count on the CPU). It is
# part of every plan-cache key, and is cheap (~1 us): os.environ's raw mapping, torch._C getters.
_ENV_NAMES = ("PORTCONV_BACKEND", "PORTCONV_DISABLE", "PORTCONV_OPENCL_DEVICE", "PORTCONV_OPENCL_DENSE",
              "PORTCONV_OPENCL_TC", "PORTCONV_TUNE", "PORTCONV_CACHE_DIR",
              # kernel-variant knobs of the cuda backend, read when a plan's launches are first recorded (Note
              # [replayed launches]): part of the key, so that changing one mid-process makes a new plan
              "PORTCONV_CUDA_IGEMM_TC_TILE", "PORTCONV_CUDA_IGEMM_TC_V4",
              "PORTCONV_CUDA_IGEMM_TC_V5", "PORTCONV_CUDA_IGEMM_TC_V6", "PORTCONV_CUDA_IGEMM_TC_KS",
              "PORTCONV_CUDA_IGEMM_TC_V8", "PORTCONV_CUDA_IGEMM_NARROW",
              "PORTCONV_CUDA_DEPTHWISE",
              "PORTCONV_CUDA_DEPTHWISE_TILE", "PORTCONV_CUDA_DEPTHWISE_PLANES")
try:  # CPython's os.environ keeps the raw mapping (updated in place by os.environ[...] = ..., monkeypatch.setenv)
    _env_get, _env_keys = os.environ._data.get, tuple(os.environ.encodekey(n) for n in _ENV_NAMES)  # type: ignore
except AttributeError:
    _env_get, _env_keys = os.environ.get, _ENV_NAMES


def torch_flags(device_type: str) -> tuple:
    """The torch flags that decide ATen's route (and portconv's checks) for tensors on ``device_type``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    c = torch._C
    if device_type == "cuda":
        get = getattr(c, "_get_fp32_precision_getter", None)
        tf32 = ((get("cuda", "conv"), get("cuda", "all"), get("generic", "all")) if get is not None
                else c._get_cudnn_allow_tf32())
        kernel = getattr(c, "_get_cudnn_depthwise_kernel", None)
        return (c._get_cudnn_enabled(), c._get_cudnn_deterministic(), c._get_cudnn_benchmark(),
                c._get_deterministic_algorithms(), tf32, kernel() if kernel is not None else "auto")
    return c._get_mkldnn_enabled(), c._get_nnpack_enabled(), torch.get_num_threads()


def call_state(device_type: str) -> tuple:
    """Note [call state] for one call on ``device_type``."""
    return tuple(map(_env_get, _env_keys)), _forced.get(), _tuning.get(), torch_flags(device_type)


def select(problem: Problem, backend: str | BackendId | None = None, state: tuple | None = None) -> Plan:
    """Pick a backend for ``problem``. Explicit ``backend`` > use_backend() > PORTCONV_BACKEND > automatic.

    ``state``: call_state() when the caller already has it.
    """
    forced = backend if backend is not None else (_forced.get() or knobs.backend())
    forced_id = None if forced in (None, "auto") else BackendId.parse(forced)
    key = (problem, forced_id, call_state(problem.input.device_type) if state is None else state)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    plan = _select(problem, forced_id, knobs.disabled())
    with _cache_lock:
        _cache[key] = plan
    return plan


def _gpu_torch(problem: Problem) -> bool:
    return problem.input.kind == "torch" and problem.input.device_type == "cuda"


def _select(problem: Problem, forced_id: BackendId | None, disabled: frozenset[str]) -> Plan:
    if forced_id is not None:
        try:
            device, choice = _try(forced_id, problem)
        except Unsupported as e:
            raise BackendUnavailable(f"backend '{forced_id}' was requested but cannot run this problem: "
                                     f"{e.reason}\n  problem: {problem.describe()}") from None
        return _plan(problem, forced_id, device, choice, (), True)
    if tuning():
        from .tune import select_tuned

        return select_tuned(problem, disabled)
    if _gpu_torch(problem):
        from .rules import TorchContext

        prefer, passed = gpu_policy(problem, TorchContext.from_torch(problem.input.device))
    else:
        prefer, passed = tuple((b, "") for b in candidates(problem)), ()
    rejected: list[tuple[str, str]] = []
    for bid, why in prefer:
        plan = _attempt(problem, bid, why, disabled, rejected)
        if plan is not None:
            return dataclasses.replace(plan, rejected=_dedup(rejected + [(b.value, f"not preferred: {w}")
                                                                         for b, w in passed]))
    # The preferred backends cannot run it: the others, in the place's order, as the last resort.
    tried = {b for b, _ in prefer}
    for bid in candidates(problem):
        if bid in tried:
            continue
        plan = _attempt(problem, bid, "last resort: the preferred backends cannot run it", disabled, rejected)
        if plan is not None:
            return plan
    reasons = "\n".join(f"  {b}: {why}" for b, why in _dedup(rejected))
    raise BackendUnavailable(f"no portconv backend can run this problem ({problem.describe()}):\n{reasons}")


def _attempt(problem: Problem, bid: BackendId, why: str, disabled, rejected: list) -> Plan | None:
    """A plan on ``bid`` (its reason prefixed with ``why``), or None with the reason appended to ``rejected``."""
    if bid.value in disabled:
        rejected.append((bid.value, "disabled by PORTCONV_DISABLE"))
        return None
    try:
        device, choice = _try(bid, problem)
    except Unsupported as e:
        rejected.append((bid.value, e.reason))
        return None
    if why:
        choice = dataclasses.replace(choice, reason=f"{why}; {choice.reason}")
    return _plan(problem, bid, device, choice, tuple(_dedup(rejected)), False)


def _dedup(rejected) -> tuple[tuple[str, str], ...]:
    seen, out = set(), []
    for b, why in rejected:
        if (b, why) not in seen:
            seen.add((b, why))
            out.append((b, why))
    return tuple(out)


def _plan(problem, bid, device, choice: Choice, rejected, forced) -> Plan:
    return Plan(problem=problem, backend=bid, algorithm=choice.algorithm, memory_format=choice.memory_format,
                reason=choice.reason, device=device, math=choice.math, rejected=rejected, forced=forced)
