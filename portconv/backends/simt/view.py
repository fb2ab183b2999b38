"""The kernels' argument block (cuda/common.cuh) built from a ConvView and Layouts, and the per-result launch list."""
from __future__ import annotations

import dataclasses
import math
import textwrap

from ...problem import ConvView, Layout
from ...tensors import dense_strides
from ..program import Bind, Buffer, KernelPlan, Launch, Module

# The kernel argument block, in cuda/common.cuh's order (tests/test_cuda_compile.py checks the two agree).
ARG_FIELDS = (("x", 1), ("w", 1), ("y", 1), ("b", 1), ("ws", 1), ("N", 1), ("C", 1), ("K", 1), ("G", 1),
              ("X", 3), ("Y", 3), ("R", 3), ("S", 3), ("P", 3), ("DL", 3), ("xs", 5), ("ws_", 5), ("ys", 5),
              ("bs", 1), ("splits", 1), ("chunk", 1), ("flags", 1))
ARG_COUNT = sum(n for _, n in ARG_FIELDS)
POINTERS = ("x", "w", "y", "b", "ws")  # the first five fields: device addresses, patched per call (Bind.slot)
FLAG_CL = 1
FLAG_VA, FLAG_VB = 2, 4  # Note [vector gathers] (cuda/conv_igemm_tc.cuh): A / B may be read 16 bytes at a time
FLAG_WARP = 8  # Note [warp finalize]: portconv_split_finalize sums a value with a warp
FLAG_COLTAP = 16  # Note [narrow backward-data]: portconv_col2im's columns are (tap, c) (W channels-last)
DTYPE_CODE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
ITEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
THREADS = 256
GRID_YZ_MAX = 65535
MODULE_LINE = 100  # a module's description (source and defines) wraps at this width in a plan's lines
INDEX32_LIMIT = 2**31 - 1 - 2**26  # headroom for grid-stride steps past the last element
# Note [warp finalize] (cuda/reduce.cuh): the finalize sums a value with a warp from WARP_FINALIZE splits and up to
# WARP_FINALIZE_MAX values (more values fill the GPU with a thread a value, and its loads coalesce)
WARP_FINALIZE, WARP_FINALIZE_MAX = 16, 16384


@dataclasses.dataclass(frozen=True)
class Operand:
    """A tensor a launch reads or writes: the role whose address it takes, and its layout."""

    role: str
    layout: Layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def strides(self) -> tuple[int, ...]:
        return self.layout.strides


def arg_field(launch, name: str) -> int:
    """The value of one ARG_FIELDS field ('flags', 'splits', ...) in a Launch's argument block."""
    offset = 0
    for n, count in ARG_FIELDS:
        if n == name:
            return launch.args[offset]
        offset += count
    raise KeyError(name)


def strides5(t: Operand | None) -> tuple[int, ...]:
    """Element strides of an (N, C, *spatial) operand as 5 values (leading spatial dims of extent 1 get 0)."""
    if t is None:
        return (0,) * 5
    st = t.strides
    return st[:2] + (0,) * (5 - len(st)) + st[2:]


def bias_stride(bias: Operand | None) -> int:
    return 0 if bias is None else bias.strides[0]


def needs_index64(*layouts: Layout | None) -> bool:
    """True if any layout has as many elements, or a last offset, as 32-bit kernel indexing allows."""
    for lay in layouts:
        if lay is None:
            continue
        if math.prod(lay.shape) > INDEX32_LIMIT or lay.span - 1 > INDEX32_LIMIT:
            return True
    return False


def nchw_dense(t: Operand) -> bool:
    """t is dense in its dimension order (NCHW / NCDHW), extent-1 axes of any stride: plane n*C + c lies at
    (n*C + c)*H*W (Note [depthwise planes]), and Note [channels-last staging] may copy it as one [N][C][rest] block."""
    want = dense_strides(t.shape)
    return all(n == 1 or a == b for n, a, b in zip(t.shape, t.strides, want))


def vector_ok(t: Operand | None, item: int, axis: int = 1) -> bool:
    """Note [vector gathers]: t's reduction-channel axis (1; 0 for the K of a weight in backward-data) is contiguous,
    every other axis that is not of extent 1 steps by a multiple of 16 bytes, and its address is 16-byte aligned, so
    16 channels from a multiple of 16 are aligned 16-byte vectors."""
    if t is None:
        return False
    st, shape = t.strides, t.shape
    return (st[axis] == 1 and t.layout.misalign == 0
            and all((s * item) % 16 == 0 for i, (s, n) in enumerate(zip(st, shape)) if i != axis and n > 1))


