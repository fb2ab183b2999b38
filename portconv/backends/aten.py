"""The aten backend: PyTorch's own convolution on the tensors' device (ATen picks its kernel; we report which)."""
from __future__ import annotations

from .. import device as _device
from ..device import Availability
from ..errors import ConvError, Unsupported
from ..rules import TorchContext, aten_answer
from . import Backend, BackendId, Choice
from .torchlib import library_kernels, pad_extra, unpad


class AtenRunner:
    """torch.convolution and aten.convolution_backward with positional arguments: the quickest Python bindings
    (torch.ops.aten.convolution costs ~10 us more a call; the backward overload with keywords ~4 us more).

    ATen records forward() as ConvolutionBackward0 (and the pad of padding='same''s extra side as its own node),
    whose backward is aten.convolution_backward with these arguments: backward() itself (aten_autograd)."""

    aten_autograd = True
    native = None

    def __init__(self, problem):
        import torch

        p, self.input_shape = problem.params, problem.input.shape
        self.params, self.padded = p, any(p.padding_extra)
        self.args = (list(p.stride), list(p.padding), list(p.dilation), p.transposed, list(p.output_padding),
                     p.groups)
        self.conv, self.conv_backward = torch.convolution, torch.ops.aten.convolution_backward.default
        self.bias_sizes = [problem.bias_size]
        # forward() as one call, for Note [module memo]: (torch.convolution, its arguments after the tensors)
        self.direct = None if self.padded else (self.conv, self.args)

    def forward(self, input, weight, bias):
        if self.padded:
            input = pad_extra(input, self.params)
        return self.conv(input, weight, bias, *self.args)

    def backward(self, grad_output, input, weight, output_mask):
        x = pad_extra(input, self.params) if self.padded else input
        gi, gw, gb = self.conv_backward(grad_output, x, weight, self.bias_sizes, *self.args, list(output_mask))
        if gi is not None and self.padded:
            gi = unpad(gi, input.shape)
        # ATen computes some gradients together (oneDNN returns grad_weight with grad_bias): honour the mask anyway
        return (gi if output_mask[0] else None, gw if output_mask[1] else None, gb if output_mask[2] else None)


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
            return _device.torch_cuda(spec.device_index or 0)
        raise Unsupported(f"tensors on {spec.device} are not handled by portconv's aten backend")

    def choose(self, problem, device, options):
        ctx = TorchContext.from_torch(problem.input.device)
        try:
            name, fmt = aten_answer(problem, ctx)
        except ConvError as e:
            raise Unsupported(f"ATen refuses this convolution: {e}") from None
        tf32 = (device.vendor == "nvidia" and problem.dtype == "float32" and ctx.allow_tf32
                and name in ("Cudnn", "CudnnTranspose"))
        return Choice(f"aten:{name}", fmt, f"PyTorch's own convolution: ATen runs it as {name}",
                      math="tf32" if tf32 else "ieee")

    def prepare(self, problem, device, choice, options):
        ctx = TorchContext.from_torch(problem.input.device)
        bwd = aten_answer(problem, ctx, need_backward=True)[0]
        kernels = library_kernels(f"torch.convolution (ATen: {choice.algorithm.removeprefix('aten:')})",
                                  f"aten.convolution_backward (ATen: {bwd})", problem.has_bias)
        return kernels, AtenRunner(problem)
