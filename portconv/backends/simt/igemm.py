"""The implicit-GEMM launches (FMA and tensor-core tiles): tile rule, ring steps, staging, vectors, phases, splits."""
from __future__ import annotations

import math

from ...problem import ConvView
from ...tensors import dense_strides
from . import view as V
from .view import FLAG_COLTAP, FLAG_VA, FLAG_VB, Launches, Operand

FAMILIES = ("implicit_gemm", "igemm-tc")
FMA_TILE = (64, 64, 16)  # BM, BN, BK of cuda/conv_igemm.cuh as compiled here
TC_TILES = {"128x128": (128, 128, 2), "128x64": (128, 64, 4), "64x128": (64, 128, 2),  # BM, BN, warps along M
            "128x16": (128, 16, 8)}  # Note [narrow tiles]
RING_STEPS = 2  # Note [stage rows]: steps of 16 a ring stage (1.12x 16-bit, 1.07x TF32 over 1 on the H100)
WIDE_WEIGHT_N = 1536  # Note [tile rule]: weight gradients this wide take 128 x 128

# Note [tile rule] (docs/kernels/implicit-gemm.md): the tensor-core tile of an M x N GEMM (per group).
# - Note [narrow tiles]: up to 16 columns (backward-data of C_in = 1..16) take 128 x 16, 8 warps along M: a
#   64-column tile spent 75%-98% of every mma on padding columns.
# - Up to 64 columns take 128 x 64; up to 64 rows take 64 x 128 (32 x 32 warp tiles).
# - A weight gradient fills the device by splitting its reduction, not by tiles: from WIDE_WEIGHT_N columns it takes
#   128 x 128 (wav2vec2-conv1d 1.16x-1.27x over 128 x 64 on the H100).
# - TF32's forward / backward-data ring holds 3 stages at 128 x 64 and 2 at 128 x 128 (48 KB), so they take
#   128 x 64, as do reductions of under 8 steps (mostly epilogue, which two blocks an SM overlap) and GEMMs with
#   fewer 128 x 128 tiles than two an SM; the rest take 128 x 128.


