"""Replayed launches of the opencl backend (Note [OpenCL replay]): a cached plan's call on pyopencl arrays,
recorded once, then repeated with only its buffers and offsets set again."""
from __future__ import annotations

from .. import knobs
from . import _cl_runtime as rt

# Note [OpenCL replay]
# The general call path (opencl._Call) costs 170-200 us of Python and pyopencl per call on the 2-core CPU host
# (measured with cProfile and perf_counter, docs/performance/notes-opencl.md): dtype checks through numpy's dtype
# names, five-dimensional strides and a Desc per launch, pyopencl.array.Array() (21 us), and Kernel.set_args, where
# every by-value argument (the packed descriptor) costs ~9 us in pyopencl (a buffer argument 0.13 us, the same bytes
# through Kernel._set_arg_buf 0.2 us). Against PyTorch's 0.15-0.35 ms on the small depthwise rows that is most of
# the time.
#
# So the first call of a plan per direction (forward, or one backward output mask) on pyopencl arrays runs the
# general path with a Recorder, which keeps each launch: the kernel, its N-D range, the packed descriptor, and what
# each kernel argument is (call argument i, result k, a scratch buffer, or a constant such as the dummy buffer and
# the local memory). Each recorded launch gets a kernel object of its own with the constant arguments set once.
# A later call whose arrays have the recorded type, shape, strides, dtype and context (the plan cache already
# checked the problem), and offsets that keep the recorded kernels' alignment (Recorder.align), only:
#   - patches the tensors' element offsets into the descriptor when they changed (views of one buffer, such as the
#     bench's rotated sets) and sets it with _set_arg_buf,
#   - sets the buffer arguments, allocates the results from the runtime's pool with pyopencl's fast Array
#     constructor (NaN-filled under PORTCONV_POISON, as the general path does),
#   - enqueues the launches on the anchor array's queue, waiting for the arrays' events.
# Anything else (torch tensors, other strides, offsets that need 64-bit indices, rt.force_idx64) takes the general
# path, which records again (up to MAX_REPLAYS per plan and direction).
MAX_REPLAYS = 4

# Which descriptor offset each kernel argument's tensor sets, per kernel (depthwise and igemm names without "dw_",
# "cl_" (Note [channels-last depthwise]), "ig_": the four sets take their tensors in the same order).
_OFFSET_FIELDS = {"fwd": ("xo", "wo", "bo", "yo"), "bwd_data": ("yo", "wo", "bo", "xo"),
                  "bwd_weight": ("xo", "yo", "wo", None), "finalize": (None, "wo"), "bias_grad": ("yo", "bo")}


class Recorder:
    """What one general-path call launched (steps) and returned (outputs)."""

    def __init__(self):
        self.steps: list[tuple] = []
        self.outs: list[tuple[rt.DevTensor, int]] = []
        self.align = 1  # element offsets a replay needs (a multiple of): DW_CLA's aligned vectors

    def output(self, t: rt.DevTensor, position: int) -> None:
        self.outs.append((t, position))

    def step(self, runtime, entry, name, desc, args, gsize, lsize, local_bytes) -> None:
        self.steps.append((entry, name, desc, tuple(args), tuple(gsize), tuple(lsize), local_bytes))


def _key(direction) -> tuple:
    return ("opencl-replay", direction)


def run(plan, direction, args):
    """(the results of a replayed call or None, a Recorder when the general path should record this call)."""
    reps = plan.state.get(_key(direction))
    if reps:
        for rep in reps:
            if rep is not None:
                got = rep(args)
                if got is not None:
                    return got, None
    anchor = args[0] if direction == "fwd" else args[1]
    if (reps is None or len(reps) < MAX_REPLAYS) and not _is_torch(anchor):
        return None, Recorder()
    return None, None


def keep(plan, direction, args, rec: Recorder | None, call) -> None:
    """Store the replay of a recorded call (None when it cannot be replayed, so the attempts stay bounded)."""
    if rec is None:
        return
    try:
        rep = Replay(rec, call, args, direction)
    except _NotReplayable:
        rep = None
    plan.state.setdefault(_key(direction), []).append(rep)


class _NotReplayable(Exception):
    pass


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


class _Step:
    __slots__ = ("knl", "name", "gs", "ls", "desc", "set_desc", "offs", "last", "bufs")


