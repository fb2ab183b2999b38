"""ConvFunction: torch autograd for a planned convolution (the backward runs on the same plan's backend)."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, plan):
        ctx.plan = plan
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)
        return plan.forward(input, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        need_i, need_w, need_b = ctx.needs_input_grad[:3]
        mask = (need_i, need_w, need_b and ctx.has_bias)
        if not any(mask):
            return None, None, None, None
        gi, gw, gb = ctx.plan.backward(grad_output, input, weight, mask)
        return gi, gw, gb, None
