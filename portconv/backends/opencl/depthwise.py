"""The depthwise kernels (opencl/depthwise.cl): when they apply (problem and layouts), their settings, launches."""
from __future__ import annotations

import dataclasses
import functools
import math

from ...problem import ConvView, Problem
from ..program import Bind, Buffer
from .kernels import Ctx, Operand, Part, bias_bind, bias_fields, desc, make_launch

# Note [depthwise kernels] (opencl/depthwise.cl): the vectorised depthwise kernels take depthwise convolutions
# (CG == 1, G > 1) that are not transposed, undilated, float32/float64/bfloat16 (bfloat16 computed in float32),
# computed in the contiguous layout, with a kernel size of the table below and strides 1 or 2; the kernel size and
# strides are compile-time constants of the program. Per call, x and y (the tensors a direction reads and writes
# along W) must be contiguous along W; other layouts run the generic kernels of conv.cl.
DW_KERNEL_SIZES = {(1, 1, 3), (1, 3, 3), (3, 3, 3), (1, 5, 5)}
# Note [channels-last depthwise]: W positions per work-item (DW_CLW). CPU: 16, amortising the taps' weight gathers
# (PoCL, mbv2-dw3x3-bf16-cl forward + backward-data: 0.71x the time of 4); GPU: 4 (docs/kernels/opencl.md).
DW_CLW_CPU, DW_CLW_GPU = 16, 4
DW_CL_LOCAL = (2, 2, 2)  # ... and its work-groups on CPUs (8 work-items: PoCL runs a group's items in one loop)
DW_CL_LOCAL_GPU = (8, 4, 4)  # GPUs: 8 channel blocks (one 128-byte line of bfloat16 x 8 lanes) x 4 W blocks x 4 rows
# ... the grad-weight's work-groups on GPUs (DW_CLB, DW_CLR): 8 channel blocks x 32 position lanes, added in a local
# tree, 2 work-groups per compute unit (H100, mbv2-dw3x3-bf16-cl: 0.56x the time of 8 per compute unit)
DW_CLW_LOCAL_GPU = (8, 32)
DW_CLW_GROUPS_PER_CU = 2


