"""The opencl backend's decisions as tables: (problem, device, options, layouts) -> Choice and KernelPlans, on a CPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from portconv.backends.opencl import clw, depthwise, igemm
from portconv.backends.opencl.kernels import SLOT, Operand
from portconv.backends.opencl.select import (
    BANDS_AHEAD_OF_DW,
    CLW_AHEAD_OF_BANDS,
    CLW_AHEAD_OF_DW_CL,
    Facts,
    build,
    choose,
    implied_layouts,
    tc_mode,
)
from portconv.conformance import cases as C
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.knobs import DEFAULT_OPTIONS, Options
from portconv.params import ConvParams
from portconv.problem import ConvView, Layout, Problem
from portconv.rules import TorchContext, conv_tf32
from portconv.tensors import TensorSpec, dense_strides

POCL = DeviceInfo(vendor="pocl", kind="cpu", name="pthread-cpu", arch="x86_64", runtime="opencl", compute_units=2,
                  local_mem_bytes=1 << 20, max_work_group=4096, index="opencl:0:0")
H100 = DeviceInfo(vendor="nvidia", kind="gpu", name="NVIDIA H100", arch="sm_90", runtime="opencl", wavefront=32,
                  compute_units=132, local_mem_bytes=48 << 10, max_work_group=1024, fp16=True, index="opencl:1:0")
MI250 = DeviceInfo(vendor="amd", kind="gpu", name="gfx90a", arch="gfx90a", runtime="opencl", wavefront=64,
                   compute_units=104, local_mem_bytes=64 << 10, max_work_group=256, fp16=True, index="opencl:2:0")
TF32_ON, TF32_OFF = (True, "conv.fp32_precision = 'tf32'"), (False, "conv.fp32_precision = 'ieee'")
WIDTH = 105  # explain() prints each line after a 13-column label within 120 columns


def spec(shape, fmt="contiguous", dtype="float32", kind="torch") -> TensorSpec:
    return TensorSpec(tuple(shape), dense_strides(shape, fmt), dtype, "cpu" if kind == "torch" else "opencl",
                      None if kind == "torch" else 0, kind)


def problem(x, w, stride=1, padding=0, dilation=1, groups=1, transposed=False, output_padding=0, bias=True,
            fmt="contiguous", dtype="float32", kind="torch") -> Problem:
    p = ConvParams.make(len(x) - 2, stride, padding, dilation, transposed, output_padding, groups, weight_shape=w)
    return Problem(p, spec(x, fmt, dtype, kind), spec(w, "contiguous", dtype, kind), bias)


def plans(pr: Problem, device: DeviceInfo, options: Options = DEFAULT_OPTIONS, tf32=TF32_ON, limits=None, fwd=None,
          bwd=None, mask=None):
    """(Choice, {result: KernelPlan}) of a forward and a backward call on the implied (or given) layouts; torch
    problems take the default TorchContext (a CPU build of torch 2.13 with oneDNN) for the result-layout rule."""
    facts = Facts(TorchContext() if pr.input.kind == "torch" else None, tf32)
    choice = choose(pr, device, options, facts)
    f, b = implied_layouts(pr, choice.memory_format)
    mask = mask or (True, True, pr.has_bias)
    ks = build(pr, device, options, choice, "forward", (), fwd or f, limits) + \
        build(pr, device, options, choice, "backward", mask, bwd or b, limits)
    return choice, {k.result: k for k in ks}


def launches(k):
    return [(x.kernel, x.grid, x.block) for x in k.launches]


def defines(k, i=0) -> dict:
    return dict(k.launches[i].module.defines)


DENSE = problem((2, 8, 16, 16), (16, 8, 3, 3), padding=1)
DW = problem((2, 16, 14, 14), (16, 1, 3, 3), padding=1, groups=16)
DW_CL = problem((2, 16, 9, 13), (16, 1, 3, 3), padding=1, groups=16, fmt="channels_last", dtype="bfloat16",
                kind="pyopencl")
X_WSTRIDED = Layout((2, 16, 14, 14), (16 * 14 * 28, 14 * 28, 28, 2))
DW_CLW = problem((2, 96, 14, 14), (96, 1, 7, 7), padding=3, groups=96, fmt="channels_last")  # Note [depthwise clw]

# (id, problem, device, options, tf32, fwd layouts or None) -> (algorithm, memory format, math,
#   {result: [(kernel, grid, block), ...]}, {result: defines of its first launch that must hold})
TABLE = [
    ("dense-pocl", DENSE, POCL, Options(), TF32_ON, None, ("igemm", "contiguous", "ieee", {
        "output": [("igemm_fwd", (256, 1, 1), (32, 1, 1))],  # narrow 64x16 tile: 16 output channels
        "grad_input": [("igemm_bwd_data", (256, 1, 1), (32, 1, 1))],
        "grad_weight": [("igemm_bwd_weight", (32, 2, 4), (32, 1, 1)), ("igemm_finalize", (1152,), (16,))],
        "grad_bias": [("conv_bias_grad", (1024,), (64,))]},
        {"output": {"IG_BM": "64", "IG_BN": "16", "IG_CPU": ""}, "grad_weight": {"IG_BM": "16", "IG_BN": "64"}})),
    ("dense-h100-tf32", DENSE, H100, Options(), TF32_ON, None, ("igemm-tc", "contiguous", "tf32", {
        "output": [("igemm_fwd", (512, 1, 1), (128, 1, 1))],  # TC_NARROW 128x16
        "grad_input": [("igemm_bwd_data", (512, 1, 1), (128, 1, 1))],
        "grad_weight": [("igemm_bwd_weight", (128, 1, 1), (128, 1, 1))]},
        {"output": {"IG_MMA_PTX": "", "IG_TC": "1", "IG_BM": "128", "IG_BN": "16"},
         "grad_input": {"IG_MFAST": "", "IG_TAPMAJOR": "1", "IG_BN": "8"},
         "grad_weight": {"IG_BK": "32", "IG_BM": "16", "IG_BN": "128"}})),
    ("dense-h100-ieee", DENSE, H100, Options(), TF32_OFF, None, ("igemm", "contiguous", "ieee", {
        "output": [("igemm_fwd", (512, 1, 1), (128, 1, 1))],
        "grad_weight": [("igemm_bwd_weight", (128, 1, 4), (128, 1, 1)), ("igemm_finalize", (1152,), (64,))]},
        {"output": {"IG_BM": "128", "IG_BN": "16", "IG_TM": "8", "IG_TN": "2"}})),
    ("dense-mi250", DENSE, MI250, Options(), TF32_ON, None, ("igemm", "contiguous", "ieee", {
        "output": [("igemm_fwd", (512, 1, 1), (128, 1, 1))]}, {"output": {"IG_BM": "128"}})),
    ("wide-bf16-h100", problem((2, 64, 14, 14), (128, 64, 3, 3), padding=1, dtype="bfloat16"), H100, Options(),
     TF32_OFF, None, ("igemm-tc", "contiguous", "fp32-accumulate", {
         "output": [("igemm_fwd", (1024, 2, 1), (256, 1, 1))],
         "grad_weight": [("igemm_bwd_weight", (256, 5, 1), (256, 1, 1))]},  # TC_TILE_WEIGHT 128x128, one split
         {"output": {"IG_BM": "128", "IG_BN": "64", "IG_WM": "4", "IG_WN": "2", "DTYPE_BF16": ""},
          "grad_weight": {"IG_BM": "128", "IG_BN": "128", "IG_BK": "32"}})),
    ("pointwise-f16-h100", problem((2, 32, 56, 56), (64, 32, 1, 1), dtype="float16"), H100, Options(), TF32_ON,
     None, ("igemm-tc", "contiguous", "fp32-accumulate", {
         "output": [("igemm_fwd", (12544, 1, 1), (256, 1, 1))],
         "grad_weight": [("igemm_bwd_weight", (256, 1, 12), (256, 1, 1)), ("igemm_finalize", (2048,), (64,))]},
         {"output": {"IG_MFAST": "", "IG_TAPMAJOR": "1"}, "grad_weight": {"IG_BM": "64"}})),  # TC_WEIGHT_ROWS64
    ("portable-pocl", problem((2, 24, 10, 9), (40, 24, 3, 3), stride=2, padding=1), POCL,
     Options(opencl_tc="portable"), TF32_OFF, None, ("igemm-tc", "contiguous", "tf32", {
         "output": [("igemm_fwd", (256, 1, 1), (256, 1, 1))],
         "grad_input": [("igemm_bwd_data", (256, 1, 4), (256, 1, 1))]},
         {"output": {"IG_TC": "1", "IG_CPU": ""}})),
    ("float64-h100", problem((3, 7, 53), (9, 7, 5), stride=2, padding=2, dtype="float64"), H100, Options(),
     TF32_ON, None, ("igemm", "contiguous", "ieee", {
         "grad_input": [("igemm_bwd_data", (128, 1, 2), (128, 1, 1))],
         "grad_bias": [("conv_bias_grad", (576,), (64,))]}, {"output": {"DTYPE_F64": ""}})),
    ("direct-h100", DENSE, H100, Options(opencl_dense="direct"), TF32_ON, None, ("direct", "contiguous", "ieee", {
        "output": [("conv_fwd", (8192,), (64,))], "grad_input": [("conv_bwd_data", (4096,), (64,))],
        "grad_weight": [("conv_bwd_weight", (73728,), (64,))]}, {"output": {"DTYPE_F32": ""}})),
    ("strided-dilated-pocl", problem((2, 4, 13, 12), (6, 4, 3, 3), stride=2, padding=2, dilation=2, bias=False),
     POCL, Options(), TF32_ON, None, ("igemm", "contiguous", "ieee", {
         "output": [("igemm_fwd", (64, 1, 1), (32, 1, 1))],
         "grad_input": [("conv_bwd_data", (1280,), (64,))]}, {})),  # no phases: the direct kernel
    ("transposed-pocl", problem((2, 8, 5, 5), (8, 4, 3, 3), stride=2, padding=1, output_padding=1,
                                transposed=True), POCL, Options(), TF32_ON, None, ("igemm-transposed", "contiguous",
                                                                                   "ieee", {
         "output": [("igemm_bwd_data", (32, 1, 4), (32, 1, 1))], "grad_input": [("igemm_fwd", (32, 1, 1), (32, 1, 1))],
         "grad_bias": [("conv_bias_grad", (256,), (64,))]}, {})),
    ("depthwise-pocl", DW, POCL, Options(), TF32_ON, None, ("depthwise", "contiguous", "ieee", {
        "output": [("dw_fwd", (2, 2, 32), (2, 2, 2))], "grad_input": [("dw_bwd_data", (2, 2, 32), (2, 2, 2))],
        "grad_weight": [("dw_bwd_weight", (1, 16), (1, 1))],
        "grad_bias": [("depthwise_bias_grad", (1024,), (64,))]},
        {"output": {"DW_VW": "8", "DW_RB": "4", "DW_NB": "2", "DW_CPU": "", "DW_K1": "3"}})),
    ("depthwise-w-strided-pocl", DW, POCL, Options(), TF32_ON,
     (X_WSTRIDED, Layout((16, 1, 3, 3), (9, 9, 3, 1)), Layout((16,), (1,))), ("depthwise", "contiguous", "ieee", {
         "output": [("depthwise_fwd", (6272,), (64,))]}, {"output": {"DEPTHWISE": ""}})),
    ("depthwise-cl-h100", DW_CL, H100, Options(), TF32_ON, None, ("depthwise", "channels_last", "fp32-accumulate", {
        "output": [("dw_cl_fwd", (8, 4, 20), (8, 4, 4))], "grad_input": [("dw_cl_bwd_data", (8, 4, 20), (8, 4, 4))],
        "grad_weight": [("dw_cl_bwd_weight", (8, 32), (8, 32))]},
        {"output": {"DW_CL": "", "DW_CLA": "", "DW_CLB": "8", "DW_CLR": "32", "DW_CLW": "4"}})),
    ("depthwise-cl-pocl", DW_CL, POCL, Options(), TF32_ON, None, ("depthwise", "channels_last", "fp32-accumulate", {
        "output": [("dw_cl_fwd", (2, 2, 18), (2, 2, 2))],
        "grad_weight": [("dw_cl_bwd_weight", (2, 4), (1, 1)), ("dw_finalize", (144,), (16,))]},
        {"output": {"DW_CL": "", "DW_CLW": "16", "DW_CPU": ""}})),
    # Note [depthwise clw]: float32 4x4 outputs an item, 48 channel groups of 2 in tiles of 32; the weight gradient's
    # (n, row, 8 columns) units: 56 in 4 splits on 2 compute units
    ("depthwise-clw-pocl", DW_CLW, POCL, Options(), TF32_ON, None, ("depthwise", "channels_last", "ieee", {
        "output": [("clw_fwd_s1", (1024, 2), (256, 1))], "grad_input": [("clw_bwd_data_s1", (1024, 2), (256, 1))],
        "grad_weight": [("clw_bwd_weight_s1", (1024, 2), (256, 1)), ("clw_finalize", (4736,), (64,))],
        "grad_bias": [("depthwise_bias_grad", (6144,), (64,))]},
        {"output": {"CLW_R1": "7", "CLW_R2": "7", "CLW_TH": "4", "CLW_VW": "4", "CLW_VWW": "8", "DTYPE_F32": ""}})),
    # bfloat16 1x8 an item, 24 groups of 4 in one tile; 28 units of 16 columns, a split each on 132 compute units
    ("depthwise-clw-h100", dataclasses.replace(DW_CLW, input=spec((2, 96, 14, 14), "channels_last", "bfloat16",
                                                                   "pyopencl"),
                                               weight=spec((96, 1, 7, 7), dtype="bfloat16", kind="pyopencl")),
     H100, Options(), TF32_ON, None, ("depthwise", "channels_last", "fp32-accumulate", {
         "output": [("clw_fwd_s1", (1536, 1), (256, 1))], "grad_input": [("clw_bwd_data_s1", (1536, 1), (256, 1))],
         "grad_weight": [("clw_bwd_weight_s1", (7168, 1), (256, 1)), ("clw_finalize", (4736,), (64,))]},
         {"output": {"CLW_TH": "1", "CLW_VW": "8", "CLW_VWW": "16", "DTYPE_BF16": ""}})),
]


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r[0])
def test_selection_table(row):
    name, pr, device, options, tf32, fwd, (alg, fmt, math_, want, want_defines) = row
    choice, ks = plans(pr, device, options, tf32, fwd=fwd)
    assert (choice.algorithm, choice.memory_format, choice.math) == (alg, fmt, math_)
    for result, expect in want.items():
        assert launches(ks[result]) == expect, (result, launches(ks[result]))
    for result, d in want_defines.items():
        got = defines(ks[result])
        assert {k: got.get(k) for k in d} == d, (result, got)
    for k in ks.values():
        for line in k.lines():
            assert len(line) <= WIDTH, line
        for x in k.launches:  # 32-bit indices everywhere here; the grid a multiple of the work-group
            assert ("IDX64", "") not in x.module.defines
            assert all(g % b == 0 for g, b in zip(x.grid, x.block))
    if name.startswith("depthwise-cl-") and device.kind == "gpu":
        assert "DW_CPU" not in defines(ks["output"])
        assert "8 channel blocks x 32 position lanes" in ks["grad_weight"].summary


def _clw_case(k, fmt="channels_last", dtype="float32", c=12, stride=1, dilation=1, mult=1):
    return problem((2, c, 13, 13), (c * mult, 1, *k), stride=stride, padding=tuple(r // 2 for r in k),
                   dilation=dilation, groups=c, fmt=fmt, dtype=dtype)


# Note [depthwise clw]: (id, problem, device) -> (the first kernel of output, grad_input, grad_weight; a reason part)
CLW_RULE = [
    ("7x7-cl", _clw_case((7, 7)), POCL, ("clw_fwd_s1", "clw_bwd_data_s1", "clw_bwd_weight_s1"),
     "depthwise, channel multiplier 1: the clw kernels (opencl/clw.cl, Note [depthwise clw])"),
    ("2x9-cl-float64", _clw_case((2, 9), dtype="float64"), POCL,
     ("clw_fwd_s1", "clw_bwd_data_s1", "clw_bwd_weight_s1"), "vectorised kernels not used: results channels_last"),
    ("9x9-cl-float16", _clw_case((9, 9), dtype="float16"), H100, ("clw_fwd_s1", "clw_bwd_data_s1",
                                                                   "clw_bwd_weight_s1"), "Note [depthwise clw]"),
    ("5x5-cl-stride2", _clw_case((5, 5), stride=2), POCL, ("clw_fwd_s2", "clw_bwd_data_s2", "clw_bwd_weight_s2"),
     "the clw kernels (opencl/clw.cl, Note [depthwise clw])"),  # the backward-data by phases
    ("4x4-cl-stride2-multiplier2", _clw_case((4, 4), stride=2, mult=2), POCL,
     ("bands_fwd_s2", "depthwise_bwd_data", "bands_bwd_weight_s2"), "the bands kernels"),  # multiplier 2: not clw
    ("7x7-nchw", _clw_case((7, 7), fmt="contiguous"), POCL, ("bands_fwd_s1", "bands_bwd_data_s1",
                                                              "bands_bwd_weight_s1"), "the bands kernels"),
    ("13x13-cl", _clw_case((13, 13)), POCL, ("bands_fwd_s1", "bands_bwd_data_s1", "bands_bwd_weight_s1"),
     "the bands kernels"),
    ("3x3-cl", _clw_case((3, 3), c=16), POCL, ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight"),
     "channels-last kernels (opencl/depthwise.cl)"),
    ("5x5-cl-c16", _clw_case((5, 5), c=16), POCL, ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight"),
     "channels-last kernels (opencl/depthwise.cl)"),  # depthwise.cl's program first, as before clw
    # on a GPU clw runs ahead of depthwise.cl in the directions it takes (CLW_AHEAD_OF_DW_CL); depthwise.cl keeps the
    # stride-2 backward-data
    ("5x5-cl-c16-h100", _clw_case((5, 5), c=16), H100, ("clw_fwd_s1", "clw_bwd_data_s1", "clw_bwd_weight_s1"),
     "the clw kernels (opencl/clw.cl, Note [depthwise clw]), else channels-last kernels (opencl/depthwise.cl)"),
    ("5x5-cl-c16-stride2-h100", _clw_case((5, 5), c=16, stride=2), H100,
     ("clw_fwd_s2", "clw_bwd_data_s2", "clw_bwd_weight_s2"), "Note [depthwise clw]), else channels-last kernels"),
    ("3x3-cl-h100", _clw_case((3, 3), c=16), H100, ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight"),
     "channels-last kernels (opencl/depthwise.cl) where the layouts allow"),  # 3 taps: not clw
    ("5x5-cl-c16-float16", _clw_case((5, 5), c=16, dtype="float16"), POCL,
     ("clw_fwd_s1", "clw_bwd_data_s1", "clw_bwd_weight_s1"), "Note [depthwise clw]"),
    ("5x3-cl", _clw_case((5, 3)), POCL, ("depthwise_fwd", "depthwise_bwd_data", "depthwise_bwd_weight"),
     "the generic kernels"),  # 3 taps along the last axis
    ("7x7-cl-dilation2", _clw_case((7, 7), dilation=2), POCL, ("depthwise_fwd", "depthwise_bwd_data",
                                                                "depthwise_bwd_weight"), "the generic kernels"),
    ("1x7-cl", _clw_case((1, 7)), POCL, ("depthwise_fwd", "depthwise_bwd_data", "depthwise_bwd_weight"),
     "the generic kernels"),
]


@pytest.mark.parametrize("row", CLW_RULE, ids=lambda r: r[0])
def test_clw_selection(row):
    """Which channels-last depthwise problems the clw kernels take (ahead of bands, after depthwise.cl's programs),
    direction by direction, and the reason that says so."""
    _, pr, device, kernels, reason = row
    choice, ks = plans(pr, device)
    got = tuple(ks[r].launches[0].kernel for r in ("output", "grad_input", "grad_weight"))
    assert got == kernels and reason in choice.reason, (got, choice.reason)
    assert ("clw" in choice.reason) == any(k.startswith("clw") for k in kernels), choice.reason
    # bands (and depthwise.cl for 5x5 on a GPU) takes every clw row here too: the reason says why clw runs instead
    # (with its evidence)
    gpu_5x5 = device.kind == "gpu" and tuple(pr.weight.shape[2:]) == (5, 5)
    evidence = CLW_AHEAD_OF_DW_CL if gpu_5x5 else CLW_AHEAD_OF_BANDS
    assert (evidence in choice.reason) == kernels[0].startswith("clw"), choice.reason


BANDS_FIRST = [  # (id, problem, device, kernels per result, reason)
    ("5x5-pocl", problem((2, 8, 20, 20), (8, 1, 5, 5), padding=2, groups=8), POCL,
     ("dw_fwd", "dw_bwd_data", "dw_bwd_weight"), "vectorised kernels (opencl/depthwise.cl) where the layouts allow"),
    ("5x5-h100", problem((2, 8, 20, 20), (8, 1, 5, 5), padding=2, groups=8), H100,
     ("bands_fwd_s1", "bands_bwd_data_s1", "bands_bwd_weight_s1"),
     "the bands kernels (opencl/bands.cl); else vectorised kernels (opencl/depthwise.cl)"),
    ("5x5-stride2-bf16-h100", problem((2, 8, 20, 20), (8, 1, 5, 5), stride=2, padding=2, groups=8, dtype="bfloat16"),
     H100, ("bands_fwd_s2", "bands_bwd_data_s2", "bands_bwd_weight_s2"), "the bands kernels (opencl/bands.cl);"),
    ("5x5-multiplier2-mi250", problem((2, 8, 20, 20), (16, 1, 5, 5), padding=2, groups=8), MI250,
     ("bands_fwd_s1", "dw_bwd_data", "bands_bwd_weight_s1"),
     "the bands kernels (opencl/bands.cl) for fwd, bwd_weight;"),  # multiplier 2: no bands backward-data
    ("3x3-h100", problem((2, 8, 20, 20), (8, 1, 3, 3), padding=1, groups=8), H100,
     ("dw_fwd", "dw_bwd_data", "dw_bwd_weight"), "vectorised kernels (opencl/depthwise.cl) where the layouts allow"),
]


@pytest.mark.parametrize("row", BANDS_FIRST, ids=lambda r: r[0])
def test_bands_ahead_of_depthwise_cl_on_gpus(row):
    """Contiguous 2-D 5x5 depthwise problems, which opencl/depthwise.cl's vectorised kernels and bands both take: on a
    GPU bands runs first in every direction it takes (BANDS_AHEAD_OF_DW, its evidence in the reason); on a CPU
    depthwise.cl's programs keep them."""
    _, pr, device, kernels, reason = row
    choice, ks = plans(pr, device)
    got = tuple(ks[r].launches[0].kernel for r in ("output", "grad_input", "grad_weight"))
    assert got == kernels and reason in choice.reason, (got, choice.reason)
    assert (BANDS_AHEAD_OF_DW in choice.reason) == kernels[0].startswith("bands"), choice.reason


def test_clw_launch_limits_fall_to_bands():
    """A compiled clw kernel allowing fewer than 256 work-items a group, or a device with less local memory than the
    staged filters (9x9 float16: 41472 B), runs the next set (bands) for that direction and says why."""
    pr = _clw_case((9, 9), dtype="float16")
    ks = plans(pr, POCL)[1]
    fwd = ks["output"].launches[0]
    ks = plans(pr, POCL, limits={(fwd.module, fwd.kernel): 128})[1]
    assert [ks[r].launches[0].kernel for r in ("output", "grad_input")] == ["bands_fwd_s1", "clw_bwd_data_s1"]
    assert "clw kernels not used: clw_fwd_s1 needs 256-item work-groups, the device allows 128" in ks["output"].lines()
    small = dataclasses.replace(POCL, local_mem_bytes=32 << 10)
    ks = plans(pr, small)[1]
    got = [ks[r].launches[0].kernel for r in ("output", "grad_input", "grad_weight")]
    assert got == ["bands_fwd_s1", "bands_bwd_data_s1", "clw_bwd_weight_s1"], got  # no local memory in the weight's
    assert ("clw kernels not used: clw_bwd_data_s1 needs 41472 B of local memory, the device has 32768 B"
            in ks["grad_input"].lines())


def test_bands_module_sized_for_the_directions_bands_runs(monkeypatch):
    """Where clw takes some directions (made here to leave the stride-2 backward-data to bands), the bands module of
    the others (four phases) holds their local array only, as the CUDA set's family defines: 8 KB, not the 32 KB of
    the forward's 51 planes a group (all the local memory some devices have)."""
    pr = problem((3, 4, 7, 9), (4, 1, 2, 2), stride=2, padding=1, groups=4, fmt="channels_last")
    real = clw.kernels
    monkeypatch.setattr(clw, "kernels", lambda *a: {**real(*a), "bwd_data": ""})
    ks = plans(pr, POCL)[1]
    assert launches(ks["grad_input"])[0][0] == "bands_bwd_data_s2" and defines(ks["grad_input"])["BANDS_BYTES"] == \
        "8192"
    monkeypatch.setattr(clw, "kernels", lambda *a: dict.fromkeys(clw.DIRECTIONS, ""))
    ks = plans(pr, POCL)[1]
    assert [defines(ks[r])["BANDS_BYTES"] for r in ("output", "grad_input")] == ["32768", "32768"]


def test_depthwise_cl_alignment_from_layouts():
    """DW_CLA (aligned vector accesses, GPUs) only where every vector of x and y starts at a multiple of the vector
    width: the operands' misalign (offset modulo 8) and their strides."""
    x = Layout((2, 16, 9, 13), dense_strides((2, 16, 9, 13), "channels_last"))
    w, b = Layout((16, 1, 3, 3), (9, 9, 3, 1)), Layout((16,), (1,))
    for lay, aligned in ((x, True), (dataclasses.replace(x, misalign=4), False),
                         (Layout(x.shape, (16 * 9 * 20, 1, 16 * 20, 20)), False)):
        ks = plans(DW_CL, H100, fwd=(lay, w, b))[1]
        assert ("DW_CLA" in defines(ks["output"])) == aligned, lay
        assert ("DW_CLA: every vector at a multiple of 8 elements" in ks["output"].decisions) == aligned
    op = Operand("input", dataclasses.replace(x, misalign=0))
    off4 = Operand("input", dataclasses.replace(x, misalign=4))
    assert depthwise.cl_aligned(8, op) and not depthwise.cl_aligned(8, off4) and depthwise.cl_aligned(4, off4)
    # channel stride above 1 (a channels-last result read back as NCHW): the generic kernels
    nchw = Layout(DW_CL.output_shape, dense_strides(DW_CL.output_shape))
    ks = plans(DW_CL, H100, bwd=(nchw, Layout(x.shape, x.strides), w))[1]
    assert launches(ks["grad_input"])[0][0] == "depthwise_bwd_data"
    assert launches(ks["grad_weight"])[0][0] == "depthwise_bwd_weight"
    assert "channel stride > 1" in "\n".join(ks["grad_input"].lines())


def test_index_width_from_options_shapes_and_layouts():
    """IDX64: Options(index64=True) everywhere; else only the launches that touch an operand beyond 32-bit offsets
    (Layout.wide: a pyopencl array far into its buffer) or run 2^31 work-items."""
    ks = plans(DENSE, POCL, Options(index64=True))[1]
    assert all(("IDX64", "") in x.module.defines for k in ks.values() for x in k.launches)
    assert all("64-bit indices" in line for k in ks.values() for line in k.decisions if " grid " in line)
    f, b = implied_layouts(DENSE, "contiguous")
    wide = dataclasses.replace(f[0], wide=True)
    ks = plans(DENSE, POCL, fwd=(wide, f[1], f[2]), bwd=(b[0], wide, b[2]))[1]
    width = {r: [("IDX64", "") in x.module.defines for x in k.launches] for r, k in ks.items()}
    # the input is read by the forward and the grad-weight; grad_input is a fresh buffer
    assert width == {"output": [True], "grad_input": [False], "grad_weight": [True, False], "grad_bias": [False]}


def test_work_group_limits_are_facts_of_the_build():
    """Note [work-group limits]: a compiled kernel allowing fewer work-items than the tile needs runs the direct
    kernel for that direction (the decision says why); a smaller limit on a direct kernel shrinks its work-group."""
    _, ks = plans(DENSE, POCL)
    fwd = ks["output"].launches[0]
    limits = {(fwd.module, fwd.kernel): 8}
    _, ks = plans(DENSE, POCL, limits=limits)
    assert launches(ks["output"]) == [("conv_fwd", (8192,), (64,))]
    assert "igemm_fwd needs 32-item work-groups, the device allows 8: the direct kernel" in ks["output"].decisions
    assert launches(ks["grad_input"])[0][0] == "igemm_bwd_data"  # its own kernel, its own limit
    direct = ks["output"].launches[0]
    _, ks = plans(DENSE, POCL, limits={**limits, (direct.module, direct.kernel): 16})
    assert launches(ks["output"]) == [("conv_fwd", (8192,), (16,))]
    _, ks = plans(DW, H100)
    dw = ks["output"].launches[0]
    _, ks = plans(DW, H100, limits={(dw.module, dw.kernel): 16})
    assert launches(ks["output"])[0][0] == "depthwise_fwd"
    assert "dw_fwd needs 112-item work-groups, the device allows 16: the generic kernels" in ks["output"].decisions


def test_descriptor_binds_and_buffers():
    """The argument block: every offset field zero and bound to its operand's offset (results: fresh, offset 0);
    no bias binds the dummy buffer; the split grad-weight's partials are a workspace of the accumulator type."""
    pr = dataclasses.replace(DENSE, has_bias=False)
    _, ks = plans(pr, POCL)
    fwd = ks["output"].launches[0]
    assert [fwd.args[SLOT[f]] for f in ("xo", "wo", "yo", "bo", "has_bias")] == [0, 0, 0, 0, 0]
    assert [(b.slot, b.role, b.offset_slot) for b in fwd.binds] == [
        (1, "input", SLOT["xo"]), (2, "weight", SLOT["wo"]), (3, "dummy", -1), (4, "output", -1)]
    view = ConvView.of(pr)
    assert fwd.args[:4] == (view.N, view.G, view.cg, view.kg) and fwd.args[10:13] == view.R
    gw = ks["grad_weight"]
    assert [(b.role, b.shape, b.dtype, b.result) for b in gw.buffers] == [
        ("grad_weight", (16, 8, 3, 3), "float32", True), ("partials", (4608,), "float32", False)]
    assert [b.role for b in gw.launches[0].binds] == ["input", "grad_output", "grad_weight", "partials"]
    assert [b.role for b in gw.launches[1].binds] == ["partials", "grad_weight"]
    with pytest.raises(ValueError, match="grad_output has shape"):
        f, b = implied_layouts(pr, "contiguous")
        plans(pr, POCL, bwd=(Layout((1, 16, 16, 16), (4096, 256, 16, 1)), b[1], b[2]))


def test_explain_lines_fit_for_every_conformance_case():
    """Every reason part and KernelPlan line of the whole conformance grid, on three devices and two dtypes, fits
    explain()'s 120 columns after its label."""
    for case in C.all_cases():
        for dtype in ("float32", "bfloat16"):
            p = case.params
            x = spec(case.input_shape, "channels_last" if case.layout == "chlast" and len(case.input_shape) == 4
                     else "contiguous", dtype)
            pr = Problem(p, x, spec(case.weight_shape, dtype=dtype), case.bias)
            for device in (POCL, H100, MI250):
                try:
                    choice, ks = plans(pr, device)
                except Unsupported:
                    continue
                for part in choice.reason.split("; "):
                    assert len(part) <= WIDTH, (case.id, part)
                for k in ks.values():
                    for line in k.lines():
                        assert len(line) <= WIDTH, (case.id, line)


# --- the tables the old per-call code held, now pure functions of the view and the device -----------------------

def test_memory_format_rule_table():
    """Note [own kernels' result layout]: pyopencl arrays take cuDNN's rule (channels-last when the input or the
    weight is, never float64); torch CPU tensors what ATen's CPU route returns."""
    def pr(xshape, xfmt, wfmt, kind="pyopencl", dtype="float32"):
        wshape = (4, xshape[1]) + (3,) * (len(xshape) - 2)
        return Problem(ConvParams.make(len(xshape) - 2), spec(xshape, xfmt, dtype, kind),
                       spec(wshape, wfmt, dtype, kind), False)

    table = [((2, 3, 8, 8), "contiguous", "contiguous", "contiguous"),
             ((2, 3, 8, 8), "channels_last", "contiguous", "channels_last"),
             ((2, 3, 8, 8), "contiguous", "channels_last", "channels_last"),
             ((2, 3, 4, 8, 8), "channels_last_3d", "contiguous", "channels_last_3d"),
             ((2, 3, 4, 8, 8), "contiguous", "channels_last_3d", "channels_last_3d"),
             ((2, 3, 8), "contiguous", "contiguous", "contiguous")]
    for xshape, xfmt, wfmt, want in table:
        assert choose(pr(xshape, xfmt, wfmt), POCL, Options(), Facts()).memory_format == want, (xshape, xfmt, wfmt)
    assert choose(pr((2, 3, 8, 8), "channels_last", "contiguous", dtype="float64"), POCL, Options(),
                  Facts()).memory_format == "contiguous"
    ctx = TorchContext()
    for xfmt in ("contiguous", "channels_last"):
        c = choose(pr((2, 3, 8, 8), xfmt, "contiguous", "torch"), POCL, Options(), Facts(ctx))
        assert c.memory_format == xfmt and "ATen's CPU route" in c.reason


def test_igemm_selection_table():
    """Which family a problem gets per device and Options.opencl_dense, with the reason."""
    x = problem((1, 4, 9, 9), (8, 4, 3, 3), padding=1)
    t = problem((1, 4, 5, 5), (4, 8, 3, 3), stride=2, padding=1, transposed=True)
    d = problem((1, 4, 9, 9), (4, 1, 3, 3), padding=1, groups=4)
    for opts, device, dense in ((Options(), H100, "igemm-tc"), (Options(), POCL, "igemm"),
                                (Options(opencl_dense="direct"), H100, "direct"),
                                (Options(opencl_dense="igemm"), POCL, "igemm")):
        assert choose(x, device, opts, Facts(TorchContext(), TF32_ON)).algorithm == dense, (opts, device.name)
        assert choose(t, device, opts, Facts(TorchContext(), TF32_ON)).algorithm == dense + "-transposed"
        assert choose(d, device, opts, Facts(TorchContext(), TF32_ON)).algorithm == "depthwise"  # unchanged
    s2 = problem((1, 4, 9, 9), (8, 4, 3, 3), stride=2, padding=1)
    assert "by phases (4 phase(s)" in plans(s2, H100, Options(opencl_dense="igemm"))[1]["grad_input"].summary
    sd = problem((1, 4, 9, 9), (8, 4, 3, 3), stride=2, padding=2, dilation=2)
    assert "the direct kernel" in "\n".join(plans(sd, H100)[1]["grad_input"].lines())
    assert "opencl_dense=igemm" in choose(x, POCL, Options(opencl_dense="igemm"), Facts()).reason
    forced = {"implicit_gemm": "igemm", "direct": "direct", "igemm-tc": "igemm-tc"}
    for alg, fam in forced.items():
        assert choose(x, H100, Options(algorithm=alg), Facts(None, TF32_OFF)).algorithm == fam
    assert choose(d, POCL, Options(algorithm="direct"), Facts()).algorithm == "direct"
    with pytest.raises(Unsupported, match="PTX mma needs an NVIDIA sm_80"):
        choose(x, POCL, Options(algorithm="igemm-tc"), Facts())
    assert choose(x, POCL, Options(algorithm="igemm-tc", opencl_tc="portable"), Facts()).algorithm == "igemm-tc"


def test_tensor_core_selection():
    """Where the tile runs by default: NVIDIA GPUs of sm_80+, float16/bfloat16 always, float32 where the TF32 rule
    (rules.conv_tf32, the torch flags) allows; never float64, older GPUs or other vendors; options force either way."""
    t4 = dataclasses.replace(H100, name="T4", arch="sm_75")
    conv = getattr(torch.backends.cudnn, "conv", None)
    old = conv.fp32_precision if conv is not None else torch.backends.cudnn.allow_tf32
    off = Options()
    try:
        assert tc_mode("float16", H100, off, TF32_OFF)[0] == "ptx"
        assert tc_mode("bfloat16", H100, off, TF32_OFF)[0] == "ptx"
        if conv is not None:
            conv.fp32_precision = "tf32"
        else:
            torch.backends.cudnn.allow_tf32 = True
        assert tc_mode("float32", H100, off, conv_tf32(torch))[0] == "ptx"
        if conv is not None:
            conv.fp32_precision = "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = False
        mode, why = tc_mode("float32", H100, off, conv_tf32(torch))
        assert mode == "" and "TF32 not allowed" in why
    finally:
        if conv is not None:
            conv.fp32_precision = old
        else:
            torch.backends.cudnn.allow_tf32 = old
    for dev in (t4, MI250, POCL):
        mode, why = tc_mode("float16", dev, off, TF32_ON)
        assert mode == "" and "sm_80" in why, dev
    assert tc_mode("float64", H100, off, TF32_ON)[0] == ""
    for forced in ("portable", "ptx"):
        assert tc_mode("float32", POCL, Options(opencl_tc=forced), TF32_OFF)[0] == forced
    assert tc_mode("float16", H100, Options(opencl_tc="off"), TF32_ON)[0] == ""


def test_depthwise_gpu_work_groups_fit_the_image():
    """GPU settings: work-groups of up to 16 W blocks x 8 row blocks that fit the image, filled to 128 work-items with
    planes, at most 64 (NVIDIA's limit along z) (MobileNetV2's 7x7 and 28x28 layers), the 16x8 groups on large
    images; the CPU's up to 4x4 filled to 8."""
    for size, stride, gpu, cpu in (((7, 7), 1, (2, 4, 16), (1, 1, 8)), ((56, 56), 2, (7, 8, 2), (4, 4, 1)),
                                   ((1, 1), 1, (1, 1, 64), (1, 1, 8)),
                                   ((112, 112), 1, (16, 8, 1), (4, 4, 1)), ((56, 56), 1, (14, 8, 1), (4, 4, 1))):
        pr = problem((2, 8, *size), (8, 1, 3, 3), stride=stride, padding=1, groups=8)
        view = ConvView.of(pr)
        got = tuple(depthwise.dw_spec(pr, view, "contiguous", c)[0].local for c in (False, True))
        assert got == (gpu, cpu), (size, stride, got)
    h = plans(problem((2, 8, 7, 7), (8, 1, 3, 3), padding=1, groups=8), H100)[1]
    assert launches(h["output"]) == [("dw_fwd", (2, 4, 16), (2, 4, 16))]
    assert "DW_CPU" not in defines(h["output"]) and defines(h["output"])["DW_VW"] == "4"


def test_depthwise_splits_table():
    assert depthwise.dw_splits(144, 392, 16, 2, cpu=True) == 1  # enough channels for two cores
    assert depthwise.dw_splits(144, 98, 1, 2, cpu=True) == 1  # the CPU's one work-item per channel
    assert depthwise.dw_splits(3, 40, 1, 2, cpu=True) == 3  # three channels: split for two cores (+ dw_finalize)
    assert depthwise.dw_splits(144, 14 * 56 * 32, 64, 132, cpu=False) == 8  # a 132-SM GPU: 8 per SM over 144 channels
    assert depthwise.dw_splits(4, 10, 64, 132, cpu=False) == 1  # too little work to split
    assert depthwise.dw_splits(1, 10**7, 64, 132, cpu=False) == 64  # capped
    pr = problem((2, 3, 40, 17), (3, 1, 3, 3), padding=1, groups=3)
    gw = plans(pr, POCL)[1]["grad_weight"]
    assert launches(gw) == [("dw_bwd_weight", (3, 3), (1, 1)), ("dw_finalize", (32,), (16,))]
    assert "3 splits of" in "\n".join(gw.decisions) and gw.buffers[1].shape == (3 * 3 * 9,)


def test_igemm_splits_table():
    def view(n, c, k, y, taps=(3, 3), g=1):
        return ConvView(n, c * g, k * g, g, (1, *y), (1, *y), (1, *taps), (1, 1, 1), (0, 1, 1), (1, 1, 1))

    gpu = igemm.GPU_TILE
    assert igemm.splits(view(32, 64, 64, (56, 56)), gpu, 132, 4) == (59, 1712)  # 9 tiles: 528 groups wanted
    assert igemm.splits(view(32, 256, 256, (14, 14)), gpu, 132, 4) == (4, 1568)  # 144 tiles
    assert igemm.splits(view(1, 64, 64, (56, 56)), gpu, 132, 4) == (12, 272)  # >= 16 steps of 16 per split
    assert igemm.splits(view(1, 4, 4, (5, 5)), gpu, 132, 4) == (1, 32)  # too short to split
    assert igemm.splits(view(32, 2048, 2048, (14, 14)), gpu, 132, 4)[0] == 1  # 9216 tiles fill the GPU
    assert igemm.splits(view(32, 512, 512, (28, 28)), gpu, 2, 4) == (1, 25088)  # 2-core CPU: the tiles suffice


def test_igemm_narrow_tiles():
    """GEMMs with few columns or rows per group (resnext50-g32: 4 channels per group) run a tile narrow on that side."""
    fit, gpu, cpu, narrow, tc = igemm.fit, igemm.GPU_TILE, igemm.CPU_TILE, igemm.NARROW_TILES, igemm.TC_TILE
    assert fit(gpu, 100352, 256) == gpu
    assert fit(gpu, 100352, 4) == narrow[(False, "cols", 16)]  # forward, 4 output channels per group
    assert fit(gpu, 4, 36) == narrow[(False, "rows", 16)]  # grad-weight, 4 output channels per group
    assert fit(cpu, 3136, 16) == narrow[(True, "cols", 16)]
    assert fit(cpu, 3136, 4) == narrow[(True, "cols", 4)]
    assert fit(cpu, 8, 8) == narrow[(True, "rows", 16)]
    assert fit(cpu, 3, 36) == narrow[(True, "rows", 4)]
    assert fit(narrow[(True, "cols", 4)], 3136, 4) == narrow[(True, "cols", 4)]
    assert fit(gpu, 17, 17) == gpu

    def shape(sp):
        return sp.bm, sp.bn, sp.wm, sp.wn, sp.threads, sp.tc

    assert fit(tc, 100352, 256) == tc
    assert shape(fit(tc, 100352, 3)) == (128, 8, 4, 1, 128, "ptx")  # the stem's backward-data
    assert shape(fit(tc, 100352, 12)) == (128, 16, 4, 1, 128, "ptx")
    assert shape(fit(tc, 4, 36)) == (16, 128, 1, 4, 128, "ptx")  # grad-weight, 4 output channels per group
    assert fit(tc, 100352, 17) == tc
    wt = igemm.weight_tile
    assert shape(wt(tc)) == (128, 128, 2, 4, 256, "ptx") and wt(tc).bk == 32
    assert shape(fit(wt(tc), 4, 36)) == (16, 128, 1, 4, 128, "ptx")
    for rows, want in ((17, (64, 128, 2, 4, 256, "ptx")), (64, (64, 128, 2, 4, 256, "ptx")),
                       (65, (128, 128, 2, 4, 256, "ptx")), (16, (16, 128, 1, 4, 128, "ptx"))):
        assert shape(fit(wt(tc, rows), rows, 576)) == want, rows
    assert wt(gpu) == gpu
    ks = plans(problem((2, 32, 11, 10), (24, 4, 3, 3), stride=2, padding=1, groups=8), POCL)[1]
    assert "narrow tile: <= 4 columns per group" in ks["output"].decisions  # 3 output channels per group


def test_igemm_gather_order():
    """The tensor-core tile's load order per kernel (M-lane loads, tap-major steps) on the suite's rows: the rule the
    H100 measurements chose (Note [OpenCL M-lane gathers], Note [OpenCL tap-major steps])."""
    from portconv.bench import load_suite

    rows = {r.name: r for r in load_suite(None)[0]}
    want = {  # row: ((fwd kernel mlane, tap-major), (bwd_data kernel mlane, tap-major))
        "resnet50-stem": ((False, False), (True, True)),  # C_in 3 (no tap-major forward); 4 phases of 16 taps
        "resnet50-l1-3x3": ((False, False), (True, True)),
        "resnet50-l1-3x3-bf16-cl": ((False, True), (False, True)),
        "resnet50-l3-3x3": ((False, False), (False, False)),  # 14-wide phases
        "resnet50-1x1-expand": ((True, True), (True, True)),
        "resnet50-1x1-reduce": ((False, True), (False, True)),
        "r3d18-l1-3d": ((False, False), (True, False)),  # depth taps
        "wav2vec2-posconv-g16": ((False, False), (False, False)),
        "vae-dec-transposed-bf16": ((False, False), (True, True)),  # forward = the bwd_data kernel
        "dcgan-gen-transposed": ((False, False), (False, False)),
    }
    for name, (f, bd) in want.items():
        c = rows[name].case
        x = TensorSpec((1, *c.input_shape[1:]), dense_strides((1, *c.input_shape[1:])), "float32", "meta")
        w = TensorSpec(tuple(c.weight_shape), dense_strides(c.weight_shape), "float32", "meta")
        view = ConvView.of(Problem(c.params, x, w, True))
        cl = c.layout == "chlast"
        got = (igemm.gather_order("fwd", view, cl, 16), igemm.gather_order("bwd_data", view, cl, 16))
        assert got == (f, bd), (name, got)
