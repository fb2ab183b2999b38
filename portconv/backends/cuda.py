"""The cuda backend: portconv's CUDA kernel set (cuda/*.cu) compiled with NVRTC and launched through CuPy."""
from __future__ import annotations

import dataclasses
import math
import os

from ..device import Availability, DeviceInfo
from ..errors import Unsupported, VendorImportError
from ..tensors import FLOATING, dense_strides
from . import Backend, BackendId, Choice, Problem, _cupy, _replay

# The kernel argument block, in cuda/common.cuh's order (tests/test_cuda_compile.py checks the two agree).
ARG_FIELDS = (("x", 1), ("w", 1), ("y", 1), ("b", 1), ("ws", 1), ("N", 1), ("C", 1), ("K", 1), ("G", 1),
              ("X", 3), ("Y", 3), ("R", 3), ("S", 3), ("P", 3), ("DL", 3), ("xs", 5), ("ws_", 5), ("ys", 5),
              ("bs", 1), ("splits", 1), ("chunk", 1), ("flags", 1))
ARG_COUNT = sum(n for _, n in ARG_FIELDS)
FLAG_CL = 1
FLAG_VA, FLAG_VB = 2, 4  # Note [vector gathers] (cuda/conv_igemm_tc.cuh): A / B may be read 16 bytes at a time
FLAG_WARP = 8  # Note [warp finalize]: portconv_split_finalize sums a value with a warp
FLAG_COLTAP = 16  # Note [narrow backward-data]: portconv_col2im's columns are (tap, c) (W channels-last)
DTYPE_CODE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
ENTRY = {"direct": "direct.cu", "depthwise": "depthwise.cu", "implicit_gemm": "igemm.cu", "igemm-tc": "igemm.cu"}
PREFIX = {"direct": "portconv_direct", "depthwise": "portconv_depthwise", "implicit_gemm": "portconv_igemm",
          "igemm-tc": "portconv_igemm"}
IGEMM_TILE = (64, 64, 16)  # BM, BN, BK of cuda/conv_igemm.cuh as compiled here
IGEMM_ALGS = ("implicit_gemm", "igemm-tc")
# Note [tensor-core implicit GEMM] (cuda/conv_igemm_tc.cuh): mma.sync per dtype; TF32 for float32 only when the
# plan's math is 'tf32' (torch's cuDNN conv precision policy allows it, as for the cudnn backend).
TC_MMA = {"float16": "mma.sync fp16 m16n8k16, fp32 accumulate", "bfloat16": "mma.sync bf16 m16n8k16, fp32 accumulate",
          "float32": "mma.sync tf32 m16n8k8 (operands rounded to TF32), fp32 accumulate"}
# "64x128": 32 x 32 warp tiles since v8 (64 x 16 before, kept as "64x128w1" for before / after: its 8 warps each read
# the whole 64-row A slab; H100 sweep, docs/performance/h100-2026-11-25h call 5: weight gradients 1.00x-1.06x)
TC_TILES = {"128x128": (128, 128, 2), "128x64": (128, 64, 4), "64x128": (64, 128, 2),  # BM, BN, warps along M
            "128x16": (128, 16, 8),  # Note [narrow tiles]
            "64x128w1": (64, 128, 1)}
TC_TILE_ENV = "PORTCONV_CUDA_IGEMM_TC_TILE"  # force one TC_TILES entry for every launch (experiments)
TC_V4_ENV = "PORTCONV_CUDA_IGEMM_TC_V4"  # "1": the v4 tile (no ldmatrix, no vector gathers; before/after timings)
TC_V5_ENV = "PORTCONV_CUDA_IGEMM_TC_V5"  # "1": the v5 kernels (weight gradient without Note [TN tiles]; before/after)
TC_V6_ENV = "PORTCONV_CUDA_IGEMM_TC_V6"  # "1": v6 (TF32 without Note [TF32 ldmatrix] and its ring, v6's tile rule)
TC_V8_ENV = "PORTCONV_CUDA_IGEMM_TC_V8"  # "1": v8's TN copy order (Note [TN copy order]; before/after timings)
TC_KS_ENV = "PORTCONV_CUDA_IGEMM_TC_KS"  # "1", "2", "4": steps a ring stage (Note [deep stages]; before/after timings)
TC_KS = ("1", "2", "4")
TC_KS_DEFAULT = 2  # Note [stage rows] (H100, docs/performance/h100-2026-11-25h call 4): 1.12x 16-bit, 1.07x TF32 over 1
THREADS = 256
# Note [warp finalize] (cuda/reduce.cuh): the finalize sums a value with a warp from WARP_FINALIZE splits and up to
# WARP_FINALIZE_MAX values (more values fill the GPU with a thread a value, and its loads coalesce)
WARP_FINALIZE, WARP_FINALIZE_MAX = 16, 16384
DW_TAPS = 9  # PC_DW_TAPS of cuda/conv_depthwise.cuh
DW_V = 4  # PC_DW_V of cuda/conv_depthwise_rows.cuh: outputs per thread along the last spatial axis
# Note [whole-row strips]: a view whose last axis is at most DW_V_ROW long in X and Y (MobileNetV2's 7x7 planes) builds
# the 'rows' kernels with PC_DW_V = DW_V_ROW (a module build of its own): one strip a row instead of a 4-wide and a
# 3-wide one, half the threads, 10 window loads a source row for 7 outputs instead of 6 + 5 for 4 + 3. H100:
# mbv2-dw3x3-last forward 0.0142 -> 0.0121 ms, backward-data 0.0149 -> 0.0129 (held; notes-depthwise-v3.md "v11")
DW_V_ROW = 8
# and where only the weight gradient runs a 'rows' kernel of a wider 16-bit NCHW view (forward and backward-data on
# the tile kernels), PC_DW_V = DW_V_WIDE16: H100, mbv2-dw3x3-bf16 weight gradient 0.0746 -> 0.0592 ms held (8:
# 0.0636); float32 and 3-D weight gradients are slower with wider strips (mbv2-dw3x3 0.0713 -> 0.0952 at 8)
DW_V_WIDE16 = 16
# Output rows x columns per thread of the fwd/bwd-data tile kernels of cuda/conv_depthwise_tile.cuh, per family (its
# PC_DWT_THN/VWN, _THN16/VWN16, _TH3/VW3, _THC/VWC, _THC3/VWC): 'tilen_s*' (2-D NCHW; 'nchw16' in 16-bit types, Note
# [packed rows]), 'tilen3d_s*', 'tile_s*' (2-D channels-last), 'tile3d_s*'
DW_TILE = {"nchw": (8, 2), "nchw16": (8, 4), "nchw3d": (8, 2), "cl": (14, 2), "cl3d": (4, 2),
           "w4": (8, 2)}  # 'w4': the weight gradient's unit with 4 channels a thread (PC_DWT_THW4, _VWW4)
