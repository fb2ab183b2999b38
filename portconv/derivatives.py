"""The derivative math of a convolution (ATen's formulas, the vmap rules) over the caller's conv callables."""
from __future__ import annotations


def add(a, b):
    """a + b, where None is zero."""
    return b if a is None else (a if b is None else a + b)


def bias_term(db, shape):
    """A bias (or its tangent) broadcast to an output of ``shape``."""
    return db.reshape(1, -1, *(1,) * (len(shape) - 2)).expand(shape)


def double_backward(go, x, w, ggi, ggw, ggb, need, conv, conv_backward) -> tuple:
    """ATen's _convolution_double_backward (Note [portconv autograd]): (ggO, gI, gW) of convolution_backward's
    results' gradients ``ggi``, ``ggw``, ``ggb`` (None: zero), each None unless ``need`` asks for it and a term
    exists. ``conv(x, w)`` is the convolution without a bias, ``conv_backward(grad_output, x, w, mask)`` its
    convolution_backward: portconv's autograd functions in eager calls, the custom ops in traced ones."""
    ggo = gi = gw = None
    if need[0]:
        if ggi is not None:
            ggo = conv(ggi, w)
        if ggw is not None:
            ggo = add(ggo, conv(x, ggw))
        if ggb is not None:
            ggo = add(ggo, bias_term(ggb, go.shape))
    if need[1] and ggw is not None:
        gi = conv_backward(go, x, ggw, (True, False, False))[0]
    if need[2] and ggi is not None:
        gw = conv_backward(go, ggi, w, (False, True, False))[1]
    return ggo, gi, gw


def forward_jvp(x, w, dx, dw, db, out_shape, conv):
    """Forward AD of y = conv(x, w, b): conv(dx, w) + conv(x, dw) + db (None where no tangent is given)."""
    out = None
    if dx is not None:
        out = conv(dx, w)
    if dw is not None:
        out = add(out, conv(x, dw))
    if db is not None:
        out = add(out, bias_term(db, out_shape))
    return out


def backward_jvp(go, x, w, dgo, dx, dw, mask, conv_backward) -> list:
    """Forward AD of convolution_backward(go, x, w, mask): its three results are bilinear in (go, x or w), so each
    tangent is the same call on one tangent (None where the mask is False or no tangent reaches it)."""
    out = [None, None, None]
    if dgo is not None:
        out = list(conv_backward(dgo, x, w, mask))
    if dw is not None and mask[0]:
        out[0] = add(out[0], conv_backward(go, x, dw, (True, False, False))[0])
    if dx is not None and mask[1]:
        out[1] = add(out[1], conv_backward(go, dx, w, (False, True, False))[1])
    return out


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
