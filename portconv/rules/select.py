"""Convolution.cpp's ConvParams predicates and _select_conv_backend (torch 2.13) as pure functions of data."""
from __future__ import annotations

import dataclasses
import functools

from ..device import Availability
from ..errors import ConvError
from ..params import ConvParams
from ..tensors import TensorSpec, is_contiguous
from .context import CpuFacts, TorchContext
from .layout import (
    CONTIGUOUS,
    INT_MAX,
    can_use_32bit_index_math,
    contiguous,
    cudnn_conv_suggest_memory_format,
    pad_high,
    unsqueeze,
)

MIOPEN_DIM_MAX = 5
_yes, _no = Availability.yes, Availability.no


@dataclasses.dataclass(frozen=True)
class AtenView:
    """One call as _select_conv_backend sees it: 'same' padding applied, 1-d expanded to 2-d."""

    input: TensorSpec
    weight: TensorSpec
    params: ConvParams
    bias_sizes: tuple[int, ...] | None = None
    bias_contiguous: bool = True
    need_backward: bool = False
    input_layout: str = "strided"  # 'strided' or 'mkldnn' (x.to_mkldnn())
    weight_layout: str = "strided"

    @property
    def input_is_mkldnn(self) -> bool:
        return self.input_layout == "mkldnn"


def aten_view(input: TensorSpec, weight: TensorSpec, params: ConvParams, bias: TensorSpec | None = None,
              bias_sizes=None, *, need_backward: bool = False, input_layout: str = "strided",
              weight_layout: str = "strided") -> AtenView:
    """Apply what ATen does before selecting: convolution_same's high-side padding, then select_conv_backend's
    1-d -> 2-d view (input made contiguous, both unsqueezed at dim 2) unless the input is mkldnn or on XPU."""
    if any(params.padding_extra):
        input = pad_high(input, params.padding_extra)
        params = dataclasses.replace(params, padding_extra=(0,) * params.rank)
    if weight.dim == 3 and input_layout != "mkldnn" and input.device_type != "xpu":
        input = unsqueeze(contiguous(input), 2)
        weight = unsqueeze(weight, 2)
        params = ConvParams((1,) + params.stride, (0,) + params.padding, (1,) + params.dilation, params.transposed,
                            (0,) + params.output_padding, params.groups)
    if bias is not None:
        bias_sizes = tuple(bias.shape)
    return AtenView(input, weight, params, None if bias_sizes is None else tuple(bias_sizes),
                    bias is None or is_contiguous(bias.shape, bias.strides), need_backward, input_layout, weight_layout)


def _public(fn):
    """Expose a predicate on (input, weight, params, ctx, bias=None, ...) as the caller has them."""
    @functools.wraps(fn)
    def wrapper(input: TensorSpec, weight: TensorSpec, params: ConvParams, ctx: TorchContext, bias=None, **kw):
        return fn(aten_view(input, weight, params, bias, **kw), ctx)
    return wrapper


# --- ConvParams' simple predicates ----------------------------------------------------------------------------

def is_strided(p: ConvParams) -> bool:
    return any(s != 1 for s in p.stride)


def is_dilated(p: ConvParams) -> bool:
    return any(d != 1 for d in p.dilation)


def is_padded(p: ConvParams) -> bool:
    return any(x != 0 for x in p.padding)


def is_output_padding_big(p: ConvParams) -> bool:
    return any(op >= s for op, s in zip(p.output_padding, p.stride))


