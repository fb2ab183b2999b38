"""The opencl backend's tiled implicit-GEMM kernels (opencl/igemm.cl): when they run, their tiles, their launches."""
from __future__ import annotations

import dataclasses
import math

from .. import knobs
from . import _cl_runtime as rt

# Note [OpenCL dense algorithm]: dense problems (every problem the depthwise rule does not take) run either the
# direct kernels of conv.cl (one work-item per result, no data reuse) or the implicit-GEMM tiles of igemm.cl (Note
# [OpenCL implicit GEMM]). PORTCONV_OPENCL_DENSE=direct|igemm forces one; by default GPUs run the tiles and CPUs
# run DENSE_CPU_DEFAULT, chosen by the PoCL measurements in docs/performance/notes-opencl.md (igemm v1/v2).
# Backward-data (and the transposed forward) runs by phases, which need dilation 1 on every axis with a stride
# above 1; other problems run that direction on the direct kernel (the plan's reason says so).
DENSE_CPU_DEFAULT = "igemm"
MODES = ("direct", "igemm")
WORKSPACE_BYTES = 64 << 20  # cap of the split grad-weight's partial sums
# Returned instead of an event when the device cannot run a tile's work-group size for this kernel
# (CL_KERNEL_WORK_GROUP_SIZE below IG_NT): the caller runs the direct kernel instead (stats["ig_too_large"]).
TOO_LARGE = object()


