"""The implicit-GEMM kernels (opencl/igemm.cl) on this device: FMA tiles, the tensor-core tile, work-group limits."""
from __future__ import annotations

import pytest
import torch
from opencl_cases import (
    CASES,
    CL_FMT,
    DTYPES,
    direct_plan,
    ig_case,
    lines,
    make,
    opencl_plan,
    problem_of,
    run_all,
    this_device,
)

import portconv
from portconv.backends import get
from portconv.backends.opencl import igemm, launch
from portconv.backends.opencl import runtime as rt
from portconv.backends.opencl.select import tc_mode
from portconv.knobs import Options
from portconv.params import ConvParams

pytestmark = pytest.mark.usefixtures("opencl_env")


IG_KERNELS = ("ig_fwd", "ig_bwd_data", "ig_bwd_weight", "ig_finalize", "fwd", "bwd_data", "bwd_weight")

# --- the implicit-GEMM kernels (opencl/igemm.cl, Note [OpenCL implicit GEMM]) -------------------------------

IG_EDGES = [  # (id, kwargs of ig_case): M, N and the reduction off the 64 x 64 x 16 tile, groups, strides, layouts
    ("m-n-red-off-tile", dict(n=3, cin=5, cout=67, sp=(11, 13), k=(3, 3), padding=1)),
    ("wide-n-130", dict(n=1, cin=17, cout=130, sp=(9, 7), k=(1, 1))),
    ("groups4-stride2", dict(n=2, cin=12, cout=20, sp=(15, 14), k=(3, 3), stride=2, padding=1, groups=4)),
    ("stride2-bwd-data-odd", dict(n=2, cin=6, cout=9, sp=(17, 16), k=(3, 3), stride=2, padding=0)),
    ("stride3-k2-phases-no-tap", dict(n=1, cin=4, cout=5, sp=(13, 11), k=(2, 2), stride=3, padding=1)),
    ("dilated-stride1", dict(n=2, cin=7, cout=6, sp=(12, 12), k=(3, 3), padding=2, dilation=2)),
    ("stride2-dilated-direct-bwd", dict(n=2, cin=4, cout=6, sp=(13, 12), k=(3, 3), stride=2, padding=2, dilation=2)),
    ("channels-last", dict(n=2, cin=9, cout=70, sp=(10, 9), k=(3, 3), stride=2, padding=1, fmt="channels_last")),
    ("3d", dict(n=2, cin=5, cout=7, sp=(6, 7, 5), k=(3, 3, 3), stride=(1, 2, 1), padding=1)),
    ("3d-channels-last-groups", dict(n=1, cin=6, cout=6, sp=(5, 6, 7), k=(2, 3, 3), padding=1, groups=2,
                                     fmt="channels_last")),
    ("1d", dict(n=3, cin=7, cout=9, sp=(53,), k=(5,), stride=2, padding=2)),
    ("1d-long-kernel-groups", dict(n=2, cin=8, cout=8, sp=(40,), k=(17,), padding=8, groups=2)),
    ("transposed-s2-outpad", dict(n=2, cin=6, cout=5, sp=(7, 6), k=(4, 4), stride=2, padding=1, transposed=True,
                                  out_pad=1)),
    ("transposed-groups-3d", dict(n=1, cin=4, cout=6, sp=(3, 4, 3), k=(3, 3, 3), stride=2, padding=1, groups=2,
                                  transposed=True, out_pad=1)),
    ("split-grad-weight", dict(n=3, cin=3, cout=5, sp=(33, 31), k=(3, 3), padding=1)),
    ("single-input-channel", dict(n=2, cin=1, cout=8, sp=(21, 40), k=(5, 7), stride=2)),
    ("narrow-groups8", dict(n=2, cin=32, cout=24, sp=(11, 10), k=(3, 3), stride=2, padding=1, groups=8)),
    ("narrow-rows-split", dict(n=4, cin=40, cout=6, sp=(30, 29), k=(1, 1))),
]


def _edge(name):
    return dict(next(e[1] for e in IG_EDGES if e[0] == name))


