"""The depthwise kernels (opencl/depthwise.cl) on this device; calls on pyopencl arrays (views, contexts, events)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_refs import depthwise_tap_reference
from opencl_cases import (
    CASES,
    DTYPES,
    NO_TC,
    check,
    direct_plan,
    dw_case,
    launched_since,
    lines,
    make,
    opencl_plan,
    reference,
    run_all,
    tol,
)

import portconv
from portconv.backends.opencl import clw, depthwise
from portconv.backends.opencl import runtime as rt
from portconv.knobs import Options
from portconv.params import ConvParams

pytestmark = pytest.mark.usefixtures("opencl_env")


DW_KERNELS = ("dw_fwd", "dw_bwd_data", "dw_bwd_weight", "dw_finalize", "fwd", "bwd_data", "bwd_weight")
CL_KERNELS = DW_KERNELS + ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight")

# --- the vectorised depthwise kernels (opencl/depthwise.cl, Note [depthwise kernels]) ---------------------

DW_EDGES = [  # (id, shape (C, *spatial), kernel, stride, padding, channel multiplier, batch)
    ("w13-not-multiple-of-8", (3, 9, 13), (3, 3), 1, 1, 1, 2),
    ("w5-narrower-than-a-vector", (4, 6, 5), (3, 3), 1, 1, 1, 1),
    ("1x1-image-pad1", (2, 1, 1), (3, 3), 1, 1, 1, 2),
    ("2x3-image-pad2", (2, 2, 3), (3, 3), 1, 2, 1, 1),
    ("pad2-stride2-w17", (3, 11, 17), (3, 3), 2, 2, 1, 3),
    ("stride2-pad0-w20", (2, 9, 20), (3, 3), 2, 0, 1, 2),
    ("stride2-odd-w29", (2, 7, 29), (3, 3), 2, 1, 2, 1),
    ("mult2-w37", (3, 20, 37), (3, 3), 1, 1, 2, 2),
    ("5x5-pad2-w19", (3, 17, 19), (5, 5), 1, 2, 1, 2),
    ("5x5-stride2-w23", (2, 12, 23), (5, 5), 2, 2, 1, 1),
    ("3d-3x3x3", (2, 5, 9, 10), (3, 3, 3), 1, 1, 1, 2),
    ("3d-stride2-pad2", (2, 6, 7, 18), (3, 3, 3), 2, 2, 2, 1),
    ("1d-k3-w29", (3, 29), (3,), 1, 1, 1, 2),
    ("1d-k3-stride2-w31", (3, 31), (3,), 2, 0, 1, 2),
]


@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("edge", DW_EDGES, ids=lambda e: e[0])
def test_depthwise_kernels_edge_shapes(edge, dt):
    _, shape, k, stride, padding, mult, n = edge
    dtype = DTYPES[dt]
    x, w, b, p = dw_case(shape, k, stride, padding, mult, n, dtype)
    plan = opencl_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, dtype, DW_KERNELS)
    assert plan.algorithm == "depthwise" and "opencl/depthwise.cl" in plan.reason
    assert "dw_fwd" in plan.kernel("output").summary and "dw_bwd_weight" in plan.kernel("grad_weight").summary
    assert launched.get("dw_fwd") == 1 and launched.get("dw_bwd_data") == 1 and launched.get("dw_bwd_weight") == 1
    assert not any(launched.get(kn) for kn in ("fwd", "bwd_data", "bwd_weight")), launched


@pytest.mark.parametrize("why,kw,reason", [
    ("channels-last", dict(fmt="channels_last"), "channels_last"),
    ("float16", dict(dtype=torch.float16), "float16"),
    ("1x7", dict(k=(1, 7), padding=(0, 3)), None),  # one filter row: no bands kernel (Note [depthwise bands])
])
def test_depthwise_outside_the_specialised_set_runs_the_generic_kernels(why, kw, reason):
    args = dict(shape=(3, 10, 12), k=(3, 3), padding=1)
    args.update(kw)
    dtype = args.get("dtype", torch.float32)
    x, w, b, p = dw_case(**args)
    plan = opencl_plan(x, w, b, p)
    launched = run_all(plan, x, w, b, p, dtype, DW_KERNELS)
    assert plan.algorithm == "depthwise" and "depthwise.cl" not in plan.reason
    if reason:
        assert reason in plan.reason
    assert launched.get("fwd") == 1 and not launched.get("dw_fwd"), launched


BANDS_EDGES = [  # Note [depthwise bands] (opencl/bands.cl): (id, shape (C, *spatial), kernel, stride, padding, mult, n)
    ("7x7-11x11", (4, 11, 11), (7, 7), 1, 3, 1, 2),
    ("5x5-stride2-phases", (3, 12, 13), (5, 5), 2, 2, 1, 2),  # channels-last only: NCHW 5x5 runs depthwise.cl
    # on a CPU's plan (test_nchw_5x5_runs_bands_on_gpus runs a GPU's)
    ("4x4-even-mult2", (3, 9, 10), (4, 4), 1, 1, 2, 1),  # backward-data: generic (multiplier 2)
    ("13x13-11x11", (2, 11, 11), (13, 13), 1, 6, 1, 2),  # 13 filter rows in steps of 7 (one zero row)
    ("13x13-7x7", (3, 7, 7), (13, 13), 1, 6, 1, 2),  # 7 of 13 columns a work-item (Note [bands columns])
    ("13x13-5x5-pad13", (2, 5, 5), (13, 13), 1, 13, 1, 1),  # clipped forward: edge outputs read no column
    ("13x13-7x7-pad8", (2, 7, 7), (13, 13), 1, 8, 1, 1),  # 11 output rows, 7 input rows: one step for both
    ("7x7-48x48-bands", (2, 48, 48), (7, 7), 1, 3, 1, 3),  # bands of 40 rows; split weight gradient
]


@pytest.mark.parametrize("dt", ["f32", "f64", "bf16", "f16"])
@pytest.mark.parametrize("edge,fmt", [(e, f) for e in BANDS_EDGES for f in ("contiguous", "channels_last")
                                      if e[2] != (5, 5) or f == "channels_last"], ids=lambda v: v if isinstance(v, str)
                         else v[0])
def test_depthwise_bands_kernels(edge, fmt, dt, monkeypatch):
    """Filters with no vectorised program (7x7, 13x13, even) in either layout, and the channels-last 5x5 stride 2
    (four backward-data phases), run bands_fwd/bwd_data/bwd_weight and match float64; where the CUDA set's rule
    takes a direction (multiplier 1 for backward-data), so does this one. The clw kernels, which take the
    channels-last 7x7 and 5x5 (multiplier 1) ahead of bands, are off here (tests/test_opencl_clw.py runs them)."""
    monkeypatch.setattr(clw, "kernels", lambda *a: dict.fromkeys(clw.DIRECTIONS, ""))
    _, shape, k, stride, padding, mult, n = edge
    dtype = {**DTYPES, "f16": torch.float16}[dt]
    x, w, b, p = dw_case(shape, k, stride, padding, mult, n, dtype, fmt=fmt)
    plan = direct_plan(x, w, b, p)
    names = [f"bands_{d}_s{stride}" for d in ("fwd", "bwd_data", "bwd_weight")] + ["bands_finalize", "bwd_data"]
    launched = run_all(plan, x, w, b, p, dtype, names, go_like_y=True)
    assert plan.algorithm == "depthwise" and "bands kernels" in plan.reason, plan.reason
    assert launched.get(f"bands_fwd_s{stride}") == 1 and launched.get(f"bands_bwd_weight_s{stride}") == 1, launched
    assert launched.get(f"bands_bwd_data_s{stride}", 0) == int(mult == 1), launched
    assert launched.get("bwd_data", 0) == int(mult != 1), launched  # conv.cl's generic backward-data
    if shape[1] == 48:  # two bands a plane, 3 samples: units enough for splits on any device here
        assert launched.get("bands_finalize", 0) == 1, launched


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("stride,shape", [(1, (3, 14, 14)), (2, (3, 13, 12))], ids=["s1", "s2"])
def test_nchw_5x5_runs_bands_on_gpus(stride, shape, dt):
    """EfficientNet's contiguous 5x5 depthwise runs the bands kernels ahead of depthwise.cl's on GPUs
    (bands.ahead_of_depthwise): the plan of a device described as a GPU, run on PoCL, in every direction (stride 2:
    backward-data in four phases) against float64."""
    dtype = DTYPES[dt]
    x, w, b, p = dw_case(shape, (5, 5), stride, 2, 1, 2, dtype)
    plan = direct_plan(x, w, b, p, kind="gpu")
    names = [f"bands_{d}_s{stride}" for d in ("fwd", "bwd_data", "bwd_weight")]
    launched = run_all(plan, x, w, b, p, dtype, names + ["dw_fwd", "dw_bwd_data", "dw_bwd_weight"])
    assert "the bands kernels (opencl/bands.cl)" in plan.reason, plan.reason
    assert launched == dict.fromkeys(names, 1), launched


@pytest.mark.parametrize("stride", [1, 2])
def test_bands_planes_past_the_float_division(monkeypatch, stride):
    """Note [staged loads]: where a view has 2**22 planes or more (N K + P > 2**22), the bands forward and
    backward-data stage a plane's image by integer division (pc_dwb_div / bands_div is exact below 2**22 only), in
    the element form (stride 1) and the row form (the stride-2 forward). Two channels-last images (in NCHW a wrong
    image and channel of a plane can still meet its offset) of 2**21 + 20 channels of 2 x 3 with a 2 x 2 filter, the
    clw kernels off, against float64 formed tap by tap (ATen's float64 depthwise takes minutes on these channels)."""
    monkeypatch.setattr(clw, "kernels", lambda *a: dict.fromkeys(clw.DIRECTIONS, ""))
    x, w, b, p = dw_case(((1 << 21) + 20, 2, 3), (2, 2), stride, 0, 1, 2, fmt="channels_last")
    plan = direct_plan(x, w, b, p)
    before = dict(rt.stats)
    y = plan.forward(x, w, b)
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    gx = plan.backward(go, x, w, (True, False, False))[0]
    names = [f"bands_fwd_s{stride}", f"bands_bwd_data_s{stride}"]
    assert launched_since(before, names) == dict.fromkeys(names, 1)
    ry, rgx = depthwise_tap_reference(x, w, b, go, stride)
    check(y, ry, torch.float32, "output", tol(plan, torch.float32))
    check(gx, rgx, torch.float32, "grad_input", tol(plan, torch.float32))


def test_bands_kernel_constants_match_the_host():
    """Note [depthwise bands]: opencl/bands.cl computes the weight gradient's units and the groups' geometry from its
    own constants; they are portconv/dwbands.py's (the CUDA set's test checks cuda/conv_depthwise_bands.cuh)."""
    import pathlib
    import re

    from portconv import dwbands

    src = (pathlib.Path(__file__).resolve().parents[1] / "opencl" / "bands.cl").read_text()
    d = {k: int(v) for k, v in re.findall(r"#define (BANDS_\w+) +(\d+)", src)}
    assert (d["BANDS_THREADS"], d["BANDS_U"], d["BANDS_ROWS"], d["BANDS_MAX"]) == (
        dwbands.THREADS, dwbands.DWB_U, dwbands.DWB_ROWS, dwbands.DWB_MAX_BYTES)


DW_CL_EDGES = [  # Note [channels-last depthwise]: (id, shape (C, *spatial), kernel, stride, padding, batch)
    ("c16-w13", (16, 9, 13), (3, 3), 1, 1, 2),
    ("c8-2x3-image-pad2", (8, 2, 3), (3, 3), 1, 2, 2),
    ("c16-stride2-pad0-w20", (16, 9, 20), (3, 3), 2, 0, 1),
    ("c8-stride2-odd-w11", (8, 7, 11), (3, 3), 2, 1, 2),
    ("c24-5x5-stride2-pad2", (24, 12, 9), (5, 5), 2, 2, 1),
    ("c8-3d-3x3x3", (8, 5, 6, 7), (3, 3, 3), 1, 1, 2),
    ("c16-3d-stride2-pad2", (16, 6, 7, 9), (3, 3, 3), 2, 2, 1),
    ("c8-w37-several-w-blocks", (8, 5, 37), (3, 3), 1, 1, 1),  # 16 W positions per CPU work-item: 16 + 16 + 5
]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("edge", DW_CL_EDGES, ids=lambda e: e[0])
def test_depthwise_channels_last_kernels(edge, dt, split, monkeypatch):
    """Note [channels-last depthwise]: channels-last depthwise problems (channels in whole vectors) run dw_cl_fwd,
    dw_cl_bwd_data and dw_cl_bwd_weight (in one pass, or split over positions with dw_finalize), and match float64."""
    monkeypatch.setattr(depthwise, "dw_cl_splits", lambda *a: 3 if split else 1)
    _, shape, k, stride, padding, n = edge
    dtype = DTYPES[dt]
    x, w, b, p = dw_case(shape, k, stride, padding, 1, n, dtype, fmt="channels_last")
    # float64 3-D: ATen's CPU route returns contiguous results, and so does the plan (Note [own kernels' result
    # layout]); the kernels are run here in channels_last_3d all the same
    fmt = "channels_last" if len(shape) == 3 else "channels_last_3d"
    assert direct_plan(x, w, b, p).memory_format == ("contiguous" if (dt, len(shape)) == ("f64", 4) else fmt)
    plan = direct_plan(x, w, b, p, fmt=fmt)
    launched = run_all(plan, x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
    assert plan.algorithm == "depthwise" and "dw_cl_fwd" in plan.kernel("output").summary, lines(plan, "output")
    assert launched.get("dw_cl_fwd") == 1 and launched.get("dw_cl_bwd_data") == 1, launched
    assert not any(launched.get(kn) for kn in ("fwd", "bwd_data")), launched
    assert launched.get("dw_cl_bwd_weight") == 1 and launched.get("dw_finalize", 0) == int(split), launched
    assert not launched.get("bwd_weight"), launched


def test_depthwise_channels_last_kernels_only_where_they_apply():
    """Channel counts off the vector width (12 in float32, vectors of 8; float64's 4 divide it), a channel
    multiplier of 2, and a contiguous grad_output (its direction) keep the generic kernels."""
    for shape, mult, dtype, cl in (((12, 6, 7), 1, torch.float32, False), ((12, 6, 7), 1, torch.float64, True),
                                   ((8, 6, 7), 2, torch.float32, False)):
        x, w, b, p = dw_case(shape, (3, 3), 1, 1, mult, 2, dtype, fmt="channels_last")
        launched = run_all(opencl_plan(x, w, b, p), x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
        assert bool(launched.get("dw_cl_fwd")) == cl and bool(launched.get("fwd")) != cl, (shape, mult, launched)
    x, w, b, p = dw_case((16, 6, 7), (3, 3), fmt="channels_last")
    plan = opencl_plan(x, w, b, p)
    go = torch.randn(p.output_shape(x.shape, w.shape))  # contiguous (NCHW), not channels-last
    before = dict(rt.stats)
    got = plan.backward(go, x, w, (True, True, False))
    _, gi, gw, _ = reference(x, w, b, p, go)
    check(got[0], gi, torch.float32, "grad_input")
    check(got[1], gw, torch.float32, "grad_weight")
    ran = launched_since(before, CL_KERNELS)
    assert ran.get("bwd_data") == 1 and ran.get("bwd_weight") == 1 and not ran.get("dw_cl_bwd_data"), ran


def test_depthwise_channels_last_gpu_settings_run_here(monkeypatch):
    """The GPU settings of the channels-last kernels (vloadn or DW_CLA's aligned vectors, 8x4x4 work-groups, a
    grad-weight of 8 channel blocks x 32 position lanes in a local tree) run, and match, on this device: one split
    and several (partials added by dw_finalize). Their table is test_opencl_select's."""
    for dtype, n, size, ch in ((torch.bfloat16, 2, (9, 13), 16), (torch.float32, 2, (9, 13), 72),
                               (torch.bfloat16, 64, (40, 40), 8)):
        # 16 and 72 channels (2 and 9 blocks: work-groups of 8 blocks partly past C), 2 x 5 x 7 outputs: one split;
        # 64 x 20 x 20 outputs: several splits
        x, w, b, p = dw_case((ch, *size), (3, 3), 2, 1, 1, n, dtype, fmt="channels_last")
        plan = direct_plan(x, w, b, p, kind="gpu")
        assert dict(plan.kernel("output").launches[0].module.defines).get("DW_CLA") == ""  # uploads are aligned
        launched = run_all(plan, x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
        assert launched.get("dw_cl_fwd") == 1 and launched.get("dw_cl_bwd_data") == 1, launched
        assert launched.get("dw_cl_bwd_weight") == 1 and not launched.get("bwd_weight"), launched
        assert launched.get("dw_finalize") == (1 if n == 64 else None), launched


def test_depthwise_dilated_and_transposed_run_the_generic_kernels():
    x, w, b, _ = dw_case((3, 10, 12), (3, 3))
    for p in (ConvParams.make(2, 1, 2, 2, False, 0, 3, weight_shape=w.shape),
              ConvParams.make(2, 2, 1, 1, True, 1, 3, weight_shape=w.shape)):
        plan = opencl_plan(x, w, b, p)
        launched = run_all(plan, x, w, b, p, torch.float32)
        assert "depthwise.cl" not in plan.reason and not any(k.startswith("dw_") for k in launched), launched


def test_depthwise_w_strided_tensors_take_the_generic_kernels_per_layout():
    x, w, b, p = dw_case((3, 9, 11), (3, 3), fmt="w_strided")
    launched = run_all(opencl_plan(x, w, b, p), x, w, b, p, torch.float32)
    assert launched.get("fwd") == 1 and launched.get("bwd_weight") == 1 and not launched.get("dw_fwd")
    assert launched.get("dw_bwd_data") == 1  # grad_output and grad_input are dense: that direction stays vectorised


@pytest.mark.parametrize("variant", ["gpu-settings", "split-reduction", "idx64"])
def test_depthwise_variants(variant, monkeypatch):
    """The GPU settings (vloadn/vstoren, 4 wide, no DW_CPU), the split grad-weight reduction with its finalize kernel,
    and the 64-bit index build, all on this device."""
    fields, options = {}, NO_TC
    if variant == "gpu-settings":
        fields = dict(kind="gpu")
    elif variant == "split-reduction":
        monkeypatch.setattr(depthwise, "dw_splits", lambda *a: 3)
    else:
        options = Options(opencl_tc="off", index64=True)
        monkeypatch.setattr(depthwise, "dw_splits", lambda *a: 1)  # the single-pass grad-weight in the 64-bit build
    for shape, k, stride, mult, dt in (((3, 13, 21), (3, 3), 1, 1, torch.float32),
                                       ((2, 9, 19), (3, 3), 2, 2, torch.float64),
                                       ((2, 4, 6, 11), (3, 3, 3), 1, 1, torch.float32),
                                       ((3, 9, 14), (3, 3), 2, 1, torch.bfloat16)):
        x, w, b, p = dw_case(shape, k, stride, 1, mult, 2, dt)
        plan = direct_plan(x, w, b, p, options, **fields)
        mod = dict(plan.kernel("output").launches[0].module.defines)
        assert ("DW_CPU" in mod) == (variant != "gpu-settings") and ("IDX64" in mod) == (variant == "idx64")
        launched = run_all(plan, x, w, b, p, dt)
        assert launched.get("dw_fwd") == 1 and launched.get("dw_bwd_weight") == 1
        assert launched.get("dw_finalize", 0) == (1 if variant == "split-reduction" else 0)


def test_depthwise_grad_weight_is_deterministic(monkeypatch):
    x, w, b, p = dw_case((4, 30, 45), (3, 3), n=3)
    # fixed data, like x and w: split and unsplit sums of 4050 products differ by reordering (~5e-5 absolute here,
    # within rtol of these elements); unseeded draws put such a difference on an element near 0 about 1 run in 5
    go = torch.randn(p.output_shape(x.shape, w.shape), generator=torch.Generator().manual_seed(1))
    plan = direct_plan(x, w, b, p)
    first = plan.backward(go, x, w, (False, True, False))[1]
    assert torch.equal(first, plan.backward(go, x, w, (False, True, False))[1])
    monkeypatch.setattr(depthwise, "dw_splits", lambda *a: 5)
    plan = direct_plan(x, w, b, p)  # a new plan: the splits are its decision
    assert "5 splits of" in lines(plan, "grad_weight")
    split = plan.backward(go, x, w, (False, True, False))[1]
    assert torch.equal(split, plan.backward(go, x, w, (False, True, False))[1])
    torch.testing.assert_close(split, first, rtol=1e-5, atol=1e-5)


# --- calls on pyopencl arrays (Note [OpenCL replay], Note [programs]) ---------------------------------------------

def _device():
    return next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())


def _views(q, tensors, gap=3):
    """pyopencl arrays viewing one buffer, each at its own (unaligned) element offset, like the bench's sets."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    offsets, at = [], gap
    for t in tensors:
        offsets.append(at)
        at += t.numel() + gap
    host = np.zeros(at, np.dtype(str(tensors[0].dtype).removeprefix("torch.")))
    for t, o in zip(tensors, offsets):
        host[o:o + t.numel()] = t.contiguous().reshape(-1).numpy()
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    item = host.dtype.itemsize
    return [cla.Array(q, tuple(t.shape), host.dtype, data=buf, offset=o * item,
                      strides=tuple(item * s for s in t.contiguous().stride())) for t, o in zip(tensors, offsets)]


def _to_torch(a):
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(a.get()))


def _queue():
    import pyopencl as cl

    return cl.CommandQueue(cl.Context([_device()]))


@pytest.mark.parametrize("case", [
    ("dw-3x3", (3, 13, 21), (3, 3), 1, 1, torch.float32, True),
    ("dw-s2-nobias", (2, 9, 19), (3, 3), 2, 2, torch.float64, False),
    ("dw-3d", (2, 4, 6, 11), (3, 3, 3), 1, 1, torch.float32, True),
    ("dense-generic", None, None, None, None, torch.float32, True),
    ("dense-igemm-split", 17, None, None, None, torch.float32, True),
], ids=lambda c: c[0])
def test_calls_on_array_views_match_torch_tensors(case):
    """Calls on pyopencl arrays that view one buffer at other offsets: every backward mask, the same launch counts on
    every set, the same bits as the same plan on torch tensors; once each layout is loaded nothing is built or
    loaded again (offsets are patched into the descriptor)."""
    _, shape, k, stride, mult, dtype, with_bias = case
    if shape is None or type(shape) is int:
        x, w, b, p = make(CASES[6 if shape is None else shape], dtype, "contiguous")
    else:
        x, w, b, p = dw_case(shape, k, stride, 1, mult, 2, dtype)
    b = b if with_bias else None
    q = _queue()
    go = torch.randn(p.output_shape(x.shape, w.shape), dtype=dtype)
    ry, *refs = reference(x, w, b, p, go)
    sets = [_views(q, [t for t in (x, w, b, go) if t is not None], gap=3 + i) for i in range(3)]
    for s in sets:
        if b is None:
            s.insert(2, None)
    xa, wa, ba, _ = sets[0]
    plan = portconv.plan(xa, wa, ba, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups,
                         backend="opencl")
    masks = [(True, False, False), (False, True, False), (True, True, True)]
    first = None
    for i, (xa, wa, ba, ga) in enumerate(sets * 2):
        if i == len(sets):
            loaded, built = rt.stats["programs_loaded"], rt.stats["programs_built"]
        before = dict(rt.stats)
        y = plan.forward(xa, wa, ba)
        got = [plan.backward(ga, xa, wa, m) for m in masks]
        launched = launched_since(before)
        outs = [_to_torch(y)] + [None if o is None else _to_torch(o) for r in got for o in r]
        if first is None:
            first, first_launched = outs, launched
        else:
            assert launched == first_launched, i
            for a, r in zip(outs, first):
                assert (a is None) == (r is None) and (a is None or torch.equal(a, r)), i
    assert (rt.stats["programs_loaded"], rt.stats["programs_built"]) == (loaded, built)
    check(first[0], ry, dtype, "output")
    check(first[1], refs[0], dtype, "grad_input")
    check(first[5], refs[1], dtype, "grad_weight")
    if b is not None:
        check(first[9], refs[2], dtype, "grad_bias")
    tplan = opencl_plan(x, w, b, p)
    tout = [tplan.forward(x, w, b)] + [o for m in masks for o in tplan.backward(go, x, w, m)]
    for a, r in zip(tout, first):
        assert (a is None) == (r is None) and (a is None or torch.equal(a, r))


def test_array_calls_split_reduction_poison_and_other_layouts(monkeypatch):
    """A split grad-weight (workspace + dw_finalize) on array views under PORTCONV_POISON, loaded once; other strides
    and the 64-bit index build are other programs, and stay correct."""
    import pyopencl.array as cla

    monkeypatch.setattr(depthwise, "dw_splits", lambda *a: 3)
    x, w, b, p = dw_case((3, 10, 17), (3, 3), n=2)
    q = _queue()
    go = torch.randn(p.output_shape(x.shape, w.shape))
    _, _, rgw, _ = reference(x, w, b, p, go)
    xa, wa, ba, ga = _views(q, [x, w, b, go])
    plan = direct_plan(xa, wa, ba, p)
    mask = (False, True, False)
    loaded = rt.stats["programs_loaded"]
    for _ in range(3):
        before = rt.stats["dw_finalize"]
        check(_to_torch(plan.backward(ga, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight")
        assert rt.stats["dw_finalize"] == before + 1
    assert rt.stats["programs_loaded"] == loaded + 1
    # grad_output with other strides (a transposed copy viewed back): another layout, another program
    gt = cla.to_device(q, go.transpose(2, 3).contiguous().numpy()).transpose((0, 1, 3, 2))
    check(_to_torch(plan.backward(gt, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight (other strides)")
    assert rt.stats["programs_loaded"] == loaded + 2
    plan64 = direct_plan(xa, wa, ba, p, Options(opencl_tc="off", index64=True))
    check(_to_torch(plan64.backward(ga, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight (idx64)")
    assert ("IDX64", "") in plan64.kernel("grad_weight").launches[0].module.defines


def test_arrays_of_another_context_on_the_same_device():
    """One plan serves pyopencl arrays of any context on its device: kernels are looked up per context, results are
    arrays of the caller's context and queue."""
    x, w, b, p = dw_case((4, 12, 16), (3, 3), n=1)
    ref = reference(x, w, b, p, None)[0]
    q1, q2 = _queue(), _queue()
    a1 = [_views(q1, [t])[0] for t in (x, w, b)]
    plan = portconv.plan(*a1, padding=1, groups=4, backend="opencl")
    for q in (q1, q2, q1):
        arrays = [_views(q, [t])[0] for t in (x, w, b)]
        y = plan.forward(*arrays)
        assert y.context == q.context and y.queue == q
        check(_to_torch(y), ref, torch.float32, "output")
    mixed = [_views(q1, [x])[0], _views(q2, [w])[0], None]
    with pytest.raises(portconv.Unsupported, match="different OpenCL contexts"):
        plan.forward(*mixed)


def test_fast_path_on_pyopencl_arrays(monkeypatch):
    """Note [fast path] on pyopencl arrays: a repeated portconv.conv2d (batched or not) skips validation and planning
    and runs the same plan; bad input after a cached call still gets PyTorch's error before any kernel runs; another
    dtype gets its own entry."""
    import numpy as np
    import pyopencl.array as cla

    from portconv import fastpath, planner
    from portconv.backends.program import ProgramRunner

    x, w, b, p = dw_case((4, 12, 16), (3, 3), n=2)
    q = _queue()
    xa, wa, ba = (cla.to_device(q, t.numpy()) for t in (x, w, b))
    kw = dict(padding=1, groups=4, backend="opencl")
    ref = reference(x, w, b, p, None)[0]
    first = portconv.conv2d(xa, wa, ba, **kw), portconv.conv2d(xa[0], wa, ba, **kw)
    key = fastpath.key("conv2d", xa, wa, ba, (1, 1, 1, 4, 0), "opencl")
    assert key is not None and key in fastpath._entries

    def again(*a, **k):
        raise AssertionError("validated and planned again")

    with monkeypatch.context() as m:  # (undo() would also drop the autouse fixture's settings, part of the key)
        m.setattr(planner, "make_problem", again)
        m.setattr(planner, "select", again)
        for _ in range(2):
            y, y0 = portconv.conv2d(xa, wa, ba, **kw), portconv.conv2d(xa[0], wa, ba, **kw)
            check(_to_torch(y), ref, torch.float32, "cached output")
            check(_to_torch(y0), ref[0], torch.float32, "cached unbatched output")
    assert torch.equal(_to_torch(first[0]), _to_torch(y)) and torch.equal(_to_torch(first[1]), _to_torch(y0))
    ran = []
    monkeypatch.setattr(ProgramRunner, "forward", lambda *a, **k: ran.append(a))
    bad = {"channels": (x[:, :3].contiguous(), w, b), "bias dtype": (x, w, b.double()),
           "input dtype, same strides": (x.int(), w, b)}
    for what, ts in bad.items():
        with pytest.raises(RuntimeError) as want:
            F.conv2d(*ts, padding=1, groups=4)
        arrays = [cla.to_device(q, t.numpy()) for t in ts]
        for _ in range(2):  # never cached: checked again each time
            with pytest.raises(RuntimeError) as got:
                portconv.conv2d(*arrays, **kw)
            assert str(got.value) == str(want.value), what
    assert ran == []  # the checks came before any kernel
    assert fastpath.key("conv2d", xa.astype(np.float64), wa, ba, (1, 1, 1, 4, 0), "opencl") != key
    assert fastpath.key("conv2d", xa, wa, ba, (1.0, 1, 1, 4, 0), "opencl") is None


def test_calls_wait_for_the_arrays_events():
    """An input written by a command still queued on another queue: the launch waits for its event."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    x, w, b, p = dw_case((4, 12, 16), (3, 3), n=1)
    ctx = cl.Context([_device()])
    q1, q2 = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    xa, wa, ba = (cla.to_device(q1, t.numpy()) for t in (x, w, b))
    plan = portconv.plan(xa, wa, ba, stride=1, padding=1, groups=4, backend="opencl")
    plan.forward(xa, wa, ba)
    q1.finish()
    x2 = torch.randn(x.shape)
    xb = cla.empty(q2, x.shape, np.float32)
    gate = cl.UserEvent(ctx)
    xb.add_event(cl.enqueue_copy(q2, xb.base_data, x2.numpy(), wait_for=[gate], is_blocking=False))
    xb = xb.with_queue(q1)
    y = plan.forward(xb, wa, ba)
    gate.set_status(cl.command_execution_status.COMPLETE)
    check(_to_torch(y), reference(x2, w, b, p, None)[0], torch.float32, "output after the copy")