@dataclasses.dataclass(frozen=True)
class IgSpec:
    """One tile configuration of igemm.cl: an IG_BM x IG_BN tile, IG_TM x IG_TN results per work-item, or with
    ``tc`` ('ptx' | 'portable') the tensor-core products of Note [OpenCL tensor cores]: IG_WM x IG_WN warps."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    cpu: bool = False
    phases: bool = True  # backward-data by phases; False: the direct kernel (a strided and dilated axis)
    tc: str = ""
    wm: int = 0
    wn: int = 0
    regs: int = 0  # NVIDIA's -cl-nv-maxrregcount for the PTX tile (0: the compiler's choice)
    mfast: bool = False  # IG_MFAST: load work-items along rows / columns first (Note [OpenCL M-lane gathers])
    tapmajor: bool = False  # IG_TAPMAJOR: Note [OpenCL tap-major steps] (forward and backward-data; gather_order)

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn if self.tc else (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def defines(self) -> tuple[str, ...]:
        tile = (f"IG_BM={self.bm}", f"IG_BN={self.bn}", f"IG_BK={self.bk}")
        if self.tc:
            tile += ("IG_TC=1", f"IG_WM={self.wm}", f"IG_WN={self.wn}") + (("IG_MMA_PTX",) if self.tc == "ptx" else ())
            if self.tc == "ptx" and self.regs:
                tile += (f"-cl-nv-maxrregcount={self.regs}",)
        else:
            tile += (f"IG_TM={self.tm}", f"IG_TN={self.tn}")
        return (tile + (("IG_CPU",) if self.cpu else ()) + (("IG_MFAST",) if self.mfast else ())
                + (("IG_TAPMAJOR=1",) if self.tapmajor else ()))

    def describe(self) -> str:
        narrow = f"a GEMM with <= {NARROW} rows or columns per group: an FMA tile narrow on that side"
        if self.tc:
            narrow = f"a GEMM with <= {NARROW} rows or columns per group: a tensor-core tile narrow on that side"
            how = ("mma.sync through inline PTX" if self.tc == "ptx" else
                   "the tile's portable products (plain OpenCL C, PORTCONV_OPENCL_TC=portable)")
            return (f"{self.bm}x{self.bn} tensor-core tiles (Note [OpenCL tensor cores]), reduction step {self.bk}, "
                    f"{self.wm}x{self.wn} warps of {self.bm // self.wm}x{self.bn // self.wn}, {how}; {narrow}")
        return (f"{self.bm}x{self.bn} tiles, reduction step {self.bk}, {self.tm}x{self.tn} results per work-item "
                f"({self.threads}-item work-groups; {narrow})")


GPU_TILE = IgSpec(64, 64, 16, 4, 4)
# Note [OpenCL tensor cores] tiles, measured on the H100 (docs/performance/notes-opencl.md, tc v1): 128x64, BK 16,
# 8 warps of 32x32 for forward and backward-data (128x128, 256x64, 64x64, 64x128 and BK 32 were 1.2x-1.6x slower
# there); the grad-weight, split over its long reduction, 128x128 with BK 32 (0.89x the time of 128x64).
TC_TILE = IgSpec(128, 64, 16, 0, 0, tc="ptx", wm=4, wn=2)
TC_TILE_WEIGHT = IgSpec(128, 128, 32, 0, 0, tc="ptx", wm=2, wn=4)
# ... and for 17-64 output channels per group, half as tall (64x128, 2x4 warps of 32x32): a 128-row tile spent half
# or more of its products and A gathers on padding. Measured (tc v5): the grad-weight of resnet50-stem, -l1-3x3,
# -l1-3x3-bf16-cl, r3d18-l1-3d, deepbench-speech-c1 and wav2vec2-posconv-g16 0.76x-0.82x the time, mbv2-pw-project
# 0.91x.
TC_WEIGHT_ROWS64 = (64, 2, 4)  # IG_BM, IG_WM, IG_WN
CPU_TILE = IgSpec(32, 32, 8, 4, 4, cpu=True)  # the fastest of 8 shapes on PoCL (notes-opencl.md igemm v1)
# A GEMM with at most 16 (CPU: 4 or 16) columns or rows per group, such as the 4 channels per group of resnext50-g32,
# runs a tile that narrow on that side (a 64-wide tile would compute 16x the useful products; igemm v2). A tile of
# width BN needs IG_NT / IG_BK <= BN work-items per load pass: 4 wide means 32-item groups, kept to the CPU.
NARROW = 16
NARROW_TILES = {(False, "cols", 16): IgSpec(128, 16, 8, 8, 2), (False, "rows", 16): IgSpec(16, 128, 8, 2, 8),
                (True, "cols", 16): IgSpec(64, 16, 8, 8, 4, cpu=True),
                (True, "rows", 16): IgSpec(16, 64, 8, 4, 8, cpu=True),
                (True, "cols", 4): IgSpec(64, 4, 8, 8, 1, cpu=True),
                (True, "rows", 4): IgSpec(4, 64, 8, 1, 8, cpu=True)}


# Tensor-core tiles narrow on one side (Note [OpenCL tensor cores]): the padded mma costs little next to the gathers,
# so a GEMM of C_in = 1..3 columns (backward-data of a stem) or 4 rows per group keeps the tensor cores. Values:
# (IG_BM, IG_BN, IG_WM, IG_WN); the rest of the problem's tile (products, BK, flags) is kept.
TC_NARROW = {("cols", 8): (128, 8, 4, 1), ("cols", 16): (128, 16, 4, 1), ("rows", 16): (16, 128, 1, 4)}


def fit(sp: IgSpec, rows: int, cols: int) -> IgSpec:
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
    return dataclasses.replace(narrow, phases=sp.phases)


def mode(device_kind: str) -> tuple[str, str]:
    """('direct' | 'igemm', why) for a dense problem on a device of this kind (Note [OpenCL dense algorithm])."""
    forced = (knobs.get("PORTCONV_OPENCL_DENSE") or "").strip().lower()
    if forced in MODES:
        return forced, f"PORTCONV_OPENCL_DENSE={forced}"
    if device_kind == "cpu":
        return DENSE_CPU_DEFAULT, "the CPU default (PoCL measurements, docs/performance/notes-opencl.md)"
    return "igemm", "the GPU default"


def spec(geo, cpu: bool, tc: str = "") -> IgSpec:
    """The tile of a problem: the FMA tile of the device kind, or the tensor-core tile with products ``tc``."""
    base = dataclasses.replace(TC_TILE, tc=tc, cpu=cpu) if tc else CPU_TILE if cpu else GPU_TILE
    phases = all(s == 1 or d == 1 for s, d in zip(geo.S, geo.DL))
    return base if phases else dataclasses.replace(base, phases=False)


# Note [OpenCL tensor cores] (opencl/igemm_tc.h): where the implicit-GEMM tiles compute on tensor cores. By default
# on NVIDIA GPUs of sm_80 and newer (inline PTX mma.sync; the device's compute capability from
# cl_nv_device_attribute_query), for float16 and bfloat16 always and for float32 where torch allows TF32 for cuDNN
# convolutions (the cuda backend's rule, Note [TF32 policy]); the plan's math is then 'tf32' and the conformance
# tolerance follows. PORTCONV_OPENCL_TC=off|ptx|portable forces it; 'portable' runs the same tile with its products
# in plain OpenCL C on any device (how CI runs the tile on PoCL).
TC_MODES = ("off", "ptx", "portable")


def _tc_knob() -> str:
    """PORTCONV_OPENCL_TC as one of TC_MODES, or '' (unset or unknown: the default rule)."""
    v = (knobs.get("PORTCONV_OPENCL_TC") or "").strip().lower()
    return v if v in TC_MODES else ""


def tc_of(algorithm: str) -> str:
    """The products a plan's algorithm ('igemm-tc...') runs: 'portable' when forced so (the knob is part of the
    plan's key), else 'ptx'; '' for the FMA tiles."""
    if not algorithm.startswith("igemm-tc"):
        return ""
    return "portable" if _tc_knob() == "portable" else "ptx"


