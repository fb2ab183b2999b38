"""The cudnn backend: cuDNN reached through PyTorch's aten.cudnn_convolution(_transpose) and convolution_backward."""
from __future__ import annotations

import dataclasses

from ..device import Availability, DeviceInfo
from ..errors import Unsupported
from ..tensors import TensorSpec, dense_strides
from . import Backend, BackendId, Choice, Problem

CUDNN_DTYPES = ("float32", "float64", "float16", "bfloat16")
_CUDNN_BACKENDS = ("Cudnn", "CudnnTranspose")


def cudnn_conv_tf32(torch) -> tuple[bool, str]:
    """Whether cuDNN convolutions may use TF32 for float32, and the setting that says so.

    Note [TF32 policy]: torch >= 2.9 keeps a per-operator precision, torch.backends.cudnn.conv.fp32_precision
    ('tf32' by default), that inherits when 'none' from torch.backends.cudnn.fp32_precision and then from
    torch.backends.fp32_precision; 'none' all the way up means IEEE float32 (the legacy setter
    ``torch.backends.cudnn.allow_tf32 = False`` leaves exactly that). The legacy getter raises once the conv and
    RNN flags differ, so it is read only on older torch.
    """
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if conv is None:
        allowed = bool(torch.backends.cudnn.allow_tf32)
        return allowed, f"torch.backends.cudnn.allow_tf32 = {allowed}"
    chain = (("torch.backends.cudnn.conv.fp32_precision", conv),
             ("torch.backends.cudnn.fp32_precision", getattr(torch.backends.cudnn, "fp32_precision", "none")),
             ("torch.backends.fp32_precision", getattr(torch.backends, "fp32_precision", "none")))
    for name, value in chain:
        if value in ("tf32", "ieee"):
            return value == "tf32", f"{name} = '{value}'"
    return False, "every fp32_precision from cudnn.conv up is 'none' (IEEE float32)"


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


class CudnnBackend(Backend):
    id = BackendId.CUDNN
    pip_hint = "pip install torch (a CUDA build: https://pytorch.org/get-started/locally/)"

    def __init__(self):
        self._routes: dict[Problem, _Route] = {}

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
        from . import _cupy

        return _cupy.device_info("torch", spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo) -> Choice:
        import torch

        from ..rules import TorchContext

        ctx = TorchContext.from_torch(problem.input.device)
        choice, route = choose_for(problem, ctx, *cudnn_conv_tf32(torch))
        self._routes[problem] = route
        return choice

    def devices(self) -> list[DeviceInfo]:
        import torch

        if not self.probe():
            return []
        from . import _cupy

        return [_cupy.device_info("torch", i) for i in range(torch.cuda.device_count())]

    # --- execution --------------------------------------------------------------------------------------------
    @staticmethod
    def _prepare(plan, tensors, one_d: bool):
        from .aten import _pad_extra

        p = plan.problem.params
        x, *rest = tensors
        if any(p.padding_extra):
            x = _pad_extra(x, p)
        out = [x, *rest]
        if one_d:  # ATen's view1d_as_2d
            out = [None if t is None else t.contiguous().unsqueeze(2) for t in out]
            p = p.as_2d(with_extra=False)
        return out, p

    def forward(self, plan, input, weight, bias):
        import torch

        st = plan.state.get("cudnn")
        if st is None:
            st = plan.state["cudnn"] = _CallArgs.of(plan)
        (x, w), p = self._prepare(plan, (input, weight), st.one_d) if st.reshape else ((input, weight), None)
        key = (x.stride(), w.stride())
        fmt = st.formats.get(key)
        if fmt is None:
            fmt = st.formats[key] = _torch_format(torch, x, w)
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        c = torch._C
        bench, det = c._get_cudnn_benchmark(), c._get_cudnn_deterministic() or c._get_deterministic_algorithms()
        if st.transposed:
            out = torch.cudnn_convolution_transpose(x, w, st.padding, st.output_padding, st.stride, st.dilation,
                                                    st.groups, bench, det, st.tf32)
        else:
            out = torch.cudnn_convolution(x, w, st.padding, st.stride, st.dilation, st.groups, bench, det, st.tf32)
        if bias is not None:  # as ATen's _convolution does after the cuDNN call
            out.add_(bias.reshape(st.bias_shape))
        return out.squeeze(2) if st.one_d else out

    def backward(self, plan, grad_output, input, weight, output_mask):
        import torch

        pr = plan.problem
        route = self._routes.get(pr)
        if route is None:
            from ..rules import TorchContext

            route = gradient_route(pr, TorchContext.from_torch(pr.input.device))
            self._routes[pr] = route
        one_d = pr.params.rank == 1
        (x, w, go), p = self._prepare(plan, (input, weight, grad_output), one_d)
        if route.grads == "channels_last":
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x, w, go = (t.contiguous(memory_format=fmt) for t in (x, w, go))
        a = p.as_aten()
        gi, gw, gb = torch.ops.aten.convolution_backward.default(
            go, x, w, [go.shape[1]], a["stride"], a["padding"], a["dilation"], a["transposed"], a["output_padding"],
            a["groups"], list(output_mask))
        if one_d:
            gi = None if gi is None else gi.squeeze(2)
            gw = None if gw is None else gw.squeeze(2)
        if gi is not None and any(pr.params.padding_extra):
            gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in input.shape[2:])]
        return gi, gw, gb


@dataclasses.dataclass
class _CallArgs:
    """A plan's cuDNN call arguments, computed on its first call (Plan.state['cudnn'])."""

    one_d: bool
    reshape: bool  # padding='same' extra padding or a 1-d problem: _prepare runs per call
    transposed: bool
    padding: list
    output_padding: list
    stride: list
    dilation: list
    groups: int
    tf32: bool  # the plan's math: decided (and explained) when the plan was made
    bias_shape: tuple
    formats: dict  # (input strides, weight strides) -> the memory format cuDNN gets

    @classmethod
    def of(cls, plan) -> _CallArgs:
        p = plan.problem.params
        one_d = p.rank == 1
        if one_d:
            p = p.as_2d(with_extra=False)
        return cls(one_d, one_d or any(plan.problem.params.padding_extra), p.transposed, list(p.padding),
                   list(p.output_padding), list(p.stride), list(p.dilation), p.groups, plan.math == "tf32",
                   (1, -1) + (1,) * p.rank, {})


def _torch_format(torch, x, w):
    """cudnn_conv_suggest_memory_format on the tensors handed to cuDNN (ATen makes both contiguous in it)."""
    from ..tensors import suggest_memory_format

    if torch.float64 in (x.dtype, w.dtype) or w.dim() not in (4, 5):
        return torch.contiguous_format
    name = "channels_last" if w.dim() == 4 else "channels_last_3d"
    if any(suggest_memory_format(tuple(t.shape), tuple(t.stride())) == name for t in (x, w)):
        return torch.channels_last if w.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format
