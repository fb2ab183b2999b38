"""portconv's own selection: plan(...) -> Plan with the backend, algorithm, memory format and every reason."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading

from . import backends as _backends
from . import knobs
from .backends import BackendId, Choice, Problem
from .device import DeviceInfo
from .errors import BackendUnavailable, Unsupported

# Preference order per place the tensors live. Each backend may still reject a problem, with its reason.
_ORDER = {
    "pyopencl": (BackendId.OPENCL,),
    "cpu": (BackendId.OPENCL, BackendId.ATEN),
    "cuda": (BackendId.CUDNN, BackendId.CUDA, BackendId.MIOPEN, BackendId.HIP, BackendId.ATEN),
}
_DEFAULT_ORDER = (BackendId.ATEN,)

_forced: contextvars.ContextVar[BackendId | None] = contextvars.ContextVar("portconv_forced", default=None)


@contextlib.contextmanager
def use_backend(name: str | BackendId | None):
    """Within the block, every call without an explicit ``backend=`` uses this backend (None: auto)."""
    token = _forced.set(None if name is None else BackendId.parse(name))
    try:
        yield
    finally:
        _forced.reset(token)


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

    @property
    def impl(self) -> _backends.Backend:
        return _backends.get(self.backend)

    def forward(self, input, weight, bias=None):
        return self.impl.forward(self, input, weight, bias)

    def backward(self, grad_output, input, weight, output_mask=(True, True, True)):
        return self.impl.backward(self, grad_output, input, weight, tuple(bool(m) for m in output_mask))

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


def _try(bid: BackendId, problem: Problem) -> tuple[DeviceInfo, Choice]:
    impl = _backends.get(bid)
    avail = impl.probe()
    if not avail:
        raise Unsupported(avail.reason)
    device = impl.device_for(problem)
    return device, impl.choose(problem, device)


_cache: dict[tuple, Plan] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def select(problem: Problem, backend: str | BackendId | None = None) -> Plan:
    """Pick a backend for ``problem``. Explicit ``backend`` > use_backend() > PORTCONV_BACKEND > automatic."""
    forced = backend if backend is not None else (_forced.get() or knobs.backend())
    forced_id = None if forced in (None, "auto") else BackendId.parse(forced)
    disabled = knobs.disabled()
    key = (problem, forced_id, disabled, knobs.get("PORTCONV_OPENCL_DEVICE"))
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    plan = _select(problem, forced_id, disabled)
    with _cache_lock:
        _cache[key] = plan
    return plan


def _select(problem: Problem, forced_id: BackendId | None, disabled: frozenset[str]) -> Plan:
    if forced_id is not None:
        try:
            device, choice = _try(forced_id, problem)
        except Unsupported as e:
            raise BackendUnavailable(f"backend '{forced_id}' was requested but cannot run this problem: "
                                     f"{e.reason}\n  problem: {problem.describe()}") from None
        return _plan(problem, forced_id, device, choice, (), True)
    rejected: list[tuple[str, str]] = []
    for bid in candidates(problem):
        if bid.value in disabled:
            rejected.append((bid.value, "disabled by PORTCONV_DISABLE"))
            continue
        try:
            device, choice = _try(bid, problem)
        except Unsupported as e:
            rejected.append((bid.value, e.reason))
            continue
        return _plan(problem, bid, device, choice, tuple(rejected), False)
    reasons = "\n".join(f"  {b}: {why}" for b, why in rejected)
    raise BackendUnavailable(f"no portconv backend can run this problem ({problem.describe()}):\n{reasons}")


def _plan(problem, bid, device, choice: Choice, rejected, forced) -> Plan:
    return Plan(problem=problem, backend=bid, algorithm=choice.algorithm, memory_format=choice.memory_format,
                reason=choice.reason, device=device, math=choice.math, rejected=rejected, forced=forced)
