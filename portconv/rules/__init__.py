"""The ATen model: PyTorch 2.13's convolution backend selection and memory-format rules as pure functions of data.

Nothing here imports torch at module level; ``TorchContext.from_torch`` is the one function that reads it.
Names follow ATen: ``select_conv_backend`` returns an ``at::native::ConvBackend`` member name, the memory
formats are 'contiguous', 'channels_last' and 'channels_last_3d'.
"""
from __future__ import annotations

from .context import MIOPEN_NHWC_DEFAULT_ARCHS, CpuFacts, TorchContext, check_env, miopen_nhwc_default, torch_flags
from .layout import (
    CHANNELS_LAST,
    CHANNELS_LAST_3D,
    CONTIGUOUS,
    CONV_BACKENDS,
    can_use_32bit_index_math,
    cudnn_conv_suggest_memory_format,
    determine_backend_memory_format,
    miopen_conv_suggest_memory_format,
    miopen_conv_use_channels_last,
    mkldnn_conv_use_channels_last,
    mps_conv_use_channels_last,
    suggest,
    thnn_conv_use_channels_last,
    xpu_conv_use_channels_last,
)
from .precision import conv_tf32
from .select import (
    MIOPEN_DIM_MAX,
    AtenView,
    aten_view,
    is_depthwise,
    is_dilated,
    is_output_padding_big,
    is_padded,
    is_strided,
    mkldnn_takes,
    needs_64bit_indexing_no_split,
    select_conv_backend,
    select_view,
    use_cpu_depthwise3x3_winograd,
    use_cudnn,
    use_cudnn_depthwise,
    use_miopen,
    use_mkldnn,
    use_mps,
    use_nnpack,
    use_xnnpack,
)

__all__ = [
    "AtenView", "CHANNELS_LAST", "CHANNELS_LAST_3D", "CONTIGUOUS", "CONV_BACKENDS", "CpuFacts", "MIOPEN_DIM_MAX",
    "MIOPEN_NHWC_DEFAULT_ARCHS", "RESULT_RULES", "TorchContext", "aten_answer", "aten_view",
    "can_use_32bit_index_math", "check_env", "conv_tf32", "cudnn_conv_suggest_memory_format",
    "determine_backend_memory_format", "is_depthwise", "is_dilated", "is_output_padding_big", "is_padded",
    "is_strided", "miopen_conv_suggest_memory_format", "miopen_conv_use_channels_last", "miopen_nhwc_default",
    "mkldnn_conv_use_channels_last", "mkldnn_takes", "mps_conv_use_channels_last", "needs_64bit_indexing_no_split",
    "result_format", "select_conv_backend", "select_view", "suggest", "thnn_conv_use_channels_last", "torch_flags",
    "use_cpu_depthwise3x3_winograd", "use_cudnn", "use_cudnn_depthwise", "use_miopen", "use_mkldnn", "use_mps",
    "use_nnpack", "use_xnnpack", "xpu_conv_use_channels_last",
]

_TORCH_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta")


def aten_answer(problem, ctx: TorchContext | None = None, *, need_backward: bool = False) -> tuple[str, str]:
    """(ConvBackend name, memory format) ATen's _convolution would use for a portconv Problem.

    The memory format is determine_backend_memory_format on the tensors ATen hands the backend, i.e. after
    'same' padding and the 1-d -> 2-d view, exactly as _convolution computes it. ``ctx`` defaults to
    ``TorchContext.from_torch`` for the problem's device.
    """
    if ctx is None:
        spec = problem.input
        ctx = TorchContext.from_torch(spec.device if spec.kind == "torch" and spec.device_type in _TORCH_DEVICE_TYPES
                                      else "cpu")
    p, w = problem.params, problem.weight
    bias_sizes = ((w.shape[1] * p.groups if p.transposed else w.shape[0]),) if problem.has_bias else None
    v = aten_view(problem.input, w, p, None, bias_sizes, need_backward=need_backward and ctx.grad_enabled)
    backend = select_view(v, ctx)
    return backend, determine_backend_memory_format(v.input, v.weight, backend, ctx)


# Note [own kernels' result layout]
# The own kernel sets read and write any strides, so the layout of their results is a choice: the one PyTorch makes
# for the same call on the same vendor. CUDA/HIP kernels on NVIDIA take cuDNN's rule, on AMD MIOpen's (which follows
# PYTORCH_MIOPEN_SUGGEST_NHWC and the build's default); OpenCL on torch CPU tensors returns what ATen's CPU route
# returns (oneDNN's or the slow kernels' rule); pyopencl arrays, with no PyTorch counterpart, take cuDNN's rule.
RESULT_RULES = ("cudnn", "miopen", "cpu")


def result_format(problem, rule: str, ctx: TorchContext) -> tuple[str, str]:
    """(memory format of every result, why) of an own kernel set's results under ``rule`` (RESULT_RULES)."""
    from .layout import _not_double, _suggest_impl

    x, w = problem.input, problem.weight
    if rule == "cudnn":
        fmt = _suggest_impl(x, w, _not_double(x, w))
        return fmt, f"{fmt}: cuDNN's rule (channels-last when the input or weight is, not float64)"
    if rule == "miopen":
        fmt = _suggest_impl(x, w, _not_double(x, w) and ctx.miopen_nhwc)
        return fmt, (f"{fmt}: MIOpen's rule (NHWC {'on' if ctx.miopen_nhwc else 'off'} by this build's default "
                     "and PYTORCH_MIOPEN_SUGGEST_NHWC)")
    if rule == "cpu":
        backend, fmt = aten_answer(problem, ctx)
        fmt = fmt if problem.params.rank > 1 else CONTIGUOUS
        return fmt, f"{fmt}: what ATen's CPU route ({backend}) returns"
    raise ValueError(f"unknown result-layout rule {rule!r}; known: {', '.join(RESULT_RULES)}")
