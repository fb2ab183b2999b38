"""NVIDIA's compiler and driver through ctypes: libnvrtc and libcuda, without CuPy (Note [ctypes toolchain]).

Note [ctypes toolchain]: on NVIDIA the cuda set (and the hip set through its NVIDIA prelude) compiles with libnvrtc,
loads modules and launches through libcuda, both by ctypes: a plan on torch tensors never imports CuPy (0.15-0.2 s
of a process's first step) and needs no CuPy installed. CuPy is only the memory and streams of CuPy arrays, and the
whole runtime on AMD (hiprtc and HIP through CuPy for ROCm). libnvrtc is looked for where torch's and CuPy's wheels
put it (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), then under CUDA_PATH / CUDA_HOME, /usr/local/cuda and the loader's
own path, and only where none of those has one, where cuda-pathfinder finds it; of those found, the newest whose
CUDA major the driver runs. Modules load into the device's primary context, the one the CUDA runtime (torch, CuPy)
uses, made current for the load and restored after.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import threading

from ...errors import BackendUnavailable, VendorImportError
from .compile import FORK

NVRTC_PIP_HINT = ("pip install nvidia-cuda-nvrtc  (CUDA 13; nvidia-cuda-nvrtc-cu12 for CUDA 12), or set CUDA_PATH "
                  "to a CUDA toolkit")
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # CUdevice_attribute


def check(lib, what: str, rc: int) -> None:
    """Raise RuntimeError naming ``what`` and the driver's error name where ``rc`` (a CUresult) is not 0."""
    if rc:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