# every shape in float32 and float64; float16 and bfloat16 on a spread of them (the conformance grid runs them all)
IG_PARAMS = [pytest.param(e, dt, id=f"{e[0]}-{dt}") for e in IG_EDGES for dt in ("f32", "f64")
             + (("f16", "bf16") if e[0] in ("m-n-red-off-tile", "channels-last", "transposed-s2-outpad", "1d") else ())]


@pytest.mark.parametrize("edge,dt", IG_PARAMS)
def test_igemm_edge_shapes(edge, dt):
    dtype = DTYPES[dt]
    x, w, b, p = ig_case(dtype=dtype, **edge[1])
    with portconv.options(opencl_dense="igemm"):
        plan = opencl_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, dtype, IG_KERNELS)
    assert plan.algorithm == "igemm" + ("-transposed" if p.transposed else "")
    data_fwd, data_bwd = ("ig_bwd_data", "ig_fwd") if p.transposed else ("ig_fwd", "ig_bwd_data")
    assert launched.get(data_fwd) == 1 and launched.get("ig_bwd_weight") == 1
    if edge[0] == "stride2-dilated-direct-bwd":  # no phase decomposition: the direct kernel
        assert launched.get("bwd_data") == 1 and not launched.get(data_bwd)
        assert "the direct kernel" in lines(plan, "grad_input")
    else:
        assert launched.get(data_bwd) == 1 and not launched.get("bwd_data") and not launched.get("fwd")
    if edge[0] == "split-grad-weight":
        assert launched.get("ig_finalize") == 1


@pytest.mark.parametrize("tile", [(64, 64, 16, 4, 4), (32, 64, 8, 4, 8), (64, 32, 16, 8, 4), (16, 16, 8, 2, 2),
                                  (128, 64, 16, 8, 4), (128, 128, 8, 8, 8)],
                         ids=lambda t: "x".join(map(str, t)))
def test_igemm_tile_configurations(tile, monkeypatch):
    """Other tile shapes than the default (the GPU and CPU defaults are tables, not fixed by the kernels)."""
    monkeypatch.setattr(igemm, "CPU_TILE", igemm.Tile(*tile, cpu=True))
    monkeypatch.setattr(igemm, "GPU_TILE", igemm.Tile(*tile))
    for name in ("m-n-red-off-tile", "groups4-stride2", "transposed-s2-outpad", "split-grad-weight", "channels-last"):
        x, w, b, p = ig_case(**_edge(name))
        run_all(direct_plan(x, w, b, p, Options(opencl_tc="off", opencl_dense="igemm")), x, w, b, p, torch.float32)


def test_igemm_gpu_settings_idx64_and_determinism():
    """The GPU build (no IG_CPU), the 64-bit index build, and bit-identical split grad-weights across calls."""
    x, w, b, p = ig_case(**_edge("split-grad-weight"))
    plan = direct_plan(x, w, b, p, kind="gpu")
    assert "IG_CPU" not in dict(plan.kernel("output").launches[0].module.defines)
    launched = run_all(plan, x, w, b, p, torch.float32, IG_KERNELS)
    assert launched.get("ig_finalize") == 1
    go = torch.randn(p.output_shape(x.shape, w.shape), generator=torch.Generator().manual_seed(2))
    first = plan.backward(go, x, w, (True, True, False))
    assert all(torch.equal(a, c) for a, c in zip(first[:2], plan.backward(go, x, w, (True, True, False))[:2]))
    for name in ("split-grad-weight", "transposed-groups-3d", "channels-last", "narrow-groups8", "narrow-rows-split"):
        x, w, b, p = ig_case(**_edge(name))
        run_all(direct_plan(x, w, b, p, Options(opencl_tc="off", index64=True), kind="gpu"), x, w, b, p,
                torch.float32)


@pytest.mark.parametrize("case", [c for c in CASES if "depthwise" not in c[0]][::2],
                         ids=lambda c: c[0])
