"""The cudnn backend: cuDNN reached through PyTorch's aten.cudnn_convolution(_transpose) and convolution_backward."""
from __future__ import annotations

import dataclasses

from ..device import Availability, DeviceInfo, torch_cuda
from ..errors import Unsupported
from ..problem import Problem
from ..tensors import TensorSpec, dense_strides
from . import Backend, BackendId, Choice
from .torchlib import library_kernels, pad_extra, unpad

CUDNN_DTYPES = ("float32", "float64", "float16", "bfloat16")
_CUDNN_BACKENDS = ("Cudnn", "CudnnTranspose")


@dataclasses.dataclass(frozen=True)
class _Route:
    """How the gradients reach cuDNN: ATen routes the call as given ('direct') or once made channels-last."""

    grads: str  # 'direct' or 'channels_last'
    why: str


def _channels_last(spec: TensorSpec) -> TensorSpec:
    fmt = "channels_last" if spec.dim == 4 else "channels_last_3d"
    return dataclasses.replace(spec, strides=dense_strides(spec.shape, fmt))


def _as_2d(spec: TensorSpec) -> TensorSpec:
    """ATen's view1d_as_2d: a 1-d problem's tensor made contiguous and unsqueezed at dim 2."""
    shape = spec.shape[:2] + (1,) + spec.shape[2:]
    return dataclasses.replace(spec, shape=shape, strides=dense_strides(shape))


def gradient_route(problem: Problem, ctx) -> _Route:
    """Where aten.convolution_backward sends this problem's gradients, by the ATen model (portconv.rules).

    Note [cuDNN gradients]: the autograd formula of aten.cudnn_convolution is itself convolution_backward
    (FunctionsManual.cpp, _cudnn_convolution_backward), which selects its backend again: depthwise problems
    go to PyTorch's native CudaDepthwise kernels unless cuDNN's depthwise rule takes them. ATen sends every
    channels-last depthwise problem to cuDNN, so such gradients are computed on channels-last copies; float64
    is never channels-last for cuDNN, so a float64 depthwise problem has no cuDNN gradient and is rejected.
    """
    from ..rules import select_conv_backend

    p = problem.params
    bias = ((problem.weight.shape[1] * p.groups if p.transposed else problem.weight.shape[0]),)
    got = select_conv_backend(problem.input, problem.weight, None, p, ctx, bias, need_backward=True)
    if got == "Empty":
        return _Route("direct", "an empty batch or channel dimension: the front end returns empty results")
    if got in _CUDNN_BACKENDS:
        return _Route("direct", f"ATen routes the gradients to cuDNN ({got})")
    if problem.is_depthwise and problem.dtype != "float64":
        x, w = problem.input, problem.weight
        if p.rank == 1:
            x, w = _as_2d(x), _as_2d(w)
            p = p.as_2d()
        got_cl = select_conv_backend(_channels_last(x), _channels_last(w), None, p, ctx, bias, need_backward=True)
        if got_cl in _CUDNN_BACKENDS:
            return _Route("channels_last", f"ATen would route these depthwise gradients to {got}, so they run on "
                                           f"channels-last copies, which ATen sends to cuDNN ({got_cl})")
    raise Unsupported(f"ATen routes this problem's gradients to {got}, not cuDNN, and no layout change sends them "
                      "to cuDNN (float64 is never channels-last for cuDNN)")


def half_accumulating(problem: Problem) -> bool:
    """Note [cuDNN half accumulation]: cuDNN's grouped 3-D weight-gradient engines (one channel per group on
    the weight's second axis: depthwise and the like) accumulate float16/bfloat16 in the half type. Measured
    with cuDNN 9.19 on an H200: grad_weight errors of 2-9 half ulps (up to 5x the float32-accumulation bound)
    in every such conformance case, channels-last or not, convolution or transposed; 2-D was within bounds."""
    p = problem.params
    return (problem.dtype in ("float16", "bfloat16") and p.rank == 3 and p.groups > 1
            and problem.weight.shape[1] == 1)


