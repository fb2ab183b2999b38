"""PyTorch's autograd contract through portconv, per backend: double backward, forward AD, vmap, complex."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from conftest import require_backend

import portconv
from portconv.conformance import cases as C
from portconv.conformance.runner import gradgradcheck_case
from portconv.errors import BackendUnavailable

D = torch.float64
TIGHT = dict(rtol=1e-9, atol=1e-9)



@pytest.fixture
def be(backend, monkeypatch):
    """The backend under test, with tensors made on its device and TF32 off (float32 compared with F.conv*)."""
    require_backend(backend)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    gpu = backend in ("cuda", "cudnn", "hip", "miopen")
    if gpu:
        torch.set_default_device("cuda")
    yield backend
    if gpu:
        torch.set_default_device("cpu")


# (portconv function, torch function, input shape, weight shape, keyword arguments)
CONVS = [
    (portconv.conv1d, F.conv1d, (2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, groups=2)),
    (portconv.conv2d, F.conv2d, (2, 3, 7, 6), (4, 3, 3, 2), dict(padding=1, dilation=(1, 2))),
    (portconv.conv2d, F.conv2d, (1, 4, 6, 6), (8, 1, 3, 3), dict(padding=1, groups=4)),
    (portconv.conv2d, F.conv2d, (2, 2, 5, 6), (3, 2, 2, 2), dict(padding="same")),
    (portconv.conv3d, F.conv3d, (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1))),
    (portconv.conv_transpose1d, F.conv_transpose1d, (2, 4, 5), (4, 3, 3), dict(stride=2, output_padding=1)),
    (portconv.conv_transpose2d, F.conv_transpose2d, (1, 4, 4, 3), (4, 2, 3, 3),
     dict(stride=2, padding=1, output_padding=1, groups=2)),
    (portconv.conv_transpose3d, F.conv_transpose3d, (1, 2, 3, 2, 3), (2, 2, 2, 2, 2), dict(stride=2)),
]
IDS = [f"{c[0].__name__}-{i}" for i, c in enumerate(CONVS)]


def _case(i, dtype=D, backend=None):
    """(portconv function, torch function, input, weight, bias, keyword arguments) of CONVS[i], seeded; skipped with
    the plan's reason where ``backend`` cannot run it (cuDNN has no float64 depthwise gradients)."""
    ours, theirs, xs, ws, kw = CONVS[i]
    transposed = "transpose" in ours.__name__
    k = ws[1] * kw.get("groups", 1) if transposed else ws[0]
    torch.manual_seed(0)
    x, w, b = (torch.randn(s, dtype=dtype, requires_grad=True) for s in (xs, ws, (k,)))
    if backend is not None and not dtype.is_complex:
        try:
            portconv.plan(x.detach(), w.detach(), b.detach(), transposed=transposed, backend=backend, **kw)
        except BackendUnavailable as e:
            pytest.skip(f"unsupported on {backend}: {str(e).splitlines()[0]}")
    return ours, theirs, x, w, b, kw


@pytest.mark.parametrize("i", range(len(CONVS)), ids=IDS)
def test_second_order_terms_match_torch(be, i):
    """All three second-order terms (w.r.t. grad_output, input, weight) of ATen's double backward."""
    ours, theirs, x, w, b, kw = _case(i, backend=be)
    results = []
    for fn in (lambda *a: ours(*a, **kw, backend=be), lambda *a: theirs(*a, **kw)):
        y = fn(x, w, b)
        torch.manual_seed(1)
        go = torch.randn_like(y).requires_grad_()
        gi, gw, gb = torch.autograd.grad(y, (x, w, b), go, create_graph=True)
        ggs = [torch.randn_like(t) for t in (gi, gw, gb)]
        results.append(torch.autograd.grad((gi, gw, gb), (go, x, w), ggs))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("transposed", [False, True])
