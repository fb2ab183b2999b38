"""The cuda backend: its selection rule (pure), and on an NVIDIA GPU its kernels against float64 PyTorch, zero copy,
streams, device indices, CuPy arrays, the compile cache and proof (torch.profiler) that portconv's kernels ran."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from conftest import require_backend
from gpu_refs import assert_close, reference, spy_launches
from gpu_refs import make as _make

import portconv
from portconv.backends import BackendId, Problem, cuda
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.params import ConvParams
from portconv.plan import Plan, clear_cache
from portconv.tensors import TensorSpec, dense_strides, spec_of

H100 = DeviceInfo(vendor="nvidia", kind="gpu", name="H100", arch="sm_90", compute_units=132, fp16=True, bf16=True)
def _spec(shape, dtype="float32", fmt="contiguous"):
    return TensorSpec(tuple(shape), dense_strides(shape, fmt), dtype, "cuda", 0, "torch")


def _problem(x_shape, w_shape, dtype="float32", fmt="contiguous", **kw) -> Problem:
    p = ConvParams.make(len(x_shape) - 2, weight_shape=w_shape, **kw)
    return Problem(p, _spec(x_shape, dtype, fmt), _spec(w_shape, dtype), True)


# --- the rule, as a table (no GPU needed) -----------------------------------------------------------------------
RULE_TABLE = [
    # (input, weight, kwargs, dtype, algorithm, words the reason must contain)
    ((8, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144), "float32", "depthwise", "multiplier 1"),
    ((2, 16, 9, 9), (32, 1, 3, 3), dict(groups=16, stride=2), "float16", "depthwise", "multiplier 2"),
    ((2, 8, 5, 9, 9), (8, 1, 3, 3, 3), dict(groups=8, padding=1), "bfloat16", "depthwise", "depthwise"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", "implicit_gemm", "M=25088 N=64 K=576"),
    ((4, 3, 16), (8, 3, 5), dict(padding="same"), "float64", "implicit_gemm", "implicit GEMM"),
    ((2, 16, 7, 7), (16, 8, 4, 4), dict(stride=2, transposed=True), "float32", "implicit_gemm", "M="),
    # Note [grouped implicit GEMM]: 8 / 16 channels a group run the per-group GEMMs; ResNeXt's 4 stay direct
    ((2, 32, 14, 14), (64, 8, 3, 3), dict(groups=4, padding=1), "float32", "implicit_gemm", "8 / 16 channels a group"),
    ((2, 128, 14, 14), (128, 4, 3, 3), dict(groups=32, padding=1), "float32", "direct", "under 8 channels a group"),
    ((2, 64, 9), (64, 8, 5), dict(groups=8, transposed=True), "float32", "implicit_gemm", "groups = 8, 8 / 8"),
    ((2, 16, 7, 7), (16, 1, 3, 3), dict(groups=16, transposed=True), "float32", "direct", "not depthwise"),
]


@pytest.mark.parametrize("x,w,kw,dtype,alg,words", RULE_TABLE)
def test_rule_table(x, w, kw, dtype, alg, words):
    c = cuda.choose_for(_problem(x, w, dtype, **kw), H100)
    assert c.algorithm == alg and words in c.reason, c
    assert c.math == ("fp32-accumulate" if dtype in ("float16", "bfloat16") else "ieee")


def test_rule_layout_index_width_and_dtypes():
    c = cuda.choose_for(_problem((2, 8, 9, 9), (8, 8, 3, 3), fmt="channels_last"), H100)
    assert c.memory_format == "channels_last"
    big = cuda.choose_for(_problem((2**16, 64, 32, 32), (64, 64, 3, 3), padding=1), H100)  # 2**32 elements
    assert "64-bit indexing" in big.reason
    with pytest.raises(Unsupported, match="not int32"):
        cuda.choose_for(_problem((1, 2, 5, 5), (2, 2, 3, 3), "int32"), H100)
    with pytest.raises(Unsupported, match="NVIDIA"):
        cuda.CudaBackend().choose(_problem((1, 2, 5, 5), (2, 2, 3, 3)), dataclasses.replace(H100, vendor="amd"))


TC_TABLE = [  # (input, weight, kwargs, dtype, tf32 allowed, algorithm, words)
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float16", False, "igemm-tc", "fp16 m16n8k16"),
    ((2, 16, 7, 7), (16, 8, 4, 4), dict(stride=2, transposed=True), "bfloat16", False, "igemm-tc", "bf16 m16n8k16"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", True, "igemm-tc", "tf32 m16n8k8"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", False, "implicit_gemm", "shared-memory tiles"),
    ((4, 3, 16), (8, 3, 5), dict(padding="same"), "float64", True, "implicit_gemm", "shared-memory tiles"),
    ((2, 32, 14, 14), (64, 8, 3, 3), dict(groups=4, padding=1), "float16", True, "igemm-tc", "groups = 4, 8 / 16"),
    ((2, 64, 7, 7), (64, 16, 3, 3), dict(groups=4, padding=1), "float32", True, "igemm-tc", "tf32 m16n8k8"),
    ((2, 128, 14, 14), (128, 4, 3, 3), dict(groups=32, padding=1), "float16", True, "direct", "groups = 32"),
    # Note [narrow backward-data]: the reason says when grad_input (a transposed forward) takes the column GEMM
    ((32, 1, 161, 700), (32, 1, 5, 20), dict(stride=2), "float32", True, "igemm-tc", "backward-data as a column GEMM"),
    ((2, 3, 64, 64), (16, 3, 7, 7), dict(stride=2, padding=3), "float64", True, "implicit_gemm", "and col2im (3"),
    ((2, 16, 8, 8), (16, 3, 4, 4), dict(stride=2, transposed=True), "float16", False, "igemm-tc", "the forward as a"),
]


@pytest.mark.parametrize("x,w,kw,dtype,tf32,alg,words", TC_TABLE)
def test_tensor_core_rule(x, w, kw, dtype, tf32, alg, words):
    """Note [tensor-core implicit GEMM]: half types on sm_80+ always, float32 only with TF32 allowed (math 'tf32',
    which the conformance tolerance reads), never float64, never the HIP set, never before sm_80."""
    pr = _problem(x, w, dtype, **kw)
    c = cuda.choose_for(pr, H100, "CUDA", tf32, "test setting")
    assert c.algorithm == alg and words in c.reason, c
    assert c.math == ("tf32" if alg == "igemm-tc" and dtype == "float32" else
                      "fp32-accumulate" if dtype in ("float16", "bfloat16") else "ieee")
    if alg == "igemm-tc":
        assert "tensor cores" in c.reason
        assert cuda.choose_for(pr, H100, "HIP", tf32).algorithm == "implicit_gemm"
        assert cuda.choose_for(pr, dataclasses.replace(H100, arch="sm_75"), "CUDA", tf32).algorithm == "implicit_gemm"


def test_tensor_core_tiles(monkeypatch):
    assert cuda.tc_tile(25088, 64, 132) == cuda.TC_TILES["128x64"]
    assert cuda.tc_tile(64, 1152, 132) == cuda.TC_TILES["64x128"]
    assert cuda.tc_tile(100352, 256, 132) == cuda.TC_TILES["128x128"]
    assert cuda.tc_tile(901_600, 1, 132) == cuda.TC_TILES["128x16"]  # deepbench-speech-c1's backward-data phases
    assert cuda.tc_tile(401_408, 17, 132) == cuda.TC_TILES["128x64"]
    # Note [tile rule]: TF32 forward / backward-data (ring of 3 stages at 128 x 64, 2 at 128 x 128) and reductions
    # of under 8 steps (resnet50-1x1-expand's forward, 64 long) take 128 x 64 where 128 x 128 would be chosen
    assert cuda.tc_tile(100352, 256, 132, reduction=576) == cuda.TC_TILES["128x128"]
    assert cuda.tc_tile(100352, 256, 132, reduction=576, tf32_ring=True) == cuda.TC_TILES["128x64"]
    assert cuda.tc_tile(100352, 256, 132, reduction=64) == cuda.TC_TILES["128x64"]
    assert cuda.tc_tile(64, 1152, 132, reduction=64, tf32_ring=True) == cuda.TC_TILES["64x128"]
    # v8: wide weight gradients (wav2vec2-conv1d's 512 x 1536) take 128 x 128; narrower ones keep the rule above
    assert cuda.tc_tile(512, 1536, 132, reduction=12792, weight=True) == cuda.TC_TILES["128x128"]
    assert cuda.tc_tile(512, 1536, 132, reduction=12792) == cuda.TC_TILES["128x64"]
    assert cuda.tc_tile(1024, 512, 132, reduction=6272, weight=True) == cuda.TC_TILES["128x64"]
    assert cuda.tc_tile(64, 1536, 132, reduction=6272, weight=True) == cuda.TC_TILES["64x128"]
    assert cuda.TC_TILES["64x128"] == (64, 128, 2)  # v8: 32 x 32 warp tiles
    monkeypatch.setenv(cuda.TC_TILE_ENV, "64x128")
    assert cuda.tc_tile(100352, 256, 132) == cuda.TC_TILES["64x128"]
    assert cuda.sm_version("sm_90a") == 90 and cuda.sm_version("gfx90a") == 0


def test_ring_steps():
    """Note [stage rows]: a ring stage's channels stay inside one tap: steps a stage halve until 16 x steps divides
    the channel count (64: 2 by default, 4 when forced; 48, 144: 1)."""
    assert cuda.ring_steps(64) == cuda.TC_KS_DEFAULT == 2
    assert cuda.ring_steps(48) == cuda.ring_steps(144) == cuda.ring_steps(16) == 1
    assert cuda.ring_steps(64, "4") == 4 and cuda.ring_steps(96, "4") == 2 and cuda.ring_steps(64, "1") == 1


def test_narrow_col_rule():
    """Note [narrow backward-data]: the column GEMM and col2im take backward-data for one group, at most NARROW_C
    channels of dX, 2+ taps, at least NARROW_K of dY, a dense weight and a column buffer of at most NARROW_COL_MAX."""
    def view(n=32, c=1, k=32, g=1, r=(1, 5, 20), y=(1, 79, 341)):
        return cuda.ConvView(n, c, k, g, (1, 161, 700), y, r, (1, 2, 2), (0, 0, 0), (1, 1, 1))

    def ok(v, w_strides=None):
        shape = (v.K, v.C // v.G) + v.R[1:]
        return cuda.narrow_col(v, shape, w_strides or dense_strides(shape))

    assert ok(view()) and ok(view(c=3, k=64, r=(1, 7, 7), y=(1, 112, 112)))  # deepbench-speech-c1, resnet50-stem
    shape = (64, 3, 7, 7)
    assert cuda.narrow_col(view(c=3, k=64, r=(1, 7, 7)), shape, dense_strides(shape, "channels_last"))
    assert not cuda.narrow_col(view(c=3, k=64, r=(1, 7, 7)), shape, (3 * 7 * 8, 7 * 8, 8, 1))  # a strided W
    assert not ok(view(c=5)) and not ok(view(c=4, g=2)) and not ok(view(k=8)) and not ok(view(r=(1, 1, 1)))
    assert not ok(view(n=4096))  # 4096 x 26939 positions x 100 columns: over NARROW_COL_MAX
    assert not ok(dataclasses.replace(view(), DL=(1, 2, 1)))  # stride 2 and dilation 2 on one axis


def test_rocm_and_cpu_tensors_are_not_the_cuda_backends(monkeypatch):
    be = cuda.CudaBackend()
    cpu = Problem(ConvParams.make(2), dataclasses.replace(_spec((1, 2, 5, 5)), device_type="cpu", device_index=None),
                  _spec((2, 2, 3, 3)), False)
    with pytest.raises(Unsupported, match="CUDA tensors and CuPy arrays"):
        be.device_for(cpu)
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    with pytest.raises(Unsupported, match="ROCm"):
        be.device_for(_problem((1, 2, 5, 5), (2, 2, 3, 3)))


# --- on the GPU ---------------------------------------------------------------------------------------------------
@pytest.fixture
def gpu(requested_backends, monkeypatch):
    """A CUDA device, poisoned outputs, and IEEE float32 (torch's TF32 conv policy off: float32 dense problems keep
    the FMA tile here; the tensor-core tests turn TF32 on themselves)."""
    from portconv.bench.settings import torch_variant

    if "cuda" not in requested_backends:
        pytest.skip("the cuda backend was not requested (pytest --backend cuda)")
    require_backend("cuda")
    monkeypatch.setenv("PORTCONV_POISON", "1")
    clear_cache()
    with torch_variant(ieee=True):
        yield torch.device("cuda", torch.cuda.current_device())
    clear_cache()


GPU_CASES = [  # (input, weight, conv kwargs, layout)
    ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1), "contig"),
    ((2, 24, 17, 15), (24, 1, 3, 3), dict(padding=1, stride=2, groups=24), "chlast"),
    ((2, 8, 33), (16, 4, 4), dict(padding="same", dilation=2, groups=2), "strided"),
    ((1, 4, 6, 7, 8), (6, 4, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "chlast"),
    ((2, 12, 9, 9), (12, 8, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
    ((3, 8, 40, 40), (16, 1, 5, 5), dict(padding=2, groups=8), "contig"),
    ((2, 32, 11, 11), (48, 16, 3, 3), dict(padding=1, groups=2), "chlast"),  # Note [grouped implicit GEMM]
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_every_algorithm_matches_float64(gpu, case, dtype):
    xs, ws, kw, layout = GPU_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    problem = Problem(p, spec_of(x), spec_of(w), True)
    be = cuda.CudaBackend()
    choice = be.choose(problem, be.device_for(problem))
    go = torch.randn(problem.output_shape, device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    algs = ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else [])
    for alg in algs + (["igemm-tc"] if choice.algorithm == "igemm-tc" else []):
        plan = Plan(problem, BackendId.CUDA, alg, choice.memory_format, choice.reason, be.device_for(problem))
        y = be.forward(plan, x, w, b)
        grads = be.backward(plan, go, x, w, (True, True, True))
        for name, got, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), ref):
            assert_close(got, r, dtype, f"{alg} {name}")
            assert got.device == gpu and got.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_replayed_launches_match_float64(gpu, case, dtype):
    """Note [replayed launches]: a plan's second call replays the first's launches with this call's addresses;
    every algorithm and direction is replayed (never the ordinary fallback) and still matches float64."""
    from portconv.backends._replay import Program

    xs, ws, kw, layout = GPU_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    x0, w0, b0, _ = _make(xs, ws, kw, layout, dtype, gpu, seed_mult=7)  # the recorded call's data
    problem = Problem(p, spec_of(x), spec_of(w), True)
    be = cuda.CudaBackend()
    choice = be.choose(problem, be.device_for(problem))
    go = torch.randn(problem.output_shape, device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    masks = ((True, True, True), (True, False, False), (False, True, False))
    for alg in ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else []):
        plan = Plan(problem, BackendId.CUDA, alg, choice.memory_format, choice.reason, be.device_for(problem))
        for mask in masks:
            be.forward(plan, x0, w0, b0)
            be.backward(plan, torch.randn_like(go), x0, w0, mask)
            y = be.forward(plan, x, w, b)
            grads = be.backward(plan, go, x, w, mask)
            for name, got, r, m in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), ref,
                                       (True, *mask)):
                if m:
                    assert_close(got, r, dtype, f"{alg} {name} (replayed)")
                else:
                    assert got is None
        programs = plan.state["replay"]
        assert len(programs) == 1 + len(masks) and all(isinstance(v, Program) for v in programs.values()), alg


def test_public_api_autograd_and_output_mask(gpu):
    x, w, b, p = _make((2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    x.requires_grad_(True)
    y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    assert portconv.plan(x, w, b, padding=1, backend="cuda").backend == BackendId.CUDA
    y.sum().backward()
    ref = reference(x, w, b, p, torch.ones_like(y))
    assert_close(y.detach(), ref[0], torch.float32, "output")
    assert_close(x.grad, ref[1], torch.float32, "grad_input")
    gi, gw, gb = portconv.convolution_backward(torch.ones_like(y), x.detach(), w, [16], [1, 1], [1, 1], [1, 1],
                                               False, [0, 0], 1, output_mask=(False, True, False), backend="cuda")
    assert gi is None and gb is None
    assert_close(gw, ref[2], torch.float32, "grad_weight")


@pytest.mark.parametrize("replayed", [False, True])
def test_zero_copy_and_current_stream(gpu, replayed):
    """Inputs are read in place and work is queued on torch's current stream: a copy into x queued behind a
    long sleep on a side stream must be seen by the convolution issued on that same stream. ``replayed``: the
    plan's first call ran on the default stream, so the side-stream call replays it (Note [replayed launches])."""
    x, w, b, p = _make((4, 16, 64, 64), (16, 16, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    if replayed:
        portconv.conv2d(x, w, b, padding=1, backend="cuda")
    ptr = x.data_ptr()
    new = torch.randn_like(x)
    side = torch.cuda.Stream(gpu)
    torch.cuda.synchronize(gpu)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        x.copy_(new)
        y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    side.synchronize()
    assert x.data_ptr() == ptr and y.device == gpu
    assert_close(y, reference(new, w, b, p, torch.zeros(y.shape))[0], torch.float32, "output on the side stream")


def test_non_default_device(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the non-default device index cannot be exercised here")
    dev = torch.device("cuda", 1)
    x, w, b, p = _make((2, 8, 10, 10), (8, 8, 3, 3), dict(padding=1), "contig", torch.float32, dev)
    y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    assert y.device == dev
    assert_close(y, reference(x, w, b, p, torch.zeros(y.shape))[0], torch.float32, "output on cuda:1")


def test_cupy_arrays_in_and_out(gpu, monkeypatch):
    cupy = pytest.importorskip("cupy")
    x, w, b, p = _make((2, 6, 11, 11), (12, 6, 3, 3), dict(padding=1, stride=2), "contig", torch.float32, gpu)
    xc, wc, bc = (cupy.asarray(t.cpu().numpy()) for t in (x, w, b))
    y = portconv.conv2d(xc, wc, bc, padding=1, stride=2, backend="cuda")
    assert isinstance(y, cupy.ndarray) and y.device.id == gpu.index
    assert_close(torch.from_numpy(cupy.asnumpy(y)), reference(x, w, b, p, torch.zeros(1, 12, 6, 6))[0],
                 torch.float32, "cupy output")
    from portconv import functional  # Note [fast path]: a repeated call runs the cached plan, same numbers

    assert functional._fast_key("conv2d", xc, wc, bc, (2, 1, 1, 1, 0), "cuda") in functional._fast
    for name in ("make_problem", "select"):
        monkeypatch.setattr(functional, name, lambda *a, **k: pytest.fail("validated and planned again"))
    y2 = portconv.conv2d(xc, wc, bc, padding=1, stride=2, backend="cuda")
    assert isinstance(y2, cupy.ndarray) and bool((y2 == y).all())


def test_index64_variant(gpu, monkeypatch):
    """The 64-bit-index build computes the same numbers (forced here on a small problem)."""
    monkeypatch.setattr(cuda, "needs_index64", lambda *specs: True)
    x, w, b, p = _make((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    assert "64-bit" in portconv.plan(x, w, b, padding=1, backend="cuda").reason
    assert_close(y, reference(x, w, b, p, torch.zeros(y.shape))[0], torch.float32, "64-bit index output")


def test_compile_cache_on_disk(gpu, tmp_path, monkeypatch):
    from portconv.backends import _cupy

    monkeypatch.setenv("PORTCONV_CACHE_DIR", str(tmp_path))
    for expect in ("nvrtc", "disk"):
        ks = _cupy.KernelSet()
        n = len(_cupy.compile_events())
        ks.module("direct.cu", {"PC_DTYPE": 0, "PC_INDEX64": 0}, gpu.index)
        ks.module("direct.cu", {"PC_DTYPE": 0, "PC_INDEX64": 0}, gpu.index)  # the memory cache: no new event
        events = _cupy.compile_events()[n:]
        assert [e.how for e in events] == [expect] and events[0].seconds > 0
    assert len(list((tmp_path / "cuda").glob("*.bin"))) == 1


def test_profiler_sees_portconv_kernels(gpu):
    from torch.profiler import ProfilerActivity, profile

    x, w, b, _ = _make((2, 16, 24, 24), (16, 1, 3, 3), dict(padding=1, groups=16), "contig", torch.float32, gpu)
    x.requires_grad_(True)
    portconv.conv2d(x, w, b, padding=1, groups=16, backend="cuda").sum().backward()  # compile outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        portconv.conv2d(x, w, b, padding=1, groups=16, backend="cuda").sum().backward()
        torch.cuda.synchronize(gpu)
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert all(any(n == k or n.startswith(k + "_") for n in names)  # plain or a variant (_rows3s1 ...)
               for k in ("portconv_depthwise_fwd", "portconv_depthwise_bwd_data")), sorted(names)
    assert not [n for n in names if re.search(r"cudnn|xmma|conv_depthwise[23]d", n, re.I)], sorted(names)


TC_CASES = [  # (input, weight, conv kwargs, layout): edges, dilation, strides, 1-D/3-D, transposed, channels-last
    ((3, 40, 13, 11), (72, 40, 3, 3), dict(padding=1), "contig"),
    ((2, 24, 17, 15), (136, 24, 3, 3), dict(padding=2, stride=2, dilation=2), "chlast"),
    ((2, 8, 33), (20, 8, 4), dict(padding="same", dilation=2), "strided"),
    ((1, 12, 6, 7, 8), (18, 12, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "chlast"),
    ((2, 36, 9, 9), (36, 20, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
    ((4, 64, 28, 28), (160, 64, 1, 1), dict(), "chlast"),
    ((2, 3, 64, 64), (16, 3, 7, 7), dict(stride=2, padding=3), "contig"),  # 147-long reduction, split-K weight grad
]
TC_TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 2e-3}  # float32 on TF32: 10-bit mantissas


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(TC_CASES)))
def test_tensor_core_igemm(gpu, case, dtype):
    """Note [tensor-core implicit GEMM] on the GPU: the plan picks 'igemm-tc' (float32: with TF32 allowed),
    every direction matches float64, and the profiler sees portconv's igemm kernels, no cuDNN."""
    from torch.profiler import ProfilerActivity, profile

    xs, ws, kw, layout = TC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    conv = getattr(torch.backends.cudnn, "conv", None)
    old = conv.fp32_precision if conv is not None and hasattr(conv, "fp32_precision") else None
    old_legacy = None if old is not None else torch.backends.cudnn.allow_tf32
    try:
        if old is not None:
            conv.fp32_precision = "tf32"
        else:
            torch.backends.cudnn.allow_tf32 = True
        clear_cache()
        problem = Problem(p, spec_of(x), spec_of(w), True)
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        assert "tensor cores" in plan.reason and plan.math == ("tf32" if dtype == torch.float32 else "fp32-accumulate")
        go = torch.randn(problem.output_shape, device=gpu).to(dtype)
        ref = reference(x, w, b, p, go)
        be = cuda.CudaBackend()
        y = be.forward(plan, x, w, b)
        grads = be.backward(plan, go, x, w, (True, True, True))
        for name, got, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), ref):
            assert got is not None and torch.isfinite(got).all(), name
            err = ((got.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
            assert err < TC_TOL[dtype], f"igemm-tc {dtype} {name}: relative error {err:.3g}"
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            be.forward(plan, x, w, b)
            be.backward(plan, go, x, w, (True, True, False))
            torch.cuda.synchronize(gpu)
        names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        phase = "_phase" if all(s == 1 or d == 1 for s, d in zip(p.stride, p.dilation)) else ""  # [bwd-data phases]
        narrow = cuda.narrow_col(cuda.ConvView.of(problem), w.shape, w.stride())  # Note [narrow backward-data]
        bwd = "portconv_col2im" if narrow else f"portconv_igemm_bwd_data{phase}"
        assert {"portconv_igemm_fwd", bwd, "portconv_igemm_bwd_weight"} <= names, names
        assert not [n for n in names if re.search(r"cudnn|xmma|sm\d+_", n, re.I)], sorted(names)
    finally:
        if old is not None:
            conv.fp32_precision = old
        else:
            torch.backends.cudnn.allow_tf32 = old_legacy
        clear_cache()
    if dtype == torch.float32:  # IEEE float32 (the gpu fixture's policy): the FMA tile again
        assert portconv.plan(x, w, b, **kw, backend="cuda").algorithm == "implicit_gemm"


@pytest.fixture
def tf32_conv():
    """torch's cuDNN conv float32 policy set to TF32 for one test (igemm-tc takes float32 only then), restored after."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        pytest.skip("this torch has no torch.backends.cudnn.conv.fp32_precision")
    old = conv.fp32_precision
    conv.fp32_precision = "tf32"
    yield
    conv.fp32_precision = old
    clear_cache()


def _misaligned(t):
    """The same values as t, one element past a 16-byte boundary (the kernels can take no 16-byte vectors of it)."""
    buf = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    return buf[1:].as_strided(t.shape, t.stride()).copy_(t)


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


@pytest.mark.parametrize("tile", sorted(cuda.TC_TILES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tensor_core_every_tile(gpu, tile, dtype, monkeypatch, tf32_conv):
    """Every tile of cuda.TC_TILES (forced through PORTCONV_CUDA_IGEMM_TC_TILE) on an edge-heavy problem per kind:
    channels-last with stride and dilation (generic gathers) and a transposed one (Note [bwd-data phases])."""
    monkeypatch.setenv(cuda.TC_TILE_ENV, tile)
    for case in (1, 4, 6):
        xs, ws, kw, layout = TC_CASES[case]
        x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
        clear_cache()
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        ref = reference(x, w, b, p, go)
        be = cuda.CudaBackend()
        got = (be.forward(plan, x, w, b), *be.backward(plan, go, x, w, (True, True, True)))
        for name, g_, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
            err = ((g_.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
            assert err < TC_TOL[dtype], f"{tile} case {case} {dtype} {name}: relative error {err:.3g}"


NARROW_TC = [  # Note [narrow backward-data] on the tensor-core tiles
    ((4, 1, 41, 70), (32, 1, 5, 20), dict(stride=2), "contig"),  # C_in = 1 (deepbench-speech-c1's shape, smaller)
    ((2, 3, 30, 30), (64, 3, 7, 7), dict(stride=2, padding=3), "chlast"),  # an RGB stem; W channels-last too
    ((2, 32, 9, 9), (32, 3, 4, 4), dict(stride=2, padding=1, transposed=True), "contig"),  # a transposed forward to 3
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(NARROW_TC)))
def test_tensor_core_narrow_backward_data(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [narrow backward-data]: few dX channels run grad_input (a transposed problem's forward, with its bias) as
    the 1 x 1 column GEMM on tensor cores and portconv_col2im; the plan says so, every direction matches float64
    with outputs poisoned, and the caller's tensors are unchanged."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    launches = spy_launches(monkeypatch)
    xs, ws, kw, layout = NARROW_TC[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    if layout == "chlast":
        w = _channels_last(w)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc" and "col2im" in plan.reason, plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    keep = [t.clone() for t in (x, w, b, go)]
    ref = reference(x, w, b, p, go)
    be = cuda.CudaBackend()
    _tc_check((be.forward(plan, x, w, b), *be.backward(plan, go, x, w, (True, True, True))), ref, dtype,
              f"narrow case {case}")
    assert all(torch.equal(a, k) for a, k in zip((x, w, b, go), keep))
    names = [n for n, _, _ in launches]
    assert names.count("portconv_col2im") == names.count("portconv_igemm_col") == 1, names
    assert not [n for n in names if "bwd_data" in n], names


def _spy_vector_flags(monkeypatch) -> list:
    """Every FLAG_VA / FLAG_VB result of cuda._Run._vector_flags during the test (Note [vector gathers])."""
    flags = []
    real = cuda._Run._vector_flags

    def spy(self, *a, **k):
        flags.append(real(self, *a, **k))
        return flags[-1]

    monkeypatch.setattr(cuda._Run, "_vector_flags", spy)
    return flags


def _tc_check(got, ref, dtype, what: str) -> None:
    """The four results of a tensor-core plan: finite, and within TC_TOL of the float64 reference."""
    for name, g_, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
        assert torch.isfinite(g_).all(), f"{what} {name}"
        err = ((g_.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
        assert err < TC_TOL[dtype], f"{what} {dtype} {name}: relative error {err:.3g}"


VEC_CASES = [  # Note [vector gathers]: channel counts of A's reduction multiples of 16; edges of every tile
    ((3, 32, 13, 11), (48, 32, 3, 3), dict(padding=1, stride=2)),  # phase bwd-data over 4 phases, K = 48
    ((2, 48, 5, 9, 7), (32, 48, 3, 3, 3), dict(padding=1)),  # taps along depth
    ((2, 16, 11, 12), (32, 16, 3, 3), dict(padding=(1, 2), dilation=(1, 2))),  # C = 16, dilation
    ((2, 32, 9, 9), (32, 24, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True)),
    ((5, 16, 7, 7), (144, 16, 1, 1), dict()),  # 144 columns: a partial second column tile
    ((2, 64, 9, 10), (64, 64, 3, 3), dict(padding=1)),  # C = K = 64: 2 (4 when forced) steps a ring stage
]


@pytest.mark.parametrize("ks", cuda.TC_KS)
@pytest.mark.parametrize("w_layout", ["chlast", "contig"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(VEC_CASES)))
def test_tensor_core_vector_gathers(gpu, case, dtype, w_layout, ks, monkeypatch, tf32_conv):
    """Note [vector gathers]: channels-last problems whose reduction channels come in 16s read A (and, forward with a
    channels-last weight, B) 16 bytes at a time: the launches carry FLAG_VA (FLAG_VB), every direction matches
    float64; the same problem from a misaligned address runs the element gathers (no flag) and matches too. Each
    with 1, 2 and 4 steps a ring stage (Note [deep stages]: the cases' 1, 3, 9, 27 steps leave part-empty stages)."""
    monkeypatch.setenv(cuda.TC_KS_ENV, ks)
    flags = _spy_vector_flags(monkeypatch)
    xs, ws, kw = VEC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, "chlast", dtype, gpu)
    if w_layout == "chlast":
        w = _channels_last(w)
    for misaligned in (False, True):
        if misaligned:
            x = _misaligned(x)
        flags.clear()
        clear_cache()
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        go = _channels_last(go)
        ref = reference(x, w, b, p, go)
        be = cuda.CudaBackend()
        got = (be.forward(plan, x, w, b), *be.backward(plan, go, x, w, (True, True, True)))
        _tc_check(got, ref, dtype, f"case {case} {w_layout} misaligned={misaligned}")
        used = 0
        for f in flags:
            used |= f
        if not misaligned:
            assert used & cuda.FLAG_VA, flags
        elif not p.transposed:  # the forward's A is the misaligned x
            assert not flags[0] & cuda.FLAG_VA, flags
        if not p.transposed:  # B of the forward is W: vectors when its channels are contiguous (a 1x1 W is)
            assert bool(flags[0] & cuda.FLAG_VB) == cuda.vector_ok(w, w.element_size()), flags


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(VEC_CASES)))
def test_tensor_core_channels_last_staging(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [channels-last staging]: dense NCHW operands of a vector-eligible launch (at every size here: stage_pays
    overruled) are first transposed into channel-contiguous workspaces; the launches then carry FLAG_VA and
    FLAG_VB, every direction matches float64, and the caller's tensors are unchanged."""
    monkeypatch.setattr(cuda, "stage_pays", lambda macs, elems, direction: bool(elems))
    flags, staged = _spy_vector_flags(monkeypatch), []
    real_t = cuda._Run._transposed

    def spy_t(self, t, *a, **k):
        staged.append(tuple(t.shape))
        return real_t(self, t, *a, **k)

    monkeypatch.setattr(cuda._Run, "_transposed", spy_t)
    xs, ws, kw = VEC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, "contig", dtype, gpu)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc", plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    keep = [t.clone() for t in (x, w, go)]
    be = cuda.CudaBackend()
    got = (be.forward(plan, x, w, b), *be.backward(plan, go, x, w, (True, True, True)))
    _tc_check(got, ref, dtype, f"case {case}")
    assert all(torch.equal(a, k) for a, k in zip((x, w, go), keep))
    assert staged, "no operand was staged"
    assert any(f & cuda.FLAG_VA and f & cuda.FLAG_VB for f in flags), flags


GROUPED_CASES = [  # Note [grouped implicit GEMM]: 8+ channels a group; vectors where a group's channels come in 16s
    ((2, 32, 9, 9), (64, 16, 3, 3), dict(padding=1, groups=2), "chlast"),  # vector A, B; TN weight gradient
    ((2, 48, 37), (48, 8, 5), dict(padding=2, groups=6), "contig"),  # 8 a group: element gathers, M lanes
    ((2, 32, 7, 7), (32, 8, 4, 4), dict(stride=2, padding=1, groups=4, transposed=True), "chlast"),  # phases
    ((2, 48, 499), (48, 16, 32), dict(padding=16, groups=3), "contig"),  # posconv-like: a long kernel
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(GROUPED_CASES)))
def test_tensor_core_grouped(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [grouped implicit GEMM]: grouped problems with 8+ channels a group plan igemm-tc and match float64 in
    every direction; channels-last ones whose groups' channels come in 16s take the vector modes and the TN tile."""
    flags = _spy_vector_flags(monkeypatch)
    xs, ws, kw, layout = GROUPED_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc" and "grouped" in plan.reason, plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    go = _channels_last(go) if layout == "chlast" else go
    ref = reference(x, w, b, p, go)
    be = cuda.CudaBackend()
    got = (be.forward(plan, x, w, b), *be.backward(plan, go, x, w, (True, True, True)))
    _tc_check(got, ref, dtype, f"grouped case {case}")
    if case == 0:
        assert any(f & cuda.FLAG_VA for f in flags), flags
        assert any(f & cuda.FLAG_VA and f & cuda.FLAG_VB for f in flags), flags  # the weight gradient's TN tile


TN_CASES = [  # Note [TN tiles]: weight gradients whose dY and X channels come in whole 16-byte vectors
    ((3, 16, 5, 7), (24, 16, 3, 3), dict(padding=1)),  # rows of 7 (a step crosses rows), K = 24: a partial M tile
    ((8, 64, 28, 28), (64, 64, 3, 3), dict(padding=1)),  # a long reduction: split over grid z, the workspace
    ((2, 16, 5, 6, 7), (16, 16, 3, 3, 3), dict(padding=1, stride=(1, 2, 1))),  # 3-D
    ((4, 32, 37), (16, 32, 5), dict(stride=2, padding=1)),  # 1-D (NCHW only: staged)
    ((2, 16, 9, 9), (16, 8, 4, 4), dict(stride=2, padding=1, transposed=True)),  # transposed: roles swapped
]


@pytest.mark.parametrize("layout", ["chlast", "contig"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(TN_CASES)))
def test_tensor_core_tn_weight_gradient(gpu, case, dtype, layout, monkeypatch, tf32_conv):
    """Note [TN tiles]: the weight gradient of a channels-last problem (or a dense NCHW 16-bit one, staged:
    stage_pays overruled) launches with FLAG_VA | FLAG_VB and matches float64, in the copy order of Note [TN copy
    order] and in v8's (PORTCONV_CUDA_IGEMM_TC_V8=1); with PORTCONV_CUDA_IGEMM_TC_V5=1 (the v5 element gathers), from
    a misaligned channels-last X (no vectors) and for TF32 NCHW (never staged) it launches without them and matches
    too."""
    xs, ws, kw = TN_CASES[case]
    if layout == "chlast" and len(xs) == 3:
        pytest.skip("1-D tensors have no channels-last memory format; the contig run stages this case")
    monkeypatch.setattr(cuda, "stage_pays", lambda macs, elems, direction: bool(elems))
    launches = spy_launches(monkeypatch)
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    vec = cuda.FLAG_VA | cuda.FLAG_VB
    for variant in ("tn", "v8", "v5", "misaligned"):
        if variant == "v8":
            monkeypatch.setenv(cuda.TC_V8_ENV, "1")
        if variant == "v5":
            monkeypatch.delenv(cuda.TC_V8_ENV)
            monkeypatch.setenv(cuda.TC_V5_ENV, "1")
        if variant == "misaligned":
            monkeypatch.delenv(cuda.TC_V5_ENV)
            x = _misaligned(x)
        launches.clear()
        clear_cache()
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        if layout == "chlast":
            go = _channels_last(go)
        keep = [t.clone() for t in (x, go)]
        ref = reference(x, w, b, p, go)
        gw = cuda.CudaBackend().backward(plan, go, x, w, (False, True, False))[1]
        assert torch.isfinite(gw).all()
        err = ((gw.double().cpu() - ref[2]).norm() / ref[2].norm()).item()
        assert err < TC_TOL[dtype], f"case {case} {dtype} {layout} {variant}: relative error {err:.3g}"
        assert all(torch.equal(a, k) for a, k in zip((x, go), keep))
        (flags,) = [f for n, f, _ in launches if n == "portconv_igemm_bwd_weight"]
        # a staged copy is aligned: vectors again; TF32 never stages for the weight gradient (Note [channels-last
        # staging]), so its NCHW problems keep the element gathers
        stages = layout == "contig" and dtype != torch.float32
        expect = (variant in ("tn", "v8") and (layout == "chlast" or stages)) or (variant == "misaligned" and stages)
        assert (flags & vec == vec) == expect, (variant, launches)
    if case == 1:  # the long reduction was split
        assert [g for n, _, g in launches if n == "portconv_igemm_bwd_weight"][0][2] > 1, launches
