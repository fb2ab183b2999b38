"""The HIP kernel set compiles for AMD targets (hipcc for gfx90a/gfx940/gfx1030, hiprtc) and through the NVIDIA map.

No GPU is needed. Without hipcc these tests skip, except under PORTCONV_REQUIRE_HIPCC=1 (tox -e hip-build, CI),
where they fail: a compile check that silently does nothing proves nothing.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("hip_build", ROOT / "scripts" / "hip_build.py")
hip_build = importlib.util.module_from_spec(_spec)
sys.modules["hip_build"] = hip_build  # dataclasses look their module up there
_spec.loader.exec_module(hip_build)

from portconv.backends.simt import hip as hipbackend  # noqa: E402
from portconv.backends.simt import select  # noqa: E402


def _need(tool: str | None, what: str, env: str) -> str:
    if tool:
        return tool
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} is required ({env}=1) but not found: apt-get install -y --no-install-recommends "
                    "hipcc libamdhip64-dev rocm-device-libs", pytrace=False)
    pytest.skip(f"{what} not found (set {env}=1 to make this a failure)")


@pytest.fixture(scope="module")
def hipcc() -> str:
    return _need(hip_build.find_hipcc(), "hipcc", "PORTCONV_REQUIRE_HIPCC")


@pytest.fixture(scope="module")
def build(hipcc) -> list:
    return hip_build.run(hip_build.TARGETS, hipcc=hipcc, log=lambda s: None)


# --- the sources: one body, no copies ----------------------------------------------------------------------

def test_hip_entries_only_include_the_shared_bodies():
    """hip/*.hip are thin: comments and #includes only, each naming the cuda/ body of its module."""
    entries = sorted(p.name for p in (ROOT / "hip").glob("*.hip"))
    assert entries == sorted(hipbackend.MODULES.values())
    for alg, entry in hipbackend.MODULES.items():
        text = (ROOT / "hip" / entry).read_text()
        code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        lines = [ln.strip() for ln in code.splitlines() if ln.strip()]
        assert all(ln.startswith("#include") for ln in lines), f"{entry} holds code, not just includes"
        included = [re.search(r'"([^"]+)"', ln).group(1) for ln in lines]
        assert included[0] == "prelude.h"
        for inc in included[1:]:
            assert (ROOT / "cuda" / inc).is_file(), f"{entry} includes {inc}, which is not a cuda/ body"
        cuda_entry = (ROOT / "cuda" / select.ENTRY[alg]).read_text()
        cuda_bodies = re.findall(r'#include "([^"]+)"', cuda_entry)[1:]
        assert included[1:] == cuda_bodies, f"{entry} and its cuda/ twin include different bodies"


def test_hip_headers_define_no_kernels():
    for p in (ROOT / "hip").glob("*.h"):
        code = re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)
        assert "__global__ void" not in code and "PC_KERNEL void" not in code, f"{p.name} defines a kernel"


def test_hip_prelude_defines_every_cuda_prelude_name():
    """Every macro, type and function cuda/prelude.cuh gives the bodies exists in the HIP prelude too."""
    cuda = re.sub(r"/\*.*?\*/", "", (ROOT / "cuda" / "prelude.cuh").read_text(), flags=re.S)
    names = set(re.findall(r"#define (PC_\w+)", cuda)) | set(re.findall(r"typedef [\w ]+ (pc_\w+);", cuda))
    names |= set(re.findall(r"PC_DEVICE [\w ]+?\b(pc_\w+)\(", cuda))
    names -= {"PC_VENDOR_CUDA"}
    hip = "".join((ROOT / "hip" / f).read_text() for f in ("prelude_hip.h", "prelude_amd.h", "prelude_nvidia.h"))
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", hip))
    assert names and not missing, f"hip/ preludes lack {missing}"


# --- hipcc for the AMD targets -------------------------------------------------------------------------------

@pytest.mark.parametrize("target", hip_build.TARGETS)
def test_every_module_compiles_for_target(build, target):
    """Every module x define set the backend uses compiles without errors or wrong-code warnings, and its code
    object has every kernel the backend launches, with the target's wavefront size (64 gfx9, 32 gfx10)."""
    rs = [r for r in build if r.unit.target == target]
    assert len(rs) >= len(hipbackend.MODULES) * len(hip_build.define_sets(target))
    if target == hip_build.TARGETS[0]:  # every define set the runtime uses, 64-bit indexing included
        built = {tuple(sorted(r.unit.defines.items())) for r in rs}
        assert built >= {tuple(sorted(d.items())) for d in hipbackend.DEFINE_SETS}
    bad = [r for r in rs if not r.ok]
    assert not bad, hip_build.summary(bad)
    waves = {m["wavefront_size"] for r in rs for m in r.kernels.values()}
    assert waves == {hipbackend.wave_of(target)}