DW_TILE_VC = {"float32": 2, "float16": 4, "bfloat16": 4, "float64": 1}  # PC_DWT_VC: channels per thread (CL)
# where the tile fwd/bwd_data kernels run: "auto" (default: channels-last, and NCHW with >= 16 rows and enough
# tiles to fill the GPU, DW_TILE_MIN_WORK), "cl" (channels-last only) or "all"
DW_TILE_ENV = "PORTCONV_CUDA_DEPTHWISE_TILE"
DW_TILE_MIN_WORK = 1 << 14  # 1 << 16 until "v11": mbv2-dw3x3-b1 (25088) now runs faster on the 8 x 2 tile
DW_ENV = "PORTCONV_CUDA_DEPTHWISE"  # "rows" (default): Note [depthwise rows] kernels where they apply; "v1" never
# Note [depthwise planes] (cuda/conv_depthwise_planes.cuh): 2-D NCHW 3x3 stride-1 forward / backward-data on planes of
# at most DWP_PLANE elements (X and Y) where the tile kernels do not run. A chunk is the whole planes that give about
# DWP_UNITS threads a result column (Note [plane columns]), rounded down so that chunks start 16-byte aligned, at most
# DWP_MAX_BYTES of shared memory for two source buffers and a result buffer. The view's module is built with that
# memory in DWP_STEP steps (PC_DWP_BYTES) and for the blocks an SM it leaves, at most DWP_BLOCKS[element size]
# (PC_DWP_MINB; the registers that leaves hold the float32 body at 6 blocks (40), 16-bit at 5, float64 at 4 without
# spills); the grid is that many blocks an SM. H200, mbv2-dw3x3-last forward: 0.0073 ms at 4 blocks (48 KiB), 0.0065
# at 6 (32 KiB) (notes-depthwise-v3.md "v12")
DWP_PLANE, DWP_UNITS, DWP_MAX_BYTES, DWP_STEP = 256, 256, 49152, 8192
DWP_BLOCKS = {2: 5, 4: 6, 8: 4}
DWP_SM_BYTES = {"sm_90": 233472, "sm_100": 233472, "sm_80": 167936, "sm_87": 167936}  # shared memory an SM (grids)
DWP_SM_BYTES_OTHER = 102400  # other NVIDIA GPUs; AMD GPUs: 65536 (an LDS)
DWP_ENV = "PORTCONV_CUDA_DEPTHWISE_PLANES"  # "UNITS,BLOCKS" for sweeps (BLOCKS 0: a block a chunk)
GROUPED_GEMM_MIN = 8  # Note [grouped implicit GEMM]: channels a group (in and out) from which grouped problems run it
INDEX32_LIMIT = 2**31 - 1 - 2**26  # headroom for grid-stride steps past the last element
GRID_YZ_MAX = 65535


def _max_offset(shape, strides) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(shape, strides) if s > 0)


def needs_index64(*specs: tuple) -> bool:
    """True if any (shape, strides) has as many elements, or a last offset, as 32-bit kernel indexing allows."""
    for shape, strides in specs:
        n = 1
        for s in shape:
            n *= s
        if n > INDEX32_LIMIT or _max_offset(shape, strides) > INDEX32_LIMIT:
            return True
    return False


def output_format(problem: Problem) -> str:
    """Channels-last outputs when the input or weight is channels-last (cuDNN's rule in ATen), else contiguous."""
    for spec in (problem.input, problem.weight):
        fmt = spec.memory_format
        if fmt != "contiguous" and spec.dim == problem.weight.dim:
            return fmt
    return "contiguous"


