"""torch.library ops portconv::convolution and portconv::convolution_backward: what torch.compile and export see."""
from __future__ import annotations

import dataclasses

import torch

from . import derivatives, fastpath, knobs, planner, validate
from .backends.torchlib import pad_extra, torch_format, unpad
from .params import ConvParams
from .tensors import TensorSpec, dense_strides, spec_of

# Note [custom ops]
# Eager calls run on the lean path (functional -> fastpath -> ConvFunction); a call that a tracer records
# (torch.compile, torch.export, make_fx, any torch dispatch mode: composite.traced(input)) becomes one of these ops:
#   portconv::convolution            aten::convolution's arguments and result, plus the backend request;
#   portconv::convolution_backward   aten::convolution_backward's, plus the request ('' = automatic).
# The real kernels plan when they run, through the same fast path as eager calls: plan lookup and its caches stay
# outside any graph, and the plan cache's key holds everything a plan depends on (Note [plan cache]). The fake
# kernels validate with PyTorch's checks and texts and give each result the memory format of the plan made from
# the fake tensors' specs (planning reads only specs, device facts and flags; it runs with fake mode off, so what
# a backend caches is real; the real call then finds that plan cached). The real kernels return exactly the dense
# strides of their plan's format (_restride: as they are; a free restride where only size-1 dims differ; else a
# copy, which no backend needs today), so what Inductor assumes of a result holds, unless portconv's context
# (use_backend, PORTCONV_* knobs, torch flags) changes between tracing and running in a way that changes a plan's
# format: Inductor's stride assertion then says so. A format depends on sizes only where an operand is
# channels-last (ATen's CPU route and cuDNN's depthwise choice vary with sizes there): with symbolic sizes such a
# call is specialised to its sizes (guard_int); elsewhere it plans on the size hints without a guard.
# CUDA graphs (mode="reduce-overhead"): the real kernels allocate every result and workspace through torch's
# allocator, launch on torch's current stream and never synchronise the host, and keep no tensor between calls;
# plan lookup and kernel compilation happen in the warm-up run that precedes capture, and the captured graph
# replays only the launches. forward() and backward() at the end take ConvParams: composite.py's traced route, and
# autograd.py's for tensors the runners cannot read (through fastpath.traced, registered here: autograd is below).
_FWD = ("(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, "
        "bool transposed, SymInt[] output_padding, SymInt groups, str backend) -> Tensor")
_BWD = ("(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, "
        "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, "
        "bool[3] output_mask, str backend) -> (Tensor, Tensor, Tensor)")


def _request(backend: str):
    return backend or None


_dense: dict[tuple, tuple] = {}  # (shape, format) -> dense strides; bounded like the plan cache it follows


def _restride(t, fmt: str):
    """``t`` with exactly the dense strides of ``fmt`` (Note [custom ops])."""
    key = (t.shape, fmt)
    want = _dense.get(key)
    if want is None:
        if len(_dense) >= knobs.env().plan_cache:
            _dense.clear()
        want = _dense[key] = dense_strides(tuple(t.shape), fmt)
    got = t.stride()
    if got == want:
        return t
    if all(g == w or s <= 1 for g, w, s in zip(got, want, t.shape)):
        return t.as_strided(t.shape, want)
    return torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device).copy_(t)


def _ints(v):
    """An argument of the op's schema in a cache key: int lists as tuples (the schema makes every other one exact)."""
    return tuple(v) if type(v) is list else v


def _forward_plan(input, weight, bias, args: tuple, backend: str):
    """(plan or None for an Empty problem, params) of an aten::convolution call, through the fast path."""
    request = _request(backend)
    key = fastpath.key(("op", *map(_ints, args)), input, weight, bias, (), request)
    hit = fastpath.get(key)
    if hit is None:
        params = planner.params_of(weight, *args)
        hit = (planner.prepare(input, weight, bias, params, request, None if key is None else key[-1]), params)
        fastpath.put(key, hit)
    return hit


