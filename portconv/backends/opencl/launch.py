"""The OpenCL Loader: a plan's Program made executable once, then every call binds tensors and enqueues."""
from __future__ import annotations

import math
import threading

from ... import knobs
from ...errors import Unsupported
from ...problem import Layout
from ...tensors import kind_of
from ..program import Program
from . import runtime as rt
from . import select

# Note [work-group limits]: a compiled kernel may allow fewer work-items per group than the device's maximum
# (CL_KERNEL_WORK_GROUP_SIZE: registers, local memory), and only the compiler knows it. The builders take the limits
# as a fact (default DeviceInfo.max_work_group) and choose within them: an implicit-GEMM or depthwise launch whose
# work-group does not fit runs the direct kernels, a direct kernel takes a smaller work-group. load() compiles the
# program's modules, compares each launch's work-group with its kernel's limit and, where one is smaller, builds the
# call again (pure, with those limits) before anything runs; the limits are kept per device for later builds, and
# counted in stats ('ig_too_large' for implicit-GEMM launches, 'wg_too_large' for others). Plan.kernels (explain())
# show the plan at the device's maximum.
_LIMITS: dict[str, dict] = {}  # DeviceInfo.index -> {(Module, kernel): work-group limit}
_LAYOUT_CACHE = 4096


def stat_name(kernel: str) -> str:
    """The stats counter of a kernel: conv.cl's without its prefix, 'ig_' for igemm.cl's, depthwise.cl's as named."""
    for prefix in ("conv_", "depthwise_"):
        if kernel.startswith(prefix):
            return kernel[len(prefix):]
    return "ig_" + kernel[6:] if kernel.startswith("igemm_") else kernel


class Loader:
    """One plan's side of ProgramRunner: operand Layouts, the pure builder with the limits learned so far, and
    load(), which makes a Program an Exec."""

    def __init__(self, problem, device, options, choice):
        self.problem, self.device, self.options, self.choice = problem, device, options, choice
        self.dtype = problem.dtype
        self._origin: dict[tuple, tuple] = {}  # a built program's launches -> (call, mask, layouts)
        self._layouts: dict[tuple, Layout] = {}
        self.array_type = None  # pyopencl.array.Array, once seen

    def build(self, call: str, mask: tuple, layouts: tuple, limits=None):
        limits = dict(_LIMITS.get(self.device.index, {})) if limits is None else limits
        plans = select.build(self.problem, self.device, self.options, self.choice, call, mask, layouts, limits)
        self._origin[tuple(x for p in plans for x in p.launches)] = (call, mask, layouts)
        return plans

    def key(self, t) -> Layout | None:
        """ProgramRunner's key of an operand: its Layout itself (cached per shape, strides and offset)."""
        return None if t is None else self.layout(t)

    def layout(self, t) -> Layout | None:
        """The Layout a call's operand has on the device: a pyopencl array's own (offset modulo 8, 32-bit reach), a
        torch tensor's once uploaded (runtime.upload_strides, at offset 0)."""
        if t is None:
            return None
        if type(t) is self.array_type:
            key = (t.shape, t.strides, t.offset, t.dtype.itemsize)
        else:
            kind = kind_of(t)
            if kind == "pyopencl":
                self.array_type = type(t)
                key = (t.shape, t.strides, t.offset, t.dtype.itemsize)
            elif kind == "torch":
                key = (tuple(t.shape), t.stride())
            else:
                raise TypeError(f"the OpenCL backend takes torch CPU tensors or pyopencl arrays, not {type(t)}")
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) > _LAYOUT_CACHE:
                self._layouts.clear()
            lay = self._layouts[key] = _layout(*key)
        return lay

    def prefetch(self, program: Program, anchor) -> None:
        """OpenCL programs build when first loaded (the runtime's program cache); nothing compiles ahead."""

    def load(self, program: Program, anchor):
        """An Exec of ``program``, its modules compiled for the anchor's context and their work-group limits met."""
        runtime = _runtime(self.device, anchor)
        origin = self._origin.pop(program.launches, None)
        for _ in range(4):
            over = {}
            for x in program.launches:
                lim = runtime.program(x.module)[1][x.kernel]
                if math.prod(x.block) > lim:
                    over[(x.module, x.kernel)] = lim
                    rt.stats["ig_too_large" if x.kernel.startswith("igemm_") else "wg_too_large"] += 1
            if not over:
                rt.stats["programs_loaded"] += 1
                return Exec(self, program)
            if origin is None:
                break
            known = _LIMITS.setdefault(self.device.index, {})
            known.update(over)
            plans = self.build(*origin, limits=dict(known))
            self._origin.pop(tuple(x for p in plans for x in p.launches), None)
            program = Program.of(plans, program.outputs)
        raise RuntimeError(f"portconv: the OpenCL kernels' work-group limits on {self.device.name} could not be met")


