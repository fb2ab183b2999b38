"""Table tests of the ATen model where torch on this machine cannot answer: CUDA/cuDNN, ROCm/MIOpen, MPS, XPU,
mobile and ARM builds, and the contexts' own rules. Expected values are read off Convolution.cpp / ConvUtils.h."""
from __future__ import annotations

import subprocess
import sys

import pytest

from portconv import rules
from portconv.errors import ConvError
from portconv.params import ConvParams
from portconv.problem import Problem
from portconv.rules import TorchContext, miopen_nhwc_default
from portconv.tensors import TensorSpec, dense_strides

# Device descriptions as a torch 2.13 build on each would report them (versions from the vendors' release notes).
H100 = TorchContext(device_type="cuda", has_cudnn=True, cudnn_version=91002, gpu_arch="sm_90", num_threads=8)
A100 = H100.replace(gpu_arch="sm_80")
T4 = H100.replace(gpu_arch="sm_75")
P100 = H100.replace(gpu_arch="sm_60")


def rocm(arch: str, miopen: int = 30500, env: str | None = None, rule: str = "rocm-fork-mi") -> TorchContext:
    """A ROCm build on an AMD GPU: MIOpen 3.5.0 ships with ROCm 7.0."""
    return TorchContext(device_type="cuda", is_hip=True, miopen_version=miopen, gpu_arch=arch,
                        miopen_suggest_nhwc=env, miopen_nhwc_default=miopen_nhwc_default(rule, miopen, arch))


GFX90A, GFX942, GFX1100 = rocm("gfx90a"), rocm("gfx942"), rocm("gfx1100")
MPS = TorchContext(device_type="mps", mps_built=True)
XPU = TorchContext(device_type="xpu")
MOBILE = TorchContext(mobile_build=True, xnnpack_available=True, mkldnn_available=False, nnpack_available=False)
ARM = TorchContext(cpu_winograd=True, mkldnn_enabled=False)
X86 = TorchContext(num_threads=4)


def spec(shape, fmt="contiguous", dtype="float32", device="cuda", strides=None) -> TensorSpec:
    shape = tuple(shape)
    return TensorSpec(shape, tuple(strides) if strides else dense_strides(shape, fmt), dtype, device)


def answer(ctx, x, w, *, fmt="contiguous", wfmt="contiguous", dtype="float32", device=None, wstrides=None,
           bias=False, need_backward=False, **kw):
    device = device or ctx.device_type
    rank = len(x) - 2
    params = ConvParams.make(rank, weight_shape=w, **kw)
    problem = Problem(params, spec(x, fmt, dtype, device), spec(w, wfmt, dtype, device, wstrides), bias)
    return rules.aten_answer(problem, ctx, need_backward=need_backward)


CL, CL3, C = "channels_last", "channels_last_3d", "contiguous"
X, W = (2, 8, 16, 16), (4, 8, 3, 3)
DW = dict(groups=32, padding=1)

