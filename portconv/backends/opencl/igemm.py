"""The implicit-GEMM kernels (opencl/igemm.cl): their tiles, narrow tiles, gather order, splits and launches."""
from __future__ import annotations

import dataclasses
import math

from ...problem import ConvView
from ..program import Bind, Buffer
from .kernels import Ctx, Operand, Part, bias_bind, bias_fields, desc, make_launch

WORKSPACE_BYTES = 64 << 20  # cap of the split grad-weight's partial sums
RED_BLOCK = 4096  # opencl/common.h's: the positions of one block of a blocked sum (Note [blocked sums])


@dataclasses.dataclass(frozen=True)
class Tile:
    """One tile of igemm.cl: an IG_BM x IG_BN tile stepping IG_BK, IG_TM x IG_TN results per work-item, or with
    ``tc`` ('ptx' | 'portable') the tensor-core products of Note [OpenCL tensor cores] on IG_WM x IG_WN warps."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    cpu: bool = False
    tc: str = ""
    wm: int = 0
    wn: int = 0
    mfast: bool = False  # IG_MFAST: load work-items along rows / columns first (Note [OpenCL M-lane gathers])
    tapmajor: bool = False  # IG_TAPMAJOR: Note [OpenCL tap-major steps] (forward and backward-data; gather_order)

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn if self.tc else (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def defines(self) -> dict:
        d = {"IG_BM": self.bm, "IG_BN": self.bn, "IG_BK": self.bk}
        if self.tc:
            d.update(IG_TC=1, IG_WM=self.wm, IG_WN=self.wn, **({"IG_MMA_PTX": ""} if self.tc == "ptx" else {}))
        else:
            d.update(IG_TM=self.tm, IG_TN=self.tn)
        return {**d, **({"IG_CPU": ""} if self.cpu else {}), **({"IG_MFAST": ""} if self.mfast else {}),
                **({"IG_TAPMAJOR": 1} if self.tapmajor else {})}

    def describe(self) -> str:
        if self.tc:
            return (f"{self.bm}x{self.bn} tensor-core tiles, step {self.bk}, {self.wm}x{self.wn} warps of "
                    f"{self.bm // self.wm}x{self.bn // self.wn}")
        return (f"{self.bm}x{self.bn} tiles, step {self.bk}, {self.tm}x{self.tn} per work-item, "
                f"{self.threads}-item groups")

    @property
    def products(self) -> list[str]:
        """explain()'s line on the tensor-core products."""
        if not self.tc:
            return []
        return [f"products: {'mma.sync (inline PTX)' if self.tc == 'ptx' else 'portable (plain OpenCL C)'}, "
                f"Note [OpenCL tensor cores]"]


GPU_TILE = Tile(64, 64, 16, 4, 4)
CPU_TILE = Tile(32, 32, 8, 4, 4, cpu=True)  # the fastest of 8 shapes on PoCL (docs/kernels/opencl.md)
# Note [OpenCL tensor cores] tiles: forward and backward-data 128x64, step 16, 8 warps of 32x32 (H100: 128x128, 256x64,
# 64x64, 64x128 and step 32 ran 1.2x-1.6x its time); the grad-weight, split over its long reduction, 128x128 with
# step 32 (0.89x the time of 128x64), 64x128 for 17-64 rows, where a 128-row tile spends half its products and A
# gathers on padding (0.76x-0.91x the time on the suite's rows; docs/kernels/opencl.md).
TC_TILE = Tile(128, 64, 16, 0, 0, tc="ptx", wm=4, wn=2)
TC_TILE_WEIGHT = Tile(128, 128, 32, 0, 0, tc="ptx", wm=2, wn=4)
TC_WEIGHT_ROWS64 = (64, 2, 4)  # IG_BM, IG_WM, IG_WN
# A GEMM with at most 16 (CPU: 4 or 16) columns or rows per group, such as the 4 channels per group of resnext50-g32,
# runs a tile that narrow on that side (a 64-wide tile would compute 16x the useful products). A tile of width BN
# needs IG_NT / IG_BK <= BN work-items per load pass: 4 wide means 32-item groups, kept to the CPU.
NARROW = 16
NARROW_TILES = {(False, "cols", 16): Tile(128, 16, 8, 8, 2), (False, "rows", 16): Tile(16, 128, 8, 2, 8),
                (True, "cols", 16): Tile(64, 16, 8, 8, 4, cpu=True),
                (True, "rows", 16): Tile(16, 64, 8, 4, 8, cpu=True),
                (True, "cols", 4): Tile(64, 4, 8, 8, 1, cpu=True),
                (True, "rows", 4): Tile(4, 64, 8, 1, 8, cpu=True)}
