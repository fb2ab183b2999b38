"""A user's C++ depthwise forward (dwconv.cpp, pybind11) trained with portconv's gradients.

    cd examples/custom_forward_cpp && python setup.py build_ext --inplace && python example.py

dw_forward below is the user kernel; portconv.custom_forward makes it the torch op ``example::dw_forward`` with
F.conv2d's signature: validated arguments, autograd through portconv.convolution_backward, torch.compile and
autocast. Problems the kernel does not take (not depthwise, not 2-D, 16-bit) go to portconv's own forward.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import portconv

try:
    import dwconv  # the extension built by setup.py
except ImportError as e:
    raise SystemExit(f"build the extension first: python setup.py build_ext --inplace ({e})") from e


def _takes(problem) -> bool:
    return (problem.is_depthwise and problem.params.rank == 2 and problem.dtype in ("float32", "float64")
            and problem.input.device_type == "cpu")


@portconv.custom_forward("example::dw_forward", supports=_takes)
def dw_forward(input, weight, bias, stride, padding, dilation, groups):
    f = dwconv.forward_f32 if input.dtype == torch.float32 else dwconv.forward_f64
    b = None if bias is None else bias.detach().numpy()
    y = f(input.detach().numpy(), weight.detach().numpy(), b, stride, padding, dilation, groups)
    return torch.from_numpy(np.asarray(y))


class DwConv(nn.Conv2d):
    """nn.Conv2d whose forward is the user kernel (the same parameters and state_dict)."""

    def forward(self, x):
        return dw_forward(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def model(conv=nn.Conv2d) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), conv(16, 16, 3, padding=1, groups=16),
                         nn.BatchNorm2d(16), nn.ReLU(), conv(16, 32, 5, stride=2, padding=2, groups=16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def train(net: nn.Module, steps: int = 5, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    torch.manual_seed(0)
    ref = model()
    ours = model(DwConv)
    ours.load_state_dict(ref.state_dict())
    print(portconv.check_forward(dw_forward))
    a, b = train(ref), train(ours)
    worst = max(abs(p - q) / abs(p) for p, q in zip(a, b))
    for i, (p, q) in enumerate(zip(a, b)):
        print(f"step {i + 1}: PyTorch {p:.6f}  user kernel + portconv gradients {q:.6f}")
    x = torch.randn(2, 16, 12, 12)
    print(dw_forward.explain(x, ours[2].weight, ours[2].bias, 1, 1, 1, 16))
    print(f"EXAMPLE-RESULT max relative loss difference {worst:.2e}")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
