"""The CuPy runtime layer shared by the cuda and hip backends: compile cache, devices, streams, tensor interop."""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import pathlib
import re
import threading
import time
import warnings

from .. import knobs, sources
from ..device import DeviceInfo
from ..errors import VendorImportError
from . import _replay

CUDA_PIP_HINT = "pip install portconv[cuda12]  (CUDA 12 driver) or  pip install portconv[cuda13]  (CUDA 13 driver)"


def import_cupy(pip_hint: str = CUDA_PIP_HINT):
    """Import CuPy or raise VendorImportError naming the pip extra."""
    try:
        import cupy
    except ImportError as e:
        raise VendorImportError(f"CuPy is not installed ({e}); {pip_hint}") from e
    return cupy


def is_hip(cupy) -> bool:
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


# --- kernel sources ----------------------------------------------------------------------------------------

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def inline_source(entry: str, folders: list[pathlib.Path], overrides: dict[str, pathlib.Path] | None = None) -> str:
    """``entry`` with every quoted #include replaced by the file's text (each file once, #pragma once).

    Note [inlined sources]: the compiler sees one self-contained text, so the cache key (a hash of that text)
    covers every header, NVRTC/hiprtc need no include path (hiprtc ignores -I for some headers), and a second
    kernel set reuses these bodies by putting its own prelude earlier in ``folders`` or in ``overrides``.
    """
    overrides = overrides or {}
    seen: set[pathlib.Path] = set()

    def find(name: str) -> pathlib.Path:
        if name in overrides:
            return overrides[name]
        for f in folders:
            if (f / name).is_file():
                return f / name
        raise FileNotFoundError(f"kernel source {name!r} not found in {', '.join(map(str, folders))}")

    def expand(path: pathlib.Path) -> str:
        path = path.resolve()
        if path in seen:
            return ""
        seen.add(path)
        text = path.read_text().replace("#pragma once", "")
        out = [f'#line 1 "{path.name}"']
        pos = 0
        for mt in _INCLUDE.finditer(text):
            out.append(text[pos:mt.start()])
            out.append(expand(find(mt.group(1))))
            line = text.count("\n", 0, mt.end()) + 1
            out.append(f'\n#line {line + 1} "{path.name}"')
            pos = mt.end()
        out.append(text[pos:])
        return "\n".join(out)

    return expand(find(entry))


# --- compiling and caching modules ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One module made ready for a device: compiled now ('nvrtc'/'hiprtc') or read back ('disk')."""

    entry: str
    defines: tuple[tuple[str, str], ...]
    arch: str
    how: str
    seconds: float
    device: int


_events: list[CompileEvent] = []


def compile_events() -> list[CompileEvent]:
    """Every module load so far in this process (the CLI's ``--time`` prints the first call's compile time)."""
    return list(_events)