# Tensor-core tiles narrow on one side: the padded mma costs little next to the gathers, so a GEMM of 1..3 columns
# (backward-data of a stem) or 4 rows per group keeps the tensor cores. (IG_BM, IG_BN, IG_WM, IG_WN); the rest kept.
TC_NARROW = {("cols", 8): (128, 8, 4, 1), ("cols", 16): (128, 16, 4, 1), ("rows", 16): (16, 128, 1, 4)}


def base_tile(cpu: bool, tc: str = "") -> Tile:
    """The tile of a device kind: the FMA tile, or the tensor-core tile with products ``tc``."""
    return dataclasses.replace(TC_TILE, tc=tc, cpu=cpu) if tc else CPU_TILE if cpu else GPU_TILE


def fit(sp: Tile, rows: int, cols: int) -> Tile:
    """The tile of one GEMM of ``rows`` x ``cols`` per group: ``sp``, or a narrow one (NARROW_TILES, TC_NARROW)."""
    side, size = ("cols", cols) if cols <= NARROW and cols < rows else ("rows", rows)
    table = TC_NARROW if sp.tc else {(sd, w): t for (cpu, sd, w), t in NARROW_TILES.items() if cpu == sp.cpu}
    widths = [w for (sd, w) in table if sd == side and size <= w]
    if not widths or (sp.bn if side == "cols" else sp.bm) <= min(widths):
        return sp
    narrow = table[(side, min(widths))]
    if sp.tc:
        bm, bn, wm, wn = narrow
        return dataclasses.replace(sp, bm=bm, bn=bn, wm=wm, wn=wn)
    return narrow


def weight_tile(sp: Tile, rows: int = 1 << 30) -> Tile:
    """The grad-weight's tile for a problem whose tile is ``sp`` and whose grad-weight GEMM has ``rows`` (output
    channels per group): TC_TILE_WEIGHT's shape for the tensor-core tile (TC_WEIGHT_ROWS64's for 17-64 rows)."""
    if not sp.tc:
        return sp
    w = TC_TILE_WEIGHT
    bm, wm, wn = TC_WEIGHT_ROWS64 if NARROW < rows <= TC_WEIGHT_ROWS64[0] else (w.bm, w.wm, w.wn)
    return dataclasses.replace(sp, bm=bm, bn=w.bn, bk=w.bk, wm=wm, wn=wn)


# Note [OpenCL M-lane gathers]: IG_MFAST numbers the tensor-core tile's load work-items along the rows first, so 16
# neighbouring rows (positions) read one contiguous run of an NCHW tensor instead of 16 reduction indices (channels
# H*W apart, taps). Taken by NCHW backward-data phases whose last axis has >= MLANE_MIN_RUN positions and <=
# MLANE_MAX_TAPS taps (H100: 0.69x-0.98x the time; 1.08x on 4-wide phases, 1.20x on 128 taps) and by NCHW 1x1 forwards
# (0.84x-0.93x; 1.1x-1.3x slower on every multi-tap forward) (docs/kernels/opencl.md).
# Note [OpenCL tap-major steps] (opencl/igemm.cl): channel-innermost steps without divisions, row bounds once per tap,
# when the channel count is a multiple of the reduction step; taken channels-last (H100: forward 0.66x, backward-data
# 0.78x), with one tap, and NCHW with M-lane loads and no depth taps (backward-data 0.79x-0.88x); NCHW multi-tap
# without M-lane loads (1.07x-1.84x) and depth taps (1.43x) ran slower (docs/kernels/opencl.md).
MLANE_MIN_RUN, MLANE_MAX_TAPS = 16, 32


