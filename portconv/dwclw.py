"""Note [depthwise clw]: the rule and the geometry of the 'clw' depthwise kernels, shared by the CUDA/HIP set
(cuda/conv_depthwise_clw.cuh, portconv/backends/simt/depthwise.py) and the OpenCL set (opencl/clw.cl,
portconv/backends/opencl/clw.py), which take the same problems with the same lanes, tiles and splits. Pure functions
of the canonical view (problem.ConvView) and the result layout; each kernel computes the same formulas from its
argument block.
"""
from __future__ import annotations

from typing import NamedTuple

from .dwbands import THREADS
from .problem import ConvView

# Channels-last 2-D filters of 2 to DWC_TAPS_MAX taps an axis (not 3 along the last: the 3-tap kernels take those),
# multiplier 1, dilation 1, the same stride 1 or 2 on both axes (the stride-2 backward-data by phases, Note [clw
# phases] in cuda/conv_depthwise_clw.cuh). DWC_CTMAX: channel groups a block at most (PC_DWC_CTMAX, CLW_CTMAX);
# DWC_SHARED: the staged filters' bytes at most (R1 x R2 x CTMAX x VC values). A block (work-group) is THREADS lanes.
DWC_TAPS_MAX, DWC_CTMAX, DWC_SHARED = 9, 32, 49152
DWC_BLOCKS_PER_UNIT = 32  # forward / backward-data blocks a compute unit at most; the kernels' loops take the rest
# Channels a lane on the tile kernels' vector path (PC_DWT_VC): one 64-bit access of four 16-bit values or two
# float32, float64 one a lane (cuda/conv_depthwise_tile.cuh).
DWC_VC = {"float32": 2, "float16": 4, "bfloat16": 4, "float64": 1}


class Geometry(NamedTuple):
    """The clw kernels' compile-time geometry of one dtype (PC_DWC_*, CLW_*)."""

    vc: int  # channels a lane on the vector path (one access of VC values)
    th: int  # output rows a lane (forward, backward-data)
    vw: int  # output columns a lane
    vw_s2: int  # output columns a lane in a stride-2 module (its forward and backward-data phases)
    vww: int  # output columns a weight-gradient unit
    minb: int  # blocks an SM asked of ptxas for the forward and backward-data (CUDA/HIP only)
    minbw: int  # the same for the weight gradient
    row_loop: bool  # the forward / backward-data walk its source rows in a loop, not unrolled (Note [clw row loop])


# H100 sweeps over ConvNeXt's 7x7 and EfficientNet's 5x5 channels-last rows: 16-bit types 4 channels, 1 x 8 at 2 blocks
# an SM (4 x 4 spills at that cap: the forward ran 4x slower; uncapped it ran up to 38% slower than 1 x 8); 2 channels
# 2 x 8 ran the forward 5-25% faster but convnext-dw7x7-st1's weight gradient 28% slower (0.336 against 0.263 ms;
# one VC serves every direction). float32 4 x 4, uncapped then (convnext-dw7x7-st1-cl forward 0.214 ms against 0.297 at
# 1 x 8; one channel 4 x 8 ran it in 0.179 ms but effnet-dw5x5-s2-cl's in 0.143 against 0.092). At stride 2 the
# 16-bit forward's window of (8 - 1) 2 + R2 vectors spills (1.5 KB at 5x5): 1 x 4 ran effnet-dw5x5-s2-bf16-cl's
# forward in 0.079 ms against 0.181. The kernels' defaults are the 16-bit stride-1 values.
DWC_GEOMETRY = {"float16": Geometry(4, 1, 8, 4, 16, 2, 2, False), "bfloat16": Geometry(4, 1, 8, 4, 16, 2, 2, False),
                "float32": Geometry(2, 4, 4, 4, 8, 3, 1, True), "float64": Geometry(1, 4, 4, 4, 8, 1, 1, True)}


# Note [clw row loop]
# A forward (backward-data) lane walks the (TH - 1) S + R1 source rows of its tile. Unrolled, the compiler loads rows
# ahead of their use, and the float32 TH x VW = 4 x 4 tile takes 255 registers (one block an SM at 256 lanes); in a
# loop it takes 96, and 80 without spills at 3 blocks an SM (minb; the stride-2 forward spills 88 bytes there and
# runs as fast). The loop at 3 blocks ran every float32 channels-last row's forward and backward-data faster on the
# H200 (the rows and their times: docs/performance/h200/README.md); the weight gradient keeps its own bound (minbw),
# where 3 blocks ran up to 7% slower. float64 takes the same tile and loop (255 -> 109 registers; on GPUs its results
# are NCHW, so it runs on CPU OpenCL only). The 16-bit 1 x 8 tile keeps the unrolled walk (in a loop
# effnet-dw5x5-bf16-cl's forward ran 34% slower). opencl/clw.cl takes the same define: NVIDIA's OpenCL and PoCL ran
# as fast with it as without.
def clw_vw(view: ConvView, dtype: str) -> int:
    """Output columns a lane of the view's module (PC_DWC_VW, CLW_VW): the dtype's vw, vw_s2 at stride 2."""
    g = DWC_GEOMETRY[dtype]
    return g.vw_s2 if view.S[1] == 2 else g.vw