CUDA_TABLE = [
    ("fp32", H100, X, W, {}, "Cudnn", C),
    ("fp32 channels-last input", H100, X, W, dict(fmt=CL), "Cudnn", CL),
    ("fp32 channels-last weight only", H100, X, W, dict(wfmt=CL), "Cudnn", CL),
    ("fp64 channels-last stays NCHW", H100, X, W, dict(fmt=CL, dtype="float64"), "Cudnn", C),
    ("old cuDNN no longer gates NHWC (2.13)", H100.replace(cudnn_version=7600), X, W, dict(fmt=CL), "Cudnn", CL),
    ("transposed", H100, X, (8, 4, 3, 3), dict(transposed=True, stride=2, output_padding=1), "CudnnTranspose", C),
    ("output_padding >= stride", H100, X, (8, 4, 3, 3), dict(transposed=True, dilation=2, output_padding=1),
     "SlowTranspose2d", C),
    ("cuDNN disabled", H100.replace(cudnn_enabled=False), X, W, dict(fmt=CL), "Slow2d", C),
    ("cuDNN disabled, dilated", H100.replace(cudnn_enabled=False), X, W, dict(dilation=2), "SlowDilated2d", C),
    ("cuDNN disabled, 3-d", H100.replace(cudnn_enabled=False), (2, 4, 6, 6, 6), (4, 4, 3, 3, 3), {},
     "SlowDilated3d", C),
    ("cuDNN disabled, 3-d transposed", H100.replace(cudnn_enabled=False), (2, 4, 6, 6, 6), (4, 4, 3, 3, 3),
     dict(transposed=True), "SlowTranspose3d", C),
    ("3-d channels_last_3d", H100, (2, 4, 6, 6, 6), (4, 4, 3, 3, 3), dict(fmt=CL3), "Cudnn", CL3),
    ("deterministic no longer rejects dilation", H100.replace(deterministic=True), X, W, dict(dilation=2), "Cudnn", C),
    ("1-d", H100, (2, 4, 10), (6, 4, 3), {}, "Cudnn", C),
    ("1-d with a k-major weight is NHWC in its 2-d view", H100, (2, 4, 10), (6, 4, 3), dict(wstrides=(12, 1, 4)),
     "Cudnn", CL),
    ("empty batch", H100, (0, 8, 16, 16), W, {}, "Empty", C),
    ("bf16 on sm_80", A100, X, W, dict(dtype="bfloat16"), "Cudnn", C),
    ("bf16 on sm_75", T4, X, W, dict(dtype="bfloat16"), "Slow2d", C),
    ("bf16 without the v8 API", H100.replace(cudnn_v8_api=False), X, W, dict(dtype="bfloat16"), "Slow2d", C),
    ("fp16 depthwise, heuristic says cuDNN", H100, (1, 32, 56, 56), (32, 1, 3, 3), dict(dtype="float16", **DW),
     "Cudnn", C),
    ("... unless depthwise_kernel='native'", H100.replace(cudnn_depthwise_kernel="native"), (1, 32, 56, 56),
     (32, 1, 3, 3), dict(dtype="float16", **DW), "CudaDepthwise2d", C),
    ("fp16 depthwise stride 2, heuristic says native", H100, (2, 64, 56, 56), (64, 1, 3, 3),
     dict(dtype="float16", stride=2, groups=64, padding=1), "CudaDepthwise2d", C),
    ("... unless depthwise_kernel='cudnn'", H100.replace(cudnn_depthwise_kernel="cudnn"), (2, 64, 56, 56),
     (64, 1, 3, 3), dict(dtype="float16", stride=2, groups=64, padding=1), "Cudnn", C),
    ("fp16 depthwise stride 2, batch 1, 3x3: cuDNN", H100, (1, 64, 56, 56), (64, 1, 3, 3),
     dict(dtype="float16", stride=2, groups=64, padding=1), "Cudnn", C),
    ("fp16 depthwise stride 2, batch 1, 1x1 on 56 wide: native", H100, (1, 64, 56, 56), (64, 1, 1, 1),
     dict(dtype="float16", stride=2, groups=64), "CudaDepthwise2d", C),
    ("fp16 depthwise stride 2, batch 8, 256 channels, 28 wide: cuDNN", H100, (8, 256, 28, 28), (256, 1, 5, 5),
     dict(dtype="float16", stride=2, groups=256, padding=2), "Cudnn", C),
    ("fp16 depthwise 1x1 stride 2, batch 16, 128 channels, 7 wide: cuDNN", H100, (16, 128, 7, 7), (128, 1, 1, 1),
     dict(dtype="float16", stride=2, groups=128), "Cudnn", C),
    ("fp16 depthwise, non-square kernel: native", H100, (1, 32, 56, 56), (32, 1, 3, 5),
     dict(dtype="float16", groups=32, padding=1), "CudaDepthwise2d", C),
    ("fp16 depthwise 1-d: cuDNN", H100, (4, 32, 100), (32, 1, 7), dict(dtype="float16", groups=32), "Cudnn", C),
    ("fp16 depthwise, unequal strides: native", H100.replace(cudnn_depthwise_kernel="cudnn"), (1, 32, 56, 56),
     (32, 1, 3, 3), dict(dtype="float16", groups=32, stride=(1, 2)), "CudaDepthwise2d", C),
    ("fp16 depthwise, 16 channels", H100.replace(cudnn_depthwise_kernel="cudnn"), (1, 16, 56, 56), (16, 1, 3, 3),
     dict(dtype="float16", groups=16, padding=1), "CudaDepthwise2d", C),
    ("fp32 depthwise", H100, (1, 32, 56, 56), (32, 1, 3, 3), DW, "CudaDepthwise2d", C),
    ("depthwise on sm_60", P100, (1, 32, 56, 56), (32, 1, 3, 3), dict(dtype="float16", **DW), "CudaDepthwise2d", C),
    ("channels-last depthwise always cuDNN", H100, X, (8, 1, 3, 3), dict(fmt=CL, groups=8), "Cudnn", CL),
    ("depthwise multiplier 2", H100, (2, 4, 8, 8), (8, 1, 3, 3), dict(groups=4), "CudaDepthwise2d", C),
    ("depthwise 3-d", H100, (2, 4, 6, 6, 6), (8, 1, 3, 3, 3), dict(groups=4), "CudaDepthwise3d", C),
    ("grouped, not depthwise", H100, (2, 4, 8, 8), (8, 2, 3, 3), dict(groups=2), "Cudnn", C),
    ("64-bit, cuDNN 9.10", H100, (1, 1, 65536, 65536), (1, 1, 3, 3), dict(dtype="float16", padding=1), "Cudnn", C),
    ("64-bit, cuDNN 9.1", H100.replace(cudnn_version=90100), (1, 1, 65536, 65536), (1, 1, 3, 3),
     dict(dtype="float16", padding=1), "Slow2d", C),
    ("64-bit, v8 API off", H100.replace(cudnn_v8_api=False), (1, 1, 65536, 65536), (1, 1, 3, 3),
     dict(dtype="float16", padding=1), "Slow2d", C),
    ("large but batch-splittable, cuDNN 9.1", H100.replace(cudnn_version=90100), (4, 64, 4096, 2048), (64, 64, 3, 3),
     dict(dtype="float16", padding=1), "Cudnn", C),
    ("64-bit depthwise, cuDNN 9.1", H100.replace(cudnn_version=90100), (1, 64, 8192, 8192), (64, 1, 3, 3),
     dict(dtype="float16", groups=64, padding=1), "CudaDepthwise2d", C),
    ("64-bit depthwise, cuDNN 9.10", H100, (1, 64, 8192, 8192), (64, 1, 3, 3),
     dict(dtype="float16", groups=64, padding=1), "Cudnn", C),
    ("64-bit NHWC depthwise in cuDNN's broken 9.11-9.14", H100.replace(cudnn_version=91200), (1, 64, 8192, 8192),
     (64, 1, 3, 3), dict(fmt=CL, dtype="float16", groups=64, padding=1), "CudaDepthwise2d", C),
    ("... 9.14 is still broken", H100.replace(cudnn_version=91400), (1, 64, 8192, 8192), (64, 1, 3, 3),
     dict(fmt=CL, dtype="float16", groups=64, padding=1), "CudaDepthwise2d", C),
    ("... 9.10.0 is not", H100.replace(cudnn_version=91000), (1, 64, 8192, 8192), (64, 1, 3, 3),
     dict(fmt=CL, dtype="float16", groups=64, padding=1), "Cudnn", CL),
    ("64-bit NHWC depthwise, cuDNN 9.15", H100.replace(cudnn_version=91500), (1, 64, 8192, 8192), (64, 1, 3, 3),
     dict(fmt=CL, dtype="float16", groups=64, padding=1), "Cudnn", CL),
]