def _div_trunc(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


def _output_numel_per_sample(v: AtenView) -> int:
    p, i, w = v.params, v.input.shape, v.weight.shape
    if p.transposed:  # conv_input_size
        spatial = [(o - 1) * s - 2 * pad + (k - 1) * d + 1 + op
                   for o, k, pad, op, s, d in zip(i[2:], w[2:], p.padding, p.output_padding, p.stride, p.dilation)]
        channels = w[1] * p.groups
    else:  # conv_output_size (C++ division truncates toward zero)
        spatial = [_div_trunc(x + 2 * pad - (d * (k - 1) + 1), s) + 1
                   for x, k, pad, s, d in zip(i[2:], w[2:], p.padding, p.stride, p.dilation)]
        channels = w[0]
    n = channels
    for s in spatial:
        n *= s
    return n


def _needs_64bit_indexing_no_split(v: AtenView, ctx: TorchContext | None = None) -> bool:
    numel = v.input.numel
    if numel == 0:
        return False
    if numel // v.input.shape[0] > INT_MAX:
        return True
    return _output_numel_per_sample(v) > INT_MAX


def _is_depthwise(v: AtenView, ctx: TorchContext | None = None) -> bool:
    c = v.input.shape[1]
    return (v.input.device_type == "cuda" and not v.params.transposed and v.input.dim in (4, 5)
            and c == v.params.groups and v.params.groups > 1 and v.weight.shape[0] % c == 0)


# --- the backend predicates (each answers with its reason) ----------------------------------------------------

def _use_cudnn(v: AtenView, ctx: TorchContext) -> Availability:
    if ctx.mobile_build or not ctx.has_cudnn:
        return _no("this PyTorch build has no cuDNN")
    if v.input.device_type != "cuda":
        return _no(f"cuDNN only takes CUDA tensors, not {v.input.device_type}")
    if not ctx.cudnn_enabled:
        return _no("torch.backends.cudnn.enabled is False")
    if _needs_64bit_indexing_no_split(v) and not ((ctx.cudnn_version or 0) >= 90300 and ctx.cudnn_v8_api):
        return _no("64-bit indexing that batch splitting cannot avoid needs cuDNN >= 9.3 with the v8 API")
    if "bfloat16" in (v.input.dtype, v.weight.dtype) and not (ctx.sm_major >= 8 and ctx.cudnn_v8_api):
        return _no(f"bfloat16 convolution in cuDNN needs sm_80 or newer and the v8 API (device {ctx.gpu_arch})")
    if is_output_padding_big(v.params):
        return _no("output_padding >= stride")
    return _yes("cuDNN takes it")


def _check_cudnn_depthwise_workload_with_filter(v: AtenView, stride: int) -> bool:
    """The cuDNN >= 8.2 fp16 depthwise heuristic (Convolution.cpp)."""
    i, w = v.input.shape, v.weight.shape
    if i[2] == 1 and stride == 1:
        return True
    if w[2] != w[3]:
        return False
    f = w[3]
    if f not in (1, 3, 5) or i[3] < 7:
        return False
    width, ch, bs = i[3], i[1], i[0]
    if stride == 1:
        return True
    if stride != 2:
        return False
    if bs == 1:
        return (f == 1 and width <= 28) or f in (3, 5)
    if f == 1 and bs <= 16 and ch >= 128 and width <= 7:
        return True
    return f in (3, 5) and (ch >= 512 or (ch >= 256 and width >= 28))


def _use_cudnn_depthwise(v: AtenView, ctx: TorchContext) -> Availability:
    if not ctx.cudnn_enabled or not ctx.has_cudnn or v.input.device_type != "cuda":
        return _no("cuDNN is disabled, absent, or the tensors are not on CUDA")
    ver = ctx.cudnn_version if ctx.cudnn_version is not None else -1
    channels_last = cudnn_conv_suggest_memory_format(v.input, v.weight, ctx) != CONTIGUOUS
    if not (can_use_32bit_index_math(v.input) and can_use_32bit_index_math(v.weight)):
        if channels_last and (ver < 0 or 91000 < ver < 91500):
            return _no(f"64-bit channels-last depthwise is broken in cuDNN {ver} (9.10 < v < 9.15)")
        if not (ver >= 90300 and ctx.cudnn_v8_api):
            return _no("64-bit depthwise needs cuDNN >= 9.3 with the v8 API")
        return _yes("64-bit depthwise: the native kernel cannot, cuDNN can")
    if channels_last:
        return _yes("channels-last depthwise always goes to cuDNN")
    if ctx.sm_major < 7:
        return _no(f"cuDNN depthwise needs sm_70 or newer (device {ctx.gpu_arch or 'unknown'})")
    p, i = v.params, v.input.shape
    if not (_use_cudnn(v, ctx) and v.input.dtype == "float16" and v.weight.dtype == "float16" and _is_depthwise(v)
            and v.input.dim == 4 and not is_dilated(p) and (p.stride[0] == p.stride[1] or i[2] == 1)
            and i[1] >= 32):
        return _no("cuDNN depthwise is used for contiguous float16, 2-d, undilated, square-stride, >= 32 channels")
    if ctx.cudnn_depthwise_kernel == "native":
        return _no("torch.backends.cudnn.depthwise_kernel is 'native'")
    if ctx.cudnn_depthwise_kernel == "cudnn":
        return _yes("torch.backends.cudnn.depthwise_kernel is 'cudnn'")
    if _check_cudnn_depthwise_workload_with_filter(v, p.stride[1]):
        return _yes("the fp16 depthwise workload heuristic prefers cuDNN")
    return _no("the fp16 depthwise workload heuristic prefers the native kernel")


def _use_miopen(v: AtenView, ctx: TorchContext) -> Availability:
    if not ctx.is_hip:
        return _no("this PyTorch build has no MIOpen (not a ROCm build)")
    if v.input.dtype not in ("float32", "float16", "bfloat16"):
        return _no(f"MIOpen takes float32, float16 and bfloat16, not {v.input.dtype}")
    if not ctx.cudnn_enabled:
        return _no("torch.backends.cudnn.enabled is False (it gates MIOpen on ROCm)")
    if v.input.device_type != "cuda":
        return _no(f"MIOpen only takes GPU tensors, not {v.input.device_type}")
    if v.input.dim > MIOPEN_DIM_MAX:
        return _no(f"MIOpen takes at most {MIOPEN_DIM_MAX - 2} spatial dims")
    if v.params.groups > 1 and is_dilated(v.params):
        return _no("MIOpen does not support dilation with groups > 1")
    if not ctx.miopen_64bit_indexing and _needs_64bit_indexing_no_split(v):
        return _no("64-bit indexing that batch splitting cannot avoid")
    return _yes("MIOpen takes it")


def _use_mkldnn(v: AtenView, ctx: TorchContext) -> Availability:
    return mkldnn_takes(v.params, v.input.shape, v.weight.shape, v.input.dtype, v.input.device_type, ctx.cpu_facts,
                        v.input_is_mkldnn)


def mkldnn_takes(p: ConvParams, i, w, dtype: str, device_type: str, facts: CpuFacts,
                 input_is_mkldnn: bool = False) -> Availability:
    """ConvParams::use_mkldnn (the oneDNN rule) on the 1-d -> 2-d view's params and shapes: the one copy of it
    (portconv.validate asks it too, to pick the error texts PyTorch's CPU kernels would raise)."""
    if not facts.available:
        return _no("this PyTorch build has no oneDNN (mkldnn)")
    if not facts.enabled:
        return _no("torch.backends.mkldnn.enabled is False")
    if p.transposed and is_output_padding_big(p):
        return _no("transposed with output_padding >= stride")
    cpu = device_type == "cpu"
    if cpu and ((dtype == "bfloat16" and facts.bf16) or (dtype == "float16" and facts.fp16)):
        return _yes(f"oneDNN {dtype} on a CPU that supports it")
    if input_is_mkldnn:
        return _yes("the input is an mkldnn tensor")
    if not cpu or dtype != "float32":
        return _no(f"oneDNN takes CPU float32 (and bf16/fp16 where the CPU has them), not {dtype} on {device_type}")
    if not (is_strided(p) or is_dilated(p) or i[0] >= 16 or w[-1] != 1 or w[-2] != 1 or facts.threads > 1):
        return _no("1x1 single-threaded: THNN is faster")
    if not (p.groups > 1 or (w[-1] > 3 and w[-2] > 3) or i[0] > 1 or i[0] * i[1] * i[2] * i[3] > 20480):
        return _no("small single-sample problem: the native kernel is faster")
    return _yes("oneDNN takes CPU float32")


def _use_nnpack(v: AtenView, ctx: TorchContext) -> Availability:
    p, i, w = v.params, v.input.shape, v.weight.shape
    if not (ctx.nnpack_available and ctx.nnpack_enabled):
        return _no("NNPACK is unavailable or disabled")
    if not (v.input.device_type == "cpu" and v.input.dtype == "float32" and not is_dilated(p)
            and not p.transposed and v.input.dim == 4 and v.weight.dim == 4):
        return _no("NNPACK takes undilated, untransposed 2-d CPU float32")
    if not (w[2] < 17 and w[3] < 17 and p.padding[0] < w[2] and p.padding[1] < w[3]):
        return _no("NNPACK needs kernels up to 16x16 and padding < kernel")
    if not (ctx.mobile_build or i[0] >= 16):
        return _no("batch < 16")
    return _yes("NNPACK spatial convolution")


def _use_xnnpack(v: AtenView, ctx: TorchContext) -> Availability:
    """xnnpack::use_convolution2d (mobile builds only), for depthwise-style C == groups problems."""
    p, i, w = v.params, v.input.shape, v.weight.shape
    if not (ctx.mobile_build and ctx.xnnpack_available) or p.transposed:
        return _no("XNNPACK convolution exists in mobile builds only, untransposed")
    bias_ok = v.bias_sizes is None or (len(v.bias_sizes) == 1 and w[0] == v.bias_sizes[0])
    ok = (i[1] == p.groups and v.weight.dim == 4 and w[2] > 0 and w[3] > 0 and v.weight.device_type == "cpu"
          and v.weight.dtype == "float32" and bias_ok and w[1] > 0 and w[0] > 0 and w[0] % p.groups == 0
          and v.input.dim == 4 and v.input.device_type == "cpu" and v.input.dtype == "float32"
          and i[1] > 0 and i[2] > 0 and i[3] > 0 and not v.need_backward)
    return _yes("XNNPACK 2-d convolution") if ok else _no("not an XNNPACK-shaped problem")


def _use_cpu_depthwise3x3_winograd(v: AtenView, ctx: TorchContext) -> Availability:
    p, i, w = v.params, v.input, v.weight
    ok = (ctx.cpu_winograd and i.dim == 4 and i.shape[1] == p.groups and w.dim == 4 and w.shape[0] % i.shape[1] == 0
          and w.shape[1:] == (1, 3, 3) and i.device_type == "cpu" and i.dtype == "float32"
          and is_contiguous(i.shape, i.strides) and w.device_type == "cpu" and w.dtype == "float32"
          and is_contiguous(w.shape, w.strides) and v.bias_contiguous and not is_strided(p) and not is_dilated(p)
          and not p.transposed)
    return _yes("ARM 3x3 depthwise Winograd") if ok else _no("not a contiguous float32 3x3 depthwise on ARM")


def _use_mps(v: AtenView, ctx: TorchContext) -> Availability:
    if not ctx.mps_built or v.input.device_type != "mps":
        return _no("not an MPS tensor in an MPS build")
    long_ok = ctx.mps_conv3d_long_index and v.input.dim == 5 and not v.params.transposed
    if _needs_64bit_indexing_no_split(v) and not long_ok:
        return _no("MPS convolution cannot index 64-bit problems")
    return _yes("MPS convolution")


needs_64bit_indexing_no_split = _public(_needs_64bit_indexing_no_split)
is_depthwise = _public(_is_depthwise)
use_cudnn = _public(_use_cudnn)
use_cudnn_depthwise = _public(_use_cudnn_depthwise)
use_miopen = _public(_use_miopen)
use_mkldnn = _public(_use_mkldnn)
use_nnpack = _public(_use_nnpack)
use_xnnpack = _public(_use_xnnpack)
use_cpu_depthwise3x3_winograd = _public(_use_cpu_depthwise3x3_winograd)
use_mps = _public(_use_mps)


# --- _select_conv_backend -------------------------------------------------------------------------------------

def _unsupported() -> ConvError:
    return ConvError("unsupported ConvNd parameters")


def select_view(v: AtenView, ctx: TorchContext) -> str:
    """_select_conv_backend on an AtenView: the ConvBackend member name."""
    i, p = v.input, v.params
    if i.shape[0] == 0 or i.shape[1] == 0:
        return "MkldnnEmpty" if v.input_is_mkldnn else "Empty"
    if i.numel == 0:
        raise ConvError("Only zero batch or zero channel inputs are supported, but got input shape: "
                        f"[{', '.join(str(s) for s in i.shape)}]")
    if _is_depthwise(v):
        if _use_cudnn_depthwise(v, ctx):
            return "Cudnn"
        if _use_miopen(v, ctx):
            return "MiopenDepthwise"
        return "CudaDepthwise2d" if i.dim == 4 else "CudaDepthwise3d"
    for pred, plain, transposed in ((_use_cudnn, "Cudnn", "CudnnTranspose"),
                                    (_use_miopen, "Miopen", "MiopenTranspose"),
                                    (_use_mkldnn, "Mkldnn", "MkldnnTranspose")):
        if pred(v, ctx):
            return transposed if p.transposed else plain
    if not v.need_backward and _use_xnnpack(v, ctx):
        return "Xnnpack2d"
    if not v.need_backward and _use_cpu_depthwise3x3_winograd(v, ctx):
        return "Winograd3x3Depthwise"
    cpu = i.device_type == "cpu"
    if not p.transposed and i.dim == 5 and cpu and not is_dilated(p):
        return "Slow3d"  # the fast path for grouped conv3d
    if cpu or i.device_type == "cuda":
        if p.transposed:
            if i.dim in (4, 5):
                return "SlowTranspose2d" if i.dim == 4 else "SlowTranspose3d"
            raise _unsupported()
        if i.dim == 4:
            if is_dilated(p):
                return "SlowDilated2d"
            return "NnpackSpatial" if _use_nnpack(v, ctx) else "Slow2d"
        if i.dim == 5:
            return "SlowDilated3d" if (i.device_type == "cuda" or is_dilated(p)) else "Slow3d"
        raise _unsupported()
    if _use_mps(v, ctx):
        return "MpsTranspose" if p.transposed else "Mps"
    return "Overrideable"  # a device whose convolution lives out of tree (XPU, meta, privateuse1, ...)


def select_conv_backend(input: TensorSpec, weight: TensorSpec, bias: TensorSpec | None, params: ConvParams,
                        ctx: TorchContext, bias_sizes=None, *, need_backward: bool = False,
                        input_layout: str = "strided", weight_layout: str = "strided") -> str:
    """torch._C._select_conv_backend: the at::native::ConvBackend name ATen would run this call with.

    ``need_backward`` is GradMode on and any of input/weight/bias requiring grad (it only matters for the
    inference-only XNNPACK and Winograd paths); ``input_layout='mkldnn'`` describes an ``x.to_mkldnn()`` input.
    Raises ConvError where ATen raises (zero-size spatial input, no backend for the rank).
    """
    v = aten_view(input, weight, params, bias, bias_sizes, need_backward=need_backward and ctx.grad_enabled,
                  input_layout=input_layout, weight_layout=weight_layout)
    return select_view(v, ctx)
