"""Kernel sources inlined, compiled at run time (NVRTC; hiprtc in hip.py) and cached in memory and on disk."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import importlib.util
import os
import pathlib
import queue
import re
import sys
import threading
import time

from ... import diskcache, forks, knobs, sources
from ...errors import VendorImportError
from ..program import Module

CUDA_PIP_HINT = "pip install portconv[cuda12]  (CUDA 12 driver) or  pip install portconv[cuda13]  (CUDA 13 driver)"


def _torch_initialised_cuda() -> bool:
    """Note [fork]: in a child, whether torch had initialised CUDA (or ROCm) in the parent: one driver per process.
    A process that never imported torch (CuPy arrays only) did not."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda._is_in_bad_fork()


# Note [fork]: the cuda and hip backends reach the runtime first through nvidia.driver() (NVIDIA) or import_cupy()
# (CuPy arrays, ROCm), each of which marks it used; what a plan loaded before a fork runs is checked at load and
# launch (runtime.py).
FORK = forks.RuntimeGuard("the CUDA/HIP runtime", "neither CUDA nor ROCm can run in a child forked after the "
                          "driver was initialised", inherited=_torch_initialised_cuda)


def import_cupy(pip_hint: str = CUDA_PIP_HINT):
    """CuPy, for a call into the CUDA/HIP runtime: BackendUnavailable in a forked child (Note [fork]), else the
    runtime marked used; VendorImportError naming the pip extra where CuPy is missing."""
    FORK.use("cuda/hip backends")
    try:
        import cupy
    except ImportError as e:
        raise VendorImportError(f"CuPy is not installed ({e}); {pip_hint}") from e
    return cupy


def is_hip(cupy) -> bool:
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


def torch_with_gpu():
    """torch, where it is imported and sees a GPU (CUDA or ROCm); else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() else None


def platform(pip_hint: str = CUDA_PIP_HINT) -> str:
    """'amd' or 'nvidia': torch's build where torch sees a GPU, else CuPy's where CuPy is installed, else 'nvidia'
    (Note [ctypes toolchain]: CuPy is imported only where torch cannot tell)."""
    torch = torch_with_gpu()
    if torch is not None:
        return "amd" if getattr(torch.version, "hip", None) else "nvidia"
    if importlib.util.find_spec("cupy") is None:
        return "nvidia"
    return "amd" if is_hip(import_cupy(pip_hint)) else "nvidia"


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


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One module made ready for a device: compiled ('nvrtc'/'hiprtc') or read back ('disk'); ``seconds``: what
    the launching thread spent on it (waiting for a compile ahead, or compiling, and loading)."""

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


# Note [compile ahead]
# A plan knows every kernel its calls will launch (its KernelPlans: forward, and the backward of the layouts the
# problem implies). At its first call, ProgramRunner hands all of them to the kernel set (prefetch), which makes the
# binaries of those not yet loaded (compiled, or read from the disk cache) on a pool of worker threads: NVRTC releases
# the GIL, so the backward's modules build while the forward runs and later layers plan, and a model's first step
# waits for the slowest chain of compiles, not their sum. Workers only make bytes; loading them
# (cuModuleLoad, on the caller's device) stays with the thread that launches, in _load. There a module whose compile
# has started is taken from its future (a compile error raises there, as it would have inline); one still queued
# (behind other plans' modules) is taken off the queue and made by the caller, which never waits for the queue.
# Modules that are never launched (a backward that runs on other layouts) cost a compile and nothing else. hiprtc on
# AMD compiles inline, as before: concurrent hiprtc compiles have never run here (no AMD GPU), so none are started.
# The workers are daemon threads: a process that ends does not wait for compiles it may never use (what it does
# launch, it took or made in _load). PORTCONV_COMPILE_THREADS=0 turns this off; a forked child starts with no pool
# and nothing pending (the parent's workers do not exist there).
class _Workers:
    """``size`` daemon threads running submitted calls in order, each with a concurrent.futures.Future (cancelled
    while queued: skipped)."""

    def __init__(self, size: int):
        self.size = size
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(size):
            threading.Thread(target=self._run, name=f"portconv-compile-{i}", daemon=True).start()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fut, fn, args))
        return fut

    def close(self) -> None:
        """The threads end once the calls queued before this have run."""
        for _ in range(self.size):
            self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # raised where the module is needed (_take)
                    fut.set_exception(e)


_pool: _Workers | None = None
_pool_lock = threading.Lock()


def ahead_threads() -> int:
    """The compile-ahead pool's size: PORTCONV_COMPILE_THREADS, else one thread per CPU up to 8."""
    n = knobs.env().compile_threads
    return min(8, os.cpu_count() or 1) if n is None else n


def _submit(fn, *args) -> concurrent.futures.Future | None:
    global _pool
    n = ahead_threads()
    if n == 0:
        return None
    with _pool_lock:
        if _pool is None or _pool.size != n:  # first use, or the knob changed (knobs.reload)
            if _pool is not None:
                _pool.close()
            _pool = _Workers(n)
        return _pool.submit(fn, *args)


def _after_fork() -> None:
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_after_fork)