def test_input_gradient_penalty_reaches_the_weight(be, transposed):
    """Issue 29: create_graph=True with an upstream gradient that does not require grad kept only the first-order
    term (weight-gradient norm 10.39 where PyTorch gives 10005.93)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8, dtype=D, requires_grad=True)
    w = torch.randn(3, 5, 3, 3, dtype=D, requires_grad=True) if transposed else \
        torch.randn(5, 3, 3, 3, dtype=D, requires_grad=True)
    fns = ((lambda a, c: portconv.conv_transpose2d(a, c, padding=1, backend=be), F.conv_transpose2d) if transposed
           else (lambda a, c: portconv.conv2d(a, c, padding=1, backend=be), F.conv2d))
    grads = []
    for fn in fns:
        y = fn(x, w) if fn is fns[0] else fn(x, w, padding=1)
        go = torch.ones_like(y)  # does not require grad
        (gi,) = torch.autograd.grad(y, x, go, create_graph=True)
        grads.append(torch.autograd.grad(gi.norm() * 1e3, w)[0])
    assert grads[0].norm() > 1.0
    torch.testing.assert_close(grads[0], grads[1], **TIGHT)


@pytest.mark.parametrize("case", C.gradcheck_cases(), ids=[c.id for c in C.gradcheck_cases()])
def test_gradgradcheck_and_forward_ad(be, case):
    """The conformance suite's second-order check: gradgradcheck (with forward-over-reverse, batched) and
    gradcheck's forward-AD and batched checks, float64."""
    r = gradgradcheck_case(case, be)
    if r.status == "unsupported":
        pytest.skip(f"unsupported on {be}: {r.reason}")
    assert r.status == "pass", r.reason
    assert set(r.tensors) == {"forward_ad", "gradgradcheck"}


@pytest.mark.parametrize("i", range(len(CONVS)), ids=IDS)
def test_forward_ad_matches_torch(be, i):
    ours, theirs, x, w, b, kw = _case(i, backend=be)
    tangents = [torch.randn_like(t) for t in (x, w, b)]
    primals = [t.detach() for t in (x, w, b)]
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]
        got = fwAD.unpack_dual(ours(*duals, **kw, backend=be)).tangent
        want = fwAD.unpack_dual(theirs(*duals, **kw)).tangent
    torch.testing.assert_close(got, want, **TIGHT)
    _, jvp = torch.func.jvp(lambda a, c: ours(a, c, None, **kw, backend=be), tuple(primals[:2]), tuple(tangents[:2]))
    _, jvp_ref = torch.func.jvp(lambda a, c: theirs(a, c, None, **kw), tuple(primals[:2]), tuple(tangents[:2]))
    torch.testing.assert_close(jvp, jvp_ref, **TIGHT)


@pytest.mark.parametrize("dims", [(0, None, None), (None, 0, None), (0, 0, None), (1, 2, 0), (None, None, 0)],
                         ids=lambda d: "-".join(map(str, d)))
@pytest.mark.parametrize("i", [0, 2, 3, 6], ids=[IDS[j] for j in (0, 2, 3, 6)])
def test_vmap_matches_torch(be, i, dims):
    ours, theirs, x, w, b, kw = _case(i, backend=be)
    size = 3
    args = []
    for t, d in zip((x.detach(), w.detach(), b.detach()), dims):
        args.append(t if d is None else torch.stack([t * (j + 1) for j in range(size)], d))
    got = torch.func.vmap(lambda a, c, e: ours(a, c, e, **kw, backend=be), in_dims=dims)(*args)
    want = torch.func.vmap(lambda a, c, e: theirs(a, c, e, **kw), in_dims=dims)(*args)
    torch.testing.assert_close(got, want, **TIGHT)


