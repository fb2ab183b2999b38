#!/usr/bin/env python3
"""Compile every hip/ kernel module for AMD GPU targets with hipcc (and hiprtc); fail on errors and wrong-code warnings.

Usage: python scripts/hip_build.py [--targets gfx90a,gfx940,gfx1030] [--jobs N] [--strict] [--json FILE]

Each hip/*.hip module is compiled with HIP_PLATFORM=amd hipcc --genco for every target and every define set the
hip backend uses at run time (portconv.backends.simt.hip.DEFINE_SETS), with the backend's own options
(compile_options) plus the warning flags below. A unit fails on any error, on any warning of WRONG_CODE, on a
code object whose wavefront size differs from the target's, or on a kernel the backend launches that the code
object lacks. Other warnings are printed (and fail with --strict). Needs no GPU and no torch.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from portconv.backends.simt import hip as hipbackend  # noqa: E402  (pure Python: no torch, no cupy)

TARGETS = ("gfx90a", "gfx940", "gfx1030")
WARN_FLAGS = ("-Wall", "-Wextra", "-Wno-unused-parameter")
# Note [wrong-code warnings]: clang diagnostics that mean the kernel computes something other than intended
# (reads of uninitialized values, out-of-range shifts and indices, truncated constants, unsequenced updates,
# suspicious precedence). Style warnings (unused variables, comments, pass remarks) are reported only.
WRONG_CODE = ("uninitialized", "sometimes-uninitialized", "conditional-uninitialized", "return-type", "array-bounds",
              "array-bounds-pointer-arithmetic", "shift-count-overflow", "shift-count-negative",
              "shift-negative-value", "shift-overflow", "division-by-zero", "unsequenced", "constant-conversion",
              "literal-conversion", "float-overflow-conversion", "implicit-const-int-float-conversion",
              "int-in-bool-context", "bool-operation", "tautological-constant-out-of-range-compare",
              "tautological-overlap-compare", "self-assign", "sizeof-pointer-memaccess", "sizeof-array-div",
              "null-dereference", "parentheses", "logical-op-parentheses", "bitwise-op-parentheses",
              "misleading-indentation", "undefined-internal", "format", "dangling-else", "sign-compare",
              "implicit-function-declaration", "return-stack-address", "dangling", "uninitialized-const-reference")
WERROR_FLAGS = tuple(f"-Werror={w}" for w in WRONG_CODE)
_DIAG = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (?P<kind>warning|error): (?P<msg>.*?)"
                   r"(?: \[(?P<flag>-W[^\]]+)\])?$", re.M)


def find_hipcc() -> str | None:
    for cand in (os.environ.get("HIPCC"), shutil.which("hipcc"), "/opt/rocm/bin/hipcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def find_llvm_tool(name: str) -> str | None:
    """clang-offload-bundler / llvm-readelf from the HIP clang (ROCm's llvm/bin, Debian's llvm-N/bin)."""
    dirs = [os.environ.get("HIP_CLANG_PATH"), "/opt/rocm/llvm/bin"]
    dirs += sorted((str(p) for p in pathlib.Path("/usr/lib").glob("llvm-*/bin")), reverse=True)
    for d in dirs:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name)


def hip_version() -> str:
    """hipconfig --version (hipcc --version runs rocm_agent_enumerator, which fails without a GPU)."""
    tool = shutil.which("hipconfig") or "/opt/rocm/bin/hipconfig"
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        return "unknown"


def hip_version_number(text: str) -> int:
    """'5.2.21153-0' -> 50221153 (HIP_VERSION's encoding: major*10^7 + minor*10^5 + patch)."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return int(m.group(1)) * 10**7 + int(m.group(2)) * 10**5 + int(m.group(3)) if m else 0


@dataclasses.dataclass
class Unit:
    module: str  # algorithm name: 'direct', 'depthwise', 'implicit_gemm'
    target: str
    defines: dict[str, int]
    extra: tuple[str, ...] = ()  # more options (the ROCm 7 mask check adds its shim)

    @property
    def source(self) -> pathlib.Path:
        return ROOT / "hip" / hipbackend.MODULES[self.module]

    @property
    def label(self) -> str:
        d = " ".join(f"{k}={v}" for k, v in self.defines.items())
        return f"{self.source.name} {self.target} {d}{' ' + ' '.join(self.extra) if self.extra else ''}"

    def command(self, hipcc: str, out: pathlib.Path) -> list[str]:
        opts = hipbackend.compile_options("amd", hipbackend.wave_of(self.target))
        defs = [f"-D{k}={v}" for k, v in self.defines.items()]
        return [hipcc, "--genco", f"--offload-arch={self.target}", *opts, *WARN_FLAGS, *WERROR_FLAGS, *self.extra,
                f"-I{ROOT / 'hip'}", f"-I{ROOT / 'cuda'}", *defs, str(self.source), "-o", str(out)]


@dataclasses.dataclass
class Result:
    unit: Unit
    ok: bool
    seconds: float
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)  # wrong-code ones are errors
    kernels: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"unit": self.unit.label, "ok": self.ok, "seconds": round(self.seconds, 2), "errors": self.errors,
                "warnings": self.warnings, "kernels": self.kernels}