def _layout(shape, strides, offset=0, item=0) -> Layout:
    if item:  # a pyopencl array: byte strides and offset
        strides = tuple(s // item for s in strides)
        if any(s < 0 for s in strides):
            raise Unsupported("pyopencl arrays with negative strides are not supported")
        offset //= item
    else:
        strides = rt.upload_strides(tuple(shape), tuple(strides))
    lay = Layout(tuple(shape), strides, offset % 8)
    return Layout(lay.shape, lay.strides, lay.misalign, offset + lay.span > rt.INT32_MAX)


def _runtime(device, anchor) -> rt.Runtime:
    return rt.runtime_for_index(device.index) if kind_of(anchor) == "torch" else rt.runtime_for_array(anchor)


class _Step:
    __slots__ = ("knl", "set_desc", "desc", "grid", "block", "operands", "results", "work", "offs", "last", "stat")


class _Bound:
    """A program's kernels in one context: a kernel object per launch, its constant arguments set once."""

    def __init__(self, ex: Exec, runtime: rt.Runtime):
        import numpy as np

        cl = runtime.cl
        self.rt, self.lock, self.steps = runtime, threading.Lock(), []
        for launch in ex.program.launches:
            st = _Step()
            st.knl = cl.Kernel(runtime.program(launch.module)[0], launch.kernel)
            wide = any(k == "IDX64" for k, _ in launch.module.defines)
            st.desc = np.array(launch.args, dtype=np.int64 if wide else np.int32)
            st.set_desc = getattr(st.knl, "_set_arg_buf", None) or st.knl.set_arg
            st.set_desc(0, st.desc)
            st.operands, st.results, st.work, offs = [], [], [], []
            for b in launch.binds:
                if b.role == "dummy":
                    st.knl.set_arg(b.slot, runtime.dummy())
                elif b.role in ex.result_index:
                    st.results.append((b.slot, ex.result_index[b.role]))
                elif b.role in ex.work_index:
                    st.work.append((b.slot, ex.work_index[b.role]))
                else:
                    st.operands.append((b.slot, b.role))
                    if b.offset_slot >= 0:
                        offs.append((b.offset_slot, b.role))
            if launch.local_bytes:
                st.knl.set_arg(1 + max(b.slot for b in launch.binds), cl.LocalMemory(launch.local_bytes))
            st.offs, st.last = tuple(offs), tuple(0 for _ in offs)
            st.grid, st.block, st.stat = launch.grid, launch.block, stat_name(launch.kernel)
            self.steps.append(st)

    def run(self, queue, bufs: dict, offsets: dict, results: list, work: list, wait_for) -> list:
        """Bind and enqueue every launch; the event of each."""
        events = []
        enqueue, stats = self.rt.cl.enqueue_nd_range_kernel, rt.stats
        with self.lock:
            for st in self.steps:
                knl = st.knl
                if st.offs:
                    now = tuple(offsets[role] for _, role in st.offs)
                    if now != st.last:
                        for (slot, _), v in zip(st.offs, now):
                            st.desc[slot] = v
                        st.set_desc(0, st.desc)
                        st.last = now
                for slot, role in st.operands:
                    knl.set_arg(slot, bufs[role])
                for slot, i in st.results:
                    knl.set_arg(slot, results[i])
                for slot, i in st.work:
                    knl.set_arg(slot, work[i])
                events.append(enqueue(queue, knl, st.grid, st.block, wait_for=wait_for))
                stats[st.stat] += 1
        return events


# Note [OpenCL replay]: what a call costs on the host once its Program is loaded (ProgramRunner, Note [programs]).
# pyopencl charges ~9 us for a by-value kernel argument through Kernel.set_args (a buffer argument 0.13 us, the same
# bytes through Kernel._set_arg_buf 0.2 us) and ~21 us for pyopencl.array.Array(): so each launch has a kernel object
# of its own per context, its descriptor (a numpy array) set once with _set_arg_buf and again only when an operand's
# element offset changed (views of one buffer, such as the bench's rotated sets); results come from the runtime's pool
# through pyopencl's fast Array constructor; launches wait for the operand arrays' events. A tiny conv2d on pyopencl
# arrays costs 15 us a call on PoCL (2 cores), against 19 us for the per-call recording it replaces. Torch CPU
# tensors are copied in without blocking and out with one blocking copy (83 us against 160 us).
class Exec:
    """A loaded Program: called with the call's values ({role: tensor}), returns its results in Program.outputs
    order, as torch CPU tensors (the input is one) or pyopencl arrays of the input's context and queue."""

    def __init__(self, loader: Loader, program: Program):
        self.loader, self.program, self.dtype = loader, program, loader.dtype
        res = [b for b in program.buffers if b.result]
        self.results = [(b.role, b.shape, b.strides, math.prod(b.shape)) for b in res]
        self.result_index = {b.role: i for i, b in enumerate(res)}
        work = [b for b in program.buffers if not b.result]
        self.work = [math.prod(b.shape) * rt.ITEMSIZE[b.dtype] for b in work]
        self.work_index = {b.role: i for i, b in enumerate(work)}
        self.operand_roles = tuple(sorted({b.role for x in program.launches for b in x.binds}
                                          - {"dummy", *self.result_index, *self.work_index}))
        writes = {r: i for i, x in enumerate(program.launches) for b in x.binds
                  for r in (b.role,) if r in self.result_index}
        self.writer = [writes.get(r) for r, *_ in self.results]  # the last launch writing each result
        self.out = tuple(None if r is None else self.result_index[r] for r in program.outputs)
        self._bound: dict[int, _Bound] = {}
        self._ctx = self._last = None
        self._np_dtype = self._new_array = None  # the arrays' numpy dtype; pyopencl's fast Array constructor
        self._array_results: list = []  # (shape, byte strides, size) of each result as a pyopencl array

    def bound(self, runtime: rt.Runtime) -> _Bound:
        b = self._bound.get(runtime.ctx.int_ptr)
        if b is None:
            b = self._bound[runtime.ctx.int_ptr] = _Bound(self, runtime)
        return b

    def __call__(self, values: dict) -> tuple:
        rt.check_not_forked()  # Note [fork]: a plan made before the fork
        anchor = values["input"]
        if type(anchor) is self.loader.array_type and self._new_array:
            got = self._arrays(values, anchor)
            if got is not None:
                return got
        return self._general(values, anchor)

    def _check_array(self, a, ctx) -> None:
        if self._np_dtype is None:
            from ...tensors import spec_of

            if spec_of(a).dtype != self.dtype:
                raise ValueError(f"the OpenCL backend needs one dtype for all tensors: got {a.dtype} with {self.dtype}")
            self._np_dtype, item = a.dtype, a.dtype.itemsize
            self._array_results = [(shape, tuple(s * item for s in strides), size)
                                   for _, shape, strides, size in self.results]
        elif a.dtype != self._np_dtype:
            raise ValueError(f"the OpenCL backend needs one dtype for all tensors: got {a.dtype} with {self.dtype}")
        if a.context is not ctx and a.context.int_ptr != ctx.int_ptr:
            raise Unsupported("pyopencl arrays from different OpenCL contexts cannot meet in one convolution")

    def _arrays(self, values: dict, anchor):
        """Note [OpenCL replay]: a call whose operands are all pyopencl arrays of the anchor's type, dtype and context;
        None for anything else (the general path checks it and says what is wrong)."""
        ctx = anchor.context
        if ctx is self._ctx:
            b = self._last
        else:
            b = self.bound(rt.runtime_for_array(anchor))
            self._ctx, self._last = ctx, b
        cls, dtype, item, bufs, offsets, wait = type(anchor), self._np_dtype, self._np_dtype.itemsize, {}, {}, None
        for role in self.operand_roles:
            a = values[role]
            if type(a) is not cls or a.context is not ctx or (a.dtype is not dtype and a.dtype != dtype):
                return None
            bufs[role] = a.base_data if a.size else b.rt.dummy()
            offsets[role] = a.offset // item
            if a.events:
                wait = (wait or []) + a.events
        runtime = b.rt
        queue = anchor.queue or runtime.queue
        pool, array, poison = runtime.pool, self._new_array, knobs.env().poison
        outs = []
        for shape, strides, size in self._array_results:
            out = array(None, shape, dtype, allocator=pool, strides=strides, _fast=True, _size=size, _context=ctx,
                        _queue=queue) if size else self._array(runtime, queue, dtype, shape, strides, 0)
            if size and poison:
                runtime.poison(queue, out.base_data, self.dtype, size)
            outs.append(out)
        return self._finish(b, queue, bufs, offsets, outs, wait)

    def _array(self, runtime: rt.Runtime, queue, dtype, shape, strides, size):
        """A result array (byte ``strides``) from the runtime's pool, NaN-filled under PORTCONV_POISON."""
        import pyopencl.array as cla

        if self._new_array is None:
            try:  # pyopencl's fast constructor (keyword-only internals); a pyopencl without it takes the other one
                cla.Array(None, (1,), dtype, allocator=runtime.pool, strides=(dtype.itemsize,), _fast=True, _size=1,
                          _context=runtime.ctx, _queue=queue)
                self._new_array = cla.Array
            except TypeError:
                self._new_array = False
        out = cla.Array(queue, shape, dtype, strides=strides, allocator=runtime.pool)
        if size and knobs.env().poison:
            runtime.poison(queue, out.base_data, self.dtype, size)
        return out

    def _finish(self, b: _Bound, queue, bufs, offsets, outs, wait):
        work = [b.rt.allocate(n) for n in self.work]
        events = b.run(queue, bufs, offsets, [o.base_data for o in outs], work, wait)
        for o, w in zip(outs, self.writer):
            if w is not None:
                o.add_event(events[w])
        return tuple(None if i is None else outs[i] for i in self.out)

    def _general(self, values: dict, anchor):
        """Any call: torch CPU tensors uploaded (results downloaded), pyopencl arrays bound as they are."""
        torch_anchor = kind_of(anchor) == "torch"
        runtime = _runtime(self.loader.device, anchor)
        b = self.bound(runtime)
        queue = runtime.queue if torch_anchor else (anchor.queue or runtime.queue)
        bufs, offsets, wait, keep = {}, {}, [], []
        if not torch_anchor:
            self._check_array(anchor, runtime.ctx)
        for role in self.operand_roles:
            a = values[role]
            if kind_of(a) == "torch":
                self._check_tensor(a)
                buf, done = runtime.upload(a, blocking=not torch_anchor)
                keep.append(done)
                bufs[role], offsets[role] = runtime.dummy() if buf is None else buf, 0
            else:
                self._check_array(a, runtime.ctx)
                bufs[role] = a.base_data if a.size else runtime.dummy()
                offsets[role] = a.offset // a.dtype.itemsize
                wait += a.events
        if not torch_anchor:
            outs = [self._array(runtime, queue, self._np_dtype, shape, strides, size)
                    for shape, strides, size in self._array_results]
            return self._finish(b, queue, bufs, offsets, outs, wait or None)
        out_bufs = []
        for *_, size in self.results:
            buf = runtime.allocate(size * rt.ITEMSIZE[self.dtype]) if size else runtime.dummy()
            if size and knobs.env().poison:
                runtime.poison(queue, buf, self.dtype, size)
            out_bufs.append(buf)
        work = [runtime.allocate(n) for n in self.work]
        b.run(queue, bufs, offsets, out_bufs, work, None)
        outs = [runtime.download(buf, shape, strides, self.dtype, queue)
                for buf, (_, shape, strides, _) in zip(out_bufs, self.results)]
        if not any(size for *_, size in self.results):  # no blocking download: the uploads end here
            queue.finish()
        return tuple(None if i is None else outs[i] for i in self.out)

    def _check_tensor(self, t) -> None:
        if t.device.type != "cpu":
            raise Unsupported(f"the OpenCL backend takes CPU tensors or pyopencl arrays, not tensors on {t.device}")
        name = str(t.dtype).removeprefix("torch.")
        if name != self.dtype:
            raise ValueError(f"the OpenCL backend needs one dtype for all tensors: got {name} with {self.dtype}")