ROCM_TABLE = [
    ("fp32", GFX942, X, W, {}, "Miopen", C),
    ("NHWC by default on gfx942 with MIOpen 3.5", GFX942, X, W, dict(fmt=CL), "Miopen", CL),
    ("NHWC by default on gfx90a", GFX90A, X, W, dict(fmt=CL), "Miopen", CL),
    ("not by default on gfx1100", GFX1100, X, W, dict(fmt=CL), "Miopen", C),
    ("not with MIOpen 3.4", rocm("gfx942", 30400), X, W, dict(fmt=CL), "Miopen", C),
    ("PYTORCH_MIOPEN_SUGGEST_NHWC=1 on gfx1100", rocm("gfx1100", env="1"), X, W, dict(fmt=CL), "Miopen", CL),
    ("PYTORCH_MIOPEN_SUGGEST_NHWC=1 with MIOpen 3.4", rocm("gfx90a", 30400, "1"), X, W, dict(fmt=CL), "Miopen", CL),
    ("PYTORCH_MIOPEN_SUGGEST_NHWC=0 on gfx942", rocm("gfx942", env="0"), X, W, dict(fmt=CL), "Miopen", C),
    ("an invalid value is ignored", rocm("gfx942", env="true"), X, W, dict(fmt=CL), "Miopen", CL),
    ("upstream 2.13 has no default", rocm("gfx942", rule="upstream"), X, W, dict(fmt=CL), "Miopen", C),
    ("the all-arch fork rule on gfx1100", rocm("gfx1100", rule="rocm-fork"), X, W, dict(fmt=CL), "Miopen", CL),
    ("fp16", GFX942, X, W, dict(dtype="float16"), "Miopen", C),
    ("bf16 with bias", GFX942, X, W, dict(dtype="bfloat16", bias=True), "Miopen", C),
    ("float64 is not MIOpen's", rocm("gfx942", env="1"), X, W, dict(dtype="float64", fmt=CL), "Slow2d", C),
    ("groups > 1 and dilated", GFX942, (2, 4, 8, 8), (4, 2, 3, 3), dict(groups=2, dilation=2), "SlowDilated2d", C),
    ("groups > 1", GFX942, (2, 4, 8, 8), (4, 2, 3, 3), dict(groups=2), "Miopen", C),
    ("dilated", GFX942, X, W, dict(dilation=2), "Miopen", C),
    ("depthwise", GFX942, (2, 8, 8, 8), (8, 1, 3, 3), dict(groups=8), "MiopenDepthwise", C),
    ("depthwise NHWC", GFX942, (2, 8, 8, 8), (8, 1, 3, 3), dict(groups=8, fmt=CL), "MiopenDepthwise", CL),
    ("depthwise dilated", GFX942, (2, 8, 8, 8), (8, 1, 3, 3), dict(groups=8, dilation=2), "CudaDepthwise2d", C),
    ("transposed", GFX942, X, (8, 4, 3, 3), dict(transposed=True), "MiopenTranspose", C),
    ("transposed NHWC", GFX942, X, (8, 4, 3, 3), dict(transposed=True, fmt=CL), "MiopenTranspose", CL),
    ("3-d NHWC", GFX90A, (2, 4, 6, 6, 6), (4, 4, 3, 3, 3), dict(fmt=CL3), "Miopen", CL3),
    ("1-d", GFX942, (2, 4, 10), (6, 4, 3), {}, "Miopen", C),
    ("cudnn.enabled=False gates MIOpen", GFX942.replace(cudnn_enabled=False), X, W, {}, "Slow2d", C),
    ("64-bit (2.13: MIOpen indexes 64-bit)", GFX942, (1, 1, 65536, 65536), (1, 1, 3, 3), dict(padding=1),
     "Miopen", C),
    ("64-bit, older rule", GFX942.replace(miopen_64bit_indexing=False), (1, 1, 65536, 65536), (1, 1, 3, 3),
     dict(padding=1), "Slow2d", C),
    ("empty channels", GFX942, (2, 0, 8, 8), (4, 0, 3, 3), {}, "Empty", C),
]

