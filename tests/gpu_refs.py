"""Float64 references, tolerances and inputs shared by the vendor tests (cuda, hip, cudnn, opencl) and the CPU
emulator."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from portconv.params import ConvParams

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}  # relative L2 error


def reference(x, w, b, p: ConvParams, go, mask=None):
    """aten.convolution and convolution_backward in float64 on the CPU (padding_extra applied as F.conv* does).

    ``mask`` defaults to (True, True, bias given); returns (output, grad_input, grad_weight, grad_bias)."""
    x64, w64, b64, go64 = (None if t is None else t.detach().double().cpu() for t in (x, w, b, go))
    xp = F.pad(x64, [v for e in reversed(p.padding_extra) for v in (0, e)]) if any(p.padding_extra) else x64
    y = torch.ops.aten.convolution(xp, w64, b64, **p.as_aten())
    mask = list(mask) if mask is not None else [True, True, b is not None]
    gi, gw, gb = torch.ops.aten.convolution_backward(go64, xp, w64, [y.shape[1]], **p.as_aten(), output_mask=mask)
    if gi is not None and any(p.padding_extra):
        gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in x.shape[2:])]
    return y, gi, gw, gb


def depthwise_tap_reference(x, w, b, go, stride):
    """The forward and grad_input of a multiplier-1 depthwise convolution without padding or dilation, in float64,
    formed tap by tap (ATen's float64 depthwise takes minutes on millions of channels)."""
    xd, wd, god = x.double(), w.double()[:, 0], go.double()
    y1, y2 = god.shape[2:]
    at = [(a, e, (slice(None), slice(None), slice(a, a + stride * (y1 - 1) + 1, stride),
                  slice(e, e + stride * (y2 - 1) + 1, stride))) for a in range(w.shape[2]) for e in range(w.shape[3])]
    y = b.double()[None, :, None, None] + sum(xd[ix] * wd[None, :, a, e, None, None] for a, e, ix in at)
    gx = torch.zeros_like(xd)
    for a, e, ix in at:
        gx[ix] += god * wd[None, :, a, e, None, None]
    return y, gx


def assert_close(got, ref, dtype, what):
    """Present, same shape, every element written (finite), relative L2 error under TOL[dtype]."""
    assert got is not None, f"{what}: missing"
    got = torch.as_tensor(got).double().cpu()
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite (unwritten) elements"
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], f"{what}: relative error {err:.3g}"


def make(xs, ws, kw, layout, dtype, dev, seed_mult=31):
    """Seeded random input, weight (scaled by fan-in) and bias in ``layout`` ('contig', 'chlast', 'strided')."""
    g = torch.Generator(device=dev).manual_seed(sum(xs) * seed_mult + sum(ws))
    x = torch.randn(xs, generator=g, device=dev, dtype=torch.float32)
    if layout == "chlast" and len(xs) in (4, 5):
        x = x.contiguous(memory_format=torch.channels_last if len(xs) == 4 else torch.channels_last_3d)
    if layout == "strided":
        x = torch.randn(xs[:-1] + (2 * xs[-1],), generator=g, device=dev)[..., 1::2]
    w = torch.randn(ws, generator=g, device=dev) / (ws[1] * max(ws[2], 1)) ** 0.5
    p = ConvParams.make(len(xs) - 2, weight_shape=ws, **kw)
    b = torch.randn((ws[1] * p.groups) if p.transposed else ws[0], generator=g, device=dev)
    return x.to(dtype), w.to(dtype), b.to(dtype), p


def spy_launches(monkeypatch) -> list:
    """Record every kernel launch of the simt backends' Programs as a GPU Loader loads them (the first call of a plan,
    mask and layout; later calls run the same launches) as (name, the PC_FLAG_* bits of its arguments, grid)."""
    from portconv.backends.simt import runtime

    launches = []
    real = runtime.Loader.load

    def spy(self, program, anchor):
        launches.extend((x.kernel, x.args[-1], x.grid) for x in program.launches)
        return real(self, program, anchor)

    monkeypatch.setattr(runtime.Loader, "load", spy)
    return launches
