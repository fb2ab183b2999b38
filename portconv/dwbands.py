"""Note [depthwise bands]: the geometry and the rule of the 'bands' depthwise kernels, shared by the CUDA/HIP set
(cuda/conv_depthwise_bands.cuh, portconv/backends/simt/depthwise.py) and the OpenCL set (opencl/bands.cl,
portconv/backends/opencl/bands.py), which stage the same bands and take the same problems. Pure functions of the
canonical view (problem.ConvView); each kernel computes the same formulas from its argument block.
"""
from __future__ import annotations

from .problem import ConvView

THREADS = 256  # work-items a group of every bands launch (the CUDA set's block, the OpenCL set's work-group)
DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")  # the order of a per-direction kernel tuple
# A band of output rows of P planes staged in shared (local) memory, DWB_VH output rows a thread (PC_DWB_VH, BANDS_VH).
# A block takes as many whole planes as its THREADS columns and DWB_MAX_BYTES allow; a module's shared memory
# (PC_DWB_BYTES, BANDS_BYTES) is the largest direction's need in DWB_STEP steps.
DWB_VH, DWB_MAX_BYTES, DWB_STEP = 8, 49152, 8192
DWB_VH_TALL, DWB_TALL_ROWS = 16, 13  # filters of 13+ rows on planes of 32+ rows: 16 output rows a thread (H100,
# replk-dw31x31 forward 1.28x over 8; ConvNeXt's 7x7 and EfficientNet's 5x5 stride 2 are slower with 16)


