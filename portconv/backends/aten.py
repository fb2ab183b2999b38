"""The aten backend: PyTorch's own convolution on the tensors' device (ATen picks its kernel; we report which)."""
from __future__ import annotations

from .. import device as _device
from ..device import Availability
from ..errors import ConvError, Unsupported
from ..rules import TorchContext, aten_answer
from . import Backend, BackendId, Choice


def _pad_extra(x, params):
    """Apply padding='same''s extra high-side padding to the input, as torch.nn.functional does."""
    import torch.nn.functional as F

    pads = []
    for e in reversed(params.padding_extra):
        pads += [0, e]
    return F.pad(x, pads)


def _call_args(plan) -> tuple:
    """(pad_extra?, torch.convolution, stride, padding, dilation, transposed, output_padding, groups,
    aten.convolution_backward.default), memoized on the plan: the hot path makes one positional call to the C binding
    (torch.ops.aten.convolution costs ~10 us more; the backward overload with keywords ~4 us more)."""
    import torch

    p = plan.problem.params
    args = (any(p.padding_extra), torch.convolution, list(p.stride), list(p.padding), list(p.dilation), p.transposed,
            list(p.output_padding), p.groups, torch.ops.aten.convolution_backward.default)
    plan.state["aten_args"] = args
    return args


class AtenBackend(Backend):
    id = BackendId.ATEN

    def probe(self) -> Availability:
        return Availability.yes("PyTorch is always present")

    def device_for(self, problem):
        spec = problem.input
        if spec.kind != "torch":
            raise Unsupported(f"the aten backend takes torch tensors, not {spec.kind} arrays")
        if spec.device_type == "cpu":
            return _device.host_cpu()
        if spec.device_type == "cuda":
            return _device.from_torch_cuda(spec.device_index or 0)
        raise Unsupported(f"tensors on {spec.device} are not handled by portconv's aten backend")

    def choose(self, problem, device):
        ctx = TorchContext.from_torch(problem.input.device)
        try:
            name, fmt = aten_answer(problem, ctx)
        except ConvError as e:
            raise Unsupported(f"ATen refuses this convolution: {e}") from None
        tf32 = (device.vendor == "nvidia" and problem.dtype == "float32" and ctx.allow_tf32
                and name in ("Cudnn", "CudnnTranspose"))
        return Choice(f"aten:{name}", fmt, f"PyTorch's native convolution (reference path); ATen runs it as {name}",
                      math="tf32" if tf32 else "ieee")

    def forward(self, plan, input, weight, bias):
        args = plan.state.get("aten_args")
        if args is None:
            args = _call_args(plan)
        if args[0]:
            input = _pad_extra(input, plan.problem.params)
        return args[1](input, weight, bias, *args[2:8])

    def backward(self, plan, grad_output, input, weight, output_mask):
        args = plan.state.get("aten_args")
        if args is None:
            args = _call_args(plan)
        p = plan.problem.params
        x = _pad_extra(input, p) if args[0] else input
        bias_sizes = [weight.shape[1] * p.groups if p.transposed else weight.shape[0]]
        gi, gw, gb = args[8](grad_output, x, weight, bias_sizes, *args[2:8], list(output_mask))
        if gi is not None and args[0]:
            gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in input.shape[2:])]
        # ATen computes some gradients together (oneDNN returns grad_weight with grad_bias): honour the mask anyway
        return tuple(t if m else None for t, m in zip((gi, gw, gb), output_mask))
