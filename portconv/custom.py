"""Bring your own forward kernel: a user's convolution forward as a differentiable, compilable torch op whose
gradients are portconv's (Note [custom forward])."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from . import composite, functional, validate
from .backends.torchlib import pad_extra
from .conformance import tolerance
from .params import ConvParams
from .problem import Problem
from .tensors import spec_of

# Note [custom forward]
# custom_forward(name)(fn) registers the torch.library op ``name``: (input, weight, bias, stride, padding, dilation,
# transposed, output_padding, groups) -> output, batched input, every argument expanded per spatial dim and padding
# symmetric. Its real kernel runs ``fn`` on problems ``supports`` accepts (every problem when it is None) and
# portconv's own forward elsewhere; either way the result is contiguous, which the fake kernel promises. Its
# autograd is portconv.convolution_backward on the same problem (a plan of its own, with its reasons; itself
# differentiable), so the op trains, double-backwards and compiles (fullgraph: the backward becomes
# portconv::convolution_backward). The Python wrapper gives the F.conv*d signature: autocast as ATen casts a
# convolution, PyTorch's checks and texts before any kernel runs (the fake kernel repeats them under a tracer),
# unbatched input, and padding='same''s extra high side applied as F.conv*d does. With check=True the first problem
# that reaches ``fn`` is compared with PyTorch in float64 (the conformance suite's tolerance): a wrong kernel
# raises there, with the numbers, before its output is used.
_SCHEMA = ("(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, "
           "bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor")


class CustomForward:
    """A user forward kernel registered as the op ``name`` (Note [custom forward]); call it as F.conv*d (or
    F.conv_transpose*d with ``transposed=True``)."""

    def __init__(self, name: str, fn: Callable, supports: Callable[[Problem], bool] | None = None,
                 check: bool = True, transposed: bool = False, rank: int | None = None):
        if "::" not in name:
            raise ValueError(f"custom_forward: name must be 'namespace::op', not {name!r}")
        if rank not in (None, 1, 2, 3):
            raise ValueError(f"custom_forward: rank must be 1, 2, 3 or None (the weight's), not {rank!r}")
        self.name, self.fn, self.supports, self.check, self.transposed = name, fn, supports, check, transposed
        self.rank = rank  # None: F.conv*d of the weight's rank; 1, 2, 3: exactly F.conv{rank}d, its checks too
        self.checked = False
        self.op = torch.library.custom_op(name, mutates_args=(), schema=_SCHEMA)(self._real)
        self.op.register_fake(self._fake)
        self.op.register_autograd(self._backward, setup_context=self._setup)

    # the F.conv*d-style entry ---------------------------------------------------------------------------------
    def _params(self, x, weight, stride, padding, rest) -> ConvParams:
        """The call's ConvParams: ``rest`` is F.conv*d's (dilation, groups) or F.conv_transpose*d's (output_padding,
        groups, dilation); ``x`` batched."""
        if self.transposed:
            output_padding, groups, dilation = _rest(rest, (0, 1, 1))
        else:
            (dilation, groups), output_padding = _rest(rest, (1, 1)), 0
        return ConvParams.make(self.rank or weight.dim() - 2, stride, padding, dilation, self.transposed,
                               output_padding, groups, weight_shape=tuple(weight.shape), input_shape=tuple(x.shape))

    def __call__(self, input, weight, bias=None, stride=1, padding=0, *rest):
        fastpath = composite.fastpath
        lean = not fastpath.special()  # Note [eager and traced calls]: plain eager calls skip the op's dispatch
        if not lean:
            input, weight, bias = composite.autocast(input, weight, bias)
            if torch.compiler.is_compiling():
                return self._call(input, weight, bias, stride, padding, rest, None, False)
        # Note [fast path]: a call seen before skips the checks, the argument expansion and the supports() decision
        key = fastpath.key((self.name, "call"), input, weight, bias, (stride, padding, *rest), None)
        hit = fastpath.get(key)
        if hit is None:
            return self._call(input, weight, bias, stride, padding, rest, key, lean)
        params, is_batched, args, decided = hit
        x = input if is_batched else input[None]
        if any(params.padding_extra):
            x = pad_extra(x, params)
        out = self._run(x, weight, bias, args, lean, decided)
        return out if is_batched else out[0]

    def _run(self, x, weight, bias, args: tuple, lean: bool, decided: tuple | None):
        """The op (what tracers, transforms and autocast see), or for a plain eager call the same kernels through a
        lean autograd.Function: torch.library's Python autograd costs more a call than the kernels of a small layer."""
        if not lean or decided is None:
            return self.op(x, weight, bias, *args)
        if composite.fastpath.wants_grad(x, weight, bias):
            return _EagerCustom.apply(x, weight, bias, self, args, decided)
        return self._forward(x, weight, bias, args, decided)

    def _op_call(self, input, weight, stride, padding, rest) -> tuple[bool, ConvParams, tuple]:
        """(batched, the call's ConvParams, the op's arguments) of an F.conv*d-style call, unchecked."""
        rank = self.rank or weight.dim() - 2
        is_batched = input.dim() == rank + 2
        params = self._params(input if is_batched else input[None], weight, stride, padding, rest)
        return is_batched, params, (list(params.stride), list(params.padding), list(params.dilation),
                                    params.transposed, list(params.output_padding), params.groups)

    def _call(self, input, weight, bias, stride, padding, rest, key, lean: bool):
        tracing = torch.compiler.is_compiling()
        if not tracing:
            rank = self.rank or weight.dim() - 2
            validate.batchify(spec_of(input), rank, f"conv{'_transpose' if self.transposed else ''}{rank}d")
        is_batched, params, args = self._op_call(input, weight, stride, padding, rest)
        x = input if is_batched else input[None]
        if not tracing:
            if not self.transposed and not isinstance(padding, str):  # F.conv*d compares the bias dtype first
                validate.check_functional_bias(spec_of(x), None if bias is None else spec_of(bias))
            validate.check_forward(spec_of(x), spec_of(weight), None if bias is None else spec_of(bias), params)
        if any(params.padding_extra):
            x = pad_extra(x, params)
        decided = None
        if key is not None:  # an eager call on real tensors: decided once, kept with the call's entry
            decided = self._decide(x, weight, bias, args)
            composite.fastpath.put(key, (params, is_batched, args, decided))
        out = self._run(x, weight, bias, args, lean, decided)
        return out if is_batched else out[0]

    def explain(self, input, weight, bias=None, stride=1, padding=0, *rest) -> str:
        """What runs: the user kernel (or why not) for the forward, and portconv's plan for the gradients."""
        ours = self.takes(input, weight, bias, stride, padding, *rest)
        head = (f"forward      user kernel {self.name}" if ours else
                f"forward      portconv's own: {self.name}'s supports() rejects this problem")
        is_batched, params, _ = self._op_call(input, weight, stride, padding, rest)
        p = functional.plan(input if is_batched else input[None], weight, bias, stride, padding, params.dilation,
                            self.transposed, params.output_padding, params.groups)
        text = p.explain(results=("grad_input", "grad_weight", "grad_bias") if ours else
                         ("output", "grad_input", "grad_weight", "grad_bias"))
        lines = [ln for ln in text.splitlines() if not ln.startswith("autograd ")]  # the op's own: the gradients
        return "\n".join([head, *lines, "autograd     the op's: portconv.convolution_backward on this plan"])

    def takes(self, input, weight, bias=None, stride=1, padding=0, *rest) -> bool:
        """Whether an F.conv*d-style call runs the user kernel: supports() on the problem the op receives (the
        input batched, padding='same''s extra side applied)."""
        is_batched, params, args = self._op_call(input, weight, stride, padding, rest)
        x = input if is_batched else input[None]
        if any(params.padding_extra):
            x = pad_extra(x, params)
        return self._decide(x, weight, bias, args)[2]

    # the op's kernels and autograd ------------------------------------------------------------------------------
    def _decide(self, input, weight, bias, args: tuple) -> tuple:
        """(params, problem, whether the user kernel takes it, the output shape) of the op's arguments."""
        stride, padding, dilation, transposed, output_padding, groups = args
        params = ConvParams.make(weight.dim() - 2, stride, padding, dilation, transposed, output_padding, groups,
                                 weight_shape=tuple(weight.shape))
        problem = Problem(params, spec_of(input), spec_of(weight), bias is not None)
        ours = self.supports is None or bool(self.supports(problem))
        return params, problem, ours, params.output_shape(tuple(input.shape), tuple(weight.shape))

    def _real(self, input, weight, bias, *args):
        """The op's kernel (CPU and CUDA): the decision cached per call signature (Note [fast path]), then _forward."""
        fastpath = composite.fastpath
        key = fastpath.key((self.name, "real"), input, weight, bias, args, None)
        decided = fastpath.get(key)
        if decided is None:
            decided = self._decide(input, weight, bias, args)
            fastpath.put(key, decided)
        return self._forward(input, weight, bias, args, decided)

    def _forward(self, input, weight, bias, args: tuple, decided: tuple):
        """The user kernel on a problem it takes (portconv's own forward elsewhere), its result checked as the
        kernel's contract and, once (check=True), against PyTorch in float64."""
        stride, padding, dilation, transposed, output_padding, groups = args
        params, problem, ours, want = decided
        if not ours:
            out = functional.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                         groups)
            return out.contiguous()
        call = (input, weight, bias, list(stride), list(padding))
        call += (list(output_padding), groups, list(dilation)) if transposed else (list(dilation), groups)
        out = self.fn(*call)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != input.dtype \
                or out.device != input.device:
            got = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise TypeError(f"{self.name}: the user kernel returned {got}; expected {want} {input.dtype} on "
                            f"{input.device}")
        if self.check and not self.checked:
            self.checked = True
            verdict = check_call(self.fn, call, out, params, problem)
            if verdict:
                self.checked = False
                raise ValueError(f"{self.name}: the user kernel's output is wrong on {problem.describe()}: {verdict}")
        return out.contiguous()

    def _fake(self, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        from .ops import _specs  # fake tensors' specs at their size hints (Note [custom ops])

        params = ConvParams.make(weight.dim() - 2, stride, padding, dilation, transposed, output_padding, groups,
                                 weight_shape=tuple(weight.shape))
        ispec, wspec, *bspec = _specs(input, weight, *(() if bias is None else (bias,)))
        validate.check_forward(ispec, wspec, bspec[0] if bspec else None, params)  # under a tracer, the wrapper's
        return input.new_empty(params.output_shape(tuple(input.shape), tuple(weight.shape)))

    @staticmethod
    def _setup(ctx, inputs, output):
        input, weight, bias, *args = inputs
        ctx.save_for_backward(input, weight)
        ctx.args, ctx.bias_sizes = args, (None if bias is None else [bias.shape[0]])

    @staticmethod
    def _backward(ctx, grad):
        return (*_gradients(ctx, grad), None, None, None, None, None, None)


def _gradients(ctx, grad) -> tuple:
    """(grad_input, grad_weight, grad_bias) of a custom forward: portconv's backward of the same problem."""
    input, weight = ctx.saved_tensors
    mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.bias_sizes is not None and ctx.needs_input_grad[2])
    return functional.convolution_backward(grad, input, weight, ctx.bias_sizes, *ctx.args, mask)