class KernelSet:
    """One kernel-source set compiled at run time with NVRTC (or hiprtc): modules cached in memory and on disk.

    ``folders`` are searched in order for quoted includes; the HIP backend passes its own folder first so its
    prelude wins, then cuda/ for the shared bodies.
    """

    vendor = "cuda"
    compiler = "nvrtc"

    def __init__(self, folders: list[pathlib.Path] | None = None, overrides: dict[str, pathlib.Path] | None = None,
                 options: tuple[str, ...] = ("-std=c++17",), pip_hint: str = CUDA_PIP_HINT):
        self.folders = folders or [sources.folder("cuda")]
        self.overrides = overrides or {}
        self.options = options
        self.pip_hint = pip_hint
        self._modules: dict[tuple, object] = {}
        self._functions: dict[tuple, object] = {}
        self._texts: dict[str, str] = {}
        self._lock = threading.Lock()

    # the parts a vendor overrides ------------------------------------------------------------------------
    def compiler_version(self) -> str:
        cupy = import_cupy(self.pip_hint)
        return ".".join(map(str, cupy.cuda.nvrtc.getVersion()))

    def arch_options(self, device: int) -> tuple[str, tuple[str, ...], str]:
        """(arch name, arch options, binary kind) for a device: a cubin where NVRTC knows the arch, else PTX."""
        cupy = import_cupy(self.pip_hint)
        cc = int(cupy.cuda.Device(device).compute_capability)
        supported = sorted(cupy.cuda.nvrtc.getSupportedArchs())
        if cc in supported:
            return f"sm_{cc}", (f"-arch=sm_{cc}",), "cubin"
        best = max([a for a in supported if a <= cc] or supported[:1])
        return f"sm_{cc}", (f"-arch=compute_{best}",), "ptx"

    def build(self, text: str, name: str, options: tuple[str, ...], kind: str) -> bytes:
        cupy = import_cupy(self.pip_hint)
        nvrtc = cupy.cuda.nvrtc
        prog = nvrtc.createProgram(text, name, [], [])
        try:
            try:
                nvrtc.compileProgram(prog, list(options))
            except nvrtc.NVRTCError as e:
                log = nvrtc.getProgramLog(prog)
                raise RuntimeError(f"{self.compiler} failed to compile {name} {' '.join(options)}:\n{log}") from e
            if kind == "cubin":
                return nvrtc.getCUBIN(prog)
            return nvrtc.getPTX(prog) + b"\0"  # the driver's loader reads PTX as a C string
        finally:
            nvrtc.destroyProgram(prog)

    # the shared machinery ----------------------------------------------------------------------------------
    def text(self, entry: str) -> str:
        if entry not in self._texts:
            self._texts[entry] = inline_source(entry, self.folders, self.overrides)
        return self._texts[entry]

    def module(self, entry: str, defines: dict[str, object], device: int):
        """The loaded module of ``entry`` with ``defines`` on ``device`` (compiled once, then from cache)."""
        dkey = tuple(sorted((k, str(v)) for k, v in defines.items()))
        mkey = (entry, dkey, device)
        mod = self._modules.get(mkey)
        if mod is not None:
            return mod
        with self._lock:
            mod = self._modules.get(mkey)
            if mod is None:
                mod = self._load(entry, dkey, device)
                self._modules[mkey] = mod
        return mod

    def function(self, entry: str, defines: dict[str, object], device: int, name: str):
        fkey = (entry, tuple(sorted((k, str(v)) for k, v in defines.items())), device, name)
        fn = self._functions.get(fkey)
        if fn is None:
            fn = self.module(entry, defines, device).get_function(name)
            self._functions[fkey] = fn
        return fn

    def cache_path(self, key: str) -> pathlib.Path:
        return pathlib.Path(knobs.cache_dir()) / self.vendor / f"{key}.bin"

    def _load(self, entry: str, dkey: tuple, device: int):
        cupy = import_cupy(self.pip_hint)
        t0 = time.perf_counter()
        arch, arch_opts, kind = self.arch_options(device)
        options = tuple(self.options) + arch_opts + tuple(f"-D{k}={v}" for k, v in dkey)
        text = self.text(entry)
        h = hashlib.sha256()
        for part in (self.vendor, self.compiler, self.compiler_version(), arch, kind, " ".join(options), text):
            h.update(part.encode())
            h.update(b"\0")
        key = h.hexdigest()[:32]
        path = self.cache_path(key)
        binary, how = None, "disk"
        if path.is_file():
            binary = path.read_bytes()
        if not binary:
            binary, how = self.build(text, entry, options, kind), self.compiler
            _write_atomic(path, binary)
        with cupy.cuda.Device(device):
            mod = cupy.cuda.function.Module()
            mod.load(binary)
        _events.append(CompileEvent(entry, dkey, arch, how, time.perf_counter() - t0, device))
        return mod


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent processes never read half a binary."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache directory costs a recompile next process, never a failure
        warnings.warn(f"portconv: cannot write the kernel cache {path}: {e}", RuntimeWarning, stacklevel=3)


# --- devices -----------------------------------------------------------------------------------------------------

_device_infos: dict[tuple[str, int], DeviceInfo] = {}


def device_info(kind: str, index: int) -> DeviceInfo:
    """DeviceInfo of a GPU that torch (kind 'torch') or only CuPy (kind 'cupy') sees; cached per index."""
    key = (kind, index)
    if key not in _device_infos:
        if kind == "torch":
            from ..device import from_torch_cuda

            _device_infos[key] = from_torch_cuda(index)
        else:
            _device_infos[key] = _from_cupy(index)
    return _device_infos[key]


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


# --- tensors in, tensors out ----------------------------------------------------------------------------------

_streams: dict[tuple[int, int], object] = {}


def _external_stream(cupy, ptr: int, device: int):
    key = (ptr, device)
    s = _streams.get(key)
    if s is None:
        with warnings.catch_warnings():  # ExternalStream is deprecated from CuPy 14 in favour of from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(ptr, device)
        _streams[key] = s
    return s


def _torch_ptr(t) -> int:
    return t.data_ptr()


