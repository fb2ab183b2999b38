"""The public API: torch.nn.functional-style convolutions, aten::convolution(_backward) and plan()."""
from __future__ import annotations

from collections.abc import Sequence

from . import composite, fastpath, validate
from .params import ConvParams
from .planner import Plan, select
from .problem import Problem
from .tensors import spec_of


def make_problem(input, weight, bias, params: ConvParams) -> Problem:
    """Validate (PyTorch's checks and texts) and describe one batched problem. Runs no kernel."""
    ispec, wspec = spec_of(input), spec_of(weight)
    bspec = None if bias is None else spec_of(bias)
    validate.check_forward(ispec, wspec, bspec, params)
    return Problem(params=params, input=ispec, weight=wspec, has_bias=bias is not None)


def _params(weight, stride, padding, dilation, transposed, output_padding, groups, backward=False) -> ConvParams:
    shape = spec_of(weight).shape  # make() raises PyTorch's "weight should have at least three dimensions"
    return ConvParams.make(max(len(shape) - 2, 1), stride, padding, dilation, transposed, output_padding, groups,
                           weight_shape=shape, backward=backward)


def plan(input, weight, bias=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1,
         backend=None) -> Plan:
    """The plan portconv would use for this convolution (batched or unbatched input), without running it."""
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups)
    ispec = spec_of(input)
    if ispec.dim == params.rank + 1:
        input = input[None]
    return select(make_problem(input, weight, bias, params), backend)


def _function():
    """autograd.lean_apply (imported on first use: it imports torch)."""
    global _apply
    if _apply is None:
        from .autograd import lean_apply

        _apply = lean_apply
    return _apply


_apply = None


# A call's mode: 0 a public call (Note [eager and traced calls] is checked first), 1 that check done, 2 that check
# done and the call always recorded by ConvFunction (functorch transforms, forward AD).
def _execute(p: Plan | None, input, weight, bias, params: ConvParams, mode: int = 0):
    """Run a planned call (None: ATen's Empty problem), through autograd when a gradient is wanted."""
    if p is None:
        return validate.empty_forward(input, weight, bias, params)
    if mode == 2:
        from .autograd import ConvFunction

        return ConvFunction.apply(input, weight, bias, p)
    if fastpath.wants_grad(input, weight, bias):
        return (_apply or _function())(input, weight, bias, p)
    return p.runner.forward(input, weight, bias)


def _prepare(input, weight, bias, params: ConvParams, backend, state=None) -> Plan | None:
    """Validate and plan one batched call; None for ATen's Empty problems (no kernel runs)."""
    problem = make_problem(input, weight, bias, params)
    if validate.is_empty_problem(problem):
        return None
    return select(problem, backend, state)


def convolution(input, weight, bias=None, stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False, output_padding: Sequence[int] = (0,),
                groups: int = 1, backend=None):
    """``aten::convolution`` semantics (batched input, explicit parameters), on the chosen backend."""
    return _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend)


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend,
                 mode: int = 0):
    if mode == 0 and fastpath.special():  # Note [eager and traced calls]
        return composite.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                     groups, backend)
    key = fastpath.key("convolution", input, weight, bias, (stride, padding, dilation, transposed, output_padding,
                                                           groups), backend)
    hit = fastpath.get(key)
    if hit is not None:  # Note [fast path]
        return _execute(hit[0], input, weight, bias, hit[1], mode)
    if composite.foreign(input, weight, bias):
        return composite.traced_forward(input, weight, bias, _params(weight, stride, padding, dilation, transposed,
                                                                     output_padding, groups), backend)
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups)
    if spec_of(input).dtype in composite.COMPLEX:  # Note [complex convolution]
        return composite.complex_conv(lambda x, w, b: _convolution(x, w, b, stride, padding, dilation, transposed,
                                                                   output_padding, groups, backend, mode or 1),
                                      input, weight, bias)
    p = _prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    fastpath.put(key, (p, params))
    return _execute(p, input, weight, bias, params, mode)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask=(True, True, True), backend=None):
    """``aten::convolution_backward``: returns (grad_input, grad_weight, grad_bias), None where the mask is False.

    This is the call for a user who has a forward kernel of their own and needs a correct backward. Its results are
    differentiable (aten's double backward, Note [portconv autograd]) when an operand requires grad.
    """
    mode = 0
    if fastpath.special():  # Note [eager and traced calls]
        if composite.traced(input):
            return composite.traced_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                             transposed, output_padding, groups, output_mask, backend)
        mode = composite.mode(input)
    if composite.foreign(grad_output, input, weight):
        return composite.traced_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                         transposed, output_padding, groups, output_mask, backend)
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups, backward=True)
    problem = make_problem(input, weight, None, params)
    bias_sizes = None if bias_sizes is None else [int(s) for s in bias_sizes]
    validate.check_backward(spec_of(grad_output), problem, bias_sizes, output_mask)
    mask = tuple(bool(m) for m in output_mask)
    if validate.is_empty_problem(problem):
        return validate.empty_backward(grad_output, input, weight, params, mask, bias_sizes)
    p = select(problem, backend)
    if mode == 2 or fastpath.wants_grad(grad_output, input, weight):
        from .autograd import backward_apply

        return backward_apply(grad_output, input, weight, p, mask)
    return p.backward(grad_output, input, weight, mask)


def _convnd(rank: int, name: str, input, weight, bias, stride, padding, dilation, groups, backend,
            transposed=False, output_padding=0, mode: int = 0):
    if mode == 0 and fastpath.special():  # Note [eager and traced calls]
        return composite.convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend,
                                transposed, output_padding)
    key = fastpath.key(name, input, weight, bias, (stride, padding, dilation, groups, output_padding), backend)
    hit = fastpath.get(key)
    if hit is not None:  # Note [fast path]
        if hit[2]:
            return _execute(hit[0], input, weight, bias, hit[1], mode)
        return _execute(hit[0], input[None], weight, bias, hit[1], mode)[0]
    if composite.foreign(input, weight, bias):
        return composite.traced_convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend,
                                       transposed, output_padding)
    if not transposed and not isinstance(padding, str):  # conv1d/2d/3d check the bias dtype first
        validate.check_functional_bias(spec_of(input), None if bias is None else spec_of(bias))
    is_batched = validate.batchify(spec_of(input), rank, name)
    if spec_of(input).dtype in composite.COMPLEX:  # Note [complex convolution]
        return composite.complex_conv(lambda x, w, b: _convnd(rank, name, x, w, b, stride, padding, dilation, groups,
                                                              backend, transposed, output_padding, mode or 1),
                                      input, weight, bias)
    if not is_batched:
        input = input[None]
    params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=spec_of(weight).shape, input_shape=spec_of(input).shape)
    p = _prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    fastpath.put(key, (p, params, is_batched))
    out = _execute(p, input, weight, bias, params, mode)
    return out if is_batched else out[0]


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(1, "conv1d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(2, "conv2d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(3, "conv3d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(1, "conv_transpose1d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(2, "conv_transpose2d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(3, "conv_transpose3d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


fastpath._init_torch()  # with torch already imported: the custom ops registered before any tracer meets a call