def _backward_plan(grad_output, input, weight, bias_sizes, args: tuple, mask, backend: str):
    """(plan or None, params, bias_sizes) of an aten::convolution_backward call; grad_output's spec is in the key
    (the bias slot) so that a cached call never skips its checks."""
    request = _request(backend)
    name = ("op.backward", *map(_ints, args), None if bias_sizes is None else tuple(bias_sizes), mask)
    key = fastpath.key(name, input, weight, grad_output, (), request)
    hit = fastpath.get(key)
    if hit is None:
        params = planner.params_of(weight, *args, backward=True)
        sizes = None if bias_sizes is None else [int(s) for s in bias_sizes]
        problem = planner.backward_problem(grad_output, input, weight, params, sizes, mask)
        if sizes is not None:
            problem = dataclasses.replace(problem, has_bias=True)  # the forward's problem: its plan
        p = None if validate.is_empty_problem(problem) else planner.select(problem, request)
        hit = (p, params, sizes)
        fastpath.put(key, hit)
    return hit


@torch.library.custom_op("portconv::convolution", mutates_args=(), schema=_FWD)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend):
    p, params = _forward_plan(input, weight, bias, (stride, padding, dilation, transposed, output_padding, groups),
                              backend)
    if p is None:
        return validate.empty_forward(input, weight, bias, params)
    return _restride(p.forward(input, weight, bias), p.memory_format)


@torch.library.custom_op("portconv::convolution_backward", mutates_args=(), schema=_BWD)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask, backend):
    mask = tuple(bool(m) for m in output_mask)
    p, params, sizes = _backward_plan(grad_output, input, weight, bias_sizes,
                                      (stride, padding, dilation, transposed, output_padding, groups), mask, backend)
    if p is None:
        grads = validate.empty_backward(grad_output, input, weight, params, mask, sizes)
        return _filled(grads, input)
    gi, gw, gb = p.backward(grad_output, input, weight, mask)
    fmt = p.memory_format
    return (_restride(gi, fmt) if mask[0] else input.new_empty(0),
            _restride(gw, fmt) if mask[1] else input.new_empty(0),
            _restride(gb, "contiguous") if mask[2] else input.new_empty(0))


def _filled(grads, like):
    """The op's three results: an empty tensor where the mask is False (a schema result cannot be None)."""
    return tuple(like.new_empty(0) if g is None else g for g in grads)


# --- fake kernels ---------------------------------------------------------------------------------------------
def _guard_int(v) -> int:
    from torch.fx.experimental.symbolic_shapes import guard_int  # imports sympy: only where shapes are symbolic

    return guard_int(v)


def _hint(v) -> int:
    return v if type(v) is int else (v.node.hint if v.node.hint is not None else _guard_int(v))


def _hint_spec(t) -> tuple[TensorSpec, bool]:
    """The spec of a fake tensor at its size hints, and whether any size or stride is symbolic."""
    shape, strides = tuple(t.shape), tuple(t.stride())
    symbolic = any(type(v) is not int for v in shape + strides)
    if not symbolic:
        return spec_of(t), False
    dev = t.device
    spec = TensorSpec(tuple(_hint(v) for v in shape), tuple(_hint(v) for v in strides),
                      str(t.dtype).replace("torch.", ""), dev.type, dev.index, "torch")
    return spec, True


def _specs(*tensors):
    """Specs of the fake operands; channels-last operands with symbolic sizes are specialised (Note [custom ops])."""
    pairs = [_hint_spec(t) for t in tensors]
    if any(sym for _, sym in pairs) and any(s.memory_format != "contiguous" for s, _ in pairs):
        for t in tensors:
            for v in (*t.shape, *t.stride()):
                _guard_int(v)
    return [s for s, _ in pairs]


def _plan_format(problem, backend: str) -> str:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return planner.select(problem, _request(backend)).memory_format


def _make_problem(ispec, wspec, has_bias: bool, params: ConvParams):
    from .problem import Problem

    return Problem(params=params, input=ispec, weight=wspec, has_bias=has_bias)