def choose_for(problem: Problem, ctx, tf32: bool, tf32_setting: str) -> tuple[Choice, _Route]:
    """The cudnn backend's rule, pure: ATen's use_cudnn and memory format, the gradients' route, the math."""
    from ..rules import aten_view, cudnn_conv_suggest_memory_format, use_cudnn

    if problem.dtype not in CUDNN_DTYPES:
        raise Unsupported(f"cuDNN convolutions take {', '.join(CUDNN_DTYPES)}, not {problem.dtype}")
    p = problem.params
    ok = use_cudnn(problem.input, problem.weight, p, ctx)
    if not ok:
        raise Unsupported(f"ATen's use_cudnn says no: {ok.reason}")
    route = gradient_route(problem, ctx)
    v = aten_view(problem.input, problem.weight, p)
    fmt = cudnn_conv_suggest_memory_format(v.input, v.weight, ctx) if p.rank > 1 else "contiguous"
    op = "cudnn_convolution_transpose" if p.transposed else "cudnn_convolution"
    if problem.dtype == "float32":
        math, how = ("tf32" if tf32 else "ieee"), f"TF32 {'allowed' if tf32 else 'off'} for float32 ({tf32_setting})"
    elif half_accumulating(problem):
        math = "fp16-accumulate" if problem.dtype == "float16" else "bf16-accumulate"
        how = f"{math}: cuDNN's grouped 3-D weight-gradient engines accumulate {problem.dtype} in {problem.dtype}"
    else:
        math, how = "ieee", f"{problem.dtype} with float32 accumulation" if problem.dtype != "float64" else "float64"
    return Choice(op, fmt, f"cuDNN {ctx.cudnn_version} via aten.{op}; {route.why}; {how}", math), route


class CudnnRunner:
    """aten.cudnn_convolution(_transpose) forward, and aten.convolution_backward on the gradients' route.

    aten_autograd (Note [ATen-recorded plans]) where the route is 'direct' and the call needs no view (1-d) or extra
    padding: ATen records the forward as CudnnConvolutionBackward0 (and the bias's add), whose backward is
    aten.convolution_backward of the same operands, which ATen sends to cuDNN: backward() itself."""

    native = None

    def __init__(self, problem: Problem, route: _Route, tf32: bool):
        import torch

        self.torch, self.route = torch, route
        p = problem.params
        self.params, self.input_shape = p, problem.input.shape
        self.one_d = p.rank == 1
        q = p.as_2d(with_extra=False) if self.one_d else p
        self.view_params = q
        self.reshape = self.one_d or any(p.padding_extra)  # padding='same' extra padding or the 1-d view per call
        self.transposed, self.groups, self.tf32 = q.transposed, q.groups, tf32
        self.padding, self.output_padding = list(q.padding), list(q.output_padding)
        self.stride, self.dilation = list(q.stride), list(q.dilation)
        self.bias_shape = (1, -1) + (1,) * q.rank
        self.formats: dict[tuple, object] = {}  # (input strides, weight strides) -> cuDNN's layout for them
        self.aten_autograd = route.grads == "direct" and not self.reshape

    def _prepare(self, tensors):
        x, *rest = tensors
        if any(self.params.padding_extra):
            x = pad_extra(x, self.params)
        out = [x, *rest]
        if self.one_d:  # ATen's view1d_as_2d
            out = [None if t is None else t.contiguous().unsqueeze(2) for t in out]
        return out

    def forward(self, input, weight, bias):
        torch = self.torch
        x, w = self._prepare((input, weight)) if self.reshape else (input, weight)
        key = (x.stride(), w.stride())
        fmt = self.formats.get(key)
        if fmt is None:
            fmt = self.formats[key] = _torch_format(torch, x, w)
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        c = torch._C
        bench, det = c._get_cudnn_benchmark(), c._get_cudnn_deterministic() or c._get_deterministic_algorithms()
        if self.transposed:
            out = torch.cudnn_convolution_transpose(x, w, self.padding, self.output_padding, self.stride,
                                                    self.dilation, self.groups, bench, det, self.tf32)
        else:
            out = torch.cudnn_convolution(x, w, self.padding, self.stride, self.dilation, self.groups, bench, det,
                                          self.tf32)
        if bias is not None:  # as ATen's _convolution does after the cuDNN call
            out.add_(bias.reshape(self.bias_shape))
        return out.squeeze(2) if self.one_d else out

    def backward(self, grad_output, input, weight, output_mask):
        torch = self.torch
        x, w, go = self._prepare((input, weight, grad_output))
        if self.route.grads == "channels_last":
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x, w, go = (t.contiguous(memory_format=fmt) for t in (x, w, go))
        a = self.view_params.as_aten()
        gi, gw, gb = torch.ops.aten.convolution_backward.default(
            go, x, w, [go.shape[1]], a["stride"], a["padding"], a["dilation"], a["transposed"], a["output_padding"],
            a["groups"], list(output_mask))
        if self.one_d:
            gi = None if gi is None else gi.squeeze(2)
            gw = None if gw is None else gw.squeeze(2)
        if gi is not None and any(self.params.padding_extra):
            gi = unpad(gi, input.shape)
        return gi, gw, gb