class _EagerCustom(torch.autograd.Function):
    """A plain eager call of a custom forward: CustomForward._forward forward, _gradients backward (differentiable:
    convolution_backward records itself when a graph is being built)."""

    @staticmethod
    def forward(ctx, input, weight, bias, custom: CustomForward, args: tuple, decided: tuple):
        ctx.save_for_backward(input, weight)
        ctx.args, ctx.bias_sizes = args, (None if bias is None else [bias.shape[0]])
        return custom._forward(input, weight, bias, args, decided)

    @staticmethod
    def backward(ctx, grad):
        return (*_gradients(ctx, grad), None, None, None)


def _rest(rest: tuple, defaults: tuple) -> tuple:
    return tuple(rest) + defaults[len(rest):]


def load(ref: str):
    """The object 'module:attr' names, the module found as `python -c` finds it (the current folder first); ValueError
    with the cause where it cannot be loaded (`portconv conform --custom`, `portconv bench --custom`)."""
    import importlib
    import os
    import sys

    mod, _, attr = ref.partition(":")
    if not mod or not attr:
        raise ValueError(f"{ref!r}: give module:attr")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{ref!r}: cannot load it: {type(e).__name__}: {e}") from e


def custom_forward(name: str, supports: Callable[[Problem], bool] | None = None, check: bool = True,
                   transposed: bool = False, rank: int | None = None) -> Callable[[Callable], CustomForward]:
    """Decorator: ``fn(input, weight, bias, stride, padding, dilation, groups) -> Tensor`` (transposed: ``(input,
    weight, bias, stride, padding, output_padding, groups, dilation)``), arguments validated and expanded per
    spatial dim, input batched, becomes a torch op ``name`` with F.conv*d's signature whose gradients are portconv's
    (Note [custom forward]). ``supports(problem)``: False sends a problem to portconv's own forward. ``rank``: the
    F.conv{rank}d it stands for (None: the weight's rank decides)."""
    return lambda fn: CustomForward(name, fn, supports, check, transposed, rank)


