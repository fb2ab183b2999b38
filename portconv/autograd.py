"""portconv's autograd: gradients of every order, forward AD and vmap of a planned convolution, on its backend."""
from __future__ import annotations

import dataclasses

import torch

from . import derivatives, fastpath, planner, validate
from .params import ConvParams

# Note [portconv autograd]
# ConvFunction records one planned convolution: forward runs plan.forward; backward runs plan.backward directly
# when no graph is being built (create_graph off: the lean path), else ConvBackward, itself recorded. ConvBackward's
# backward is ATen's _convolution_double_backward (Convolution.cpp; derivatives.double_backward, which the custom
# ops' autograd shares) written with portconv's own calls:
#   ggO = conv(ggI, w) + conv(x, ggW) + ggb,   gI = grad_input(gO, w := ggW),   gW = grad_weight(gO, x := ggI)
# ATen computes gW as a convolution of ggI and gO with stride and dilation swapped and gI as a transposed
# convolution; those are exactly the weight and input gradients of the convolution with those operands, which
# here the backend's own backward kernels compute. Each term is ConvFunction or ConvBackward again, so every order
# is differentiable. The jvp staticmethods are forward AD (derivatives.forward_jvp: jvp = conv(dx, w) + conv(x, dw)
# + db; for the backward, the three gradients are bilinear in (grad_output, input or weight)), the vmap staticmethods
# Note [vmap rules] (derivatives.py).
# Higher-order terms run on the plan's backend when it was forced (backend=, use_backend, PORTCONV_BACKEND) and
# are planned automatically otherwise, as the first-order call was (an eager call of a plan ATen records takes ATen's
# own double backward, routed by ATen: Note [ATen-recorded plans]). Tensors of the legacy vmap
# (autograd.grad(..., is_grads_batched=True), gradcheck's batched checks) have no functorch rule: their calls go to
# the custom ops (ops.forward/backward, reached through fastpath.traced, which ops.py fills when it is imported:
# this module is below ops.py), which PyTorch's batched fallback runs slice by slice.

#
# Note [ATen-recorded plans]
# A plan whose runner calls ATen's differentiable convolution with the arguments its backward would pass to
# aten.convolution_backward (Plan.aten_autograd: the aten backend; the cudnn backend where ATen sends the gradients of
# the problem as given to cuDNN, whose aten.cudnn_convolution ATen records as CudnnConvolutionBackward0, itself
# aten.convolution_backward) needs no autograd.Function in eager mode: ATen records ConvolutionBackward0, whose backward
# is that same call, and whose double backward, forward AD and vmap are PyTorch's own. The eager call then costs
# PyTorch's host time plus the fast path's lookup (a Python autograd.Function costs about 45 us more per forward +
# backward on a 2-core Xeon). Functorch transforms, forward AD and tracers keep their routes (mode 2, the custom ops),
# whatever the plan.


def request_of(plan):
    """The backend request of a plan's higher-order terms."""
    return plan.backend if plan.forced else None


def _legacy(*tensors) -> bool:
    return any(t is not None and torch._C._functorch.is_legacy_batchedtensor(t) for t in tensors)


def _forward_mode() -> bool:
    return torch.autograd.forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def conv(x, w, b, params: ConvParams, backend):
    """portconv's convolution for ConvParams (a batched input), recorded by autograd: a higher-order term."""
    if _legacy(x, w, b) or fastpath.foreign(x, w, b):
        return fastpath.traced.forward(x, w, b, params, backend)
    key = fastpath.key(params, x, w, b, (), backend)
    hit = fastpath.get(key)
    if hit is None:
        hit = (planner.prepare(x, w, b, params, backend, None if key is None else key[-1]),)
        fastpath.put(key, hit)
    if hit[0] is None:
        return validate.empty_forward(x, w, b, params)
    return ConvFunction.apply(x, w, b, hit[0])


def conv_backward(grad_output, x, w, params: ConvParams, mask, backend):
    """portconv's convolution_backward for ConvParams, recorded by autograd: a higher-order term."""
    if _legacy(grad_output, x, w) or fastpath.foreign(grad_output, x, w):
        return fastpath.traced.backward(grad_output, x, w, params, mask, backend)
    key = fastpath.key(("backward", params), x, w, grad_output, (), backend)  # grad_output's spec in the bias slot
    hit = fastpath.get(key)
    if hit is None:
        problem = planner.backward_problem(grad_output, x, w, params, None, mask)
        hit = (None if validate.is_empty_problem(problem) else planner.select(problem, backend),)
        fastpath.put(key, hit)
    if hit[0] is None:
        return validate.empty_backward(grad_output, x, w, params, mask)
    return backward_apply(grad_output, x, w, hit[0], tuple(mask))


def native_slow(params: ConvParams, request, grad_output, input, weight, mask) -> tuple:
    """The native executor's node's backward where it does not run the plan's kernels itself (Note [native
    executor]): with a graph being built (create_graph), or a grad_output that is not a plain tensor (the legacy
    vmap's batched gradients, a functorch transform's wrapper): conv_backward, recorded, as ConvFunction's."""
    if _legacy(grad_output):
        return fastpath.traced.backward(grad_output, input, weight, params, mask, request)
    return conv_backward(grad_output, input, weight, params, mask, request)


def backward_apply(grad_output, input, weight, plan, mask) -> tuple:
    """ConvBackward's results spread to (grad_input, grad_weight, grad_bias), None where the mask is False."""
    it = iter(ConvBackward.apply(grad_output, input, weight, plan, mask))
    return tuple(next(it) if m else None for m in mask)