def test_forced_direct_kernels(case):
    """Options.opencl_dense='direct' (PORTCONV_OPENCL_DENSE) keeps the direct kernels of conv.cl for dense problems."""
    x, w, b, p = make(case, torch.float32, "contiguous")
    with portconv.options(opencl_dense="direct"):
        plan = opencl_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, torch.float32, IG_KERNELS)
    assert plan.algorithm == "direct" + ("-transposed" if p.transposed else "")
    assert not any(k.startswith("ig_") for k in launched) and launched.get("bwd_weight") == 1


def test_dense_knob_is_part_of_the_plan_key(knob_env):
    """Changing PORTCONV_OPENCL_DENSE mid-process (and reloading the knobs) makes a new plan."""
    x, w, b, p = make(CASES[0], torch.float32, "contiguous")
    algs = []
    for mode in ("direct", "igemm", "direct"):
        knob_env("PORTCONV_OPENCL_DENSE", mode)
        algs.append(opencl_plan(x, w, b, p).algorithm.split("-")[0])  # select(): the cached path
    assert algs == ["direct", "igemm", "direct"]


def test_igemm_tile_too_large_for_the_device_runs_the_direct_kernels(monkeypatch):
    """Note [work-group limits]: a device whose compiled igemm kernels allow fewer work-items than the tile needs runs
    the direct kernels instead: load() learns the limits and builds the call again before anything runs."""
    orig = rt.Runtime.program

    def small(self, module):
        prg, wg = orig(self, module)
        return prg, {k: (8 if k.startswith("igemm_") else v) for k, v in wg.items()}

    monkeypatch.setattr(rt.Runtime, "program", small)
    monkeypatch.setattr(launch, "_LIMITS", {})  # what this test teaches the loader stays in this test
    x, w, b, p = ig_case(**_edge("m-n-red-off-tile"))
    plan = direct_plan(x, w, b, p, Options(opencl_tc="off", opencl_dense="igemm"))
    assert plan.algorithm == "igemm" and plan.kernel("output").launches[0].kernel == "igemm_fwd"  # the plan: max
    before = rt.stats["ig_too_large"]
    launched = run_all(plan, x, w, b, p, torch.float32, IG_KERNELS)
    assert launched == {"fwd": 1, "bwd_data": 1, "bwd_weight": 1}
    assert rt.stats["ig_too_large"] > before
    launch_limits = launch._LIMITS[this_device().index]
    assert all(v == 8 and k[1].startswith("igemm_") for k, v in launch_limits.items())


# --- the tensor-core tile (opencl/igemm_tc.h, Note [OpenCL tensor cores]) ------------------------------------------

@pytest.fixture
def tc_tile():
    """Options.opencl_tc for one test: 'ptx' on an NVIDIA GPU of sm_80+ (the mma.sync products), else 'portable' (the
    same tile, products in plain OpenCL C: PoCL in CI). Returns the mode."""
    mode = "ptx" if tc_mode("float16", this_device(), Options(), (False, ""))[0] == "ptx" else "portable"
    with portconv.options(opencl_tc=mode, opencl_dense="igemm"):
        yield mode


TC_EDGES = [  # every direction on the tile: > 16 channels on both sides of each GEMM (narrower ones run FMA tiles)
    ("tc-3x3-stride2-phases", dict(n=2, cin=24, cout=40, sp=(10, 9), k=(3, 3), stride=2, padding=1)),
    ("tc-1x1-wide", dict(n=1, cin=17, cout=130, sp=(9, 7), k=(1, 1))),
    ("tc-split-channels-last", dict(n=4, cin=20, cout=36, sp=(33, 31), k=(3, 3), padding=1, fmt="channels_last")),
    ("tc-3d-transposed", dict(n=2, cin=24, cout=20, sp=(4, 5, 4), k=(3, 3, 3), stride=2, padding=1, transposed=True,
                              out_pad=1)),
    ("tc-1d-dilated-groups", dict(n=3, cin=40, cout=48, sp=(40,), k=(5,), padding=4, dilation=2, groups=2)),
    # Note [OpenCL M-lane gathers]: NCHW backward-data with phases 19 and 18 wide loads along the rows
    ("tc-mlane-stride2", dict(n=2, cin=24, cout=40, sp=(9, 37), k=(3, 3), stride=2, padding=1)),
    # narrow tensor-core tiles (TC_NARROW): backward-data of 3 input channels (128x8), 4 channels per group (128x8
    # forward and backward-data, 16x128 grad-weight), 12 output channels (128x16 forward)
    ("tc-narrow-cin3", dict(n=2, cin=3, cout=24, sp=(15, 14), k=(5, 5), stride=2, padding=2)),
    ("tc-narrow-groups4", dict(n=2, cin=16, cout=16, sp=(9, 9), k=(3, 3), padding=1, groups=4)),
    ("tc-narrow-cout12", dict(n=2, cin=20, cout=12, sp=(11, 10), k=(3, 3), padding=1)),
]
TC_PARAMS = [pytest.param(e, dt, id=f"{e[0]}-{dt}") for e in TC_EDGES for dt in ("f32", "f16", "bf16")
             if dt == "f32" or e[0] in ("tc-3x3-stride2-phases", "tc-split-channels-last", "tc-3d-transposed",
                                        "tc-narrow-groups4", "tc-mlane-stride2")]