# --- checking a user kernel ------------------------------------------------------------------------------------
def check_call(fn, args: tuple, out, params: ConvParams, problem: Problem) -> str:
    """'' when ``out`` (fn's result for ``args``) is within the conformance tolerance of PyTorch in float64, else
    the numbers."""
    x, w, b = args[:3]
    with torch.no_grad():
        x64, w64, b64 = (None if t is None else t.detach().to("cpu", torch.float64) for t in (x, w, b))
        args64 = (list(params.stride), list(params.padding), list(params.dilation), params.transposed,
                  list(params.output_padding), params.groups)
        ref = torch.convolution(x64, w64, b64, *args64)  # on the CPU, where tolerance.check compares
        absref = torch.convolution(x64.abs(), w64.abs(), None if b64 is None else b64.abs(), *args64)
    length = (w.shape[0] // params.groups if params.transposed else w.shape[1]) * math.prod(w.shape[2:])
    got = tolerance.check("forward", out, ref, absref, length, problem.dtype, "ieee", x.device)
    return "" if not got.failed else got.message


@dataclasses.dataclass
class CheckReport:
    """check_forward's verdict per (case, dtype): 'pass', 'fail' (with the numbers) or 'skipped' (why)."""

    name: str
    rows: list[dict]

    @property
    def ok(self) -> bool:
        return any(r["status"] == "pass" for r in self.rows) and not self.failures

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "fail"]

    def __str__(self) -> str:
        counts = {s: sum(r["status"] == s for r in self.rows) for s in ("pass", "fail", "skipped")}
        lines = [f"{self.name}: {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped "
                 "against PyTorch float64 (the conformance suite's tolerance)"]
        lines += [f"  FAIL {r['case']} {r['dtype']}: {r['reason']}" for r in self.failures]
        return "\n".join(lines)


