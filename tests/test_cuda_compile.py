"""CPU-only checks of the CUDA kernel set: nvcc builds every cuda/*.cu for sm_80 and sm_90, NVRTC keeps the hot
kernels' registers, and the sources' static rules. (The bodies run on the CPU: test_cuda_emulator.py.)"""
from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest

from portconv.backends.simt import hip, igemm, select, view
from portconv.backends.simt.compile import inline_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "cuda"
EMU_DIR = pathlib.Path(__file__).resolve().parent / "cuda_emu"
ENTRIES = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
ARCHS = ("sm_80", "sm_90")
SM80_DTYPES = (0, 3)  # float32, bfloat16


def _nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    return None


@pytest.fixture(scope="module")
def nvcc() -> str:
    path = _nvcc()
    if path is None:
        if os.environ.get("PORTCONV_REQUIRE_NVCC") == "1":
            pytest.fail("PORTCONV_REQUIRE_NVCC=1 but nvcc is not on PATH or in $CUDA_HOME/bin", pytrace=False)
        pytest.skip("nvcc not found (set PORTCONV_REQUIRE_NVCC=1 to make this a failure)")
    return path


def _compile(nvcc: str, entry: str, arch: str, defines: dict[str, int], out_dir: str) -> tuple[str, int, str]:
    out = os.path.join(out_dir, f"{entry}-{arch}-{'-'.join(f'{k}{v}' for k, v in defines.items())}.cubin")
    cmd = [nvcc, f"-arch={arch}", "-cubin", "-std=c++17", "-Werror", "all-warnings", "-Xptxas", "-v",
           *(f"-D{k}={v}" for k, v in defines.items()), str(CUDA_DIR / entry), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return " ".join(cmd), r.returncode, r.stderr


def test_nvcc_builds_every_kernel(nvcc):
    """Every entry, dtype and arch (plus 64-bit indexing) compiles to a cubin with no warning.

    Register spills are a performance matter (issue 5's), not wrong code, so they are not failures here."""
    # sm_80 and sm_90 builds differ only where prelude.cuh tests __CUDA_ARCH__ >= 900 (the dependent-launch wait);
    # the dtype paths are arch-independent: sm_90 builds every dtype, sm_80 float32 and bfloat16 (CI time)
    jobs = [(e, a, {"PC_DTYPE": dt, "PC_INDEX64": 0}) for e in ENTRIES for a in ARCHS
            for dt in (range(4) if a == "sm_90" else SM80_DTYPES)]
    jobs += [(e, "sm_90", {"PC_DTYPE": 0, "PC_INDEX64": 1}) for e in ENTRIES]
    # the tensor-core tiles (Note [tensor-core implicit GEMM]): float32 (TF32), float16, bfloat16, every tile
    tc = [{"PC_TENSOR_CORES": 1, "PC_TC_BM": bm, "PC_TC_BN": bn, "PC_TC_WM": wm}
          for bm, bn, wm in igemm.TC_TILES.values()]
    # every tile on sm_90, the first on the other archs (the tile is arch-independent code; CI time)
    jobs += [("igemm.cu", a, {"PC_DTYPE": dt, "PC_INDEX64": 0, **t}) for a in ARCHS for dt in (0, 2, 3)
             for t in (tc if a == "sm_90" else tc[:1])]
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": 2, "PC_INDEX64": 1, **tc[0]})]
    # Note [stage rows]: the other ring depth the host derives (PC_TC_KS 1; 2 is the default above), TF32 and 16-bit
    ks = sorted({igemm.ring_steps(c) for c in (16, 32, 48, 64)} - {igemm.RING_STEPS})
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_TC_KS": k, **tc[i]}) for k in ks
             for dt in (0, 2) for i in (0, 1)]
    # Note [rows by plan]: the 16-bit 2-D NCHW row paths a plan builds alone (0, one element an access, is above)
    jobs += [("depthwise.cu", "sm_90", {"PC_DTYPE": 3, "PC_INDEX64": 0, "PC_DWT_N16": n}) for n in (1, 2, 4)]
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        results = list(ex.map(lambda j: _compile(nvcc, *j, tmp), jobs))
    failures = [f"{cmd}\n{err}" for cmd, rc, err in results if rc != 0 or "warning" in err.lower()]
    assert not failures, "\n\n".join(failures)
    assert ks == [1]
    assert len(results) == (len(ENTRIES) * (4 + len(SM80_DTYPES) + 1) + 3 * (len(tc) + len(ARCHS) - 1) + 1 + 4 * len(ks)
                            + 3)