def gather_order(kernel: str, view: ConvView, c_inner: bool, bk: int) -> tuple[bool, bool]:
    """(M-lane loads, tap-major steps) of the tensor-core ``kernel`` ('fwd' | 'bwd_data') for this problem."""
    if kernel == "fwd":
        run, taps, ch = view.Y[2], view.taps, view.cg
    else:  # one phase: its last axis and its taps
        run, taps, ch = -(-view.X[2] // view.S[2]), math.prod(-(-r // s) for r, s in zip(view.R, view.S)), view.kg
    mlane = not c_inner and run >= MLANE_MIN_RUN and (taps == 1 if kernel == "fwd" else taps <= MLANE_MAX_TAPS)
    tapmajor = ch % bk == 0 and (c_inner or taps == 1 or (mlane and view.R[0] == 1))
    return mlane, tapmajor


def splits(view: ConvView, sp: Tile, compute_units: int, acc_bytes: int) -> tuple[int, int]:
    """(splits, positions per split) of the grad-weight reduction: enough work-groups to fill the device (4 per
    compute unit), at least 16 reduction steps per split, at most 64 splits, workspace within WORKSPACE_BYTES;
    a split longer than RED_BLOCK is whole blocks (Note [blocked sums])."""
    red = view.y_positions
    tiles = -(-view.kg // sp.bm) * -(-(view.cg * view.taps) // sp.bn) * view.G
    count = view.K * view.cg * view.taps
    want = -(-4 * max(1, compute_units) // tiles)
    n = max(1, min(64, want, red // (16 * sp.bk), WORKSPACE_BYTES // max(1, count * acc_bytes)))
    chunk = -(-red // n) if red else 0
    unit = RED_BLOCK if n > 1 and chunk > RED_BLOCK else sp.bk  # Note [blocked sums] (opencl/common.h)
    chunk = -(-chunk // unit) * unit
    return (-(-red // chunk) if chunk else 1), chunk


def _order(sp: Tile) -> list[str]:
    return ((["loads along the rows (Note [OpenCL M-lane gathers])"] if sp.mfast and sp.tc else [])
            + (["tap-major steps (Note [OpenCL tap-major steps])"] if sp.tapmajor else []))


def _narrow(base: Tile, sp: Tile) -> list[str]:
    if (sp.bm, sp.bn) == (base.bm, base.bn):
        return []
    side = "columns" if sp.bn < base.bn else "rows"
    return [f"narrow tile: <= {min(sp.bm, sp.bn)} {side} per group"]


def _launch(ctx: Ctx, sp: Tile, kernel: str, m: int, n: int, z: int, args, binds, ops, extra: int = 0):
    """The launch of an igemm kernel over (m tiles x threads, n tiles, z) work-items, or why it cannot run (Note
    [work-group limits]: the compiled kernel allows fewer work-items than the tile needs)."""
    grid = (-(-m // sp.bm) * sp.threads, -(-n // sp.bn), z)
    mod = ctx.module("igemm.cl", ctx.idx64(math.prod(grid), *ops, extra=extra), sp.defines)
    lim = ctx.limit(mod, kernel)
    if lim < sp.threads:
        return None, f"{kernel} needs {sp.threads}-item work-groups, the device allows {lim}: the direct kernel"
    return make_launch(mod, kernel, grid, (sp.threads, 1, 1), args, binds), ""


def _tc_order(ctx: Ctx, kernel: str, sp: Tile) -> tuple[Tile, int]:
    """The tensor-core tile with its gather order for this kernel, and the descriptor's c_inner."""
    if not sp.tc:
        return sp, ctx.c_inner
    mfast, tapmajor = gather_order(kernel, ctx.view, bool(ctx.c_inner), sp.bk)
    return dataclasses.replace(sp, mfast=mfast, tapmajor=tapmajor), 1 if tapmajor else ctx.c_inner


def fwd(ctx: Ctx, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    """igemm_fwd: rows N x output positions, columns KG, reduction CG x taps, one grid z per group."""
    v = ctx.view
    base = base_tile(ctx.cpu, ctx.tc)
    sp, c_inner = _tc_order(ctx, "fwd", fit(base, v.y_positions, v.kg))
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, c_inner=c_inner, **bias_fields(bias))
    binds = (x.bind(1, "xo"), w.bind(2, "wo"), bias_bind(bias, 3), y.bind(4, "yo"))
    launch, why = _launch(ctx, sp, "igemm_fwd", v.y_positions, v.kg, v.G, args, binds, (x, w, y, bias))
    if launch is None:
        return None, [why]
    gemm = f"GEMM rows N x positions = {v.y_positions}, columns {v.kg}, reduction {v.cg} x {v.taps} tap(s)"
    return Part(f"igemm_fwd (opencl/igemm.cl): {sp.describe()}",
                [gemm + f", {v.G} group(s)", *sp.products, *_narrow(base, sp), *_order(sp)], [launch]), []


def bwd_data(ctx: Ctx, y: Operand, w: Operand, x: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    """igemm_bwd_data by phases (Note [bwd-data phases]): grid z = groups x S0*S1*S2 phases; rows N x the phase's
    positions, columns CG, reduction KG x the phase's taps."""
    v = ctx.view
    if not v.phased:
        return None, ["an axis with stride and dilation above 1 has no phases: the direct kernel"]
    base = base_tile(ctx.cpu, ctx.tc)
    largest = v.N * math.prod(-(-xx // s) for xx, s in zip(v.X, v.S))  # phase 0
    sp, c_inner = _tc_order(ctx, "bwd_data", fit(base, largest, v.cg))
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, c_inner=c_inner, **bias_fields(bias))
    binds = (y.bind(1, "yo"), w.bind(2, "wo"), bias_bind(bias, 3), x.bind(4, "xo"))
    phases = math.prod(v.S)
    launch, why = _launch(ctx, sp, "igemm_bwd_data", largest, v.cg, v.G * phases, args, binds, (x, w, y, bias))
    if launch is None:
        return None, [why]
    gemm = f"GEMM rows N x phase positions <= {largest}, columns {v.cg}, reduction {v.kg} x the phase's taps"
    return Part(f"igemm_bwd_data (opencl/igemm.cl) by phases ({phases} phase(s) x {v.G} group(s))",
                [sp.describe(), *sp.products, gemm, *_narrow(base, sp), *_order(sp)], [launch]), []


def bwd_weight(ctx: Ctx, x: Operand, y: Operand, w: Operand) -> tuple[Part | None, list[str]]:
    """igemm_bwd_weight: rows KG, columns CG x taps, reduction N x positions split over grid z; the splits' partial
    tiles added in split order by igemm_finalize (deterministic, no atomics)."""
    v, acc = ctx.view, ctx.acc_bytes
    base = weight_tile(base_tile(ctx.cpu, ctx.tc), v.kg)
    sp = fit(base, v.kg, v.cg * v.taps)
    if sp.tc and ctx.c_inner:  # channels-last: rows (k) and columns ((tap, c), c innermost) read along C
        sp = dataclasses.replace(sp, mfast=True)
    n_split, chunk = splits(v, sp, ctx.device.compute_units, acc)
    count = v.K * v.cg * v.taps
    part = count * n_split if n_split > 1 else 0
    # IG_MFAST's columns are channel-innermost (c_inner), in the kernel and in igemm_finalize alike
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, total=n_split, red=chunk, c_inner=int(sp.mfast))
    binds = (x.bind(1, "xo"), y.bind(2, "yo"), w.bind(3, "wo"), Bind(4, "partials" if part else "dummy"))
    launch, why = _launch(ctx, sp, "igemm_bwd_weight", v.kg, v.cg * v.taps, v.G * n_split, args, binds, (x, w, y),
                          extra=count * n_split)
    if launch is None:
        return None, [why]
    out = Part(f"igemm_bwd_weight (opencl/igemm.cl): {sp.describe()}",
               [f"GEMM rows {v.kg}, columns {v.cg} x {v.taps} tap(s), reduction N x positions = {v.y_positions}",
                *sp.products, *_narrow(base, sp),
                *(["loads along the rows and columns (channels-last)"] if sp.mfast else [])],
               [launch])
    if n_split == 1:
        out.decisions.append("1 split: no igemm_finalize")
        return out, []
    out.decisions.append(f"{n_split} splits of {chunk} positions, added in split order by igemm_finalize")
    out.buffers.append(Buffer("partials", (part,), (1,), ctx.acc_dtype))
    mod = ctx.module("igemm.cl", ctx.idx64(part, w), sp.defines)
    ls = min(16 if ctx.cpu else 64, ctx.limit(mod, "igemm_finalize"))
    fin = desc(v, ws=w.strides5, total=count, red=n_split, c_inner=int(sp.mfast))
    out.launches.append(make_launch(mod, "igemm_finalize", (count,), (ls,), fin,
                                    (Bind(1, "partials"), w.bind(2, "wo"))))
    return out, []