OTHER_TABLE = [
    ("MPS", MPS, X, W, {}, "Mps", C),
    ("MPS channels-last", MPS, X, W, dict(fmt=CL), "Mps", CL),
    ("MPS transposed", MPS, X, (8, 4, 3, 3), dict(transposed=True), "MpsTranspose", C),
    ("MPS depthwise", MPS, X, (8, 1, 3, 3), dict(groups=8), "Mps", C),
    ("MPS 1-d", MPS, (2, 4, 10), (6, 4, 3), {}, "Mps", C),
    ("MPS 64-bit", MPS, (1, 1, 65536, 65536), (1, 1, 3, 3), {}, "Overrideable", C),
    ("MPS 64-bit 3-d, long-index build", MPS.replace(mps_conv3d_long_index=True), (1, 1, 2048, 2048, 1024),
     (1, 1, 1, 1, 1), {}, "Mps", C),
    ("MPS 64-bit 3-d", MPS, (1, 1, 2048, 2048, 1024), (1, 1, 1, 1, 1), {}, "Overrideable", C),
    ("MPS tensors without an MPS build", MPS.replace(mps_built=False), X, W, {}, "Overrideable", C),
    ("XPU", XPU, X, W, {}, "Overrideable", C),
    ("XPU channels-last", XPU, X, W, dict(fmt=CL), "Overrideable", CL),
    ("XPU channels_last_3d", XPU, (2, 4, 6, 6, 6), (4, 4, 3, 3, 3), dict(fmt=CL3), "Overrideable", CL3),
    ("XPU float64 keeps NHWC", XPU, X, W, dict(fmt=CL, dtype="float64"), "Overrideable", CL),
    ("XPU 1-d is not viewed as 2-d", XPU, (2, 4, 10), (6, 4, 3), dict(fmt=CL), "Overrideable", C),
    ("meta", TorchContext(device_type="meta"), X, W, dict(fmt=CL), "Overrideable", C),
    ("mobile XNNPACK depthwise", MOBILE, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, fmt=CL), "Xnnpack2d", C),
    ("mobile, needs backward", MOBILE, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, need_backward=True),
     "Slow2d", C),
    ("mobile, not C == groups", MOBILE, (1, 8, 16, 16), (8, 8, 3, 3), {}, "Slow2d", C),
    ("ARM 3x3 depthwise Winograd", ARM, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, padding=1),
     "Winograd3x3Depthwise", C),
    ("ARM Winograd is inference only", ARM, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, need_backward=True),
     "Slow2d", C),
    ("ARM Winograd needs stride 1", ARM, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, stride=2), "Slow2d", C),
    ("ARM Winograd needs a contiguous input", ARM, (1, 8, 16, 16), (8, 1, 3, 3), dict(groups=8, fmt=CL),
     "Slow2d", CL),
    ("ARM Winograd is 3x3 only", ARM, (1, 8, 16, 16), (8, 1, 5, 5), dict(groups=8), "Slow2d", C),
    ("oneDNN comes before Winograd", ARM.replace(mkldnn_enabled=True), (1, 8, 16, 16), (8, 1, 3, 3),
     dict(groups=8), "Mkldnn", C),
    ("CPU bf16 where oneDNN has it", X86.replace(mkldnn_bf16=True), X, W, dict(dtype="bfloat16", fmt=CL), "Mkldnn",
     CL),
    ("CPU bf16 transposed", X86.replace(mkldnn_bf16=True), X, (8, 4, 3, 3), dict(dtype="bfloat16", transposed=True),
     "MkldnnTranspose", C),
    ("CPU fp16 where oneDNN has it", X86.replace(mkldnn_fp16=True), X, W, dict(dtype="float16"), "Mkldnn", C),
    ("CPU bf16 without", X86, X, W, dict(dtype="bfloat16", fmt=CL), "Slow2d", CL),
    ("CPU build without oneDNN, batch 16", X86.replace(mkldnn_available=False), (16, 8, 16, 16), W, {},
     "NnpackSpatial", C),
    ("CPU build without oneDNN or NNPACK", X86.replace(mkldnn_available=False, nnpack_available=False),
     (16, 8, 16, 16), W, {}, "Slow2d", C),
]


