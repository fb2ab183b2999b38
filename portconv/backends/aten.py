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
    """(pad_extra?, torch.convolution, (stride, padding, dilation, transposed, output_padding, groups),
    aten.convolution_backward.default, bias_sizes), memoized on the plan: the hot path makes one positional call to
    the C binding (torch.ops.aten.convolution costs ~10 us more; the backward overload with keywords ~4 us more)."""
    import torch

    p, w = plan.problem.params, plan.problem.weight.shape
    conv = (list(p.stride), list(p.padding), list(p.dilation), p.transposed, list(p.output_padding), p.groups)
    args = (any(p.padding_extra), torch.convolution, conv, torch.ops.aten.convolution_backward.default,
            [w[1] * p.groups if p.transposed else w[0]])
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
        args = plan.state.get("aten_args") or _call_args(plan)
        if args[0]:
            input = _pad_extra(input, plan.problem.params)
        return args[1](input, weight, bias, *args[2])

    def backward(self, plan, grad_output, input, weight, output_mask):
        args = plan.state.get("aten_args") or _call_args(plan)
        x = _pad_extra(input, plan.problem.params) if args[0] else input
        gi, gw, gb = args[3](grad_output, x, weight, args[4], *args[2], list(output_mask))
        if gi is not None and args[0]:
            gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in input.shape[2:])]
        # ATen computes some gradients together (oneDNN returns grad_weight with grad_bias): honour the mask anyway
        return (gi if output_mask[0] else None, gw if output_mask[1] else None, gb if output_mask[2] else None)
