"""The depthwise launches: the kernel per direction (rows, tile, planes, per-element), strips, planes, splits."""
from __future__ import annotations

import math

from ...dwbands import DIRECTIONS, bands_kernels, dw_bands, dwb_defines, dwb_phases, dwb_splits, dwb_vh
from ...dwclw import DWC_GEOMETRY, DWC_VC, clw_defines, clw_grid, clw_kernels, clw_phases, clw_splits, clw_vw
from ...problem import ConvView
from . import view as V
from .view import THREADS, Launches, Operand

DW_TAPS = 9  # PC_DW_TAPS of cuda/conv_depthwise.cuh: weight-gradient taps a block of the per-element kernel
DW_V = 4  # PC_DW_V of cuda/conv_depthwise_rows.cuh: outputs per thread along the last spatial axis
# Note [whole-row strips]: a view whose last axis is at most DW_V_ROW long in X and Y (MobileNetV2's 7x7 planes) builds
# the 'rows' kernels with PC_DW_V = DW_V_ROW: one strip a row instead of a 4-wide and a 3-wide one, half the threads,
# 10 window loads a source row for 7 outputs instead of 6 + 5 (H100, mbv2-dw3x3-last: 1.17x forward, 1.16x
# backward-data; docs/kernels/depthwise.md).
DW_V_ROW = 8
# Where only the weight gradient runs a 'rows' kernel of a wider 16-bit NCHW view (forward and backward-data on the
# tile kernels), PC_DW_V = DW_V_WIDE16 (H100, mbv2-dw3x3-bf16 weight gradient 1.26x over 4); float32 and 3-D weight
# gradients are slower with wider strips.
DW_V_WIDE16 = 16
# Output rows x columns per thread of the fwd/bwd-data tile kernels of cuda/conv_depthwise_tile.cuh, per family (its
# PC_DWT_THN/VWN, _THN16/VWN16, _TH3/VW3, _THC/VWC, _THC3/VWC): 'tilen_s*' (2-D NCHW; 'nchw16' in 16-bit types, Note
# [packed rows]), 'tilen3d_s*', 'tile_s*' (2-D channels-last), 'tile3d_s*'
DW_TILE = {"nchw": (8, 2), "nchw16": (8, 4), "nchw3d": (8, 2), "cl": (14, 2), "cl3d": (4, 2),
           "w4": (8, 2)}  # 'w4': the weight gradient's unit with 4 channels a thread (PC_DWT_THW4, _VWW4)
# Note [depthwise tile]: the tile kernels run fwd / bwd-data on channels-last data, and on NCHW data with at least
# DW_TILE_MIN_ROWS output rows and DW_TILE_MIN_WORK 4 x 4 output tiles (smaller planes and under-filled grids run
# faster on 'rows'; mbv2-dw3x3-b1's 25088 on the 8 x 2 tile)
DW_TILE_MIN_ROWS = 16
DW_TILE_MIN_WORK = 1 << 14
# Note [depthwise planes] (cuda/conv_depthwise_planes.cuh): 2-D NCHW 3x3 stride-1 forward / backward-data on planes of
# at most DWP_PLANE elements (X and Y) where the tile kernels do not run. A chunk is the whole planes that give about
# DWP_UNITS threads a result column (Note [plane columns]), rounded down so that chunks start 16-byte aligned, at most
# DWP_MAX_BYTES of shared memory for two source buffers and a result buffer. The view's module is built with that
# memory in DWP_STEP steps (PC_DWP_BYTES) and for the blocks an SM it leaves, at most DWP_BLOCKS[element size]
# (PC_DWP_MINB; the registers that leaves hold the float32 body at 6 blocks, 16-bit at 5, float64 at 4 without
# spills); the grid is that many blocks an SM (H200, mbv2-dw3x3-last forward: 1.12x at 6 blocks over 4).
DWP_PLANE, DWP_UNITS, DWP_MAX_BYTES, DWP_STEP = 256, 256, 49152, 8192
DWP_BLOCKS = {2: 5, 4: 6, 8: 4}  # 0: a block a chunk
DWP_SM_BYTES = {"sm_90": 233472, "sm_100": 233472, "sm_80": 167936, "sm_87": 167936}  # shared memory an SM (grids)
DWP_SM_BYTES_OTHER = 102400  # other NVIDIA GPUs; AMD GPUs: 65536 (an LDS)


