"""portconv's autograd: gradients of every order, forward AD and vmap of a planned convolution, on its backend."""
from __future__ import annotations

import dataclasses

import torch

from . import composite, fastpath, functional, validate
from .params import ConvParams
from .tensors import spec_of

# Note [portconv autograd]
# ConvFunction records one planned convolution: forward runs plan.forward; backward runs plan.backward directly
# when no graph is being built (create_graph off: the lean path), else ConvBackward, itself recorded. ConvBackward's
# backward is ATen's _convolution_double_backward (Convolution.cpp) written with portconv's own calls:
#   ggO = conv(ggI, w) + conv(x, ggW) + ggb,   gI = grad_input(gO, w := ggW),   gW = grad_weight(gO, x := ggI)
# ATen computes gW as a convolution of ggI and gO with stride and dilation swapped and gI as a transposed
# convolution; those are exactly the weight and input gradients of the convolution with those operands, which
# here the backend's own backward kernels compute. Each term is ConvFunction or ConvBackward again, so every order
# is differentiable. The jvp staticmethods are forward AD (jvp = conv(dx, w) + conv(x, dw) + db; for the backward,
# the three gradients are bilinear in (grad_output, input or weight)), the vmap staticmethods Note [vmap rules].
# Higher-order terms run on the plan's backend when it was forced (backend=, use_backend, PORTCONV_BACKEND) and
# are planned automatically otherwise, as the first-order call was. Tensors of the legacy vmap
# (autograd.grad(..., is_grads_batched=True), gradcheck's batched checks) have no functorch rule: their calls go to
# the custom ops (ops.forward/backward), which PyTorch's batched fallback runs slice by slice.


def _request(plan):
    """The backend request of a plan's higher-order terms."""
    return plan.backend if plan.forced else None


def _legacy(*tensors) -> bool:
    return any(t is not None and torch._C._functorch.is_legacy_batchedtensor(t) for t in tensors)


def _forward_mode() -> bool:
    return torch.autograd.forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def conv(x, w, b, params: ConvParams, backend):
    """portconv's convolution for ConvParams (a batched input), recorded by autograd: a higher-order term."""
    if _legacy(x, w, b) or composite.foreign(x, w, b):
        from . import ops

        return ops.forward(x, w, b, params, backend)
    key = fastpath.key(params, x, w, b, (), backend)
    hit = fastpath.get(key)
    if hit is None:
        hit = (functional._prepare(x, w, b, params, backend, None if key is None else key[-1]),)
        fastpath.put(key, hit)
    if hit[0] is None:
        return validate.empty_forward(x, w, b, params)
    return ConvFunction.apply(x, w, b, hit[0])


def conv_backward(grad_output, x, w, params: ConvParams, mask, backend):
    """portconv's convolution_backward for ConvParams, recorded by autograd: a higher-order term."""
    if _legacy(grad_output, x, w) or composite.foreign(grad_output, x, w):
        from . import ops

        return ops.backward(grad_output, x, w, params, mask, backend)
    key = fastpath.key(("backward", params), x, w, grad_output, (), backend)  # grad_output's spec in the bias slot
    hit = fastpath.get(key)
    if hit is None:
        problem = functional.make_problem(x, w, None, params)
        validate.check_backward(spec_of(grad_output), problem, None, mask)
        hit = (None if validate.is_empty_problem(problem) else functional.select(problem, backend),)
        fastpath.put(key, hit)
    if hit[0] is None:
        return validate.empty_backward(grad_output, x, w, params, mask)
    return backward_apply(grad_output, x, w, hit[0], tuple(mask))


def backward_apply(grad_output, input, weight, plan, mask) -> tuple:
    """ConvBackward's results spread to (grad_input, grad_weight, grad_bias), None where the mask is False."""
    it = iter(ConvBackward.apply(grad_output, input, weight, plan, mask))
    return tuple(next(it) if m else None for m in mask)


def _add(a, b):
    return b if a is None else (a if b is None else a + b)


def _bias_term(db, shape):
    return db.reshape(1, -1, *(1,) * (len(shape) - 2)).expand(shape)


# Note [vmap rules]
# y = conv(x, w, b) mapped over a dim of size B, as PyTorch's convolution batch rule computes it. Only x batched:
# B folds into the batch, one convolution of B*N samples. A batched weight folds B into the groups: x becomes
# (N, B*C, ...), w (B*K, C/G, ...) (transposed: (B*C, K/G, ...)), groups B*G, so that group b*G + g of the folded
# problem is group g of sample b and the output (N, B*K, ...) unfolds to (B, N, K, ...); an unbatched x is
# expanded first. A batched bias is added after the convolution. The backward folds the same way: grad_input
# unfolds like x, grad_weight (B*K, ...) to (B, K, ...), grad_bias (B*K,) to (B, K); when only grad_input is asked
# for and the weight is not batched, B folds into the batch instead. ``run`` is the convolution (or its backward)
# of the caller's world: portconv's autograd functions in eager calls, the custom ops in traced ones.


def _front(t, d, size: int):
    """``t`` with its vmapped dim first (an unbatched ``t`` expanded to ``size``)."""
    return t.expand(size, *t.shape) if d is None else t.movedim(d, 0)


def _groups_view(t):
    """(B, N, C, ...) -> (N, B*C, ...)."""
    return t.transpose(0, 1).flatten(1, 2)