def check_forward(fn, cases: Sequence | None = None, dtypes: Sequence[str] = ("float32", "float64"),
                  device: str | torch.device = "cpu", transposed: bool | None = None) -> CheckReport:
    """Run a user forward kernel (a plain function as custom_forward takes, or a CustomForward) over the
    conformance cases it accepts (its ``supports``; its kind, convolution or transposed) against PyTorch in
    float64, with the suite's tolerances; NaN never passes."""
    from .conformance import cases as C
    from .conformance.reference import make_inputs, output_shape, reference

    custom = fn if isinstance(fn, CustomForward) else None
    kernel = custom.fn if custom else fn
    transposed = custom.transposed if custom else bool(transposed)
    supports = custom.supports if custom else None
    rows = []
    for case in (C.all_cases() if cases is None else cases):
        if case.transposed != transposed or case.n == 0:
            continue
        for dtype in dtypes:
            row = {"case": case.id, "dtype": dtype}
            rows.append(row)
            inputs = make_inputs(case, dtype, device, output_shape(case))
            a = case.conv_args()
            params = ConvParams.make(case.rank, a["stride"], a["padding"], a["dilation"], a["transposed"],
                                     a["output_padding"], a["groups"], weight_shape=tuple(inputs.weight.shape))
            problem = Problem(params, spec_of(inputs.input), spec_of(inputs.weight), inputs.bias is not None)
            if supports is not None and not supports(problem):
                row.update(status="skipped", reason="supports() rejects it")
                continue
            x = pad_extra(inputs.input, params) if any(params.padding_extra) else inputs.input  # as the wrapper
            args = (x, inputs.weight, inputs.bias, list(params.stride), list(params.padding))
            args += ((list(params.output_padding), params.groups, list(params.dilation)) if transposed
                     else (list(params.dilation), params.groups))
            try:
                with torch.no_grad():
                    out = kernel(*args)
            except Exception as e:  # noqa: BLE001 - the kernel's failure is this row's verdict
                row.update(status="fail", reason=f"raised {type(e).__name__}: {e}"[:500])
                continue
            ref = reference(case, inputs)
            got = tolerance.check("forward", out, ref.value["forward"], ref.absolute["forward"],
                                  case.reduction_lengths()["forward"], dtype, "ieee", inputs.input.device)
            row.update(status="fail" if got.failed else "pass", reason=got.message if got.failed else "")
    return CheckReport(getattr(custom, "name", getattr(kernel, "__name__", "kernel")), rows)