@pytest.mark.parametrize("edge,dt", TC_PARAMS)
def test_igemm_tensor_core_tile(edge, dt, tc_tile):
    """Forward and every gradient on the tensor-core tile match float64 within the plan's math (TF32 for float32;
    16-bit operands are exact in the tile); the split grad-weight adds its partials; the plan names the tile."""
    dtype = DTYPES[dt]
    x, w, b, p = ig_case(dtype=dtype, **edge[1])
    plan = opencl_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, dtype, IG_KERNELS)
    assert plan.algorithm == "igemm-tc" + ("-transposed" if p.transposed else "")
    assert plan.math == ("tf32" if dt == "f32" else "fp32-accumulate")
    text = "\n".join(lines(plan, r) for r in ("output", "grad_input", "grad_weight"))
    assert "tensor-core tiles" in text and f"opencl_tc={tc_tile}" in plan.reason
    assert ("M-lane" in text) == (edge[0] in ("tc-mlane-stride2", "tc-1d-dilated-groups")), text
    assert launched.get("ig_fwd") == 1 and launched.get("ig_bwd_data") == 1 and launched.get("ig_bwd_weight") == 1
    assert not {"fwd", "bwd_data", "bwd_weight"} & set(launched)
    if edge[0] == "tc-split-channels-last":
        assert launched.get("ig_finalize") == 1


# Note [OpenCL tap-major steps]: channel counts per group that are multiples of the tile's reduction step 16 (forward
# C/G, backward-data K/G), with a phase of no tap (stride 3, kernel 2), 3-D, groups, and M-lane loads (wide phases)
TM_EDGES = [
    ("tm-3x3-stride2", dict(n=2, cin=32, cout=48, sp=(11, 37), k=(3, 3), stride=2, padding=1)),
    ("tm-stride3-no-tap", dict(n=2, cin=16, cout=32, sp=(13, 11), k=(2, 2), stride=3, padding=1)),
    ("tm-3d-groups", dict(n=2, cin=64, cout=32, sp=(4, 5, 6), k=(3, 3, 3), padding=1, groups=2)),
    ("tm-1x1-transposed", dict(n=2, cin=16, cout=32, sp=(9, 20), k=(1, 1), transposed=True)),
]
TM_PARAMS = [pytest.param(e, dt, fmt, id=f"{e[0]}-{dt}-{fmt}") for e in TM_EDGES for dt in ("f32", "bf16")
             for fmt in ("contiguous", "channels_last") if fmt == "contiguous" or len(e[1]["sp"]) == 2]