def _rows(table):
    return [pytest.param(*row[1:], id=row[0]) for row in table]


@pytest.mark.parametrize("ctx,x,w,kw,backend,fmt", _rows(CUDA_TABLE + ROCM_TABLE + OTHER_TABLE))
def test_table(ctx, x, w, kw, backend, fmt):
    assert answer(ctx, x, w, **kw) == (backend, fmt)


def test_six_dims_have_no_gpu_backend():
    with pytest.raises(ConvError, match="unsupported ConvNd parameters"):
        answer(GFX942, (1, 2, 4, 4, 4, 4), (2, 2, 1, 1, 1, 1))


@pytest.mark.parametrize("env,nhwc", [(None, True), ("1", True), ("0", False), ("yes", True), ("", True)])
def test_miopen_suggest_memory_format_reads_the_variable(env, nhwc):
    ctx = rocm("gfx942", env=env)
    x, w = spec(X, CL), spec(W)
    assert rules.miopen_conv_suggest_memory_format(x, w, ctx) == (CL if nhwc else C)
    assert rules.miopen_conv_use_channels_last(x, w, ctx) is nhwc
    x64, w64 = spec(X, CL, "float64"), spec(W, dtype="float64")
    assert rules.miopen_conv_suggest_memory_format(x64, w64, ctx) == C


