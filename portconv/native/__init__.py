"""The native executor: a plan's launches and autograd node in C++, built on first use (Note [native executor])."""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import threading
import weakref

from .. import knobs

# Note [native executor]
# In Python, a call of the own kernels costs more host time than PyTorch's own call of its kernels: the
# autograd.Function, the Executable's binding and the ctypes launches (the layers of docs/performance/h200/README.md,
# native against off). executor.cpp does that part in C++: runtime.Executable's work (allocate the
# buffers, poison the results, write the addresses into copies of the argument blocks, launch in order on the
# current stream in the device's primary context), ProgramRunner's table of executables per operand layout, and the
# autograd node (a torch::autograd::Function whose backward runs the plan's backward; with create_graph, or operands
# that are not plain tensors, it calls back into autograd.native_slow, the Python path's differentiable backward).
# Nothing is decided there: each Executable is made by Python from the same Program (ProgramRunner.native_executable,
# runtime.Loader.load_native) the first time a layout is seen. Plans get one when their loader can
# (Loader.supports_native: torch tensors on NVIDIA's driver), through offer(); CuPy arrays, AMD GPUs (launched
# through CuPy) and the OpenCL set keep the Python path.
# The module is compiled from executor.cpp with the host's C++ compiler against the installed torch, once per (source,
# torch, Python, compiler) in PORTCONV_CACHE_DIR/native; it links to torch only (the driver's entry points come from
# Python as addresses). PORTCONV_NATIVE (knobs): 'auto' builds it in a background thread at the first offer while the
# calls run in Python, and plans switch over when it is loaded; 'wait' builds it at the first offer and waits; 'off'
# never builds it. The compiler runs in a session of its own and puts the module in place itself, so a process that
# exits before the build ends (a short script under 'auto') leaves it for the next one. Without a compiler or Python's
# headers the reason is kept (status()) and every call stays in Python, which computes the same results.
SOURCE = pathlib.Path(__file__).with_name("executor.cpp")

_lock = threading.Lock()
_module = None  # the loaded extension
_failed = ""  # why it is not available
_thread: threading.Thread | None = None
_pending: list[weakref.ref] = []  # plans offered before the module was loaded


def status() -> str:
    """'ready', 'building', 'off', 'not built yet (...)' or 'unavailable: <reason>'."""
    if knobs.env().native == "off":
        return "off"
    if _module is not None:
        return "ready"
    if _failed:
        return f"unavailable: {_failed}"
    return "building" if _thread is not None else "not built yet (built at the first call that can use it)"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _flags(torch, name: str, includes: list[str]) -> list[str]:
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return ["-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", f"-DTORCH_EXTENSION_NAME={name}",
            "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in includes),
            f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


def _includes(python_include: str) -> list[str]:
    """torch's and Python's header folders. torch.utils.cpp_extension imports setuptools, which a process that finds
    the module built must not pay for (it holds the GIL through a warm first step): only a build asks, and the cache
    key names what these folders derive from."""
    from torch.utils import cpp_extension

    return [*cpp_extension.include_paths(), python_include]


def _key(torch, cxx: str, python_include: str) -> str:
    """The cache name of the module: the source, torch (version and folder, which fix its headers), Python (version
    and header folder), the compiler and the flags."""
    parts = [SOURCE.read_bytes(), torch.__version__.encode(), os.path.dirname(torch.__file__).encode(),
             sys.version.encode(), python_include.encode(), cxx.encode(),
             " ".join(_flags(torch, "x", [])).encode()]
    return "portconv_native_" + hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _build():
    """Compile (or find in the cache) and import the extension; returns it or raises RuntimeError with the reason."""
    import torch

    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++; or set CXX)")
    python_include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(python_include, "Python.h")):
        raise RuntimeError(f"no Python.h under {python_include} (install the Python headers, e.g. python3-dev)")
    name = _key(torch, cxx, python_include)
    from ..diskcache import folder

    where = folder(pathlib.Path(knobs.env().cache_dir) / "native")
    if where is None:
        raise RuntimeError(f"no usable cache folder under {knobs.env().cache_dir}")
    so = where / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not so.exists():
        _compile(cxx, so, _flags(torch, name, _includes(python_include)))
    spec = importlib.util.spec_from_file_location(name, so, loader=importlib.machinery.ExtensionFileLoader(name,
                                                                                                      str(so)))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compile(cxx: str, so: pathlib.Path, flags: list[str]) -> None:
    """Compile executor.cpp into ``so`` in a process of its own session that renames its output into place itself:
    a build started by a process that exits before it ends still lands in the cache for the next process (the
    compiler's messages go to a log beside it, kept only on failure). Whole files only: a process beside this one
    reads the old name or the new file."""
    tmp = so.with_name(f"{so.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    log = tmp.with_suffix(".log")
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []  # below the first steps' own kernel compiles
    script = 'tmp=$1 so=$2 log=$3; shift 3; "$@" > "$log" 2>&1 && mv -f "$tmp" "$so" && rm -f "$log"'
    with open(os.devnull, "rb") as null:
        p = subprocess.Popen(["sh", "-c", script, "sh", str(tmp), str(so), str(log), *nice, cxx, str(SOURCE), "-o",
                              str(tmp), *flags], stdin=null, start_new_session=True)
    if p.wait() != 0:
        text = log.read_text(errors="replace").strip()[-2000:] if log.exists() else ""
        tmp.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
        raise RuntimeError(f"{cxx} failed: {text}")


def _load() -> None:
    global _module, _failed
    try:
        mod = _build()
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, with its reason
        _failed = str(e) or type(e).__name__
        return
    with _lock:
        _module = mod
        plans = [p() for p in _pending]
        _pending.clear()
    for plan in plans:
        if plan is not None:
            _attach(plan)


def wait(timeout: float | None = None):
    """Start the build if it has not started (PORTCONV_NATIVE permitting) and wait for it: the module, or None."""
    if knobs.env().native == "off":
        return None
    _start()
    t = _thread
    if t is not None:
        t.join(timeout)
    return _module


def _start() -> None:
    global _thread
    with _lock:
        if _thread is None and _module is None and not _failed:
            _thread = threading.Thread(target=_load, name="portconv-native-build", daemon=True)
            _thread.start()


def offer(plan) -> None:
    """Give ``plan`` (whose runner is a ProgramRunner that can run natively) the native executor, now where it is
    loaded, else once it is (PORTCONV_NATIVE=auto builds it in the background, =wait here and now)."""
    mode = knobs.env().native
    if mode == "off" or _failed:
        return
    plan.runner.native_poison = knobs.env().poison
    if _module is None:
        with _lock:
            if _module is None:
                _pending.append(weakref.ref(plan))
        _start()
        if mode == "wait":
            _thread.join()
        if _module is None:
            return
    _attach(plan)


def _attach(plan) -> None:
    from .. import autograd

    params, request = plan.problem.params, autograd.request_of(plan)

    def slow(grad_output, input, weight, mask):
        return autograd.native_slow(params, request, grad_output, input, weight, mask)

    plan.runner.native = _module.Runner(plan.runner.native_executable, slow)


def executable(*args):
    """The loaded module's Executable (runtime.Loader.load_native)."""
    return _module.Executable(*args)
