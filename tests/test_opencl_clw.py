"""The depthwise 'clw' kernels (opencl/clw.cl, Note [depthwise clw]) on this device, against float64, outputs
poisoned; their constants against the host's (portconv/dwclw.py). The selection table is test_opencl_select's."""
from __future__ import annotations

import pathlib
import re

import pytest
import torch
from opencl_cases import DTYPES, check, direct_plan, dw_case, launched_since, lines, reference, run_all

from portconv import dwclw
from portconv.backends.opencl import runtime as rt
from portconv.knobs import Options
from portconv.params import ConvParams

CLW = ("clw_fwd_s1", "clw_fwd_s2", "clw_bwd_data_s1", "clw_bwd_data_s2", "clw_bwd_weight_s1", "clw_bwd_weight_s2",
       "clw_finalize")
OTHERS = ("bands_fwd_s1", "bands_fwd_s2", "bands_bwd_data_s1", "bands_bwd_data_s2", "bands_bwd_weight_s1",
          "bands_bwd_weight_s2", "dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight", "fwd", "bwd_data", "bwd_weight")

EDGES = [  # (id, shape (C, *spatial), kernel, stride, padding, batch)
    ("c5-7x7-one-channel-a-lane", (5, 11, 12), (7, 7), 1, 3, 2),  # C off every vector width
    ("c8-2x2-pad0", (8, 9, 10), (2, 2), 1, 0, 3),
    ("c6-5x5", (6, 10, 11), (5, 5), 1, 2, 2),  # 5x5 with C % 8 != 0: not depthwise.cl's channels-last kernels
    ("c6-9x9-pad4", (6, 12, 13), (9, 9), 1, 4, 2),
    ("c4-7x2-pad3x1", (4, 13, 9), (7, 2), 1, (3, 1), 2),
    ("c4-2x7-pad0x3", (4, 9, 14), (2, 7), 1, (0, 3), 1),
    ("c4-3x5-pad1x2", (4, 8, 10), (3, 5), 1, (1, 2), 2),  # 3 rows, 5 columns
    ("c4-4x4-same", (4, 9, 8), (4, 4), 1, "same", 2),  # 1 low, 2 high padding a side
    ("c6-5x5-stride2", (6, 12, 13), (5, 5), 2, 2, 2),  # backward-data by phases (Note [clw phases])
    ("c8-4x4-stride2-pad1", (8, 11, 10), (4, 4), 2, 1, 2),
    ("c4-7x7-stride2-pad0", (4, 13, 10), (7, 7), 2, 0, 2),  # no padding: a phase's window starts past m
    ("c66-5x5-channel-tiles", (66, 6, 7), (5, 5), 1, 2, 1),  # float32: 33 groups, tiles of 32 and 1
    ("c2-2x2-one-group", (2, 2, 5), (2, 2), 1, 0, 1),  # one work-group a direction, one weight split
]


@pytest.mark.usefixtures("opencl_env")
@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e[0])
def test_clw_kernels(edge, dt):
    """Forward (with bias), grad_input and grad_weight of channels-last results run clw_fwd, clw_bwd_data (stride 2:
    by phases) and clw_bwd_weight (+ clw_finalize where it splits) and match float64."""
    _, shape, k, stride, padding, n = edge
    dtype = DTYPES[dt]
    x, w, b, p = dw_case(shape, k, stride, padding, 1, n, dtype, fmt="channels_last")
    plan = direct_plan(x, w, b, p)
    assert plan.memory_format == "channels_last" and "opencl/clw.cl" in plan.reason, plan.reason
    launched = run_all(plan, x, w, b, p, dtype, CLW + OTHERS, go_like_y=True)
    splits = len(plan.kernel("grad_weight").launches) - 1
    want = {f"clw_fwd_s{stride}": 1, f"clw_bwd_weight_s{stride}": 1, **({"clw_finalize": 1} if splits else {}),
            f"clw_bwd_data_s{stride}": 1}
    assert launched == want, (launched, lines(plan, "grad_weight"))
    if shape == (2, 2, 5):
        assert [x_.grid for r in ("output", "grad_input") for x_ in plan.kernel(r).launches] == [(256, 1)] * 2
        assert splits == 0