def test_nvrtc_keeps_the_hot_depthwise_kernels_at_two_blocks_an_sm():
    """What runs is NVRTC's build, and its registers can differ from nvcc's: 130 registers made the bfloat16
    channels-last weight gradient 1.4x slower (one 256-thread block an SM), and `__launch_bounds__(256, 1)` gave the
    forward 154 (docs/kernels/depthwise.md). mbv2-dw3x3-bf16-cl's three kernels, as NVRTC 13 builds them for sm_90
    (scripts/nvrtc_regs.py), must fit two blocks an SM (<= 128 registers) with no spills."""
    tool = _nvrtc_tool()
    for k in ("fwd_tile_s1", "bwd_data_tile_s1", "bwd_weight_tile2d_s1"):
        name = f"portconv_depthwise_{k}"  # built alone, as it runs (Note [one kernel a module])
        got = _entries(tool, "depthwise.cu", {"PC_DTYPE": 3, "PC_INDEX64": 0, "PC_ONLY": "", f"PC_ONLY_{name}": ""})
        regs, spill = got[name]
        assert regs <= 128 and spill == 0, f"{k}: {regs} registers, {spill} bytes spilled under NVRTC"


def test_nvrtc_keeps_the_quad_rows_at_three_blocks_an_sm():
    """Note [rows by plan]: the bfloat16 2-D NCHW quad-rows kernels built alone, as plans build them, took 88
    registers (two 256-thread blocks an SM; mbv2-dw3x3-bf16 forward 20% slower on the H100) until their launch bounds
    asked for three: they must fit three blocks (<= 80 registers) with no spills under NVRTC for sm_90."""
    tool = _nvrtc_tool()
    for k in ("fwd_tilen_s1", "bwd_data_tilen_s1"):
        name = f"portconv_depthwise_{k}"
        got = _entries(tool, "depthwise.cu", {"PC_DTYPE": 3, "PC_INDEX64": 0, "PC_DWT_N16": 4, "PC_ONLY": "",
                                              f"PC_ONLY_{name}": ""})
        regs, spill = got[name]
        assert regs <= 80 and spill == 0, f"{k}: {regs} registers, {spill} bytes spilled under NVRTC"