@convolution.register_fake
def _convolution_fake(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend):
    _register_decompositions()
    ispec, wspec, *bspec = _specs(input, weight, *(() if bias is None else (bias,)))
    params = ConvParams.make(max(wspec.dim - 2, 1), stride, padding, dilation, transposed, output_padding,
                             _hint(groups), weight_shape=wspec.shape)
    validate.check_forward(ispec, wspec, bspec[0] if bspec else None, params)
    problem = _make_problem(ispec, wspec, bias is not None, params)
    if validate.is_empty_problem(problem):
        return validate.empty_forward(input, weight, bias, params)  # the real kernel's ops: the same strides
    shape = params.output_shape(tuple(input.shape), tuple(weight.shape))
    fmt = torch_format(torch, _plan_format(problem, backend))
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)


@convolution_backward.register_fake
def _convolution_backward_fake(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                               output_padding, groups, output_mask, backend):
    _register_decompositions()
    mask = tuple(bool(m) for m in output_mask)
    gspec, ispec, wspec = _specs(grad_output, input, weight)
    params = ConvParams.make(max(wspec.dim - 2, 1), stride, padding, dilation, transposed, output_padding,
                             _hint(groups), weight_shape=wspec.shape, backward=True)
    validate.check_forward(ispec, wspec, None, params)
    sizes = None if bias_sizes is None else [_hint(s) for s in bias_sizes]
    problem = _make_problem(ispec, wspec, sizes is not None, params)
    validate.check_backward(gspec, problem, sizes, mask)
    if validate.is_empty_problem(problem):
        return _filled(validate.empty_backward(grad_output, input, weight, params, mask, bias_sizes), input)
    fmt = torch_format(torch, _plan_format(problem, backend))

    def like(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device, memory_format=fmt)

    return (like(input) if mask[0] else input.new_empty(0), like(weight) if mask[1] else input.new_empty(0),
            weight.new_empty(list(bias_sizes)) if mask[2] else input.new_empty(0))


