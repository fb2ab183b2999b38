"""The cudnn backend: its rules (pure, from the ATen model), and on an NVIDIA GPU proof that cuDNN itself ran
(torch.profiler kernel names) for forward and gradients, with PyTorch's numbers."""
from __future__ import annotations

import re
import types

import pytest
import torch
from conftest import require_backend
from gpu_refs import TOL
from gpu_refs import reference as _reference

import portconv
from portconv.backends import cudnn
from portconv.errors import BackendUnavailable, Unsupported
from portconv.params import ConvParams
from portconv.planner import clear_cache
from portconv.problem import Problem
from portconv.rules import TorchContext, conv_tf32
from portconv.tensors import TensorSpec, dense_strides

# cuDNN's kernels (legacy names, xmma/cutlass engines, runtime-compiled engines); PyTorch's own conv kernels.
CUDNN_KERNEL = re.compile(r"cudnn|xmma|cutlass|implicit_convolve|fprop|dgrad|wgrad|nchwToNhwc|nhwcToNchw", re.I)
NATIVE_KERNEL = re.compile(r"conv_depthwise[23]d|slow_conv|im2col|col2im|vol2col|vol2im|portconv_", re.I)
CTX = TorchContext(device_type="cuda", has_cudnn=True, cudnn_version=91002, gpu_arch="sm_90")


def _problem(x_shape, w_shape, dtype="float32", fmt="contiguous", **kw) -> Problem:
    def spec(shape, f):
        return TensorSpec(tuple(shape), dense_strides(shape, f), dtype, "cuda", 0, "torch")

    return Problem(ConvParams.make(len(x_shape) - 2, weight_shape=w_shape, **kw), spec(x_shape, fmt),
                   spec(w_shape, "contiguous"), False)


# --- rules (no GPU needed) ----------------------------------------------------------------------------------------
ROUTES = [
    ((2, 16, 9, 9), (32, 16, 3, 3), dict(padding=1), "float32", "direct"),
    ((2, 16, 9, 9), (16, 8, 3, 3), dict(stride=2, transposed=True, groups=2), "float16", "direct"),
    ((2, 32, 9, 9), (32, 1, 3, 3), dict(groups=32, padding=1), "float32", "channels_last"),
    ((2, 32, 9, 9), (32, 1, 3, 3), dict(groups=32, padding=1), "float16", "direct"),  # cuDNN's fp16 heuristic
    ((2, 32, 9, 9), (32, 1, 3, 3), dict(groups=32, padding=1), "float32", "direct", "channels_last"),
    ((2, 8, 30), (8, 1, 5), dict(groups=8, padding=2), "bfloat16", "channels_last"),
    ((2, 8, 5, 6, 6), (16, 1, 3, 3, 3), dict(groups=8), "float32", "channels_last"),
]


@pytest.mark.parametrize("row", ROUTES)
def test_gradient_route_follows_the_aten_model(row):
    x, w, kw, dtype, route, *fmt = row
    r = cudnn.gradient_route(_problem(x, w, dtype, *(fmt or ["contiguous"]), **kw), CTX)
    assert r.grads == route, r.why


RECORDED = [  # (input, weight, kwargs, dtype, layout, ATen records the forward: Note [ATen-recorded plans])
    ((2, 16, 9, 9), (32, 16, 3, 3), dict(padding=1), "float32", "contiguous", True),
    ((2, 16, 9, 9), (16, 8, 3, 3), dict(stride=2, transposed=True, groups=2), "float16", "contiguous", True),
    ((2, 32, 9, 9), (32, 1, 3, 3), dict(groups=32, padding=1), "float32", "contiguous", False),  # channels-last route
    ((2, 32, 9, 9), (32, 1, 3, 3), dict(groups=32, padding=1), "float32", "channels_last", True),
    ((2, 8, 30), (16, 8, 5), dict(padding=2), "float32", "contiguous", False),  # the 1-d view
    ((2, 8, 10, 10), (8, 8, 4, 4), dict(padding="same"), "float32", "contiguous", False),  # 'same''s extra pad
]


