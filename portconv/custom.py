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
        # Note [fast path]: a call seen before skips the checks and the argument expansion
        key = fastpath.key((self.name, "call"), input, weight, bias, (stride, padding, *rest), None)
        hit = fastpath.get(key)
        if hit is None:
            return self._call(input, weight, bias, stride, padding, rest, key, lean)
        params, is_batched, extra, args = hit
        x = input if is_batched else input[None]
        if extra:
            x = pad_extra(x, params)
        out = self._run(x, weight, bias, args, lean)
        return out if is_batched else out[0]

    def _run(self, x, weight, bias, args: tuple, lean: bool):
        """The op (what tracers, transforms and autocast see), or for a plain eager call the same kernels through a
        lean autograd.Function: torch.library's Python autograd costs more a call than the kernels of a small layer."""
        if not lean:
            return self.op(x, weight, bias, *args)
        if composite.fastpath.wants_grad(x, weight, bias):
            return _EagerCustom.apply(x, weight, bias, self, args)
        return self._real(x, weight, bias, *args)

    def _call(self, input, weight, bias, stride, padding, rest, key, lean: bool):
        rank = self.rank or weight.dim() - 2
        tracing = torch.compiler.is_compiling()
        fname = f"conv{'_transpose' if self.transposed else ''}{rank}d"
        is_batched = input.dim() == rank + 2 if tracing else validate.batchify(spec_of(input), rank, fname)
        x = input if is_batched else input[None]
        params = self._params(x, weight, stride, padding, rest)
        if not tracing:
            if not self.transposed and not isinstance(padding, str):  # F.conv*d compares the bias dtype first
                validate.check_functional_bias(spec_of(x), None if bias is None else spec_of(bias))
            validate.check_forward(spec_of(x), spec_of(weight), None if bias is None else spec_of(bias), params)
        args = (list(params.stride), list(params.padding), list(params.dilation), params.transposed,
                list(params.output_padding), params.groups)
        if not tracing:
            composite.fastpath.put(key, (params, is_batched, any(params.padding_extra), args))
        if any(params.padding_extra):
            x = pad_extra(x, params)
        out = self._run(x, weight, bias, args, lean)
        return out if is_batched else out[0]

    def explain(self, input, weight, bias=None, stride=1, padding=0, *rest) -> str:
        """What runs: the user kernel (or why not) for the forward, and portconv's plan for the gradients."""
        x = input if input.dim() == (self.rank or weight.dim() - 2) + 2 else input[None]
        params = self._params(x, weight, stride, padding, rest)
        problem = Problem(params, spec_of(x), spec_of(weight), bias is not None)
        ours = self.supports is None or bool(self.supports(problem))
        head = (f"forward      user kernel {self.name}" if ours else
                f"forward      portconv's own: {self.name}'s supports() rejects this problem")
        p = functional.plan(x, weight, bias, stride, padding, params.dilation, self.transposed,
                            params.output_padding, params.groups)
        text = p.explain(results=("grad_input", "grad_weight", "grad_bias") if ours else
                         ("output", "grad_input", "grad_weight", "grad_bias"))
        lines = [ln for ln in text.splitlines() if not ln.startswith("autograd ")]  # the op's own: the gradients
        return "\n".join([head, *lines, "autograd     the op's: portconv.convolution_backward on this plan"])

    # the op's kernels and autograd ------------------------------------------------------------------------------
    def _real(self, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        fastpath = composite.fastpath
        key = fastpath.key((self.name, "real"), input, weight, bias,
                           (stride, padding, dilation, "T" if transposed else "F", output_padding, groups), None)
        hit = fastpath.get(key)
        if hit is None:
            rank = weight.dim() - 2
            params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                                     weight_shape=tuple(weight.shape))
            problem = Problem(params, spec_of(input), spec_of(weight), bias is not None)
            hit = (params, problem, self.supports is None or bool(self.supports(problem)))
            fastpath.put(key, hit)
        params, problem, ours = hit
        if not ours:
            out = functional.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                         groups)
            return out.contiguous()
        args = (input, weight, bias, list(stride), list(padding))
        args += (list(output_padding), groups, list(dilation)) if transposed else (list(dilation), groups)
        out = self.fn(*args)
        want = params.output_shape(tuple(input.shape), tuple(weight.shape))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != input.dtype \
                or out.device != input.device:
            got = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise TypeError(f"{self.name}: the user kernel returned {got}; expected {want} {input.dtype} on "
                            f"{input.device}")
        if self.check and not self.checked:
            self.checked = True
            verdict = check_call(self.fn, args, out, params, problem)
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
    """A plain eager call of a custom forward: CustomForward._real forward, _gradients backward (differentiable:
    convolution_backward records itself when a graph is being built)."""

    @staticmethod
    def forward(ctx, input, weight, bias, custom: CustomForward, args: tuple):
        ctx.save_for_backward(input, weight)
        ctx.args, ctx.bias_sizes = args, (None if bias is None else [bias.shape[0]])
        return custom._real(input, weight, bias, *args)

    @staticmethod
    def backward(ctx, grad):
        return (*_gradients(ctx, grad), None, None)


def _rest(rest: tuple, defaults: tuple) -> tuple:
    return tuple(rest) + defaults[len(rest):]


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