def code_object_notes(path: pathlib.Path, target: str) -> dict[str, dict[str, int]]:
    """Kernel name -> AMDGPU metadata (wavefront_size, vgpr_count, spills, LDS, scratch) of a --genco output."""
    data = path.read_bytes()
    elf = path
    if data.startswith(b"__CLANG_OFFLOAD_BUNDLE__"):
        bundler = find_llvm_tool("clang-offload-bundler")
        if bundler is None:
            raise FileNotFoundError("clang-offload-bundler not found (needed to read a hipcc --genco bundle)")
        elf = path.with_suffix(".elf")
        subprocess.run([bundler, "--unbundle", "--type=o", f"--targets=hipv4-amdgcn-amd-amdhsa--{target}",
                        f"--input={path}", f"--output={elf}"], check=True, capture_output=True, timeout=120)
    readelf = find_llvm_tool("llvm-readelf")
    if readelf is None:
        raise FileNotFoundError("llvm-readelf not found (needed to read the code object's kernel metadata)")
    notes = subprocess.run([readelf, "--notes", str(elf)], check=True, capture_output=True, text=True,
                           timeout=120).stdout
    kernels: dict[str, dict[str, int]] = {}
    current: dict[str, int] = {}
    for line in notes.splitlines():
        m = re.match(r"\s+\.(\w+):\s+(\S+)$", line)
        if not m:
            continue
        key, val = m.groups()
        if key == "name":
            current = kernels.setdefault(val, {})
        elif key in ("wavefront_size", "vgpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
                     "group_segment_fixed_size", "private_segment_fixed_size"):
            current[key] = int(val)
    return kernels


def compile_unit(hipcc: str, unit: Unit, workdir: pathlib.Path, strict: bool = False) -> Result:
    out = workdir / f"{unit.module}-{unit.target}-{abs(hash(unit.label)):x}.hsaco"
    env = dict(os.environ, HIP_PLATFORM="amd")
    t0 = time.perf_counter()
    proc = subprocess.run(unit.command(hipcc, out), capture_output=True, text=True, env=env, timeout=900)
    res = Result(unit, True, time.perf_counter() - t0)
    log = proc.stdout + proc.stderr
    for d in _DIAG.finditer(log):
        text = f"{d['file']}:{d['line']}: {d['kind']}: {d['msg']}" + (f" [{d['flag']}]" if d["flag"] else "")
        wrong = d["flag"] and d["flag"].replace("-Werror=", "-W")[2:] in WRONG_CODE
        (res.errors if d["kind"] == "error" or wrong or strict else res.warnings).append(text)
    if proc.returncode != 0 or not out.is_file():
        res.ok = False
        if not res.errors:
            res.errors.append(f"hipcc exited with {proc.returncode}:\n{log.strip()[-4000:]}")
        return res
    if res.errors:
        res.ok = False
    res.kernels = code_object_notes(out, unit.target)
    _check_kernels(res)
    return res


def _check_kernels(res: Result) -> None:
    """Every kernel the backend launches is in the code object, with the target's wavefront size."""
    unit = res.unit
    want_wave = hipbackend.wave_of(unit.target)
    expected = set(hipbackend.KERNELS[unit.module]) | set(hipbackend.COMMON_KERNELS)
    missing = sorted(expected - set(res.kernels))
    if missing:
        res.ok = False
        res.errors.append(f"code object lacks kernel(s) the hip backend launches: {', '.join(missing)}")
    for name, meta in res.kernels.items():
        if meta.get("wavefront_size") != want_wave:
            res.ok = False
            res.errors.append(f"{name}: wavefront_size {meta.get('wavefront_size')} on {unit.target}, "
                              f"expected {want_wave}")