def test_vmap_over_unbatched_inputs_and_jacobians(be):
    torch.manual_seed(0)
    xs, w = torch.randn(4, 2, 5, 5, dtype=D), torch.randn(3, 2, 3, 3, dtype=D)
    got = torch.func.vmap(lambda a: portconv.conv2d(a, w, padding=1, backend=be))(xs)  # per sample (C, H, W)
    torch.testing.assert_close(got, F.conv2d(xs, w, padding=1), **TIGHT)
    x = xs[:1]
    try:  # the Jacobians vmap over the weight, which folds into the groups: a depthwise problem (cuDNN: no float64)
        portconv.plan(x.repeat(1, 3, 1, 1), w.repeat(3, 1, 1, 1), padding=1, groups=3, backend=be)
    except BackendUnavailable as e:
        pytest.skip(f"the Jacobians' problem is unsupported on {be}: {str(e).splitlines()[0]}")
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        jac = transform(lambda c: portconv.conv2d(x, c, padding=1, backend=be).square().sum(dim=(2, 3)))(w)
        ref = transform(lambda c: F.conv2d(x, c, padding=1).square().sum(dim=(2, 3)))(w)
        torch.testing.assert_close(jac, ref, **TIGHT)
    x1 = x[:, :1]
    try:  # the Hessian's 9 = 3x3 batched weights fold into 9 groups: a depthwise problem (cuDNN: no float64)
        portconv.plan(x1.repeat(1, 9, 1, 1), w[:1, :1].repeat(9, 1, 1, 1), groups=9, backend=be)
    except BackendUnavailable as e:
        pytest.skip(f"the Hessian's problem is unsupported on {be}: {str(e).splitlines()[0]}")
    hess = torch.func.hessian(lambda c: portconv.conv2d(x1, c, backend=be).sin().sum())(w[:1, :1])
    ref = torch.func.hessian(lambda c: F.conv2d(x1, c).sin().sum())(w[:1, :1])
    torch.testing.assert_close(hess, ref, **TIGHT)


def test_batched_gradients(be):
    """autograd.grad(..., is_grads_batched=True) (the legacy vmap, as gradcheck's batched checks use it)."""
    ours, theirs, x, w, b, kw = _case(1, backend=be)
    grads = []
    for fn in (lambda *a: ours(*a, **kw, backend=be), lambda *a: theirs(*a, **kw)):
        y = fn(x, w, b)
        torch.manual_seed(2)
        gos = torch.randn(3, *y.shape, dtype=D)
        grads.append(torch.autograd.grad(y, (x, w, b), gos, is_grads_batched=True))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("i", range(len(CONVS)), ids=IDS)
def test_complex_matches_torch(be, i, dtype):
    ours, theirs, x, w, b, kw = _case(i, dtype)
    _case(i, D, backend=be)  # the real convolutions of the parts must run on the backend
    tol = TIGHT if dtype == torch.complex128 else dict(rtol=1e-5, atol=1e-5)
    for bias in (b, None):
        y, y_ref = ours(x, w, bias, **kw, backend=be), theirs(x, w, bias, **kw)
        assert y.dtype == y_ref.dtype == dtype
        torch.testing.assert_close(y, y_ref, **tol)
        go = torch.randn_like(y)
        leaves = (x, w) if bias is None else (x, w, bias)
        for got, want in zip(torch.autograd.grad(y, leaves, go), torch.autograd.grad(y_ref, leaves, go)):
            torch.testing.assert_close(got, want, **tol)
    unbatched = ours(x[0], w, b, **kw, backend=be)
    torch.testing.assert_close(unbatched, theirs(x[0], w, b, **kw), **tol)


def test_complex_gradcheck_and_errors(be):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(3, 2, 2, 2, dtype=torch.complex128, requires_grad=True)
    b = torch.randn(3, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: portconv.conv2d(*a, padding=1, backend=be), (x, w, b))
    for args in ((x, w.real.detach()), (x.real.detach(), w)):
        with pytest.raises(RuntimeError) as theirs:
            F.conv2d(*args)
        with pytest.raises(RuntimeError) as ours:
            portconv.conv2d(*args, backend=be)
        assert str(ours.value) == str(theirs.value)


