"""Run conformance cases on one backend: plan, forward, convolution_backward, compare with the float64 reference."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import time
import traceback
from collections.abc import Sequence

import torch

from .. import functional, knobs
from ..backends import BackendId
from ..backends import get as get_backend
from ..errors import BackendUnavailable, Unsupported
from . import cases as _cases
from .reference import TENSORS, Inputs, make_inputs, output_shape, reference
from .report import Progress, Report
from .tolerance import TensorCheck, check, not_requested

DEFAULT_DTYPES = ("float32", "float64")
_CUDA_BACKENDS = (BackendId.CUDA, BackendId.CUDNN, BackendId.HIP, BackendId.MIOPEN)


def default_device(backend: str | None) -> torch.device:
    """Where a backend's torch tensors live: CUDA/ROCm backends on the current GPU, OpenCL on CPU tensors,
    aten (or automatic selection) on the GPU when torch has one, else the CPU."""
    bid = None if backend in (None, "auto") else BackendId.parse(backend)
    if bid in _CUDA_BACKENDS or (bid in (None, BackendId.ATEN) and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return torch.device("cpu")


@contextlib.contextmanager
def poisoned(on: bool = True):
    """Poisoning on inside the block (backends NaN-fill outputs before their kernels run); off leaves it as is."""
    if not on:
        yield
        return
    with knobs.with_env(poison=True):
        yield


@dataclasses.dataclass
class CaseResult:
    case: _cases.Case
    dtype: str
    status: str  # 'pass', 'fail', 'unsupported'
    reason: str = ""  # why unsupported, or the first failure
    plan: dict | None = None
    tensors: dict[str, TensorCheck] = dataclasses.field(default_factory=dict)
    time_s: float = 0.0
    kind: str = "conformance"  # or 'gradcheck'
    device_info: object = None  # the plan's DeviceInfo

    @property
    def id(self) -> str:
        return self.case.id

    def errors(self) -> list[str]:
        msgs = [self.reason] if self.status == "fail" and self.reason else []
        for t in self.tensors.values():
            if t.failed and t.message:
                msgs.append(t.message)
        return list(dict.fromkeys(msgs))  # one exception fails several tensors: say it once

    def as_dict(self) -> dict:
        return {"id": self.id, "key": self.case.key, "family": self.case.family, "dtype": self.dtype,
                "kind": self.kind, "status": self.status, "reason": self.reason, "describe": self.case.describe(),
                "plan": self.plan, "time_s": round(self.time_s, 6), "errors": self.errors(),
                "tensors": {k: v.as_dict() for k, v in self.tensors.items()}}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _err(what: str, e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{what} raised {type(e).__name__}: {e}{where}"


def plan_for(case: _cases.Case, inputs: Inputs, backend: str | None):
    """The plan the backend makes for this case; raises BackendUnavailable/Unsupported with the plan's reason."""
    return functional.plan(inputs.input, inputs.weight, inputs.bias, **case.conv_args(), backend=backend)


def _warm_up(case: _cases.Case, dtype: str, device: torch.device, backend: str, poison: bool) -> None:
    """Note [checked call is the second]: one forward and backward on other tensors of the same layouts first, so
    the checked calls take the path a training loop takes (functional's fast path, the plan's runner with its loaded
    programs, Note [programs]). Errors are left to the checked calls, which raise them again."""
    other = make_inputs(case, dtype, device, output_shape(case), fill=False)
    args = case.conv_args()
    with poisoned(poison):
        try:
            functional.convolution(other.input, other.weight, other.bias, **args, backend=backend)
            functional.convolution_backward(other.grad_output, other.input, other.weight, [case.k], args["stride"],
                                            args["padding"], args["dilation"], args["transposed"],
                                            args["output_padding"], args["groups"], case.mask, backend=backend)
        except Exception:  # noqa: BLE001, S110 - the checked calls below report it
            pass


