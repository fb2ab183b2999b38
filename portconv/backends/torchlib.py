"""What the backends that call PyTorch share (aten, cudnn, miopen): padding='same', the 1-d view, layouts."""
from __future__ import annotations

from ..backends.program import KernelPlan

GRADIENTS = ("grad_input", "grad_weight", "grad_bias")


def pad_extra(x, params):
    """padding='same''s extra high-side padding applied to the input, as torch.nn.functional does."""
    import torch.nn.functional as F

    pads = []
    for e in reversed(params.padding_extra):
        pads += [0, e]
    return F.pad(x, pads)


def unpad(gi, input_shape):
    """grad_input of a padded input cut back to the caller's input."""
    return gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in input_shape[2:])]


def torch_format(torch, fmt: str):
    """The torch.memory_format of a format name."""
    return {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d}.get(
        fmt, torch.contiguous_format)


def library_kernels(forward: str, gradients: str, has_bias: bool) -> tuple[KernelPlan, ...]:
    """The KernelPlans of a library call: one line for the forward, one per gradient."""
    grads = GRADIENTS if has_bias else GRADIENTS[:2]
    return (KernelPlan("output", forward),) + tuple(KernelPlan(g, gradients) for g in grads)
