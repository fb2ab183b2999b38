"""The OpenCL runtime: devices, the compiler probe, contexts, programs compiled once, the buffer pool, host copies."""
from __future__ import annotations

import collections
import functools
import os
import re
import threading

from ... import diskcache, forks, knobs, sources
from ...device import Availability, DeviceInfo, opencl_devices
from ...errors import Unsupported, VendorImportError
from ..program import Module

PIP_HINT = "pip install portconv[pocl]"
INT32_MAX = 2**31 - 1
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
# Poison patterns (NaN) per storage dtype, as raw bits so float16/bfloat16 need no numpy support.
_NAN_BITS = {"float32": ("uint32", 0x7FC00000), "float64": ("uint64", 0x7FF8000000000000),
             "float16": ("uint16", 0x7E00), "bfloat16": ("uint16", 0x7FC0)}

# What the tests read: programs built and loaded, launches per kernel (launch.stat_name), work-group limits met at
# load time (Note [work-group limits]).
stats: collections.Counter = collections.Counter()


# Note [fork] (portconv/forks.py): PoCL, like most OpenCL drivers, cannot run in a child forked after its parent
# enumerated devices or made a runtime; such a child never calls OpenCL.
FORK = forks.RuntimeGuard("OpenCL", "PoCL (like most OpenCL drivers) cannot run in such a child")


def check_not_forked() -> None:
    """Raise BackendUnavailable where OpenCL must not be called (Note [fork])."""
    FORK.check("opencl backend")


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
    cl()  # VendorImportError with the pip hint when pyopencl is missing
    FORK.use("opencl backend")
    return opencl_devices()


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


def select(spec: str | None) -> tuple[Availability, tuple[int, int] | None]:
    """The device PORTCONV_OPENCL_DEVICE=spec names (default: first GPU, else first CPU; by type or default, the
    first whose compiler works, Note [compiler probe]), with the reason; none in a forked child (Note [fork]: the
    answer the parent cached included)."""
    if FORK.forked:
        return Availability.no(FORK.reason), None
    return _select(spec)


@functools.cache
def _select(spec: str | None) -> tuple[Availability, tuple[int, int] | None]:
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
    avail, pd = select(knobs.env().opencl_device)
    if pd is None:
        raise Unsupported(avail.reason)
    return pd




@functools.cache
def info(platform_index: int, device_index: int) -> DeviceInfo:
    from ...device import from_opencl

    for p, d, dev in all_devices():
        if (p, d) == (platform_index, device_index):
            return from_opencl(dev, p, d)
    raise Unsupported(f"OpenCL device {platform_index}:{device_index} does not exist")


def info_of_flat(flat: int) -> DeviceInfo:
    p, d, _ = all_devices()[flat]
    return info(p, d)


# --- contexts, programs, buffers ------------------------------------------------------------------------

def build_options(module: Module) -> list[str]:
    """The compiler options of a module: the kernel folder and its defines."""
    folder = str(sources.folder("opencl"))
    return ["-I", f'"{folder}"' if " " in folder else folder] + [f"-D{k}" if v == "" else f"-D{k}={v}"
                                                                   for k, v in module.defines]


# Note [PoCL work-group method]
# PoCL turns a kernel into a work-group function by one of several methods (POCL_WORK_GROUP_METHOD, read when it
# generates that function). On Debian's PoCL 5.0 (LLVM 16, AVX-512 Xeon) the default and 'loopvec' methods return
# wrong implicit-GEMM weight gradients (loopvec: 109 of the 2048 conformance runs, float32 and float64; the default:
# test_nn's grouped ConvTranspose2d case), while 'cbs' (continuation-based barriers) passed all 2048; PoCL 3.0 and
# 3.1 pass with their default. So on PoCL >= 5 CPU devices portconv sets POCL_WORK_GROUP_METHOD=cbs for the process
# before its first program there, unless the variable is already set (a user's choice is kept).
POCL_WG_METHOD = "cbs"


def pocl_work_group_method(platform_version: str, is_cpu: bool) -> str | None:
    """The work-group method portconv asks PoCL for on this device, or None (leave PoCL's default): pure."""
    m = re.search(r"\bPoCL (\d+)\.", platform_version)
    return POCL_WG_METHOD if is_cpu and m is not None and int(m.group(1)) >= 5 else None


def _set_pocl_method(device) -> None:
    want = pocl_work_group_method(device.platform.version, bool(device.type & cl().device_type.CPU))
    if want is not None:
        knobs.default_foreign("POCL_WORK_GROUP_METHOD", want)