def tc_mode(dtype: str, device) -> tuple[str, str]:
    """('' | 'ptx' | 'portable', why) for a dense problem of ``dtype`` on ``device`` (a DeviceInfo)."""
    if dtype == "float64":
        return "", "float64 has no tensor-core mma here"
    forced = _tc_knob()
    if forced:
        return ("" if forced == "off" else forced), f"PORTCONV_OPENCL_TC={forced}"
    arch = device.arch or ""
    if device.vendor != "nvidia" or device.kind != "gpu" or not arch.startswith("sm_") or int(arch[3:] or 0) < 80:
        return "", f"no tensor-core mma on {device.name} ({device.vendor} {device.kind} {arch}; PTX mma needs sm_80+)"
    if dtype == "float32":
        import torch

        from .cudnn import cudnn_conv_tf32

        ok, setting = cudnn_conv_tf32(torch)
        if not ok:
            return "", f"TF32 not allowed for float32 ({setting})"
        return "ptx", f"{arch}; TF32 allowed for float32 ({setting})"
    return "ptx", arch


def _order(geo, sp: IgSpec, kernel: str, c_inner: bool) -> str:
    """The reason's words for gather_order."""
    if not sp.tc:
        return ""
    mlane, tapmajor = gather_order(kernel, geo, c_inner, sp.bk)
    return ("; loads along the rows (Note [OpenCL M-lane gathers])" if mlane else "") + (
        "; tap-major steps (Note [OpenCL tap-major steps])" if tapmajor else "")


def reason(geo, sp: IgSpec, transposed: bool, why: str, device: str, c_inner: bool = False) -> str:
    t = ("; the transposed forward is the backward-data kernel, its backward-data the forward kernel"
         if transposed else "")
    bwd = (f"igemm_bwd_data by phases ({math.prod(geo.S)} phase(s) x {geo.G} group(s); rows: N x the phase's "
           f"positions, columns: {geo.CX} channel(s), reduction: {geo.CY} channel(s) x the phase's taps"
           f"{_order(geo, sp, 'bwd_data', c_inner)})"
           if sp.phases else
           "the direct kernel (an axis with both stride and dilation above 1 has no phase decomposition)")
    w = weight_tile(sp, geo.CY)
    wt = f" on {w.bm}x{w.bn} tensor-core tiles, reduction step {w.bk}" if sp.tc else ""
    return (f"implicit-GEMM kernels (opencl/igemm.cl) on {device}, {sp.describe()}, chosen by {why}: forward: "
            f"igemm_fwd (rows: N x output positions, columns: {geo.CY} channel(s), reduction: {geo.CX} channel(s) x "
            f"{geo.taps} tap(s), {geo.G} group(s){_order(geo, sp, 'fwd', c_inner)}); backward-data: {bwd}; "
            f"grad-weight: igemm_bwd_weight{wt} (rows: "
            f"{geo.CY} channel(s), columns: {geo.CX} channel(s) x {geo.taps} tap(s), reduction: N x positions = "
            f"{geo.reduction}) split over the reduction, the partial sums added in order by igemm_finalize "
            f"(no atomics){t}")