@pytest.mark.parametrize("rule,version,arch,default", [
    ("upstream", 30500, "gfx942", False), ("rocm-fork", 30500, "gfx1100", True), ("rocm-fork", 30400, "gfx942", False),
    ("rocm-fork-mi", 30500, "gfx90a", True), ("rocm-fork-mi", 30500, "gfx942:sramecc+:xnack-", True),
    ("rocm-fork-mi", 30500, "gfx950", True), ("rocm-fork-mi", 30500, "gfx1100", False),
    ("rocm-fork-mi", None, "gfx942", False)])
def test_miopen_nhwc_default(rule, version, arch, default):
    assert miopen_nhwc_default(rule, version, arch) is default


def test_memory_format_rules_per_vendor():
    sliced = spec((2, 4, 8, 8), strides=(512, 1, 64, 8), device="cpu")  # channel slice of an NHWC tensor
    w = spec(W[:1] + (4, 3, 3), device="cpu")
    assert rules.suggest(sliced) == CL and rules.suggest(sliced, exact_match=True) == C
    assert rules.mkldnn_conv_use_channels_last(sliced, w) is True
    assert rules.mkldnn_conv_use_channels_last(sliced, w, input_layout="mkldnn") is False
    assert rules.thnn_conv_use_channels_last(sliced, w) is True
    assert rules.thnn_conv_use_channels_last(spec((2, 4, 8, 8), CL), w) is False  # CPU only
    mps = [spec(s.shape, strides=s.strides, device="mps") for s in (sliced, w)]
    assert rules.mps_conv_use_channels_last(*mps) is False
    assert rules.mps_conv_use_channels_last(spec((2, 4, 8, 8), CL, device="mps"), mps[1]) is True
    xpu = [spec(s.shape, strides=s.strides, device="xpu") for s in (sliced, w)]
    assert rules.xpu_conv_use_channels_last(*xpu) is True
    assert rules.xpu_conv_use_channels_last(xpu[0], w) is False  # both must be on XPU
    assert rules.cudnn_conv_suggest_memory_format(spec(X, CL), spec(W), TorchContext()) == C  # no cuDNN in build
    with pytest.raises(ValueError, match="unknown ConvBackend"):
        rules.determine_backend_memory_format(spec(X), spec(W), "Cudnn8", H100)


