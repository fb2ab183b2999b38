"""OpenCL runtime for the opencl backend: device selection, contexts, cached programs, buffers and launches."""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import re
import threading

from .. import knobs, sources
from ..device import Availability, DeviceInfo
from ..errors import Unsupported, VendorImportError

PIP_HINT = "pip install portconv[pocl]"
_DEFINES = {"float32": "DTYPE_F32", "float64": "DTYPE_F64", "float16": "DTYPE_F16", "bfloat16": "DTYPE_BF16"}
# Poison patterns (NaN) per storage dtype, as raw bits so float16/bfloat16 need no numpy support.
_NAN_BITS = {"float32": ("uint32", 0x7FC00000), "float64": ("uint64", 0x7FF8000000000000),
             "float16": ("uint16", 0x7E00), "bfloat16": ("uint16", 0x7FC0)}
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
INT32_MAX = 2**31 - 1

# Counters the tests read: how many programs were built and how often each kernel was launched.
stats: collections.Counter = collections.Counter()
# Tests set this to run the 64-bit index variant (real problems need tensors of 2^31 elements for it).
force_idx64 = False


@functools.cache
def _digest() -> str:
    """The OpenCL sources' digest, read once per process (part of every program key)."""
    return sources.digest("opencl")


def cl():
    """The pyopencl module, imported on first use."""
    try:
        import pyopencl
    except ImportError as e:
        raise VendorImportError(f"the OpenCL backend needs pyopencl ({e}); {PIP_HINT}") from e
    return pyopencl


# --- devices ---------------------------------------------------------------------------------------------

def all_devices() -> list[tuple[int, int, object]]:
    """(platform index, device index, pyopencl.Device) for every OpenCL device; raises on ICD errors."""
    mod = cl()
    out = []
    for pi, plat in enumerate(mod.get_platforms()):
        try:
            devs = plat.get_devices()
        except mod.Error as e:  # a platform with no devices raises DEVICE_NOT_FOUND: list it as empty
            if "DEVICE_NOT_FOUND" not in str(e):
                raise
            devs = []
        out += [(pi, di, d) for di, d in enumerate(devs)]
    return out


# Simulators claim every device type (Oclgrind reports CPU|GPU|ACCELERATOR): only chosen by name or index.
_SIMULATORS = ("oclgrind",)


def _is_simulator(dev) -> bool:
    return any(s in dev.platform.name.lower() for s in _SIMULATORS)


# Note [compiler probe]: an OpenCL device can be listed and still fail to build any program: the PoCL that pyopencl's
# wheel bundles (3.0-rc2, LLVM 14) answers "unknown target CPU 'generic'" on CPUs its LLVM does not know (seen here on
# an AMD EPYC with AVX-512 VP2INTERSECT, a Zen 5). Chosen by type or by default, a device is taken only once its
# compiler has built a one-line kernel; a device named by index or name is taken as named, so its own error shows.
_PROBE_SOURCE = "__kernel void portconv_probe(__global float *a) { a[get_global_id(0)] = 1.0f; }"


_compiler_problems: dict[int, str | None] = {}  # pyopencl.Device.int_ptr -> compiler_problem's answer


def compiler_problem(dev) -> str | None:
    """Why ``dev``'s OpenCL compiler cannot build a one-line kernel, or None; probed once per device and process."""
    if dev.int_ptr not in _compiler_problems:
        mod = cl()
        try:
            mod.Program(mod.Context([dev]), _PROBE_SOURCE).build()
            why = None
        except mod.Error as e:
            text = str(e)
            m = re.search(r"^(?:error: )?(.*error.*|unknown.*)$", text.split("Build on", 1)[-1], re.M | re.I)
            why = " ".join((m.group(1) if m else text).split())[:240]
        _compiler_problems[dev.int_ptr] = why
    return _compiler_problems[dev.int_ptr]


