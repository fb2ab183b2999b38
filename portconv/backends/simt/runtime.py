"""The simt Loaders: a Program made executable on torch CUDA/ROCm tensors or CuPy arrays (Note [programs]).

Note [zero copy]: kernels get raw device addresses and element strides, so inputs are read in place whatever their
layout, and results are allocated by the caller's library (torch's caching allocator or CuPy's pool) in the layout
the plan chose. Work is queued on the caller's current stream of the tensors' device, read at every call:
torch.cuda.current_stream(device) for torch tensors, CuPy's current stream for CuPy arrays.

Note [driver launch]: on NVIDIA a launch goes straight to the driver (cuLaunchKernel through ctypes, about 2 us where
CuPy's launch took 7 us on an H100; the argument block is the kernel's only parameter and the driver copies it at
launch). Everything a launch needs but the addresses (function, grid, the argument block with its address fields
zero) is converted to ctypes once, when the Program is loaded; a call copies each block, writes the addresses of
its Binds and launches. CuPy for ROCm launches through CuPy.

Note [dependent launch]: a split reduction is two kernels, the partial sums and portconv_split_finalize, whose Launch
is marked dependent. On a GPU of compute capability 9.0 or newer it is launched with cuLaunchKernelEx and
programmatic stream serialization (PDL): the GPU may start it before the kernel before it has finished, and it
waits inside (pc_grid_dependency_wait, griddepcontrol.wait in cuda/prelude.cuh) until that kernel has completed and
its writes are visible. Nothing is read before the wait, so the order of every memory access is the ordinary one;
what goes is the gap between the two kernels. PORTCONV_CUDA_PDL=0 (knobs.env().cuda_pdl), an older GPU, a driver
without cuLaunchKernelEx or a kernel set whose prelude does not wait (HIP's): the ordinary launch.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable

import numpy as np

from ... import knobs
from ...device import DeviceInfo, torch_cuda
from ...errors import VendorImportError
from ...problem import Layout
from ..program import OPERANDS, Buffer, Launch, Program
from . import nvidia
from .compile import FORK, import_cupy, is_hip
from .view import ARG_COUNT

_CUDA_ERROR_INVALID_CONTEXT = 201
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_BLOCK = ctypes.c_int64 * ARG_COUNT
_VOID = np.dtype((np.void, 8 * ARG_COUNT))


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]


class DriverLaunch:
    """cuLaunchKernel (and cuLaunchKernelEx) from libcuda, for kernels whose one parameter is the argument block."""

    def __init__(self, lib):
        self.lib = lib  # nvidia.Driver's libcuda
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p,
                                                                            ctypes.c_void_p, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._launch_ex = getattr(lib, "cuLaunchKernelEx", None)  # CUDA 12.0 drivers and newer
        address = lambda f: 0 if f is None else ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        # the native executor's entry points (Note [native executor]), in executor.cpp's Driver order
        self.addresses = tuple(address(f) for f in (self._launch, self._launch_ex, lib.cuCtxGetCurrent,
                                                     lib.cuCtxSetCurrent, lib.cuGetErrorName))
        if self._launch_ex is not None:
            self._launch_ex.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
            self._launch_ex.restype = ctypes.c_int
        self.has_ex = self._launch_ex is not None

    @staticmethod
    def head_ex(fn_ptr: int, grid, block) -> tuple:
        """cuLaunchKernelEx's configuration of a dependent launch (its stream set at each call) and function."""
        attr = _LaunchAttribute(_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), 0, None, ctypes.pointer(attr), 1)
        return "ex", cfg, attr, ctypes.c_void_p(fn_ptr)

    @staticmethod
    def head(fn_ptr: int, grid, block) -> tuple:
        """cuLaunchKernel's leading arguments (function, grid, block, no dynamic shared memory) as ctypes values."""
        u = ctypes.c_uint
        return ctypes.c_void_p(fn_ptr), u(grid[0]), u(grid[1]), u(grid[2]), u(block[0]), u(block[1]), u(block[2]), u(0)

    def _go(self, head: tuple, stream: int, pp) -> int:
        if head[0] == "ex":
            head[1].stream = stream
            return self._launch_ex(ctypes.byref(head[1]), head[3], pp, None)
        return self._launch(*head, stream, pp, None)

    def __call__(self, head: tuple, block_args, stream: int, device: int) -> None:
        """Launch with ``head`` (head() or, for a dependent launch, head_ex())."""
        pp = ctypes.byref(ctypes.c_void_p(ctypes.addressof(block_args)))
        err = self._go(head, stream, pp)
        if err == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never made the device's context current
            nvidia.driver().make_current(device)
            err = self._go(head, stream, pp)
        if err:
            what = "cuLaunchKernelEx (Note [dependent launch])" if head[0] == "ex" else "cuLaunchKernel"
            nvidia.check(self.lib, what, err)


