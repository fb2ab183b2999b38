"""What every OpenCL launch is made of: the descriptor, operands, index width, modules; the direct kernels (conv.cl)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from ...device import DeviceInfo
from ...knobs import Options
from ...problem import ConvView, Layout, Problem
from ..program import Bind, Buffer, KernelPlan, Launch, Module

INT32_MAX = 2**31 - 1
DTYPE_DEFINES = {"float32": "DTYPE_F32", "float64": "DTYPE_F64", "float16": "DTYPE_F16", "bfloat16": "DTYPE_BF16"}

# The host image of common.h's conv_desc: one idx_t per field, in this order (int32, or int64 under IDX64).
FIELDS = ("N", "G", "CG", "KG", "X0", "X1", "X2", "Y0", "Y1", "Y2", "R0", "R1", "R2", "S0", "S1", "S2", "P0", "P1",
          "P2", "DL0", "DL1", "DL2", *(f"{t}{i}" for t in ("xs", "ws", "ys") for i in range(5)),
          "xo", "wo", "yo", "bo", "bs", "has_bias", "c_inner", "total", "red")
SLOT = {name: i for i, name in enumerate(FIELDS)}


def desc(view: ConvView, *, xs=(0,) * 5, ws=(0,) * 5, ys=(0,) * 5, bs=0, has_bias=0, c_inner=0, total=0, red=0,
         N=None, G=None, KG=None, Y=None) -> tuple[int, ...]:
    """conv_desc of ``view`` with these strides and counts; every offset field 0 (Binds patch them per call).
    N, G, KG, Y replace the view's (the bias gradient's reduction over one tensor)."""
    v = view
    return (v.N if N is None else N, v.G if G is None else G, v.cg, v.kg if KG is None else KG, *v.X,
            *(v.Y if Y is None else Y), *v.R, *v.S, *v.P, *v.DL, *xs, *ws, *ys, 0, 0, 0, 0, bs, has_bias, c_inner,
            total, red)


@dataclasses.dataclass(frozen=True)
class Operand:
    """A tensor a launch reads or writes: its role and Layout; ``result``: a fresh buffer of the call (offset 0)."""

    role: str
    layout: Layout
    result: bool = False

    @property
    def shape5(self) -> tuple[int, ...]:
        """(N, C, D, H, W): missing spatial dims of extent 1."""
        s = self.layout.shape
        return s[:2] + (1,) * (5 - len(s)) + s[2:]

    @property
    def strides5(self) -> tuple[int, ...]:
        """Element strides as (N, C, D, H, W); missing spatial dims have stride 0."""
        s = self.layout.strides
        return s[:2] + (0,) * (5 - len(s)) + s[2:]

    @property
    def numel(self) -> int:
        return math.prod(self.layout.shape)

    @property
    def big(self) -> bool:
        """Some element lies beyond 32-bit offsets."""
        return self.layout.wide or self.layout.span > INT32_MAX

    def bind(self, slot: int, offset_field: str | None = None) -> Bind:
        return Bind(slot, self.role, -1 if self.result or offset_field is None else SLOT[offset_field])


def result(role: str, shape, strides) -> Operand:
    return Operand(role, Layout.dense(shape, strides), result=True)


def bias_bind(bias: Operand | None, slot: int) -> Bind:
    return Bind(slot, "dummy") if bias is None else bias.bind(slot, "bo")


def bias_fields(bias: Operand | None) -> dict:
    return {} if bias is None else {"has_bias": 1, "bs": bias.layout.strides[0]}


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What a builder knows of one plan: the problem, its view, the device, options, the chosen family and products,
    the result format, and the compiled kernels' work-group limits learned so far (Note [work-group limits])."""

    problem: Problem
    view: ConvView
    device: DeviceInfo
    options: Options
    family: str  # 'depthwise', 'igemm', 'igemm-tc', 'direct'
    tc: str  # '', 'ptx', 'portable'
    fmt: str
    limits: Mapping[tuple[Module, str], int] = dataclasses.field(default_factory=dict)

    @property
    def dtype(self) -> str:
        return self.problem.dtype

    @property
    def cpu(self) -> bool:
        return self.device.kind == "cpu"

    @property
    def acc_bytes(self) -> int:
        return 8 if self.dtype == "float64" else 4

    @property
    def acc_dtype(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def c_inner(self) -> int:
        """The written tensors are channels-last: channel is the fastest work index."""
        return int(self.fmt != "contiguous")

    def limit(self, module: Module, kernel: str) -> int:
        """The work-group size a compiled kernel allows (default: the device's maximum)."""
        return self.limits.get((module, kernel), self.device.max_work_group or 256)

    def idx64(self, count: int, *ops: Operand | None, extra: int = 0) -> bool:
        """64-bit indices: forced, or ``count`` work-items, ``extra`` elements or an operand beyond 32-bit offsets,
        or an input or output of more elements than 32 bits count: every reduction over positions (N x the
        positions of x or y) is at most that, so its length and loop indices fit (stride-0 operands have small
        spans and any number of elements), as needs_index64 of the CUDA/HIP set."""
        v = self.view
        elements = max(v.N * v.C * math.prod(v.X), v.N * v.K * math.prod(v.Y))
        return (self.options.index64 or count + 64 > INT32_MAX or extra > INT32_MAX or elements > INT32_MAX
                or any(op is not None and op.big for op in ops))

    def module(self, source: str, idx64: bool, defines: dict | None = None) -> Module:
        return Module.of(source, {DTYPE_DEFINES[self.dtype]: "", **({"IDX64": ""} if idx64 else {}),
                                  **(defines or {})})


@dataclasses.dataclass
class Part:
    """One result's kernels: explain()'s summary and decision lines, its launches and workspaces."""

    summary: str
    decisions: list[str] = dataclasses.field(default_factory=list)
    launches: list[Launch] = dataclasses.field(default_factory=list)
    buffers: list[Buffer] = dataclasses.field(default_factory=list)

    def plan(self, result: str, out: Operand, dtype: str, why: list[str] = ()) -> KernelPlan:
        lines = [*why, *self.decisions]
        for launch in self.launches:
            lines += launch_lines(launch)
        buf = Buffer(out.role, out.layout.shape, out.layout.strides, dtype, result=True)
        return KernelPlan(result, self.summary, tuple(lines), (buf, *self.buffers), tuple(self.launches))


def launch_lines(launch: Launch) -> list[str]:
    """A launch in explain()'s words: grid, work-group, index width, local memory; its module's defines."""
    width = "64" if any(k == "IDX64" for k, _ in launch.module.defines) else "32"
    local = f", {launch.local_bytes} B local" if launch.local_bytes else ""
    lines = [f"{launch.describe()}, {width}-bit indices{local}"]
    words = [f"{k}={v}" if v != "" else k for k, v in launch.module.defines
             if k not in DTYPE_DEFINES.values() and k != "IDX64"]
    line = f"  {launch.module.source}"
    for w in words:
        if len(line) + len(w) > 100:
            lines.append(line)
            line = "   "
        line += " " + w
    return lines + [line]


def make_launch(module: Module, kernel: str, grid, block, args, binds, local_bytes: int = 0) -> Launch:
    """A launch over ``grid`` work-items, each dimension rounded up to the work-group (the kernels return early).
    A 32-bit module's descriptor must fit 32 bits: Ctx.idx64 decides the width, this only asserts it held."""
    grid = tuple(-(-g // b) * b for g, b in zip(grid, block))
    assert any(k == "IDX64" for k, _ in module.defines) or all(-INT32_MAX - 1 <= a <= INT32_MAX for a in args), \
        f"{kernel}: a descriptor value passes 32 bits in a 32-bit module (Ctx.idx64)"
    return Launch(module, kernel, grid, tuple(block), tuple(args), tuple(binds), local_bytes=local_bytes)


def fitted_launch(ctx: Ctx, mod: Module, kernel: str, grid, block, args, binds, local: int = 0) -> Launch | str:
    """make_launch, or why the launch cannot run: its compiled kernel allows fewer work-items than ``block`` (Note
    [work-group limits]), or the device has less local memory than the kernel's static ``local`` bytes."""
    if ctx.limit(mod, kernel) < math.prod(block):
        return f"{kernel} needs {math.prod(block)}-item work-groups, the device allows {ctx.limit(mod, kernel)}"
    if 0 < ctx.device.local_mem_bytes < local:
        return f"{kernel} needs {local} B of local memory, the device has {ctx.device.local_mem_bytes} B"
    return make_launch(mod, kernel, grid, block, args, binds)


def part_of(family: str, summary: str, *launches: Launch | str) -> tuple[Part | None, list[str]]:
    """A direction's Part of these launches, or None and why (``family``'s kernels not used) where one cannot run."""
    bad = [x for x in launches if isinstance(x, str)]
    return (None, [f"{family} kernels not used: {bad[0]}"]) if bad else (Part(summary, [], list(launches)), [])


def module_launch(ctx: Ctx, source: str, defines: dict, kernel: str, grid, block, args, binds, ops, extra: int = 0,
                  local: int = 0) -> Launch | str:
    """fitted_launch of ``kernel`` in the module of ``source`` and ``defines``, its index width from the launch's
    work-items and the operands ``ops`` (``extra``: elements of a workspace it also indexes)."""
    groups = math.prod(-(-g // b) * b for g, b in zip(grid, block))
    mod = ctx.module(source, ctx.idx64(groups, *ops, extra=extra), defines)
    return fitted_launch(ctx, mod, kernel, grid, block, args, binds, local)


def split_part(ctx: Ctx, family: str, source: str, defines: dict, summary: str, launch: Launch | str, w: Operand,
               count: int, splits: int, finalize: str) -> tuple[Part | None, list[str]]:
    """A weight gradient's Part: ``launch`` alone (one split), or with ``finalize`` (its module's kernel), which adds
    the splits' partials[split][count] into ``w`` in split order (deterministic, no atomics)."""
    if splits == 1:
        return part_of(family, summary, launch)
    part_elems = splits * count
    mod = ctx.module(source, ctx.idx64(count, w, extra=part_elems), defines)
    ls = max(1, min(64, ctx.limit(mod, finalize)))
    fin = desc(ctx.view, ws=w.strides5, total=count, red=splits)
    out, why = part_of(family, summary, launch, make_launch(mod, finalize, (count,), (ls,), fin,
                                                            (Bind(1, "partials"), w.bind(2, "wo"))))
    if out is not None:
        out.buffers.append(Buffer("partials", (part_elems,), (1,), ctx.acc_dtype))
    return out, why


def pow2_floor(v: int) -> int:
    p = 1
    while p * 2 <= v:
        p *= 2
    return p


def group_size(reduction: int) -> int:
    """Work-group size of a reduction: a few fixed sizes (PoCL compiles one work-group function per size)."""
    return 16 if reduction <= 64 else 64 if reduction <= 2048 else 256


def taps_text(view: ConvView) -> str:
    return "x".join(str(r) for r in view.R if r > 1) or "1"


# --- the direct kernels of conv.cl: one work-item per result element, one work-group per reduced element ---

_WRITES = {"fwd": "y", "bwd_data": "x", "bwd_weight": "w"}


def direct(ctx: Ctx, kind: str, x: Operand, w: Operand, y: Operand, bias: Operand | None = None) -> Part:
    """conv.cl's ``kind`` ('fwd', 'bwd_data', 'bwd_weight') of the view: x, w, y by role (Note [canonical
    convolution] in opencl/common.h); ``bias`` (fwd, bwd_data) per written channel."""
    v = ctx.view
    written = {"x": x, "w": w, "y": y}[_WRITES[kind]]
    name = ("depthwise_" if v.depthwise else "conv_") + kind
    ops = (x, w, y, bias)
    total = written.numel
    strides = dict(xs=x.strides5, ws=w.strides5, ys=y.strides5, c_inner=ctx.c_inner, total=total)
    if kind == "bwd_weight":
        group = group_size(v.y_positions)
        mod = ctx.module("conv.cl", ctx.idx64(total * group, *ops), {"DEPTHWISE": ""} if v.depthwise else {})
        ls = pow2_floor(min(group, ctx.limit(mod, name)))
        launch = make_launch(mod, name, (total * ls,), (ls,), desc(v, **strides),
                             (x.bind(1, "xo"), y.bind(2, "yo"), w.bind(3, "wo")), ls * ctx.acc_bytes)
        swapped = ["transposed: x and grad_output roles swapped"] if ctx.problem.params.transposed else []
        return Part(f"{name} (opencl/conv.cl): a work-group of {ls} per weight element over N x positions "
                    f"= {v.y_positions}", swapped, [launch])
    mod = ctx.module("conv.cl", ctx.idx64(total, *ops), {"DEPTHWISE": ""} if v.depthwise else {})
    ls = max(1, min(64, ctx.limit(mod, name)))
    args = desc(v, **strides, **bias_fields(bias))
    a, o = (x, "xo"), (y, "yo")
    first, last = (a, o) if kind == "fwd" else (o, a)
    binds = (first[0].bind(1, first[1]), w.bind(2, "wo"), bias_bind(bias, 3), last[0].bind(4, last[1]))
    summed = f"{v.cg if kind == 'fwd' else v.kg} channel(s) x {v.taps} tap(s)"
    return Part(f"{name} (opencl/conv.cl): a work-item per {written.role} element, {summed}",
                launches=[make_launch(mod, name, (total,), (ls,), args, binds)])


def bias_grad(ctx: Ctx, t: Operand, b: Operand) -> Part:
    """b[c] = the sum of t[:, c] over N and positions: one work-group per channel (conv.cl's bias_grad)."""
    v = ctx.view
    shape, strides = t.shape5, t.strides5
    red = shape[0] * math.prod(shape[2:])
    name = ("depthwise_" if v.depthwise else "conv_") + "bias_grad"
    group = group_size(red)
    mod = ctx.module("conv.cl", ctx.idx64(shape[1] * group, t, b), {"DEPTHWISE": ""} if v.depthwise else {})
    ls = pow2_floor(min(group, ctx.limit(mod, name)))
    args = desc(v, N=shape[0], G=1, KG=shape[1], Y=shape[2:], ys=strides, bs=b.layout.strides[0], total=shape[1],
                red=red)
    launch = make_launch(mod, name, (shape[1] * ls,), (ls,), args, (t.bind(1, "yo"), b.bind(2, "bo")),
                         ls * ctx.acc_bytes)
    return Part(f"{name} (opencl/conv.cl): a work-group of {ls} per channel reducing {red} values",
                launches=[launch] if shape[1] else [])