def _pick(devs, spec: str | None) -> tuple[tuple | None, list[str]]:
    """Apply PORTCONV_OPENCL_DEVICE ('P:D', 'gpu', 'cpu' or a name substring): (one entry or None, the devices
    passed over because their compiler failed, Note [compiler probe])."""
    mod = cl()
    skipped: list[str] = []

    def of_type(t):
        return [e for e in devs if e[2].type & t and not _is_simulator(e[2])]

    def first_that_builds(entries):
        for e in entries:
            why = compiler_problem(e[2])
            if why is None:
                return e
            skipped.append(f"{e[0]}:{e[1]} {e[2].name.strip()} ({e[2].platform.version.strip()}): {why}")
        return None

    if spec is None:
        gpus, cpus = of_type(mod.device_type.GPU), of_type(mod.device_type.CPU)
        return first_that_builds(gpus or cpus or devs), skipped
    s = spec.strip()
    m = re.fullmatch(r"(\d+):(\d+)", s)
    if m:
        want = (int(m.group(1)), int(m.group(2)))
        return next((e for e in devs if (e[0], e[1]) == want), None), skipped
    if s.lower() in ("gpu", "cpu"):
        return first_that_builds(of_type(mod.device_type.GPU if s.lower() == "gpu" else mod.device_type.CPU)), skipped
    low = s.lower()
    return next((e for e in devs if low in e[2].platform.name.lower() or low in e[2].name.lower()), None), skipped


def _listing(devs) -> str:
    return "; ".join(f"{p}:{d} {dev.name.strip()} ({dev.platform.name.strip()})" for p, d, dev in devs) or "none"


_NO_COMPILER_HINT = ("a PoCL whose LLVM knows this CPU (Debian/Ubuntu: apt-get install pocl-opencl-icd; pyopencl "
                     "lists /etc/OpenCL/vendors first), or PORTCONV_OPENCL_DEVICE='P:D' to take a device anyway")


@functools.cache
def select(spec: str | None) -> tuple[Availability, tuple[int, int] | None]:
    """The device PORTCONV_OPENCL_DEVICE=spec names (default: first GPU, else first CPU; by type or default, the
    first whose compiler works, Note [compiler probe]), with the reason."""
    try:
        mod = cl()
    except VendorImportError as e:
        return Availability.no(str(e)), None
    try:
        devs = all_devices()
    except mod.Error as e:
        return Availability.no(f"no OpenCL platform could be opened (ICD loader: {e}); {PIP_HINT} "
                               f"gives a CPU device"), None
    if not devs:
        return Availability.no(f"no OpenCL device found on any platform; {PIP_HINT} gives a CPU device"), None
    hit, skipped = _pick(devs, spec)
    if hit is None:
        if skipped:
            return Availability.no(f"no usable OpenCL device{f' for PORTCONV_OPENCL_DEVICE={spec!r}' if spec else ''}"
                                   f": the compiler failed on {'; '.join(skipped)}; {_NO_COMPILER_HINT}"), None
        return Availability.no(f"PORTCONV_OPENCL_DEVICE={spec!r} matches no OpenCL device; devices: "
                               f"{_listing(devs)}"), None
    p, d, dev = hit
    why = f"PORTCONV_OPENCL_DEVICE={spec!r}" if spec else "the first GPU, else the first CPU device"
    passed = f"; passed over (compiler failed): {'; '.join(skipped)}" if skipped else ""
    return Availability.yes(f"OpenCL device {p}:{d} {dev.name.strip()} ({dev.platform.name.strip()}), "
                            f"chosen as {why}{passed}"), (p, d)


def default_index() -> tuple[int, int]:
    avail, pd = select(knobs.get("PORTCONV_OPENCL_DEVICE"))
    if pd is None:
        raise Unsupported(avail.reason)
    return pd


def flat_index(device) -> int:
    """Position of a pyopencl.Device in all_devices() (TensorSpec.device_index of pyopencl arrays)."""
    return _flat_positions().get(device.int_ptr, -1)


@functools.lru_cache(maxsize=1)
def _flat_positions() -> dict[int, int]:
    return {dev.int_ptr: i for i, (_, _, dev) in enumerate(all_devices())}


