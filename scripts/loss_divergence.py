"""How far two correct sets of convolution kernels drift apart in training: the relative difference of the loss
after each of 20 SGD steps (momentum 0.9, float32) of one small MobileNetV2-style model (depthwise blocks with
BatchNorm and ReLU6) from one init on the same batches, PyTorch against (a) PyTorch with its other CPU kernels
(oneDNN off: slow_conv2d and the thnn depthwise kernels) and (b) the model converted to a portconv backend.
The issue's loss target (1e-4 relative after 20 steps) is measured against (a), PyTorch's own spread.

  python3 scripts/loss_divergence.py [--backend opencl] [--steps 20]
"""
from __future__ import annotations

import argparse
import copy

import torch

import portconv


def model() -> torch.nn.Module:
    nn = torch.nn

    def block(c):
        return nn.Sequential(nn.Conv2d(c, 4 * c, 1, bias=False), nn.BatchNorm2d(4 * c), nn.ReLU6(),
                             nn.Conv2d(4 * c, 4 * c, 3, padding=1, groups=4 * c, bias=False), nn.BatchNorm2d(4 * c),
                             nn.ReLU6(), nn.Conv2d(4 * c, c, 1, bias=False), nn.BatchNorm2d(c))
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), *[block(16) for _ in range(6)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def train(net, data) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    base = model()
    data = [(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))) for _ in range(args.steps)]
    ref = train(copy.deepcopy(base), data)
    with torch.backends.mkldnn.flags(enabled=False):
        other = train(copy.deepcopy(base), data)
    ours = train(portconv.convert(copy.deepcopy(base), backend=args.backend), data)
    marks = sorted({0, args.steps // 2 - 1, args.steps - 1})
    for name, losses in (("PyTorch, oneDNN off", other), (f"portconv {args.backend}", ours)):
        rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref)]
        print(f"{name:22s} " + "  ".join(f"step {i + 1}: {rel[i]:.1e}" for i in marks))


if __name__ == "__main__":
    main()