def test_predicates_say_why():
    x, w, p = spec(X), spec(W), ConvParams.make(2)
    assert rules.use_cudnn(x, w, p, H100) and "cuDNN" in rules.use_cudnn(x, w, p, H100).reason
    assert "enabled is False" in rules.use_cudnn(x, w, p, H100.replace(cudnn_enabled=False)).reason
    assert "sm_80" in rules.use_cudnn(spec(X, dtype="bfloat16"), spec(W, dtype="bfloat16"), p, T4).reason
    x64, w64 = spec(X, dtype="float64"), spec(W, dtype="float64")
    assert not rules.use_miopen(x64, w64, p, GFX942) and "float64" in rules.use_miopen(x64, w64, p, GFX942).reason
    grouped = ConvParams.make(2, groups=2, dilation=2)
    why = rules.use_miopen(spec((2, 4, 8, 8)), spec((4, 2, 3, 3)), grouped, GFX942)
    assert not why and "groups > 1" in why.reason
    cpu_x, cpu_w = spec(X, device="cpu"), spec(W, device="cpu")
    assert "mkldnn.enabled is False" in rules.use_mkldnn(cpu_x, cpu_w, p, X86.replace(mkldnn_enabled=False)).reason
    assert rules.use_mkldnn(cpu_x, cpu_w, p, X86)


@pytest.mark.parametrize("x,w,kw,expected", [
    ((1, 1, 65536, 65536), (1, 1, 3, 3), dict(padding=1), True),  # 2^32 elements per sample
    ((4, 64, 4096, 2048), (64, 64, 3, 3), dict(padding=1), False),  # 2^31 in all, 2^29 per sample
    ((1, 1, 46341, 46341), (1, 1, 1, 1), {}, True),  # just above INT_MAX per sample
    ((1, 1, 46340, 46340), (1, 1, 1, 1), {}, False),  # just below
    ((1, 1, 32768, 32768), (1, 2, 2, 2), dict(transposed=True, stride=2), True),  # the output is 64-bit
    ((0, 1, 65536, 65536), (1, 1, 3, 3), {}, False),  # empty
])
def test_needs_64bit_indexing_no_split(x, w, kw, expected):
    params = ConvParams.make(len(x) - 2, **kw)
    assert rules.needs_64bit_indexing_no_split(spec(x), spec(w), params, H100) is expected


def test_can_use_32bit_index_math():
    assert rules.can_use_32bit_index_math(spec((2, 3, 4, 4)))
    assert not rules.can_use_32bit_index_math(spec((1, 1, 46341, 46341)))
    assert not rules.can_use_32bit_index_math(spec((1, 1, 2, 2), strides=(0, 0, 2**30, 2**30)))  # offset too big
    assert rules.can_use_32bit_index_math(spec((8, 8, 8, 8), strides=(0, 0, 0, 0)))


def test_context_validation_and_helpers():
    with pytest.raises(ValueError, match="depthwise_kernel"):
        TorchContext(cudnn_depthwise_kernel="fast")
    with pytest.raises(ValueError, match="not both"):
        TorchContext(has_cudnn=True, is_hip=True)
    with pytest.raises(ValueError, match="unknown MIOpen NHWC rule"):
        miopen_nhwc_default("rocm", 30500, "gfx942")
    assert [rules.check_env(v) for v in ("1", "0", None, "true")] == [True, False, None, None]
    assert (H100.sm_major, A100.sm_major, TorchContext(gpu_arch="sm_100").sm_major, GFX942.sm_major) == (9, 8, 10, 0)
    assert len(rules.CONV_BACKENDS) == 23 and rules.CONV_BACKENDS.index("MkldnnTranspose") == 9