@functools.cache
def info(platform_index: int, device_index: int) -> DeviceInfo:
    from ..device import from_opencl

    for p, d, dev in all_devices():
        if (p, d) == (platform_index, device_index):
            return from_opencl(dev, p, d)
    raise Unsupported(f"OpenCL device {platform_index}:{device_index} does not exist")


def info_of_flat(flat: int) -> DeviceInfo:
    p, d, _ = all_devices()[flat]
    return info(p, d)


# --- the kernel descriptor, contexts, programs, kernels ------------------------------------------------

@dataclasses.dataclass
class Desc:
    """The host image of common.h's conv_desc (same field order); packed as int32, or int64 under IDX64.

    ``geo`` is the canonical convolution (opencl.Geometry: N, G, CX, CY, X, Y, K, S, P, DL); the rest are the
    per-launch strides, offsets and sizes."""

    geo: object
    xs: tuple[int, ...] = (0,) * 5
    ws: tuple[int, ...] = (0,) * 5
    ys: tuple[int, ...] = (0,) * 5
    xo: int = 0
    wo: int = 0
    yo: int = 0
    bo: int = 0
    bs: int = 0
    has_bias: int = 0
    c_inner: int = 0
    total: int = 0
    red: int = 0
    idx64: bool = False
    acc_bytes: int = 4

    # Positions of the tensor offsets in pack()'s array (the replayed launches patch them per call).
    OFFSET_INDEX = {"xo": 37, "wo": 38, "yo": 39, "bo": 40}

    def pack(self):
        import numpy as np

        g = self.geo
        vals = [g.N, g.G, g.CX, g.CY, *g.X, *g.Y, *g.K, *g.S, *g.P, *g.DL,
                *self.xs, *self.ws, *self.ys, self.xo, self.wo, self.yo, self.bo, self.bs, self.has_bias,
                self.c_inner, self.total, self.red]
        return np.array(vals, dtype=np.int64 if self.idx64 else np.int32)


@dataclasses.dataclass
class DevTensor:
    """A tensor on the device: buffer, element offset, shape and element strides (any layout)."""

    buf: object
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    host: object = None  # the pyopencl Array or torch tensor the result becomes
    role: object = None  # what a recorded launch binds it to (Note [OpenCL replay]): call argument i, ("out", k)

    @property
    def span(self) -> int:
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0)