def _nvrtc_tool():
    """scripts/nvrtc_regs.py with libnvrtc found (a failure under PORTCONV_REQUIRE_NVRTC=1, else a skip)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvrtc_regs", ROOT / "scripts" / "nvrtc_regs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    try:
        tool.libnvrtc()
    except SystemExit as e:
        if os.environ.get("PORTCONV_REQUIRE_NVRTC") == "1":
            pytest.fail(f"PORTCONV_REQUIRE_NVRTC=1: {e}", pytrace=False)
        pytest.skip(f"{e} (set PORTCONV_REQUIRE_NVRTC=1 to make this a failure)")
    return tool


def _entries(tool, entry: str, defines: dict) -> dict[str, tuple[int, int]]:
    """{kernel: (registers, spilled bytes)} of every entry function NVRTC builds from ``entry`` for sm_90."""
    got = {}
    for line in tool.summary(tool.report(entry, "sm_90", defines)):
        name, regs, spill = re.match(r"(\w+): (\d+) registers, (\d+) bytes spilled", line).groups()
        got[name] = (int(regs), int(spill))
    return got


def test_every_kernel_builds_alone():
    """Note [one kernel a module]: each PC_KERNEL sits in the guard of its own name, and a module built with PC_ONLY
    and PC_ONLY_<kernel> holds exactly that kernel (NVRTC, sm_90, float32 and bfloat16), as the plans build them."""
    defined = set()
    for p in CUDA_DIR.glob("*.cuh"):
        text = p.read_text()
        for m in re.finditer(r"^PC_KERNEL\b[^\n]*?\b(portconv_\w+)\(", text, re.M):
            guard = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
            assert guard == f"#if !defined(PC_ONLY) || defined(PC_ONLY_{m.group(1)})", (p.name, m.group(1), guard)
            defined.add(m.group(1))
    tool = _nvrtc_tool()
    jobs = [(select.ENTRY[f], k, dt) for f, names in hip.KERNELS.items() for k in (*names, *hip.COMMON_KERNELS)
            for dt in (0, 3)]
    assert {k for _, k, _ in jobs} <= defined

    def build(job):
        entry, name, dt = job
        return job, _entries(tool, entry, {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_ONLY": "", f"PC_ONLY_{name}": ""})

    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        for (entry, name, dt), got in pool.map(build, jobs):
            assert set(got) == {name}, (entry, name, dt, sorted(got))


def test_the_finalize_waits_before_it_reads():
    """Note [dependent launch]: a finalize launched dependent may start before the kernel that writes its partial sums
    has finished; its first statement waits for it, so no read comes before (griddepcontrol.wait on sm_90+)."""
    body = (CUDA_DIR / "reduce.cuh").read_text().split("portconv_split_finalize(const pc_conv_args a) {", 1)[1]
    assert body.lstrip().startswith("pc_grid_dependency_wait();")
    prelude = (CUDA_DIR / "prelude.cuh").read_text()
    assert 'asm volatile("griddepcontrol.wait;" ::: "memory")' in prelude and "__CUDA_ARCH__ >= 900" in prelude


def test_sources_are_self_contained():
    """NVRTC at run time gets one inlined text and no include path: no system headers, every include resolved."""
    for p in CUDA_DIR.iterdir():
        assert not re.search(r"^\s*#\s*include\s*<", p.read_text(), re.M), f"{p.name} includes a system header"
    for entry in ENTRIES:
        text = inline_source(entry, [CUDA_DIR])
        assert "#include" not in text
        assert text.count("struct pc_conv_args {") == 1


def test_no_experiment_switches_remain():
    """Issue 28 point 5: the kernel sources keep only what a selection can build; the deleted variants' switches
    (and version histories in comments) are gone."""
    gone = ("PC_TC_LDSM", "PC_TC_V6", "PC_TC_V8", "PC_DWT_LA", "PC_DWT_PF", "PC_DWT_PK", "PC_DWT_DI", "PC_DWT_Q4",
            "PC_BF16_CVT", "PC_DIRECT_BODIES_ONLY", "portconv_depthwise_fwd(", "portconv_depthwise_bwd_data(")
    for p in [*CUDA_DIR.iterdir(), *(ROOT / "hip").iterdir()]:
        text = p.read_text()
        assert not [g for g in gone if g in text], p.name
        assert not re.search(r"\bv[0-9]+\b|before / after|notes-depthwise|experiments", text), p.name


def test_tensor_core_tile_is_cuda_only():
    """igemm.cu carries the tensor-core tile under PC_TENSOR_CORES; the HIP prelude refuses it; the emulator is
    pinned to the FMA tile."""
    text = inline_source("igemm.cu", [CUDA_DIR])
    assert "pc_igemm_tc_run" in text and "mma.sync.aligned.m16n8k16" in text and "#if PC_TENSOR_CORES" in text
    hip_prelude = (ROOT / "hip" / "prelude_hip.h").read_text()
    assert re.search(r"#if PC_TENSOR_CORES\s*\n#error", hip_prelude)
    assert "#define PC_TENSOR_CORES 0" in (EMU_DIR / "prelude.cuh").read_text()


def test_argument_block_matches_common_cuh():
    """simt/view.py packs the kernel argument block in exactly the order cuda/common.cuh declares it."""
    body = re.search(r"struct pc_conv_args \{(.*?)\};", (CUDA_DIR / "common.cuh").read_text(), re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for decl in re.findall(r"long long ([^;]+);", body):
        for item in decl.split(","):
            m = re.fullmatch(r"\s*(\w+)(?:\[(\d+)\])?\s*", item)
            fields.append((m.group(1), int(m.group(2) or 1)))
    assert tuple(fields) == view.ARG_FIELDS
    assert view.POINTERS == tuple(n for n, _ in view.ARG_FIELDS[:5])
    flags = dict(re.findall(r"#define (PC_FLAG_\w+) (\d+)", (CUDA_DIR / "common.cuh").read_text()))
    assert {k: int(v) for k, v in flags.items()} == {"PC_FLAG_CL": view.FLAG_CL, "PC_FLAG_VA": view.FLAG_VA,
                                                    "PC_FLAG_VB": view.FLAG_VB, "PC_FLAG_WARP": view.FLAG_WARP,
                                                    "PC_FLAG_COLTAP": view.FLAG_COLTAP}


def test_every_launched_kernel_exists():
    """Every kernel the selection may launch from a module (hip.KERNELS, the same list for both kernel sets, plus the
    tensor-core set's phase and staging kernels) is defined in its cuda/ entry."""
    for family, names in hip.KERNELS.items():
        text = inline_source(select.ENTRY[family], [CUDA_DIR])
        for name in (*names, *hip.COMMON_KERNELS):
            assert re.search(rf"PC_KERNEL void (PC_LAUNCH_BOUNDS(_MIN)?\([\w, ]+\)|PC_DWT_NBOUNDS) {name}\(", text), (
                family, name)  # PC_DWT_NBOUNDS: Note [rows by plan]
    text = inline_source(select.ENTRY["igemm-tc"], [CUDA_DIR])
    assert " portconv_igemm_bwd_data_phase(" in text and " portconv_stage_transpose(" in text


# --- the bodies on the CPU -------------------------------------------------------------------------------------
