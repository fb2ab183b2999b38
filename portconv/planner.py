"""portconv's selection: select(problem) -> Plan, the one place a backend and its kernels are decided."""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Callable

from . import backends as _backends
from . import knobs, native, policy, validate
from .backends import BackendId, Choice, Runner
from .backends.program import RESULTS, KernelPlan
from .device import DeviceInfo
from .errors import BackendUnavailable, Unsupported
from .knobs import Options
from .params import ConvParams
from .problem import Problem
from .rules.context import torch_flags
from .tensors import spec_of

_forced: contextvars.ContextVar[BackendId | None] = contextvars.ContextVar("portconv_forced", default=None)
_tuning: contextvars.ContextVar[bool | None] = contextvars.ContextVar("portconv_tuning", default=None)
WIDTH = 120  # explain()'s lines


@contextlib.contextmanager
def use_backend(name: str | BackendId | None):
    """Within the block, every call without an explicit ``backend=`` uses this backend (None: auto)."""
    token = _forced.set(None if name is None else BackendId.parse(name))
    try:
        yield
    finally:
        _forced.reset(token)


@contextlib.contextmanager
def tune(enabled: bool = True):
    """Within the block, automatic plans are tuned (like cudnn.benchmark / MIOpen's Find): every backend that can
    run a new problem is timed once (forward + both gradients), the fastest is used and persisted per (device,
    versions, problem) in portconv.tuning.cache_path(). ``PORTCONV_TUNE=1`` does the same for the whole process; a
    forced backend (``backend=``, use_backend, PORTCONV_BACKEND) is never tuned."""
    token = _tuning.set(bool(enabled))
    try:
        yield
    finally:
        _tuning.reset(token)


def tuning() -> bool:
    """Is tuning on: portconv.tune() in this context, else PORTCONV_TUNE."""
    on = _tuning.get()
    return knobs.env().tune if on is None else on


def automatic() -> bool:
    """Whether a call without ``backend=`` gets the automatic plan of the default options: no use_backend(),
    PORTCONV_BACKEND, tuning, portconv.options() block or disabled aten backend (Note [ATen's modules])."""
    env = knobs.env()
    return (_forced.get() is None and not tuning() and knobs.options() is knobs.DEFAULT_OPTIONS
            and env.backend in (None, "auto") and "aten" not in env.disable)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A backend's decision for one problem: its kernels per result (KernelPlan), and the Runner of its calls."""

    problem: Problem
    backend: BackendId
    algorithm: str
    memory_format: str
    reason: str  # why this backend and family: '; '-separated parts, one explain() line each
    device: DeviceInfo
    math: str = "ieee"
    rejected: tuple[tuple[str, str], ...] = ()
    forced: bool = False
    options: Options = knobs.DEFAULT_OPTIONS
    kernels: tuple[KernelPlan, ...] = ()  # what runs, for the layouts the problem implies (Note [programs])
    aten_autograd: bool = False  # eager autograd records forward's ATen calls (Note [ATen-recorded plans])
    keeps_ops: bool = False  # unforced, yet Inductor keeps its ops (Note [own kernel wins compiled])
    runner: Runner | None = dataclasses.field(default=None, compare=False, repr=False)

    def forward(self, input, weight, bias=None):
        return self.runner.forward(input, weight, bias)

    def backward(self, grad_output, input, weight, output_mask=(True, True, True)):
        gi, gw, gb = output_mask  # three flags, as aten::convolution_backward takes
        return self.runner.backward(grad_output, input, weight, (bool(gi), bool(gw), bool(gb)))

    @property
    def torch_own(self) -> bool:
        """The plan is PyTorch's own convolution (the aten backend): under autocast and in compiled graphs its calls
        are PyTorch's (Note [autocast and ATen's plans], Note [ATen's plans in compiled graphs])."""
        return self.backend is BackendId.ATEN

    @property
    def compiled_as_aten(self) -> bool:
        """Inductor compiles this plan's calls as ATen's own convolution (Note [ATen's plans in compiled graphs]):
        an aten plan, or any plan of an unforced call but those of Note [own kernel wins compiled]."""
        return self.torch_own or not (self.forced or self.keeps_ops)

    def kernel(self, result: str) -> KernelPlan | None:
        """The KernelPlan of one result ('output', 'grad_input', 'grad_weight', 'grad_bias'), if the plan has one."""
        return next((k for k in self.kernels if k.result == result), None)

    def explain(self, device: bool = True, results: tuple[str, ...] = RESULTS) -> str:
        """The plan, one line per decision, each within WIDTH columns; ``device=False`` leaves out the device and
        its versions (a listing of many plans prints them once); ``results``: the KernelPlans to show."""
        rows = [("problem", self.problem.describe()),
                ("output", f"{list(self.problem.output_shape)} {self.memory_format}"),
                ("backend", f"{self.backend}{' (forced)' if self.forced else ''}: {self.algorithm}"),
                *(("why", part) for part in self.reason.split("; ") if part),
                *((("device", self.device.describe(versions=False)),
                   ("versions", self.device.describe_versions())) if device else ()),
                ("math", self.math),
                ("autograd", "ATen records the forward's calls (their backward is the plan's gradients)"
                 if self.aten_autograd else f"the native executor's C++ node ({native.status()}; Note [native "
                 "executor]), else portconv's autograd.Function, runs the plan's gradients"
                 if getattr(self.runner, "supports_native", False)
                 else "portconv's autograd.Function runs the plan's gradients"),
                ("compiled", "Inductor: aten.convolution and its backward, as PyTorch compiles them (static sizes)"
                 if self.compiled_as_aten else "Inductor: the portconv ops run this plan (" + (
                     "a forced backend)" if self.forced else "OWN_KERNEL_WINS: faster compiled too)"))]
        if self.options != knobs.DEFAULT_OPTIONS:
            rows.append(("options", self.options.describe()))
        for k in self.kernels:
            if k.result in results:
                rows += [(k.result, line) for line in k.lines()]
        rows += [(f"rejected {b}", why) for b, why in self.rejected]
        return "\n".join(_line(name, text) for name, text in rows)

    def as_dict(self) -> dict:
        return {"backend": str(self.backend), "algorithm": self.algorithm, "memory_format": self.memory_format,
                "math": self.math, "reason": self.reason, "forced": self.forced, "aten_autograd": self.aten_autograd,
                "options": self.options.describe(),
                "kernels": {k.result: k.lines() for k in self.kernels},
                "rejected": [list(r) for r in self.rejected], "device": self.device.as_dict()}


