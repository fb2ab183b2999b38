"""torch.compile (fullgraph), export, make_fx, CUDA graphs and autocast of converted models, per backend."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import require_backend
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

import portconv
import portconv.nn as pnn
from portconv import ops

CUDA = torch.cuda.is_available()



@pytest.fixture
def be(backend, monkeypatch):
    require_backend(backend)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 results compared with F.conv*
    torch._dynamo.reset()
    counters.clear()
    return backend


def _device(be: str) -> str:
    return "cuda" if be in ("cuda", "cudnn", "hip", "miopen") else "cpu"


def _model(kind: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    """A small torch.nn model of every convolution flavour of one rank, and its input shape."""
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "2d":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode="reflect"), nn.ReLU(),
                             nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.Conv2d(4, 4, 2, padding="same"),
                             nn.Conv2d(4, 2, 1, stride=2, bias=False)), (2, 3, 8, 8)
    if kind == "1d":
        return nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.Tanh(),
                             nn.ConvTranspose1d(4, 2, 3, stride=2, output_padding=1)), (2, 3, 9)
    return nn.Sequential(nn.Conv3d(2, 4, 2, padding=1, dilation=(1, 2, 1)), nn.ReLU(),
                         nn.ConvTranspose3d(4, 2, 2, stride=2)), (1, 2, 3, 4, 3)


def _grads(model, x):
    model.zero_grad()
    y = model(x)
    y.square().mean().backward()
    return y, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("compiler", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("kind", ["2d", "1d", "3d"])
def test_compiled_converted_model_has_no_graph_break_and_matches_eager(be, compiler, kind):
    model, shape = _model(kind)
    model = pnn.convert(model.to(_device(be)), backend=be)
    x = torch.randn(shape, device=_device(be))
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    y, grads = _grads(compiled, x)
    y_eager, grads_eager = _grads(model, x)
    assert sum(counters["graph_break"].values()) == 0
    torch.testing.assert_close(y, y_eager)
    for g, g_eager in zip(grads, grads_eager):
        torch.testing.assert_close(g, g_eager)
    assert torch._dynamo.explain(model)(x).graph_break_count == 0


@pytest.mark.parametrize("amp", [False, True])
def test_a_module_memo_from_eager_calls_compiles_without_graph_breaks(amp):
    """Note [module memo]: modules called eagerly first (plain or under autocast) hold a memo; dynamo traces past it."""
    torch._dynamo.reset()
    model, shape = _model("2d")
    ours = pnn.convert(model.eval())
    x = torch.randn(shape)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    with ctx():
        for _ in range(3):
            want = ours(x)
        convs = [m for m in ours.modules() if isinstance(m, torch.nn.Conv2d)]  # Note [ATen's modules]: groups 1 none
        assert [m.__dict__.get("_pc_memo") is not None for m in convs] == [m.groups > 1 for m in convs]
        got = torch.compile(ours, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, want)


def test_automatic_plan_compiles_on_cpu_tensors():
    """Issue 29: the default plan on CPU tensors crashed under dynamo; it now compiles with fullgraph and exports."""
    torch._dynamo.reset()
    model, shape = _model("2d")
    ours = pnn.convert(model.eval())
    x = torch.randn(shape)
    torch.testing.assert_close(torch.compile(ours, fullgraph=True)(x), model(x))
    torch.testing.assert_close(torch.export.export(ours, (x,)).module()(x), model(x))


def test_export_records_the_op(be):
    if be == "cudnn":
        pytest.skip("torch.export traces with cuDNN switched off (torch.export._trace._ignore_backend_decomps): a plan "
                    "forced onto the cudnn backend cannot be made while exporting")
    model, shape = _model("2d")
    model = pnn.convert(model.to(_device(be)).eval(), backend=be)
    x = torch.randn(shape, device=_device(be))
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes={"input": {0: batch}})
    targets = [n.target for n in ep.graph.nodes]
    assert targets.count(torch.ops.portconv.convolution.default) == 5
    for n in (2, 5):
        xn = torch.randn(n, *shape[1:], device=_device(be))
        torch.testing.assert_close(ep.module()(xn), model(xn))


def test_make_fx_records_the_ops(be):
    x = torch.randn(2, 3, 6, 6, device=_device(be), requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=_device(be), requires_grad=True)

    def step(x, w):
        y = portconv.conv2d(x, w, padding=1, backend=be)
        return torch.autograd.grad(y.sum(), (x, w))

    gm = make_fx(step)(x, w)
    targets = {n.target for n in gm.graph.nodes}
    assert {torch.ops.portconv.convolution.default, torch.ops.portconv.convolution_backward.default} <= targets
    for got, want in zip(gm(x, w), step(x, w)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("channels_last", [False, True])
def test_dynamic_shapes_keep_the_fake_strides(be, channels_last):
    """Inductor checks each op result's strides against the fake kernel's (assert_size_stride): they must hold for
    every size of a dynamic graph, in both layouts."""
    dev = _device(be)
    w = torch.randn(8, 4, 3, 3, device=dev)
    fn = torch.compile(lambda x: (portconv.conv2d(x, w, padding=1, backend=be) * 2).relu() + 1, dynamic=True,
                       fullgraph=True)
    for n in (2, 3, 16, 5):
        x = torch.randn(n, 4, 6, 7, device=dev)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        y, want = fn(x), (F.conv2d(x, w, padding=1) * 2).relu() + 1
        torch.testing.assert_close(y, want)
        assert y.stride() == want.stride()


def _op_args(be: str):
    dev = _device(be)
    x = torch.randn(2, 4, 6, 6, device=dev, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, device=dev, requires_grad=True)
    b = torch.randn(6, device=dev, requires_grad=True)
    fwd = [(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 2, be),
           (x.detach().to(memory_format=torch.channels_last), w, None, [2, 1], [0, 1], [1, 2], False, [0, 0], 2, be),
           (x, w.transpose(0, 1).reshape(4, 3, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 0], 2, be)]
    go = torch.randn(2, 6, 6, 6, device=dev)
    bwd = [(go, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True], be),
           (go, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [False, True, False], be)]
    return fwd, bwd


def test_opcheck(be):
    """torch.library.opcheck: schema, fake kernels against the real ones, autograd registration, AOT dispatch."""
    fwd, bwd = _op_args(be)
    for args in fwd:
        torch.library.opcheck(torch.ops.portconv.convolution.default, args)
    for args in bwd:
        torch.library.opcheck(torch.ops.portconv.convolution_backward.default, args)


def test_vmap_of_the_ops(be):
    """The ops' vmap rules (Note [vmap rules]), as torch.func.vmap meets them in a traced function."""
    fwd, bwd = _op_args(be)
    torch.manual_seed(0)
    x, w, b, *args = fwd[0]
    xs, ws = torch.randn(3, *x.shape, device=x.device), torch.randn(3, *w.shape, device=w.device)
    op = torch.ops.portconv.convolution.default
    for dims, operands in (((0, None), (xs, w)), ((None, 0), (x.detach(), ws)), ((0, 0), (xs, ws))):
        got = torch.func.vmap(lambda a, c: op(a, c, b.detach(), *args), in_dims=dims)(*operands)
        want = torch.func.vmap(lambda a, c: F.conv2d(a, c, b.detach(), padding=1, groups=2), in_dims=dims)(*operands)
        torch.testing.assert_close(got, want)
    go, x, w, *bargs = bwd[0]
    gos = torch.randn(3, *go.shape, device=go.device)
    got = torch.func.vmap(lambda g, c: torch.ops.portconv.convolution_backward(g, x.detach(), c, *bargs))(gos, ws)
    want = torch.func.vmap(lambda g, c: torch.ops.aten.convolution_backward(g, x.detach(), c, *bargs[:-1]))(gos, ws)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c)