def dwb_ch(r1: int) -> int:
    """PC_DWB_CH: filter rows a step of the 'bands' kernels: all of them up to 8, else the step of 5 to 8 that pads
    them least (the largest of equals)."""
    return r1 if r1 <= 8 else min(range(8, 4, -1), key=lambda c: -(-r1 // c) * c)


def dwb_vh(view: ConvView) -> int:
    """PC_DWB_VH: output rows a thread of the 'bands' fwd / bwd-data kernels: DWB_VH_TALL for tall filters on tall
    planes; the plane's rows where fewer than DWB_VH (Note [small planes]); else DWB_VH."""
    if view.R[1] >= DWB_TALL_ROWS and min(view.X[1], view.Y[1]) >= 2 * DWB_VH_TALL:
        return DWB_VH_TALL
    return max(1, min(DWB_VH, max(view.X[1], view.Y[1])))


# Note [small planes]: where a thread's column of VH rows is a whole plane (planes of at most DWB_VH rows: RepLKNet's
# 13x13 and ConvNeXt's last 7x7 filters on 7x7 planes), VH is the plane's rows, so no thread forms products of rows
# past the plane, and a step takes all the filter's rows up to DWB_CH_WHOLE (dwb_step), so no zero rows pad the
# filter to a multiple of the step.
DWB_CH_WHOLE = 16


def _axis(view: ConvView, direction: str, i: int, ph: int = 0) -> tuple[int, int, int, int, int, int]:
    """(D, R, p, S, DL, source extent) of axis ``i`` of a 'bands' result, as pc_dwb_axis_of forms it: the forward's,
    backward-data's at stride 1 (the filter flipped), or at stride 2 that of parity ``ph`` with its sub-filter (Note
    [bands phases]; p = (rmax - ph - P) / 2 rounds toward zero, as C's division)."""
    x, y, r, pad, dl = view.X[i], view.Y[i], view.R[i], view.P[i], view.DL[i]
    if direction == "fwd":
        return y, r, pad, view.S[i], dl, x
    if view.S[1] == 1:
        return x, r, (r - 1) * dl - pad, 1, dl, y
    rmax = r - 1 - (r - 1 - ph - pad) % 2
    q = rmax - ph - pad
    return (x - ph + 1) // 2, rmax // 2 + 1 if rmax >= 0 else 0, -(-q // 2) if q < 0 else q // 2, 1, 1, y


def _parities(view: ConvView, direction: str) -> range:
    """The grid-y phases of a 'bands' launch: four at stride-2 backward-data (Note [bands phases]), else one."""
    return range(4 if direction != "fwd" and view.S[1] != 1 else 1)


def dwb_phases(view: ConvView, direction: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((D1, R1), (D2, R2)) of each result a 'bands' launch forms (its grid y): the forward's Y, backward-data's X at
    stride 1, or at stride 2 the four parities of X with their sub-filters (Note [bands phases]; pc_dwb_axis_of)."""
    return [(_axis(view, direction, 1, ph >> 1)[:2], _axis(view, direction, 2, ph & 1)[:2])
            for ph in _parities(view, direction)]


def dwb_columns(base: int, src: int, dl: int, r2: int) -> int:
    """Note [bands columns]: how many filter columns of an output column read inside the source (pc_dwb_cols: tap r2
    reads source column r2 dl - base)."""
    lo = -(-base // dl) if base > 0 else 0
    hi = -(-(base + src) // dl) if base + src > 0 else 0
    return max(0, min(hi, r2) - lo)


def dwb_clips(view: ConvView, direction: str) -> bool:
    """Note [bands columns]: a direction's bands kernel walks each output column's inside filter columns only where
    no output column reaches all of them (a filter wider than the plane's reach), so every warp walks fewer; elsewhere
    the uniform walk over every column measured faster (H100, effnet-dw5x5 backward-data 1.21x slower clipped)."""
    axes = {_axis(view, direction, 2, ph & 1) for ph in _parities(view, direction)}
    return all(max(dwb_columns(p - o * s, src, dl, r) for o in range(d)) < r
               for d, r, p, s, dl, src in axes if d > 0 and r > 0)


def dwb_step(view: ConvView, direction: str) -> int:
    """PC_DWB_CH (forward, stride-1 backward-data: one define, one step for both) or PC_DWB_CHP (the stride-2
    phases): filter rows a step; all of them up to DWB_CH_WHOLE where a thread's column covers every result row of
    the directions the define serves (Note [small planes])."""
    phases = dwb_phases(view, direction)
    r1 = max(r for (_, r), _ in phases)
    rows = max(view.X[1], view.Y[1]) if direction == "fwd" or view.S[1] == 1 else max(d for (d, _), _ in phases)
    return r1 if rows <= dwb_vh(view) and r1 <= DWB_CH_WHOLE else dwb_ch(r1)


def dw_bands(view: ConvView, direction: str, dtype: str) -> tuple[int, int, int] | None:
    """(planes a block, bands a plane (the most of any phase), shared bytes) of the 'bands' kernel in a direction
    (Note [depthwise bands]), None where a result row is wider than a block or one plane's band needs more than
    DWB_MAX_BYTES."""
    s, s2 = (view.S[1], view.S[2]) if direction == "fwd" else (1, 1)
    dl2 = view.DL[2] if direction == "fwd" or view.S[1] == 1 else 1
    vh, ch, item = dwb_vh(view), dwb_step(view, direction), 8 if dtype == "float64" else 4
    planes, bands, per = THREADS, 1, 0
    for (d1, r1), (d2, r2) in dwb_phases(view, direction):
        if d1 <= 0 or d2 <= 0:
            continue
        if d2 > THREADS:
            return None
        g, gp = THREADS // d2, -(-d1 // vh)
        th = d1 if gp <= g else g * vh
        r1c = -(-r1 // ch) * ch
        rows, cols = (-(-th // vh) * vh - 1) * s + r1c, (d2 - 1) * s2 + max(r2 - 1, 0) * dl2 + 1
        one = (rows * cols + r1c * r2) * item
        if one > DWB_MAX_BYTES:
            return None
        planes, bands, per = min(planes, g // gp if gp <= g else 1, DWB_MAX_BYTES // one), max(bands, -(-d1 // th)), \
            max(per, one)
    return planes, bands, planes * per


DWB_U, DWB_ROWS = 8, 2048  # PC_DWB_U: output columns a step of the weight gradient; positions a unit about
GRID_SPLITS_MAX = 65535  # splits of a weight gradient at most: a CUDA grid's y extent (simt.view.GRID_YZ_MAX)


def dwb_wgeometry(view: ConvView, dtype: str) -> tuple[int, int, int] | None:
    """(planes a unit, bands a plane, shared bytes) of the 'bands' weight gradient (Note [depthwise bands]), None
    where its staged unit needs more than DWB_MAX_BYTES or its tasks (filter rows x tap runs) exceed a block."""
    d1, d2, r1, r2, n = view.Y[1], view.Y[2], view.R[1], view.R[2], view.N
    d2c, tw = -(-d2 // DWB_U) * DWB_U, dwb_ch(r2)
    rb = max(1, DWB_ROWS // d2c)
    th = min(d1, rb)
    p = min(rb // d1, n) if th == d1 else 1
    rows_x = (th - 1) * view.S[1] + (r1 - 1) * view.DL[1] + 1
    cols_x = (d2c - 1) * view.S[2] + -(-r2 // tw) * tw
    item, per = (8 if dtype == "float64" else 4), rows_x * cols_x + th * d2c
    p = min(p, DWB_MAX_BYTES // (per * item))  # shared memory may hold fewer planes
    need = max(p * per, THREADS * tw) * item
    if p == 0 or need > DWB_MAX_BYTES or r1 * -(-r2 // tw) > THREADS:
        return None
    return p, -(-d1 // th), need


def dwb_splits(view: ConvView, dtype: str, units: int) -> tuple[int, int]:
    """(splits, units a split) of the 'bands' weight gradient, grid (K, splits): about 4 groups a compute unit, at
    most GRID_SPLITS_MAX splits (a grid's y extent); the last split may be shorter."""
    planes, bands, _ = dwb_wgeometry(view, dtype)
    work = -(-view.N // planes) * bands
    splits = max(1, min(-(-4 * max(units, 1) // view.K), work, GRID_SPLITS_MAX))
    chunk = -(-work // splits)
    return -(-work // chunk), chunk


def dwb_defines(view: ConvView, dtype: str, kernels: tuple[str, str, str] | None = None) -> dict[str, int]:
    """The compile-time values of a view's bands module, by their names without the set's prefix (PC_DWB_ in the
    CUDA set, BANDS_ in the OpenCL set): VH, CH, CHP, TW, CLIP (Note [bands columns]: bit 1 the forward, bit 2
    backward-data), and BYTES, the largest need of the directions that run the bands kernels (``kernels``: (fwd,
    bwd_data, bwd_weight), '' where another kernel runs; default bands_kernels) in DWB_STEP steps; empty where none
    does."""
    fwd, bwd_data, bwd_weight = bands_kernels(view, dtype) if kernels is None else kernels
    need = [dw_bands(view, d, dtype)[2] for d, k in (("fwd", fwd), ("bwd_data", bwd_data)) if k]
    need += [dwb_wgeometry(view, dtype)[2]] if bwd_weight else []
    if not need:
        return {}
    clip = (int(bool(fwd) and dwb_clips(view, "fwd")) | 2 * int(bool(bwd_data) and dwb_clips(view, "bwd_data")))
    return {"VH": dwb_vh(view), "CH": dwb_step(view, "fwd"), "CHP": dwb_step(view, "bwd_data"),
            "TW": dwb_ch(view.R[2]), "CLIP": clip, "BYTES": -(-max(need) // DWB_STEP) * DWB_STEP}


def bands_kernels(view: ConvView, dtype: str) -> tuple[str, str, str]:
    """The bands kernel per direction (fwd, bwd_data, bwd_weight), '' where they do not run: 2-D depthwise views
    whose last axis is not 3 taps of dilation 1 (the rows3 / tile / planes kernels take those), filters of 2+ taps on
    both axes (a thread's column and the weight gradient's tasks need filter rows; 1-D and 1-tap filters do not),
    dilation 1 along the rows, any layout (staging gathers and result stores follow the strides), where a band fits.
    Backward-data needs multiplier 1, and stride 1, or stride 2 in both axes with dilation 1 (Note [bands phases]);
    the weight gradient dilation 1 along the columns and their stride 1 or 2."""
    r0, r1, r2 = view.R
    s1, s2, d2 = view.S[1], view.S[2], view.DL[2]
    if not (view.X[0] == 1 and r0 == 1 and r1 >= 2 and r2 >= 2 and view.DL[1] == 1 and not (r2 == 3 and d2 == 1)):
        return "", "", ""
    fwd = f"bands_s{s1}" if s1 in (1, 2) and dw_bands(view, "fwd", dtype) else ""
    phases = s1 == s2 == 2 and d2 == 1  # Note [bands phases]
    ok = (s1 == s2 == 1 or phases) and view.K == view.C and dw_bands(view, "bwd_data", dtype)
    bwd_data = f"bands_s{s1}" if ok else ""
    bwd_weight = f"bands_s{s2}" if d2 == 1 and s2 in (1, 2) and dwb_wgeometry(view, dtype) else ""
    return fwd, bwd_data, bwd_weight