def _line(name: str, text: str) -> str:
    line = f"{name:<12} {text}"
    return line if len(line) <= WIDTH else line[:WIDTH - 3] + "..."


def build(problem: Problem, bid: BackendId, device: DeviceInfo, choice: Choice, options: Options,
          rejected: tuple = (), forced: bool = False) -> Plan:
    """The Plan of a chosen backend: its prepare() decides the kernels and makes the runner."""
    kernels, runner = _backends.get(bid).prepare(problem, device, choice, options)
    order = {r: i for i, r in enumerate(RESULTS)}
    plan = Plan(problem=problem, backend=bid, algorithm=choice.algorithm, memory_format=choice.memory_format,
                reason=choice.reason, device=device, math=choice.math, rejected=rejected, forced=forced,
                options=options, kernels=tuple(sorted(kernels, key=lambda k: order[k.result])),
                aten_autograd=bool(getattr(runner, "aten_autograd", False)), runner=runner)
    if getattr(runner, "supports_native", False):
        native.offer(plan)  # Note [native executor]
    return plan


def attempt(bid: BackendId, problem: Problem, options: Options) -> tuple[DeviceInfo, Choice]:
    """(device, choice) of ``bid`` for ``problem``; raises Unsupported with the reason."""
    impl = _backends.get(bid)
    avail = impl.probe()
    if not avail:
        raise Unsupported(avail.reason)
    device = impl.device_for(problem)
    return device, impl.choose(problem, device, options)


def resolved_options(env: knobs.Env, opts: Options) -> Options:
    """The options a plan is made with: the block's, with the environment's defaults where they say nothing."""
    if opts.opencl_dense is None and env.opencl_dense is not None:
        opts = dataclasses.replace(opts, opencl_dense=env.opencl_dense)
    if opts.opencl_tc is None and env.opencl_tc is not None:
        opts = dataclasses.replace(opts, opencl_tc=env.opencl_tc)
    return opts


# Note [plan cache]
# select() keeps one Plan per (problem, backend request, call state), least recently used first out beyond
# PORTCONV_PLAN_CACHE (Env.plan_cache). The call state is everything outside the arguments that can change a plan:
# the Env (Note [knobs]), use_backend(), tune(), the Options in force, and the torch flags that ATen's selection and
# portconv's checks read (rules.context.torch_flags). It costs about a microsecond: the Env is one object until
# knobs.reload().
_cache: collections.OrderedDict[tuple, Plan] = collections.OrderedDict()
_cache_lock = threading.Lock()
_clear_hooks: list[Callable[[], None]] = []  # other caches keyed on plans (the fast path)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
    for hook in _clear_hooks:
        hook()


knobs._reload_hooks.append(clear_cache)


def call_state(device_type: str) -> tuple:
    """Note [plan cache]: the call state of one call on ``device_type``."""
    return knobs.env(), _forced.get(), _tuning.get(), knobs.options(), torch_flags(device_type)