# --- Inductor: ATen's plans as ATen's ops (Note [ATen's plans in compiled graphs]) --------------------------------
# Note [ATen's plans in compiled graphs]
# Inductor compiles a portconv op as ATen's own op where portconv's plan is ATen's (Plan.torch_own: the aten
# backend), and wherever the backend was not forced (backend=, use_backend, PORTCONV_BACKEND) but for
# the OWN_KERNEL_WINS rows measured faster compiled too (Note [own kernel wins compiled], Plan.keeps_ops): a
# decomposition, which Inductor's graph tracing applies after autograd, turns portconv::convolution into
# aten.convolution and portconv::convolution_backward into aten.convolution_backward with the same arguments (what
# the aten runner calls). Inductor then lowers them as it lowers PyTorch's own convolution: its layout optimisation
# (channels-last convolutions, where cuDNN's NHWC depthwise kernels run) and its fusions reach them, and no Python op
# (tens of microseconds a call) stays in the graph. Why automatic plans go to ATen there (H100, torch 2.11, training
# step, PyTorch compiled against converted compiled): mobilenet_v2 float32 with its depthwise convolutions as portconv
# ops ran 0.73x, its GPU time 13% above PyTorch's (fusions split around the ops, NCHW depthwise against cuDNN's NHWC)
# and its host time 28% above; resnet50, all ATen's plans, 1.00x. A forced backend keeps its ops, and so do the
# rows with compiled evidence (convnext_tiny float32 compiled with its channels-last 7x7 depthwise convolutions as
# portconv ops: 2.00x PyTorch's compiled step). The decision is
# made as the fake kernels make a plan, from the operands' specs and portconv's context at compile time; with a
# symbolic size the op stays and plans at run time. The dynamo graph, make_fx and export keep the portconv ops
# (Note [custom ops]): only Inductor's table holds the decompositions, registered when a fake kernel first runs (the
# first trace), before Inductor reads the table. Inductor's caches key the graph, not portconv's context: a graph
# compiled (or cached on disk) under other PORTCONV_* knobs or options keeps its choice until compiled afresh.
def _as_aten(ispec, wspec, has_bias: bool, args: tuple, backend: str, backward: bool = False) -> bool:
    """Whether Inductor compiles this op call as ATen's op (Note [ATen's plans in compiled graphs]): static specs
    (None: a symbolic size) of a real, non-empty problem whose plan says so."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if ispec is None or wspec is None or ispec.dtype in ("complex64", "complex128") or type(args[-1]) is not int:
        return False
    params = ConvParams.make(wspec.dim - 2, *args, weight_shape=wspec.shape, backward=backward)
    problem = _make_problem(ispec, wspec, has_bias, params)
    if validate.is_empty_problem(problem):
        return False
    with unset_fake_temporarily():
        return planner.select(problem, _request(backend)).compiled_as_aten


def _static_spec(t):
    """The spec of a fake operand, or None when a size or stride is symbolic."""
    spec, symbolic = _hint_spec(t)
    return None if symbolic else spec


def _convolution_as_aten(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend):
    args = (stride, padding, dilation, transposed, output_padding, groups)
    if not _as_aten(_static_spec(input), _static_spec(weight), bias is not None, args, backend):
        return NotImplemented
    return torch.ops.aten.convolution.default(input, weight, bias, *args)


def _convolution_backward_as_aten(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                  output_padding, groups, output_mask, backend):
    args = (stride, padding, dilation, transposed, output_padding, groups)
    if (_static_spec(grad_output) is None or (bias_sizes is not None and any(type(s) is not int for s in bias_sizes))
            or not _as_aten(_static_spec(input), _static_spec(weight), bias_sizes is not None, args, backend, True)):
        return NotImplemented
    grads = torch.ops.aten.convolution_backward.default(grad_output, input, weight, bias_sizes, *args, output_mask)
    return tuple(g if m and g is not None else input.new_empty(0) for g, m in zip(grads, output_mask))


_decomposed = False


def _register_decompositions() -> None:
    """Note [ATen's plans in compiled graphs]: into Inductor's decomposition table, once (a no-op where Inductor
    cannot be imported)."""
    global _decomposed
    if _decomposed:
        return
    _decomposed = True
    table = {torch.ops.portconv.convolution.default: _convolution_as_aten,
             torch.ops.portconv.convolution_backward.default: _convolution_backward_as_aten}
    try:
        from torch._inductor import decomposition, lowering
        from torch._library.utils import get_layout_constraint_tag

        # A call that keeps its op (NotImplemented) is lowered as a fallback kernel, which Inductor refuses to make
        # for an op in its decomposition table unless told to (override_decomp): made here, with the layout
        # constraint Inductor's implicit fallback gives a custom op.
        for op in table:
            if op not in lowering.lowerings:
                lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(
                    get_layout_constraint_tag(op, with_default=True)), warn=False, override_decomp=True)
        decomposition.decompositions.update(table)
        decomposition.fast_random_decomps().update(table)  # the cached copy Inductor traces with
    except (ImportError, AttributeError, TypeError):  # another torch's Inductor: the ops stay, as without this note
        return


# --- autograd: the backward op, and ATen's double backward through the ops (Note [portconv autograd]) -----------
def _forward_setup(ctx, inputs, output):
    input, weight, bias, *args, backend = inputs
    ctx.save_for_backward(input, weight)
    ctx.args, ctx.backend = tuple(args), backend
    ctx.bias_sizes = None if bias is None else [bias.shape[0]]


def _forward_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], need[1], ctx.bias_sizes is not None and need[2]]
    if grad is None or not any(mask):
        return (None,) * 10
    gi, gw, gb = convolution_backward(grad, input, weight, ctx.bias_sizes, *ctx.args, mask, ctx.backend)
    return (gi if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None) + (None,) * 7


def _backward_setup(ctx, inputs, output):
    grad_output, input, weight, _, *args, mask, backend = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.args, ctx.mask, ctx.backend = tuple(args), tuple(mask), backend


def _backward_backward(ctx, ggi, ggw, ggb):
    go, x, w = ctx.saved_tensors
    ggi, ggw, ggb = (g if m else None for g, m in zip((ggi, ggw, ggb), ctx.mask))
    args, backend = ctx.args, ctx.backend

    def conv(x, w):
        return convolution(x, w, None, *args, backend)

    def conv_backward(go, x, w, mask):
        return convolution_backward(go, x, w, None, *args, list(mask), backend)

    ggo, gi, gw = derivatives.double_backward(go, x, w, ggi, ggw, ggb, ctx.needs_input_grad, conv, conv_backward)
    return (ggo, gi, gw) + (None,) * 9


convolution.register_autograd(_forward_backward, setup_context=_forward_setup)
convolution_backward.register_autograd(_backward_backward, setup_context=_backward_setup)


# --- autocast: convolution is on autocast's lower-precision list ----------------------------------------------
def autocast_args(tensors, device_type: str, dtype=None):
    """ATen's cached_cast to ``dtype`` (default: the autocast dtype of ``device_type``): floating tensors on that
    device type, float64 excepted (at::autocast::is_eligible)."""
    dtype = torch.get_autocast_dtype(device_type) if dtype is None else dtype
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.device.type == device_type
                 and t.dtype not in (torch.float64, dtype) else t for t in tensors)


_impl = torch.library.Library("portconv", "IMPL")


def _register_autocast(device_type: str) -> None:
    """An Autocast<device> kernel that reads the autocast dtype at call time (torch.library.register_autocast
    fixes one dtype at registration): casts, then runs the op below autocast, as ATen's autocast wrappers do."""
    name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    key = getattr(torch._C.DispatchKey, name)
    op = torch.ops.portconv.convolution.default

    def run(input, weight, bias, *args):
        input, weight, bias = autocast_args((input, weight, bias), device_type)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(input, weight, bias, *args)

    op.py_impl(key)(run)
    _impl.impl("convolution", lambda _keys, *args: run(*args), name, with_keyset=True)


for _device_type in ("cpu", "cuda"):
    _register_autocast(_device_type)


# --- vmap (Note [vmap rules]) ----------------------------------------------------------------------------------
def _forward_vmap(info, in_dims, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                  backend):
    def run(x, w, b, g):
        return convolution(x, w, b, stride, padding, dilation, transposed, output_padding, g, backend)

    return derivatives.vmap_forward(info.batch_size, in_dims[:3], input, weight, bias, groups, weight.dim() - 2, run), 0


def _backward_vmap(info, in_dims, grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                   output_padding, groups, output_mask, backend):
    def run(go, x, w, g, mask):
        sizes = None if bias_sizes is None else [bias_sizes[0] * g // groups]
        return convolution_backward(go, x, w, sizes, stride, padding, dilation, transposed, output_padding, g,
                                    list(mask), backend)

    grads = derivatives.vmap_backward(info.batch_size, in_dims[:3], grad_output, input, weight, groups,
                                      tuple(output_mask), run)
    return tuple(input.new_empty(0) if g is None else g for g in grads), tuple(0 if g is not None else None
                                                                               for g in grads)


convolution.register_vmap(_forward_vmap)
convolution_backward.register_vmap(_backward_vmap)


# --- the traced entry points: ConvParams -> op calls -------------------------------------------------------------
def aten_args(params: ConvParams) -> tuple:
    return (list(params.stride), list(params.padding), list(params.dilation), params.transposed,
            list(params.output_padding), params.groups)


def forward(input, weight, bias, params: ConvParams, backend) -> torch.Tensor:
    """portconv::convolution for ConvParams: padding='same''s extra high-side padding applied first, as ATen's
    convolution_same does (the op has aten::convolution's symmetric padding)."""
    if any(params.padding_extra):
        input = pad_extra(input, params)
    return convolution(input, weight, bias, *aten_args(params), "" if backend is None else str(backend))


def backward(grad_output, input, weight, params: ConvParams, mask, backend, bias_sizes=None) -> tuple:
    """portconv::convolution_backward for ConvParams; None where the mask is False."""
    x = pad_extra(input, params) if any(params.padding_extra) else input
    grads = convolution_backward(grad_output, x, weight, bias_sizes, *aten_args(params), list(mask),
                                 "" if backend is None else str(backend))
    gi = grads[0] if mask[0] and x is input else (unpad(grads[0], input.shape) if mask[0] else None)
    return gi, grads[1] if mask[1] else None, grads[2] if mask[2] else None


fastpath.register_traced(forward, backward)  # autograd's route for what the runners cannot read (Note [custom ops])