def igemm_dims(problem: Problem) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of the three implicit GEMMs of Note [implicit GEMM], per group, for the conv view."""
    p = problem.params
    xs, ws = problem.input.shape, problem.weight.shape
    ys = problem.output_shape
    if p.transposed:
        xs, ys = ys, xs
    n, taps = xs[0], 1
    for r in ws[2:]:
        taps *= r
    sp_x = sp_y = 1
    for s in xs[2:]:
        sp_x *= s
    for s in ys[2:]:
        sp_y *= s
    cg, kg = ws[1], ws[0] // p.groups
    return {"fwd": (n * sp_y, kg, cg * taps), "bwd_data": (n * sp_x, cg, kg * taps),
            "bwd_weight": (kg, cg * taps, n * sp_y)}


def sm_version(arch: str) -> int:
    """80 for 'sm_80', 90 for 'sm_90a'; 0 when the arch is not an sm_NN name."""
    digits = "".join(ch for ch in arch[3:] if ch.isdigit()) if arch.startswith("sm_") else ""
    return int(digits) if digits else 0


def tensor_core_mma(dtype: str, device: DeviceInfo, kernel_set: str, tf32: bool) -> str | None:
    """The tensor-core instruction the implicit GEMM uses for ``dtype``, or None for the FMA tile: CUDA set only,
    sm_80 and newer, float16/bfloat16 always, float32 only when TF32 is allowed (``tf32``)."""
    if kernel_set != "CUDA" or device.vendor != "nvidia" or sm_version(device.arch) < 80:
        return None
    if dtype in ("float16", "bfloat16") or (dtype == "float32" and tf32):
        return TC_MMA[dtype]
    return None


# Note [narrow tiles]: backward-data's GEMM has C/G columns, so C_in = 1..16 (an image stem, a spectrogram) left a
# 64-column tile spending 75%-98% of every mma on padding columns (v6: deepbench-speech-c1's backward-data, C_in = 1,
# at 0.16x-0.27x cuDNN). GEMMs of up to 16 columns take the 128x16 tile: 8 warps along M, 16 x 16 warp tiles.
WIDE_WEIGHT_N = 1536


def tc_tile(m: int, n: int, units: int, reduction: int = 0, tf32_ring: bool = False,
            weight: bool = False) -> tuple[int, int, int]:
    """(BM, BN, warps along M) of the tensor-core tile for an M x N GEMM (per group) over ``reduction`` terms (0:
    not said); ``tf32_ring``: a TF32 forward / backward-data, whose vector modes run the cp.async ring (v7);
    ``weight``: a weight gradient (its reduction split to fill the device: _splits)."""
    forced = os.environ.get(TC_TILE_ENV, "")
    if forced in TC_TILES:
        return TC_TILES[forced]
    if n <= 16:  # Note [narrow tiles]: a GEMM of 1..16 columns (backward-data of C_in = 1..16) on 64 wasted 75%+
        return TC_TILES["128x16"]
    if n <= 64:
        return TC_TILES["128x64"]
    if m <= 64:
        return TC_TILES["64x128"]
    # Note [tile rule], v8: a weight gradient fills the device by splitting its reduction, not by tiles, so the count
    # of 128 x 128 tiles below says nothing there; on the wide ones (C/G x taps >= WIDE_WEIGHT_N columns) 128 x 128 ran
    # 1.00x-1.27x the speed of 128 x 64 in both dtypes and two H100 sweeps (wav2vec2-conv1d 1.16x-1.27x, vae-dec
    # 1.03x-1.21x, dcgan, resnet50-l3-3x3, deeplabv3-aspp-d12 1.00x-1.10x), and 0.89x-0.99x on the narrower
    # resnet50-1x1-reduce / -downsample and deepbench-b1-3x3 (h100-2026-11-25h calls 2 and 5)
    if weight and n >= WIDE_WEIGHT_N:
        return TC_TILES["128x128"]
    # Note [tile rule] (tile sweep of v7, docs/performance/h100-igemm-tc/v7): TF32's ring holds 3 stages at 128 x 64
    # and 2 at 128 x 128 (48 KB of shared memory; Note [async stages]), and 128 x 64 ran 1.1x-1.3x faster on the
    # TF32 rows where 128 x 128 had been chosen (deeplabv3-aspp-d12, wav2vec2-conv1d, resnet50-1x1-expand); a
    # reduction of under 8 steps is mostly epilogue, which two 128 x 64 blocks per SM overlap with each other's loop
    # (resnet50-1x1-expand's forward, 64 long: 0.81x-0.82x the time in all three dtypes)
    if tf32_ring or 0 < reduction < 128 or -(-m // 128) * -(-n // 128) < 2 * max(units, 1):
        return TC_TILES["128x64"]
    return TC_TILES["128x128"]


# Note [narrow backward-data] (cuda/conv_igemm.cuh): backward-data with at most NARROW_C channels of dX (one group, 2+
# taps, K >= 16) runs as a 1 x 1 column GEMM into a buffer of at most NARROW_COL_MAX values, then col2im. H100, v9
# (docs/performance/h100-2026-11-25i): deepbench-speech-c1 (C_in = 1) and resnet50-stem (C_in = 3)
NARROW_C, NARROW_K = 4, 16
NARROW_COL_MAX = 1 << 28
NARROW_ENV = "PORTCONV_CUDA_IGEMM_NARROW"  # "0": backward-data without the column GEMM (v8's; before/after timings)


def narrow_col(view: ConvView, w_shape, w_strides) -> bool:
    """Note [narrow backward-data]: whether backward-data (dX; a transposed forward's output) runs as the column GEMM
    and col2im: one group, at most NARROW_C channels of dX, two taps or more, at least NARROW_K channels of dY, a
    weight dense in (K, C, taps) or channels-last order (its (c, tap) block one run), every axis of stride 1 or
    dilation 1, a column buffer of at most NARROW_COL_MAX values."""
    w_shape, w_strides = tuple(w_shape), tuple(w_strides)
    dense = w_strides in (dense_strides(w_shape), dense_strides(w_shape, "channels_last"))
    return (view.G == 1 and view.C <= NARROW_C and view.taps > 1 and view.K >= NARROW_K and dense
            and view.phased
            and view.y_positions * view.C * view.taps <= NARROW_COL_MAX)


def ring_steps(ch: int, forced: str | None = None) -> int:
    """Note [deep stages], Note [stage rows]: steps of 16 a stage of the tensor-core ring (PC_TC_KS) for tap-major
    steps over ``ch`` channels a tap: TC_KS_DEFAULT (or ``forced``, PORTCONV_CUDA_IGEMM_TC_KS), halved until a
    stage's 16 x steps channels divide ``ch``, so that no stage straddles a tap."""
    ks = int(forced or TC_KS_DEFAULT)
    while ks > 1 and ch % (16 * ks):
        ks //= 2
    return ks


def choose_for(problem: Problem, device: DeviceInfo, kernel_set: str = "CUDA", tf32: bool = False,
               tf32_setting: str = "") -> Choice:
    """The cuda (and hip) kernel sets' rule: depthwise kernels for depthwise problems, implicit GEMM for dense
    groups == 1 problems (on tensor cores where tensor_core_mma allows), the direct kernels for the rest. Pure:
    reads only the problem, the device and the TF32 permission (``tf32``, and the setting that says so)."""
    dt = problem.dtype
    if dt not in FLOATING:
        raise Unsupported(f"portconv's {kernel_set} kernels take float32, float64, float16 and bfloat16, not {dt}")
    if dt == "float64" and not device.fp64:
        raise Unsupported(f"{device.name} has no float64 arithmetic")
    p = problem.params
    fmt = output_format(problem)
    math = "fp32-accumulate" if dt in ("float16", "bfloat16") else "ieee"
    big = needs_index64((problem.input.shape, problem.input.strides), (problem.weight.shape, problem.weight.strides),
                        (problem.output_shape, dense_strides(problem.output_shape, fmt)))
    idx = "; 64-bit indexing" if big else ""
    if problem.is_depthwise:
        m = problem.weight.shape[0] // problem.input.shape[1]
        view = ConvView.of(problem)
        ks = depthwise_kernels(view, fmt != "contiguous")
        rows_v = dw_v(view, dt, fmt != "contiguous", ks)
        names = ", ".join(f"{d} {ks[d]}" for d in ("fwd", "bwd_data", "bwd_weight"))
        return Choice("depthwise", fmt, f"depthwise (groups = C_in = {p.groups}, channel multiplier {m}): per-channel "
                      f"kernels without a channel loop [{names}] ('rows*': {rows_v} outputs per thread, "
                      f"Note [depthwise rows]; 'tile*': {tile_shape(fmt != 'contiguous', p.rank, dt)} tiles per "
                      f"thread, Note [depthwise tile]; 'planes': a block's whole planes staged in shared memory "
                      f"where X and Y are NCHW-contiguous (else 'rows3s1'), Note [depthwise planes]; "
                      f"plain: one output per thread, {DW_TAPS} weight-gradient taps per block){idx}", math)
    dims = igemm_dims(problem)
    cg, kg = dims["bwd_data"][1], dims["fwd"][1]
    # Note [grouped implicit GEMM]: the GEMMs are per group (grid z), so a grouped problem with 8+ channels a group on
    # both sides runs them as well as a dense one (wav2vec2-posconv-g16, 48 a group: the direct kernels took 8.8 ms
    # forward and 91 ms for the weight gradient where cuDNN took 0.6 ms); fewer (ResNeXt's 4) stay on direct kernels
    if p.groups == 1 or (cg >= GROUPED_GEMM_MIN and kg >= GROUPED_GEMM_MIN):
        kind = "dense (groups = 1)" if p.groups == 1 else f"grouped (groups = {p.groups}, {cg} / {kg} channels a group)"
        bm, bn, bk = IGEMM_TILE
        too_wide = [d for d, (_, ncol, _) in dims.items() if -(-ncol // bn) > GRID_YZ_MAX]
        if not too_wide:
            m, n, k = dims["bwd_data" if p.transposed else "fwd"]
            if narrow_col(ConvView.of(problem), problem.weight.shape, problem.weight.strides):
                idx = (f"; {'the forward' if p.transposed else 'backward-data'} as a column GEMM and col2im "
                       f"({cg} channels, Note [narrow backward-data]){idx}")
            mma = tensor_core_mma(dt, device, kernel_set, tf32)
            if mma:
                why = f"; TF32 allowed for float32 ({tf32_setting})" if dt == "float32" else ""
                return Choice("igemm-tc", fmt, f"{kind}: implicit GEMM M={m} N={n} K={k} on tensor "
                              f"cores, {mma} (Note [tensor-core implicit GEMM]){why}{idx}",
                              "tf32" if dt == "float32" else math)
            return Choice("implicit_gemm", fmt, f"{kind}: implicit GEMM M={m} N={n} K={k} in "
                          f"{bm}x{bn}x{bk} shared-memory tiles{idx}", math)
        why = f"implicit GEMM's {too_wide[0]} grid would exceed {GRID_YZ_MAX} column tiles"
    else:
        why = f"grouped (groups = {p.groups}, not depthwise, under {GROUPED_GEMM_MIN} channels a group)"
    return Choice("direct", fmt, f"{why}: the general direct kernels{idx}", math)


def depthwise_kernels(view: ConvView, cl: bool = False) -> dict[str, str]:
    """The depthwise kernel suffix per view direction ('plain' is the per-element kernel of cuda/conv_depthwise.cuh).

    Pure in the view, the layout (``cl``: channels-last) and the PORTCONV_CUDA_DEPTHWISE environment variable:
    'v1' selects the per-element kernels everywhere, 'v2' (or 'rows') the 'rows' set of
    cuda/conv_depthwise_rows.cuh as it was before the tile kernels, 'v3' (default) adds the tile kernels of
    cuda/conv_depthwise_tile.cuh (Note [depthwise tile]) and the stride-2 backward-data window."""
    ver = os.environ.get(DW_ENV, "v4")
    if ver == "v1":
        return {"fwd": "plain", "bwd_data": "plain", "bwd_weight": "plain"}
    r0, r1, r2 = view.R
    s1, s2, d2 = view.S[1], view.S[2], view.DL[2]
    tap3 = r2 == 3 and d2 == 1
    fwd = f"rows3s{s2}" if tap3 and s2 in (1, 2) else "rows"
    bwd_data = "rows3s1" if tap3 and s2 == 1 else "rows"
    ok_w = tap3 and r1 == 3 and view.DL[1] == 1 and r0 in (1, 3) and (r0 == 1 or view.DL[0] == 1) and s2 in (1, 2)
    bwd_weight = f"rows{3 if r0 == 3 else 2}d_s{s2}" if ok_w else "plain"
    if ver in ("v2", "rows"):
        return {"fwd": fwd, "bwd_data": bwd_data, "bwd_weight": bwd_weight}
    if tap3 and s2 == 2:
        bwd_data = "rows3s2"
    # Note [depthwise tile]: 3x3 in-plane taps, dilation 1, equal in-plane strides, channel multiplier 1
    plane = tap3 and r1 == 3 and view.DL[1] == 1 and s1 == s2 and s2 in (1, 2) and view.K == view.C
    where = os.environ.get(DW_TILE_ENV, "auto")
    if where == "auto":  # NCHW: the tile loses to 'rows' on small planes and under-filled grids
        ext = view.Y
        big = ext[1] >= 16 and view.N * ext[0] * -(-ext[1] // 4) * -(-ext[2] // 4) * view.C >= DW_TILE_MIN_WORK
        where = "all" if big else "cl"
    if plane and where in ("all", "cl" if cl else "all"):
        tile = f"tile{'' if cl else 'n'}{'' if r0 == 1 else '3d'}_s{s2}"
        fwd = tile
        if s2 == 1:
            bwd_data = tile
    if plane and cl and ok_w:
        bwd_weight = f"tile{3 if r0 == 3 else 2}d_s{s2}"
    small = max(view.X[1] * view.X[2], view.Y[1] * view.Y[2]) <= DWP_PLANE and r0 == 1 and view.X[0] == 1
    if ver != "v3" and plane and s2 == 1 and not cl and small and fwd == "rows3s1":  # Note [depthwise planes]
        fwd = bwd_data = "planes"
    return {"fwd": fwd, "bwd_data": bwd_data, "bwd_weight": bwd_weight}


def _dwp_env() -> tuple[int, int | None]:
    """DWP_ENV's (units, blocks an SM), DWP_UNITS and None (DWP_BLOCKS) where it does not say."""
    units, _, blocks = (os.environ.get(DWP_ENV) or "").partition(",")
    return int(units or DWP_UNITS), int(blocks) if blocks else None


def dw_planes(view: ConvView, direction: str, item: int) -> tuple[int, int]:
    """(planes a chunk, shared bytes they take) of the 'planes' kernel in a direction (Note [depthwise planes])."""
    src, dst = (view.X, view.Y) if direction == "fwd" else (view.Y, view.X)
    s_hw, d_hw = src[1] * src[2], dst[1] * dst[2]
    target = _dwp_env()[0]
    p = min(max(1, target // dst[2]), (DWP_MAX_BYTES - 32) // ((2 * s_hw + d_hw) * item))
    q = math.lcm(16 // math.gcd(s_hw * item, 16), 16 // math.gcd(d_hw * item, 16))  # planes a 16-byte step
    p = max(1, p - p % q if p >= q else p)
    return p, (2 * s_hw + d_hw) * item * p + 32


def dwp_build(view: ConvView, item: int, arch: str) -> tuple[int, int]:
    """(PC_DWP_BYTES, blocks an SM) of a view's 'planes' module: the shared memory of its larger direction in
    DWP_STEP steps, and the blocks an SM that leaves (at most DWP_BLOCKS[item], or the BLOCKS of DWP_ENV; 0: a block
    a chunk)."""
    need = max(dw_planes(view, d, item)[1] for d in ("fwd", "bwd_data"))
    smem = min(DWP_MAX_BYTES, max(2 * DWP_STEP, -(-need // DWP_STEP) * DWP_STEP))
    sm = 65536 if arch.startswith("gfx") else DWP_SM_BYTES.get(arch, DWP_SM_BYTES_OTHER)
    cap = _dwp_env()[1]
    cap = DWP_BLOCKS[item] if cap is None else cap
    return smem, min(cap, sm // (smem + 1024)) if cap > 0 else 0


def nchw_dense(t) -> bool:
    """t is dense in its dimension order (NCHW / NCDHW), extent-1 axes of any stride: plane n*C + c lies at
    (n*C + c)*H*W (Note [depthwise planes]), and Note [channels-last staging] may copy it as one [N][C][rest] block."""
    shape, st = tuple(t.shape), elem_strides(t)
    want = dense_strides(shape)
    return all(n == 1 or a == b for n, a, b in zip(shape, st, want))


def dw_tile_key(cl: bool, rank: int, dtype: str) -> str:
    """The DW_TILE entry of the fwd/bwd-data tile kernels for a layout, spatial rank and dtype."""
    if cl:
        return "cl3d" if rank == 3 else "cl"
    return "nchw3d" if rank == 3 else "nchw16" if dtype in ("float16", "bfloat16") else "nchw"


def tile_shape(cl: bool, rank: int, dtype: str) -> str:
    """'rows x columns' of the depthwise fwd/bwd-data tile kernels for a layout, spatial rank and dtype (reasons)."""
    th, vw = DW_TILE[dw_tile_key(cl, rank, dtype)]
    if not cl and rank == 3:  # Note [depth taps inner] (stride 1, up to 3 depth taps of stride and dilation 1)
        return f"{th}x{vw} (in 2 depth planes at stride 1)"
    return f"{th}x{vw}"


def dw_v(view: ConvView, dtype: str, cl: bool, ks: dict[str, str]) -> int:
    """PC_DW_V of the view's 'rows' kernels (Note [whole-row strips]); ``ks``: its depthwise_kernels."""
    if max(view.X[2], view.Y[2]) <= DW_V_ROW:
        return DW_V_ROW
    only_weight = ks["bwd_weight"].startswith("rows") and all(ks[d].startswith("tile") for d in ("fwd", "bwd_data"))
    if dtype in ("float16", "bfloat16") and not cl and view.X[0] == 1 and only_weight:
        return DW_V_WIDE16
    return DW_V


def depthwise_work(view: ConvView, direction: str, kernel: str, cl: bool, dtype: str, rows_v: int) -> int:
    """Work items (threads of a grid-stride loop) of a depthwise 'rows*' (strips of ``rows_v``, dw_v) or 'tile*'
    fwd / bwd_data kernel."""
    ext, ch = (view.Y, view.K) if direction == "fwd" else (view.X, view.C)
    if kernel.startswith("tile"):
        vc = DW_TILE_VC[dtype] if cl and ch % DW_TILE_VC[dtype] == 0 else 1
        th, vw = DW_TILE[dw_tile_key(not kernel.startswith("tilen"), 3 if "3d" in kernel else 2, dtype)]
        return view.N * ext[0] * -(-ext[1] // th) * -(-ext[2] // vw) * (ch // vc)
    return view.N * ext[0] * ext[1] * -(-ext[2] // rows_v) * ch


def depthwise_weight_grid(view: ConvView, kernel: str, cl: bool, dtype: str, units: int,
                          rows_v: int) -> tuple[tuple, int, int]:
    """(grid, splits, chunk) of a depthwise 'rows*d' (strips of ``rows_v``) or 'tile*d' weight-gradient kernel
    (deterministic splits)."""
    v = view
    if kernel.startswith("tile"):  # grid (channel tiles, splits) over (n, o0, row tile, strip) units
        vc = min(DW_TILE_VC[dtype], 2) if kernel.startswith("tile3d") else DW_TILE_VC[dtype]
        vc = vc if cl and v.C % vc == 0 else 1
        cv = v.C // vc
        ct = 16 if cv % 16 == 0 else min(cv, 8)  # pc_dwt_channel_tile
        tiles, groups = -(-cv // ct), THREADS // ct
        th, vw = DW_TILE["w4"] if vc >= 4 else (2, 4)  # PC_DWT_THW, PC_DWT_VWW: the kernel splits its units itself
        work = v.N * v.Y[0] * -(-v.Y[1] // th) * -(-v.Y[2] // vw)
        target = 3 * max(units, 1)  # few splits: each is a partial sum the finalize reads back
        splits = max(1, min(-(-target // tiles), -(-work // (4 * groups)), GRID_YZ_MAX))
    else:  # grid (K, splits) over strips
        tiles = v.K
        work = v.N * v.Y[0] * v.Y[1] * -(-v.Y[2] // rows_v)
        target = 16 * max(units, 1)  # blocks: bandwidth-bound, so fill every SM several times
        splits = max(1, min(-(-target // v.K), -(-work // (2 * THREADS)), GRID_YZ_MAX))
    chunk = -(-work // splits)
    splits = -(-work // chunk)
    return (tiles, splits, 1), splits, chunk


@dataclasses.dataclass(frozen=True)
class ConvView:
    """Note [conv view] of cuda/common.cuh: the canonical convolution every kernel computes (spatial padded to 3-D)."""

    N: int
    C: int
    K: int
    G: int
    X: tuple[int, ...]
    Y: tuple[int, ...]
    R: tuple[int, ...]
    S: tuple[int, ...]
    P: tuple[int, ...]
    DL: tuple[int, ...]

    @classmethod
    def of(cls, problem: Problem) -> ConvView:
        p = problem.params
        xs, ws, ys = problem.input.shape, problem.weight.shape, problem.output_shape
        if p.transposed:  # the transposed input plays dY, its output plays dX
            xs, ys = ys, xs
        lead = 3 - p.rank
        return cls(xs[0], xs[1], ws[0], p.groups, (1,) * lead + tuple(xs[2:]), (1,) * lead + tuple(ys[2:]),
                   (1,) * lead + tuple(ws[2:]), (1,) * lead + p.stride, (0,) * lead + p.padding,
                   (1,) * lead + p.dilation)

    @property
    def phased(self) -> bool:
        """Note [bwd-data phases]: every axis has stride 1 or dilation 1, so the taps that reach a dX position follow
        from its phase (the phase kernels; Note [narrow backward-data]'s col2im)."""
        return all(s == 1 or d == 1 for s, d in zip(self.S, self.DL))

    @property
    def taps(self) -> int:
        return self.R[0] * self.R[1] * self.R[2]

    @property
    def y_positions(self) -> int:
        return self.N * self.Y[0] * self.Y[1] * self.Y[2]


def elem_strides(x) -> tuple[int, ...]:
    """Element strides of a torch tensor or CuPy array."""
    if (type(x).__module__ or "").startswith("torch"):
        return tuple(x.stride())
    return tuple(s // x.dtype.itemsize for s in x.strides)


def strides5(x) -> tuple[int, ...]:
    """Element strides of an (N, C, *spatial) array as 5 values (leading spatial dims of extent 1 get 0)."""
    st = elem_strides(x)
    return st[:2] + (0,) * (5 - len(st)) + st[2:]


def vector_ok(t, item: int, axis: int = 1) -> bool:
    """Note [vector gathers]: t's reduction-channel axis (1; 0 for the K of a weight in backward-data) is contiguous,
    every other axis that is not of extent 1 steps by a multiple of 16 bytes, and its address is 16-byte aligned, so
    16 channels from a multiple of 16 are aligned 16-byte vectors."""
    st, shape = elem_strides(t), tuple(t.shape)
    return (st[axis] == 1 and _cupy.Tensors.ptr(t) % 16 == 0
            and all((s * item) % 16 == 0 for i, (s, n) in enumerate(zip(st, shape)) if i != axis and n > 1))


# Note [channels-last staging]: staging pays on the H100's dense rows when the GEMM does at least STAGE_MACS_PER_ELEM
# multiply-adds per staged element (the copy reads and writes each once; the vector modes save a share of a kernel
# whose time grows with the multiply-adds) and at least STAGE_MIN_MACS in all (the forward more: it gains less than
# backward-data, whose element-wise B gathers the staged W replaces). Measured (docs/performance/notes-tensor-cores.md,
# v5): resnet50-1x1-expand's backward-data, 64 per element, lost 1.2x with staging; deepbench-b1-3x3's forward (0.9G
# multiply-adds, a 37 us kernel) lost 1.4x-1.8x, its backward-data gained 1.3x-1.5x; every other row gained. The
# weight gradient's TN tile (Note [TN tiles], v6) ran as fast as the element gathers on the 16-bit rows of 0.9G-3.7G
# multiply-adds, so staging lost there (0.62x-0.90x) and gained from 10G up (1.29x-1.54x); on TF32 the TN tile was
# slower than the element gathers on every NCHW row (0.57x-0.82x with staging), so TF32 never stages for it.
STAGE_MACS_PER_ELEM = 128
STAGE_MIN_MACS = {"fwd": 1 << 30, "bwd_data": 1 << 27, "bwd_weight": 1 << 33}


def stage_pays(macs: int, elems: list[int], direction: str) -> bool:
    """Note [channels-last staging]: whether copying operands of ``elems`` elements to the vector modes' order is
    expected to save time on a ``direction`` GEMM of ``macs`` multiply-adds."""
    return bool(elems) and macs >= STAGE_MIN_MACS[direction] and macs >= STAGE_MACS_PER_ELEM * sum(elems)


def _splits(blocks: int, total: int, min_chunk: int, units: int, count: int, align: int = 1) -> tuple[int, int]:
    """(splits, chunk) of a reduction of ``total`` terms so that ``blocks`` x splits fills the device."""
    target = 4 * max(units, 1)
    if blocks >= target or total <= min_chunk:
        return 1, max(total, 1)
    want = min(-(-target // blocks), -(-total // min_chunk), GRID_YZ_MAX, max(1, 2**27 // max(count, 1)))
    chunk = -(-total // max(want, 1))
    chunk = -(-chunk // align) * align
    return -(-total // chunk), chunk


class CudaBackend(Backend):
    """portconv's own CUDA kernels. Subclasses (hip) change the kernel set, the vendor checks and the pip hint."""

    id = BackendId.CUDA
    pip_hint = _cupy.CUDA_PIP_HINT
    kernel_set_name = "CUDA"

    def __init__(self):
        self._kernels: _cupy.KernelSet | None = None

    def kernels(self) -> _cupy.KernelSet:
        if self._kernels is None:
            self._kernels = _cupy.KernelSet(pip_hint=self.pip_hint)
        return self._kernels

    def tensors(self, like) -> _cupy.Tensors:
        """Pointers, allocation, device and stream for one call whose arrays are like ``like``."""
        return _cupy.Tensors(like, self.pip_hint)

    # --- availability -----------------------------------------------------------------------------------------
    def probe(self) -> Availability:
        try:
            cupy = _cupy.import_cupy(self.pip_hint)
        except VendorImportError as e:
            return Availability.no(str(e))
        if _cupy.is_hip(cupy):
            return Availability.no("this CuPy is built for ROCm: AMD GPUs are the hip backend's")
        try:
            n = cupy.cuda.runtime.getDeviceCount()
            nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
        except cupy.cuda.runtime.CUDARuntimeError as e:
            return Availability.no(f"no usable CUDA device or driver: {e}")
        if n == 0:
            return Availability.no("CUDA reports no device")
        return Availability.yes(f"CuPy {cupy.__version__}, NVRTC {nvrtc}, {n} CUDA device(s)")

    def device_for(self, problem: Problem) -> DeviceInfo:
        spec = problem.input
        if spec.kind == "cupy":
            return _cupy.device_info("cupy", spec.device_index or 0)
        if spec.kind != "torch" or spec.device_type != "cuda":
            raise Unsupported(f"portconv's {self.kernel_set_name} kernels take CUDA tensors and CuPy arrays, "
                              f"not {spec.kind} data on {spec.device}")
        import torch

        if getattr(torch.version, "hip", None):
            raise Unsupported("this PyTorch is built for ROCm: its 'cuda' tensors are AMD GPU memory (hip backend)")
        return _cupy.device_info("torch", spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo) -> Choice:
        if device.vendor != "nvidia":
            raise Unsupported(f"the cuda backend runs on NVIDIA GPUs, not {device.vendor} ({device.name})")
        tf32, setting = False, ""
        if problem.dtype == "float32" and problem.input.kind == "torch":
            import torch

            from .cudnn import cudnn_conv_tf32

            tf32, setting = cudnn_conv_tf32(torch)
        return choose_for(problem, device, self.kernel_set_name, tf32, setting)

    def devices(self) -> list[DeviceInfo]:
        if not self.probe():
            return []
        cupy = _cupy.import_cupy(self.pip_hint)
        return [_cupy.device_info("cupy", i) for i in range(cupy.cuda.runtime.getDeviceCount())]

    # --- execution --------------------------------------------------------------------------------------------
    def forward(self, plan, input, weight, bias):
        key = ("fwd", _layout(input), _layout(weight), _layout(bias))
        return self._call(plan, key, {"input": input, "weight": weight, "bias": bias}, self._forward)[0]

    def backward(self, plan, grad_output, input, weight, output_mask):
        key = ("bwd", output_mask, _layout(grad_output), _layout(input), _layout(weight))
        return self._call(plan, key, {"grad_output": grad_output, "input": input, "weight": weight,
                                "mask": output_mask},
                          self._backward)

    def _call(self, plan, key, inputs: dict, ordinary) -> tuple:
        """Note [replayed launches]: replay this plan's recorded launches for ``key``, or run the ordinary path
        (recording it the first time)."""
        from .. import knobs

        poison = knobs.poison()
        programs = plan.state.get("replay")
        if programs is None:
            programs = plan.state["replay"] = {}
        prog = programs.get(key)
        if prog is not None and prog is not _ORDINARY:
            return prog.run(plan.state["io"], inputs, poison)
        run = _Run(self, plan, inputs["input"], extra=(inputs["grad_output"],) if "grad_output" in inputs else ())
        if prog is _ORDINARY:
            return ordinary(run, poison, **inputs)
        if not run.io.replayable:  # CuPy arrays: the ordinary path (their allocator and streams are CuPy's)
            programs[key] = _ORDINARY
            return ordinary(run, poison, **inputs)
        run.rec = run.io.rec = _replay.Recording(inputs)
        try:
            outs = ordinary(run, poison, **inputs)
        finally:
            rec, run.rec, run.io.rec = run.rec, None, None
        programs[key] = rec.program(outs) or _ORDINARY
        plan.state.setdefault("io", run.io)
        return outs

    @staticmethod
    def _forward(run, poison, input, weight, bias):
        pr, plan = run.plan.problem, run.plan
        y = run.io.empty(pr.output_shape, dense_strides(pr.output_shape, plan.memory_format), pr.dtype, poison)
        if pr.params.transposed:
            run.bwd_data(dx=y, w=weight, dy=input, bias=bias)
        else:
            run.fwd(x=input, w=weight, y=y, bias=bias)
        return (y,)

    @staticmethod
    def _backward(run, poison, grad_output, input, weight, mask):
        pr, fmt = run.plan.problem, run.plan.memory_format
        gi = gw = gb = None
        if mask[0]:
            shape = tuple(input.shape)
            gi = run.io.empty(shape, dense_strides(shape, fmt), pr.dtype, poison)
            if pr.params.transposed:
                run.fwd(x=grad_output, w=weight, y=gi, bias=None)
            else:
                run.bwd_data(dx=gi, w=weight, dy=grad_output, bias=None)
        if mask[1]:
            shape = tuple(weight.shape)
            gw = run.io.empty(shape, dense_strides(shape, fmt), pr.dtype, poison)
            if pr.params.transposed:
                run.bwd_weight(x=grad_output, dy=input, dw=gw)
            else:
                run.bwd_weight(x=input, dy=grad_output, dw=gw)
        if mask[2]:
            channels = grad_output.shape[1]
            gb = run.io.empty((channels,), (1,), pr.dtype, poison)
            run.bias_grad(dy=grad_output, db=gb)
        return gi, gw, gb


_ORDINARY = object()  # a plan/key whose calls the Recording could not describe: always the ordinary path


def _layout(t) -> tuple | None:
    """What of a tensor the recorded launches depend on: its strides and its address modulo 16 (kernels may pick
    vector loads by alignment)."""
    if t is None:
        return None
    try:
        return t.stride(), t.data_ptr() & 15  # torch
    except AttributeError:
        return t.strides, t.data.ptr & 15  # CuPy


class _Run:
    """One call's launches: the compiled module of the plan's algorithm, the tensors' device and stream."""

    def __init__(self, backend: CudaBackend, plan, like, extra=()):
        self.backend, self.plan = backend, plan
        self.io = backend.tensors(like)
        self.view = ConvView.of(plan.problem)
        self.alg = plan.algorithm
        self.units = plan.device.compute_units or 132
        pr = plan.problem
        big = needs_index64((pr.input.shape, pr.input.strides), (pr.weight.shape, pr.weight.strides),
                            (pr.output_shape, dense_strides(pr.output_shape, plan.memory_format)),
                            *((tuple(t.shape), elem_strides(t)) for t in extra))
        self.defines = {"PC_DTYPE": DTYPE_CODE[pr.dtype], "PC_INDEX64": int(big)}
        self.acc64 = pr.dtype == "float64"
        self._item = 8 if pr.dtype == "float64" else 4 if pr.dtype == "float32" else 2
        self.v4 = os.environ.get(TC_V4_ENV) == "1"  # read when the launches are recorded (Note [replayed launches])
        self.v5 = self.v4 or os.environ.get(TC_V5_ENV) == "1"
        self.v6 = self.v5 or os.environ.get(TC_V6_ENV) == "1"
        self.v8 = os.environ.get(TC_V8_ENV) == "1"
        self.narrow = os.environ.get(NARROW_ENV) != "0"
        ks = os.environ.get(TC_KS_ENV)
        self.ks = ks if ks in TC_KS else None
        self.flags = FLAG_CL if plan.memory_format != "contiguous" else 0
        self.dw = depthwise_kernels(self.view, bool(self.flags)) if self.alg == "depthwise" else {}
        self.rows_v = dw_v(self.view, pr.dtype, bool(self.flags), self.dw) if self.dw else DW_V
        if self.rows_v != DW_V:  # Note [whole-row strips]: a module build of its own
            self.defines["PC_DW_V"] = self.rows_v
        self.dwp_blocks = 0
        if "planes" in self.dw.values():  # Note [depthwise planes]: the view's shared memory and blocks an SM
            smem, self.dwp_blocks = dwp_build(self.view, self._item, plan.device.arch)
            self.defines.update(PC_DWP_BYTES=smem, PC_DWP_MINB=max(1, self.dwp_blocks))
        self.rec: _replay.Recording | None = None  # Note [replayed launches]

    def _fn(self, name: str, extra: dict | None = None):
        defines = {**self.defines, **extra} if extra else self.defines
        return self.backend.kernels().function(ENTRY[self.alg], defines, self.io.device, name)

    def _args(self, x=None, w=None, y=None, b=None, ws=None, xs=None, wst=None, ys=None, bs=0, splits=1, chunk=1,
              C=None, K=None, R=None, Y=None, flags=0, N=None, view=None):
        import numpy as np

        v = view or self.view
        ptr = _cupy.Tensors.ptr
        vals = [ptr(x), ptr(w), ptr(y), ptr(b), ptr(ws), v.N if N is None else N, v.C if C is None else C,
                v.K if K is None else K, v.G,
                *v.X, *(v.Y if Y is None else Y), *(v.R if R is None else R), *v.S, *v.P, *v.DL,
                *(xs or (0,) * 5), *(wst or (0,) * 5), *(ys or (0,) * 5), bs, splits, chunk, self.flags | flags]
        assert len(vals) == ARG_COUNT
        args = np.array(vals, dtype=np.int64).view(np.dtype((np.void, 8 * ARG_COUNT)))
        if self.rec is not None:
            self.rec.argument_block(args, (x, w, y, b, ws))
        return args

    def _launch(self, name: str, grid, args, extra: dict | None = None, dependent: bool = False) -> None:
        self.io.launch(self._fn(name, extra), grid, THREADS, args, dependent)

    def _igemm_tile(self, m: int, n: int, reduction: int = 0, weight: bool = False,
                    ch: int = 0) -> tuple[int, int, dict | None]:
        """(BM, BN, extra defines) of the implicit GEMM tile for an M x N GEMM over ``reduction`` terms (``weight``:
        the weight gradient's) whose tap-major steps run over ``ch`` channels a tap (0: none): the FMA tile, or a
        tensor-core one (Note [tile rule]; Note [stage rows]: steps a ring stage, as many of TC_KS_DEFAULT as keep
        a stage's channels inside one tap)."""
        if self.alg != "igemm-tc":
            return IGEMM_TILE[0], IGEMM_TILE[1], None
        new = not self.v6
        bm, bn, wm = tc_tile(m, n, self.units, reduction if new else 0, new and self._item == 4 and not weight,
                             new and weight)
        extra = {"PC_TENSOR_CORES": 1, "PC_TC_BM": bm, "PC_TC_BN": bn, "PC_TC_WM": wm}
        if self.v4:
            extra["PC_TC_LDSM"] = 0
        elif self.v6:
            extra["PC_TC_V6"] = 1
        else:
            extra["PC_TC_KS"] = ring_steps(ch, self.ks)
            if self.v8:
                extra["PC_TC_V8"] = 1
        return bm, bn, extra

    def _vector_flags(self, a=None, b=None, b_axis: int = 1) -> int:
        """Note [vector gathers]: FLAG_VA / FLAG_VB for an igemm-tc launch whose A / B tensors are a / b."""
        if self.alg != "igemm-tc" or self.v4:
            return 0
        item = 4 if self.plan.problem.dtype == "float32" else 2
        return (FLAG_VA if a is not None and vector_ok(a, item) else 0) | (
            FLAG_VB if b is not None and vector_ok(b, item, b_axis) else 0)

    def _stages(self, reduce_ch: int, bm: int) -> bool:
        """Note [channels-last staging]: whether this igemm-tc launch may copy dense NCHW operands to the channel
        order of the vector modes: one group, reduction channels in 16s, a tile that takes vectors (128 rows for
        the 16-bit types)."""
        return (self.alg == "igemm-tc" and not self.v4 and self.view.G == 1
                and reduce_ch % 16 == 0 and (bm == 128 or self.plan.problem.dtype == "float32"))

    def _to_stage(self, direction: str, macs: int, *ts) -> list[bool]:
        """Which of the operands ``ts`` (A, then B; None: never) to stage: the dense NCHW ones that are not
        channel-contiguous already, all of them or none as stage_pays decides."""
        need = [t is not None and nchw_dense(t) and not vector_ok(t, self._item) for t in ts]
        elems = [math.prod(tuple(t.shape)) for t, n in zip(ts, need) if n]
        return need if stage_pays(macs, elems, direction) else [False] * len(ts)

    def _tn(self, cg: int, kg: int) -> bool:
        """Note [TN tiles]: whether this igemm-tc weight gradient may take the TN tile: channel counts in whole
        16-byte vectors."""
        ve = 16 // self._item
        return self.alg == "igemm-tc" and not self.v5 and cg % ve == 0 and kg % ve == 0

    def _channels_last(self, t, extra):
        """Note [channels-last staging]: dense NCHW t as a channels-last copy."""
        n, c, rest = t.shape[0], t.shape[1], math.prod(tuple(t.shape[2:]))
        return self._transposed(t, n, c, rest, tuple(t.shape), dense_strides(tuple(t.shape), "channels_last"), extra)

    def _transposed(self, t, batch: int, rows: int, cols: int, shape, strides, extra):
        """Note [channels-last staging]: a new array of ``shape`` / ``strides`` holding dense t [batch][rows][cols]
        as [batch][cols][rows] (one portconv_stage_transpose launch)."""
        out = self.io.empty(shape, strides, self.plan.problem.dtype)
        a = self._args(x=t, y=out, N=batch, C=rows, K=cols)
        self._launch("portconv_stage_transpose", (-(-cols // 32), -(-rows // 32), batch), a, extra)
        return out

    def _depthwise_launch(self, direction: str, src, dst) -> tuple[str, tuple[int, int, int], int]:
        """(kernel suffix, grid, a.chunk) of a 'rows*' / 'tile*' / 'planes' fwd or bwd_data launch: 'planes' where src
        and dst are NCHW-dense (a chunk of planes a block, dwp_blocks blocks an SM at most: Note [depthwise planes]),
        else 'rows3s1'."""
        v, kernel = self.view, self.dw[direction]
        if kernel == "planes":
            if nchw_dense(src) and nchw_dense(dst):
                chunk = dw_planes(v, direction, self._item)[0]
                blocks = -(-(v.N * v.C) // chunk)
                if self.dwp_blocks:
                    blocks = min(blocks, self.units * self.dwp_blocks)
                return "_planes", (blocks, 1, 1), chunk
            kernel = "rows3s1"
        work = depthwise_work(v, direction, kernel, bool(self.flags), self.plan.problem.dtype, self.rows_v)
        return "_" + kernel, self._elementwise_grid(work), 1

    def _elementwise_grid(self, total: int) -> tuple[int, int, int]:
        return (max(1, min(-(-total // THREADS), self.units * 32)), 1, 1)

    def _finalize(self, count: int, splits: int, extra: dict | None = None, **args) -> None:
        """portconv_split_finalize of ``count`` values over ``splits`` partial sums: a warp a value or a thread a value
        (Note [warp finalize]), the kernel told which by PC_FLAG_WARP."""
        warp = splits >= WARP_FINALIZE and count <= WARP_FINALIZE_MAX
        fin = self._args(splits=splits, flags=FLAG_WARP if warp else 0, **args)
        self._launch("portconv_split_finalize", self._elementwise_grid(count * (32 if warp else 1)), fin, extra,
                     dependent=True)  # Note [dependent launch]: replayed, it may start before its sums are done

    @staticmethod
    def _bias_stride(bias) -> int:
        return 0 if bias is None else _stride0(bias)

    def fwd(self, x, w, y, bias) -> None:
        v = self.view
        name, extra, chunk = f"{PREFIX[self.alg]}_fwd", None, 1
        if self.alg in IGEMM_ALGS:
            bm, bn, extra = self._igemm_tile(v.y_positions, v.K // v.G, v.C // v.G * v.taps, ch=v.C // v.G)
            grid = (-(-v.y_positions // bm), -(-(v.K // v.G) // bn), v.G)
            if self._stages(v.C // v.G, bm):  # Note [channels-last staging]
                sx, sw = self._to_stage("fwd", v.y_positions * v.K * v.C * v.taps, x, w)
                if sx:
                    x = self._channels_last(x, extra)
                if sw:
                    w = self._transposed(w, v.K, v.C, v.taps, tuple(w.shape),
                                         dense_strides(tuple(w.shape), "channels_last"), extra)
        elif self.dw.get("fwd", "plain") != "plain":
            suffix, grid, chunk = self._depthwise_launch("fwd", x, y)
            name += suffix
        else:
            grid = self._elementwise_grid(v.y_positions * v.K)
        a = self._args(x=x, w=w, y=y, b=bias, xs=strides5(x), wst=strides5(w), ys=strides5(y),
                       bs=self._bias_stride(bias), chunk=chunk, flags=self._vector_flags(x, w))
        self._launch(name, grid, a, extra)

    def bwd_data(self, dx, w, dy, bias) -> None:
        v = self.view
        if self.alg in IGEMM_ALGS and self.narrow and narrow_col(v, w.shape, elem_strides(w)):
            return self._bwd_data_col(dx, w, dy, bias)
        phases = self.alg == "igemm-tc" and v.phased
        positions = v.N * v.X[0] * v.X[1] * v.X[2]
        name, extra, flags, chunk = f"{PREFIX[self.alg]}_bwd_data", None, 0, 1
        if phases:  # Note [bwd-data phases]
            name += "_phase"
            phase0 = v.N * -(-v.X[0] // v.S[0]) * -(-v.X[1] // v.S[1]) * -(-v.X[2] // v.S[2])
            bm, bn, extra = self._igemm_tile(phase0, v.C // v.G, v.K // v.G * v.taps // math.prod(v.S), ch=v.K // v.G)
            grid = (-(-phase0 // bm), -(-(v.C // v.G) // bn), v.G * v.S[0] * v.S[1] * v.S[2])
            if self._stages(v.K // v.G, bm):  # Note [channels-last staging]
                # W's K is contiguous in no dense layout: a dense W (K outermost, KCRS or KRSC) is staged whenever
                # dY is, or when dY is channels-last already
                macs = positions * v.C * v.K * v.taps
                (sy,) = self._to_stage("bwd_data", macs, dy)
                wst = elem_strides(w)
                w_dense = wst in (dense_strides(tuple(w.shape)), dense_strides(tuple(w.shape), "channels_last"))
                sw = w_dense and (sy or vector_ok(dy, self._item)) and stage_pays(
                    macs, [math.prod(tuple(w.shape))] + ([math.prod(tuple(dy.shape))] if sy else []), "bwd_data")
                if sy:
                    dy = self._channels_last(dy, extra)
                if sw:  # W [K][rest] -> [rest][K], rest in W's own order: K contiguous
                    w = self._transposed(w, 1, v.K, v.C * v.taps, tuple(w.shape),
                                         (1,) + tuple(v.K * s for s in wst[1:]), extra)
            flags = self._vector_flags(dy, w, b_axis=0)
        elif self.alg in IGEMM_ALGS:
            bm, bn, extra = self._igemm_tile(positions, v.C // v.G, v.K // v.G * v.taps)
            grid = (-(-positions // bm), -(-(v.C // v.G) // bn), v.G)
        elif self.dw.get("bwd_data", "plain") != "plain":
            suffix, grid, chunk = self._depthwise_launch("bwd_data", dy, dx)
            name += suffix
        else:
            grid = self._elementwise_grid(positions * v.C)
        a = self._args(x=dx, w=w, y=dy, b=bias, xs=strides5(dx), wst=strides5(w), ys=strides5(dy),
                       bs=self._bias_stride(bias), chunk=chunk, flags=flags)
        self._launch(name, grid, a, extra)

    def _bwd_data_col(self, dx, w, dy, bias) -> None:
        """Note [narrow backward-data]: col = dY x W as a 1 x 1 forward GEMM (M = N*Y positions, N = C*taps columns in
        W's memory order, reduction K), then dX = col2im(col) (+ bias)."""
        v = self.view
        cols, per = v.C * v.taps, v.Y[0] * v.Y[1] * v.Y[2]
        one = ConvView(v.N, v.K, cols, 1, v.Y, v.Y, (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
        col = self.io.workspace(v.y_positions * cols, self.acc64)
        col_st = (cols * per, per, v.Y[1] * v.Y[2], v.Y[2], 1)
        bm, bn, extra = self._igemm_tile(v.y_positions, cols, v.K, ch=v.K)
        wst = elem_strides(w)  # W as the (C taps) x K weight of the 1 x 1 forward: row j at j, column k at k*ws0
        a = self._args(x=dy, w=w, ws=col, xs=strides5(dy), wst=(1, wst[0], 0, 0, 0), ys=col_st, view=one,
                       flags=self._vector_flags(dy))
        self._launch("portconv_igemm_col", (-(-v.y_positions // bm), -(-cols // bn), 1), a, extra)
        tapmajor = v.C > 1 and wst[1] == 1  # channels-last W: (tap, c) order
        b = self._args(x=dx, b=bias, ws=col, xs=strides5(dx), ys=col_st, bs=self._bias_stride(bias),
                       flags=FLAG_COLTAP if tapmajor else 0)
        self._launch("portconv_col2im", self._elementwise_grid(v.N * v.C * v.X[0] * v.X[1] * v.X[2]), b, extra)

    def bwd_weight(self, x, dy, dw) -> None:
        v = self.view
        cg, kg = v.C // v.G, v.K // v.G
        count = v.K * cg * v.taps
        total = v.y_positions
        extra, flags = None, 0
        if self.alg in IGEMM_ALGS:
            bk = IGEMM_TILE[2]
            bm, bn, extra = self._igemm_tile(kg, cg * v.taps, total, weight=True)
            tiles = (-(-kg // bm), -(-(cg * v.taps) // bn))
            splits, chunk = _splits(tiles[0] * tiles[1] * v.G, total, 32 * bk, self.units, count, bk)
            splits = min(splits, GRID_YZ_MAX // v.G)
            chunk = -(-total // splits)
            splits = -(-total // chunk)
            grid = (tiles[0], tiles[1], v.G * splits)
            if self._tn(cg, kg):  # Note [TN tiles]: dY and X channel-contiguous, 16-bit NCHW ones staged when it pays
                stage = v.G == 1 and self._item == 2  # (Note [channels-last staging]: not TF32)
                sy, sx = self._to_stage("bwd_weight", count * total, dy, x) if stage else (False, False)
                dy = self._channels_last(dy, extra) if sy else dy
                x = self._channels_last(x, extra) if sx else x
                flags = self._vector_flags(dy, x)  # the kernel takes the TN tile when both are set
        elif self.dw.get("bwd_weight", "plain") != "plain":
            grid, splits, chunk = depthwise_weight_grid(v, self.dw["bwd_weight"], bool(self.flags),
                                                        self.plan.problem.dtype, self.units, self.rows_v)
        elif self.alg == "depthwise":
            chunks = -(-v.taps // DW_TAPS)
            splits, chunk = _splits(v.K * chunks, total, 4 * THREADS, self.units, count)
            grid = (v.K * chunks, splits, 1)
        else:
            splits, chunk = _splits(count, total, 4 * THREADS, self.units, count)
            grid = (min(count, 2**31 - 1), splits, 1)
        ws = self.io.workspace(splits * count, self.acc64) if splits > 1 else None
        a = self._args(x=x, w=dw, y=dy, ws=ws, xs=strides5(x), wst=strides5(dw), ys=strides5(dy), splits=splits,
                       chunk=chunk, flags=flags)
        name = f"{PREFIX[self.alg]}_bwd_weight"
        if self.dw.get("bwd_weight", "plain") != "plain":
            name += "_" + self.dw["bwd_weight"]
        self._launch(name, grid, a, extra)
        if splits > 1:
            self._finalize(count, splits, extra, w=dw, ws=ws, wst=strides5(dw), C=cg)

    def bias_grad(self, dy, db) -> None:
        """grad_bias: dY summed over batch and space per channel (dY is the grad_output, whatever its role)."""
        v = self.view
        k = dy.shape[1]
        ext = (1,) * (5 - len(dy.shape)) + tuple(dy.shape[2:])
        total = v.N * ext[0] * ext[1] * ext[2]
        splits, chunk = _splits(k, total, 8 * THREADS, self.units, k)
        ws = self.io.workspace(splits * k, self.acc64) if splits > 1 else None
        a = self._args(y=dy, b=db, ws=ws, ys=strides5(dy), bs=_stride0(db), splits=splits, chunk=chunk, K=k, Y=ext)
        self._launch("portconv_bias_grad", (k, splits, 1), a)
        if splits > 1:
            self._finalize(k, splits, w=db, ws=ws, wst=(_stride0(db), 0, 0, 0, 0), C=1, K=k, R=(1, 1, 1))


def _stride0(t) -> int:
    """The element stride of a 1-D torch tensor or CuPy array."""
    return elem_strides(t)[0]
