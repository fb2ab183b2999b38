"""portconv.nn modules: state_dict-compatible with torch.nn and numerically equal to it (aten and opencl)."""
from __future__ import annotations

import pytest
import torch

import portconv.nn as pnn

CASES = [
    (pnn.Conv1d, torch.nn.Conv1d, dict(in_channels=4, out_channels=6, kernel_size=3, padding=1), (2, 4, 11)),
    (pnn.Conv2d, torch.nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, groups=2), (2, 4, 9, 8)),
    (pnn.Conv2d, torch.nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=4, padding="same",
                                       padding_mode="reflect"), (1, 3, 7, 7)),
    (pnn.Conv3d, torch.nn.Conv3d, dict(in_channels=2, out_channels=3, kernel_size=2, dilation=2), (1, 2, 5, 6, 5)),
    (pnn.ConvTranspose1d, torch.nn.ConvTranspose1d, dict(in_channels=4, out_channels=2, kernel_size=3, stride=2),
     (2, 4, 7)),
    (pnn.ConvTranspose2d, torch.nn.ConvTranspose2d, dict(in_channels=4, out_channels=6, kernel_size=4, stride=2,
                                                         padding=1, groups=2), (2, 4, 5, 5)),
    (pnn.ConvTranspose3d, torch.nn.ConvTranspose3d, dict(in_channels=2, out_channels=2, kernel_size=3, stride=2,
                                                         output_padding=1), (1, 2, 3, 4, 3)),
]


def _backends():
    from portconv import backends

    out = ["aten"]
    if backends.get("opencl").probe():
        out.append("opencl")
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("ours,theirs,kw,shape", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_module_matches_torch(ours, theirs, kw, shape, backend):
    torch.manual_seed(0)
    ref = theirs(**kw).double()
    mod = ours(**kw, backend=backend).double()
    missing, unexpected = mod.load_state_dict(ref.state_dict())
    assert not missing and not unexpected
    assert set(mod.state_dict()) == set(ref.state_dict())
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y_ref = mod(x), ref(x2)
    assert y.shape == y_ref.shape
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mod.weight.grad, ref.weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mod.bias.grad, ref.bias.grad, rtol=1e-10, atol=1e-10)


def test_repr_names_backend():
    assert "backend='opencl'" in repr(pnn.Conv2d(1, 1, 3, backend="opencl"))