class Runtime:
    """One OpenCL context on one device: its queue, its programs (compiled once), buffer pool and dummy buffer."""

    def __init__(self, context, device):
        mod = cl()
        FORK.use("opencl backend")
        _set_pocl_method(device)
        self.cl = mod
        self.ctx = context
        self.device = device
        self.queue = mod.CommandQueue(context, device)
        self.lock = threading.Lock()
        self._programs: dict[Module, tuple[object, dict[str, int]]] = {}
        self._dummy = None
        self._pool = None

    def program(self, module: Module) -> tuple[object, dict[str, int]]:
        """(pyopencl.Program, {kernel: CL_KERNEL_WORK_GROUP_SIZE}) of a module, compiled on first use."""
        with self.lock:
            got = self._programs.get(module)
            if got is None:
                got = self._programs[module] = self._build(module)
        return got

    def _build(self, module: Module):
        where = diskcache.folder(os.path.join(knobs.env().cache_dir, "pyopencl"))  # Note [trusted cache]
        cache = False if where is None else str(where)  # False: pyopencl builds without its binary cache
        src = sources.read("opencl", module.source)  # pyopencl's cache follows the included headers
        prg = self.cl.Program(self.ctx, src).build(options=build_options(module), devices=[self.device],
                                                   cache_dir=cache)
        stats["programs_built"] += 1
        wg = self.cl.kernel_work_group_info.WORK_GROUP_SIZE
        return prg, {k.function_name: k.get_work_group_info(wg, self.device) for k in prg.all_kernels()}

    # Note [OpenCL buffer pool]: results, uploads and workspaces come from one pyopencl MemoryPool per runtime.
    # A fresh clCreateBuffer on a CPU device is fresh host memory, and the kernel that first writes it pays the page
    # faults (PoCL: about as long as a small depthwise kernel itself); pooled buffers are reused when their array or
    # tensor is released. Results are written on the queue of the call, in order.
    @property
    def pool(self):
        if self._pool is None:
            import pyopencl.tools as clt

            self._pool = clt.MemoryPool(clt.ImmediateAllocator(self.queue))
        return self._pool

    def dummy(self):
        """A 16-byte buffer bound where a kernel argument has no tensor (no bias, no workspace, an empty tensor)."""
        if self._dummy is None:
            self._dummy = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_ONLY, 16)
        return self._dummy

    def allocate(self, nbytes: int):
        return self.pool.allocate(max(nbytes, 16))

    def poison(self, queue, buf, dtype: str, numel: int) -> None:
        """Fill ``numel`` elements of ``buf`` with NaN (PORTCONV_POISON: results must be fully written)."""
        import numpy as np

        kind, bits = _NAN_BITS[dtype]
        self.cl.enqueue_fill_buffer(queue, buf, np.array([bits], dtype=kind), 0, numel * ITEMSIZE[dtype])

    def upload(self, t, blocking: bool = True):
        """(a pooled buffer holding a torch CPU tensor's elements at offset 0 with strides upload_strides(), the copy's
        event); (None, None) for an empty tensor. Not ``blocking``: the event keeps the host memory until the copy
        is done (pyopencl's NannyEvent); a later command of the queue runs after it."""
        import torch

        if t.numel() == 0:
            return None, None
        shape, strides = tuple(t.shape), upload_strides(tuple(t.shape), tuple(t.stride()))
        if strides != tuple(t.stride()):  # a sparse view: its elements, not the gaps between them
            t = t.contiguous()
        span = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
        host = numpy_view(torch.as_strided(t.detach(), (span,), (1,), t.storage_offset()))
        buf = self.allocate(host.nbytes)
        return buf, self.cl.enqueue_copy(self.queue, buf, host, is_blocking=blocking)

    def download(self, buf, shape, strides, dtype: str, queue):
        """A torch CPU tensor of ``shape`` and (dense) ``strides`` with the contents of ``buf`` (a blocking copy)."""
        import torch

        t = torch.empty_strided(shape, strides, dtype=getattr(torch, dtype))
        if t.numel():
            self.cl.enqueue_copy(queue, numpy_view(torch.as_strided(t, (t.numel(),), (1,), 0)), buf, is_blocking=True)
        return t


def upload_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides a torch tensor has once uploaded: its own, or contiguous ones for a sparse view (a span of more
    than twice its elements and 4096)."""
    numel = 1
    for s in shape:
        numel *= s
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if numel else 0
    if span <= 2 * numel + 4096:
        return strides
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def numpy_view(flat):
    """A numpy array sharing a 1-D contiguous torch tensor's memory (bfloat16 as int16 bits)."""
    import torch

    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy()


_RUNTIMES: dict[tuple, Runtime] = {}
_RT_LOCK = threading.Lock()


def runtime_for_index(index: str) -> Runtime:
    """The runtime (a context of our own) for DeviceInfo.index 'opencl:P:D'."""
    check_not_forked()  # Note [fork]: the parent's runtime included
    with _RT_LOCK:
        rt = _RUNTIMES.get(("index", index))
        if rt is None:
            _, p, d = index.split(":")
            dev = next(e[2] for e in all_devices() if (e[0], e[1]) == (int(p), int(d)))
            rt = _RUNTIMES[("index", index)] = Runtime(cl().Context([dev]), dev)
        return rt


def runtime_for_array(arr) -> Runtime:
    """The runtime of a pyopencl array's own context (and its queue's device)."""
    check_not_forked()  # Note [fork]: the parent's runtime included
    ctx = arr.context
    dev = arr.queue.device if arr.queue is not None else ctx.devices[0]
    key = ("ctx", ctx.int_ptr, dev.int_ptr)
    with _RT_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            rt = _RUNTIMES[key] = Runtime(ctx, dev)
        return rt
