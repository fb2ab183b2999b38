"""The opencl backend: portconv's OpenCL kernel set (opencl/*.cl) on any OpenCL device, PoCL on the CPU included."""
from __future__ import annotations

import dataclasses
import math

from .. import knobs
from ..device import Availability, DeviceInfo
from ..errors import Unsupported
from ..tensors import FLOATING, dense_strides, spec_of
from . import Backend, BackendId, Choice, Problem
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


def _five(t: rt.DevTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides as (N, C, D, H, W); missing spatial dims have size 1 and stride 0."""
    pad = 5 - len(t.shape)
    return (t.shape[:2] + (1,) * pad + t.shape[2:], t.strides[:2] + (0,) * pad + t.strides[2:])


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


class _Call:
    """One forward or backward call: the runtime, queue, dtype and the kernels' common descriptor."""

    def __init__(self, plan, anchor):
        self.plan = plan
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
        self.c_inner = int(plan.memory_format != "contiguous")

    def up(self, x) -> rt.DevTensor:
        dtype = spec_of(x).dtype
        if dtype != self.dtype:  # the kernels read every tensor as the plan's dtype
            raise ValueError(f"the OpenCL backend needs one dtype for all tensors: got {dtype} with {self.dtype}")
        if not _is_torch(x):
            self.wait_for += list(x.events)
        return self.rt.upload(x, self.queue)

    def out(self, shape, dense: bool = False) -> rt.DevTensor:
        fmt = "contiguous" if dense else self.plan.memory_format
        return self.rt.empty(shape, dense_strides(shape, fmt), self.dtype, self.anchor, self.queue)

    def finish(self, out: rt.DevTensor, event):
        return self.rt.result(out, self.dtype, self.anchor, self.queue, event)

    def _desc(self, total, geo=None, **kw) -> rt.Desc:
        return rt.Desc(geo or self.geo, total=total, acc_bytes=8 if self.dtype == "float64" else 4, **kw)

    def _run(self, name, desc, tensors, args, local=None):
        if desc.total == 0:
            return None
        groups = desc.total * (local or 1)
        desc.idx64 = rt.force_idx64 or not rt.index_fits_int32(groups + 64, *(t.span for t in tensors))
        entry = self.rt.kernel(self.dtype, desc.idx64, self.geo.depthwise, name)
        return self.rt.launch(self.queue, entry, name, desc, args, desc.total, local, self.wait_for)

    def _bias(self, b):
        if b is None:
            return self.rt.dummy(), dict(has_bias=0)
        bt = self.up(b)
        return bt.buf, dict(has_bias=1, bo=bt.offset, bs=bt.strides[0])

    def fwd(self, x: rt.DevTensor, w: rt.DevTensor, y: rt.DevTensor, bias=None):
        """y = conv(x, w) (+ bias per y channel)."""
        bbuf, bkw = self._bias(bias)
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        d = self._desc(math.prod(y.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner, **bkw)
        return self._run("fwd", d, (x, w, y), (x.buf, w.buf, bbuf, y.buf))

    def bwd_data(self, y: rt.DevTensor, w: rt.DevTensor, x: rt.DevTensor, bias=None):
        """x = conv^T(y, w) (+ bias per x channel): grad_input, or the transposed forward."""
        bbuf, bkw = self._bias(bias)
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        d = self._desc(math.prod(x.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner, **bkw)
        return self._run("bwd_data", d, (x, w, y), (y.buf, w.buf, bbuf, x.buf))

    def bwd_weight(self, x: rt.DevTensor, y: rt.DevTensor, w: rt.DevTensor):
        """w = sum over N and y positions of y * x (one work-group per weight element)."""
        (_, xs), (_, ws), (_, ys) = _five(x), _five(w), _five(y)
        d = self._desc(math.prod(w.shape), xs=xs, ws=ws, ys=ys, xo=x.offset, wo=w.offset, yo=y.offset,
                       c_inner=self.c_inner)
        return self._run("bwd_weight", d, (x, w, y), (x.buf, y.buf, w.buf), _group_size(self.geo.reduction))

    def bias_grad(self, t: rt.DevTensor, b: rt.DevTensor):
        """b[c] = sum of t[:, c] (one work-group per channel)."""
        shape, strides = _five(t)
        red = shape[0] * math.prod(shape[2:])
        geo = dataclasses.replace(self.geo, N=shape[0], G=1, CY=shape[1], Y=tuple(shape[2:]))
        d = self._desc(shape[1], geo, ys=strides, yo=t.offset, bo=b.offset, bs=b.strides[0], red=red)
        return self._run("bias_grad", d, (t, b), (t.buf, b.buf), _group_size(red))


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
        alg = ("depthwise" if geo.depthwise else "direct") + ("-transposed" if problem.params.transposed else "")
        return Choice(alg, fmt, _reason(problem, geo, fmt_why, device),
                      math="fp32-accumulate" if dt in ("float16", "bfloat16") else "ieee")

    def devices(self) -> list[DeviceInfo]:
        if not self.probe() and rt.select(None)[1] is None:
            return []
        return [rt.info(p, d) for p, d, _ in rt.all_devices()]

    def forward(self, plan, input, weight, bias):
        call = _Call(plan, input)
        x, w = call.up(input), call.up(weight)
        out = call.out(plan.problem.output_shape)
        if plan.problem.params.transposed:  # Note [canonical convolution]: the transposed forward is bwd-data
            evt = call.bwd_data(x, w, out, bias)
        else:
            evt = call.fwd(x, w, out, bias)
        return call.finish(out, evt)

    def backward(self, plan, grad_output, input, weight, output_mask):
        need_i, need_w, need_b = output_mask
        if not (need_i or need_w or need_b):
            return None, None, None
        problem = plan.problem
        if tuple(grad_output.shape) != tuple(problem.output_shape):
            raise ValueError(f"grad_output has shape {list(grad_output.shape)}, expected "
                             f"{list(problem.output_shape)}")
        call = _Call(plan, input)
        go = call.up(grad_output)
        transposed = problem.params.transposed
        gi = gw = gb = None
        if need_i:
            w = call.up(weight)
            out = call.out(problem.input.shape)
            evt = call.fwd(go, w, out) if transposed else call.bwd_data(go, w, out)
            gi = call.finish(out, evt)
        if need_w:
            x = call.up(input)
            out = call.out(problem.weight.shape)
            evt = call.bwd_weight(go, x, out) if transposed else call.bwd_weight(x, go, out)
            gw = call.finish(out, evt)
        if need_b:
            out = call.out((problem.output_shape[1],), dense=True)
            gb = call.finish(out, call.bias_grad(go, out))
        return gi, gw, gb


def _reason(problem: Problem, geo: Geometry, fmt_why: str, device: DeviceInfo) -> str:
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
    dtype = {"float16": "; float16 stored as half (vload_half/vstore_half_rte), accumulated in float32",
             "bfloat16": "; bfloat16 stored as ushort, accumulated in float32, rounded to nearest even",
             }.get(problem.dtype, "")
    return (f"{kind} on {device.name}: forward: {fwd}; backward-data: {bwd}; grad-weight: {gw}; "
            f"grad-bias: one work-group per channel; results {fmt_why}{dtype}")