def test_every_conv_backend_is_reachable():
    reached = {row[5] for row in CUDA_TABLE + ROCM_TABLE + OTHER_TABLE}
    reached |= {"MkldnnEmpty", "Mkldnn", "Slow3d"}  # mkldnn-layout inputs and CPU 3-d: the CPU oracle runs them
    assert answer(X86, (0, 8, 4, 4), (4, 8, 3, 3), device="cpu")[0] == "Empty"
    x = spec((0, 8, 4, 4), device="cpu")
    assert rules.select_conv_backend(x, spec(W, device="cpu"), None, ConvParams.make(2), X86,
                                     input_layout="mkldnn") == "MkldnnEmpty"
    assert answer(X86, (2, 4, 6, 6, 6), (4, 4, 3, 3, 3), device="cpu", dtype="float64")[0] == "Slow3d"
    assert reached == set(rules.CONV_BACKENDS)


def test_import_reads_no_torch():
    code = "import sys, portconv.rules; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_from_torch_reads_the_flags():
    import torch

    with torch.backends.mkldnn.flags(enabled=False), torch.backends.nnpack.flags(enabled=False):
        ctx = TorchContext.from_torch("cpu")
    assert (ctx.mkldnn_enabled, ctx.nnpack_enabled) == (False, False)
    ctx = TorchContext.from_torch("cpu")
    assert ctx.mkldnn_enabled == torch.backends.mkldnn.enabled and ctx.num_threads == torch.get_num_threads()
    assert ctx.is_hip == bool(torch.version.hip) and ctx.device_type == "cpu"


def test_miopen_version_is_read_as_atens():
    from types import SimpleNamespace as NS

    from portconv.rules.context import _miopen_version

    compiled = NS(_C=NS(_cudnn=NS(getCompileVersion=lambda: (3, 5, 0))))
    runtime = NS(_C=NS(), backends=NS(cudnn=NS(version=lambda: 3_004_001)))  # ROCm's Python-side encoding
    assert (_miopen_version(compiled), _miopen_version(runtime)) == (30500, 30401)


def test_own_kernels_result_format_follows_each_vendors_rule():
    """Note [own kernels' result layout]: cuDNN's rule on NVIDIA, MIOpen's (NHWC default and env) on AMD, ATen's CPU
    route on the CPU; float64 is never channels-last for cuDNN or MIOpen."""
    from portconv.problem import Problem

    def prob(fmt, dtype="float32", device="cuda"):
        x = TensorSpec((2, 8, 9, 9), dense_strides((2, 8, 9, 9), fmt), dtype, device, 0)
        w = TensorSpec((8, 8, 3, 3), dense_strides((8, 8, 3, 3)), dtype, device, 0)
        return Problem(ConvParams.make(2, padding=1, weight_shape=w.shape), x, w, False)

    assert rules.result_format(prob(CL), "cudnn", H100)[0] == CL
    assert rules.result_format(prob(C), "cudnn", H100)[0] == C
    assert rules.result_format(prob(CL, "float64"), "cudnn", H100)[0] == C
    off, on = GFX942.replace(miopen_nhwc_default=False), GFX942.replace(miopen_nhwc_default=True)
    assert rules.result_format(prob(CL), "miopen", off)[0] == C  # a forced hip on ROCm follows MIOpen, not cuDNN
    assert rules.result_format(prob(CL), "miopen", on)[0] == CL
    assert rules.result_format(prob(CL), "miopen", on.replace(miopen_suggest_nhwc="0"))[0] == C
    assert rules.result_format(prob(CL), "miopen", off.replace(miopen_suggest_nhwc="1"))[0] == CL
    cpu = prob(CL, device="cpu")
    fmt, why = rules.result_format(cpu, "cpu", X86)
    assert fmt == rules.aten_answer(cpu, X86)[1] and "ATen's CPU route" in why
    with pytest.raises(ValueError, match="unknown result-layout rule"):
        rules.result_format(cpu, "nvidia", X86)