def vmap_forward(size: int, dims, x, w, b, groups: int, rank: int, run):
    """The vmapped convolution with the vmapped dim first; ``run(x, w, b, groups)`` convolves."""
    xd, wd, bd = dims
    if wd is None and xd is None:
        out = run(x, w, b if bd is None else None, groups)
        out = out.expand(size, *out.shape)
    elif wd is None:
        x = _front(x, xd, size)
        out = run(x.flatten(0, 1), w, b if bd is None else None, groups).unflatten(0, (size, -1))
    else:
        bg = None if b is None or bd is not None else b.repeat(size)
        out = run(_groups_view(_front(x, xd, size)), _front(w, wd, size).flatten(0, 1), bg, groups * size)
        out = out.unflatten(1, (size, -1)).transpose(0, 1)
    if bd is not None:
        out = out + _front(b, bd, size).reshape(size, 1, -1, *(1,) * rank)
    return out


def vmap_backward(size: int, dims, grad_output, x, w, groups: int, mask, run):
    """(grad_input, grad_weight, grad_bias) vmapped, the vmapped dim first (None where the mask is False);
    ``run(grad_output, x, w, groups, mask)`` is convolution_backward."""
    gd, xd, wd = dims
    if wd is None and not mask[1] and not mask[2]:
        go, x = _front(grad_output, gd, size), _front(x, xd, size)
        gi = run(go.flatten(0, 1), x.flatten(0, 1), w, groups, mask)[0]
        return gi.unflatten(0, (size, -1)), None, None
    go, x, w = _front(grad_output, gd, size), _front(x, xd, size), _front(w, wd, size)
    gi, gw, gb = run(_groups_view(go), _groups_view(x), w.flatten(0, 1), groups * size, mask)[:3]
    return (gi.unflatten(1, (size, -1)).transpose(0, 1) if mask[0] else None,
            gw.unflatten(0, (size, -1)) if mask[1] else None,
            gb.unflatten(0, (size, -1)) if mask[2] else None)


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
            params, request = ctx.plan.problem.params, _request(ctx.plan)
            if _legacy(grad_output):
                from . import ops

                gi, gw, gb = ops.backward(grad_output, input, weight, params, mask, request)
            else:
                gi, gw, gb = backward_apply(grad_output, input, weight, ctx.plan, mask)
        else:
            gi, gw, gb = ctx.plan.backward(grad_output, input, weight, mask)
        return gi, gw, gb, None

    @staticmethod
    def jvp(ctx, d_input, d_weight, d_bias, _):
        input, weight = ctx.saved_tensors
        params, request = ctx.plan.problem.params, _request(ctx.plan)
        out = None
        if d_input is not None:
            out = conv(d_input, weight, None, params, request)
        if d_weight is not None:
            out = _add(out, conv(input, d_weight, None, params, request))
        if d_bias is not None:
            out = _add(out, _bias_term(d_bias, ctx.out_shape))
        return out

    @staticmethod
    def vmap(info, in_dims, input, weight, bias, plan):
        params, request = plan.problem.params, _request(plan)

        def run(x, w, b, groups):
            return conv(x, w, b, dataclasses.replace(params, groups=groups), request)

        return vmap_forward(info.batch_size, in_dims[:3], input, weight, bias, params.groups, params.rank, run), 0


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
        params, request = ctx.plan.problem.params, _request(ctx.plan)
        need_go, need_x, need_w = ctx.needs_input_grad[:3]
        ggo = gi = gw = None
        if need_go:
            if ggi is not None:
                ggo = conv(ggi, w, None, params, request)
            if ggw is not None:
                ggo = _add(ggo, conv(x, ggw, None, params, request))
            if ggb is not None:
                ggo = _add(ggo, _bias_term(ggb, go.shape))
        if need_x and ggw is not None:
            gi = conv_backward(go, x, ggw, params, (True, False, False), request)[0]
        if need_w and ggi is not None:
            gw = conv_backward(go, ggi, w, params, (False, True, False), request)[1]
        return ggo, gi, gw, None, None

    @staticmethod
    def jvp(ctx, d_grad_output, d_input, d_weight, _plan, _mask):
        go, x, w = ctx.saved_tensors
        params, request, mask = ctx.plan.problem.params, _request(ctx.plan), ctx.mask
        out = [None, None, None]
        if d_grad_output is not None:
            out = list(conv_backward(d_grad_output, x, w, params, mask, request))
        if d_weight is not None and mask[0]:
            out[0] = _add(out[0], conv_backward(go, x, d_weight, params, (True, False, False), request)[0])
        if d_input is not None and mask[1]:
            out[1] = _add(out[1], conv_backward(go, d_input, w, params, (False, True, False), request)[1])
        zeros = (x.new_zeros(x.shape), w.new_zeros(w.shape), go.new_zeros(go.shape[1]))  # a tangent is never None
        return tuple(z if t is None else t for t, z, m in zip(out, zeros, mask) if m)

    @staticmethod
    def vmap(info, in_dims, grad_output, input, weight, plan, mask):
        params, request = plan.problem.params, _request(plan)

        def run(go, x, w, groups, m):
            return conv_backward(go, x, w, dataclasses.replace(params, groups=groups), m, request)

        grads = vmap_backward(info.batch_size, in_dims[:3], grad_output, input, weight, params.groups, mask, run)
        grads = tuple(g for g, m in zip(grads, mask) if m)
        return grads, (0,) * len(grads)


# Function.apply binds the arguments with inspect.signature on every call (about 20 us) before the C++ apply; with
# no functorch transform active (Note [eager and traced calls]) the C++ apply alone does the same.
lean_apply = super(torch.autograd.Function, ConvFunction).apply