def run_case(case: _cases.Case, backend: str, dtype: str, device: str | torch.device | None = None,
             poison: bool = True, warm: bool = True) -> CaseResult:
    """One case in one dtype: plan, forward, backward (with the case's output_mask), compare all four tensors.

    ``warm``: the checked calls are the plan's second (Note [checked call is the second])."""
    device = torch.device(device) if device is not None else default_device(backend)
    inputs = make_inputs(case, dtype, device, output_shape(case))
    try:
        plan = plan_for(case, inputs, backend)
    except (BackendUnavailable, Unsupported) as e:
        return CaseResult(case, dtype, "unsupported", str(e).split("\n  problem:")[0])
    except Exception as e:  # noqa: BLE001 - a valid torch problem the planner rejects is a failure, recorded
        return CaseResult(case, dtype, "fail", _err("planning", e))
    res = CaseResult(case, dtype, "pass", plan={"algorithm": plan.algorithm, "memory_format": plan.memory_format,
                                                "math": plan.math, "backend": str(plan.backend),
                                                "device": plan.device.describe()}, device_info=plan.device)
    if warm:
        _warm_up(case, dtype, device, backend, poison)
    snapshot = {k: v.clone() for k, v in inputs.tensors().items()}
    ref = reference(case, inputs)
    args = case.conv_args()
    got: dict[str, object] = {}
    raised: dict[str, str] = {}
    t0 = time.perf_counter()
    with poisoned(poison):
        try:
            got["forward"] = functional.convolution(inputs.input, inputs.weight, inputs.bias, **args, backend=backend)
        except Exception as e:  # noqa: BLE001 - recorded as this tensor's failure
            raised["forward"] = _err("forward", e)
        try:
            grads = functional.convolution_backward(
                inputs.grad_output, inputs.input, inputs.weight, [case.k], args["stride"], args["padding"],
                args["dilation"], args["transposed"], args["output_padding"], args["groups"], case.mask,
                backend=backend)
            if not (isinstance(grads, (tuple, list)) and len(grads) == 3):
                raise TypeError(f"convolution_backward returned {type(grads).__name__}, expected a 3-tuple")
            got.update(zip(TENSORS[1:], grads))
        except Exception as e:  # noqa: BLE001 - recorded as the gradients' failure
            for name in TENSORS[1:]:
                raised[name] = _err("convolution_backward", e)
        _sync(device)
    res.time_s = time.perf_counter() - t0
    lengths = case.reduction_lengths()
    wanted = dict(zip(TENSORS, (True, *case.mask)))
    for name in TENSORS:
        if name in raised and wanted[name]:
            res.tensors[name] = TensorCheck(name, "fail", message=raised[name])
        elif not wanted[name]:
            res.tensors[name] = not_requested(name, got.get(name))
        else:
            res.tensors[name] = check(name, got.get(name), ref.value[name], ref.absolute[name], lengths[name], dtype,
                                      plan.math, device, ref.partial.get(name))
    changed = [k for k, v in inputs.tensors().items() if not torch.equal(v, snapshot[k])]
    failed = [t.message for t in res.tensors.values() if t.failed]
    if changed:
        failed.insert(0, f"the backend modified the caller's {', '.join(changed)}")
    if failed:
        res.status, res.reason = "fail", failed[0]
    return res


def gradcheck_case(case: _cases.Case, backend: str, device: str | torch.device | None = None,
                   poison: bool = True) -> CaseResult:
    """torch.autograd.gradcheck in float64 through portconv.convolution (portconv's autograd) on ``backend``."""
    device = torch.device(device) if device is not None else default_device(backend)
    inputs = make_inputs(case, "float64", device)
    try:
        plan_for(case, inputs, backend)
    except (BackendUnavailable, Unsupported) as e:
        return CaseResult(case, "float64", "unsupported", str(e).split("\n  problem:")[0], kind="gradcheck")
    leaves = [t.detach().requires_grad_() for t in (inputs.input, inputs.weight, inputs.bias) if t is not None]
    args = case.conv_args()

    def fn(*ts):
        return functional.convolution(ts[0], ts[1], ts[2] if len(ts) > 2 else None, **args, backend=backend)

    t0 = time.perf_counter()
    with poisoned(poison):
        try:
            torch.autograd.gradcheck(fn, tuple(leaves), eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True)
            status, msg = "pass", ""
        except Exception as e:  # noqa: BLE001 - GradcheckError or a backend error: the case fails with it
            status, msg = "fail", _err("gradcheck", e)[:1500]
    res = CaseResult(case, "float64", status, msg, time_s=time.perf_counter() - t0, kind="gradcheck")
    res.tensors["gradcheck"] = TensorCheck("gradcheck", status, message=msg)
    return res