class Replay:
    """One recorded call (Note [OpenCL replay]); calling it with matching arrays repeats it, else returns None."""

    def __init__(self, rec: Recorder, call, args, direction):
        cl = call.rt.cl
        self.rt, self.cl = call.rt, cl
        self.anchor = 0 if direction == "fwd" else 1
        self.queue0 = call.queue
        self.dev_ptr = call.rt.device.int_ptr
        self.ctx = call.rt.ctx
        self.ctx_ptr = call.rt.ctx.int_ptr
        self.dtype_name = call.dtype
        self.align = rec.align
        self.sigs = []
        self.items = []
        for a in args:
            if a is None:
                self.sigs.append(None)
                self.items.append(1)
                continue
            if _is_torch(a) or not a.size:
                raise _NotReplayable
            self.sigs.append((type(a), a.shape, a.strides, a.dtype))
            self.items.append(a.dtype.itemsize)
        limits = [None] * len(args)
        self.steps = []
        self.out_step = {}
        for i, (entry, name, desc, kargs, gs, ls, local_bytes) in enumerate(rec.steps):
            st = _Step()
            st.name = name
            st.knl = cl.Kernel(entry[0].program, entry[0].function_name)
            st.gs = tuple(-(-g // lo) * lo for g, lo in zip(gs, ls))
            st.ls = ls
            st.desc = desc.pack()
            fields = _OFFSET_FIELDS[name.removeprefix("dw_").removeprefix("cl_").removeprefix("ig_")]
            offs, bufs = [], []
            for j, a in enumerate(kargs):
                if type(a) is not rt.DevTensor:
                    st.knl.set_arg(j + 1, a)  # a constant (the dummy buffer)
                    continue
                role = a.role
                if role is None:
                    raise _NotReplayable
                bufs.append((j + 1, role))
                field = fields[j] if j < len(fields) else None
                if field is not None and (field != "bo" or desc.has_bias):
                    idx = rt.Desc.OFFSET_INDEX[field]
                    if int(st.desc[idx]) != a.offset:
                        raise _NotReplayable
                    if type(role) is int:
                        offs.append((idx, role))
                if type(role) is int and not desc.idx64:
                    lim = rt.INT32_MAX - (a.span - a.offset)
                    limits[role] = lim if limits[role] is None else min(limits[role], lim)
                if type(role) is tuple and role[0] == "out":
                    self.out_step[role[1]] = i
            if local_bytes:
                st.knl.set_arg(len(kargs) + 1, cl.LocalMemory(local_bytes))
            st.offs, st.bufs = tuple(offs), tuple(bufs)
            st.last = tuple(int(st.desc[idx]) for idx, _ in offs)
            st.set_desc = getattr(st.knl, "_set_arg_buf", None) or st.knl.set_arg
            st.set_desc(0, st.desc)
            self.steps.append(st)
        self.limits = tuple(rt.INT32_MAX * 4 if lim is None else lim for lim in limits)
        self.outs = []
        for t, position in rec.outs:
            h = t.host
            if h is None or not h.size or position not in self.out_step:
                raise _NotReplayable
            self.outs.append((position, h.shape, h.dtype, h.strides, h.size))
        self.single = direction == "fwd"
        import pyopencl.array as cla

        self.array = cla.Array
        if not self.outs:
            raise _NotReplayable
        try:  # pyopencl's fast constructor (keyword-only internals): a pyopencl without it takes the general path
            _, shape, dtype, strides, size = self.outs[0]
            self.array(None, shape, dtype, allocator=self.rt.pool, strides=strides, _fast=True, _size=size,
                       _context=self.ctx, _queue=self.queue0)
        except TypeError:
            raise _NotReplayable from None

    def __call__(self, args):
        offsets = []
        for a, sig, item, lim in zip(args, self.sigs, self.items, self.limits):
            if a is None:
                if sig is not None:
                    return None
                offsets.append(0)
                continue
            if (sig is None or type(a) is not sig[0] or a.shape != sig[1] or a.strides != sig[2]
                    or a.dtype != sig[3]):
                return None
            ctx = a.context
            if ctx is not self.ctx and ctx.int_ptr != self.ctx_ptr:
                return None
            off = a.offset // item
            if off > lim or off % self.align:
                return None
            offsets.append(off)
        if rt.force_idx64:
            return None
        queue = args[self.anchor].queue or self.rt.queue
        if queue is not self.queue0 and queue.device.int_ptr != self.dev_ptr:
            return None
        wait_for = [e for a in args if a is not None for e in a.events] or None
        pool = self.rt.pool
        outs = [None, None, None]  # by position
        for position, shape, dtype, strides, size in self.outs:
            o = outs[position] = self.array(None, shape, dtype, allocator=pool, strides=strides, _fast=True,
                                            _size=size, _context=self.ctx, _queue=queue)
            if knobs.poison():
                self.rt.poison(queue, o.base_data, self.dtype_name, size)
        scratch = {}
        events = []
        enqueue = self.cl.enqueue_nd_range_kernel
        with self.rt.lock:
            for st in self.steps:
                knl = st.knl
                if st.offs:
                    now = tuple(offsets[role] for _, role in st.offs)
                    if now != st.last:
                        for (idx, _), v in zip(st.offs, now):
                            st.desc[idx] = v
                        st.set_desc(0, st.desc)
                        st.last = now
                for idx, role in st.bufs:
                    if type(role) is int:
                        knl.set_arg(idx, args[role].base_data)
                    elif role[0] == "out":
                        knl.set_arg(idx, outs[role[1]].base_data)
                    else:  # ("scratch", serial, nbytes): one pooled buffer per call, shared by its launches
                        buf = scratch.get(role)
                        if buf is None:
                            buf = scratch[role] = pool.allocate(max(role[2], 16))
                        knl.set_arg(idx, buf)
                events.append(enqueue(queue, knl, st.gs, st.ls, wait_for=wait_for))
                rt.stats[st.name] += 1
        for position, *_ in self.outs:
            outs[position].add_event(events[self.out_step[position]])
        return outs[0] if self.single else tuple(outs)
