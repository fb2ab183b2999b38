"""The public API: torch.nn.functional-style convolutions, aten::convolution(_backward) and plan()."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from . import validate
from .backends import BackendId, Problem
from .params import ConvParams
from .plan import Plan, _clear_hooks, call_state, select
from .tensors import ARRAY_DEVICE_TYPES, array_key, spec_of


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


# Note [fast path]
# A repeated call skips spec building, validation and planning: _fast maps everything those read to their outcome
# (the plan, or None for ATen's Empty problems). The key holds, per tensor, its exact type, shape, strides, dtype and
# device; the arguments, accepted only as ints, strings or tuples/lists of ints (a float, bool or odd sequence
# takes the slow path, so equal-but-different values never share an entry); the backend request; and
# plan.call_state() (PORTCONV_* variables, use_backend, tune, the torch flags ATen's route and the checks read).
# Only calls that passed validation are stored, so bad input always reaches the checks and raises PyTorch's error
# before any kernel runs. What is not in the key is checked on every call: grad mode and requires_grad. pyopencl and
# cupy arrays take the same path (tensors.array_key: per array exactly what spec_of reads of it, the device by its
# OpenCL handle or CUDA ordinal); they carry no autograd. On the H100 a tiny conv2d through portconv.conv2d on pyopencl
# arrays cost 100 us a call without it, against 14 us for Plan.forward (docs/performance/h100-2026-11-26b).
_fast: dict[tuple, tuple] = {}
_FAST_MAX = 4096
_torch = None  # the torch module once it is imported (portconv never imports it for pyopencl/cupy arrays)
_tensor_types: tuple = ()
_strided = None
_clear_hooks.append(_fast.clear)


def _arg(v):
    t = type(v)
    if t is int or t is str:
        return v
    if t is bool:
        return bool, v  # True == 1: kept apart from the ints
    if (t is tuple or t is list) and all(type(e) is int for e in v):
        return tuple(v)
    raise TypeError  # not cacheable: the slow path decides


def _key_args(args: tuple) -> tuple:
    """The call's arguments as part of a key: as they are when all are ints, else through _arg (TypeError: not
    cacheable)."""
    for v in args:
        if type(v) is not int:
            return tuple(_arg(v) for v in args)
    return args


def _keyable_backend(backend) -> bool:
    return backend is None or type(backend) is str or type(backend) is BackendId


def _fast_key(name: str, input, weight, bias, args: tuple, backend) -> tuple | None:
    """Note [fast path]: the cache key of one call, or None when the call cannot use the cache."""
    global _torch, _tensor_types, _strided
    if _torch is None:
        _torch = sys.modules.get("torch")
        if _torch is None:
            return _array_call_key(name, input, weight, bias, args, backend)
        _tensor_types, _strided = (_torch.Tensor, _torch.nn.Parameter), _torch.strided
    tt = _tensor_types
    if type(input) not in tt:
        return _array_call_key(name, input, weight, bias, args, backend)
    if type(weight) not in tt or not _keyable_backend(backend):
        return None
    try:
        if input.layout is not _strided or weight.layout is not _strided:
            return None  # sparse or mkldnn tensors: the slow path decides
        if bias is None:
            b = None
        elif type(bias) in tt and bias.layout is _strided:
            b = (type(bias), bias.shape, bias.stride(), bias.dtype, bias.device)
        else:
            return None
        args = _key_args(args)
        dev = input.device
        return (name, type(input), input.shape, input.stride(), input.dtype, dev, type(weight), weight.shape,
                weight.stride(), weight.dtype, weight.device, b, args, backend, call_state(dev.type))
    except (TypeError, RuntimeError):  # not a strided tensor (sparse, mkldnn), or an argument the cache cannot key
        return None


def _array_call_key(name: str, input, weight, bias, args: tuple, backend) -> tuple | None:
    """Note [fast path] for a call on pyopencl or cupy arrays, or None when the call cannot use the cache."""
    ki, kw = array_key(input), array_key(weight)
    kb = None if bias is None else array_key(bias)
    if ki is None or kw is None or (bias is not None and kb is None) or not _keyable_backend(backend):
        return None
    try:
        args = _key_args(args)
    except TypeError:
        return None
    return name, ki, kw, kb, args, backend, call_state(ARRAY_DEVICE_TYPES[ki[0]])


def _hit(hit, input, weight, bias):
    """Run a cached call: the plan (None: ATen's Empty problem), autograd when a gradient is wanted."""
    p, params = hit[0], hit[1]
    if p is None:
        return validate.empty_forward(input, weight, bias, params)
    if type(input) not in _tensor_types:  # a pyopencl or cupy array
        return p.impl.forward(p, input, weight, bias)
    if _torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                     or (bias is not None and bias.requires_grad)):
        from .autograd import ConvFunction

        return ConvFunction.apply(input, weight, bias, p)
    return p.impl.forward(p, input, weight, bias)


def _remember(key, value) -> None:
    if key is not None:
        if len(_fast) >= _FAST_MAX:
            _fast.clear()
        _fast[key] = value


def _prepare(input, weight, bias, params: ConvParams, backend, state=None) -> Plan | None:
    """Validate and plan one batched call; None for ATen's Empty problems (no kernel runs)."""
    problem = make_problem(input, weight, bias, params)
    if validate.is_empty_problem(problem):
        return None
    return select(problem, backend, state)


def _execute(p: Plan | None, input, weight, bias, params: ConvParams):
    if p is None:
        return validate.empty_forward(input, weight, bias, params)
    if _is_torch(input):
        import torch

        if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            from .autograd import ConvFunction

            return ConvFunction.apply(input, weight, bias, p)
    return p.forward(input, weight, bias)


def _run(input, weight, bias, params: ConvParams, backend):
    return _execute(_prepare(input, weight, bias, params, backend), input, weight, bias, params)


def convolution(input, weight, bias=None, stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False, output_padding: Sequence[int] = (0,),
                groups: int = 1, backend=None):
    """``aten::convolution`` semantics (batched input, explicit parameters), on the chosen backend."""
    key = _fast_key("convolution", input, weight, bias, (stride, padding, dilation, transposed, output_padding,
                                                          groups), backend)
    hit = None if key is None else _fast.get(key)
    if hit is not None:  # Note [fast path]
        return _hit(hit, input, weight, bias)
    params = _params(weight, stride, padding, dilation, transposed, output_padding, groups)
    p = _prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    _remember(key, (p, params))
    return _execute(p, input, weight, bias, params)


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
    key = _fast_key(name, input, weight, bias, (stride, padding, dilation, groups, output_padding), backend)
    hit = None if key is None else _fast.get(key)
    if hit is not None:  # Note [fast path]
        if hit[2]:
            return _hit(hit, input, weight, bias)
        return _hit(hit, input[None], weight, bias)[0]
    if not transposed and not isinstance(padding, str):  # conv1d/2d/3d check the bias dtype first
        validate.check_functional_bias(spec_of(input), None if bias is None else spec_of(bias))
    is_batched = validate.batchify(spec_of(input), rank, name)
    if not is_batched:
        input = input[None]
    params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=spec_of(weight).shape, input_shape=spec_of(input).shape)
    p = _prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    _remember(key, (p, params, is_batched))
    out = _execute(p, input, weight, bias, params)
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