def test_rocm7_mask_check_ran_or_headers_have_it(build):
    """The 64-bit-mask shuffle calls were compiled against ROCm 7's declarations (the shim on older HIP)."""
    shim = [r for r in build if "-DPC_HIP_TEST_WARP_SYNC=1" in r.unit.extra]
    if hip_build.hip_version_number(hip_build.hip_version()) < 60200000:
        assert {r.unit.module for r in shim} == set(hipbackend.MODULES) and all(r.ok for r in shim)
    else:
        assert not shim  # the real __shfl_*_sync of HIP >= 6.2 are used instead


def _compile(hipcc, src: pathlib.Path, target: str, *opts) -> subprocess.CompletedProcess:
    cmd = [hipcc, "--genco", f"--offload-arch={target}", "-O1", f"-I{ROOT / 'hip'}", f"-I{ROOT / 'cuda'}", *opts,
           str(src), "-o", os.devnull]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HIP_PLATFORM="amd"), timeout=600)


@pytest.mark.parametrize("target,wrong", [("gfx1030", 64), ("gfx90a", 32)])
def test_wave_size_that_disagrees_with_the_target_is_an_error(hipcc, target, wrong):
    r = _compile(hipcc, ROOT / "hip" / "direct.hip", target, f"-DWAVE_SIZE={wrong}")
    assert r.returncode != 0 and "WAVE_SIZE disagrees" in r.stderr, r.stderr[-2000:]


def test_rocm7_shim_rejects_a_32_bit_mask(hipcc, tmp_path):
    """Negative control: the shim really fails a 32-bit mask, so the mask check above can fail."""
    src = tmp_path / "mask32.hip"
    src.write_text('#include "prelude.h"\nextern "C" __global__ void k(float *p) {\n'
                   "    p[threadIdx.x] = __shfl_down_sync(0xffffffffu, p[threadIdx.x], 1, WAVE_SIZE);\n}\n")
    shim = ROOT / "scripts" / "hip_rocm7_shim.h"
    if hip_build.hip_version_number(hip_build.hip_version()) >= 60200000:
        pytest.skip("HIP >= 6.2 declares __shfl_*_sync itself; the shim is for older headers")
    r = _compile(hipcc, src, "gfx90a", "-DPC_HIP_TEST_WARP_SYNC=1", "-include", str(shim))
    assert r.returncode != 0 and "64-bit" in r.stderr, r.stderr[-2000:]


# --- hiprtc: the run-time compiler on AMD, offline ---------------------------------------------------------------

def test_hiprtc_compiles_the_runtime_text(hipcc):
    """The inlined text HipKernelSet gives hiprtc compiles for gfx90a (wave64) and gfx1030 (wave32). In a process of
    its own: hiprtc's LLVM and another LLVM in one process crash it (a worker that had run the OpenCL tests on
    Debian's PoCL, which loads libLLVM-15, died here)."""
    _need(hip_build.load_hiprtc() is not None and "hiprtc", "hiprtc", "PORTCONV_REQUIRE_HIPCC")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "hip_build.py"), "--hiprtc-only"], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0 and "units ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


# --- the NVIDIA mapping: the same sources through nvcc -----------------------------------------------------------

@pytest.mark.parametrize("wave", [32, 16])
def test_hip_sources_compile_for_nvidia_through_the_prelude(tmp_path, wave):
    nvcc = _need(shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc"),
                 "nvcc", "PORTCONV_REQUIRE_NVCC")
    for alg, entry in hipbackend.MODULES.items():
        for dtype in (0, 2):
            cmd = [nvcc, "-cubin", "-arch=sm_90", "-x", "cu", *hipbackend.compile_options("nvidia", wave),
                   f"-I{ROOT / 'hip'}", f"-I{ROOT / 'cuda'}", f"-DPC_DTYPE={dtype}", str(ROOT / "hip" / entry),
                   "-o", str(tmp_path / f"{alg}.cubin")]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0 and "warning" not in r.stderr, f"{' '.join(cmd)}\n{r.stderr[-3000:]}"


def test_wave64_cannot_be_compiled_for_nvidia(tmp_path):
    nvcc = _need(shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc"),
                 "nvcc", "PORTCONV_REQUIRE_NVCC")
    cmd = [nvcc, "-cubin", "-arch=sm_90", "-x", "cu", *hipbackend.compile_options("nvidia", 64),
           f"-I{ROOT / 'hip'}", f"-I{ROOT / 'cuda'}", str(ROOT / "hip" / "direct.hip"), "-o", str(tmp_path / "x")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "WAVE_SIZE must be 32, 16 or 8" in r.stderr
