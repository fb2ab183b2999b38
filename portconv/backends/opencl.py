"""The opencl backend: portconv's OpenCL kernel set (opencl/*.cl) on any OpenCL device, PoCL on the CPU included."""
from __future__ import annotations

import dataclasses
import functools
import math

from .. import knobs
from ..device import Availability, DeviceInfo
from ..errors import Unsupported
from ..tensors import FLOATING, dense_strides, spec_of
from . import Backend, BackendId, Choice, Problem
from . import _cl_igemm as igemm
from . import _cl_replay as replay
from . import _cl_runtime as rt

_CHANNELS_LAST = {4: "channels_last", 5: "channels_last_3d"}


# Note [OpenCL memory format]: the kernels read and write any strides, so the layout of a result is a
# free choice. portconv's OpenCL rule follows cuDNN's (cudnn_conv_suggest_memory_format) and PyTorch's
# CPU paths: the output (forward), grad_input and grad_weight are channels-last (channels_last for 4-D,
# channels_last_3d for 5-D tensors) when the input or the weight suggests channels-last, and contiguous
# otherwise (always for 1-D convolutions, which have no channels-last format). grad_bias is 1-D.
# A channels-last result is also computed in channels-last order (channel = fastest work index).
def output_memory_format(problem: Problem) -> tuple[str, str]:
    """(memory format of every result, why) under portconv's OpenCL rule."""
    cl_fmt = _CHANNELS_LAST.get(problem.input.dim)
    if cl_fmt is None:
        return "contiguous", "contiguous (1-D convolutions have no channels-last format)"
    for name, spec in (("input", problem.input), ("weight", problem.weight)):
        if spec.memory_format == cl_fmt:
            return cl_fmt, f"{cl_fmt} because the {name} is {cl_fmt} (portconv's OpenCL rule, as cuDNN's)"
    return "contiguous", "contiguous because neither input nor weight is channels-last (portconv's OpenCL rule)"


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The canonical convolution of a problem (Note [canonical convolution] in opencl/common.h)."""

    N: int
    G: int
    CX: int
    CY: int
    X: tuple[int, int, int]
    Y: tuple[int, int, int]
    K: tuple[int, int, int]
    S: tuple[int, int, int]
    P: tuple[int, int, int]
    DL: tuple[int, int, int]

    @property
    def depthwise(self) -> bool:
        return self.CX == 1 and self.G > 1

    @property
    def taps(self) -> int:
        return math.prod(self.K)

    @property
    def reduction(self) -> int:
        return self.N * math.prod(self.Y)


def _pad3(t, fill: int) -> tuple[int, int, int]:
    t = tuple(t)
    return (fill,) * (3 - len(t)) + t


@functools.lru_cache(maxsize=512)
def geometry(problem: Problem) -> Geometry:
    p = problem.params
    ishape, wshape, oshape = problem.input.shape, problem.weight.shape, problem.output_shape
    g = p.groups
    if p.transposed:  # the transposed input is y, its output is x; w (Cin, Cout/G, k) is already (G*CY, CX, k)
        x_sp, y_sp, cx, cy = oshape[2:], ishape[2:], wshape[1], ishape[1] // g
    else:
        x_sp, y_sp, cx, cy = ishape[2:], oshape[2:], ishape[1] // g, wshape[0] // g
    return Geometry(ishape[0], g, cx, cy, _pad3(x_sp, 1), _pad3(y_sp, 1), _pad3(wshape[2:], 1),
                    _pad3(p.stride, 1), _pad3(p.padding, 0), _pad3(p.dilation, 1))


# Note [depthwise kernels] (opencl/depthwise.cl): the vectorised depthwise kernels take depthwise convolutions
# (CX == 1, G > 1) that are not transposed, undilated, float32/float64/bfloat16 (bfloat16 computed in float32),
# computed in the contiguous layout,
# with a kernel size of the table below and strides 1 or 2; the kernel size and strides are compile-time
# constants of the program. Everything else runs the generic kernels of conv.cl.
DW_KERNEL_SIZES = {(1, 1, 3), (1, 3, 3), (3, 3, 3), (1, 5, 5)}
# Note [channels-last depthwise]: W positions per work-item (opencl/depthwise.cl's DW_CLW). CPU: 16 (the taps'
# weight gathers, 8 scalar loads per tap, amortised over more positions; PoCL, mbv2-dw3x3-bf16-cl forward +
# backward-data, two runs each: 1.88 / 1.95 ms at 4, 1.34 / 1.46 at 16, 1.24 / 1.62 at 8); GPU: 4 (measured, H100).
DW_CLW_CPU, DW_CLW_GPU = 16, 4
DW_CL_LOCAL = (2, 2, 2)  # ... and its work-groups (8 work-items: PoCL runs a group's items in one loop)
DW_CL_LOCAL_GPU = (8, 4, 4)  # GPUs: 8 channel blocks (one 128-byte line of bfloat16 x 8 lanes) x 4 W blocks x 4 rows
# ... and the grad-weight's on GPUs (DW_CLB, DW_CLR): 8 channel blocks x 32 position lanes, added in a local tree
DW_CLW_LOCAL_GPU = (8, 32)
# ... over 2 work-groups per compute unit: H100, mbv2-dw3x3-bf16-cl, 0.56x the time of 8 per compute unit (32: 1.66x;
# every split adds a local tree and a finalize term); 16 lanes 0.84x, 64 lanes 1.56x at 8 per compute unit
DW_CLW_GROUPS_PER_CU = 2


@dataclasses.dataclass(frozen=True)
class DwSpec:
    """How the depthwise kernels run one problem: vector width, work-group shapes and the build defines."""

    vw: int  # outputs per work-item along W
    rb: int  # rows computed together (independent accumulators) by a work-item (forward, backward-data)
    local: tuple[int, int, int]  # fwd / bwd-data work-group (W blocks, rows, planes)
    red_local: int  # bwd-weight work-group size
    K: tuple[int, int, int]
    S: tuple[int, int, int]
    nb: int = 1  # such row blocks per work-item
    cpu: bool = False  # DW_CPU: unaligned vector dereferences instead of vloadn/vstoren (CPU compilers)
    cl: bool = False  # DW_CL: the channels-last kernels (Note [channels-last depthwise]) instead of the W-vector ones
    aligned: bool = False  # DW_CLA: every vector of a channels-last call at a multiple of vw elements (GPUs)

    @property
    def defines(self) -> tuple[str, ...]:
        return (f"DW_VW={self.vw}", f"DW_RB={self.rb}", f"DW_NB={self.nb}",
                *(f"DW_K{i}={k}" for i, k in enumerate(self.K)),
                *(f"DW_S{i}={s}" for i, s in enumerate(self.S))) + (("DW_CPU",) if self.cpu else ()) + (
                    ("DW_CL", f"DW_CLW={self.clw}", *self._cl_weight_defines) if self.cl else ()) + (
                    ("DW_CLA",) if self.aligned else ())

    @property
    def _cl_weight_defines(self) -> tuple[str, ...]:
        return () if self.cpu else tuple(f"DW_CL{k}={v}" for k, v in zip("BR", DW_CLW_LOCAL_GPU))

    @property
    def clw(self) -> int:
        """DW_CLW of the channels-last kernels: W positions per work-item, by device type."""
        return DW_CLW_CPU if self.cpu else DW_CLW_GPU

    def grid(self, extents) -> tuple[int, int]:
        """fwd / bwd-data work-items (W blocks, row blocks) over the written tensor's (D, H, W) extents."""
        return -(-extents[2] // self.vw), -(-extents[1] // (self.rb * self.nb))

    @property
    def taps(self) -> int:
        return math.prod(self.K)

    def describe(self) -> str:
        k = "x".join(str(v) for v in self.K if v > 1 or self.K == (1, 1, 1)) or "1"
        s = "x".join(str(v) for v, kk in zip(self.S, self.K) if kk > 1) or "1"
        return (f"{k} stride {s}, {self.vw} W outputs x {self.rb * self.nb} rows per work-item, work-group "
                f"{'x'.join(map(str, self.local))}")


@functools.lru_cache(maxsize=512)
def dw_spec(problem: Problem, geo: Geometry, fmt: str, cpu: bool) -> tuple[DwSpec | None, str]:
    """The depthwise kernels' settings for this problem, or None and why the generic kernels run."""
    why = None
    if not geo.depthwise:
        why = "not depthwise"
    elif problem.params.transposed:
        why = "transposed"
    elif problem.dtype not in ("float32", "float64", "bfloat16"):
        why = f"{problem.dtype} (the vectorised depthwise kernels take float32, float64 and bfloat16)"
    elif geo.DL != (1, 1, 1):
        why = "dilated"
    elif geo.K not in DW_KERNEL_SIZES:
        why = f"kernel {'x'.join(map(str, geo.K))} has no specialised depthwise program"
    elif any(s not in (1, 2) for s in geo.S):
        why = "a stride other than 1 or 2"
    elif fmt != "contiguous":
        why = f"results are {fmt} (the depthwise kernels vectorise along a contiguous W)"
    if why:
        return None, why
    # CPU (PoCL): one AVX2 register of outputs per work-item, small work-groups (work-items run one after
    # the other inside a group) that fit the grid: up to 4 W blocks x 4 row blocks, filled up to 8 work-items
    # with planes when the image is narrower (a 7x7 image is one work-item per plane: 8 planes per group, not
    # 16 work-items of which 15 return at once; measured 50-100 us against 130-200 us on mbv2-dw3x3-last);
    # the grad-weight runs one work-item per (channel, split), walking its rows in order (no local tree:
    # notes-opencl.md v7). GPU: 4 outputs per work-item, 2 rows, work-groups of up to 16x8 (W blocks x row blocks)
    # that fit the image, filled up to 128 work-items with at most 64 planes (NVIDIA's limit along z) (a fixed 16x8
    # group left 120 of its 128 work-items idle on a 7x7 image and over half of them on a 28x28 one; H100: 7x7
    # forward 0.45x the time), 64-item reductions.
    vw, rb, nb = (4 if problem.dtype == "float64" else 8, 4, 2) if cpu else (4, 2, 1)
    cap, fill = ((4, 4, 8), 8) if cpu else ((16, 8, 64), 128)
    lx = min(cap[0], -(-min(geo.Y[2], geo.X[2]) // vw))
    ly = min(cap[1], -(-min(geo.Y[1], geo.X[1]) // (rb * nb)))
    local = (lx, ly, max(1, min(cap[2], fill // (lx * ly))))
    return DwSpec(vw, rb, local, 1 if cpu else 64, geo.K, geo.S, nb=nb, cpu=cpu), ""


@functools.lru_cache(maxsize=512)
def dw_cl_spec(problem: Problem, geo: Geometry, fmt: str, cpu: bool) -> DwSpec | None:
    """Note [channels-last depthwise] (opencl/depthwise.cl): the settings of the kernels that vectorise along C for
    channels-last depthwise problems, or None (they need channel multiplier 1 and C in whole vectors; otherwise the
    generic kernels run). CPU devices run the grad-weight one work-item per channel block and split, GPUs with
    DW_CLR position lanes per channel block (DW_CLW_LOCAL_GPU)."""
    if fmt == "contiguous" or geo.CY != 1 or dw_spec(problem, geo, "contiguous", cpu)[0] is None:
        return None
    vw = 4 if problem.dtype == "float64" else 8
    local = DW_CL_LOCAL if cpu else DW_CL_LOCAL_GPU
    return DwSpec(vw, 1, local, 1, geo.K, geo.S, cpu=cpu, cl=True) if geo.G % vw == 0 else None


def cl_aligned(vw: int, *tensors: rt.DevTensor) -> bool:
    """Whether every run of vw channels of these channels-last tensors starts at a multiple of vw elements: their
    offsets and their strides other than the channel one (of extents above 1) are multiples of vw (DW_CLA)."""
    return not any(t.offset % vw or any(st % vw for n, st in zip(*_five(t)) if n > 1 and st != 1) for t in tensors)


def _five(t: rt.DevTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides as (N, C, D, H, W); missing spatial dims have size 1 and stride 0."""
    pad = 5 - len(t.shape)
    return (t.shape[:2] + (1,) * pad + t.shape[2:], t.strides[:2] + (0,) * pad + t.strides[2:])


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def _dtype_name(x) -> str:
    """'float32' etc. of a torch tensor or a pyopencl array (the per-call check; spec_of is the full one)."""
    if _is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    name = str(x.dtype)
    return name if name in FLOATING else spec_of(x).dtype


class _Call:
    """One forward or backward call: the runtime, queue, dtype and the kernels' common descriptor."""

    def __init__(self, plan, anchor, rec=None):
        self.plan = plan
        self.rec = rec  # a _cl_replay.Recorder while the call is recorded (Note [OpenCL replay])
        self.problem: Problem = plan.problem
        self.dtype = self.problem.dtype
        self.geo = geometry(self.problem)
        self.anchor = anchor  # the caller's input: its type decides the results' type
        if _is_torch(anchor):
            self.rt = rt.runtime_for_index(plan.device.index)
            self.queue = self.rt.queue
        else:
            self.rt = rt.runtime_for_array(anchor)
            self.queue = anchor.queue or self.rt.queue
        self.wait_for = []
        self.scratches = 0
        self.c_inner = int(plan.memory_format != "contiguous")
        self.dw = dw_spec(self.problem, self.geo, plan.memory_format, self.rt.is_cpu)[0]
        self.dwcl = dw_cl_spec(self.problem, self.geo, plan.memory_format, self.rt.is_cpu)
        self.ig = (igemm.spec(self.geo, self.rt.is_cpu, igemm.tc_of(plan.algorithm))
                   if plan.algorithm.startswith("igemm") else None)

    def up(self, x, role: int) -> rt.DevTensor:
        """Call argument number ``role`` (forward: input, weight, bias; backward: grad_output, input, weight)."""
        dtype = _dtype_name(x)
        if dtype != self.dtype:  # the kernels read every tensor as the plan's dtype
            raise ValueError(f"the OpenCL backend needs one dtype for all tensors: got {dtype} with {self.dtype}")
        if not _is_torch(x):
            self.wait_for += list(x.events)
        t = self.rt.upload(x, self.queue)
        t.role = role
        return t

    def out(self, shape, position: int, dense: bool = False) -> rt.DevTensor:
        """A result, returned at ``position`` (forward: 0; backward: 0 grad_input, 1 grad_weight, 2 grad_bias)."""
        fmt = "contiguous" if dense else self.plan.memory_format
        t = self.rt.empty(shape, dense_strides(shape, fmt), self.dtype, self.anchor, self.queue)
        t.role = ("out", position)
        if self.rec is not None:
            self.rec.output(t, position)
        return t

    def finish(self, out: rt.DevTensor, event):
        return self.rt.result(out, self.dtype, self.anchor, self.queue, event)

    def _desc(self, total, geo=None, **kw) -> rt.Desc:
        return rt.Desc(geo or self.geo, total=total, acc_bytes=8 if self.dtype == "float64" else 4, **kw)

    def _run(self, name, desc, tensors, args, local=None):
        """A generic kernel (conv.cl): ``desc.total`` work-items (local=None), or ``desc.total`` work-groups of
        ``local`` items reducing through local memory."""
        if desc.total == 0:
            return None
        groups = desc.total * (local or 1)
        desc.idx64 = rt.force_idx64 or not rt.index_fits_int32(groups + 64, *(t.span for t in tensors))
        entry = self.rt.kernel(self.dtype, desc.idx64, self.geo.depthwise, name)
        if local is None:
            ls = max(1, min(64, entry[1]))
            return self._launch(entry, name, desc, args, (-(-desc.total // ls) * ls,), (ls,))
        ls = rt.pow2_floor(min(local, entry[1]))
        return self._launch(entry, name, desc, args, (desc.total * ls,), (ls,), ls * desc.acc_bytes)

    def _launch(self, entry, name, desc, args, gsize, lsize, local_bytes=0):
        if self.rec is not None:
            self.rec.step(self.rt, entry, name, desc, args, gsize, lsize, local_bytes)
        return self.rt.launch_nd(self.queue, entry, name, desc, args, gsize, lsize, local_bytes, self.wait_for)

    def _bias(self, b):
        """The bias argument of fwd/bwd_data (call argument 2, or the dummy buffer) and its descriptor fields."""
        if b is None:
            return self.rt.dummy(), dict(has_bias=0)
        bt = self.up(b, 2)
        return bt, dict(has_bias=1, bo=bt.offset, bs=bt.strides[0])

    def _dw_ok(self, *tensors: rt.DevTensor) -> bool:
        """The depthwise kernels run when the plan chose them and x and y rows are contiguous along W."""
        return self.dw is not None and all(_five(t)[1][4] == 1 or _five(t)[0][4] == 1 for t in tensors)

    def _dwcl_ok(self, *tensors: rt.DevTensor) -> bool:
        """Note [channels-last depthwise]: those kernels run when the plan allows them and x and y (grad_input and
        grad_output) have channel stride 1."""
        return self.dwcl is not None and all(_five(t)[1][1] == 1 for t in tensors)

    def _cl_spec(self, *tensors: rt.DevTensor) -> DwSpec:
        """The channels-last kernels' settings for one call: DW_CLA (aligned vector accesses) on a GPU when every
        vector of ``tensors`` starts at a multiple of vw elements (offsets and the strides of N, D, H, W)."""
        spec = self.dwcl
        if spec.cpu or not cl_aligned(spec.vw, *tensors):
            return spec
        if self.rec is not None:  # a replay of this call needs offsets as aligned (Note [OpenCL replay])
            self.rec.align = max(self.rec.align, spec.vw)
        return dataclasses.replace(spec, aligned=True)

    def _dw_run(self, name, desc, tensors, args, gsize, lsize, local_bytes=0, spec=None):
        groups = math.prod(-(-g // l) * l for g, l in zip(gsize, lsize))
        desc.idx64 = rt.force_idx64 or not rt.index_fits_int32(groups + 64, *(t.span for t in tensors))
        entry = self.rt.dw_kernel(self.dtype, desc.idx64, (spec or self.dw).defines, name)
        return self._launch(entry, "dw_" + name, desc, args, gsize, lsize, local_bytes)

    def fwd(self, x: rt.DevTensor, w: rt.DevTensor, y: rt.DevTensor, bias=None):
        """y = conv(x, w) (+ bias per y channel)."""
        bbuf, bkw = self._bias(bias)
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        g = self.geo
        if self._dw_ok(x, y) and math.prod(y.shape):
            planes = g.N * g.G * g.CY * g.Y[0]
            d = self._desc(planes, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, **bkw)
            return self._dw_run("fwd", d, (x, w, y), (x, w, bbuf, y),
                                (*self.dw.grid(g.Y), planes), self.dw.local)
        if self._dwcl_ok(x, y) and math.prod(y.shape):  # Note [channels-last depthwise]
            rows = g.N * g.Y[0] * g.Y[1]
            d = self._desc(rows, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, **bkw)
            return self._dw_run("cl_fwd", d, (x, w, y), (x, w, bbuf, y), self._cl_grid(g.Y[2], rows),
                                self.dwcl.local, spec=self._cl_spec(x, y))
        if self.ig is not None and math.prod(y.shape):
            evt = igemm.fwd(self, x, w, y, bbuf, bkw, xs, ws, ys)
            if evt is not igemm.TOO_LARGE:
                return evt
        d = self._desc(math.prod(y.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner, **bkw)
        return self._run("fwd", d, (x, w, y), (x, w, bbuf, y))

    def bwd_data(self, y: rt.DevTensor, w: rt.DevTensor, x: rt.DevTensor, bias=None):
        """x = conv^T(y, w) (+ bias per x channel): grad_input, or the transposed forward."""
        bbuf, bkw = self._bias(bias)
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        g = self.geo
        if bias is None and self._dw_ok(x, y) and math.prod(x.shape):
            planes = g.N * g.G * g.X[0]
            d = self._desc(planes, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset)
            return self._dw_run("bwd_data", d, (x, w, y), (y, w, bbuf, x),
                                (*self.dw.grid(g.X), planes), self.dw.local)
        if bias is None and self._dwcl_ok(x, y) and math.prod(x.shape):  # Note [channels-last depthwise]
            rows = g.N * g.X[0] * g.X[1]
            d = self._desc(rows, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset)
            return self._dw_run("cl_bwd_data", d, (x, w, y), (y, w, bbuf, x), self._cl_grid(g.X[2], rows),
                                self.dwcl.local, spec=self._cl_spec(x, y))
        if self.ig is not None and self.ig.phases and math.prod(x.shape):
            evt = igemm.bwd_data(self, y, w, x, bbuf, bkw, xs, ws, ys)
            if evt is not igemm.TOO_LARGE:
                return evt
        d = self._desc(math.prod(x.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner, **bkw)
        return self._run("bwd_data", d, (x, w, y), (y, w, bbuf, x))

    def bwd_weight(self, x: rt.DevTensor, y: rt.DevTensor, w: rt.DevTensor):
        """w = sum over N and y positions of y * x (one work-group per weight element)."""
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        if self._dw_ok(x, y) and math.prod(w.shape):
            return self._dw_bwd_weight(x, y, w, xs, ws, ys)
        if self._dwcl_ok(x, y) and math.prod(w.shape):
            return self._dw_cl_bwd_weight(x, y, w, xs, ws, ys)
        if self.ig is not None and math.prod(w.shape):
            evt = igemm.bwd_weight(self, x, y, w, xs, ws, ys)
            if evt is not igemm.TOO_LARGE:
                return evt
        d = self._desc(math.prod(w.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner)
        return self._run("bwd_weight", d, (x, w, y), (x, y, w), _group_size(self.geo.reduction))

    def _dw_bwd_weight(self, x, y, w, xs, ws, ys):
        """Depthwise grad-weight: work-groups per (split, channel), partials added by dw_finalize when split."""
        g, spec = self.geo, self.dw
        co_n = g.G * g.CY
        L = spec.red_local
        items = g.N * g.Y[0] * -(-g.Y[1] // spec.rb) * -(-g.Y[2] // spec.vw)  # (blocks of rb rows) x W blocks
        splits = dw_splits(co_n, items, L, self.rt.device.max_compute_units, self.rt.is_cpu)
        per = -(-items // splits) if items else 0
        acc = 8 if self.dtype == "float64" else 4
        part = self._scratch(co_n * splits * spec.taps * acc) if splits > 1 else self.rt.dummy()
        d = self._desc(co_n * splits, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, red=per)
        evt = self._dw_run("bwd_weight", d, (x, w, y), (x, y, w, part), (L * splits, co_n), (L, 1),
                           spec.taps * L * acc)
        return evt if splits == 1 else self._dw_finalize(w, ws, part, co_n, splits, spec)

    def _dw_finalize(self, w, ws, part, channels: int, splits: int, spec: DwSpec):
        """dw_finalize: the depthwise grad-weight's split partials added in split order, into w."""
        d = self._desc(channels * spec.taps, ws=ws, wo=w.offset, red=splits)
        return self._dw_run("finalize", d, (w,), (part, w), (channels * spec.taps,),
                            (16 if self.rt.is_cpu else 64,), spec=spec)

    def _cl_grid(self, width: int, rows: int) -> tuple[int, int, int]:
        """Note [channels-last depthwise]: work-items (channel blocks, W blocks of DW_CLW, rows)."""
        return self.geo.G // self.dwcl.vw, -(-width // self.dwcl.clw), rows

    def _dw_cl_bwd_weight(self, x, y, w, xs, ws, ys):
        """Note [channels-last depthwise] grad-weight: per (channel block, split) one work-item (CPU) or DW_CLR lanes
        (GPU) walking the split's positions in order; partials added by dw_finalize when split."""
        g, spec = self.geo, self._cl_spec(x, y)
        blocks, cnt = g.G // spec.vw, g.N * math.prod(g.Y)
        local = (1, 1) if spec.cpu else DW_CLW_LOCAL_GPU
        splits = dw_cl_splits(blocks, cnt, self.rt.device.max_compute_units, spec.cpu)
        per = -(-cnt // splits) if cnt else 0
        splits = -(-cnt // per) if per else 1
        acc = 8 if self.dtype == "float64" else 4
        part = self._scratch(g.G * splits * spec.taps * acc) if splits > 1 else self.rt.dummy()
        d = self._desc(g.G * splits, xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset, red=per)
        evt = self._dw_run("cl_bwd_weight", d, (x, w, y), (x, y, w, part), (blocks, splits * local[1]), local,
                           spec=spec)
        return evt if splits == 1 else self._dw_finalize(w, ws, part, g.G, splits, spec)

    def _scratch(self, nbytes: int) -> rt.DevTensor:
        """Intermediate results of one call (from the pool; a recorded call allocates them again each time)."""
        self.scratches += 1
        return rt.DevTensor(self.rt.scratch(nbytes), 0, (nbytes,), (1,), role=("scratch", self.scratches, nbytes))

    def bias_grad(self, t: rt.DevTensor, b: rt.DevTensor):
        """b[c] = sum of t[:, c] (one work-group per channel)."""
        shape, strides = _five(t)
        red = shape[0] * math.prod(shape[2:])
        geo = dataclasses.replace(self.geo, N=shape[0], G=1, CY=shape[1], Y=tuple(shape[2:]))
        d = self._desc(shape[1], geo, ys=strides, yo=t.offset, bo=b.offset, bs=b.strides[0], red=red)
        return self._run("bias_grad", d, (t, b), (t, b), _group_size(red))


def dw_splits(channels: int, items: int, local: int, compute_units: int, cpu: bool) -> int:
    """Work-groups per channel of the depthwise grad-weight: enough groups to fill the device (CPU: 4 per
    core, GPU: 8 per compute unit), never fewer than 4 work-items' worth of items per group, at most 64."""
    want = (4 if cpu else 8) * max(1, compute_units)
    splits = max(1, min(64, -(-want // max(1, channels)), items // (4 * local)))
    return splits


def dw_cl_splits(blocks: int, positions: int, compute_units: int, cpu: bool) -> int:
    """Splits of the channels-last depthwise grad-weight's positions: CPUs as dw_splits (one work-item per channel
    block and split); GPUs DW_CLW_GROUPS_PER_CU work-groups (of DW_CLW_LOCAL_GPU) per compute unit, at least 4
    positions per lane, at most 1024."""
    if cpu:
        return dw_splits(blocks, positions, 1, compute_units, True)
    groups = -(-blocks // DW_CLW_LOCAL_GPU[0])
    return max(1, min(1024, -(-DW_CLW_GROUPS_PER_CU * max(1, compute_units) // groups),
                      positions // (4 * DW_CLW_LOCAL_GPU[1])))


def _group_size(reduction: int) -> int:
    """Work-group size of a reduction: a few fixed sizes (PoCL compiles one work-group function per size)."""
    return 16 if reduction <= 64 else 64 if reduction <= 2048 else 256


class OpenCLBackend(Backend):
    id = BackendId.OPENCL
    pip_hint = rt.PIP_HINT

    def probe(self) -> Availability:
        return rt.select(knobs.get("PORTCONV_OPENCL_DEVICE"))[0]

    def device_for(self, problem: Problem) -> DeviceInfo:
        ispec, wspec = problem.input, problem.weight
        for name, spec in (("input", ispec), ("weight", wspec)):
            if spec.kind == "torch" and spec.device_type != "cpu" or spec.kind not in ("torch", "pyopencl"):
                where = f"{spec.kind} arrays" if spec.kind != "torch" else f"tensors on {spec.device}"
                raise Unsupported(f"the OpenCL backend takes CPU tensors or pyopencl arrays (the {name} is {where})")
        if ispec.kind != wspec.kind:
            raise Unsupported(f"the input is a {ispec.kind} {'array' if ispec.kind == 'pyopencl' else 'tensor'} "
                              f"but the weight is a {wspec.kind} one; pass both as the same type")
        if ispec.kind == "pyopencl" and ispec.device_index is not None and ispec.device_index >= 0:
            return rt.info_of_flat(ispec.device_index)
        return rt.info(*rt.default_index())

    def choose(self, problem: Problem, device: DeviceInfo) -> Choice:
        dt = problem.dtype
        if dt not in FLOATING:
            raise Unsupported(f"the OpenCL kernels take float32, float64, float16 and bfloat16 tensors, not {dt}")
        if problem.weight.dtype != dt:
            raise Unsupported(f"input ({dt}) and weight ({problem.weight.dtype}) dtypes differ")
        if dt == "float64" and not device.fp64:
            raise Unsupported(f"{device.name} has no double precision (no cl_khr_fp64, CL_DEVICE_DOUBLE_FP_CONFIG 0), "
                              "so the OpenCL kernels cannot run float64 on it")
        if any(s < 0 for spec in (problem.input, problem.weight) for s in spec.strides):
            raise Unsupported("tensors with negative strides are not supported by the OpenCL backend")
        fmt, fmt_why = output_memory_format(problem)
        geo = geometry(problem)
        t = "-transposed" if problem.params.transposed else ""
        spec, _ = dw_spec(problem, geo, fmt, device.kind == "cpu")
        dense, dense_why = ("depthwise", "") if geo.depthwise else igemm.mode(device.kind)
        math_ = "fp32-accumulate" if dt in ("float16", "bfloat16") else "ieee"
        if dense == "igemm":
            tc, tc_why = igemm.tc_mode(dt, device)
            sp = igemm.spec(geo, device.kind == "cpu", tc)
            why = (igemm.reason(geo, sp, problem.params.transposed, dense_why, device.name, fmt != "contiguous")
                   + f"; grad-bias: one work-group per channel; results {fmt_why}"
                   + (f"; tensor cores: {tc_why}" if tc else f"; FMA products ({tc_why})") + _DTYPE_NOTE.get(dt, ""))
            if tc:
                dense, math_ = "igemm-tc", ("tf32" if dt == "float32" else math_)
        else:
            cl = dw_cl_spec(problem, geo, fmt, device.kind == "cpu") if spec is None else None
            why = (_reason_cl(problem, geo, fmt_why, device, cl) if cl else _reason(problem, geo, fmt_why, device, spec)
                   ) + (f" (chosen by {dense_why})" if dense_why else "")
        return Choice(dense + t, fmt, why, math=math_)

    def devices(self) -> list[DeviceInfo]:
        if not self.probe() and rt.select(None)[1] is None:
            return []
        return [rt.info(p, d) for p, d, _ in rt.all_devices()]

    def forward(self, plan, input, weight, bias):
        args = (input, weight, bias)
        got, rec = replay.run(plan, "fwd", args)
        if got is not None:
            return got
        call = _Call(plan, input, rec)
        x, w = call.up(input, 0), call.up(weight, 1)
        out = call.out(plan.problem.output_shape, 0)
        if plan.problem.params.transposed:  # Note [canonical convolution]: the transposed forward is bwd-data
            evt = call.bwd_data(x, w, out, bias)
        else:
            evt = call.fwd(x, w, out, bias)
        result = call.finish(out, evt)
        replay.keep(plan, "fwd", args, rec, call)
        return result

    def backward(self, plan, grad_output, input, weight, output_mask):
        need_i, need_w, need_b = output_mask
        if not (need_i or need_w or need_b):
            return None, None, None
        problem = plan.problem
        if tuple(grad_output.shape) != tuple(problem.output_shape):
            raise ValueError(f"grad_output has shape {list(grad_output.shape)}, expected "
                             f"{list(problem.output_shape)}")
        args = (grad_output, input, weight)
        got, rec = replay.run(plan, output_mask, args)
        if got is not None:
            return got
        call = _Call(plan, input, rec)
        go = call.up(grad_output, 0)
        transposed = problem.params.transposed
        gi = gw = gb = None
        if need_i:
            w = call.up(weight, 2)
            out = call.out(problem.input.shape, 0)
            evt = call.fwd(go, w, out) if transposed else call.bwd_data(go, w, out)
            gi = call.finish(out, evt)
        if need_w:
            x = call.up(input, 1)
            out = call.out(problem.weight.shape, 1)
            evt = call.bwd_weight(go, x, out) if transposed else call.bwd_weight(x, go, out)
            gw = call.finish(out, evt)
        if need_b:
            out = call.out((problem.output_shape[1],), 2, dense=True)
            gb = call.finish(out, call.bias_grad(go, out))
        replay.keep(plan, output_mask, args, rec, call)
        return gi, gw, gb


def _reason_cl(problem: Problem, geo: Geometry, fmt_why: str, device: DeviceInfo, spec: DwSpec) -> str:
    k = "x".join(str(v) for v in geo.K if v > 1) or "1"
    st = "x".join(str(v) for v, kk in zip(geo.S, geo.K) if kk > 1) or "1"
    return (f"channels-last depthwise kernels (opencl/depthwise.cl, Note [channels-last depthwise]) on {device.name}: "
            f"{k} stride {st}, {spec.vw} channels x {spec.clw} W positions per work-item; "
            f"forward: dw_cl_fwd; backward-data: dw_cl_bwd_data; grad-weight: "
            + ("dw_cl_bwd_weight, one work-item per (channel block, split) + dw_finalize when split" if spec.cpu else
               "dw_cl_bwd_weight, work-groups of {} channel blocks x {} position lanes per split, the lanes added in a "
               "local tree, + dw_finalize when split".format(*DW_CLW_LOCAL_GPU))
            + f"; work-groups {'x'.join(map(str, spec.local))}; tensors whose channels are not contiguous run the "
            f"generic kernels; grad-bias: one work-group per channel; results {fmt_why}"
            + ("; bfloat16 stored as ushort, computed in float32, rounded to nearest even"
               if problem.dtype == "bfloat16" else ""))


def _reason(problem: Problem, geo: Geometry, fmt_why: str, device: DeviceInfo, spec: DwSpec | None = None) -> str:
    if spec is not None:
        return (f"vectorised depthwise kernels (opencl/depthwise.cl, channel multiplier {geo.CY}) on {device.name}: "
                f"{spec.describe()}; forward: dw_fwd; backward-data: dw_bwd_data; grad-weight: dw_bwd_weight, "
                f"work-groups of {spec.red_local} per (channel, split) + dw_finalize when split; W-strided "
                f"tensors run the generic kernels; grad-bias: one work-group per channel; results {fmt_why}"
                + ("; bfloat16 stored as ushort, computed in float32, rounded to nearest even"
                   if problem.dtype == "bfloat16" else ""))
    t = problem.params.transposed
    kind = f"depthwise kernels (channel multiplier {geo.CY})" if geo.depthwise else "direct kernels"
    gather = f"one work-item per output element summing {geo.CY if t else geo.CX} channel(s) x {geo.taps} tap(s)"
    scatter = f"one work-item per grad_input element summing {geo.CX if t else geo.CY} channel(s) x {geo.taps} tap(s)"
    if t:
        fwd, bwd = f"the backward-data kernel (transposed identity), {gather}", f"the forward kernel, {scatter}"
    else:
        fwd, bwd = gather, scatter
    gw = (f"one work-group of {_group_size(geo.reduction)} per weight element reducing N x "
          f"{'input' if t else 'output'} spatial = {geo.reduction} products"
          + (" (x and grad_output roles swapped)" if t else ""))
    return (f"{kind} on {device.name}: forward: {fwd}; backward-data: {bwd}; grad-weight: {gw}; "
            f"grad-bias: one work-group per channel; results {fmt_why}{_DTYPE_NOTE.get(problem.dtype, '')}")


_DTYPE_NOTE = {"float16": "; float16 stored as half (vload_half/vstore_half_rte), accumulated in float32",
               "bfloat16": "; bfloat16 stored as ushort, accumulated in float32, rounded to nearest even"}
