"""ConvUtils.h's memory-format rules and determine_backend_memory_format, as pure functions of TensorSpecs."""
from __future__ import annotations

from ..tensors import TensorSpec, dense_strides, is_contiguous, suggest_memory_format
from .context import TorchContext

CONTIGUOUS, CHANNELS_LAST, CHANNELS_LAST_3D = "contiguous", "channels_last", "channels_last_3d"
INT_MAX = 2**31 - 1  # std::numeric_limits<int>::max()

# at::native::ConvBackend in declaration order: a member's index is its integer value (ConvUtils.h, torch 2.13).
# torch._C._ConvBackend exposes all but MkldnnTranspose (9), which Python prints as '???', and spells
# MpsTranspose 'MpsTranspose,' (a typo in torch/csrc/Module.cpp's py::enum_).
CONV_BACKENDS = ("CudaDepthwise2d", "CudaDepthwise3d", "Cudnn", "CudnnTranspose", "Empty", "Miopen",
                 "MiopenDepthwise", "MiopenTranspose", "Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "NnpackSpatial",
                 "Overrideable", "Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d",
                 "SlowTranspose3d", "Winograd3x3Depthwise", "Xnnpack2d", "Mps", "MpsTranspose")


# --- tensor geometry as c10 computes it ---------------------------------------------------------------------

def suggest(t: TensorSpec, exact_match: bool = False, layout: str = "strided") -> str:
    """Tensor::suggest_memory_format(channels_last_strides_exact_match); non-strided layouts are contiguous."""
    if layout != "strided":
        return CONTIGUOUS
    fmt = suggest_memory_format(t.shape, t.strides)
    if exact_match and fmt != CONTIGUOUS and tuple(t.strides) != dense_strides(t.shape, fmt):
        return CONTIGUOUS
    return fmt


def contiguous(t: TensorSpec) -> TensorSpec:
    """Tensor::contiguous(): the tensor itself when already contiguous, else a dense contiguous copy."""
    if is_contiguous(t.shape, t.strides):
        return t
    return TensorSpec(tuple(t.shape), dense_strides(t.shape), t.dtype, t.device_type, t.device_index, t.kind)


def unsqueeze(t: TensorSpec, dim: int) -> TensorSpec:
    """Tensor::unsqueeze(dim): the new size-1 dim gets stride sizes[dim] * strides[dim] (1 past the end)."""
    new_stride = 1 if dim >= t.dim else t.shape[dim] * t.strides[dim]
    return TensorSpec(t.shape[:dim] + (1,) + t.shape[dim:], t.strides[:dim] + (new_stride,) + t.strides[dim:],
                      t.dtype, t.device_type, t.device_index, t.kind)


def pad_high(t: TensorSpec, extra: tuple[int, ...]) -> TensorSpec:
    """constant_pad_nd adding ``extra`` on the high side of each spatial dim: a new tensor dense in
    the input's suggested memory format (what convolution_same feeds the convolution for asymmetric 'same')."""
    shape = tuple(t.shape[:2]) + tuple(s + e for s, e in zip(t.shape[2:], extra))
    return TensorSpec(shape, dense_strides(shape, suggest(t)), t.dtype, t.device_type, t.device_index, t.kind)


def can_use_32bit_index_math(t: TensorSpec, max_elem: int = INT_MAX) -> bool:
    """ATen canUse32BitIndexMath: fewer than max_elem elements and the last element's offset below it."""
    n = t.numel
    if n >= max_elem:
        return False
    if n == 0:
        return max_elem > 0
    offset, linear = 0, n - 1
    for size, stride in zip(reversed(t.shape), reversed(t.strides)):
        offset += (linear % size) * stride
        linear //= size
    return offset < max_elem


# --- ConvUtils.h (torch 2.13) ---------------------------------------------------------------------------------

def _suggest_impl(input: TensorSpec, weight: TensorSpec, enabled: bool) -> str:
    """_conv_suggest_memory_format_impl: 4-D weight -> channels_last, 5-D -> channels_last_3d, if either asks."""
    if not enabled:
        return CONTIGUOUS
    fmts = (suggest(input), suggest(weight))
    if weight.dim == 4 and CHANNELS_LAST in fmts:
        return CHANNELS_LAST
    if weight.dim == 5 and CHANNELS_LAST_3D in fmts:
        return CHANNELS_LAST_3D
    return CONTIGUOUS