def load_hiprtc():
    """The hiprtc library (libhiprtc on ROCm >= 5.?, inside libamdhip64 on Debian's HIP 5.2), or None."""
    import ctypes
    import ctypes.util

    names = [ctypes.util.find_library("hiprtc"), "libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6",
             ctypes.util.find_library("amdhip64"), "libamdhip64.so", "libamdhip64.so.5"]
    for n in names:
        if not n:
            continue
        try:
            lib = ctypes.CDLL(n)
        except OSError:
            continue
        if hasattr(lib, "hiprtcCreateProgram"):
            return lib
    return None


def hiprtc_compile(lib, text: str, name: str, options) -> tuple[int, str, bytes]:
    """(status, log, code object) of hiprtc compiling ``text`` with ``options`` (offline: no GPU needed)."""
    import ctypes

    prog = ctypes.c_void_p()
    status = lib.hiprtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None)
    if status:
        return status, "hiprtcCreateProgram failed", b""
    try:
        opts = [o.encode() for o in options]
        status = lib.hiprtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.hiprtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        lib.hiprtcGetProgramLog(prog, buf)
        code = b""
        if status == 0:
            lib.hiprtcGetCodeSize(prog, ctypes.byref(n))
            cbuf = ctypes.create_string_buffer(n.value)
            lib.hiprtcGetCode(prog, cbuf)
            code = cbuf.raw
        return status, buf.value.decode(errors="replace"), code
    finally:
        lib.hiprtcDestroyProgram(ctypes.byref(prog))


def run_hiprtc(targets=("gfx90a", "gfx1030"), dtypes=(0, 2), log=print) -> list[Result]:
    """Compile each module's run-time text (headers inlined, as HipKernelSet hands it to hiprtc) with hiprtc."""
    from portconv.backends.simt.compile import inline_source

    lib = load_hiprtc()
    if lib is None:
        raise FileNotFoundError("hiprtc not found (libhiprtc.so, or libamdhip64.so on Debian's HIP 5.2)")
    version = hip_version_number(hip_version())
    results = []
    with tempfile.TemporaryDirectory(prefix="portconv-hiprtc-") as tmp:
        for t in targets:
            for module, entry in hipbackend.MODULES.items():
                text = inline_source(entry, [ROOT / "hip", ROOT / "cuda"])
                for d in dtypes:
                    unit = Unit(module, t, {"PC_DTYPE": d, "PC_INDEX64": 0}, ("hiprtc",))
                    opts = (*hipbackend.compile_options("amd", hipbackend.wave_of(t), version or None),
                            f"--offload-arch={t}", f"-DPC_DTYPE={d}", "-DPC_INDEX64=0")
                    t0 = time.perf_counter()
                    status, text_log, code = hiprtc_compile(lib, text, entry, opts)
                    res = Result(unit, status == 0, time.perf_counter() - t0)
                    if status:
                        res.errors.append(f"hiprtc status {status}:\n{text_log.strip()[-4000:]}")
                    else:
                        out = pathlib.Path(tmp) / f"{module}-{t}-{d}.co"
                        out.write_bytes(code)
                        res.kernels = code_object_notes(out, t)
                        _check_kernels(res)
                    log(f"{'ok  ' if res.ok else 'FAIL'} {res.seconds:5.1f}s {unit.label}")
                    results.append(res)
    return results


SECONDARY_DTYPES = (0, 3)  # float32, bfloat16: what the targets after the first are built in


def define_sets(target: str, targets=TARGETS) -> list[dict]:
    """The define sets compiled for ``target``: every one of hip.DEFINE_SETS for the first target; for the others
    float32 and bfloat16 with 32-bit indices. The dtype and index paths are target-independent code, checked once on
    the first target; a target changes the wavefront size and the instruction set, which float32 and a 16-bit type
    exercise (as the nvcc check's sm_80 builds do). CI's AMD builds: 36 instead of 72."""
    sets = [dict(d) for d in hipbackend.DEFINE_SETS]
    if target == targets[0]:
        return sets
    return [d for d in sets if not d.get("PC_INDEX64") and d["PC_DTYPE"] in SECONDARY_DTYPES]


def units(targets=TARGETS, modules=None) -> list[Unit]:
    mods = modules or list(hipbackend.MODULES)
    return [Unit(m, t, d) for t in targets for m in mods for d in define_sets(t, targets)]