def test_traced_bad_input_raises_pytorch_text(be):
    x, w = torch.randn(2, 3, 8, 8, device=_device(be)), torch.randn(4, 5, 3, 3, device=_device(be))
    with pytest.raises(RuntimeError) as want:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as got:
        torch.compile(lambda a, c: portconv.conv2d(a, c, backend=be), fullgraph=True, backend="aot_eager")(x, w)
    assert str(want.value) in str(got.value)


def test_eager_calls_stay_off_the_ops(be, monkeypatch):
    calls = []
    real = ops._forward_plan
    monkeypatch.setattr(ops, "_forward_plan", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(1, 2, 5, 5, device=_device(be), requires_grad=True)
    w = torch.randn(3, 2, 3, 3, device=_device(be), requires_grad=True)
    portconv.conv2d(x, w, backend=be).sum().backward()
    assert not calls
    torch.compile(lambda a, c: portconv.conv2d(a, c, backend=be), fullgraph=True, backend="aot_eager")(x, w)
    assert calls


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "automatic"])
def test_inductor_compiles_aten_plans_as_atens_convolution(be, forced, monkeypatch):
    """Note [ATen's plans in compiled graphs]: under Inductor a call whose plan is ATen's, or whose backend was not
    forced, runs as ATen's own convolution and convolution_backward (the portconv ops never run); a forced own
    kernel set runs the ops. The compiled step matches eager either way, and the dynamo graph records the op."""
    calls = []
    for name in ("_forward_plan", "_backward_plan"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    model, shape = _model("2d")
    ours = pnn.convert(model.to(_device(be)), backend=be if forced else None)
    x = torch.randn(shape, device=_device(be))
    want = _grads(ours, x)
    assert not calls  # eager calls stay off the ops
    compiled = torch.compile(ours, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):  # compiled here, not taken from a cache
        for _ in range(2):
            got = _grads(compiled, x)
            torch.testing.assert_close(got[0], want[0])
            for g, g_ref in zip(got[1], want[1]):
                torch.testing.assert_close(g, g_ref)
    if be == "aten" or not forced:
        assert not calls, calls
    elif be in ("opencl", "cuda", "hip"):
        assert {"_forward_plan", "_backward_plan"} <= set(calls), calls
    graphs = []
    torch._dynamo.reset()
    torch.compile(ours, fullgraph=True, backend=lambda gm, _: graphs.append(gm) or gm)(x)
    assert torch.ops.portconv.convolution.default in {n.target for n in graphs[0].graph.nodes}


def _amp_step(model, x, device_type, dtype):
    model.zero_grad()
    with torch.autocast(device_type, dtype=dtype):
        y = model(x)
        loss = y.float().square().mean()
    loss.backward()
    return y, loss, [p.grad.clone() for p in model.parameters()]


def _check_amp(be, device_type, dtype):
    model, shape = _model("2d")
    model = model.to(_device(be))
    ours = pnn.convert(model, backend=be)
    x = torch.randn(shape, device=_device(be))
    want = _amp_step(model, x, device_type, dtype)
    # the same kernels on the CPU (exact); on the GPU other kernels round the low-precision products otherwise
    tol = {} if device_type == "cpu" else dict(rtol=2e-2, atol=2e-2)
    for candidate in (ours, torch.compile(ours, fullgraph=True)):
        got = _amp_step(candidate, x, device_type, dtype)
        assert got[0].dtype == want[0].dtype == dtype
        torch.testing.assert_close(got[0], want[0], **tol)
        torch.testing.assert_close(got[1], want[1], **tol)
        for g, g_ref in zip(got[2], want[2]):
            assert g.dtype == g_ref.dtype
            torch.testing.assert_close(g, g_ref, **tol)


def test_autocast_cpu_bfloat16_matches_pytorch_amp(be):
    if _device(be) != "cpu":
        pytest.skip("CPU autocast is for backends on CPU tensors")
    _check_amp(be, "cpu", torch.bfloat16)
    x, w = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.randn(3, 2, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float64 is not cast; the weight is: PyTorch's error
        with pytest.raises(RuntimeError) as want:
            F.conv2d(x, w)
        with pytest.raises(RuntimeError) as got:
            portconv.conv2d(x, w, backend=be)
    assert str(got.value) == str(want.value)


def test_autocast_repeats_are_pytorchs_call_for_aten_plans(be, monkeypatch):
    """Note [autocast and ATen's plans]: from its second time under autocast, a call whose plan ATen records is
    PyTorch's own F.convNd on the operands as they came (ATen's autocast casts them); a plan of an own kernel set
    keeps the cast and the eager path. Every step matches PyTorch AMP, in values and dtypes."""
    from portconv import composite, planner

    planner.clear_cache()  # fresh call keys: the first step below is each call's first under autocast
    device_type = _device(be)
    if device_type == "cuda" and not CUDA:
        pytest.skip("needs a CUDA device")
    model, shape = _model("2d")
    model = model.to(device_type)
    ours = pnn.convert(model, backend=be)
    x = torch.randn(shape, device=device_type)
    routed, real = [], composite.torch_convnd
    monkeypatch.setattr(composite, "torch_convnd", lambda name, *a: routed.append(name) or real(name, *a))
    want = _amp_step(model, x, device_type, torch.bfloat16)
    tol = {} if device_type == "cpu" else dict(rtol=2e-2, atol=2e-2)
    for _ in range(3):
        got = _amp_step(ours, x, device_type, torch.bfloat16)
        assert got[0].dtype == want[0].dtype == torch.bfloat16
        torch.testing.assert_close(got[1], want[1], **tol)
        for g, g_ref in zip(got[2], want[2]):
            assert g.dtype == g_ref.dtype
            torch.testing.assert_close(g, g_ref, **tol)
    convs = sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in ours.modules())
    if be == "aten":
        assert sorted(set(routed)) == ["conv2d", "conv_transpose2d"] and len(routed) == 2 * convs, routed
    elif be in ("opencl", "cuda", "hip"):
        assert not routed, routed


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_cuda_matches_pytorch_amp(be, dtype):
    if _device(be) != "cuda":
        pytest.skip("CUDA autocast is for backends on CUDA tensors")
    _check_amp(be, "cuda", dtype)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_graphs_reduce_overhead(be):
    """mode='reduce-overhead': the ops are captured (no cudagraph skip) and replays match eager."""
    if _device(be) != "cuda":
        pytest.skip("CUDA graphs need a backend on CUDA tensors")
    model, shape = _model("2d")
    model = pnn.convert(model.cuda(), backend=be)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        x = torch.randn(shape, device="cuda")
        y, grads = _grads(compiled, x)
        y_eager, grads_eager = _grads(model, x)
        torch.testing.assert_close(y, y_eager)
        for g, g_eager in zip(grads, grads_eager):
            torch.testing.assert_close(g, g_eager)
    assert counters["inductor"]["cudagraph_skips"] == 0
