"""The examples' proof that a user forward plus portconv's gradients trains as PyTorch does.

    cd examples/custom_forward_cupy && python ../dwtrain.py dwconv_cupy:dw_forward --device cuda

For an op made with portconv.custom_forward: its check against PyTorch in float64 over the conformance cases it
accepts (portconv.check_forward), then a small model whose depthwise convolutions run the op, trained beside the same
model on PyTorch's own convolutions from the same weights and data: the gradients of the first step and the losses of
every step compared, and the plan of the op's depthwise layer (the user kernel forward, portconv's gradients).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import portconv

GRAD_TOL = 1e-4  # largest relative L2 difference of a parameter's gradient after the first step (float32)
LOSS_TOL = 1e-4  # largest relative loss difference over the steps


class OpConv(nn.Conv2d):
    """nn.Conv2d whose forward is ``op`` (a registered user forward): the same parameters and state_dict."""

    def __init__(self, op, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.op = op

    def forward(self, x):
        return self.op(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def model(op=None) -> nn.Module:
    """A dense stem, then two depthwise convolutions on ``op`` (None: nn.Conv2d): 3x3 stride 1 without bias (batch
    norm follows, which would leave a bias only rounding noise for a gradient), 5x5 stride 2 with channel multiplier 2
    and a bias; a classifier."""
    dw = nn.Conv2d if op is None else functools.partial(OpConv, op)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), dw(16, 16, 3, padding=1, groups=16, bias=False),
                         nn.BatchNorm2d(16), nn.ReLU(), dw(16, 32, 5, stride=2, padding=2, groups=16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def compare(op, device="cpu", steps: int = 5, seed: int = 0) -> tuple[float, list[tuple[float, float]]]:
    """(largest relative gradient difference after the first step, [(PyTorch's loss, ours) a step]) of model(op)
    against model() trained side by side with SGD on the same float32 batches."""
    torch.manual_seed(seed)
    ref = model().to(device)
    ours = model(op).to(device)
    ours.load_state_dict(ref.state_dict())
    opts = [torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) for net in (ref, ours)]
    g = torch.Generator().manual_seed(seed)
    grad_err, losses = 0.0, []
    for step in range(steps):
        x, y = torch.randn(8, 3, 16, 16, generator=g).to(device), torch.randint(0, 10, (8,), generator=g).to(device)
        pair = []
        for net, opt in zip((ref, ours), opts):
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            pair.append(loss.item())
        if step == 0:
            for a, b in zip(ref.parameters(), ours.parameters()):
                grad_err = max(grad_err, ((a.grad - b.grad).norm() / a.grad.norm().clamp_min(1e-30)).item())
        for opt in opts:
            opt.step()
        losses.append((pair[0], pair[1]))
    return grad_err, losses


def run(op, device="cpu", dtypes=("float32", "float64"), steps: int = 5) -> int:
    """Print the check, the training comparison and the plan; 0 when all hold, else 1."""
    report = portconv.check_forward(op, dtypes=dtypes, device=device)
    print(report)
    grad_err, losses = compare(op, device, steps)
    print(f"gradients after the first step: largest relative difference {grad_err:.2e}")
    for i, (p, q) in enumerate(losses):
        print(f"step {i + 1}: PyTorch {p:.6f}  user kernel + portconv gradients {q:.6f}")
    worst = max(abs(p - q) / abs(p) for p, q in losses)
    dw = model(op).to(device)[2]
    x = torch.randn(2, 16, 12, 12, device=device)
    print(op.explain(x, dw.weight, dw.bias, dw.stride, dw.padding, dw.dilation, dw.groups))
    print(f"EXAMPLE-RESULT max relative loss difference {worst:.2e}, gradient difference {grad_err:.2e}")
    return 0 if report.ok and worst <= LOSS_TOL and grad_err <= GRAD_TOL else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", metavar="MODULE:OP", help="a portconv.custom_forward op, found from the current folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32,float64", help="check_forward's dtypes (comma-separated)")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    mod, _, attr = a.op.partition(":")
    op = getattr(importlib.import_module(mod), attr)
    return run(op, a.device, tuple(a.dtypes.split(",")), a.steps)


if __name__ == "__main__":
    raise SystemExit(main())