def rocm7_mask_units(targets=TARGETS) -> list[Unit]:
    """Note [ROCm 7 mask check]: on HIP < 6.2 headers the 64-bit-mask __shfl_*_sync calls are compiled against
    scripts/hip_rocm7_shim.h, which declares them with ROCm 7's static_assert on the mask width."""
    shim = ROOT / "scripts" / "hip_rocm7_shim.h"
    waves = {hipbackend.wave_of(t): t for t in reversed(targets)}  # one target per wavefront size
    return [Unit(m, t, {"PC_DTYPE": 0, "PC_INDEX64": 0}, ("-DPC_HIP_TEST_WARP_SYNC=1", "-include", str(shim)))
            for t in waves.values() for m in hipbackend.MODULES]


def run(targets=TARGETS, jobs: int | None = None, strict: bool = False, modules=None, hipcc: str | None = None,
        workdir: pathlib.Path | None = None, log=print) -> list[Result]:
    hipcc = hipcc or find_hipcc()
    if hipcc is None:
        raise FileNotFoundError("hipcc not found: apt-get install hipcc libamdhip64-dev rocm-device-libs "
                                "(Debian/Ubuntu), or install ROCm, or set HIPCC")
    todo = units(targets, modules)
    if hip_version_number(hip_version()) < 60200000:
        todo += rocm7_mask_units(targets)
    jobs = jobs or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="portconv-hip-") as tmp:
        wd = workdir or pathlib.Path(tmp)
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futs = [pool.submit(compile_unit, hipcc, u, wd, strict) for u in todo]
            results = []
            for f in concurrent.futures.as_completed(futs):
                r = f.result()
                results.append(r)
                log(f"{'ok  ' if r.ok else 'FAIL'} {r.seconds:5.1f}s {r.unit.label}")
    return sorted(results, key=lambda r: r.unit.label)


def summary(results: list[Result]) -> str:
    lines = []
    for t in sorted({r.unit.target for r in results}):
        rs = [r for r in results if r.unit.target == t]
        ks = [m for r in rs for m in r.kernels.values()]
        waves = sorted({m.get("wavefront_size") for m in ks})
        lines.append(f"{t}: {sum(r.ok for r in rs)}/{len(rs)} units ok, {len(ks)} kernels, wave {waves}, "
                     f"max VGPRs {max((m.get('vgpr_count', 0) for m in ks), default=0)}, "
                     f"VGPR spills {sum(m.get('vgpr_spill_count', 0) for m in ks)}, "
                     f"scratch bytes {max((m.get('private_segment_fixed_size', 0) for m in ks), default=0)}, "
                     f"{sum(r.seconds for r in rs):.0f}s of compiling")
    for r in results:
        for e in r.errors:
            lines.append(f"ERROR   {r.unit.label}: {e}")
        for w in r.warnings:
            lines.append(f"warning {r.unit.label}: {w}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--strict", action="store_true", help="every warning fails")
    ap.add_argument("--json", help="write every unit's result here")
    ap.add_argument("--hiprtc-only", action="store_true", help="only the run-time (hiprtc) compile check")
    args = ap.parse_args(argv)
    if args.hiprtc_only:
        if load_hiprtc() is None:
            print("hiprtc not found (libhiprtc.so, or libamdhip64.so on Debian's HIP 5.2)", file=sys.stderr)
            return 2
        results = run_hiprtc(log=lambda s: None)
        print(summary(results))
        return 0 if results and all(r.ok for r in results) else 1
    hipcc = find_hipcc()
    if hipcc is None:
        print("hipcc not found: apt-get install -y --no-install-recommends hipcc libamdhip64-dev rocm-device-libs",
              file=sys.stderr)
        return 2
    print(f"hipcc {hipcc} (HIP {hip_version()}), targets {args.targets}")
    t0 = time.perf_counter()
    results = run(tuple(args.targets.split(",")), args.jobs, args.strict, hipcc=hipcc)
    if load_hiprtc() is not None:
        results += run_hiprtc()
    else:
        print("hiprtc not found: the run-time (hiprtc) compile check is skipped", file=sys.stderr)
    print(summary(results))
    print(f"{sum(r.ok for r in results)}/{len(results)} units ok in {time.perf_counter() - t0:.0f}s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"hip": hip_version(), "results": [r.as_dict() for r in results]},
                                                      indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