@dataclasses.dataclass(frozen=True)
class DwSpec:
    """How the depthwise kernels run one problem: vector width, work-group shapes and the build defines."""

    vw: int  # outputs per work-item along W (channels along C for the channels-last kernels)
    rb: int  # rows computed together (independent accumulators) by a work-item (forward, backward-data)
    local: tuple[int, int, int]  # fwd / bwd-data work-group (W blocks, rows, planes)
    red_local: int  # bwd-weight work-group size
    R: tuple[int, int, int]
    S: tuple[int, int, int]
    nb: int = 1  # such row blocks per work-item
    cpu: bool = False  # DW_CPU: unaligned vector dereferences instead of vloadn/vstoren (CPU compilers)
    cl: bool = False  # DW_CL: the channels-last kernels (Note [channels-last depthwise]) instead of the W-vector ones
    aligned: bool = False  # DW_CLA: every vector of a channels-last call at a multiple of vw elements (GPUs)

    @property
    def defines(self) -> dict:
        d = {"DW_VW": self.vw, "DW_RB": self.rb, "DW_NB": self.nb, **{f"DW_K{i}": r for i, r in enumerate(self.R)},
             **{f"DW_S{i}": s for i, s in enumerate(self.S)}}
        d.update({"DW_CPU": ""} if self.cpu else {})
        if self.cl:
            d.update({"DW_CL": "", "DW_CLW": self.clw})
            d.update({} if self.cpu else {"DW_CLB": DW_CLW_LOCAL_GPU[0], "DW_CLR": DW_CLW_LOCAL_GPU[1]})
        return {**d, **({"DW_CLA": ""} if self.aligned else {})}

    @property
    def clw(self) -> int:
        """DW_CLW of the channels-last kernels: W positions per work-item, by device type."""
        return DW_CLW_CPU if self.cpu else DW_CLW_GPU

    def grid(self, extents) -> tuple[int, int]:
        """fwd / bwd-data work-items (W blocks, row blocks) over the written tensor's (D, H, W) extents."""
        return -(-extents[2] // self.vw), -(-extents[1] // (self.rb * self.nb))

    @property
    def taps(self) -> int:
        return math.prod(self.R)

    def describe(self) -> str:
        k = "x".join(str(v) for v in self.R if v > 1 or self.R == (1, 1, 1)) or "1"
        s = "x".join(str(v) for v, kk in zip(self.S, self.R) if kk > 1) or "1"
        if self.cl:
            return f"{k} stride {s}, {self.vw} channels x {self.clw} W positions per work-item"
        return f"{k} stride {s}, {self.vw} W outputs x {self.rb * self.nb} rows per work-item"


@functools.lru_cache(maxsize=512)
def dw_spec(problem: Problem, view: ConvView, fmt: str, cpu: bool) -> tuple[DwSpec | None, str]:
    """The W-vector depthwise kernels' settings for this problem, or None and why the generic kernels run."""
    why = ""
    if not view.depthwise:
        why = "not depthwise"
    elif problem.params.transposed:
        why = "transposed"
    elif problem.dtype not in ("float32", "float64", "bfloat16"):
        why = f"{problem.dtype} (they take float32, float64 and bfloat16)"
    elif view.DL != (1, 1, 1):
        why = "dilated"
    elif view.R not in DW_KERNEL_SIZES:
        why = f"kernel {'x'.join(map(str, view.R))} has no specialised depthwise program"
    elif any(s not in (1, 2) for s in view.S):
        why = "a stride other than 1 or 2"
    elif fmt != "contiguous":
        why = f"results {fmt} (they vectorise along a contiguous W)"
    if why:
        return None, why
    # CPU (PoCL): one AVX2 register of outputs per work-item, small work-groups (work-items run one after the other
    # inside a group) that fit the grid: up to 4 W blocks x 4 row blocks, filled up to 8 work-items with planes when
    # the image is narrower (7x7 images: 8 planes a group, 0.4x-0.6x the time of 16 work-items of which 15 idle);
    # the grad-weight one work-item per (channel, split), walking its rows in order. GPU: 4 outputs per work-item,
    # 2 rows, work-groups of up to 16x8 (W blocks x row blocks) that fit the image, filled up to 128 work-items with at
    # most 64 planes (NVIDIA's limit along z) (H100, 7x7 forward: 0.45x the time of fixed 16x8 groups), 64-item
    # reductions (docs/kernels/opencl.md).
    vw, rb, nb = (4 if problem.dtype == "float64" else 8, 4, 2) if cpu else (4, 2, 1)
    cap, fill = ((4, 4, 8), 8) if cpu else ((16, 8, 64), 128)
    lx = min(cap[0], -(-min(view.Y[2], view.X[2]) // vw))
    ly = min(cap[1], -(-min(view.Y[1], view.X[1]) // (rb * nb)))
    local = (lx, ly, max(1, min(cap[2], fill // (lx * ly))))
    return DwSpec(vw, rb, local, 1 if cpu else 64, view.R, view.S, nb=nb, cpu=cpu), ""


@functools.lru_cache(maxsize=512)
def dw_cl_spec(problem: Problem, view: ConvView, fmt: str, cpu: bool) -> tuple[DwSpec | None, str]:
    """Note [channels-last depthwise] (opencl/depthwise.cl): the settings of the kernels that vectorise along C for
    channels-last depthwise problems, or None and why (they need channel multiplier 1 and C in whole vectors)."""
    if fmt == "contiguous":
        return None, "results are contiguous"
    base, why = dw_spec(problem, view, "contiguous", cpu)
    if base is None:
        return None, why
    vw = 4 if problem.dtype == "float64" else 8
    if view.kg != 1:
        return None, f"channel multiplier {view.kg} (those take 1)"
    if view.G % vw:
        return None, f"{view.G} channels are not whole vectors of {vw}"
    return DwSpec(vw, 1, DW_CL_LOCAL if cpu else DW_CL_LOCAL_GPU, 1, view.R, view.S, cpu=cpu, cl=True), ""


def cl_aligned(vw: int, *ops: Operand) -> bool:
    """DW_CLA: every run of vw channels of these channels-last operands starts at a multiple of vw elements: their
    offsets (Layout.misalign, modulo 8) and their strides other than the channel one (of extents above 1)."""
    return not any(op.layout.misalign % vw or any(st % vw for n, st in zip(op.shape5, op.strides5)
                                                  if n > 1 and st != 1) for op in ops)


def dw_splits(channels: int, items: int, local: int, compute_units: int, cpu: bool) -> int:
    """Work-groups per channel of the depthwise grad-weight: enough groups to fill the device (CPU: 4 per core, GPU:
    8 per compute unit), never fewer than 4 work-items' worth of items per group, at most 64."""
    want = (4 if cpu else 8) * max(1, compute_units)
    return max(1, min(64, -(-want // max(1, channels)), items // (4 * local)))


def dw_cl_splits(blocks: int, positions: int, compute_units: int, cpu: bool) -> int:
    """Splits of the channels-last depthwise grad-weight's positions: CPUs as dw_splits (one work-item per channel
    block and split); GPUs DW_CLW_GROUPS_PER_CU work-groups (of DW_CLW_LOCAL_GPU) per compute unit, at least 4
    positions per lane, at most 1024."""
    if cpu:
        return dw_splits(blocks, positions, 1, compute_units, True)
    groups = -(-blocks // DW_CLW_LOCAL_GPU[0])
    return max(1, min(1024, -(-DW_CLW_GROUPS_PER_CU * max(1, compute_units) // groups),
                      positions // (4 * DW_CLW_LOCAL_GPU[1])))


def _w_contiguous(*ops: Operand) -> bool:
    return all(op.strides5[4] == 1 or op.shape5[4] == 1 for op in ops)


def _channel_unit(*ops: Operand) -> bool:
    return all(op.strides5[1] == 1 for op in ops)


def _pick(ctx: Ctx, x: Operand, y: Operand) -> tuple[DwSpec | None, list[str]]:
    """The spec that runs a direction reading / writing x and y along W or C, or None and why not."""
    p, v = ctx.problem, ctx.view
    spec, why = dw_spec(p, v, ctx.fmt, ctx.cpu)
    if spec is not None:
        if _w_contiguous(x, y):
            return spec, []
        return None, [f"{x.role} or {y.role} is strided along W: the generic kernels"]
    cl, why_cl = dw_cl_spec(p, v, ctx.fmt, ctx.cpu)
    if cl is None:
        return None, [f"vectorised depthwise kernels not used: {why_cl if ctx.fmt != 'contiguous' else why}"]
    if not _channel_unit(x, y):
        return None, [f"{x.role} or {y.role} has channel stride > 1: the generic kernels"]
    if not cl.cpu and cl_aligned(cl.vw, x, y):
        return dataclasses.replace(cl, aligned=True), [f"DW_CLA: every vector at a multiple of {cl.vw} elements"]
    return cl, []


def _launch(ctx: Ctx, spec: DwSpec, kernel: str, grid, block, args, binds, ops, local_bytes=0, extra=0):
    """The launch, or the reason it cannot run: a compiled kernel allowing fewer work-items than ``block``."""
    groups = math.prod(-(-g // b) * b for g, b in zip(grid, block))
    mod = ctx.module("depthwise.cl", ctx.idx64(groups, *ops, extra=extra), spec.defines)
    lim = ctx.limit(mod, kernel)
    if lim < math.prod(block):
        return f"{kernel} needs {math.prod(block)}-item work-groups, the device allows {lim}: the generic kernels"
    return make_launch(mod, kernel, grid, block, args, binds, local_bytes)


def _done(summary: str, lines: list[str], *launches) -> tuple[Part | None, list[str]]:
    """The direction's Part, or None and why when a launch cannot run."""
    bad = [x for x in launches if isinstance(x, str)]
    return (None, lines + bad[:1]) if bad else (Part(summary, lines, list(launches)), [])


def _summary(kernel: str, spec: DwSpec) -> str:
    return f"{kernel} (opencl/depthwise.cl): {spec.describe()}"


def fwd(ctx: Ctx, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    """y = conv(x, w) (+ bias): dw_fwd over (W blocks, row blocks, planes) or dw_cl_fwd over (channel blocks, W
    blocks, rows)."""
    spec, lines = _pick(ctx, x, y)
    if spec is None:
        return None, lines
    v = ctx.view
    binds = (x.bind(1, "xo"), w.bind(2, "wo"), bias_bind(bias, 3), y.bind(4, "yo"))
    strides = dict(xs=x.strides5, ws=w.strides5, ys=y.strides5, **bias_fields(bias))
    if spec.cl:
        rows = v.N * v.Y[0] * v.Y[1]
        grid = (v.G // spec.vw, -(-v.Y[2] // spec.clw), rows)
        launch = _launch(ctx, spec, "dw_cl_fwd", grid, spec.local, desc(v, total=rows, **strides), binds, (x, w, y))
        return _done(_summary("dw_cl_fwd", spec), lines, launch)
    planes = v.N * v.G * v.kg * v.Y[0]
    launch = _launch(ctx, spec, "dw_fwd", (*spec.grid(v.Y), planes), spec.local, desc(v, total=planes, **strides),
                     binds, (x, w, y))
    return _done(_summary("dw_fwd", spec), lines, launch)


def bwd_data(ctx: Ctx, y: Operand, w: Operand, x: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    """x = conv^T(y, w): dw_bwd_data or dw_cl_bwd_data (no bias: never the transposed forward)."""
    if bias is not None:
        return None, []
    spec, lines = _pick(ctx, x, y)
    if spec is None:
        return None, lines
    v = ctx.view
    binds = (y.bind(1, "yo"), w.bind(2, "wo"), Bind(3, "dummy"), x.bind(4, "xo"))
    strides = dict(xs=x.strides5, ws=w.strides5, ys=y.strides5)
    if spec.cl:
        rows = v.N * v.X[0] * v.X[1]
        grid = (v.G // spec.vw, -(-v.X[2] // spec.clw), rows)
        launch = _launch(ctx, spec, "dw_cl_bwd_data", grid, spec.local, desc(v, total=rows, **strides), binds,
                         (x, w, y))
        return _done(_summary("dw_cl_bwd_data", spec), lines, launch)
    planes = v.N * v.G * v.X[0]
    launch = _launch(ctx, spec, "dw_bwd_data", (*spec.grid(v.X), planes), spec.local, desc(v, total=planes, **strides),
                     binds, (x, w, y))
    return _done(_summary("dw_bwd_data", spec), lines, launch)


def bwd_weight(ctx: Ctx, x: Operand, y: Operand, w: Operand) -> tuple[Part | None, list[str]]:
    """w = the sum over N and positions of y * x: work-groups per (channel or channel block, split), the splits'
    partials added in split order by dw_finalize (deterministic, no atomics)."""
    spec, lines = _pick(ctx, x, y)
    if spec is None:
        return None, lines
    v, acc = ctx.view, ctx.acc_bytes
    strides = dict(xs=x.strides5, ws=w.strides5, ys=y.strides5)
    if spec.cl:
        channels, blocks, cnt = v.G, v.G // spec.vw, v.N * math.prod(v.Y)
        local = (1, 1) if spec.cpu else DW_CLW_LOCAL_GPU
        splits = dw_cl_splits(blocks, cnt, ctx.device.compute_units, spec.cpu)
        per = -(-cnt // splits) if cnt else 0
        splits = -(-cnt // per) if per else 1
        kernel, grid, local_bytes = "dw_cl_bwd_weight", (blocks, splits * local[1]), 0
        how = ("one work-item per (channel block, split)" if spec.cpu else
               f"work-groups of {local[0]} channel blocks x {local[1]} position lanes per split")
    else:
        channels, local = v.G * v.kg, (spec.red_local, 1)
        items = v.N * v.Y[0] * -(-v.Y[1] // spec.rb) * -(-v.Y[2] // spec.vw)  # (blocks of rb rows) x W blocks
        splits = dw_splits(channels, items, spec.red_local, ctx.device.compute_units, spec.cpu)
        per = -(-items // splits) if items else 0
        kernel, grid = "dw_bwd_weight", (spec.red_local * splits, channels)
        local_bytes = spec.taps * spec.red_local * acc
        how = f"work-groups of {spec.red_local} per (channel, split)"
    part_elems = channels * splits * spec.taps if splits > 1 else 0
    ws = Bind(4, "partials") if splits > 1 else Bind(4, "dummy")
    launch = _launch(ctx, spec, kernel, grid, local, desc(v, total=channels * splits, red=per, **strides),
                     (x.bind(1, "xo"), y.bind(2, "yo"), w.bind(3, "wo"), ws), (x, w, y), local_bytes, part_elems)
    summary = f"{kernel} (opencl/depthwise.cl): {how}"
    if splits == 1:
        return _done(summary, lines + ["1 split: no dw_finalize"], launch)
    fin = desc(v, ws=w.strides5, total=channels * spec.taps, red=splits)
    ls = 16 if ctx.cpu else 64
    mod = ctx.module("depthwise.cl", ctx.idx64(channels * spec.taps, w, extra=part_elems), spec.defines)
    ls = min(ls, ctx.limit(mod, "dw_finalize"))
    finalize = make_launch(mod, "dw_finalize", (channels * spec.taps,), (ls,), fin,
                           (Bind(1, "partials"), w.bind(2, "wo")))
    out, why = _done(summary, lines + [f"{splits} splits of {per} positions, added in split order by dw_finalize"],
                     launch, finalize)
    if out is not None:
        out.buffers.append(Buffer("partials", (part_elems,), (1,), ctx.acc_dtype))
    return out, why