class Runtime:
    """One OpenCL context on one device: its queue, its programs (built once) and kernel objects (fetched once)."""

    def __init__(self, context, device, queue=None):
        mod = cl()
        self.cl = mod
        self.ctx = context
        self.device = device
        self.queue = queue or mod.CommandQueue(context, device)
        self.driver = device.driver_version
        self.lock = threading.Lock()
        self._kernels: dict[tuple, dict] = {}
        self._dummy = None
        self._pool = None

    # Note [OpenCL buffer pool]: results, uploads and scratch come from one pyopencl MemoryPool per runtime.
    # A fresh clCreateBuffer on a CPU device is fresh host memory, and the kernel that first writes it pays
    # the page faults (PoCL: about as long as a small depthwise kernel itself); pooled buffers are reused when
    # their array or tensor is released. Results are written on the queue of the call, in order.
    @property
    def pool(self):
        if self._pool is None:
            import pyopencl.tools as clt

            self._pool = clt.MemoryPool(clt.ImmediateAllocator(self.queue))
        return self._pool

    # programs ------------------------------------------------------------------------------------------
    def kernel(self, dtype: str, idx64: bool, depthwise: bool, name: str):
        """(kernel object, its max work-group size) from the program of this define set, built on first use."""
        defines = (_DEFINES[dtype],) + (("IDX64",) if idx64 else ()) + (("DEPTHWISE",) if depthwise else ())
        prefix = "depthwise_" if depthwise else "conv_"
        return self._table("conv.cl", defines)[prefix + name]

    def dw_kernel(self, dtype: str, idx64: bool, spec: tuple[str, ...], name: str):
        """A kernel of opencl/depthwise.cl (Note [depthwise kernels]) built with the defines ``spec``
        (DW_VW, DW_K0..2, DW_S0..2), one program per (dtype, index width, spec)."""
        defines = (_DEFINES[dtype],) + (("IDX64",) if idx64 else ()) + tuple(spec)
        return self._table("depthwise.cl", defines)["dw_" + name]

    def ig_kernel(self, dtype: str, idx64: bool, spec: tuple[str, ...], name: str):
        """A kernel of opencl/igemm.cl (Note [OpenCL implicit GEMM]) built with the tile defines ``spec``."""
        defines = (_DEFINES[dtype],) + (("IDX64",) if idx64 else ()) + tuple(spec)
        return self._table("igemm.cl", defines)["igemm_" + name]

    def _table(self, source: str, defines: tuple[str, ...]) -> dict:
        key = (self.driver, _digest(), source, defines)
        with self.lock:
            table = self._kernels.get(key)
            if table is None:
                table = self._kernels[key] = self._build(defines, source)
        return table

    @property
    def is_cpu(self) -> bool:
        return bool(self.device.type & self.cl.device_type.CPU)

    def _build(self, defines: tuple[str, ...], source: str = "conv.cl") -> dict:
        folder = str(sources.folder("opencl"))
        inc = f'"{folder}"' if " " in folder else folder
        options = ["-I", inc] + [d if d.startswith("-") else f"-D{d}" for d in defines]  # "-...": a build option
        src = sources.read("opencl", source)
        cache = os.path.join(knobs.cache_dir(), "pyopencl")
        os.makedirs(cache, exist_ok=True)
        prg = self.cl.Program(self.ctx, src).build(options=options, devices=[self.device], cache_dir=cache)
        stats["programs_built"] += 1
        wg = self.cl.kernel_work_group_info.WORK_GROUP_SIZE
        return {k.function_name: (k, k.get_work_group_info(wg, self.device)) for k in prg.all_kernels()}

    # buffers -------------------------------------------------------------------------------------------
    def dummy(self):
        if self._dummy is None:
            self._dummy = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_ONLY, 16)
        return self._dummy

    def upload(self, x, queue) -> DevTensor:
        """A torch CPU tensor or a pyopencl array of this context, as a DevTensor (arrays: no copy)."""
        if _is_torch(x):
            return self._upload_torch(x)
        if x.context.int_ptr != self.ctx.int_ptr:
            raise Unsupported("pyopencl arrays from different OpenCL contexts cannot meet in one convolution")
        item = x.dtype.itemsize
        if any(s < 0 for s in x.strides):
            raise Unsupported("pyopencl arrays with negative strides are not supported")
        buf = x.base_data if x.size else self.dummy()
        return DevTensor(buf, x.offset // item if x.size else 0, tuple(x.shape), tuple(s // item for s in x.strides))

    def _upload_torch(self, t) -> DevTensor:
        import torch

        t = t.detach()
        if t.device.type != "cpu":
            raise Unsupported(f"the OpenCL backend takes CPU tensors or pyopencl arrays, not tensors on {t.device}")
        if t.numel() == 0:
            return DevTensor(self.dummy(), 0, tuple(t.shape), tuple(t.stride()))
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        if span > 2 * t.numel() + 4096:  # a sparse view: upload its elements, not the gaps between them
            t = t.contiguous()
            span = t.numel()
        flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
        host = _numpy_view(flat)
        buf = self.pool.allocate(host.nbytes)
        self.cl.enqueue_copy(self.queue, buf, host, is_blocking=True)
        return DevTensor(buf, 0, tuple(t.shape), tuple(t.stride()))

    def empty(self, shape, strides, dtype: str, like, queue) -> DevTensor:
        """A dense output (strides given) of the caller's tensor type; NaN-filled when knobs.poison()."""
        numel = 1
        for s in shape:
            numel *= s
        nbytes = max(numel, 1) * _ITEMSIZE[dtype]
        if _is_torch(like):
            buf = self.pool.allocate(nbytes)
            out = DevTensor(buf, 0, tuple(shape), tuple(strides))
        else:
            import pyopencl.array as cla

            arr = cla.Array(queue, tuple(shape), like.dtype, strides=tuple(s * like.dtype.itemsize for s in strides),
                            allocator=self.pool)
            buf = arr.base_data if numel else self.dummy()
            out = DevTensor(buf, 0, tuple(shape), tuple(strides), arr)
        if knobs.poison() and numel:
            self.poison(queue, buf, dtype, numel)
        return out

    def poison(self, queue, buf, dtype: str, numel: int) -> None:
        """Fill ``numel`` elements of ``buf`` with NaN (PORTCONV_POISON: results must be fully written)."""
        import numpy as np

        kind, bits = _NAN_BITS[dtype]
        self.cl.enqueue_fill_buffer(queue, buf, np.array([bits], dtype=kind), 0, numel * _ITEMSIZE[dtype])

    def result(self, out: DevTensor, dtype: str, like, queue, event):
        """The output in the caller's type: a torch tensor (downloaded) or the pyopencl Array itself."""
        if out.host is not None:
            if event is not None:
                out.host.add_event(event)
            return out.host
        import torch

        t = torch.empty_strided(out.shape, out.strides, dtype=getattr(torch, dtype))
        if t.numel():
            flat = torch.as_strided(t, (t.numel(),), (1,), 0)
            self.cl.enqueue_copy(queue, _numpy_view(flat), out.buf, is_blocking=True)
        return t

    # launches ------------------------------------------------------------------------------------------
    def launch_nd(self, queue, kernel_entry, name: str, desc, args, gsize, lsize, local_bytes=0, wait_for=None):
        """Run one kernel on an N-D range: ``gsize`` work-items per dimension, rounded up to ``lsize``
        (the kernels return early past their extents); ``local_bytes`` of local memory as the last argument.
        ``args`` are buffers or DevTensors (their buffer)."""
        knl, _ = kernel_entry
        gs = tuple(-(-g // l) * l for g, l in zip(gsize, lsize))
        args = tuple(a.buf if type(a) is DevTensor else a for a in args)
        if local_bytes:
            args += (self.cl.LocalMemory(local_bytes),)
        with self.lock:
            knl.set_args(desc.pack(), *args)
            evt = self.cl.enqueue_nd_range_kernel(queue, knl, gs, tuple(lsize), wait_for=wait_for or None)
        stats[name] += 1
        return evt

    def scratch(self, nbytes: int):
        """A device buffer for intermediate results (the depthwise grad-weight partials), from the pool."""
        return self.pool.allocate(max(nbytes, 16))


def pow2_floor(v: int) -> int:
    p = 1
    while p * 2 <= v:
        p *= 2
    return p


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def _numpy_view(flat):
    """A numpy array sharing a 1-D contiguous torch tensor's memory (bfloat16 as int16 bits)."""
    import torch

    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy()


_RUNTIMES: dict[tuple, Runtime] = {}
_RT_LOCK = threading.Lock()


def runtime_for_index(index: str) -> Runtime:
    """The runtime (our own context) for DeviceInfo.index 'opencl:P:D'."""
    with _RT_LOCK:
        rt = _RUNTIMES.get(("index", index))
        if rt is None:
            _, p, d = index.split(":")
            dev = next(e[2] for e in all_devices() if (e[0], e[1]) == (int(p), int(d)))
            rt = _RUNTIMES[("index", index)] = Runtime(cl().Context([dev]), dev)
        return rt


def runtime_for_array(arr) -> Runtime:
    """The runtime for a pyopencl array's own context (and device)."""
    ctx = arr.context
    dev = arr.queue.device if arr.queue is not None else ctx.devices[0]
    key = ("ctx", ctx.int_ptr, dev.int_ptr)
    with _RT_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            rt = _RUNTIMES[key] = Runtime(ctx, dev)
        return rt


def index_fits_int32(*spans: int) -> bool:
    return max(spans, default=0) <= INT32_MAX