def splits_for(blocks: int, total: int, min_chunk: int, units: int, count: int, align: int = 1) -> tuple[int, int]:
    """(splits, chunk) of a reduction of ``total`` terms so that ``blocks`` x splits fills the device."""
    target = 4 * max(units, 1)
    if blocks >= target or total <= min_chunk:
        return 1, max(total, 1)
    want = min(-(-target // blocks), -(-total // min_chunk), GRID_YZ_MAX, max(1, 2**27 // max(count, 1)))
    chunk = -(-total // max(want, 1))
    chunk = -(-chunk // align) * align
    return -(-total // chunk), chunk


@dataclasses.dataclass(frozen=True)
class Target:
    """What a build knows besides the problem: the kernel set's entry files, the device's units and arch, the
    base defines of every module (dtype, index width), and the plan's family."""

    entries: dict  # family -> entry file ('direct' -> 'direct.cu' or 'direct.hip')
    algorithm: str
    dtype: str
    units: int
    arch: str
    channels_last: bool  # the results' memory format is channels-last: PC_FLAG_CL in every launch
    index64: bool
    defines: tuple[tuple[str, object], ...]  # every module of the plan has them
    waits: bool = True  # the kernel set's prelude waits in pc_grid_dependency_wait (Note [dependent launch])

    @property
    def item(self) -> int:
        return ITEM[self.dtype]

    @property
    def acc_dtype(self) -> str:
        return "float64" if self.dtype == "float64" else "float32"

    def module(self, kernel: str, extra: dict | None = None, family: str | None = None) -> Module:
        """The unit that holds ``kernel`` alone (Note [one kernel a module])."""
        return Module.of(self.entries[family or self.algorithm], {**dict(self.defines), **(extra or {})}, kernel)


class Launches:
    """The buffers and launches of one result, in order, with explain()'s decision lines."""

    def __init__(self, target: Target, view: ConvView, result: str):
        self.target, self.view, self.result = target, view, result
        self.buffers: list[Buffer] = []
        self.launches: list[Launch] = []
        self.notes: list[str] = []

    def note(self, line: str) -> None:
        self.notes.append(line)

    def buffer(self, name: str, shape, strides, dtype: str | None = None, result: bool = False) -> Operand:
        """A buffer of the call: the result itself (``name`` == the result), or '<result>.<name>'."""
        role = name if result else f"{self.result}.{name}"
        shape, strides = tuple(shape), tuple(strides)
        self.buffers.append(Buffer(role, shape, strides, dtype or self.target.dtype, result))
        return Operand(role, Layout(shape, strides))

    def workspace(self, name: str, count: int) -> Operand:
        """Partial sums in the accumulator type (float64 for float64 problems, float32 otherwise)."""
        return self.buffer(name, (count,), (1,), self.target.acc_dtype)

    def launch(self, kernel: str, grid, extra: dict | None = None, dependent: bool = False, *, x=None, w=None, y=None,
               b=None, ws=None, xs=None, wst=None, ys=None, bs=0, splits=1, chunk=1, C=None, K=None, R=None, Y=None,
               flags=0, N=None, view: ConvView | None = None) -> Launch:
        """One launch of ``kernel`` with the argument block of the view (or ``view``) and these fields; pointer
        fields are zero and bound to the operands' roles."""
        v = view or self.view
        args = (0, 0, 0, 0, 0, v.N if N is None else N, v.C if C is None else C, v.K if K is None else K, v.G,
                *v.X, *(v.Y if Y is None else Y), *(v.R if R is None else R), *v.S, *v.P, *v.DL,
                *(xs or (0,) * 5), *(wst or (0,) * 5), *(ys or (0,) * 5), bs, splits, chunk,
                (FLAG_CL if self.target.channels_last else 0) | flags)
        assert len(args) == ARG_COUNT
        binds = tuple(Bind(i, t.role) for i, t in enumerate((x, w, y, b, ws)) if t is not None)
        grid = tuple(int(g) for g in grid)
        launch = Launch(self.target.module(kernel, extra), kernel, grid, (THREADS, 1, 1), tuple(int(a) for a in args),
                        binds, dependent)
        self.launches.append(launch)
        return launch

    def elementwise_grid(self, total: int) -> tuple[int, int, int]:
        return (max(1, min(-(-total // THREADS), self.target.units * 32)), 1, 1)

    def finalize(self, count: int, splits: int, extra: dict | None = None, **fields) -> None:
        """portconv_split_finalize of ``count`` values over ``splits`` partial sums: a warp a value or a thread a value
        (Note [warp finalize]), the kernel told which by PC_FLAG_WARP; a dependent launch (Note [dependent launch])."""
        warp = splits >= WARP_FINALIZE and count <= WARP_FINALIZE_MAX
        self.note(f"{splits} partial sums of {count} values, summed {'a warp' if warp else 'a thread'} a value "
                  "(Note [warp finalize])")
        self.launch("portconv_split_finalize", self.elementwise_grid(count * (32 if warp else 1)), extra,
                    self.target.waits,
                    splits=splits, flags=FLAG_WARP if warp else 0, **fields)

    def plan(self, summary: str) -> KernelPlan:
        modules = list(dict.fromkeys(x.module.describe() for x in self.launches))  # define sets; a unit a kernel
        lines = [*self.notes, *(f"{x.kernel} grid {'x'.join(map(str, x.grid))}" for x in self.launches),
                 *(line for m in modules for line in textwrap.wrap(m, MODULE_LINE, subsequent_indent="  "))]
        return KernelPlan(self.result, summary, tuple(lines), tuple(self.buffers), tuple(self.launches))