def select(problem: Problem, backend: str | BackendId | None = None, state: tuple | None = None) -> Plan:
    """Pick a backend for ``problem``. Explicit ``backend`` > use_backend() > PORTCONV_BACKEND > automatic.

    ``state``: call_state() when the caller already has it.
    """
    state = call_state(problem.input.device_type) if state is None else state
    env, opts = state[0], state[3]
    forced = backend if backend is not None else (_forced.get() or env.backend)
    forced_id = None if forced in (None, "auto") else BackendId.parse(forced)
    key = (problem, forced_id, state)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    plan = _select(problem, forced_id, env, resolved_options(env, opts))
    with _cache_lock:
        _cache[key] = plan
        while len(_cache) > env.plan_cache:
            _cache.popitem(last=False)
    return plan


def _select(problem: Problem, forced_id: BackendId | None, env: knobs.Env, options: Options) -> Plan:
    if forced_id is not None:
        try:
            device, choice = attempt(forced_id, problem, options)
        except Unsupported as e:
            raise BackendUnavailable(f"backend '{forced_id}' was requested but cannot run this problem: "
                                     f"{e.reason}\n  problem: {problem.describe()}") from None
        return build(problem, forced_id, device, choice, options, (), True)
    if tuning():
        from .tuning import select_tuned

        return select_tuned(problem, env.disable, options, attempt, build)
    if problem.input.kind == "torch" and problem.input.device_type in ("cuda", "cpu"):
        from .rules import TorchContext

        rule = policy.gpu_policy if problem.input.device_type == "cuda" else policy.cpu_policy
        ctx = TorchContext.from_torch(problem.input.device)
        prefer, passed = rule(problem, ctx)
        keep = rule is policy.gpu_policy and policy.compiled_win(problem, ctx) is not None
    else:
        prefer, passed, keep = tuple((b, "") for b in policy.candidates(problem)), (), False
    rejected: list[tuple[str, str]] = []
    for bid, why in prefer:
        plan = _attempt(problem, bid, why, env.disable, options, rejected, passed)
        if plan is not None:  # Note [own kernel wins compiled]: the row's own backend, not its ATen fallback
            return dataclasses.replace(plan, keeps_ops=True) if keep and bid == prefer[0][0] else plan
    # The preferred backends cannot run it: the others, in the place's order, as the last resort.
    tried = {b for b, _ in prefer}
    for bid in policy.candidates(problem):
        if bid not in tried:
            plan = _attempt(problem, bid, "last resort: the preferred backends cannot run it", env.disable, options,
                            rejected, ())
            if plan is not None:
                return plan
    reasons = "\n".join(f"  {b}: {why}" for b, why in dedup(rejected))
    raise BackendUnavailable(f"no portconv backend can run this problem ({problem.describe()}):\n{reasons}")


def _attempt(problem: Problem, bid: BackendId, why: str, disabled, options: Options, rejected: list,
             passed) -> Plan | None:
    """A plan on ``bid`` (its reason prefixed with ``why``), or None with the reason appended to ``rejected``."""
    if bid.value in disabled:
        rejected.append((bid.value, "disabled by PORTCONV_DISABLE"))
        return None
    try:
        device, choice = attempt(bid, problem, options)
    except Unsupported as e:
        rejected.append((bid.value, e.reason))
        return None
    if why:
        choice = dataclasses.replace(choice, reason=f"{why}; {choice.reason}")
    others = [(b.value, f"not preferred: {w}") for b, w in passed]
    return build(problem, bid, device, choice, options, dedup(rejected + others), False)


def dedup(rejected) -> tuple[tuple[str, str], ...]:
    return tuple(dict.fromkeys(rejected))


# --- one call, validated and planned: what functional.py, autograd.py and ops.py share -----------------------------
def make_problem(input, weight, bias, params: ConvParams) -> Problem:
    """Validate (PyTorch's checks and texts) and describe one batched problem. Runs no kernel."""
    ispec, wspec = spec_of(input), spec_of(weight)
    bspec = None if bias is None else spec_of(bias)
    validate.check_forward(ispec, wspec, bspec, params)
    return Problem(params=params, input=ispec, weight=wspec, has_bias=bias is not None)


def params_of(weight, stride, padding, dilation, transposed, output_padding, groups, backward=False) -> ConvParams:
    """aten::convolution's arguments as ConvParams, the rank taken from the weight."""
    shape = spec_of(weight).shape  # make() raises PyTorch's "weight should have at least three dimensions"
    return ConvParams.make(max(len(shape) - 2, 1), stride, padding, dilation, transposed, output_padding, groups,
                           weight_shape=shape, backward=backward)


def prepare(input, weight, bias, params: ConvParams, backend, state=None) -> Plan | None:
    """Validate and plan one batched call; None for ATen's Empty problems (no kernel runs)."""
    problem = make_problem(input, weight, bias, params)
    if validate.is_empty_problem(problem):
        return None
    return select(problem, backend, state)


def backward_problem(grad_output, input, weight, params: ConvParams, bias_sizes, mask) -> Problem:
    """The problem (no bias) of one convolution_backward call, after PyTorch's checks of it and its texts."""
    problem = make_problem(input, weight, None, params)
    validate.check_backward(spec_of(grad_output), problem, bias_sizes, mask)
    return problem
