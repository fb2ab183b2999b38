"""The miopen backend: its rules as a table over typed-in gfx90a / gfx942 / gfx1100 descriptions, the aten call it
makes (checked on the CPU against emulations of the ROCm-only ops), its knobs, and on ROCm a real run."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import require_backend

from portconv.backends import Choice, miopen
from portconv.backends.torchlib import torch_format
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.params import ConvParams
from portconv.problem import Problem
from portconv.rules import TorchContext, miopen_nhwc_default, select_conv_backend
from portconv.tensors import TensorSpec, dense_strides, spec_of

# Device descriptions and the matching ROCm PyTorch contexts, typed in (no AMD GPU is reachable here):
# torch 2.13 built for ROCm 7.0 (MIOpen 3.5.0) with the MI-series NHWC default, as AMD's wheels behave.
MI250X = DeviceInfo(vendor="amd", kind="gpu", name="AMD Instinct MI250X/MI250", arch="gfx90a", runtime="hip",
                    wavefront=64, compute_units=110, memory_bytes=64 * 2**30, local_mem_bytes=65536,
                    max_work_group=1024, fp16=True, bf16=True,
                    versions=(("torch", "2.13.0+rocm7.0"), ("hip", "7.0.51831"), ("miopen", "30500")), index="cuda:0")
MI300X = dataclasses.replace(MI250X, name="AMD Instinct MI300X", arch="gfx942", compute_units=304,
                             memory_bytes=192 * 2**30)
RX7900 = dataclasses.replace(MI250X, name="AMD Radeon RX 7900 XTX", arch="gfx1100", wavefront=32, compute_units=48,
                             memory_bytes=24 * 2**30)
H100 = DeviceInfo(vendor="nvidia", kind="gpu", name="NVIDIA H100", arch="sm_90", runtime="cuda", wavefront=32)


def rocm_ctx(device: DeviceInfo, miopen_version: int = 30500, **kw) -> TorchContext:
    return TorchContext(device_type="cuda", torch_version="2.13.0+rocm7.0", is_hip=True, gpu_arch=device.arch,
                        miopen_version=miopen_version,
                        miopen_nhwc_default=miopen_nhwc_default("rocm-fork-mi", miopen_version, device.arch), **kw)


def _spec(shape, dtype="float32", fmt="contiguous", kind="torch"):
    return TensorSpec(tuple(shape), dense_strides(shape, fmt), dtype, "cuda", 0, kind)


def _problem(x, w, dtype="float32", fmt="contiguous", bias=True, kind="torch", wfmt="contiguous", **kw) -> Problem:
    p = ConvParams.make(len(x) - 2, weight_shape=w, **kw)
    return Problem(p, _spec(x, dtype, fmt, kind), _spec(w, dtype, wfmt, kind), bias)


CONV = ((4, 16, 28, 28), (32, 16, 3, 3))
CL = dict(fmt="channels_last")

# (id, problem, device, ctx changes, algorithm or None, memory format or the words of the Unsupported reason)
TABLE = [
    ("plain-90a", _problem(*CONV, padding=1), MI250X, {}, "miopen_convolution", "contiguous"),
    ("nhwc-default-90a", _problem(*CONV, padding=1, **CL), MI250X, {}, "miopen_convolution", "channels_last"),
    ("nhwc-default-942", _problem(*CONV, padding=1, **CL), MI300X, {}, "miopen_convolution", "channels_last"),
    ("nhwc-default-off-1100", _problem(*CONV, padding=1, **CL), RX7900, {}, "miopen_convolution", "contiguous"),
    ("nhwc-env-on-1100", _problem(*CONV, padding=1, **CL), RX7900, dict(miopen_suggest_nhwc="1"),
     "miopen_convolution", "channels_last"),
    ("nhwc-env-off-942", _problem(*CONV, padding=1, **CL), MI300X, dict(miopen_suggest_nhwc="0"),
     "miopen_convolution", "contiguous"),
    ("nhwc-miopen-3.4-90a", _problem(*CONV, padding=1, **CL), MI250X, dict(miopen_version=30400,
                                                                           miopen_nhwc_default=False),
     "miopen_convolution", "contiguous"),
    ("nhwc-weight-only-942", _problem(*CONV, padding=1, wfmt="channels_last"), MI300X, {}, "miopen_convolution",
     "channels_last"),
    ("nhwc-3d-942", _problem((2, 4, 6, 8, 8), (8, 4, 3, 3, 3), padding=1, fmt="channels_last_3d"), MI300X, {},
     "miopen_convolution", "channels_last_3d"),
    ("same-even-kernel-942", _problem((2, 8, 9, 9), (8, 8, 4, 4), padding="same", **CL), MI300X, {},
     "miopen_convolution", "channels_last"),
    ("1d", _problem((2, 8, 50), (8, 8, 5), padding=2), MI250X, {}, "miopen_convolution", "contiguous"),
    ("depthwise", _problem((8, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144), MI300X, {},
     "miopen_depthwise_convolution", "contiguous"),
    ("depthwise-m2-1d", _problem((2, 8, 40), (16, 1, 3), groups=8), MI250X, {}, "miopen_depthwise_convolution",
     "contiguous"),
    ("transposed", _problem((2, 16, 7, 7), (16, 8, 4, 4), stride=2, padding=1, output_padding=1, transposed=True),
     MI250X, {}, "miopen_convolution_transpose", "contiguous"),
    ("transposed-depthwise", _problem((2, 8, 7, 7), (8, 1, 3, 3), groups=8, transposed=True), MI300X, {},
     "miopen_convolution_transpose", "contiguous"),
    ("grouped-undilated", _problem((2, 32, 14, 14), (64, 8, 3, 3), groups=4, padding=1), RX7900, {},
     "miopen_convolution", "contiguous"),
    ("dilated-ungrouped", _problem(*CONV, padding=2, dilation=2), RX7900, {}, "miopen_convolution", "contiguous"),
    ("float16", _problem(*CONV, "float16", padding=1), MI300X, {}, "miopen_convolution", "contiguous"),
    ("bfloat16-bias", _problem(*CONV, "bfloat16", padding=1), MI300X, {}, "miopen_convolution", "contiguous"),
    ("64bit-2.13", _problem((1, 1, 47000, 47000), (1, 1, 3, 3), padding=1), MI300X, {}, "miopen_convolution",
     "contiguous"),
    # rejections, each with its reason
    ("float64", _problem(*CONV, "float64", padding=1), MI250X, {}, None, "no float64 convolution"),
    ("int32", _problem(*CONV, "int32"), MI250X, {}, None, "not int32"),
    ("grouped-dilated", _problem((2, 32, 14, 14), (64, 8, 3, 3), groups=4, padding=2, dilation=2), MI250X, {}, None,
     "dilation with groups > 1"),
    ("depthwise-dilated", _problem((2, 8, 14, 14), (8, 1, 3, 3), groups=8, dilation=2), MI300X, {}, None,
     "dilation with groups > 1"),
    ("64bit-old-torch", _problem((1, 1, 47000, 47000), (1, 1, 3, 3), padding=1), MI300X,
     dict(miopen_64bit_indexing=False), None, "64-bit indexing"),
    ("cudnn-disabled", _problem(*CONV), MI250X, dict(cudnn_enabled=False), None, "cudnn.enabled is False"),
    ("not-rocm", _problem(*CONV), MI250X, dict(is_hip=False), None, "not a ROCm build"),
    ("nvidia-device", _problem(*CONV), H100, {}, None, "AMD GPUs, not nvidia"),
    ("cupy-arrays", _problem(*CONV, kind="cupy"), MI250X, {}, None, "takes torch tensors"),
]


@pytest.mark.parametrize("name,problem,device,changes,alg,want", TABLE, ids=[r[0] for r in TABLE])
def test_rule_table(name, problem, device, changes, alg, want):
    ctx = rocm_ctx(device).replace(**changes)
    if alg is None:
        with pytest.raises(Unsupported, match=want):
            miopen.choose_rules(problem, device, ctx)
        return
    c = miopen.choose_rules(problem, device, ctx)
    assert (c.algorithm, c.memory_format) == (alg, want), c
    assert c.math == ("fp32-accumulate" if problem.dtype in ("float16", "bfloat16") else "ieee")
    assert f"aten.{alg}" in c.reason and "convolution_backward" in c.reason and "NHWC" in c.reason


def test_rule_accepts_exactly_what_aten_sends_to_miopen():
    """Over a small grid of problems and contexts, choose_rules accepts a problem iff ATen's selection (the
    model in portconv.rules) sends it to a Miopen backend, and then names that backend's op."""
    shapes = [((2, 8, 9, 9), (8, 8, 3, 3)), ((2, 8, 9, 9), (8, 1, 3, 3)), ((2, 8, 9, 9), (16, 2, 3, 3)),
              ((2, 8, 20), (8, 4, 3)), ((1, 4, 5, 6, 7), (4, 4, 3, 3, 3))]
    seen = set()
    for x, w in shapes:
        groups = x[1] // w[1]
        for dtype in ("float32", "float16", "bfloat16", "float64"):
            for kw in (dict(), dict(dilation=2), dict(stride=2, padding=1), dict(transposed=True)):
                if kw.get("transposed"):
                    w = (x[1], w[0] // groups) + w[2:]
                pr = _problem(x, w, dtype, groups=groups, **kw)
                for dev in (MI250X, RX7900):
                    for changes in ({}, dict(cudnn_enabled=False)):
                        ctx = rocm_ctx(dev).replace(**changes)
                        aten = select_conv_backend(pr.input, pr.weight, None, pr.params, ctx, None)
                        try:
                            c = miopen.choose_rules(pr, dev, ctx)
                        except Unsupported:
                            assert not aten.startswith("Miopen"), (pr.describe(), aten)
                            seen.add("rejected")
                            continue
                        assert c.algorithm == miopen._MIOPEN_BACKENDS[aten], (pr.describe(), aten, c)
                        seen.add(c.algorithm)
    assert seen == {"rejected", *miopen._MIOPEN_BACKENDS.values()}


def test_probe_on_this_torch():
    a = miopen.MiopenBackend().probe()
    if getattr(torch.version, "hip", None):
        pytest.skip("this is a ROCm PyTorch")
    assert not a and "not a ROCm build" in a.reason and "torch.version.hip" in a.reason


def test_settings_surface_find_mode_and_db_path(monkeypatch):
    monkeypatch.setenv("MIOPEN_FIND_MODE", "FAST")
    monkeypatch.delenv("MIOPEN_USER_DB_PATH", raising=False)
    rows = {name: (value, meaning) for name, value, meaning in miopen.miopen_settings()}
    assert rows["MIOPEN_FIND_MODE"][0] == "FAST"
    assert rows["MIOPEN_USER_DB_PATH"] == ("(unset)", miopen.MIOPEN_VARIABLES["MIOPEN_USER_DB_PATH"])
    assert "PYTORCH_MIOPEN_SUGGEST_NHWC" in rows and "torch.backends.cudnn.benchmark" in rows
    assert all(meaning for _, meaning in rows.values())


# --- the aten call, on the CPU against emulations of the ROCm-only ops ----------------------------------------------
def _emulated_ops(seen: list):
    """CPU stand-ins with the miopen ops' exact signatures, checking the layout they are handed."""
    conv = torch.ops.aten.convolution

    def check(x, w, fmt_holder):
        fmt = fmt_holder[0]
        assert x.is_contiguous(memory_format=fmt) and w.is_contiguous(memory_format=fmt)

    fmt_holder = [torch.contiguous_format]

    def fwd(name):
        def op(x, w, b, padding, stride, dilation, groups, benchmark, deterministic):
            check(x, w, fmt_holder)
            seen.append(name)
            return conv(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
        return op

    def transpose(x, w, b, padding, output_padding, stride, dilation, groups, benchmark, deterministic):
        check(x, w, fmt_holder)
        seen.append("miopen_convolution_transpose")
        return conv(x, w, b, stride, padding, dilation, True, output_padding, groups)

    ops = {"miopen_convolution": fwd("miopen_convolution"),
           "miopen_depthwise_convolution": fwd("miopen_depthwise_convolution"),
           "miopen_convolution_transpose": transpose}
    return ops, fmt_holder


WIRING = [  # (input, weight, kwargs, layout, device, ctx changes)
    ((2, 4, 11, 9), (6, 4, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)), "contig", MI250X, {}),
    ((2, 4, 11, 9), (6, 4, 3, 3), dict(stride=2, padding=1), "chlast", MI300X, {}),
    ((2, 3, 17), (5, 3, 4), dict(stride=2, padding=3, dilation=2), "strided", MI250X, {}),
    ((2, 4, 10, 10), (8, 1, 3, 3), dict(groups=4, stride=2, padding=1), "contig", RX7900, {}),
    ((2, 6, 5, 4), (6, 4, 3, 3), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig", MI250X, {}),
    ((2, 3, 9, 8), (4, 3, 2, 4), dict(padding="same"), "chlast", RX7900, dict(miopen_suggest_nhwc="1")),
]


@pytest.mark.parametrize("case", range(len(WIRING)))
def test_forward_and_backward_wiring_on_cpu(case, monkeypatch):
    xs, ws, kw, layout, dev, changes = WIRING[case]
    g = torch.Generator().manual_seed(case)
    x = torch.randn(xs, generator=g, dtype=torch.float64)
    if layout == "chlast":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        x = torch.randn(xs[:-1] + (2 * xs[-1],), generator=g, dtype=torch.float64)[..., ::2]
    w = torch.randn(ws, generator=g, dtype=torch.float64)
    p = ConvParams.make(len(xs) - 2, weight_shape=ws, **kw)
    b = torch.randn(ws[1] * p.groups if p.transposed else ws[0], generator=g, dtype=torch.float64)
    # the rule sees the problem as on a ROCm GPU (float32 there: MIOpen has no float64); the CPU runs it in float64
    gpu_problem = Problem(p, dataclasses.replace(spec_of(x), device_type="cuda", device_index=0, dtype="float32"),
                          dataclasses.replace(spec_of(w), device_type="cuda", device_index=0, dtype="float32"), True)
    choice = miopen.choose_rules(gpu_problem, dev, rocm_ctx(dev).replace(**changes))
    be = miopen.MiopenRunner(Problem(p, spec_of(x), spec_of(w), True), choice)
    seen = []
    ops, fmt_holder = _emulated_ops(seen)
    fmt_holder[0] = torch_format(torch, choice.memory_format)
    monkeypatch.setattr(miopen, "_op", lambda name: ops[name])
    x_before = x.clone()
    y = be.forward(x, w, b)
    assert seen == [choice.algorithm]
    xp = F.pad(x, [v for e in reversed(p.padding_extra) for v in (0, e)]) if any(p.padding_extra) else x
    ref = torch.ops.aten.convolution(xp, w, b, **p.as_aten())
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    rgi, rgw, rgb = torch.ops.aten.convolution_backward(go, xp, w, [ref.shape[1]], **p.as_aten(),
                                                        output_mask=[True, True, True])
    if any(p.padding_extra):
        rgi = rgi[(slice(None), slice(None)) + tuple(slice(0, s) for s in xs[2:])]
    for mask in ((True, True, True), (False, True, False), (True, False, False)):
        gi, gw, gb = be.backward(go, x, w, mask)
        for got, r, m, name in zip((gi, gw, gb), (rgi, rgw, rgb), mask, ("grad_input", "grad_weight", "grad_bias")):
            if not m:
                assert got is None, f"{name} was not requested"
            else:
                torch.testing.assert_close(got, r, rtol=1e-12, atol=1e-12, msg=name)
    assert torch.equal(x, x_before)


def test_wiring_check_catches_swapped_padding_and_stride(monkeypatch):
    """Negative control: an op that swaps padding and stride (the classic mistake) is caught by the wiring test."""
    ops, fmt_holder = _emulated_ops([])
    good = ops["miopen_convolution"]
    monkeypatch.setitem(ops, "miopen_convolution",
                        lambda x, w, b, padding, stride, *rest: good(x, w, b, stride, padding, *rest))
    monkeypatch.setattr(miopen, "_op", lambda name: ops[name])
    x, w = torch.randn(1, 2, 9, 9, dtype=torch.float64), torch.randn(3, 2, 3, 3, dtype=torch.float64)
    p = ConvParams.make(2, stride=2, padding=1)
    pr = Problem(p, spec_of(x), spec_of(w), False)
    y = miopen.MiopenRunner(pr, Choice("miopen_convolution", "contiguous", "")).forward(x, w, None)
    ref = torch.ops.aten.convolution(x, w, None, **p.as_aten())
    assert y.shape != ref.shape or not torch.allclose(y, ref)


# --- on ROCm ----------------------------------------------------------------------------------------------------------
def test_runs_on_rocm(requested_backends, knob_env):
    if "miopen" not in requested_backends:
        pytest.skip("the miopen backend was not requested (pytest --backend miopen; needs ROCm PyTorch)")
    require_backend("miopen")
    import portconv

    knob_env("PORTCONV_POISON", "1")
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(2, 8, 16, 16, device=dev, requires_grad=True)
    w, b = torch.randn(16, 8, 3, 3, device=dev), torch.randn(16, device=dev)
    plan = portconv.plan(x, w, b, padding=1, backend="miopen")
    assert plan.algorithm == "miopen_convolution" and "MIOPEN_FIND_MODE" in plan.reason
    y = portconv.conv2d(x, w, b, padding=1, backend="miopen")
    y.sum().backward()
    ref = torch.ops.aten.convolution(x.detach().double().cpu(), w.double().cpu(), b.double().cpu(), [1, 1], [1, 1],
                                     [1, 1], False, [0, 0], 1)
    torch.testing.assert_close(y.detach().double().cpu(), ref, rtol=1e-4, atol=1e-4)
    assert x.grad is not None and torch.isfinite(x.grad).all()