def gradgradcheck_case(case: _cases.Case, backend: str, device: str | torch.device | None = None,
                       poison: bool = True) -> CaseResult:
    """The rest of PyTorch's autograd contract in float64 through portconv.convolution on ``backend``: gradcheck's
    forward-AD and batched (vmap) checks, and gradgradcheck (reverse-over-reverse and forward-over-reverse, batched).
    Reported as a gradcheck result of its own, '<case id>:2nd-order'."""
    device = torch.device(device) if device is not None else default_device(backend)
    named = dataclasses.replace(case, name=f"{case.id}:2nd-order")
    inputs = make_inputs(case, "float64", device)
    try:
        plan_for(case, inputs, backend)
    except (BackendUnavailable, Unsupported) as e:
        return CaseResult(named, "float64", "unsupported", str(e).split("\n  problem:")[0], kind="gradcheck")
    leaves = tuple(t.detach().requires_grad_() for t in (inputs.input, inputs.weight, inputs.bias) if t is not None)
    args = case.conv_args()

    def fn(*ts):
        return functional.convolution(ts[0], ts[1], ts[2] if len(ts) > 2 else None, **args, backend=backend)

    tol = dict(eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True)
    checks = {
        "forward_ad": lambda: torch.autograd.gradcheck(fn, leaves, check_forward_ad=True, check_batched_grad=True,
                                                       check_batched_forward_grad=True, **tol),
        "gradgradcheck": lambda: torch.autograd.gradgradcheck(fn, leaves, check_fwd_over_rev=True,
                                                              check_batched_grad=True, **tol),
    }
    res = CaseResult(named, "float64", "pass", kind="gradcheck")
    t0 = time.perf_counter()
    with poisoned(poison):
        for name, check_fn in checks.items():
            try:
                check_fn()
                res.tensors[name] = TensorCheck(name, "pass")
            except Exception as e:  # noqa: BLE001 - GradcheckError or a backend error: the case fails with it
                msg = _err(name, e)[:1500]
                res.tensors[name] = TensorCheck(name, "fail", message=msg)
                if res.status == "pass":
                    res.status, res.reason = "fail", msg
    res.time_s = time.perf_counter() - t0
    return res


def run(backend: str = "opencl", dtypes: Sequence[str] = DEFAULT_DTYPES, cases: Sequence[_cases.Case] | None = None,
        progress: bool = True, json_path: str | None = None, device: str | torch.device | None = None,
        gradcheck: bool = True, poison: bool = True) -> Report:
    """The conformance suite on one backend. Raises BackendUnavailable (with the probe's reason) if it is absent."""
    bid = BackendId.parse(backend)
    avail = get_backend(bid).probe()
    if not avail:
        raise BackendUnavailable(f"backend '{bid}' is unavailable: {avail.reason}")
    device = torch.device(device) if device is not None else default_device(str(bid))
    cases = list(_cases.all_cases() if cases is None else cases)
    grads = _cases.gradcheck_cases() if gradcheck else []
    report = Report(backend=str(bid), dtypes=list(dtypes), probe=avail.reason, tensor_device=str(device),
                    started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    bar = Progress(len(cases) * len(dtypes) + 2 * len(grads), enabled=progress, title=f"conform {bid}")
    t0 = time.perf_counter()
    with poisoned(poison):
        report.record_knobs()
        for dtype in dtypes:
            for case in cases:
                r = run_case(case, str(bid), dtype, device, poison)
                report.add(r)
                bar.update(f"{dtype} {case.id}", failed=r.status == "fail")
        for case in grads:
            r = gradcheck_case(case, str(bid), device, poison)
            report.add(r)
            bar.update(f"gradcheck {case.id}", failed=r.status == "fail")
            r = gradgradcheck_case(case, str(bid), device, poison)
            report.add(r)
            bar.update(f"gradgradcheck {case.id}", failed=r.status == "fail")
    bar.close()
    report.finish(time.perf_counter() - t0)
    if json_path:
        report.write_json(json_path)
    return report