class Driver:
    """libcuda's module, context and attribute calls (launches: runtime.DriverLaunch, on this ``lib``)."""

    def __init__(self):
        FORK.use("cuda/hip backends")
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise VendorImportError(f"the NVIDIA driver (libcuda.so.1) cannot be loaded: {e}") from e
        check(self.lib, "cuInit", self.lib.cuInit(0))
        v = ctypes.c_int()
        check(self.lib, "cuDriverGetVersion", self.lib.cuDriverGetVersion(ctypes.byref(v)))
        self.version = v.value  # 13000 for CUDA 13.0
        self._primary: dict[int, ctypes.c_void_p] = {}
        self._cc: dict[int, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._get_current = self.lib.cuCtxGetCurrent

    def device_count(self) -> int:
        n = ctypes.c_int()
        check(self.lib, "cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def handle(self, device: int) -> int:
        """The CUdevice of a device ordinal (the runtime's, torch's and CuPy's index)."""
        dev = ctypes.c_int()
        check(self.lib, "cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), device))
        return dev.value

    def compute_capability(self, device: int) -> int:
        """85 for 8.5: major * 10 + minor (asked once a device)."""
        cc = self._cc.get(device)
        if cc is None:
            dev, major, minor = self.handle(device), ctypes.c_int(), ctypes.c_int()
            for out, attr in ((major, _ATTR_CC_MAJOR), (minor, _ATTR_CC_MINOR)):
                check(self.lib, "cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(ctypes.byref(out), attr, dev))
            cc = self._cc[device] = major.value * 10 + minor.value
        return cc

    def primary(self, device: int) -> int:
        """The device's primary context (retained once, for the process's life)."""
        ctx = self._primary.get(device)
        if ctx is None:
            with self._lock:
                ctx = self._primary.get(device)
                if ctx is None:
                    ctx = ctypes.c_void_p()
                    check(self.lib, "cuDevicePrimaryCtxRetain",
                           self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.handle(device)))
                    self._primary[device] = ctx
        return ctx.value

    def current(self) -> int | None:
        """This thread's current context (once a call: runtime.Loader's launcher asks it)."""
        local = self._local
        ctx = getattr(local, "ctx", None)
        if ctx is None:
            ctx = local.ctx = ctypes.c_void_p()
        rc = self._get_current(ctypes.byref(ctx))
        if rc:
            check(self.lib, "cuCtxGetCurrent", rc)
        return ctx.value

    def make_current(self, device: int) -> int | None:
        """Make ``device``'s primary context current on this thread; returns the context it replaced."""
        old = self.current()
        ctx = self.primary(device)
        if old != ctx:
            check(self.lib, "cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctypes.c_void_p(ctx)))
        return old

    def restore(self, old: int | None) -> None:
        if old != self.current():
            check(self.lib, "cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctypes.c_void_p(old)))

    def load(self, binary: bytes, device: int) -> Module:
        """A cubin or (NUL-terminated) PTX image loaded into ``device``'s primary context."""
        old = self.make_current(device)
        try:
            mod = ctypes.c_void_p()
            check(self.lib, "cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(mod), binary))
        finally:
            self.restore(old)
        return Module(self.lib, mod.value)


class Function:
    """A kernel of a loaded module: ``ptr`` is its CUfunction."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class Module:
    """A loaded module (never unloaded: its functions live as long as the plans that launch them)."""

    def __init__(self, lib, handle: int):
        self.lib, self.handle = lib, handle

    def get_function(self, name: str) -> Function:
        fn = ctypes.c_void_p()
        check(self.lib, f"cuModuleGetFunction({name})",
               self.lib.cuModuleGetFunction(ctypes.byref(fn), ctypes.c_void_p(self.handle), name.encode()))
        return Function(fn.value)


class Nvrtc:
    """libnvrtc: version, architectures, and a program built to a cubin or PTX."""

    def __init__(self, path: str):
        self.path = path
        for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
            if "alt" not in os.path.basename(b):
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)  # NVRTC opens it by name at compile time
        self.lib = ctypes.CDLL(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._ok(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        self._archs: list[int] | None = None

    def _ok(self, rc: int, what: str) -> None:
        if rc:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(rc).decode()} ({rc})")

    def archs(self) -> list[int]:
        """The architectures this NVRTC builds for (asked once)."""
        if self._archs is None:
            n = ctypes.c_int()
            self._ok(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
            out = (ctypes.c_int * n.value)()
            self._ok(self.lib.nvrtcGetSupportedArchs(out), "nvrtcGetSupportedArchs")
            self._archs = sorted(out)
        return self._archs

    def compile(self, text: str, name: str, options: list[str], kind: str = "cubin") -> tuple[int, str, bytes]:
        """(NVRTC's return code, its log, the cubin or NUL-terminated PTX; empty where the build failed)."""
        lib, prog = self.lib, ctypes.c_void_p()
        self._ok(lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None),
                 "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
            rc = lib.nvrtcCompileProgram(prog, len(options), opts)  # releases the GIL: ctypes calls do
            size = ctypes.c_size_t()
            self._ok(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(size.value)
            self._ok(lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            if rc:
                return rc, log.value.decode(errors="replace"), b""
            get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if kind == "cubin"
                             else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
            self._ok(get_size(prog, ctypes.byref(size)), "nvrtc size")
            code = ctypes.create_string_buffer(size.value)
            self._ok(get(prog, code), "nvrtc code")
            raw = code.raw
            return 0, log.value.decode(errors="replace"), raw if kind == "cubin" else raw.rstrip(b"\0") + b"\0"
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc_candidates() -> list[str]:
    """Every libnvrtc.so.<major> found, in the search order of Note [ctypes toolchain]."""
    roots = []
    try:
        import nvidia  # the namespace package of NVIDIA's wheels (no code runs)

        roots += [os.path.join(r, "*", "lib") for r in nvidia.__path__]
    except ImportError:
        pass
    for top in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):  # the toolkit's own
        if top:
            roots += [os.path.join(top, "lib64"), os.path.join(top, "lib")]
    found = [p for r in roots for p in sorted(glob.glob(os.path.join(r, "libnvrtc.so.*")))
             if re.fullmatch(r"libnvrtc\.so\.\d+(\.\d+)*", os.path.basename(p))]
    named = ctypes.util.find_library("nvrtc")
    return list(dict.fromkeys(found + ([named] if named else []) + ([] if found or named else _pathfinder())))


def _pathfinder() -> list[str]:
    """Where NVIDIA's cuda-pathfinder (CuPy 14's finder: conda environments and more) finds libnvrtc, if it is
    installed."""
    try:
        from cuda import pathfinder
    except ImportError:
        return []
    try:
        path = pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:  # noqa: BLE001 - any failure of an optional finder means it found nothing
        return []
    return [path] if path else []


def pick_nvrtc(paths: list[str], driver_major: int | None) -> str | None:
    """The newest libnvrtc whose CUDA major the driver runs (any, where the driver is unknown)."""
    def major(p: str) -> int:
        m = re.search(r"libnvrtc\.so\.(\d+)", os.path.basename(p))
        return int(m.group(1)) if m else 0

    fits = [p for p in paths if driver_major is None or major(p) <= driver_major]
    return max(fits, key=major, default=None)


_driver: Driver | None = None
_nvrtc: Nvrtc | None = None
_lock = threading.Lock()


def driver() -> Driver:
    """The process's Driver (VendorImportError without libcuda; BackendUnavailable in a forked child)."""
    global _driver
    FORK.check("cuda/hip backends")
    if _driver is None:
        with _lock:
            if _driver is None:
                _driver = Driver()
    return _driver


def nvrtc(driver_version: int | None = None) -> Nvrtc:
    """The process's NVRTC (VendorImportError naming what to install where none is found)."""
    global _nvrtc
    if _nvrtc is None:
        with _lock:
            if _nvrtc is None:
                major = None if driver_version is None else driver_version // 1000
                path = pick_nvrtc(nvrtc_candidates(), major)
                if path is None:
                    raise VendorImportError(f"libnvrtc (NVIDIA's runtime compiler) was not found; {NVRTC_PIP_HINT}")
                try:
                    _nvrtc = Nvrtc(path)
                except OSError as e:
                    raise VendorImportError(f"libnvrtc at {path} cannot be loaded ({e}); {NVRTC_PIP_HINT}") from e
    return _nvrtc


def availability() -> tuple[bool, str]:
    """(usable, why): the driver, a device and NVRTC, as the cuda and hip backends' probes report them."""
    try:
        drv = driver()
        n = drv.device_count()
        rtc = nvrtc(drv.version)
    except (VendorImportError, BackendUnavailable) as e:  # BackendUnavailable: a forked child (Note [fork])
        return False, str(e)
    except RuntimeError as e:
        return False, f"no usable CUDA device or driver: {e}"
    if n == 0:
        return False, "CUDA reports no device"
    v = drv.version
    return True, (f"NVRTC {rtc.version[0]}.{rtc.version[1]} ({os.path.basename(rtc.path)}), CUDA driver "
                  f"{v // 1000}.{v % 1000 // 10}, {n} CUDA device(s)")