def tile_rule(m: int, n: int, units: int, reduction: int = 0, tf32_ring: bool = False, weight: bool = False,
              forced: str | None = None) -> tuple[str, str]:
    """(TC_TILES name, why) of the tensor-core tile for an M x N GEMM over ``reduction`` terms (0: not said);
    ``tf32_ring``: a TF32 forward / backward-data; ``weight``: a weight gradient; ``forced``: Options.igemm_tile."""
    if forced is not None:
        return forced, "forced by options(igemm_tile)"
    if n <= 16:
        return "128x16", f"{n} columns (Note [narrow tiles])"
    if n <= 64:
        return "128x64", f"{n} columns"
    if m <= 64:
        return "64x128", f"{m} rows"
    if weight and n >= WIDE_WEIGHT_N:
        return "128x128", f"a weight gradient {n} columns wide"
    if tf32_ring:
        return "128x64", "TF32's ring holds 3 stages at 128 x 64"
    if 0 < reduction < 128:
        return "128x64", f"a reduction of {reduction}, under 8 steps"
    if -(-m // 128) * -(-n // 128) < 2 * max(units, 1):
        return "128x64", "under two 128 x 128 tiles an SM"
    return "128x128", "enough 128 x 128 tiles to fill the device"


def tc_tile(m: int, n: int, units: int, reduction: int = 0, tf32_ring: bool = False, weight: bool = False,
            forced: str | None = None) -> tuple[int, int, int]:
    """(BM, BN, warps along M) of the tensor-core tile (Note [tile rule])."""
    return TC_TILES[tile_rule(m, n, units, reduction, tf32_ring, weight, forced)[0]]


def ring_steps(ch: int) -> int:
    """Note [deep stages], Note [stage rows]: steps of 16 a stage of the tensor-core ring (PC_TC_KS) for tap-major
    steps over ``ch`` channels a tap: RING_STEPS, halved until a stage's 16 x steps channels divide ``ch``, so that
    no stage straddles a tap."""
    ks = RING_STEPS
    while ks > 1 and ch % (16 * ks):
        ks //= 2
    return ks


# Note [narrow backward-data] (cuda/conv_igemm.cuh): backward-data with at most NARROW_C channels of dX (one group, 2+
# taps, K >= NARROW_K) runs as a 1 x 1 column GEMM into a buffer of at most NARROW_COL_MAX values, then col2im
# (deepbench-speech-c1, C_in = 1, and resnet50-stem, C_in = 3; docs/kernels/implicit-gemm.md).
NARROW_C, NARROW_K = 4, 16
NARROW_COL_MAX = 1 << 28


def narrow_col(view: ConvView, w_shape, w_strides) -> bool:
    """Note [narrow backward-data]: whether backward-data (dX; a transposed forward's output) runs as the column GEMM
    and col2im: one group, at most NARROW_C channels of dX, two taps or more, at least NARROW_K channels of dY, a
    weight dense in (K, C, taps) or channels-last order (its (c, tap) block one run), every axis of stride 1 or
    dilation 1, a column buffer of at most NARROW_COL_MAX values."""
    w_shape, w_strides = tuple(w_shape), tuple(w_strides)
    dense = w_strides in (dense_strides(w_shape), dense_strides(w_shape, "channels_last"))
    return (view.G == 1 and view.C <= NARROW_C and view.taps > 1 and view.K >= NARROW_K and dense and view.phased
            and view.y_positions * view.C * view.taps <= NARROW_COL_MAX)


# Note [channels-last staging]: staging pays on the H100's dense rows when the GEMM does at least STAGE_MACS_PER_ELEM
# multiply-adds per staged element (the copy reads and writes each once; the vector modes save a share of a kernel
# whose time grows with the multiply-adds) and at least STAGE_MIN_MACS in all: the forward more, as it gains less
# than backward-data, whose element-wise B gathers the staged W replaces; the weight gradient most, as its TN tile
# ran as fast as the element gathers up to 3.7G multiply-adds in 16 bits (deepbench-b1-3x3's forward lost 1.4x-1.8x
# staged, its backward-data gained 1.3x-1.5x; docs/kernels/implicit-gemm.md). TF32 never stages for the TN tile: on
# every NCHW row it was slower than the element gathers (0.57x-0.82x).
STAGE_MACS_PER_ELEM = 128
STAGE_MIN_MACS = {"fwd": 1 << 30, "bwd_data": 1 << 27, "bwd_weight": 1 << 33}


def stage_pays(macs: int, elems: list[int], direction: str) -> bool:
    """Note [channels-last staging]: whether copying operands of ``elems`` elements to the vector modes' order is
    expected to save time on a ``direction`` GEMM of ``macs`` multiply-adds."""
    return bool(elems) and macs >= STAGE_MIN_MACS[direction] and macs >= STAGE_MACS_PER_ELEM * sum(elems)


class Igemm:
    """The implicit-GEMM launches of one result: the FMA tile ('implicit_gemm') or a tensor-core one ('igemm-tc')."""

    def __init__(self, L: Launches, forced_tile: str | None):
        self.L, self.t, self.v = L, L.target, L.view
        self.tc = self.t.algorithm == "igemm-tc"
        self.forced_tile = forced_tile

    def tile(self, m: int, n: int, reduction: int = 0, weight: bool = False, ch: int = 0) -> tuple[int, int, dict]:
        """(BM, BN, extra defines) of the tile for an M x N GEMM over ``reduction`` terms whose tap-major steps run over
        ``ch`` channels a tap (0: none): the FMA tile, or a tensor-core one (Note [tile rule]) with PC_TC_KS steps a
        ring stage (Note [stage rows])."""
        if not self.tc:
            return FMA_TILE[0], FMA_TILE[1], {}
        ring = self.t.item == 4 and not weight
        bm, bn, wm = tc_tile(m, n, self.t.units, reduction, ring, weight, self.forced_tile)
        why = tile_rule(m, n, self.t.units, reduction, ring, weight, self.forced_tile)[1]
        ks = ring_steps(ch)
        self.L.note(f"tile {bm}x{bn}, {wm} warps on M, ring stages of {ks} x 16: {why} (Note [tile rule])")
        return bm, bn, {"PC_TENSOR_CORES": 1, "PC_TC_BM": bm, "PC_TC_BN": bn, "PC_TC_WM": wm, "PC_TC_KS": ks}

    def vector_flags(self, a: Operand | None = None, b: Operand | None = None, b_axis: int = 1) -> int:
        """Note [vector gathers]: FLAG_VA / FLAG_VB for a tensor-core launch whose A / B tensors are a / b."""
        if not self.tc:
            return 0
        item = self.t.item
        flags = (FLAG_VA if V.vector_ok(a, item) else 0) | (FLAG_VB if V.vector_ok(b, item, b_axis) else 0)
        if flags:
            self.L.note("16-byte vector gathers of " + " and ".join(
                n for n, f in (("A", FLAG_VA), ("B", FLAG_VB)) if flags & f) + " (Note [vector gathers])")
        return flags

    def stages(self, reduce_ch: int, bm: int) -> bool:
        """Note [channels-last staging]: whether this launch may copy dense NCHW operands to the channel order of the
        vector modes: tensor cores, one group, reduction channels in 16s, a tile that takes vectors (128 rows for the
        16-bit types)."""
        return self.tc and self.v.G == 1 and reduce_ch % 16 == 0 and (bm == 128 or self.t.dtype == "float32")

    def to_stage(self, direction: str, macs: int, *ts: Operand) -> list[bool]:
        """Which of the operands ``ts`` to stage: the dense NCHW ones that are not channel-contiguous already, all of
        them or none as stage_pays decides."""
        need = [t is not None and V.nchw_dense(t) and not V.vector_ok(t, self.t.item) for t in ts]
        elems = [math.prod(t.shape) for t, n in zip(ts, need) if n]
        return need if stage_pays(macs, elems, direction) else [False] * len(ts)

    def transposed(self, t: Operand, batch: int, rows: int, cols: int, shape, strides, extra: dict) -> Operand:
        """Note [channels-last staging]: a buffer of ``shape`` / ``strides`` holding dense t [batch][rows][cols] as
        [batch][cols][rows] (one portconv_stage_transpose launch)."""
        out = self.L.buffer(f"stage.{t.role}", shape, strides)
        self.L.note(f"{t.role} staged channel-contiguous (Note [channels-last staging])")
        self.L.launch("portconv_stage_transpose", (-(-cols // 32), -(-rows // 32), batch), extra, x=t, y=out,
                      N=batch, C=rows, K=cols)
        return out

    def channels_last(self, t: Operand, extra: dict) -> Operand:
        """Note [channels-last staging]: dense NCHW t as a channels-last copy."""
        return self.transposed(t, t.shape[0], t.shape[1], math.prod(t.shape[2:]), t.shape,
                               dense_strides(t.shape, "channels_last"), extra)

    def fwd(self, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> None:
        v = self.v
        cg, kg = v.C // v.G, v.K // v.G
        bm, bn, extra = self.tile(v.y_positions, kg, cg * v.taps, ch=cg)
        grid = (-(-v.y_positions // bm), -(-kg // bn), v.G)
        if self.stages(cg, bm):
            sx, sw = self.to_stage("fwd", v.y_positions * v.K * v.C * v.taps, x, w)
            if sx:
                x = self.channels_last(x, extra)
            if sw:
                w = self.transposed(w, v.K, v.C, v.taps, w.shape, dense_strides(w.shape, "channels_last"), extra)
        self.L.launch("portconv_igemm_fwd", grid, extra, x=x, w=w, y=y, b=bias, xs=V.strides5(x), wst=V.strides5(w),
                      ys=V.strides5(y), bs=V.bias_stride(bias), flags=self.vector_flags(x, w))

    def bwd_data(self, dx: Operand, w: Operand, dy: Operand, bias: Operand | None) -> None:
        v = self.v
        if narrow_col(v, w.shape, w.strides):
            return self.bwd_data_col(dx, w, dy, bias)
        cg, kg = v.C // v.G, v.K // v.G
        if not (self.tc and v.phased):
            bm, bn, extra = self.tile(v.x_positions, cg, kg * v.taps)
            grid = (-(-v.x_positions // bm), -(-cg // bn), v.G)
            self.L.launch("portconv_igemm_bwd_data", grid, extra, x=dx, w=w, y=dy, b=bias, xs=V.strides5(dx),
                          wst=V.strides5(w), ys=V.strides5(dy), bs=V.bias_stride(bias))
            return
        # Note [bwd-data phases]: a GEMM per phase (position modulo the stride), grid z over groups x phases
        phases = math.prod(v.S)
        self.L.note(f"{phases} phase GEMM{'s' * (phases > 1)} (Note [bwd-data phases])")
        phase0 = v.N * -(-v.X[0] // v.S[0]) * -(-v.X[1] // v.S[1]) * -(-v.X[2] // v.S[2])
        bm, bn, extra = self.tile(phase0, cg, kg * v.taps // math.prod(v.S), ch=kg)
        grid = (-(-phase0 // bm), -(-cg // bn), v.G * math.prod(v.S))
        if self.stages(kg, bm):
            # W's K is contiguous in no dense layout: a dense W (K outermost, KCRS or KRSC) is staged whenever dY is,
            # or when dY is channels-last already
            macs = v.x_positions * v.C * v.K * v.taps
            (sy,) = self.to_stage("bwd_data", macs, dy)
            w_dense = w.strides in (dense_strides(w.shape), dense_strides(w.shape, "channels_last"))
            sw = w_dense and (sy or V.vector_ok(dy, self.t.item)) and stage_pays(
                macs, [math.prod(w.shape)] + ([math.prod(dy.shape)] if sy else []), "bwd_data")
            if sy:
                dy = self.channels_last(dy, extra)
            if sw:  # W [K][rest] -> [rest][K], rest in W's own order: K contiguous
                w = self.transposed(w, 1, v.K, v.C * v.taps, w.shape, (1,) + tuple(v.K * s for s in w.strides[1:]),
                                    extra)
        self.L.launch("portconv_igemm_bwd_data_phase", grid, extra, x=dx, w=w, y=dy, b=bias, xs=V.strides5(dx),
                      wst=V.strides5(w), ys=V.strides5(dy), bs=V.bias_stride(bias),
                      flags=self.vector_flags(dy, w, b_axis=0))

    def bwd_data_col(self, dx: Operand, w: Operand, dy: Operand, bias: Operand | None) -> None:
        """Note [narrow backward-data]: col = dY x W as a 1 x 1 forward GEMM (M = N*Y positions, N = C*taps columns in
        W's memory order, reduction K), then dX = col2im(col) (+ bias)."""
        v = self.v
        cols, per = v.C * v.taps, v.Y[0] * v.Y[1] * v.Y[2]
        self.L.note(f"a column GEMM of {cols} columns, then col2im (Note [narrow backward-data])")
        one = ConvView(v.N, v.K, cols, 1, v.Y, v.Y, (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
        col = self.L.workspace("col", v.y_positions * cols)
        col_st = (cols * per, per, v.Y[1] * v.Y[2], v.Y[2], 1)
        bm, bn, extra = self.tile(v.y_positions, cols, v.K, ch=v.K)
        wst = w.strides  # W as the (C taps) x K weight of the 1 x 1 forward: row j at j, column k at k*ws0
        self.L.launch("portconv_igemm_col", (-(-v.y_positions // bm), -(-cols // bn), 1), extra, x=dy, w=w, ws=col,
                      xs=V.strides5(dy), wst=(1, wst[0], 0, 0, 0), ys=col_st, view=one, flags=self.vector_flags(dy))
        tapmajor = v.C > 1 and wst[1] == 1  # channels-last W: (tap, c) order
        self.L.launch("portconv_col2im", self.L.elementwise_grid(v.N * v.C * v.X[0] * v.X[1] * v.X[2]), extra, x=dx,
                      b=bias, ws=col, xs=V.strides5(dx), ys=col_st, bs=V.bias_stride(bias),
                      flags=FLAG_COLTAP if tapmajor else 0)

    def bwd_weight(self, x: Operand, dy: Operand, dw: Operand) -> None:
        v = self.v
        cg, kg = v.C // v.G, v.K // v.G
        count, total = v.K * cg * v.taps, v.y_positions
        bk = FMA_TILE[2]
        bm, bn, extra = self.tile(kg, cg * v.taps, total, weight=True)
        tiles = (-(-kg // bm), -(-(cg * v.taps) // bn))
        splits, chunk = V.splits_for(tiles[0] * tiles[1] * v.G, total, 32 * bk, self.t.units, count, bk)
        splits = min(splits, V.GRID_YZ_MAX // v.G)
        chunk = -(-total // splits)
        splits = -(-total // chunk)
        flags = 0
        ve = 16 // self.t.item
        if self.tc and cg % ve == 0 and kg % ve == 0:
            # Note [TN tiles]: dY and X channel-contiguous; 16-bit dense NCHW ones staged when it pays (Note
            # [channels-last staging]: not TF32); the kernel takes the TN tile when both vector flags are set
            stage = v.G == 1 and self.t.item == 2
            sy, sx = self.to_stage("bwd_weight", count * total, dy, x) if stage else (False, False)
            dy = self.channels_last(dy, extra) if sy else dy
            x = self.channels_last(x, extra) if sx else x
            flags = self.vector_flags(dy, x)
            if flags == FLAG_VA | FLAG_VB:
                self.L.note("the TN tile (Note [TN tiles])")
        ws = self.L.workspace("ws", splits * count) if splits > 1 else None
        self.L.launch("portconv_igemm_bwd_weight", (tiles[0], tiles[1], v.G * splits), extra, x=x, w=dw, y=dy, ws=ws,
                      xs=V.strides5(x), wst=V.strides5(dw), ys=V.strides5(dy), splits=splits, chunk=chunk,
                      flags=flags)
        if splits > 1:
            self.L.finalize(count, splits, extra, w=dw, ws=ws, wst=V.strides5(dw), C=cg)