@pytest.mark.parametrize("edge,dt,layout", TM_PARAMS)
def test_igemm_tensor_core_tap_major(edge, dt, layout, tc_tile, monkeypatch):
    """Note [OpenCL tap-major steps] on the tensor-core tile, forced for every layout (the default takes channels-last
    problems): forward and backward-data step channel-innermost without divisions, rows' bounds once per tap; every
    result matches float64 within the plan's math."""
    from portconv.backends.opencl.kernels import SLOT
    from portconv.problem import ConvView

    dtype = DTYPES[dt]
    x, w, b, p = ig_case(dtype=dtype, fmt=layout, **edge[1])
    view = ConvView.of(problem_of(x, w, b, p))
    for direction, ch in (("fwd", view.cg), ("bwd_data", view.kg)):
        assert ch % igemm.TC_TILE.bk == 0 and igemm.gather_order(direction, view, True, 16)[1]
    order = igemm.gather_order
    monkeypatch.setattr(igemm, "gather_order", lambda k, v, c_inner, bk: (order(k, v, c_inner, bk)[0], True))
    plan = direct_plan(x, w, b, p, Options(opencl_tc=tc_tile, opencl_dense="igemm"))
    built = [(x_.kernel, dict(x_.module.defines).get("IG_TAPMAJOR"), x_.args[SLOT["c_inner"]],
              "IG_MFAST" in dict(x_.module.defines)) for k in plan.kernels.values() for x_ in k.launches]
    assert {(n, t, c) for n, t, c, _ in built if n in ("igemm_fwd", "igemm_bwd_data")} == \
        {("igemm_fwd", "1", 1), ("igemm_bwd_data", "1", 1)}, built
    launched = run_all(plan, x, w, b, p, dtype, IG_KERNELS)
    assert plan.algorithm.startswith("igemm-tc") and launched.get("ig_fwd") == 1 and launched.get("ig_bwd_data") == 1
    if layout == "contiguous" and edge[0] in ("tm-3x3-stride2", "tm-1x1-transposed"):  # with M-lane loads too
        kernel = "igemm_bwd_data" if edge[0] == "tm-3x3-stride2" else "igemm_fwd"
        assert any(mf for n, _, _, mf in built if n == kernel), built


def _tf32_rna(v: torch.Tensor) -> torch.Tensor:
    """float32 -> TF32 (10 mantissa bits), to nearest with ties away from zero (PTX cvt.rna.tf32.f32)."""
    bits = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = ((bits + 0x1000) & 0xFFFFE000).to(torch.int32)  # sign-magnitude: the add rounds the magnitude
    return torch.where(torch.isfinite(v), out.view(torch.float32), v)


def test_igemm_tensor_core_tf32_rounding(tc_tile):
    """TF32 operands are rounded to nearest, ties away from zero, once, before the products: a 1x1 convolution with
    one input channel gives y = tf32(x) * tf32(w) exactly; infinities stay infinite and NaN stays NaN."""
    ulp = 2.0**-10
    vals = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 - 2.0**-20, 3 + 0.7 * ulp, 1e-30, -2.5e20,
            float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1 + ulp / 2 + 2.0**-23]
    x = torch.tensor(vals * 5, dtype=torch.float32)[:64].reshape(1, 1, 4, 16)
    w = torch.tensor([1.0, -1.0, 0.5, 1 + ulp / 2] * 8, dtype=torch.float32).reshape(32, 1, 1, 1)
    p = ConvParams.make(2, 1, 0, 1)
    plan = opencl_plan(x, w, None, p)
    assert plan.algorithm == "igemm-tc" and plan.math == "tf32"
    y = plan.forward(x, w, None)
    want = (_tf32_rna(x).double() * _tf32_rna(w).double().reshape(1, 32, 1, 1)).float()
    assert torch.equal(torch.isnan(y), torch.isnan(want)), "NaN positions differ"
    ok = ~torch.isnan(want)
    assert torch.equal(y[ok], want[ok]), (y[ok] - want[ok]).abs().max()


def test_channels_last_results_of_every_direction():
    """Results are computed and returned in the plan's channels-last format (c_inner), including grad_weight."""
    x, w, b, p = ig_case(n=2, cin=8, cout=6, sp=(7, 9), k=(3, 3), padding=1, fmt="channels_last")
    plan = opencl_plan(x, w, b, p)
    assert plan.memory_format == "channels_last"
    y = plan.forward(x, w, b)
    gi, gw, _ = plan.backward(y.contiguous(memory_format=CL_FMT[2]), x, w)
    assert all(t.is_contiguous(memory_format=CL_FMT[2]) for t in (y, gi, gw))
    assert get("opencl").id == "opencl"
