"""The public API: torch.nn.functional-style convolutions, aten::convolution(_backward) and plan()."""
from __future__ import annotations

from collections.abc import Sequence

from . import validate
from .backends import Problem
from .params import ConvParams
from .plan import Plan, select
from .tensors import spec_of


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


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


def _run(input, weight, bias, params: ConvParams, backend):
    problem = make_problem(input, weight, bias, params)
    if validate.is_empty_problem(problem):
        return validate.empty_forward(input, weight, bias, params)
    p = select(problem, backend)
    if _is_torch(input):
        import torch

        from .autograd import ConvFunction

        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
            return ConvFunction.apply(input, weight, bias, p)
    return p.forward(input, weight, bias)


def convolution(input, weight, bias=None, stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False, output_padding: Sequence[int] = (0,),
                groups: int = 1, backend=None):
    """``aten::convolution`` semantics (batched input, explicit parameters), on the chosen backend."""
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups)
    return _run(input, weight, bias, params, backend)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask=(True, True, True), backend=None):
    """``aten::convolution_backward``: returns (grad_input, grad_weight, grad_bias), None where the mask is False.

    This is the call for a user who has a forward kernel of their own and needs a correct backward.
    """
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups, backward=True)
    problem = make_problem(input, weight, None, params)
    bias_sizes = None if bias_sizes is None else [int(s) for s in bias_sizes]
    validate.check_backward(spec_of(grad_output), problem, bias_sizes, output_mask)
    mask = tuple(bool(m) for m in output_mask)
    if validate.is_empty_problem(problem):
        return validate.empty_backward(grad_output, input, weight, params, mask, bias_sizes)
    return select(problem, backend).backward(grad_output, input, weight, mask)


def _convnd(rank: int, name: str, input, weight, bias, stride, padding, dilation, groups, backend,
            transposed=False, output_padding=0):
    if not transposed and not isinstance(padding, str):  # conv1d/2d/3d check the bias dtype first
        validate.check_functional_bias(spec_of(input), None if bias is None else spec_of(bias))
    is_batched = validate.batchify(spec_of(input), rank, name)
    if not is_batched:
        input = input[None]
    params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=spec_of(weight).shape, input_shape=spec_of(input).shape)
    out = _run(input, weight, bias, params, backend)
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