class Tensors:
    """Raw pointers, allocation and the launch stream for the arrays of one plan's calls (torch CUDA tensors or
    CuPy arrays on one device).

    Note [zero copy]: kernels get raw device addresses and element strides, so inputs are read in place
    whatever their layout, and outputs are allocated by the caller's library (torch's caching allocator or
    CuPy's pool) in the layout the plan chose. Work is queued on the caller's current stream of the tensors'
    device, read at every launch: torch.cuda.current_stream(device) for torch tensors, CuPy's current stream for
    CuPy arrays.
    """

    def __init__(self, like, pip_hint: str = CUDA_PIP_HINT):
        self.cupy = import_cupy(pip_hint)
        self.is_torch = (type(like).__module__ or "").startswith("torch")
        self.hip = is_hip(self.cupy)
        if self.is_torch:
            import torch

            self.torch = torch
            self.device = like.device.index if like.device.index is not None else torch.cuda.current_device()
            self.torch_device = torch.device("cuda", self.device)
            self._raw_stream = torch._C._cuda_getCurrentRawStream
        else:
            self.device = like.device.id
        self._driver = None if self.hip else _replay.driver_launch()
        self.ptr_of = _torch_ptr if self.is_torch else self.ptr  # a tensor's device address (replayed calls)
        self.rec: _replay.Recording | None = None  # set while a call is recorded (Note [replayed launches])
        self.replayable = self.is_torch

    @staticmethod
    def ptr(x) -> int:
        if x is None:
            return 0
        return x.data_ptr() if (type(x).__module__ or "").startswith("torch") else x.data.ptr

    def raw_stream(self) -> int:
        """The caller's current stream on the device, as a raw handle."""
        if self.is_torch:
            return self._raw_stream(self.device)
        return self.cupy.cuda.get_current_stream(self.device).ptr

    @property
    def stream(self):
        """The caller's current stream as a CuPy stream object."""
        if self.is_torch:
            return _external_stream(self.cupy, self.raw_stream(), self.device)
        return self.cupy.cuda.get_current_stream(self.device)

    def empty(self, shape, strides, dtype: str, poison: bool = False):
        """A new array of ``shape`` with element ``strides`` (a dense permutation) and dtype name."""
        if self.is_torch:
            t = self.torch.empty_strided(tuple(shape), tuple(strides), dtype=getattr(self.torch, dtype),
                                         device=self.torch_device)
            t = t.fill_(float("nan")) if poison else t
            return t if self.rec is None else self.rec.allocated(t, "empty", (shape, strides, dtype))
        assert self.rec is None, "CuPy arrays are not recorded"
        cp = self.cupy
        with cp.cuda.Device(self.device):
            dt = cp.dtype(dtype)
            n = 1
            for s in shape:
                n *= s
            mem = cp.cuda.alloc(max(n, 1) * dt.itemsize)
            a = cp.ndarray(tuple(shape), dtype=dt, memptr=mem, strides=tuple(s * dt.itemsize for s in strides))
            if poison:
                a.fill(float("nan"))
            return a

    def workspace(self, count: int, double: bool):
        """Scratch space for partial sums (float64 for float64 problems, float32 otherwise)."""
        if self.is_torch:
            t = self.torch.empty(count, dtype=self.torch.float64 if double else self.torch.float32,
                                 device=self.torch_device)
            return t if self.rec is None else self.rec.allocated(t, "workspace", (count, double))
        with self.cupy.cuda.Device(self.device):
            return self.cupy.empty(count, dtype="float64" if double else "float32")

    def launch(self, fn, grid: tuple[int, int, int], block: int, args, dependent: bool = False) -> None:
        """``dependent``: the kernel waits for the launch before it (Note [dependent launch]; replays only)."""
        with self.cupy.cuda.Device(self.device):
            fn(grid, (block, 1, 1), (args,), stream=self.stream)
        if self.rec is not None:
            self.rec.launched(fn, grid, block, args, dependent)

    def launch_head(self, fn, grid: tuple[int, int, int], block: int, dependent: bool = False) -> tuple | None:
        """What launch_block may take as ``head``: the driver's converted leading arguments (of a launch with
        programmatic stream serialization where ``dependent`` and the device takes it), or None."""
        if self._driver is None:
            return None
        if dependent and self._driver.pdl and int(self.cupy.cuda.Device(self.device).compute_capability) >= 90:
            return self._driver.head_ex(fn.ptr, grid, block)
        return self._driver.head(fn.ptr, grid, block)

    def launch_block(self, fn, grid: tuple[int, int, int], block: int, block_args, stream: int,
                     head: tuple | None = None) -> None:
        """Launch ``fn`` with one argument block (a ctypes array) on the raw ``stream`` (Note [replayed launches]);
        ``head``: launch_head(fn, grid, block), if the caller keeps it."""
        if self._driver is not None and self.cupy.cuda.runtime.getDevice() == self.device:
            self._driver(head or self._driver.head(fn.ptr, grid, block), block_args, stream, self.device)
            return
        import numpy as np

        args = np.frombuffer(block_args, dtype=np.int64).copy().view(np.dtype((np.void, ctypes.sizeof(block_args))))
        with self.cupy.cuda.Device(self.device):
            s = (_external_stream(self.cupy, stream, self.device) if self.is_torch
                 else self.cupy.cuda.get_current_stream(self.device))
            fn(grid, (block, 1, 1), (args,), stream=s)