def depthwise_kernels(view: ConvView, cl: bool = False, dtype: str = "float32") -> dict[str, str]:
    """The depthwise kernel suffix per view direction ('plain': the per-element weight gradient of
    cuda/conv_depthwise.cuh); ``cl``: channels-last results. Pure in the view, the layout and the dtype."""
    r0, r1, r2 = view.R
    s1, s2, d2 = view.S[1], view.S[2], view.DL[2]
    tap3 = r2 == 3 and d2 == 1
    fwd = f"rows3s{s2}" if tap3 and s2 in (1, 2) else "rows"
    bwd_data = f"rows3s{s2}" if tap3 and s2 in (1, 2) else "rows"
    ok_w = tap3 and r1 == 3 and view.DL[1] == 1 and r0 in (1, 3) and (r0 == 1 or view.DL[0] == 1) and s2 in (1, 2)
    bwd_weight = f"rows{3 if r0 == 3 else 2}d_s{s2}" if ok_w else "plain"
    # Note [depthwise tile]: 3x3 in-plane taps, dilation 1, equal in-plane strides, channel multiplier 1
    plane = tap3 and r1 == 3 and view.DL[1] == 1 and s1 == s2 and s2 in (1, 2) and view.K == view.C
    ext = view.Y
    big = (ext[1] >= DW_TILE_MIN_ROWS
           and view.N * ext[0] * -(-ext[1] // 4) * -(-ext[2] // 4) * view.C >= DW_TILE_MIN_WORK)
    if plane and (cl or big):
        tile = f"tile{'' if cl else 'n'}{'' if r0 == 1 else '3d'}_s{s2}"
        fwd = tile
        if s2 == 1:
            bwd_data = tile
    if plane and cl and ok_w:
        bwd_weight = f"tile{3 if r0 == 3 else 2}d_s{s2}"
    small = max(view.X[1] * view.X[2], view.Y[1] * view.Y[2]) <= DWP_PLANE and r0 == 1 and view.X[0] == 1
    if plane and s2 == 1 and not cl and small and fwd == "rows3s1":  # Note [depthwise planes]
        fwd = bwd_data = "planes"
    fwd, bwd_data, bwd_weight = (b or k for b, k in zip(bands_kernels(view, dtype), (fwd, bwd_data, bwd_weight)))
    fwd, bwd_data, bwd_weight = (c or k for c, k in zip(clw_kernels(view, cl, dtype), (fwd, bwd_data, bwd_weight)))
    return {"fwd": fwd, "bwd_data": bwd_data, "bwd_weight": bwd_weight}


def dw_planes(view: ConvView, direction: str, item: int) -> tuple[int, int]:
    """(planes a chunk, shared bytes they take) of the 'planes' kernel in a direction (Note [depthwise planes])."""
    src, dst = (view.X, view.Y) if direction == "fwd" else (view.Y, view.X)
    s_hw, d_hw = src[1] * src[2], dst[1] * dst[2]
    p = min(max(1, DWP_UNITS // dst[2]), (DWP_MAX_BYTES - 32) // ((2 * s_hw + d_hw) * item))
    q = math.lcm(16 // math.gcd(s_hw * item, 16), 16 // math.gcd(d_hw * item, 16))  # planes a 16-byte step
    p = max(1, p - p % q if p >= q else p)
    return p, (2 * s_hw + d_hw) * item * p + 32


def dwp_build(view: ConvView, item: int, arch: str) -> tuple[int, int]:
    """(PC_DWP_BYTES, blocks an SM) of a view's 'planes' module: the shared memory of its larger direction in
    DWP_STEP steps, and the blocks an SM that leaves (at most DWP_BLOCKS[item]; 0: a block a chunk)."""
    need = max(dw_planes(view, d, item)[1] for d in ("fwd", "bwd_data"))
    smem = min(DWP_MAX_BYTES, max(2 * DWP_STEP, -(-need // DWP_STEP) * DWP_STEP))
    sm = 65536 if arch.startswith("gfx") else DWP_SM_BYTES.get(arch, DWP_SM_BYTES_OTHER)
    cap = DWP_BLOCKS[item]
    return smem, min(cap, sm // (smem + 1024)) if cap > 0 else 0


def dw_tile_key(cl: bool, rank: int, dtype: str) -> str:
    """The DW_TILE entry of the fwd/bwd-data tile kernels for a layout, spatial rank and dtype."""
    if cl:
        return "cl3d" if rank == 3 else "cl"
    return "nchw3d" if rank == 3 else "nchw16" if dtype in ("float16", "bfloat16") else "nchw"


def dw_v(view: ConvView, dtype: str, cl: bool, ks: dict[str, str]) -> int:
    """PC_DW_V of the view's 'rows' kernels (Note [whole-row strips]); ``ks``: its depthwise_kernels."""
    if max(view.X[2], view.Y[2]) <= DW_V_ROW:
        return DW_V_ROW
    only_weight = ks["bwd_weight"].startswith("rows") and all(ks[d].startswith("tile") for d in ("fwd", "bwd_data"))
    if dtype in ("float16", "bfloat16") and not cl and view.X[0] == 1 and only_weight:
        return DW_V_WIDE16
    return DW_V


def depthwise_work(view: ConvView, direction: str, kernel: str, cl: bool, dtype: str, rows_v: int) -> int:
    """Work items (threads of a grid-stride loop) of a depthwise 'rows*' (strips of ``rows_v``) or 'tile*' fwd /
    bwd_data kernel."""
    ext, ch = (view.Y, view.K) if direction == "fwd" else (view.X, view.C)
    if kernel.startswith("tile"):
        vc = DWC_VC[dtype] if cl and ch % DWC_VC[dtype] == 0 else 1
        th, vw = DW_TILE[dw_tile_key(not kernel.startswith("tilen"), 3 if "3d" in kernel else 2, dtype)]
        return view.N * ext[0] * -(-ext[1] // th) * -(-ext[2] // vw) * (ch // vc)
    return view.N * ext[0] * ext[1] * -(-ext[2] // rows_v) * ch


N16_PATHS = {4: "as quads (Note [quad rows])", 1: "as pairs, P2 even (Note [packed rows])",
             2: "as pairs, P2 odd (Note [packed rows])", 0: "one element an access"}


def n16_rows(view: ConvView, x: Operand, y: Operand) -> int:
    """Note [rows by plan] (cuda/conv_depthwise_tile.cuh): PC_DWT_N16 of a 16-bit 2-D NCHW tile launch (the 'tilen'
    kernels at in-plane stride 1 or 2) whose argument block binds ``x`` and ``y``: 4 (Note [quad rows]) at stride 1
    where the window starts a column left of the strip (P2 1), the rows are a multiple of 4 and as long on both
    sides, and every stride but the unit last one is a multiple of 4 with 8-byte-aligned bases; else 1 or 2 (Note
    [packed rows]; P2 even or odd) where the last axis is unit-stride, every other stride even and the bases 4-byte
    aligned; else 0 (one element an access)."""
    xs, ys = V.strides5(x), V.strides5(y)
    unit = xs[4] == 1 and ys[4] == 1
    if (view.S[2] == 1 and unit and view.K == view.C and view.P[2] == 1 and view.X[2] % 4 == 0
            and view.Y[2] == view.X[2] and view.R[0] == 1 and view.S[0] == 1 and view.P[0] == 0
            and all(s % 4 == 0 for s in xs[:4] + ys[:4]) and x.layout.misalign % 8 == 0
            and y.layout.misalign % 8 == 0):
        return 4
    if (unit and all(s % 2 == 0 for s in xs[:4] + ys[:4]) and x.layout.misalign % 4 == 0
            and y.layout.misalign % 4 == 0):
        return 2 if view.P[2] % 2 else 1
    return 0


def depthwise_weight_grid(view: ConvView, kernel: str, cl: bool, dtype: str, units: int,
                          rows_v: int) -> tuple[tuple, int, int]:
    """(grid, splits, chunk) of a depthwise 'rows*d' (strips of ``rows_v``) or 'tile*d' weight-gradient kernel
    (deterministic splits)."""
    v = view
    if kernel.startswith("clw"):  # grid (splits, channel tiles) over (n, row, strip) units (Note [depthwise clw])
        splits, tiles, chunk = clw_splits(v, dtype, units)
        return (splits, tiles, 1), splits, chunk
    if kernel.startswith("bands"):  # grid (K, splits) over units (Note [depthwise bands])
        splits, chunk = dwb_splits(v, dtype, units)
        return (v.K, splits, 1), splits, chunk
    if kernel.startswith("tile"):  # grid (channel tiles, splits) over (n, o0, row tile, strip) units
        vc = min(DWC_VC[dtype], 2) if kernel.startswith("tile3d") else DWC_VC[dtype]
        vc = vc if cl and v.C % vc == 0 else 1
        cv = v.C // vc
        ct = 16 if cv % 16 == 0 else min(cv, 8)  # pc_dwt_channel_tile
        tiles, groups = -(-cv // ct), THREADS // ct
        th, vw = DW_TILE["w4"] if vc >= 4 else (2, 4)  # PC_DWT_THW, PC_DWT_VWW: the kernel splits its units itself
        work = v.N * v.Y[0] * -(-v.Y[1] // th) * -(-v.Y[2] // vw)
        target = 3 * max(units, 1)  # few splits: each is a partial sum the finalize reads back
        splits = max(1, min(-(-target // tiles), -(-work // (4 * groups)), V.GRID_YZ_MAX))
    else:  # grid (K, splits) over strips
        tiles = v.K
        work = v.N * v.Y[0] * v.Y[1] * -(-v.Y[2] // rows_v)
        target = 16 * max(units, 1)  # blocks: bandwidth-bound, so fill every SM several times
        splits = max(1, min(-(-target // v.K), -(-work // (2 * THREADS)), V.GRID_YZ_MAX))
    chunk = -(-work // splits)
    splits = -(-work // chunk)
    return (tiles, splits, 1), splits, chunk


class ViewKernels:
    """The depthwise choices of one view and result layout: the kernel per direction, the 'rows' strip width and the
    'planes' module's shared memory and blocks an SM; ``family_defines``: what each family's modules add
    (defines_of)."""

    def __init__(self, view: ConvView, dtype: str, cl: bool, arch: str):
        self.view, self.dtype, self.cl = view, dtype, cl
        self.kernels = depthwise_kernels(view, cl, dtype)
        self.rows_v = dw_v(view, dtype, cl, self.kernels)
        self.dwp_blocks = 0
        planes = {}
        if "planes" in self.kernels.values():  # Note [depthwise planes]: the view's shared memory and blocks an SM
            smem, self.dwp_blocks = dwp_build(view, V.ITEM[dtype], arch)
            planes = {"PC_DWP_BYTES": smem, "PC_DWP_MINB": max(1, self.dwp_blocks)}
        # Defines of one family, given to its launches only: the plan's other modules (the finalize's among them)
        # do not read them, so they build once for every view (Note [compile ahead]). Note [whole-row strips]: the
        # 'rows' strip width where it is not the default; Note [depthwise planes]; Note [depthwise bands]: shared
        # memory, filter-row steps and rows a thread, sized for the directions that run 'bands'; Note [depthwise
        # clw]: the filter and the dtype's geometry.
        ks = tuple(self.kernels[d] for d in DIRECTIONS)
        bands = tuple(k if k.startswith("bands") else "" for k in ks)
        g = DWC_GEOMETRY[dtype]
        clw = {**clw_defines(view, dtype), "MINB": g.minb, "MINBW": g.minbw} if any(k.startswith("clw") for k in ks) \
            else {}
        self.family_defines: dict[str, dict[str, int]] = {
            "rows": {} if self.rows_v == DW_V else {"PC_DW_V": self.rows_v},
            "planes": planes,
            "bands": {"PC_DWB_" + k: v for k, v in dwb_defines(view, dtype, bands).items()},
            "clw": {"PC_DWC_" + k: v for k, v in clw.items()}}

    def defines_of(self, kernel: str) -> dict[str, int] | None:
        """The family defines of a kernel suffix ('rows3s2', 'bands_s1', 'clw_s2', ...), None for the families
        without defines of their own."""
        name = kernel.lstrip("_")
        return next((d for f, d in self.family_defines.items() if name.startswith(f)), None)


class Depthwise:
    """The depthwise launches of one result."""

    def __init__(self, L: Launches, vk: ViewKernels):
        self.L, self.t, self.v, self.vk = L, L.target, L.view, vk

    def _spatial(self, direction: str, src: Operand, dst: Operand) -> tuple[str, tuple[int, int, int], int]:
        """(kernel suffix, grid, a.chunk) of a fwd or bwd_data launch: 'planes' where src and dst are NCHW-dense (a
        chunk of planes a block, dwp_blocks blocks an SM at most: Note [depthwise planes]), else 'rows3s1'."""
        v, kernel = self.v, self.vk.kernels[direction]
        if kernel == "planes":
            if V.nchw_dense(src) and V.nchw_dense(dst):
                chunk = dw_planes(v, direction, self.t.item)[0]
                blocks = -(-(v.N * v.C) // chunk)
                if self.vk.dwp_blocks:
                    blocks = min(blocks, self.t.units * self.vk.dwp_blocks)
                self.L.note(f"'planes': {chunk} planes a block in shared memory (Note [depthwise planes])")
                return "_planes", (blocks, 1, 1), chunk
            self.L.note("'rows3s1': its tensors are not NCHW-dense, so not 'planes' (Note [depthwise planes])")
            kernel = "rows3s1"
        if kernel.startswith("bands"):
            planes, bands, _ = dw_bands(v, direction, self.t.dtype)
            results = v.N * (v.K if direction == "fwd" else v.C)
            self.L.note(f"'{kernel}': {planes} plane(s) a block, {bands} band(s) a plane, {dwb_vh(v)} rows a thread "
                        "(Note [depthwise bands])")
            return "_" + kernel, (-(-results // planes) * bands, len(dwb_phases(v, direction)), 1), planes
        if kernel.startswith("clw"):  # Note [depthwise clw]: (spatial tiles, channel tiles)
            ct, blocks, tiles_c = clw_grid(v, direction, self.t.dtype, self.t.units)
            g, phases = DWC_GEOMETRY[self.t.dtype], clw_phases(v, direction)
            how = f", {phases} phases (Note [clw phases])" if phases > 1 else " (Note [depthwise clw])"
            self.L.note(f"'{kernel}': {ct} channel group(s) a block, {g.th}x{clw_vw(v, self.t.dtype)} outputs a "
                        f"lane{how}")
            return "_" + kernel, (blocks, tiles_c, phases), 1
        self._describe(direction, kernel)
        work = depthwise_work(v, direction, kernel, self.vk.cl, self.t.dtype, self.vk.rows_v)
        return "_" + kernel, self.L.elementwise_grid(work), 1

    def _describe(self, direction: str, kernel: str) -> None:
        if kernel.startswith("tile") and direction != "bwd_weight":
            th, vw = DW_TILE[dw_tile_key(self.vk.cl, 3 if "3d" in kernel else 2, self.t.dtype)]
            self.L.note(f"'{kernel}': {th}x{vw} outputs a thread (Note [depthwise tile])")
        elif kernel.startswith("tile"):
            self.L.note(f"'{kernel}': channel tiles a block, split over positions (Note [depthwise tile])")
        elif kernel.startswith("bands"):
            self.L.note(f"'{kernel}': a channel a block, staged bands of positions (Note [depthwise bands])")
        elif kernel.startswith("clw"):
            self.L.note(f"'{kernel}': a filter row of channel groups a lane, split over positions (Note [depthwise "
                        "clw])")
        elif kernel.startswith("rows"):
            self.L.note(f"'{kernel}': strips of {self.vk.rows_v} outputs a thread (Note [depthwise rows])")
        else:
            self.L.note(f"per-element weight gradient, {DW_TAPS} taps a block")

    def _defines(self, suffix: str, x: Operand, y: Operand) -> dict[str, int] | None:
        """The module defines of a fwd or bwd_data launch binding ``x`` and ``y``: its family's, and the 16-bit 2-D
        NCHW tile kernels' row path (Note [rows by plan])."""
        if self.t.item == 2 and suffix in ("_tilen_s1", "_tilen_s2"):
            n16 = n16_rows(self.v, x, y)
            self.L.note(f"rows read {N16_PATHS[n16]} (Note [rows by plan])")
            return {"PC_DWT_N16": n16}
        return self.vk.defines_of(suffix)

    def fwd(self, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> None:
        suffix, grid, chunk = self._spatial("fwd", x, y)
        self.L.launch("portconv_depthwise_fwd" + suffix, grid, self._defines(suffix, x, y), x=x, w=w, y=y, b=bias,
                      xs=V.strides5(x), wst=V.strides5(w), ys=V.strides5(y), bs=V.bias_stride(bias), chunk=chunk)

    def bwd_data(self, dx: Operand, w: Operand, dy: Operand, bias: Operand | None) -> None:
        suffix, grid, chunk = self._spatial("bwd_data", dy, dx)
        self.L.launch("portconv_depthwise_bwd_data" + suffix, grid, self._defines(suffix, dx, dy), x=dx, w=w, y=dy,
                      b=bias, xs=V.strides5(dx), wst=V.strides5(w), ys=V.strides5(dy), bs=V.bias_stride(bias),
                      chunk=chunk)

    def bwd_weight(self, x: Operand, dy: Operand, dw: Operand) -> None:
        v, kernel = self.v, self.vk.kernels["bwd_weight"]
        count = v.K * (v.C // v.G) * v.taps
        self._describe("bwd_weight", kernel)
        if kernel != "plain":
            grid, splits, chunk = depthwise_weight_grid(v, kernel, self.vk.cl, self.t.dtype, self.t.units,
                                                        self.vk.rows_v)
            name = "portconv_depthwise_bwd_weight_" + kernel
        else:
            chunks = -(-v.taps // DW_TAPS)
            splits, chunk = V.splits_for(v.K * chunks, v.y_positions, 4 * THREADS, self.t.units, count)
            grid, name = (v.K * chunks, splits, 1), "portconv_depthwise_bwd_weight"
        ws = self.L.workspace("ws", splits * count) if splits > 1 else None
        self.L.launch(name, grid, self.vk.defines_of(kernel), x=x, w=dw, y=dy, ws=ws, xs=V.strides5(x),
                      wst=V.strides5(dw), ys=V.strides5(dy), splits=splits, chunk=chunk)
        if splits > 1:
            self.L.finalize(count, splits, w=dw, ws=ws, wst=V.strides5(dw), C=v.C // v.G)