class KernelSet:
    """One kernel-source set compiled at run time with NVRTC (or hiprtc): modules cached in memory and on disk.

    ``folders`` are searched in order for quoted includes; the HIP set passes its own folder first so its prelude
    wins, then cuda/ for the shared bodies.
    """

    vendor = "cuda"
    compiler = "nvrtc"
    ahead = True  # Note [compile ahead]: the compiler may run on worker threads

    def __init__(self, folders: list[pathlib.Path] | None = None, options: tuple[str, ...] = ("-std=c++17",),
                 pip_hint: str = CUDA_PIP_HINT):
        self.folders = folders or [sources.folder("cuda")]
        self.options = options
        self.pip_hint = pip_hint
        self._modules: dict[tuple, object] = {}
        self._ahead: dict[tuple, concurrent.futures.Future] = {}  # Note [compile ahead]: binaries being made
        self._texts: dict[str, str] = {}
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._ahead.clear)  # the parent's workers do not exist in a child

    # the parts a vendor overrides: NVRTC and the driver through ctypes (Note [ctypes toolchain]) -----------------
    platform = "nvidia"

    @staticmethod
    def _nvrtc():
        """The NVRTC of this driver (Note [ctypes toolchain])."""
        from . import nvidia

        return nvidia.nvrtc(nvidia.driver().version)

    def compiler_version(self) -> str:
        return ".".join(map(str, self._nvrtc().version))

    def arch_options(self, device: int) -> tuple[str, tuple[str, ...], str]:
        """(arch name, arch options, binary kind) for a device: a cubin where NVRTC knows the arch, else PTX."""
        from . import nvidia

        cc = nvidia.driver().compute_capability(device)
        supported = self._nvrtc().archs()
        if cc in supported:
            return f"sm_{cc}", (f"-arch=sm_{cc}",), "cubin"
        best = max([a for a in supported if a <= cc] or supported[:1])
        return f"sm_{cc}", (f"-arch=compute_{best}",), "ptx"

    def build(self, text: str, name: str, options: tuple[str, ...], kind: str) -> bytes:
        rc, log, code = self._nvrtc().compile(text, name, list(options), kind)
        if rc:
            raise RuntimeError(f"{self.compiler} failed to compile {name} {' '.join(options)}:\n{log}")
        return code

    def load_binary(self, binary: bytes, device: int):
        """The loaded module (get_function(name) -> an object with ``ptr``) of a binary on ``device``."""
        from . import nvidia

        return nvidia.driver().load(binary, device)

    # the shared machinery ----------------------------------------------------------------------------------------
    def text(self, entry: str) -> str:
        if entry not in self._texts:
            self._texts[entry] = inline_source(entry, self.folders)
        return self._texts[entry]

    def module(self, module: Module, device: int):
        """The loaded module of ``module`` on ``device`` (compiled once, then from cache)."""
        key = (module, device)
        mod = self._modules.get(key)
        if mod is None:
            with self._lock:
                mod = self._modules.get(key)
                if mod is None:
                    mod = self._modules[key] = self._load(module, device)
        return mod

    def prefetch(self, modules, device: int) -> None:
        """Start making the binaries of ``modules`` for ``device`` on the pool (Note [compile ahead])."""
        if not self.ahead:
            return
        arch = None
        with self._lock:
            for module in dict.fromkeys(modules):
                key = (module, device)
                if key in self._modules or key in self._ahead:
                    continue
                arch = arch or self.arch_options(device)
                fut = _submit(self._binary, module, arch)
                if fut is None:
                    return
                self._ahead[key] = fut

    def function(self, module: Module, device: int, name: str):
        return self.module(module, device).get_function(name)

    def cache_path(self, key: str) -> pathlib.Path | None:
        """Where a binary is kept, or None where the cache folder is not usable (Note [trusted cache])."""
        where = diskcache.folder(pathlib.Path(knobs.env().cache_dir) / self.vendor)
        return None if where is None else where / f"{key}.bin"

    def _binary(self, module: Module, arch_options: tuple[str, tuple[str, ...], str]) -> tuple[bytes, str]:
        """(the module's binary, 'disk' or the compiler's name): read from the disk cache, else built and kept."""
        arch, arch_opts, kind = arch_options
        options = tuple(self.options) + arch_opts + tuple(f"-D{k}={v}" for k, v in module.compile_defines())
        text = self.text(module.source)
        h = hashlib.sha256()
        for part in (self.vendor, self.compiler, self.compiler_version(), arch, kind, " ".join(options), text):
            h.update(part.encode())
            h.update(b"\0")
        path = self.cache_path(h.hexdigest()[:32])
        binary = None if path is None else diskcache.read(path)
        if binary is not None:
            return binary, "disk"
        binary = self.build(text, module.source, options, kind)
        if path is not None:
            diskcache.write(path, binary)
        return binary, self.compiler

    def _take(self, module: Module, device: int, arch) -> tuple[bytes, str]:
        """_binary's result for a module about to load: from a compile ahead that has started, else made here
        (Note [compile ahead])."""
        pending = self._ahead.pop((module, device), None)
        if pending is not None and not pending.cancel():
            return pending.result()
        return self._binary(module, arch)

    def _load(self, module: Module, device: int):
        t0 = time.perf_counter()
        arch = self.arch_options(device)
        binary, how = self._take(module, device, arch)
        mod = self.load_binary(binary, device)
        seconds = time.perf_counter() - t0
        _events.append(CompileEvent(module.source, module.compile_defines(), arch[0], how, seconds, device))
        return mod