@pytest.mark.usefixtures("opencl_env")
def test_clw_transposed_and_strided_views():
    """A transposed depthwise convolution (its forward is the view's backward-data with a bias: conv.cl's, as bands;
    its grad_input the view's forward: clw_fwd), and a channels-last input viewed from a wider tensor (odd strides:
    one channel a lane), match float64."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 10, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(4, 1, 5, 5, generator=g), torch.randn(4, generator=g)
    p = ConvParams.make(2, 1, 2, 1, True, 0, 4, weight_shape=w.shape)
    plan = direct_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, torch.float32, CLW + OTHERS, go_like_y=True)
    splits = len(plan.kernel("grad_weight").launches) - 1
    assert launched == {"bwd_data": 1, "clw_fwd_s1": 1, "clw_bwd_weight_s1": 1,
                        **({"clw_finalize": 1} if splits else {})}, launched
    wide = torch.randn(2, 9, 9, 10, generator=g).contiguous(memory_format=torch.channels_last)
    x = wide[:, 2:8]  # channel stride 1, every other stride odd: the scalar path
    w, b = torch.randn(6, 1, 7, 7, generator=g), torch.randn(6, generator=g)
    p = ConvParams.make(2, 1, 3, 1, False, 0, 6, weight_shape=w.shape)
    plan = direct_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, torch.float32, CLW, go_like_y=True)
    assert launched.get("clw_fwd_s1") == 1 and launched.get("clw_bwd_data_s1") == 1, launched


@pytest.mark.usefixtures("opencl_env")
def test_clw_any_grid_computes_every_output(monkeypatch):
    """Channel tiles and spatial tiles are loops over the grid: one work-group of one channel tile computes the whole
    forward and backward-data of a problem with several of each; the weight gradient is the same bits run again."""
    monkeypatch.setattr(dwclw, "DWC_BLOCKS_PER_UNIT", 0)
    monkeypatch.setattr(dwclw, "clw_groups", lambda v, dtype, lanes: (min(v.C, dwclw.DWC_CTMAX, lanes), 1))
    x, w, b, p = dw_case((70, 9, 11), (5, 5), 1, 2, 1, 2, torch.float32, fmt="channels_last")
    plan = direct_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, torch.float32, CLW, go_like_y=True)
    assert launched.get("clw_fwd_s1") == 1 and launched.get("clw_bwd_data_s1") == 1, launched
    grids = {x_.grid for r in ("output", "grad_input") for x_ in plan.kernel(r).launches}
    assert grids == {(256, 1)}, grids
    go = torch.randn(plan.forward(x, w, b).shape).contiguous(memory_format=torch.channels_last)
    before = dict(rt.stats)
    first = plan.backward(go, x, w, (False, True, False))[1]
    assert torch.equal(first, plan.backward(go, x, w, (False, True, False))[1])
    assert launched_since(before, CLW).get("clw_bwd_weight_s1") == 2
    check(first, reference(x, w, b, p, go)[2], torch.float32, "grad_weight")


def test_clw_kernel_constants_match_the_host():
    """opencl/clw.cl's group size, channel-group cap and default geometry are portconv/dwclw.py's (the CUDA set's
    test checks cuda/conv_depthwise_clw.cuh); the host gives every module its dtype's VC, which the kernel takes."""
    src = (pathlib.Path(__file__).resolve().parents[1] / "opencl" / "clw.cl").read_text()
    d = {k: int(v) for k, v in re.findall(r"#define (CLW_\w+) +(\d+)", src)}
    g = dwclw.DWC_GEOMETRY["bfloat16"]
    assert (d["CLW_THREADS"], d["CLW_CTMAX"], d["CLW_VC"], d["CLW_TH"], d["CLW_VW"], d["CLW_VWW"],
            d["CLW_ROWLOOP"]) == (dwclw.THREADS, dwclw.DWC_CTMAX, g.vc, g.th, g.vw, g.vww, int(g.row_loop))
    assert dwclw.DWC_GEOMETRY["float16"] == g and dwclw.DWC_GEOMETRY["float64"].vc == 1
    assert all(dwclw.DWC_GEOMETRY[t].vc in (1, 2, 4) for t in dwclw.DWC_GEOMETRY)  # the kernel's #error otherwise


@pytest.mark.usefixtures("opencl_env")
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_clw_index64(dt):
    """The 64-bit index build (Options.index64) of every clw kernel matches float64."""
    dtype = DTYPES[dt]
    x, w, b, p = dw_case((8, 9, 10), (7, 7), 1, 3, 1, 2, dtype, fmt="channels_last")
    plan = direct_plan(x, w, b, p, Options(opencl_tc="off", index64=True))
    assert all(("IDX64", "") in x_.module.defines for k in plan.kernels.values() for x_ in k.launches)
    launched = run_all(plan, x, w, b, p, dtype, CLW, go_like_y=True)
    assert launched.get("clw_fwd_s1") == 1 and launched.get("clw_bwd_data_s1") == 1, launched
    assert launched.get("clw_bwd_weight_s1") == 1, launched


@pytest.mark.usefixtures("opencl_env")
def test_clw_on_array_views_at_any_offset():
    """pyopencl arrays viewing one buffer at element offsets 0 to 3 (the vector path where the offsets are whole
    float32 pairs, one channel a lane elsewhere): forward and every gradient match float64."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    x, w, b, p = dw_case((6, 9, 10), (5, 5), 1, 2, 1, 2, torch.float32, fmt="channels_last")
    go = torch.randn(p.output_shape(x.shape, w.shape)).contiguous(memory_format=torch.channels_last)
    ry, gi, gw, gb = reference(x, w, b, p, go)
    q = cl.CommandQueue(cl.Context([next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())]))

    def view(t, offset):
        span = t.untyped_storage().nbytes() // 4
        host = np.zeros(offset + span, np.float32)
        host[offset:] = torch.as_strided(t, (span,), (1,)).numpy()
        buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        return cla.Array(q, tuple(t.shape), np.float32, data=buf, offset=4 * offset,
                         strides=tuple(4 * s for s in t.stride()))

    def torch_of(a):  # channels-last results are read back as (N, H, W, C)
        if a.flags.forc:
            return torch.from_numpy(a.get())
        return torch.from_numpy(a.transpose((0, 2, 3, 1)).get()).permute(0, 3, 1, 2)

    for offset in range(4):
        xa, wa, ba, ga = (view(t, offset) for t in (x, w, b, go))
        plan = direct_plan(xa, wa, ba, p)
        before = dict(rt.stats)
        y = plan.forward(xa, wa, ba)
        got = plan.backward(ga, xa, wa, (True, True, True))
        assert launched_since(before, CLW).get("clw_bwd_data_s1") == 1
        for out, ref, what in zip((y, *got), (ry, gi, gw, gb), ("output", "grad_input", "grad_weight", "grad_bias")):
            check(torch_of(out), ref, torch.float32, f"{what} at offset {offset}")