def _conv_of(plan):
    """derivatives' ``conv(x, w)``: conv() with ``plan``'s params and higher-order backend request, no bias."""
    params, request = plan.problem.params, request_of(plan)
    return lambda x, w: conv(x, w, None, params, request)


def _backward_of(plan):
    """derivatives' ``conv_backward(grad_output, x, w, mask)``: conv_backward() with ``plan``'s params and request."""
    params, request = plan.problem.params, request_of(plan)
    return lambda go, x, w, mask: conv_backward(go, x, w, params, mask, request)


class ConvFunction(torch.autograd.Function):
    """y = conv(input, weight, bias) on ``plan``'s backend (Note [portconv autograd])."""

    @staticmethod
    def forward(input, weight, bias, plan):
        out = plan.runner.forward(input, weight, bias)
        if out._base is not None and _forward_mode():  # a view of the runner's own result (the 1-d view of cuDNN's
            out = out.clone()  # and MIOpen's calls): forward AD needs the primal and its tangent laid out alike
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias, plan = inputs
        ctx.plan, ctx.has_bias = plan, bias is not None
        ctx.save_for_backward(input, weight)
        if _forward_mode():
            ctx.set_materialize_grads(False)
            ctx.save_for_forward(input, weight)
            ctx.out_shape = output.shape

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        need_i, need_w, need_b = ctx.needs_input_grad[:3]
        mask = (need_i, need_w, need_b and ctx.has_bias)
        if not any(mask):
            return None, None, None, None
        if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active() or _legacy(grad_output):
            if _legacy(grad_output):
                params, request = ctx.plan.problem.params, request_of(ctx.plan)
                gi, gw, gb = fastpath.traced.backward(grad_output, input, weight, params, mask, request)
            else:
                gi, gw, gb = backward_apply(grad_output, input, weight, ctx.plan, mask)
        else:
            gi, gw, gb = ctx.plan.backward(grad_output, input, weight, mask)
        return gi, gw, gb, None

    @staticmethod
    def jvp(ctx, d_input, d_weight, d_bias, _):
        input, weight = ctx.saved_tensors
        return derivatives.forward_jvp(input, weight, d_input, d_weight, d_bias, ctx.out_shape, _conv_of(ctx.plan))

    @staticmethod
    def vmap(info, in_dims, input, weight, bias, plan):
        params, request = plan.problem.params, request_of(plan)

        def run(x, w, b, groups):
            return conv(x, w, b, dataclasses.replace(params, groups=groups), request)

        out = derivatives.vmap_forward(info.batch_size, in_dims[:3], input, weight, bias, params.groups, params.rank,
                                       run)
        return out, 0


class ConvBackward(torch.autograd.Function):
    """The gradients convolution_backward(grad_output, input, weight) computes on ``plan``'s backend, those where
    ``mask`` is True only (forward AD pairs tangents with outputs wrongly around a None output: backward_apply
    spreads them); differentiable (Note [portconv autograd])."""

    @staticmethod
    def forward(grad_output, input, weight, plan, mask):
        grads = tuple(g for g, m in zip(plan.backward(grad_output, input, weight, mask), mask) if m)
        if _forward_mode():  # a view result (grad_input cut back from 'same''s padded input) needs its tangent's
            grads = tuple(g if g._base is None else g.clone() for g in grads)  # layout: a result of its own
        return grads

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad_output, input, weight, plan, mask = inputs
        ctx.plan, ctx.mask = plan, mask
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(grad_output, input, weight)
        if _forward_mode():
            ctx.save_for_forward(grad_output, input, weight)

    @staticmethod
    def backward(ctx, *grads):
        it = iter(grads)
        ggi, ggw, ggb = (next(it) if m else None for m in ctx.mask)
        go, x, w = ctx.saved_tensors
        ggo, gi, gw = derivatives.double_backward(go, x, w, ggi, ggw, ggb, ctx.needs_input_grad[:3],
                                                  _conv_of(ctx.plan), _backward_of(ctx.plan))
        return ggo, gi, gw, None, None

    @staticmethod
    def jvp(ctx, d_grad_output, d_input, d_weight, _plan, _mask):
        go, x, w = ctx.saved_tensors
        mask = ctx.mask
        out = derivatives.backward_jvp(go, x, w, d_grad_output, d_input, d_weight, mask, _backward_of(ctx.plan))
        zeros = (x.new_zeros(x.shape), w.new_zeros(w.shape), go.new_zeros(go.shape[1]))  # a tangent is never None
        return tuple(z if t is None else t for t, z, m in zip(out, zeros, mask) if m)

    @staticmethod
    def vmap(info, in_dims, grad_output, input, weight, plan, mask):
        params, request = plan.problem.params, request_of(plan)

        def run(go, x, w, groups, m):
            return conv_backward(go, x, w, dataclasses.replace(params, groups=groups), m, request)

        grads = derivatives.vmap_backward(info.batch_size, in_dims[:3], grad_output, input, weight, params.groups,
                                          mask, run)
        grads = tuple(g for g, m in zip(grads, mask) if m)
        return grads, (0,) * len(grads)


# Function.apply binds the arguments with inspect.signature on every call (about 20 us) before the C++ apply; with
# no functorch transform active (Note [eager and traced calls]) the C++ apply alone does the same.
lean_apply = super(torch.autograd.Function, ConvFunction).apply