def _not_double(input: TensorSpec, weight: TensorSpec) -> bool:
    return input.dtype != "float64" and weight.dtype != "float64"


def cudnn_conv_suggest_memory_format(input: TensorSpec, weight: TensorSpec, ctx: TorchContext) -> str:
    """cuDNN's layout: channels-last when either tensor is (no float64, no cuDNN-version test in 2.13)."""
    return _suggest_impl(input, weight, ctx.has_cudnn and _not_double(input, weight))


def miopen_conv_suggest_memory_format(input: TensorSpec, weight: TensorSpec, ctx: TorchContext) -> str:
    """MIOpen's layout: as cuDNN's, but only when PYTORCH_MIOPEN_SUGGEST_NHWC (or the build's default) says so."""
    return _suggest_impl(input, weight, ctx.is_hip and _not_double(input, weight) and ctx.miopen_nhwc)


def miopen_conv_use_channels_last(input: TensorSpec, weight: TensorSpec, ctx: TorchContext) -> bool:
    return miopen_conv_suggest_memory_format(input, weight, ctx) != CONTIGUOUS


def _use_channels_last_impl(input: TensorSpec, weight: TensorSpec, enabled: bool, exact_match: bool,
                            layouts: tuple[str, str] = ("strided", "strided")) -> bool:
    if not enabled:
        return False
    return any(suggest(t, exact_match, lay) in (CHANNELS_LAST, CHANNELS_LAST_3D) for t, lay in zip((input, weight),
                                                                                                  layouts))


def mkldnn_conv_use_channels_last(input: TensorSpec, weight: TensorSpec, input_layout: str = "strided",
                                  weight_layout: str = "strided") -> bool:
    """oneDNN: channels-last (2-D or 3-D) when either tensor is, except float64 and mkldnn-layout tensors."""
    enabled = _not_double(input, weight) and input_layout != "mkldnn" and weight_layout != "mkldnn"
    return _use_channels_last_impl(input, weight, enabled, False, (input_layout, weight_layout))


def thnn_conv_use_channels_last(input: TensorSpec, weight: TensorSpec) -> bool:
    """The slow (THNN) CPU kernels: 2-D channels-last only, on the CPU only."""
    return input.device_type == "cpu" and CHANNELS_LAST in (suggest(input), suggest(weight))


def xpu_conv_use_channels_last(input: TensorSpec, weight: TensorSpec) -> bool:
    return _use_channels_last_impl(input, weight, input.device_type == "xpu" and weight.device_type == "xpu", False)


def mps_conv_use_channels_last(input: TensorSpec, weight: TensorSpec) -> bool:
    """MPS reads packed NHWC buffers, so it needs exactly channels-last strides (pytorch issue 180984)."""
    return _use_channels_last_impl(input, weight, input.device_type == "mps" and weight.device_type == "mps", True)


def determine_backend_memory_format(input: TensorSpec, weight: TensorSpec, backend: str, ctx: TorchContext,
                                    input_layout: str = "strided", weight_layout: str = "strided") -> str:
    """Convolution.cpp determine_backend_memory_format: the layout the chosen backend computes in."""
    if backend not in CONV_BACKENDS:
        raise ValueError(f"unknown ConvBackend {backend!r}; known: {', '.join(CONV_BACKENDS)}")
    if ctx.mobile_build:
        return CONTIGUOUS
    cl = CHANNELS_LAST_3D if weight.dim == 5 else CHANNELS_LAST
    if backend in ("Cudnn", "CudnnTranspose"):
        return cudnn_conv_suggest_memory_format(input, weight, ctx) if ctx.has_cudnn else CONTIGUOUS
    if backend in ("Miopen", "MiopenDepthwise", "MiopenTranspose"):
        return miopen_conv_suggest_memory_format(input, weight, ctx) if ctx.is_hip else CONTIGUOUS
    if backend in ("Mkldnn", "MkldnnTranspose"):
        return cl if mkldnn_conv_use_channels_last(input, weight, input_layout, weight_layout) else CONTIGUOUS
    if backend in ("Slow2d", "SlowDilated2d", "SlowTranspose2d"):
        return CHANNELS_LAST if thnn_conv_use_channels_last(input, weight) else CONTIGUOUS
    if backend == "Overrideable":
        return cl if xpu_conv_use_channels_last(input, weight) else CONTIGUOUS
    if backend in ("Mps", "MpsTranspose"):
        return cl if mps_conv_use_channels_last(input, weight) else CONTIGUOUS
    return CONTIGUOUS