@pytest.mark.parametrize("x,w,kw,dtype,fmt,recorded", RECORDED)
def test_aten_records_direct_routes(x, w, kw, dtype, fmt, recorded):
    """The cudnn runner lets ATen record its forward exactly where ATen's recorded backward is backward() itself:
    the gradients' route is the call as given ('direct') and the call takes no view or extra padding."""
    problem = _problem(x, w, dtype, fmt, **kw)
    assert cudnn.CudnnRunner(problem, cudnn.gradient_route(problem, CTX), False).aten_autograd is recorded


MATH = [  # (input, weight, kwargs, dtype, tf32 allowed, Choice.math)
    ((2, 8, 4, 6, 6), (8, 1, 3, 3, 3), dict(groups=8, padding=1), "float16", True, "fp16-accumulate"),
    ((2, 4, 3, 4, 5), (4, 1, 2, 2, 2), dict(groups=4, stride=2, transposed=True), "bfloat16", True,
     "bf16-accumulate"),
    ((2, 8, 4, 6, 6), (8, 4, 3, 3, 3), dict(groups=2, padding=1), "float16", True, "ieee"),
    ((2, 8, 9, 9), (8, 1, 3, 3), dict(groups=8, padding=1), "float16", True, "ieee"),
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "float32", True, "tf32"),
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "float32", False, "ieee"),
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "float64", True, "ieee"),
]


@pytest.mark.parametrize("x,w,kw,dtype,tf32,math", MATH)
def test_choice_math(x, w, kw, dtype, tf32, math):
    choice, _ = cudnn.choose_for(_problem(x, w, dtype, **kw), CTX, tf32, "test")
    assert choice.math == math, choice.reason
    assert choice.algorithm == ("cudnn_convolution_transpose" if kw.get("transposed") else "cudnn_convolution")


def test_empty_and_refused_problems():
    assert cudnn.gradient_route(_problem((0, 8, 9, 9), (8, 8, 3, 3)), CTX).grads == "direct"
    with pytest.raises(Unsupported, match="output_padding >= stride"):
        cudnn.choose_for(_problem((1, 4, 5, 5), (4, 4, 3, 3), stride=2, dilation=3, output_padding=2,
                                  transposed=True), CTX, True, "test")
    with pytest.raises(Unsupported, match="not int8"):
        cudnn.choose_for(_problem((1, 4, 5, 5), (4, 4, 3, 3), "int8"), CTX, True, "test")


def test_float64_depthwise_has_no_cudnn_gradient():
    with pytest.raises(Unsupported, match="CudaDepthwise2d"):
        cudnn.gradient_route(_problem((2, 8, 9, 9), (8, 1, 3, 3), "float64", groups=8), CTX)


def test_tf32_policy_chain():
    def fake(conv, cud="none", top="none"):
        return types.SimpleNamespace(backends=types.SimpleNamespace(
            cudnn=types.SimpleNamespace(conv=types.SimpleNamespace(fp32_precision=conv), fp32_precision=cud),
            fp32_precision=top))

    assert conv_tf32(fake("tf32"))[0] is True
    assert conv_tf32(fake("ieee"))[0] is False
    assert conv_tf32(fake("none", "ieee"))[0] is False
    allowed, why = conv_tf32(fake("none", "none", "tf32"))
    assert allowed and "torch.backends.fp32_precision" in why
    assert conv_tf32(fake("none"))[0] is False  # what `cudnn.allow_tf32 = False` leaves
    old = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(allow_tf32=False)))
    assert conv_tf32(old) == (False, "torch.backends.cudnn.allow_tf32 = False")


def test_unavailable_on_cpu_only_and_rocm_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    a = cudnn.CudnnBackend().probe()
    assert not a and "CPU-only" in a.reason
    monkeypatch.setattr(torch.version, "hip", "7.0.51831", raising=False)
    a = cudnn.CudnnBackend().probe()
    assert not a and "ROCm" in a.reason


# --- on the GPU ---------------------------------------------------------------------------------------------------
@pytest.fixture
def gpu(requested_backends):
    if "cudnn" not in requested_backends:
        pytest.skip("the cudnn backend was not requested (pytest --backend cudnn)")
    require_backend("cudnn")
    clear_cache()
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # exact float32 unless a test turns TF32 on (conv and RNN alike)
    yield torch.device("cuda", torch.cuda.current_device())
    torch.backends.cudnn.allow_tf32 = old
    clear_cache()


