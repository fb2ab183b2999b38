"""The default plan: the GPU policy on recorded TorchContexts, the CPU order, and the per-call fast path."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import portconv
from portconv import fastpath, knobs, planner
from portconv.backends import BackendId
from portconv.backends.aten import AtenRunner
from portconv.params import ConvParams
from portconv.planner import clear_cache, use_backend
from portconv.policy import NATIVE_EVIDENCE, VENDOR_VIA_ATEN, OwnKernelWin, cpu_policy, gpu_policy
from portconv.problem import Problem
from portconv.rules import TorchContext
from portconv.tensors import TensorSpec, dense_strides

# What TorchContext.from_torch read on an H200 (torch 2.11, cuDNN 9.19).
H200 = TorchContext(device_type="cuda", torch_version="2.11.0+cu130", has_cudnn=True, cudnn_version=91900,
                    gpu_arch="sm_90", num_threads=16, mkldnn_bf16=True)
MI300 = TorchContext(device_type="cuda", torch_version="2.13.0+rocm7.0", is_hip=True, miopen_version=30500,
                     gpu_arch="gfx942", miopen_nhwc_default=True)


def _problem(ishape, wshape, dtype="float32", fmt="contiguous", bias=False, **kw) -> Problem:
    rank = len(wshape) - 2
    p = ConvParams.make(rank, weight_shape=wshape, input_shape=ishape, **kw)

    def spec(s):
        return TensorSpec(tuple(s), dense_strides(s, fmt if len(s) > 3 else "contiguous"), dtype, "cuda", 0)

    return Problem(p, spec(ishape), spec(wshape), bias)


def _first(problem, ctx=H200, wins=None):
    prefer, passed = gpu_policy(problem, ctx, wins)
    return prefer[0][0], prefer[0][1], dict(passed), prefer


# --- the GPU policy (pure: recorded contexts, no GPU) ---------------------------------------------------------------
def test_depthwise_3d_goes_to_atens_own_kernel_with_the_evidence():
    bid, why, passed, _ = _first(_problem((2, 48, 8, 28, 28), (48, 1, 3, 3, 3), padding=1, groups=48))
    assert bid == BackendId.ATEN
    assert "CudaDepthwise3d" in why and "0.18x" in why and NATIVE_EVIDENCE["CudaDepthwise3d"] in why
    assert BackendId.CUDNN in passed and "CudaDepthwise3d" in passed[BackendId.CUDNN]
    assert "OWN_KERNEL_WINS" in passed[BackendId.CUDA]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_large_3x3_depthwise_goes_to_portconvs_kernels(dtype):
    bid, why, _, prefer = _first(_problem((32, 144, 56, 56), (144, 1, 3, 3), dtype, padding=1, groups=144))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS" in why and "CudaDepthwise2d" in why
    assert prefer[1][0] == BackendId.ATEN  # PyTorch's own kernel stays the fallback


def test_large_stride2_3x3_depthwise_goes_to_portconvs_kernels():  # mbv2-dw3x3-s2
    bid, why, _, _ = _first(_problem((32, 144, 56, 56), (144, 1, 3, 3), stride=2, padding=1, groups=144))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS" in why and "CudaDepthwise2d" in why
    s2_3d = _problem((2, 48, 8, 56, 56), (48, 1, 3, 3, 3), stride=2, padding=1, groups=48)
    assert _first(s2_3d)[0] == BackendId.ATEN  # stride 2 is measured in 2-D only


def test_small_measured_3x3_depthwise_goes_to_portconvs_kernels():  # mbv2-dw3x3-last
    case = dict(ishape=(32, 960, 7, 7), wshape=(960, 1, 3, 3), padding=1, groups=960)  # mbv2-dw3x3-last
    bid, why, _, prefer = _first(_problem(dtype="float32", **case))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS" in why and "CudaDepthwise2d" in why
    assert prefer[1][0] == BackendId.ATEN


@pytest.mark.parametrize("case", [
    # mbv2-dw3x3-b1 (401K outputs): host-bound per call, portconv's path measured 0.81x-1.32x (H100)
    dict(ishape=(1, 32, 112, 112), wshape=(32, 1, 3, 3), padding=1, groups=32),
    dict(ishape=(1, 32, 56, 56), wshape=(32, 1, 3, 3), padding=1, groups=32),  # smaller still
    dict(ishape=(32, 144, 56, 56), wshape=(144, 1, 5, 5), padding=4, dilation=2, groups=144),  # 5x5, dilation 2
])
def test_other_depthwise_goes_to_aten_with_evidence(case):
    bid, why, _, _ = _first(_problem(dtype="float32", **case))
    assert bid == BackendId.ATEN and "CudaDepthwise2d" in why and NATIVE_EVIDENCE["CudaDepthwise2d"] in why


@pytest.mark.parametrize("case,aten", [  # the suite rows of each OWN_KERNEL_WINS class measured on an H100
    (dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 1, 3, 3, 3), padding=1, groups=54, fmt="channels_last"), "Cudnn"),
    (dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 1, 5, 5, 5), padding=2, groups=54, fmt="channels_last"), "Cudnn"),
    (dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 1, 5, 5, 5), padding=2, groups=54), "CudaDepthwise3d"),
    (dict(ishape=(64, 768, 7, 7), wshape=(768, 1, 7, 7), padding=3, groups=768), "CudaDepthwise2d"),
    (dict(ishape=(32, 1024, 7, 7), wshape=(1024, 1, 13, 13), padding=6, groups=1024), "CudaDepthwise2d"),
    (dict(ishape=(32, 1024, 7, 7), wshape=(1024, 1, 13, 13), padding=6, groups=1024, fmt="channels_last"), "Cudnn"),
    (dict(ishape=(32, 128, 56, 56), wshape=(128, 1, 31, 31), padding=15, groups=128, fmt="channels_last"), "Cudnn"),
    # Note [depthwise bands]: convnext-dw7x7-st1, -st3, effnet-dw5x5, -s2, replk-dw31x31 in NCHW
    (dict(ishape=(64, 96, 56, 56), wshape=(96, 1, 7, 7), padding=3, groups=96), "CudaDepthwise2d"),
    (dict(ishape=(64, 384, 14, 14), wshape=(384, 1, 7, 7), padding=3, groups=384), "CudaDepthwise2d"),
    (dict(ishape=(64, 480, 14, 14), wshape=(480, 1, 5, 5), padding=2, groups=480), "CudaDepthwise2d"),
    (dict(ishape=(64, 144, 56, 56), wshape=(144, 1, 5, 5), padding=2, stride=2, groups=144), "CudaDepthwise2d"),
    (dict(ishape=(32, 128, 56, 56), wshape=(128, 1, 31, 31), padding=15, groups=128), "CudaDepthwise2d"),
    # Note [clw phases]: effnet-dw5x5-s2-cl
    (dict(ishape=(64, 144, 56, 56), wshape=(144, 1, 5, 5), padding=2, stride=2, groups=144, fmt="channels_last"),
     "Cudnn"),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_measured_depthwise_families_go_to_portconvs_kernels(case, aten, dtype):
    bid, why, _, prefer = _first(_problem(dtype=dtype, **case))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS" in why and f"ATen would run {aten}" in why
    assert prefer[1][0] == BackendId.ATEN


@pytest.mark.parametrize("hw,c", [(56, 96), (14, 384)])  # convnext-dw7x7-st1-cl, -st3-cl
def test_channels_last_7x7_goes_to_portconvs_kernels_in_float32_only(hw, c):
    case = dict(ishape=(64, c, hw, hw), wshape=(c, 1, 7, 7), padding=3, groups=c, fmt="channels_last")
    bid, why, _, _ = _first(_problem(dtype="float32", **case))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS" in why and "ATen would run Cudnn" in why
    assert _first(_problem(dtype="bfloat16", **case))[0] == BackendId.ATEN  # cuDNN's 16-bit NHWC kernels win


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_channels_last_5x5_goes_to_portconvs_kernels_at_stride_2_only(dtype):
    """Note [clw phases]: effnet-dw5x5-s2-cl wins as a whole (its backward-data by phases); effnet-dw5x5-cl (stride
    1) and the channels-last 3x3 at stride 2 measured slower and stay with ATen."""
    s2 = dict(ishape=(64, 144, 56, 56), wshape=(144, 1, 5, 5), padding=2, stride=2, groups=144, fmt="channels_last")
    assert _first(_problem(dtype=dtype, **s2))[0] == BackendId.CUDA
    s1 = dict(ishape=(64, 480, 14, 14), wshape=(480, 1, 5, 5), padding=2, groups=480, fmt="channels_last")
    assert _first(_problem(dtype=dtype, **s1))[0] == BackendId.ATEN
    tap3 = dict(ishape=(64, 96, 112, 112), wshape=(96, 1, 3, 3), padding=1, stride=2, groups=96, fmt="channels_last")
    assert _first(_problem(dtype=dtype, **tap3))[0] == BackendId.ATEN


def test_compiled_graphs_keep_the_own_ops_only_where_measured_compiled():
    """Note [own kernel wins compiled]: the channels-last 7x7 float32 row holds in compiled graphs (ConvNeXt-T's
    compiled step), so Inductor keeps its plans' ops; every other row compiles as ATen's convolution; a plan's
    compiled_as_aten follows (the aten backend's plans always compile as ATen's; a forced cudnn plan ATen records
    keeps its ops)."""
    from portconv.device import DeviceInfo
    from portconv.policy import compiled_win

    cl7 = _problem((64, 96, 56, 56), (96, 1, 7, 7), "float32", "channels_last", padding=3, groups=96)
    win = compiled_win(cl7, H200)
    assert win is not None and "2.00x" in win.compiled and win.applies(cl7)
    for other in (_problem((64, 96, 56, 56), (96, 1, 7, 7), "bfloat16", "channels_last", padding=3, groups=96),
                  _problem((64, 96, 56, 56), (96, 1, 7, 7), padding=3, groups=96),  # NCHW: its row has no evidence
                  _problem((32, 64, 56, 56), (64, 64, 3, 3), padding=1)):  # dense: no row
        assert compiled_win(other, H200) is None
    dev = DeviceInfo(vendor="nvidia", kind="gpu", name="H200", arch="sm_90")
    plan = planner.Plan(problem=cl7, backend=BackendId.CUDA, algorithm="depthwise", memory_format="channels_last",
                        reason="", device=dev)
    assert plan.compiled_as_aten and not dataclasses.replace(plan, keeps_ops=True).compiled_as_aten
    assert not dataclasses.replace(plan, forced=True).compiled_as_aten
    aten = dataclasses.replace(plan, backend=BackendId.ATEN, forced=True)
    assert aten.compiled_as_aten and dataclasses.replace(aten, keeps_ops=True).compiled_as_aten
    assert not dataclasses.replace(plan, forced=True, aten_autograd=True).compiled_as_aten  # cudnn's recorded plans
    assert "faster compiled too" in dataclasses.replace(plan, keeps_ops=True).explain()


@pytest.mark.parametrize("case", [  # neighbours of those classes that measured slower (or were not measured)
    dict(ishape=(64, 384, 14, 14), wshape=(384, 1, 7, 7), padding=3, stride=2, groups=384),  # 7x7 stride 2
    dict(ishape=(64, 144, 56, 56), wshape=(144, 1, 5, 5), padding=2, groups=144, fmt="channels_last"),  # -cl
    dict(ishape=(64, 144, 56, 56), wshape=(144, 1, 5, 5), padding=2, groups=144, fmt="channels_last"),  # 5x5-cl
    dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 1, 3, 3, 3), padding=1, stride=2, groups=54, fmt="channels_last"),
    dict(ishape=(1, 1024, 7, 7), wshape=(1024, 1, 13, 13), padding=6, groups=1024),  # 50K outputs: host-bound
])
def test_depthwise_families_that_lose_stay_with_aten(case):
    assert _first(_problem(dtype="float32", **case))[0] == BackendId.ATEN


def test_depthwise_that_aten_sends_to_cudnn_goes_to_cudnn_through_aten():
    # float16 contiguous, stride 1, >= 32 channels: ATen's fp16 depthwise heuristic; channels-last: always cuDNN
    half = _problem((32, 144, 56, 56), (144, 1, 3, 3), "float16", padding=1, groups=144)
    chlast = _problem((32, 144, 56, 56), (144, 1, 3, 3), "float32", "channels_last", padding=1, groups=144)
    for pr in (half, chlast):
        bid, why, passed, prefer = _first(pr)
        assert bid == BackendId.ATEN and "ATen routes it to cuDNN (Cudnn)" in why
        assert VENDOR_VIA_ATEN in why  # Note [vendor library via ATen]: the measured reason
        assert prefer[1][0] == BackendId.CUDNN and BackendId.CUDA in passed


@pytest.mark.parametrize("case,algo", [
    (dict(ishape=(32, 64, 56, 56), wshape=(64, 64, 3, 3), padding=1), "Cudnn"),
    (dict(ishape=(32, 256, 56, 56), wshape=(64, 256, 1, 1)), "Cudnn"),
    (dict(ishape=(8, 64, 28, 28), wshape=(128, 2, 3, 3), padding=1, groups=32), "Cudnn"),  # resnext: grouped
    (dict(ishape=(16, 512, 4, 4), wshape=(512, 256, 4, 4), stride=2, padding=1, transposed=True), "CudnnTranspose"),
    (dict(ishape=(4, 512, 1000), wshape=(512, 512, 3), stride=2), "Cudnn"),  # conv1d
])
def test_dense_problems_go_to_cudnn_through_aten(case, algo):
    bid, why, passed, prefer = _first(_problem(**case))
    assert bid == BackendId.ATEN and f"cuDNN ({algo})" in why and prefer[1][0] == BackendId.CUDNN
    assert _first(_problem(dtype="bfloat16", **case))[0] == BackendId.ATEN


def test_when_aten_cannot_use_cudnn_the_plan_is_aten():
    dense = _problem((2, 8, 16, 16), (8, 8, 3, 3), padding=1)
    bid, why, passed, _ = _first(dense, H200.replace(cudnn_enabled=False))
    assert bid == BackendId.ATEN and "Slow2d" in why
    big_op = _problem((2, 8, 5, 5), (8, 8, 3, 3), stride=2, transposed=True, output_padding=2, dilation=3)
    bid, why, _, _ = _first(big_op)
    assert bid == BackendId.ATEN and "SlowTranspose2d" in why
    bf16_on_volta = _first(_problem((2, 8, 16, 16), (8, 8, 3, 3), "bfloat16"), H200.replace(gpu_arch="sm_70"))
    assert bf16_on_volta[0] == BackendId.ATEN


def test_rocm_routes_to_miopen_or_aten():
    dense = _first(_problem((2, 8, 16, 16), (8, 8, 3, 3), padding=1), MI300)
    assert dense[0] == BackendId.ATEN and "MIOpen (Miopen)" in dense[1]
    dw = _first(_problem((2, 8, 16, 16), (8, 1, 3, 3), padding=1, groups=8), MI300)
    assert dw[0] == BackendId.ATEN and "MiopenDepthwise" in dw[1]
    f64 = _first(_problem((2, 8, 16, 16), (8, 8, 3, 3), "float64", padding=1), MI300)
    assert f64[0] == BackendId.ATEN and BackendId.HIP in f64[2]


def test_own_kernel_table_rows_apply_only_to_their_class():
    row = OwnKernelWin(BackendId.CUDA, ("CudaDepthwise2d",), lambda pr: pr.params.stride == (1, 1),
                       "2-d depthwise, stride 1", "1.5x PyTorch on a test row (nowhere: a test)")
    s1 = _problem((32, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144)
    bid, why, passed, prefer = _first(s1, wins=(row,))
    assert bid == BackendId.CUDA and "OWN_KERNEL_WINS: 2-d depthwise, stride 1: 1.5x" in why
    assert prefer[1][0] == BackendId.ATEN and "CudaDepthwise2d" in prefer[1][1]
    s2 = _problem((32, 144, 56, 56), (144, 1, 3, 3), padding=1, stride=2, groups=144)
    assert _first(s2, wins=(row,))[0] == BackendId.ATEN
    dense = _problem((2, 8, 16, 16), (8, 8, 3, 3), padding=1)
    assert _first(dense, wins=(row,))[0] == BackendId.ATEN  # the row replaces CudaDepthwise2d only (cuDNN via aten)
    assert "MiopenDepthwise" in _first(s1, MI300, wins=(row,))[1]  # a cuda row says nothing on ROCm


# --- the CPU order -------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh(knob_env):
    for name in ("PORTCONV_BACKEND", "PORTCONV_DISABLE", "PORTCONV_TUNE"):
        knob_env(name, None)
    clear_cache()
    yield knob_env
    clear_cache()


def test_cpu_default_is_atens_route_unless_a_measured_row_applies(fresh, requested_backends):
    """Note [CPU wins]: dense and 2-D depthwise CPU problems stay on ATen (OpenCL rejected with the reason); 3x3x3
    depthwise takes the OpenCL kernels from OWN_CPU_MIN_OUTPUTS outputs on, with ATen as the fallback."""
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    pl = portconv.plan(x, w, padding=1)
    assert pl.backend == BackendId.ATEN and "ATen's CPU route" in pl.reason
    assert ("opencl", "not preferred: OWN_KERNEL_WINS_CPU has no row for this problem") in pl.rejected
    dw3 = torch.randn(2, 8, 8, 16, 16), torch.randn(8, 1, 3, 3, 3)  # 32K outputs
    if "opencl" in requested_backends:
        pl = portconv.plan(*dw3, padding=1, groups=8)
        assert pl.backend == BackendId.OPENCL and "OWN_KERNEL_WINS_CPU" in pl.reason
    small = torch.randn(1, 8, 6, 10, 10), dw3[1]  # host-bound: ATen's CPU path
    assert portconv.plan(*small, padding=1, groups=8).backend == BackendId.ATEN
    fresh("PORTCONV_DISABLE", "opencl")
    pl = portconv.plan(*dw3, padding=1, groups=8)
    assert pl.backend == BackendId.ATEN and ("opencl", "disabled by PORTCONV_DISABLE") in pl.rejected


def test_cpu_policy_rows_follow_atens_route():
    cpu = TorchContext(num_threads=2)
    dw3 = Problem(ConvParams.make(3, padding=1, groups=8, weight_shape=(8, 1, 3, 3, 3)),
                  TensorSpec((2, 8, 8, 16, 16), dense_strides((2, 8, 8, 16, 16)), "float32", "cpu"),
                  TensorSpec((8, 1, 3, 3, 3), dense_strides((8, 1, 3, 3, 3)), "float32", "cpu"), False)
    prefer, passed = cpu_policy(dw3, cpu)
    assert prefer[0][0] == BackendId.OPENCL and prefer[1][0] == BackendId.ATEN and passed == ()
    prefer, passed = cpu_policy(dw3, cpu, wins=())  # no row: ATen, OpenCL passed over with the reason
    assert prefer == ((BackendId.ATEN, prefer[0][1]),) and passed[0][0] == BackendId.OPENCL
    half = dataclasses.replace(dw3, input=dataclasses.replace(dw3.input, dtype="bfloat16"),
                               weight=dataclasses.replace(dw3.weight, dtype="bfloat16"))
    assert cpu_policy(half, cpu)[0][0][0] == BackendId.ATEN  # the row is float32/float64 only


# --- the fast path -------------------------------------------------------------------------------------------------
def _count(monkeypatch, cls, name="forward"):
    calls = []
    orig = getattr(cls, name)

    def spy(self, *a, **k):
        calls.append(a)
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, name, spy)
    return calls


def test_fast_path_skips_checks_and_planning_and_returns_the_same_plan(fresh, monkeypatch):
    x, w, b = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), torch.randn(6)
    want = F.conv2d(x, w, b, padding=1)

    def conv():
        return portconv.convolution(x, w, b, (1, 1), (1, 1), (1, 1), False, (0, 0), 1, backend="aten")

    assert torch.equal(portconv.conv2d(x, w, b, padding=1, backend="aten"), want)
    assert torch.allclose(portconv.conv2d(x[0], w, b, padding=1, backend="aten"), want[0], atol=1e-5)
    assert torch.equal(conv(), want)

    def again(*a, **k):
        raise AssertionError("validated and planned again")

    monkeypatch.setattr(planner, "make_problem", again)
    monkeypatch.setattr(planner, "select", again)
    for _ in range(3):
        assert torch.equal(portconv.conv2d(x, w, b, padding=1, backend="aten"), want)
        assert torch.allclose(portconv.conv2d(x[0], w, b, padding=1, backend="aten"), want[0], atol=1e-5)
        assert torch.equal(conv(), want)
    monkeypatch.undo()
    hits = [v for k, v in fastpath._entries.items() if k[0] == "conv2d" and k[2] == x.shape]
    assert len(hits) == 1 and hits[0][0] is portconv.plan(x, w, b, padding=1, backend="aten")


def test_backward_fast_path_skips_checks_and_planning(fresh, monkeypatch):
    """convolution_backward keeps a fast-path entry per call (Note [fast path]); masks of bools or ints share it, and
    a grad_output of another shape misses and meets the checks."""
    from portconv import functional

    x, w, go = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), torch.randn(2, 6, 8, 8)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    want = torch.ops.aten.convolution_backward(go, x, w, [6], *args, [True, True, True])
    got = portconv.convolution_backward(go, x, w, [6], *args, (True, True, True), backend="aten")
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))

    def again(*a, **k):
        raise AssertionError("validated and planned again")

    monkeypatch.setattr(functional, "backward_problem", again)
    monkeypatch.setattr(functional, "select", again)
    for mask in ((True, True, True), [1, 1, 1]):
        got = portconv.convolution_backward(go, x, w, [6], *args, mask, backend="aten")
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    with pytest.raises(AssertionError, match="planned again"):  # another mask: another entry
        portconv.convolution_backward(go, x, w, [6], *args, (False, True, False), backend="aten")
    with pytest.raises(AssertionError, match="planned again"):  # another grad_output shape: the checks again
        portconv.convolution_backward(go[:, :, :4], x, w, [6], *args, (True, True, True), backend="aten")


def _torch_error(fn) -> str:
    with pytest.raises(RuntimeError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("bad", [
    lambda x, w, b: (x[:, :3], w, b, {}),  # wrong channel count
    lambda x, w, b: (x, w, b.double(), {}),  # bias dtype
    lambda x, w, b: (x, w, b[:5], {}),  # bias size
    lambda x, w, b: (x, w, b, {"groups": 3}),
    lambda x, w, b: (x[:, :, :1, :1], w, b, {"padding": 0}),  # kernel larger than the input
    lambda x, w, b: (x.double(), w, b, {}),  # input and weight types
])
def test_bad_input_raises_pytorchs_error_after_a_cached_call(fresh, monkeypatch, bad):
    x, w, b = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), torch.randn(6)
    portconv.conv2d(x, w, b, padding=1, backend="aten")
    ran = _count(monkeypatch, AtenRunner)
    bx, bw, bb, kw = bad(x, w, b)
    kw = {"padding": 1, **kw}
    want = _torch_error(lambda: F.conv2d(bx, bw, bb, **kw))
    for _ in range(2):  # never cached: the second call is checked again
        assert _torch_error(lambda: portconv.conv2d(bx, bw, bb, backend="aten", **kw)) == want
    assert ran == []  # the checks came before any kernel


def test_arguments_equal_in_value_but_not_in_type_do_not_share_an_entry(fresh):
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    args = (1, 1, 1, 1, 0)
    assert fastpath.key("conv2d", x, w, None, args, "aten") != fastpath.key(
        "conv2d", x, w, None, (True, 1, 1, 1, 0), "aten")
    assert fastpath.key("conv2d", x, w, None, (1.0, 1, 1, 1, 0), "aten") is None
    assert fastpath.key("conv2d", x, w, None, ([1, 1], 1, 1, 1, 0), "aten") is not None
    assert fastpath.key("conv2d", x.to_sparse(), w, None, args, "aten") is None
    assert fastpath.key("conv2d", x, w, None, args, "aten") != fastpath.key(
        "conv2d", x.contiguous(memory_format=torch.channels_last), w, None, args, "aten")


def test_cache_follows_knobs_use_backend_and_torch_flags(fresh, monkeypatch, requested_backends):
    x, w = torch.randn(1, 4, 8, 32, 32), torch.randn(4, 1, 3, 3, 3)  # depthwise 3x3x3, 32K outputs: CPU default opencl
    kw = dict(padding=1, groups=4)
    aten = _count(monkeypatch, AtenRunner)
    fresh("PORTCONV_DISABLE", "opencl")
    portconv.conv3d(x, w, **kw)
    assert len(aten) == 1
    with use_backend("aten"):
        portconv.conv3d(x, w, **kw)
    assert len(aten) == 2
    if "opencl" in requested_backends:
        from conftest import require_backend

        require_backend("opencl")  # requested: absent fails here, with the reason
        fresh("PORTCONV_DISABLE", None)
        portconv.conv3d(x, w, **kw)  # opencl again
        assert len(aten) == 2
        with use_backend("aten"):
            portconv.conv3d(x, w, **kw)
        assert len(aten) == 3
        fresh("PORTCONV_BACKEND", "aten")
        portconv.conv3d(x, w, **kw)
        assert len(aten) == 4
    big = torch.randn(16, 8, 16, 16), torch.randn(8, 8, 5, 5)
    assert portconv.plan(*big, padding=2, backend="aten").algorithm == "aten:Mkldnn"
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert portconv.plan(*big, padding=2, backend="aten").algorithm != "aten:Mkldnn"
    assert torch.allclose(portconv.conv2d(*big, padding=2, backend="aten"), F.conv2d(*big, padding=2), atol=1e-4)


def test_grad_mode_is_decided_per_call(fresh):
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    assert portconv.conv2d(x, w, padding=1, backend="aten").grad_fn is None
    x.requires_grad_(True)
    y = portconv.conv2d(x, w, padding=1, backend="aten")
    assert y.grad_fn is not None
    y.sum().backward()
    xr = x.detach().requires_grad_(True)
    F.conv2d(xr, w, padding=1).sum().backward()
    assert torch.allclose(x.grad, xr.grad, atol=1e-5)
    with torch.no_grad():
        assert portconv.conv2d(x, w, padding=1, backend="aten").grad_fn is None


def test_empty_batches_use_the_cache_and_stay_empty(fresh):
    x, w = torch.randn(0, 4, 8, 8), torch.randn(6, 4, 3, 3)
    for _ in range(2):
        y = portconv.conv2d(x, w, padding=1, backend="aten")
        assert y.shape == F.conv2d(x, w, padding=1).shape
    assert any(k[0] == "conv2d" and v[0] is None for k, v in fastpath._entries.items())


def test_clear_cache_clears_the_fast_path(fresh):
    portconv.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), backend="aten")
    assert fastpath._entries
    clear_cache()
    assert not fastpath._entries


def test_options_and_reloaded_knobs_make_a_new_plan(fresh):
    """Options (portconv.options) and the Env (after knobs.reload) are in the plan cache's key: a change mid-process
    gets a new plan, never one made under other settings."""
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    first = portconv.plan(x, w, padding=1, backend="aten")
    assert portconv.plan(x, w, padding=1, backend="aten") is first
    with portconv.options(igemm_tile="128x64") as opts:
        other = portconv.plan(x, w, padding=1, backend="aten")
        assert other is not first and other.options == opts and "igemm_tile=128x64" in other.explain()
    assert portconv.plan(x, w, padding=1, backend="aten") is first
    fresh("PORTCONV_OPENCL_DENSE", "direct")  # reload(): a new Env, and the caches it decided are dropped
    assert portconv.plan(x, w, padding=1, backend="aten") is not first


def test_plan_cache_is_bounded_lru(fresh):
    from portconv import fastpath
    from portconv import planner as plan_mod

    fresh("PORTCONV_PLAN_CACHE", "3")
    w = torch.randn(2, 2, 3)
    plans = [portconv.plan(torch.randn(1, 2, n), w, backend="aten") for n in (5, 6, 7)]
    assert portconv.plan(torch.randn(1, 2, 5), w, backend="aten") is plans[0]  # 5 is now the most recent
    portconv.plan(torch.randn(1, 2, 8), w, backend="aten")  # evicts 6, the least recently used
    assert len(plan_mod._cache) == 3
    assert portconv.plan(torch.randn(1, 2, 5), w, backend="aten") is plans[0]
    assert portconv.plan(torch.randn(1, 2, 6), w, backend="aten") is not plans[1]
    for n in range(5, 20):  # the fast path's entries are bounded alike
        portconv.conv1d(torch.randn(1, 2, n), w, backend="aten")
    assert len(fastpath._entries) == 3 and len(plan_mod._cache) == 3
    with pytest.raises(ValueError, match="PORTCONV_PLAN_CACHE='0': expected a whole number >= 1"):
        fresh("PORTCONV_PLAN_CACHE", "0")


def test_knobs_are_typed_and_read_once(fresh):
    with pytest.raises(ValueError, match="PORTCONV_OPENCL_TC='sometimes': expected one of off, ptx, portable"):
        fresh("PORTCONV_OPENCL_TC", "sometimes")
    fresh("PORTCONV_OPENCL_TC", None)
    fresh("PORTCONV_POISON", "1")
    assert knobs.env().poison is True
    with knobs.with_env(poison=False):
        assert knobs.env().poison is False
    with pytest.raises(ValueError, match="igemm_tile='9x9'"):
        knobs.Options(igemm_tile="9x9")
    assert knobs.Options().describe() == "" and knobs.Options(index64=True).describe() == "index64=True"


def test_explain_lines_fit_120_columns(fresh):
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    text = portconv.plan(x, w, padding=1, backend="aten").explain()
    assert all(len(line) <= 120 for line in text.splitlines()), text
    assert "grad_weight" in text and "aten.convolution_backward" in text
    assert "versions" not in portconv.plan(x, w, padding=1, backend="aten").explain(device=False)


@pytest.mark.parametrize("case", [  # Note [ATen's modules]: the suite's own-kernel rows made single-group
    dict(ishape=(64, 96, 56, 56), wshape=(96, 96, 7, 7), padding=3),
    dict(ishape=(64, 96, 56, 56), wshape=(96, 96, 7, 7), padding=3, fmt="channels_last"),
    dict(ishape=(32, 144, 56, 56), wshape=(144, 144, 3, 3), padding=1),
    dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 54, 3, 3, 3), padding=1, fmt="channels_last"),
    dict(ishape=(32, 1, 56, 56), wshape=(8, 1, 3, 3), padding=1),  # one input channel: groups 1, not depthwise
    dict(ishape=(8, 54, 16, 56, 56), wshape=(54, 1, 3, 3, 3), padding=1, transposed=True),  # transposed
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_single_group_and_transposed_problems_are_atens_on_every_row(case, dtype):
    """Note [ATen's modules]: where never_own() holds, no OWN_KERNEL_WINS row is consulted, even one that would
    apply to the problem's shape (a table of rows that accept everything), on the GPU and the CPU."""
    from portconv.policy import never_own

    problem = _problem(dtype=dtype, **case)
    assert never_own(problem.params.transposed, problem.params.groups) and not problem.is_depthwise
    everything = tuple(OwnKernelWin(BackendId.CUDA, (aten,), lambda p: True, "all", "none")
                       for aten in ("Cudnn", "CudaDepthwise2d", "CudaDepthwise3d", "CudnnTranspose", "Slow3d"))
    assert _first(problem, wins=everything)[0] == BackendId.ATEN
    cpu = dataclasses.replace(problem, input=dataclasses.replace(problem.input, device_type="cpu"),
                              weight=dataclasses.replace(problem.weight, device_type="cpu"))
    cpu_all = tuple(dataclasses.replace(w, backend=BackendId.OPENCL, replaces=("Mkldnn", "Slow2d", "Slow3d",
                                                                              "SlowTranspose2d", "SlowTranspose3d",
                                                                              "Empty", "Overrideable"))
                    for w in everything)
    assert cpu_policy(cpu, TorchContext(num_threads=2), cpu_all)[0][0][0] == BackendId.ATEN
    assert not never_own(False, 2)