def splits(geo, sp: IgSpec, compute_units: int, acc_bytes: int) -> tuple[int, int]:
    """(splits, positions per split) of the grad-weight reduction: enough work-groups to fill the device (4 per
    compute unit), at least 16 reduction steps per split, at most 64 splits, workspace within WORKSPACE_BYTES."""
    red = geo.reduction
    tiles = -(-geo.CY // sp.bm) * -(-(geo.CX * geo.taps) // sp.bn) * geo.G
    count = geo.G * geo.CY * geo.CX * geo.taps
    want = -(-4 * max(1, compute_units) // tiles)
    n = max(1, min(64, want, red // (16 * sp.bk), WORKSPACE_BYTES // max(1, count * acc_bytes)))
    chunk = -(-red // n) if red else 0
    chunk = -(-chunk // sp.bk) * sp.bk
    return (-(-red // chunk) if chunk else 1), chunk


def _kernel(call, name, desc, tensors, sp, m, n, z, extra=0):
    """The igemm kernel ``name`` for a launch over (m tiles x threads, n tiles, z) work-items, its index width set
    in ``desc``; TOO_LARGE when the device cannot run the tile's work-group size for it."""
    items = -(-m // sp.bm) * sp.threads * -(-n // sp.bn) * z
    desc.idx64 = rt.force_idx64 or not rt.index_fits_int32(items + 64, extra, *(t.span for t in tensors))
    entry = call.rt.ig_kernel(call.dtype, desc.idx64, sp.defines, name)
    if entry[1] < sp.threads:
        rt.stats["ig_too_large"] += 1
        return TOO_LARGE
    return entry


def _launch(call, entry, name, desc, args, sp, m, n, z):
    gsize = (-(-m // sp.bm) * sp.threads, -(-n // sp.bn), z)
    return call._launch(entry, "ig_" + name, desc, args, gsize, (sp.threads, 1, 1))


def _grid(call, name, desc, tensors, args, m, n, z):
    """One launch of an igemm kernel over (m tiles x threads, n tiles, z) work-items (m x n: one group's GEMM); the
    tensor-core forward and backward-data kernels with the load order of gather_order."""
    sp = fit(call.ig, m, n)
    if sp.tc:
        mfast, tapmajor = gather_order(name, call.geo, bool(call.c_inner), sp.bk)
        sp = dataclasses.replace(sp, mfast=mfast, tapmajor=tapmajor)
        if tapmajor:
            desc.c_inner = 1  # the reduction channel-innermost
    entry = _kernel(call, name, desc, tensors, sp, m, n, z)
    return entry if entry is TOO_LARGE else _launch(call, entry, name, desc, args, sp, m, n, z)


# How the tensor-core tile's forward and backward-data kernels gather, measured on the H100 over the suite's dense
# rows (docs/performance/notes-opencl.md, tc v5; ratios: time against the default of that run):
# Note [OpenCL M-lane gathers]: IG_MFAST numbers the load work-items along the rows first, so 16 neighbouring rows
# (positions) read one contiguous run of an NCHW tensor instead of 16 reduction indices (channels H*W apart, taps).
# Backward-data: 0.69x-0.91x on 1x1, strided and dilated rows, 0.96x-0.98x on 3x3 / 7x7 / 3-D ones, slower where a
# phase's last axis has fewer than MLANE_MIN_RUN positions (dcgan-gen-transposed's 4: 1.08x) or its taps are many
# (wav2vec2-posconv-g16's 128: 1.20x, the reduction order already reads contiguous taps there). Forward: 0.84x-0.93x
# on the 1x1 rows of 56-wide outputs, 1.1x-1.3x slower on every multi-tap row (B, the weights, then loads C*taps
# apart), so only 1x1 forwards take it.
# Note [OpenCL tap-major steps] (opencl/igemm.cl): channel-innermost steps without divisions, row bounds once per tap,
# when the channel count is a multiple of the reduction step. Channels-last: forward 0.66x, backward-data 0.78x
# (resnet50-l1-3x3-bf16-cl). NCHW with M-lane loads: backward-data 0.79x-0.88x on 2-D/1-D multi-tap rows (stem,
# l1-3x3, b1-3x3, speech-c1, conv1d) and 0.67x on the transposed vae forward; 1x1 rows, whose order does not change,
# 0.85x-0.95x. Slower, so left out: NCHW multi-tap without M-lane loads (resnet50-l3-3x3's 14-wide phases 1.39x,
# wav2vec2-posconv-g16 1.60x, every multi-tap forward 1.07x-1.84x), and 3-D taps (r3d18-l1-3d 1.43x: with channels
# innermost a depth tap reaches an input plane again only after more data than L1 holds; the CUDA set measured the
# same).
MLANE_MIN_RUN, MLANE_MAX_TAPS = 16, 32


def gather_order(kernel: str, geo, c_inner: bool, bk: int) -> tuple[bool, bool]:
    """(M-lane loads, tap-major steps) of the tensor-core ``kernel`` ('fwd' | 'bwd_data') for this problem."""
    if kernel == "fwd":
        run, taps, ch = geo.Y[2], geo.taps, geo.CX
    else:  # one phase: its last axis and its taps
        run, taps, ch = -(-geo.X[2] // geo.S[2]), math.prod(-(-k // s) for k, s in zip(geo.K, geo.S)), geo.CY
    mlane = not c_inner and run >= MLANE_MIN_RUN and (taps == 1 if kernel == "fwd" else taps <= MLANE_MAX_TAPS)
    tapmajor = ch % bk == 0 and (c_inner or taps == 1 or (mlane and geo.K[0] == 1))
    return mlane, tapmajor


def fwd(call, x, w, y, bbuf, bkw, xs, ws, ys):
    g = call.geo
    d = call._desc(0, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, c_inner=call.c_inner, **bkw)
    return _grid(call, "fwd", d, (x, w, y), (x, w, bbuf, y), g.N * math.prod(g.Y), g.CY, g.G)


def bwd_data(call, y, w, x, bbuf, bkw, xs, ws, ys):
    g = call.geo
    d = call._desc(0, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, c_inner=call.c_inner, **bkw)
    largest = g.N * math.prod(-(-xx // s) for xx, s in zip(g.X, g.S))  # phase 0
    return _grid(call, "bwd_data", d, (x, w, y), (y, w, bbuf, x), largest, g.CX, g.G * math.prod(g.S))


def weight_tile(sp: IgSpec, rows: int = 1 << 30) -> IgSpec:
    """The grad-weight's tile for a problem whose tile is ``sp`` and whose grad-weight GEMM has ``rows`` (output
    channels per group): TC_TILE_WEIGHT's shape for the tensor-core tile (TC_WEIGHT_ROWS64's for 17-64 rows)."""
    if not sp.tc:
        return sp
    w = TC_TILE_WEIGHT
    bm, wm, wn = TC_WEIGHT_ROWS64 if NARROW < rows <= TC_WEIGHT_ROWS64[0] else (w.bm, w.wm, w.wn)
    return dataclasses.replace(sp, bm=bm, bn=w.bn, bk=w.bk, wm=wm, wn=wn)


def bwd_weight(call, x, y, w, xs, ws, ys):
    g = call.geo
    sp = fit(weight_tile(call.ig, g.CY), g.CY, g.CX * g.taps)
    if sp.tc and call.c_inner:  # channels-last: rows (k) and columns ((tap, c), c innermost) read along C
        sp = dataclasses.replace(sp, mfast=True)
    acc = 8 if call.dtype == "float64" else 4
    n_split, chunk = splits(g, sp, call.rt.device.max_compute_units, acc)
    count = g.G * g.CY * g.CX * g.taps
    # IG_MFAST's columns are channel-innermost (c_inner), in the kernel and in igemm_finalize alike
    d = call._desc(n_split, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, red=chunk,
                   c_inner=int(sp.mfast))
    m, n, z = g.CY, g.CX * g.taps, g.G * n_split
    entry = _kernel(call, "bwd_weight", d, (x, w, y), sp, m, n, z, count * n_split)
    if entry is TOO_LARGE:  # before the workspace is taken
        return entry
    part = call._scratch(count * n_split * acc) if n_split > 1 else call.rt.dummy()
    evt = _launch(call, entry, "bwd_weight", d, (x, y, w, part), sp, m, n, z)
    if n_split == 1:
        return evt
    d = call._desc(count, ws=ws, wo=w.offset, red=n_split, c_inner=int(sp.mfast))
    d.idx64 = rt.force_idx64 or not rt.index_fits_int32(count * n_split + 64, w.span)
    entry = call.rt.ig_kernel(call.dtype, d.idx64, sp.defines, "finalize")
    ls = 16 if call.rt.is_cpu else 64
    return call._launch(entry, "ig_finalize", d, (part, w), (count,), (ls,))