class CudnnBackend(Backend):
    id = BackendId.CUDNN
    pip_hint = "pip install torch (a CUDA build: https://pytorch.org/get-started/locally/)"

    def probe(self) -> Availability:
        import torch

        if getattr(torch.version, "hip", None):
            return Availability.no(f"PyTorch {torch.__version__} is a ROCm build (MIOpen, not cuDNN)")
        if not torch.version.cuda:
            return Availability.no(f"PyTorch {torch.__version__} is a CPU-only build: no CUDA, no cuDNN")
        if not torch.backends.cudnn.is_available():
            return Availability.no(f"PyTorch {torch.__version__} has no usable cuDNN library")
        if not torch.cuda.is_available():
            return Availability.no("PyTorch sees no CUDA device")
        if not torch.backends.cudnn.enabled:
            return Availability.no("torch.backends.cudnn.enabled is False")
        return Availability.yes(f"cuDNN {torch.backends.cudnn.version()} through PyTorch {torch.__version__}")

    def device_for(self, problem: Problem) -> DeviceInfo:
        spec = problem.input
        if spec.kind != "torch" or spec.device_type != "cuda":
            raise Unsupported(f"cuDNN is reached through PyTorch: it takes torch CUDA tensors, not {spec.kind} data "
                              f"on {spec.device}")
        return torch_cuda(spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo, options) -> Choice:
        import torch

        from ..rules import TorchContext, conv_tf32

        return choose_for(problem, TorchContext.from_torch(problem.input.device), *conv_tf32(torch))[0]

    def prepare(self, problem: Problem, device: DeviceInfo, choice: Choice, options):
        import torch

        from ..rules import TorchContext, conv_tf32

        _, route = choose_for(problem, TorchContext.from_torch(problem.input.device), *conv_tf32(torch))
        op = "cudnn_convolution_transpose" if problem.params.transposed else "cudnn_convolution"
        grads = ("aten.convolution_backward on channels-last copies (cuDNN)" if route.grads == "channels_last"
                 else "aten.convolution_backward (cuDNN)")
        return library_kernels(f"aten.{op}", grads, problem.has_bias), CudnnRunner(problem, route,
                                                                                  choice.math == "tf32")

    def devices(self) -> list[DeviceInfo]:
        import torch

        if not self.probe():
            return []
        return [torch_cuda(i) for i in range(torch.cuda.device_count())]


def _torch_format(torch, x, w):
    """cudnn_conv_suggest_memory_format on the tensors handed to cuDNN (ATen makes both contiguous in it)."""
    from ..tensors import suggest_memory_format

    if torch.float64 in (x.dtype, w.dtype) or w.dim() not in (4, 5):
        return torch.contiguous_format
    name = "channels_last" if w.dim() == 4 else "channels_last_3d"
    if any(suggest_memory_format(tuple(t.shape), tuple(t.stride())) == name for t in (x, w)):
        return torch.channels_last if w.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format