_driver: DriverLaunch | bool | None = None
_driver_lock = threading.Lock()


def driver_launch() -> DriverLaunch | None:
    """The CUDA driver's launch (on nvidia.driver()'s libcuda), or None where libcuda cannot be loaded."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                try:
                    _driver = DriverLaunch(nvidia.driver().lib)
                except (VendorImportError, RuntimeError, AttributeError):  # no libcuda, or no usable device
                    _driver = False
    return _driver or None


_device_infos: dict[tuple[str, int], DeviceInfo] = {}


def device_info(kind: str, index: int) -> DeviceInfo:
    """DeviceInfo of a GPU that torch (kind 'torch') or only CuPy (kind 'cupy') sees; cached per index."""
    if kind == "torch":
        return torch_cuda(index)
    if index not in _device_infos:
        _device_infos[index] = _from_cupy(index)
    return _device_infos[index]


def _from_cupy(index: int) -> DeviceInfo:
    cupy = import_cupy()
    rt = cupy.cuda.runtime
    p = rt.getDeviceProperties(index)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    hip = is_hip(cupy)
    arch = (p.get("gcnArchName", b"").decode().split(":")[0] if hip else f"sm_{p['major']}{p['minor']}")
    versions = (("cuda-runtime" if not hip else "hip-runtime", str(rt.runtimeGetVersion())),
                ("driver", str(rt.driverGetVersion())), ("cupy", cupy.__version__))
    return DeviceInfo(vendor="amd" if hip else "nvidia", kind="gpu", name=name, arch=arch,
                      runtime="hip" if hip else "cuda", wavefront=int(p.get("warpSize", 64 if hip else 32)),
                      compute_units=int(p["multiProcessorCount"]), memory_bytes=int(p["totalGlobalMem"]),
                      local_mem_bytes=int(p["sharedMemPerBlock"]), max_work_group=int(p["maxThreadsPerBlock"]),
                      fp64=True, fp16=True, bf16=hip or p["major"] >= 8, versions=versions, index=f"cuda:{index}")


_streams: dict[tuple[int, int], object] = {}


def external_stream(cupy, ptr: int, device: int):
    """A CuPy stream object for a raw stream handle (cached: CuPy's launch takes only its own stream objects)."""
    key = (ptr, device)
    s = _streams.get(key)
    if s is None:
        with warnings.catch_warnings():  # ExternalStream is deprecated from CuPy 14 in favour of from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _streams[key] = cupy.cuda.ExternalStream(ptr, device)
    return s


class Executable:
    """One loaded Program: a call allocates its buffers (results NaN-poisoned under PORTCONV_POISON), copies each
    launch's argument block, writes its Binds' addresses and hands the call's launches, in order, to ``go`` with the
    caller's stream; it returns the results."""

    __slots__ = ("allocs", "steps", "outputs", "ptr", "stream", "go")

    def __init__(self, allocs, steps, outputs, ptr, stream, go):
        self.allocs = allocs  # ((role, alloc(poison) -> tensor, is a result), ...)
        self.steps = steps  # ((argument block template, ((slot, role), ...), head), ...)
        self.outputs, self.ptr, self.stream = outputs, ptr, stream
        self.go = go  # go(((head, argument block), ...), stream): the launches of one call

    def __call__(self, values: dict) -> tuple:
        FORK.check("CUDA/HIP kernels")  # Note [fork]: a plan loaded before the fork
        vals = dict(values)
        poison = knobs.env().poison
        for role, alloc, result in self.allocs:
            vals[role] = alloc(poison and result)
        ptr = self.ptr
        addr = {role: ptr(v) for role, v in vals.items() if v is not None}
        launches = []
        for template, slots, head in self.steps:
            a = template.__class__.from_buffer_copy(template)
            for i, role in slots:
                a[i] = addr[role]
            launches.append((head, a))
        self.go(launches, self.stream())
        return tuple(None if r is None else vals[r] for r in self.outputs)


def native_parts(program: Program, launch_of: Callable[[Launch], tuple[int, int, int]],
                 always_nan: bool = False) -> tuple[list, list, list]:
    """A Program as the native Executable takes it (Note [native executor]): roles as numbers (the operands, then the
    buffers), buffers (role, shape, strides, dtype, result, always NaN), steps (argument block, binds, then
    ``launch_of``'s function address, kind and emulator launch; grid, block between), outputs (role or -1)."""
    roles = {r: i for i, r in enumerate(OPERANDS)}
    roles.update((b.role, len(OPERANDS) + i) for i, b in enumerate(program.buffers))
    buffers = [(roles[b.role], b.shape, b.strides, b.dtype, b.result, always_nan and not b.result)
               for b in program.buffers]
    steps = []
    for x in program.launches:
        fn, kind, emu = launch_of(x)
        args = list(x.args) + [0] * (ARG_COUNT - len(x.args))
        steps.append((args, [(b.slot, roles[b.role]) for b in x.binds], fn, x.grid, x.block, kind, emu))
    return buffers, steps, [-1 if r is None else roles[r] for r in program.outputs]


class Loader:
    """program.Loader of the simt set: a Program's kernels fetched from the kernel set, its launch heads and blocks
    made once; memory from torch (``memory`` 'torch') or CuPy ('cupy'), launches through the driver on NVIDIA (no
    CuPy for torch tensors: Note [ctypes toolchain]), through CuPy on AMD."""

    def __init__(self, kernels, memory: str):
        self.kernels, self.memory = kernels, memory
        amd = kernels.platform == "amd"
        self.cupy = import_cupy(kernels.pip_hint) if memory == "cupy" or amd else None
        self.driver = self.nv = None
        if not amd:
            self.nv = nvidia.driver()  # VendorImportError where libcuda cannot be loaded
            self.driver = driver_launch()
        if memory == "torch":
            import torch

            self.torch = torch

    # --- memory ---------------------------------------------------------------------------------------------
    def key(self, t) -> tuple | None:
        """What layout() depends on for an operand of a plan (its shape is the plan's), as cheap as the old replay's
        key: element strides and the address modulo 16 bytes."""
        if t is None:
            return None
        if self.memory == "torch":
            return t.stride(), t.data_ptr() & 15
        return t.strides, t.data.ptr & 15

    def layout(self, t) -> Layout | None:
        if t is None:
            return None
        if self.memory == "torch":
            return Layout(tuple(t.shape), t.stride(), t.data_ptr() & 15)
        item = t.dtype.itemsize
        return Layout(t.shape, tuple(s // item for s in t.strides), t.data.ptr & 15)

    def _device(self, anchor) -> int:
        if self.memory == "torch":
            idx = anchor.device.index
            return idx if idx is not None else self.torch.cuda.current_device()
        return anchor.device.id

    def _alloc(self, b: Buffer, device: int):
        shape, strides = b.shape, b.strides
        if self.memory == "torch":
            torch = self.torch
            dtype, dev = getattr(torch, b.dtype), torch.device("cuda", device)

            def alloc(poison: bool):
                t = torch.empty_strided(shape, strides, dtype=dtype, device=dev)
                return t.fill_(float("nan")) if poison else t
            return alloc
        cp = self.cupy
        dt = cp.dtype(b.dtype)
        n = max(1, int(np.prod(shape, dtype=np.int64)))
        byte_strides = tuple(s * dt.itemsize for s in strides)

        def alloc_cupy(poison: bool):
            with cp.cuda.Device(device):
                a = cp.ndarray(shape, dtype=dt, memptr=cp.cuda.alloc(n * dt.itemsize), strides=byte_strides)
                if poison:
                    a.fill(float("nan"))
            return a
        return alloc_cupy

    def _stream(self, device: int):
        if self.memory == "torch":
            raw = self.torch._C._cuda_getCurrentRawStream
            return lambda: raw(device)
        get = self.cupy.cuda.get_current_stream
        return lambda: get(device).ptr

    # --- launches --------------------------------------------------------------------------------------------
    def prefetch(self, program: Program, anchor) -> None:
        self.kernels.prefetch([x.module for x in program.launches], self._device(anchor))

    def load(self, program: Program, anchor) -> Executable:
        FORK.check("CUDA/HIP kernels")  # Note [fork]: a plan made before the fork reads the device here
        device = self._device(anchor)
        pdl = self._pdl(device)
        steps = []
        for x in program.launches:
            fn = self.kernels.function(x.module, device, x.kernel)
            steps.append((_BLOCK(*x.args), tuple((b.slot, b.role) for b in x.binds), self._head(fn, x, pdl)))
        allocs = tuple((b.role, self._alloc(b, device), b.result) for b in program.buffers)
        ptr = (lambda t: t.data_ptr()) if self.memory == "torch" else (lambda a: a.data.ptr)
        return Executable(allocs, steps, program.outputs, ptr, self._stream(device), self._go(device))

    def _pdl(self, device: int) -> bool:
        """Whether dependent launches go out with programmatic stream serialization (Note [dependent launch])."""
        return (self.driver is not None and self.driver.has_ex and knobs.env().cuda_pdl
                and self.nv.compute_capability(device) >= 90)

    @property
    def supports_native(self) -> bool:
        """The native executor can run this loader's Programs: torch tensors, launched through NVIDIA's driver."""
        return self.memory == "torch" and self.driver is not None

    def load_native(self, program: Program, anchor, poison: bool):
        """load(), as the native executor's Executable (Note [native executor])."""
        from ... import native

        FORK.check("CUDA/HIP kernels")
        device = self._device(anchor)
        pdl = self._pdl(device)

        def launch_of(x: Launch) -> tuple[int, int, int]:
            return self.kernels.function(x.module, device, x.kernel).ptr, int(pdl and x.dependent), 0
        parts = native_parts(program, launch_of)
        return native.executable(device, self.nv.primary(device), *parts, self.driver.addresses, poison, FORK.check)

    def _head(self, fn, x: Launch, pdl: bool) -> tuple:
        d = self.driver
        if d is None:
            return None, fn, x.grid, x.block
        head = d.head_ex(fn.ptr, x.grid, x.block) if pdl and x.dependent else d.head(fn.ptr, x.grid, x.block)
        return head, fn, x.grid, x.block

    def _go(self, device: int):
        """The launcher of one call's launches: CuPy's on AMD; the driver's on NVIDIA, in the device's primary
        context, made current for the call where another (or none) is current on this thread."""
        d = self.driver
        if d is None:
            cupy = self.cupy

            def cupy_launch(launches, stream):
                s = external_stream(cupy, stream, device)
                with cupy.cuda.Device(device):
                    for head, a in launches:
                        args = np.frombuffer(a, dtype=np.int64).copy().view(_VOID)
                        head[1](head[2], head[3], (args,), stream=s)
            return cupy_launch
        nv = self.nv
        ctx, current = nv.primary(device), nv.current

        def go(launches, stream):
            if current() == ctx:
                for head, a in launches:
                    d(head[0], a, stream, device)
                return
            old = nv.make_current(device)
            try:
                for head, a in launches:
                    d(head[0], a, stream, device)
            finally:
                nv.restore(old)
        return go