CASES = [  # (input, weight, conv kwargs, layout)
    ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1), "contig"),
    ((2, 32, 17, 15), (32, 1, 3, 3), dict(padding=1, stride=2, groups=32), "contig"),
    ((2, 24, 16, 16), (48, 1, 3, 3), dict(padding=1, groups=24), "chlast"),
    ((2, 8, 33), (16, 4, 4), dict(padding="same", dilation=2, groups=2), "contig"),
    ((1, 4, 6, 7, 8), (6, 4, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "contig"),
    ((2, 12, 9, 9), (12, 8, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
]


def _run(case, dtype, dev):
    xs, ws, kw, layout = case
    g = torch.Generator(device=dev).manual_seed(len(xs) * 1000 + ws[0])
    x = torch.randn(xs, generator=g, device=dev)
    if layout == "chlast":
        x = x.contiguous(memory_format=torch.channels_last)
    p = ConvParams.make(len(xs) - 2, weight_shape=ws, **kw)
    w = torch.randn(ws, generator=g, device=dev) / (ws[1] * ws[2]) ** 0.5
    b = torch.randn(ws[1] * p.groups if p.transposed else ws[0], generator=g, device=dev)
    x, w, b = (t.to(dtype).requires_grad_(True) for t in (x, w, b))
    y = portconv.convolution(x, w, b, p.stride, kw.get("padding", 0) if kw.get("padding") == "same" else p.padding,
                             p.dilation, p.transposed, p.output_padding, p.groups, backend="cudnn")
    go = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), go)
    return (x, w, b, p, go), (y, *grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_float64(gpu, case, dtype):
    xs, ws, kw, _ = CASES[case]
    if dtype == torch.float64 and kw.get("groups", 1) == xs[1] and not kw.get("transposed"):
        with pytest.raises(BackendUnavailable, match="no layout change sends them to cuDNN"):
            _run(CASES[case], dtype, gpu)
        return
    inputs, got = _run(CASES[case], dtype, gpu)
    for name, g_, r_ in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, _reference(*inputs)):
        g64 = g_.detach().double().cpu()
        assert tuple(g64.shape) == tuple(r_.shape) and torch.isfinite(g64).all(), name
        err = ((g64 - r_).norm() / r_.norm()).item()
        assert err < TOL[dtype], f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("case", [0, 1, 2, 5])
def test_profiler_shows_cudnn_kernels(gpu, case):
    from torch.profiler import ProfilerActivity, profile

    _run(CASES[case], torch.float32, gpu)  # plan, heuristics and any lazy loading outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _run(CASES[case], torch.float32, gpu)
        torch.cuda.synchronize(gpu)
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"case {case} kernels:", *names, sep="\n  ")
    conv_like = [n for n in names if CUDNN_KERNEL.search(n)]
    assert len(conv_like) >= 2, f"expected cuDNN forward and gradient kernels, saw {names}"
    assert not [n for n in names if NATIVE_KERNEL.search(n)], f"PyTorch's own convolution kernels ran: {names}"


def test_tf32_policy_is_reported(gpu):
    x = torch.randn(2, 8, 10, 10, device=gpu)
    w = torch.randn(8, 8, 3, 3, device=gpu)
    assert portconv.plan(x, w, backend="cudnn").math == "ieee"
    torch.backends.cudnn.allow_tf32 = True
    clear_cache()
    pl = portconv.plan(x, w, backend="cudnn")
    assert pl.math == "tf32" and "TF32 allowed" in pl.reason
    assert portconv.plan(x.double(), w.double(), backend="cudnn").math == "ieee"


def test_cupy_arrays_are_refused_with_the_reason(gpu):
    cupy = pytest.importorskip("cupy")
    x, w = cupy.ones((1, 2, 5, 5), dtype="float32"), cupy.ones((2, 2, 3, 3), dtype="float32")
    with pytest.raises(BackendUnavailable, match="torch CUDA tensors"):
        portconv.conv2d(x, w, backend="cudnn")