def test_public_convolution_backward_is_differentiable(be):
    """convolution_backward's results carry aten's double backward, as aten::convolution_backward's do."""
    torch.manual_seed(0)
    go = torch.randn(2, 4, 5, 5, dtype=D, requires_grad=True)
    x = torch.randn(2, 3, 5, 5, dtype=D, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=D, requires_grad=True)
    args = ([4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    ours = portconv.convolution_backward(go, x, w, *args, backend=be)
    theirs = torch.ops.aten.convolution_backward(go, x, w, *args)
    assert all(t.requires_grad for t in ours)
    for a, c in zip(ours, theirs):
        torch.testing.assert_close(a, c, **TIGHT)
    loss = lambda gs: sum((g * torch.cos(g)).sum() for g in gs)  # noqa: E731
    for a, c in zip(torch.autograd.grad(loss(ours), (go, x, w)), torch.autograd.grad(loss(theirs), (go, x, w))):
        torch.testing.assert_close(a, c, **TIGHT)
    assert torch.autograd.gradcheck(lambda *t: portconv.convolution_backward(*t, *args, backend=be), (go, x, w))


@pytest.mark.parametrize("i", range(len(CONVS)), ids=IDS)
def test_float32_within_torch_tolerances(be, i):
    """float32 results against F.conv* at torch.testing's float32 tolerances (rtol 1.3e-6, atol 1e-5)."""
    ours, theirs, x, w, b, kw = _case(i, backend=be)
    x, w, b = (t.detach().float().requires_grad_() for t in (x, w, b))
    y, y_ref = ours(x, w, b, **kw, backend=be), theirs(x, w, b, **kw)
    torch.testing.assert_close(y, y_ref)
    go = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), go), torch.autograd.grad(y_ref, (x, w, b), go)):
        torch.testing.assert_close(got, want)


def test_callers_tensors_unchanged(be):
    ours, _, x, w, b, kw = _case(1)
    before = [t.detach().clone() for t in (x, w, b)]
    y = ours(x, w, b, **kw, backend=be)
    (gi,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    gi.sum().backward()
    for t, c in zip((x, w, b), before):
        assert torch.equal(t.detach(), c)


@pytest.mark.parametrize("i", range(len(CONVS)), ids=IDS)
def test_aten_plans_are_recorded_by_aten(i):
    """Note [ATen-recorded plans]: an eager call on an aten plan is ATen's own autograd node, with F.conv*'s
    gradients bit for bit, and its plan says so; a plan of portconv's own kernels keeps portconv's Function."""
    ours, theirs, x, w, b, kw = _case(i, torch.float32)
    transposed = "transpose" in ours.__name__
    p = portconv.plan(x.detach(), w.detach(), b.detach(), transposed=transposed, backend="aten", **kw)
    assert p.aten_autograd and "ATen records" in p.explain()
    out, ref = ours(x, w, b, backend="aten", **kw), theirs(x, w, b, **kw)
    assert type(out.grad_fn).__name__ == type(ref.grad_fn).__name__
    g = torch.randn_like(ref)
    got, want = torch.autograd.grad(out, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g)
    assert torch.equal(out, ref) and all(torch.equal(a, e) for a, e in zip(got, want))


def test_other_plans_keep_portconv_autograd(be):
    """Only the aten backend's plans, and the cudnn backend's whose gradients ATen sends to cuDNN as they come
    (test_cudnn.test_aten_records_direct_routes), are ATen-recorded: every other eager call is portconv's node."""
    ours, _, x, w, b, kw = _case(1, backend=be)
    p = portconv.plan(x.detach(), w.detach(), b.detach(), backend=be, **kw)
    recorded = be == "aten" or (be == "cudnn" and p.runner.route.grads == "direct" and not p.runner.reshape)
    assert p.aten_autograd == recorded
    assert "ATen records" in p.explain() if recorded else "autograd.Function" in p.explain()
    name = type(ours(x, w, b, backend=be, **kw).grad_fn).__name__
    native = p.runner.native is not None  # Note [native executor]: its C++ node (CppFunction to Python)
    assert name == ("ConvolutionBackward0" if be == "aten" else "AddBackward0" if recorded  # cuDNN's call, bias add
                    else "CppFunction" if native else "ConvFunctionBackward")