def clw_shared(view: ConvView, dtype: str) -> int:
    """Bytes of the staged filters (shared memory of a block, local memory of a work-group): R1 x R2 x CTMAX x VC
    accumulators."""
    return view.R[1] * view.R[2] * DWC_CTMAX * DWC_GEOMETRY[dtype].vc * (8 if dtype == "float64" else 4)


def clw_kernels(view: ConvView, cl: bool, dtype: str) -> tuple[str, str, str]:
    """The 'clw' kernel per direction (fwd, bwd_data, bwd_weight), '' where they do not run; ``cl``: channels-last
    results."""
    r0, r1, r2 = view.R
    s = view.S[1]
    if not (cl and view.X[0] == 1 and r0 == 1 and view.K == view.C and view.DL[1] == view.DL[2] == 1
            and 2 <= r1 <= DWC_TAPS_MAX and 2 <= r2 <= DWC_TAPS_MAX and r2 != 3 and view.S[2] == s and s in (1, 2)
            and clw_shared(view, dtype) <= DWC_SHARED):
        return "", "", ""
    return f"clw_s{s}", f"clw_s{s}", f"clw_s{s}"


def clw_groups(view: ConvView, dtype: str, lanes: int) -> tuple[int, int]:
    """(channel groups a block, channel tiles) of a 'clw' launch with ``lanes`` lanes a group at most (pc_dwc_ct):
    the vector path's VC channels a group where C allows it (the kernel checks strides and alignment itself), at
    most min(CTMAX, lanes) groups a block, balanced over the fewest tiles (144 channels of VC 4: 2 tiles of 18)."""
    vc = DWC_GEOMETRY[dtype].vc
    cv = view.C // (vc if view.C % vc == 0 else 1)
    tiles = -(-cv // min(DWC_CTMAX, lanes))
    return -(-cv // tiles), tiles


def clw_phases(view: ConvView, direction: str) -> int:
    """Launch phases (grid z): the stride-2 backward-data's four (Note [clw phases]), else one."""
    return 4 if direction == "bwd_data" and view.S[1] == 2 else 1


def clw_grid(view: ConvView, direction: str, dtype: str, units: int) -> tuple[int, int, int]:
    """(channel groups a block, blocks, channel tiles) of a forward or backward-data launch, grid (blocks, channel
    tiles, clw_phases): THREADS / groups lanes a block over the TH x VW tiles of the result (of a phase: its first,
    the largest), at most DWC_BLOCKS_PER_UNIT blocks a compute unit over the phases (the kernels' loops take the
    rest)."""
    ct, tiles_c = clw_groups(view, dtype, THREADS)
    phases = clw_phases(view, direction)
    ext = view.Y if direction == "fwd" else tuple(-(-e // (2 if phases > 1 else 1)) for e in view.X)
    g = DWC_GEOMETRY[dtype]
    tiles = view.N * -(-ext[1] // g.th) * -(-ext[2] // clw_vw(view, dtype))
    return ct, max(1, min(-(-tiles // (THREADS // ct)), units * DWC_BLOCKS_PER_UNIT // phases)), tiles_c


def clw_splits(view: ConvView, dtype: str, units: int) -> tuple[int, int, int]:
    """(splits, channel tiles, units a split) of the weight gradient, grid (splits, channel tiles) over the (n, output
    row, strip of VWW columns) units: about 4 blocks a compute unit; the last split may be shorter."""
    _, tiles = clw_groups(view, dtype, THREADS // view.R[1])
    work = view.N * view.Y[1] * -(-view.Y[2] // DWC_GEOMETRY[dtype].vww)
    splits = max(1, min(-(-4 * max(units, 1) // tiles), work))
    chunk = max(1, -(-work // splits))  # no units (N == 0): one split of none writes zeros
    return max(1, -(-work // chunk)), tiles, chunk


def clw_defines(view: ConvView, dtype: str) -> dict[str, int]:
    """The compile-time values of a view's clw module by their names without the set's prefix (PC_DWC_ in the CUDA
    set, CLW_ in the OpenCL set): the filter (R1, R2) and the dtype's geometry (VC, TH, VW by stride, VWW, ROWLOOP)."""
    g = DWC_GEOMETRY[dtype]
    return {"R1": view.R[1], "R2": view.R[2], "VC": g.vc, "TH": g.th, "VW": clw_vw(view, dtype), "VWW": g.vww,
            "ROWLOOP": int(g.row_loop)}
