"""CPU-only checks of the CUDA kernel set: nvcc builds every cuda/*.cu for sm_80 and sm_90, and the bodies run
under a CPU prelude (tests/cuda_emu) through the plans the simt set builds (select.py) and the same Executable the
GPU runs, loaded by the emulator's Loader (tests/emu.py), checked against PyTorch."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import zlib

import pytest
import torch
from emu import EmuKernels, EmuLoader
from gpu_refs import depthwise_tap_reference, reference

from portconv import backends, dwbands
from portconv.backends import BackendId
from portconv.backends.simt import depthwise, hip, igemm, select, view
from portconv.backends.simt.compile import inline_source
from portconv.backends.simt.cuda import CudaBackend
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.knobs import DEFAULT_OPTIONS, Options
from portconv.params import ConvParams
from portconv.planner import Plan, build
from portconv.problem import ConvView, Layout, Problem
from portconv.tensors import spec_of

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

class EmuBackend(CudaBackend):
    """The cuda backend with the emulator's Loader: its plans and Programs are the GPU's, run on the CPU; ``native``:
    its plans get the native executor (Note [native executor], tests/test_native.py)."""

    def __init__(self, kernels: EmuKernels, native: bool = False):
        super().__init__()
        self.emu, self.native = kernels, native
        self.loaders: list[EmuLoader] = []

    def loader(self, problem):
        self.loaders.append(EmuLoader(self.emu, native=self.native))
        return self.loaders[-1]

    def launches(self) -> list:
        """Every launch the last plan's calls made (its Programs, in load order)."""
        return self.loaders[-1].launches()


_DEVICE = DeviceInfo(vendor="nvidia", kind="gpu", name="emulated", arch="sm_90", compute_units=2, fp16=True,
                     bf16=True)



def run_plan(emu_backend, monkeypatch, problem: Problem, options: Options = DEFAULT_OPTIONS, choice=None,
             device: DeviceInfo = _DEVICE) -> Plan:
    """plan.build of ``problem`` on the emulated backend (registered as the cuda backend for the test)."""
    monkeypatch.setitem(backends._INSTANCES, BackendId.CUDA, emu_backend)
    choice = choice or emu_backend.choose(problem, device, options)
    return build(problem, BackendId.CUDA, device, choice, options)


@dataclasses.dataclass(frozen=True)
class EmuCase:
    rank: int
    n: int
    c: int
    k: int
    size: int
    kernel: int
    stride: int = 1
    padding: int | str = 0
    dilation: int = 1
    groups: int = 1
    transposed: bool = False
    output_padding: int = 0
    layout: str = "contig"  # contig, chlast, strided, rowpad / rowpad4 (rows 1 / 4 elements longer than the view)



EMU_CASES = [
    EmuCase(2, 2, 4, 6, 7, 3, padding=1),
    EmuCase(2, 1, 3, 5, 8, 3, stride=2, dilation=2, padding=2, layout="chlast"),
    EmuCase(1, 2, 4, 4, 9, 4, padding="same", dilation=1, layout="strided"),
    EmuCase(3, 1, 2, 3, 5, 3, stride=2, padding=1),
    EmuCase(2, 2, 6, 4, 6, 3, groups=2, padding=1, layout="strided"),
    EmuCase(2, 2, 4, 8, 7, 3, groups=4, stride=2, padding=1),  # depthwise, multiplier 2
    EmuCase(2, 1, 6, 6, 9, 5, groups=6, padding=2, dilation=2, layout="chlast"),  # depthwise, 25 taps
    EmuCase(2, 2, 4, 6, 4, 3, stride=2, padding=1, transposed=True, output_padding=1),
    EmuCase(2, 1, 4, 4, 5, 3, stride=3, padding=2, groups=2, transposed=True, output_padding=2, dilation=2),
    EmuCase(1, 3, 2, 3, 70, 1),  # 1x1 over a long row: split reductions on 2 "SMs"
    # the depthwise 'rows' fast paths (3 taps on the last axis, dilation 1, stride 1 or 2; 9/27-tap bwd-weight)
    EmuCase(2, 2, 3, 3, 9, 3, padding=1, groups=3),
    EmuCase(2, 2, 4, 4, 10, 3, stride=2, padding=1, groups=4, layout="strided"),
    EmuCase(3, 1, 2, 2, 6, 3, padding=1, groups=2),
    EmuCase(1, 2, 3, 6, 13, 3, padding=1, groups=3),  # multiplier 2, rank 1
]


def _seed(case: EmuCase) -> int:
    return zlib.crc32(repr(case).encode())


def _data(case: EmuCase, dtype):
    g = torch.Generator().manual_seed(_seed(case))
    shape = (case.n, case.c) + (case.size,) * case.rank
    wshape = ((case.c, case.k // case.groups) if case.transposed else (case.k, case.c // case.groups))
    wshape += (case.kernel,) * case.rank
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    w = torch.randn(wshape, generator=g, dtype=torch.float64)
    b = torch.randn(case.k * 2, generator=g, dtype=torch.float64)[::2]  # a strided bias
    if case.layout == "chlast" and case.rank >= 2:
        fmt = torch.channels_last if case.rank == 2 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    elif case.layout == "strided":
        x = torch.randn(shape[:-1] + (shape[-1] * 2,), generator=g, dtype=torch.float64)[..., ::2]
    elif case.layout in ("rowpad", "rowpad4"):  # sliced after the conversion (that would make a non-dense view dense)
        pad = 1 if case.layout == "rowpad" else 4
        x = torch.randn(shape[:-1] + (shape[-1] + pad,), generator=g, dtype=torch.float64).to(dtype)[..., :-pad]
    return x.to(dtype), w.to(dtype), b.to(dtype)


@pytest.fixture
def emu_backend(emu_kernels, knob_env):
    """The emulated cuda backend, results NaN-poisoned (PORTCONV_POISON=1): unwritten elements fail."""
    knob_env("PORTCONV_POISON", "1")
    return EmuBackend(emu_kernels)


def _tol(dtype):
    return {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]


def _setup(case: EmuCase, dtype):
    """(x, w, b, problem, grad_output, the float64 aten reference of all four)."""
    x, w, b = _data(case, dtype)
    params = ConvParams.make(case.rank, case.stride, case.padding, case.dilation, case.transposed,
                             case.output_padding, case.groups, weight_shape=tuple(w.shape))
    problem = Problem(params, spec_of(x), spec_of(w), True)
    go = torch.randn(problem.output_shape, dtype=torch.float64).to(dtype)
    return x, w, b, problem, go, reference(x, w, b, params, go, (True, True, True))


def _check(got, ref, dtype, what: str) -> None:
    """output, grad_input, grad_weight, grad_bias against the reference: shape, no NaN (unwritten), relative error."""
    for name, g_, r_ in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
        assert tuple(g_.shape) == tuple(r_.shape), f"{what} {name}: shape"
        assert not torch.isnan(g_).any(), f"{what} {dtype} {name}: unwritten (NaN) elements"
        err = ((g_.double() - r_).norm() / r_.norm().clamp_min(1e-30)).item()
        assert err < _tol(dtype), f"{what} {dtype} {name}: relative error {err:.3g}"


def _all(p: Plan, x, w, b, go):
    return (p.forward(x, w, b), *p.backward(go, x, w, (True, True, True)))


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"r{c.rank}g{c.groups}{'t' if c.transposed else ''}"
                         f"s{c.stride}{c.layout}")
def test_bodies_on_cpu_match_pytorch(emu_backend, case, monkeypatch):
    """Forward, grad_input, grad_weight, grad_bias of every family that applies (options(algorithm=...)), in float64
    (and one half type per case), against aten in float64, outputs NaN-poisoned. Each call of a layout after the first
    runs the loaded Program with the new tensors' addresses (Note [programs])."""
    dtypes = [torch.float64, (torch.float32, torch.float16, torch.bfloat16)[_seed(case) % 3]]
    for dtype in dtypes:
        x, w, b, problem, go, ref = _setup(case, dtype)
        algs = ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else [])
        # 'igemm-tc' (tensor cores: half types, and float32 where torch allows TF32, on sm_80+) cannot run here:
        # the emulator keeps PC_TENSOR_CORES=0 and runs the same gather through the FMA tile ('implicit_gemm')
        assert emu_backend.choose(problem, _DEVICE, Options()).algorithm in algs + (
            ["igemm-tc"] if dtype != torch.float64 else [])
        for alg in algs:
            p = run_plan(emu_backend, monkeypatch, problem, Options(algorithm=alg))
            assert p.algorithm == alg and f"forced by options(algorithm='{alg}')" in p.reason
            x0, w0, b0 = _data(case, dtype)  # the first call: same layouts, other storage
            _all(p, x0, w0, b0, go.clone())
            got = _all(p, x, w, b, go)
            assert len(emu_backend.loaders[-1].programs) == 2, alg  # one Program a call and layout
            _check(got, ref, dtype, alg)
        masked = p.backward(go, x, w, (False, True, False))
        assert masked[0] is None and masked[2] is None and masked[1] is not None
        assert len(emu_backend.loaders[-1].programs) == 3


@pytest.mark.parametrize("limit", [10**9, 0], ids=["warp", "thread"])
def test_warp_finalize_on_cpu(emu_backend, limit, monkeypatch):
    """Note [warp finalize]: every split reduction forced to 5-20 splits and the warp path switched on from 2 splits
    and up to ``limit`` values (the host's choice, PC_FLAG_WARP), so portconv_split_finalize sums each value with a
    warp (10**9) or a thread (0): the weight and bias gradients of the direct and implicit-GEMM bodies against aten
    in float64 (poisoned outputs)."""
    def many(blocks, total, min_chunk, units, count, align=1):
        chunk = -(-total // min(total, 20))
        chunk = -(-chunk // align) * align
        return -(-total // chunk), chunk

    monkeypatch.setattr(view, "splits_for", many)
    monkeypatch.setattr(view, "WARP_FINALIZE", 2)
    monkeypatch.setattr(view, "WARP_FINALIZE_MAX", limit)
    finals = []
    for case in EMU_CASES[:2] if limit else EMU_CASES[:1]:  # a thread a value: the path of every unforced split too
        for dtype in (torch.float64, torch.float32) if limit else (torch.float64,):
            x, w, b, problem, go, ref = _setup(case, dtype)
            for alg in ("direct", "implicit_gemm"):
                p = run_plan(emu_backend, monkeypatch, problem, Options(algorithm=alg))
                _check(_all(p, x, w, b, go), ref, dtype, f"{alg}, warp finalize up to {limit} values")
                finals += [x_ for x_ in emu_backend.launches() if x_.kernel == "portconv_split_finalize"]
                assert all(x_.dependent for x_ in finals)  # Note [dependent launch]: the CUDA set's finalize waits
    splits = [view.arg_field(x_, "splits") for x_ in finals]
    assert finals and min(splits) >= 2, splits
    assert all(bool(view.arg_field(x_, "flags") & view.FLAG_WARP) == bool(limit) for x_ in finals)


@pytest.mark.parametrize("case", [c for c in EMU_CASES if c.groups == c.c and not c.transposed],
                         ids=lambda c: f"r{c.rank}m{c.k // c.c}s{c.stride}{c.layout}")
def test_depthwise_rule_kernels_on_cpu(emu_backend, case, monkeypatch):
    """The depthwise plans: the 'rows' strip kernels forward and backward-data for any filter (the generic strip loop
    where the last axis is not 3 taps of dilation 1), the 'rows*d' weight gradients for 3x3 / 3x3x3 filters and the
    per-element weight gradient (PC_DW_TAPS taps a block) for the rest, in float64 against aten."""
    x, w, b, problem, go, ref = _setup(case, torch.float64)
    p = run_plan(emu_backend, monkeypatch, problem)
    assert p.algorithm == "depthwise"
    _check(_all(p, x, w, b, go), ref, torch.float64, "depthwise")
    names = {x_.kernel for x_ in emu_backend.launches()}
    v = ConvView.of(problem)
    tap3 = v.R[2] == 3 and v.DL[2] == 1
    want_w = depthwise.depthwise_kernels(v, p.memory_format != "contiguous")["bwd_weight"]
    assert ("portconv_depthwise_bwd_weight" in names) == (want_w == "plain"), names
    assert tap3 or {"portconv_depthwise_fwd_rows", "portconv_depthwise_bwd_data_rows"} <= names, names
    if case.kernel == 5:  # 5x5 taps, dilation 2: the per-element weight gradient
        assert want_w == "plain"
    if case.rank == 1:  # 1-D: one filter row, no 'bands' (Note [depthwise bands])
        assert want_w == "plain"


NARROW_CASES = [  # Note [narrow backward-data]: C_in <= igemm.NARROW_C, K >= igemm.NARROW_K, 2+ taps
    EmuCase(2, 2, 1, 16, 9, 3, stride=2, padding=1),  # C_in = 1, stride 2
    EmuCase(2, 1, 3, 16, 8, 4, stride=2, padding=1, layout="chlast"),  # RGB, an even kernel
    EmuCase(1, 2, 2, 16, 13, 5, dilation=2, padding=3),  # rank 1, dilation
    EmuCase(3, 1, 2, 16, 5, 3, stride=2, padding=1, layout="strided"),  # 3-D, a strided X
    EmuCase(2, 2, 16, 3, 5, 3, stride=2, padding=1, transposed=True, output_padding=1),  # a transposed forward to 3
    EmuCase(2, 1, 1, 16, 10, 2, stride=3, padding=1),  # stride > kernel: positions no tap reaches (0)
    EmuCase(1, 2, 1, 16, 11, 3, dilation=3, padding="same"),  # stride 1, dilation 3: o steps by 3
    EmuCase(2, 1, 16, 2, 4, 3, stride=3, padding=2, transposed=True, output_padding=1),  # first taps past Y's end
]


@pytest.mark.parametrize("case", NARROW_CASES, ids=lambda c: f"r{c.rank}c{c.c}{'t' if c.transposed else ''}{c.layout}")
def test_narrow_backward_data_on_cpu(emu_backend, case, monkeypatch):
    """Note [narrow backward-data]: the implicit-GEMM plans of problems with few dX channels compute grad_input (the
    forward, transposed) as a 1 x 1 column GEMM (portconv_igemm_col into the workspace) and portconv_col2im, with W
    dense in both orders (its (c, tap) columns c-major or tap-major): all four results against aten in float64 and
    float32, outputs poisoned."""
    for dtype in (torch.float64, torch.float32):
        x, w, b, problem, go, ref = _setup(case, dtype)
        for w_layout in ("contig", "chlast") if case.rank >= 2 else ("contig",):
            if w_layout == "chlast":
                w = w.contiguous(memory_format=torch.channels_last if case.rank == 2 else torch.channels_last_3d)
                problem = Problem(problem.params, problem.input, spec_of(w), True)
            v = ConvView.of(problem)
            assert igemm.narrow_col(v, w.shape, w.stride()), case
            p = run_plan(emu_backend, monkeypatch, problem, Options(algorithm="implicit_gemm"))
            assert "col2im" in p.reason
            _check(_all(p, x, w, b, go), ref, dtype, f"narrow {w_layout} W")
            names = [x_.kernel for x_ in emu_backend.launches()]
            assert names.count("portconv_col2im") == names.count("portconv_igemm_col") == 1, names
            assert "portconv_igemm_bwd_data" not in names, names
            (col2im,) = [x_ for x_ in emu_backend.launches() if x_.kernel == "portconv_col2im"]
            assert bool(view.arg_field(col2im, "flags") & view.FLAG_COLTAP) == (w_layout == "chlast" and v.C > 1)


# --- depthwise tiles (Note [depthwise tile] of cuda/conv_depthwise_tile.cuh), planes, stride-2 backward-data ---------

DW3_CASES = [
    EmuCase(2, 2, 6, 6, 9, 3, padding=1, groups=6, layout="chlast"),  # tile s1, vector path (C even)
    EmuCase(2, 1, 3, 3, 7, 3, padding=1, groups=3, layout="chlast"),  # tile s1, scalar fallback (C odd)
    EmuCase(2, 1, 8, 8, 20, 3, padding=1, groups=8, layout="chlast"),  # 4 channels per thread (16-bit), 2 row tiles
    EmuCase(2, 2, 16, 16, 6, 3, stride=2, padding=1, groups=16, layout="chlast"),  # 16 channels, stride 2
    EmuCase(2, 2, 4, 4, 10, 3, stride=2, padding=1, groups=4, layout="chlast"),  # tile s2, rows3s2 (P odd)
    EmuCase(2, 1, 4, 4, 11, 3, stride=2, padding=0, groups=4),  # rows3s2 (P even), NCHW tile s2 under 'all'
    EmuCase(2, 1, 2, 2, 9, 3, stride=2, padding=2, groups=2, layout="strided"),  # rows3s2, P = 2
    EmuCase(3, 1, 4, 4, 6, 3, padding=1, groups=4, layout="chlast"),  # tile 3-D (R0 = 3)
    # Note [packed rows] (2-D NCHW, 16-bit: 32-bit pairs along W where every stride is even)
    EmuCase(2, 2, 4, 4, 10, 3, padding=1, groups=4),  # odd P (window starts odd), last strip 2 of 4 columns
    EmuCase(2, 1, 3, 3, 12, 3, padding=2, groups=3),  # even P, 14 output columns
    EmuCase(2, 1, 4, 4, 9, 3, stride=2, padding=0, groups=4, layout="rowpad"),  # 9 of 10: a pair crosses the end
    EmuCase(2, 1, 4, 4, 9, 3, padding=1, groups=4, layout="rowpad"),  # stride 1, X rows 9 of 10, dense Y: unpacked
    EmuCase(2, 1, 2, 2, 10, 3, stride=2, padding=1, groups=2),  # 5 output columns: Y's rows odd, scalar fallback
    EmuCase(3, 1, 2, 2, 7, 3, stride=2, padding=1, groups=2, layout="chlast"),  # tile 3-D, stride 2
    EmuCase(3, 1, 3, 3, 10, 3, padding=1, groups=3),  # NCHW 3-D under 'all': 10 rows, a part-filled 8-row tile
    EmuCase(2, 2, 2, 2, 5, 3, padding=1, groups=2),  # NCHW 2-D under 'all': 5 rows, fewer than a tile's 8
    EmuCase(2, 2, 64, 64, 10, 3, padding=1, groups=64, layout="chlast"),  # 16-bit: 1-2 weight units a thread
    EmuCase(3, 1, 2, 2, 8, 3, padding=2, groups=2),  # NCHW 3-D under 'all': padding 2, 10 output columns
    EmuCase(3, 2, 2, 2, 9, 3, padding=1, groups=2, layout="strided"),  # NCHW 3-D, strided X
    # Note [quad rows] (2-D NCHW, 16-bit, P 1, rows a multiple of 4: 8-byte strips, 2-byte halos)
    EmuCase(2, 2, 4, 4, 12, 3, padding=1, groups=4),  # 3 strips (halos inside the row), 12 rows: 8 + a part-filled tile
    EmuCase(2, 1, 2, 2, 4, 3, padding=1, groups=2),  # one strip (both halos at the row's ends), 4 rows
    EmuCase(2, 1, 3, 3, 8, 3, padding=1, groups=3, layout="rowpad4"),  # X rows 12 apart (dense Y)
]

PLANES_CASES = [  # Note [depthwise planes]: 2-D NCHW 3x3 stride 1 on planes of at most DWP_PLANE elements
    EmuCase(2, 2, 5, 5, 7, 3, padding=1, groups=5),  # mbv2-dw3x3-last's 7x7 planes, one strip a row
    EmuCase(2, 1, 3, 3, 14, 3, padding=1, groups=3),  # 14x14: strips of 4, 4, 4, 2
    EmuCase(2, 3, 4, 4, 9, 3, padding=0, groups=4),  # no padding: Y 7x7 inside X 9x9 (backward padding 2)
    EmuCase(2, 1, 4, 4, 6, 3, padding=2, groups=4),  # padding 2: Y 8x8 around X 6x6 (backward padding 0)
    EmuCase(2, 4, 10, 10, 7, 3, padding=1, groups=10),  # 40 planes: a block of 32 and one of 8
    EmuCase(2, 2, 4, 4, 7, 3, padding=1, groups=4, layout="strided"),  # X not plane-contiguous: rows3s1 forward
]

@pytest.fixture(params=["cl", "all"])
def tile_where(request, monkeypatch):
    """Where the depthwise tile kernels run: 'cl' (channels-last only: no NCHW view is big enough) or 'all' (every
    view whose filter they take, however small), by the thresholds of Note [depthwise tile]."""
    if request.param == "cl":
        monkeypatch.setattr(depthwise, "DW_TILE_MIN_ROWS", 10**9)
    else:
        monkeypatch.setattr(depthwise, "DW_TILE_MIN_ROWS", 0)
        monkeypatch.setattr(depthwise, "DW_TILE_MIN_WORK", 0)
    return request.param


def test_depthwise_tile_shapes_match_the_header():
    """depthwise.DW_TILE sizes the tile kernels' grids and names their shape in plans: it must say what
    cuda/conv_depthwise_tile.cuh compiles by default, family by family."""
    src = (CUDA_DIR / "conv_depthwise_tile.cuh").read_text()
    d = {k: int(v) for k, v in re.findall(r"#define (PC_DWT_\w+) (\d+)", src)}
    fam = {"nchw": ("THN", "VWN"), "nchw16": ("THN16", "VWN16"), "nchw3d": ("TH3", "VW3"), "cl": ("THC", "VWC"),
           "cl3d": ("THC3", "VWC"), "w4": ("THW4", "VWW4")}
    assert depthwise.DW_TILE == {k: (d["PC_DWT_" + th], d["PC_DWT_" + vw]) for k, (th, vw) in fam.items()}
    assert [depthwise.dw_tile_key(cl, r, dt) for cl, r, dt in [
        (False, 2, "float32"), (False, 2, "bfloat16"), (False, 3, "float16"), (True, 2, "float16"),
        (True, 3, "float32"), (False, 1, "float64")]] == ["nchw", "nchw16", "nchw3d", "cl", "cl3d", "nchw"]


@pytest.mark.parametrize("case", DW3_CASES, ids=lambda c: f"r{c.rank}s{c.stride}p{c.padding}c{c.c}{c.layout}"
                         f"{'t' if c.transposed else ''}")
def test_depthwise_tile_bodies_on_cpu(emu_backend, case, tile_where, monkeypatch):
    """The depthwise tile kernels and the stride-2 backward-data window in every dtype against aten in float64."""
    _depthwise_all_dtypes(emu_backend, case, monkeypatch)


def _depthwise_all_dtypes(emu_backend, case, monkeypatch):
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        x, w, b, problem, go, ref = _setup(case, dtype)
        if case.layout == "chlast" and case.rank >= 2:  # dY in x's layout too, as autograd gives it: the vector paths
            go = go.contiguous(memory_format=torch.channels_last if case.rank == 2 else torch.channels_last_3d)
        p = run_plan(emu_backend, monkeypatch, problem)
        assert p.algorithm == "depthwise"
        _check(_all(p, x, w, b, go), ref, dtype, f"depthwise ({'; '.join(p.kernels[0].lines())})")


def test_depthwise_planes_sizes(monkeypatch):
    """Note [depthwise planes]: planes a chunk (about DWP_UNITS result columns, 16-byte aligned chunk starts, within
    DWP_MAX_BYTES), the module's shared memory in DWP_STEP steps and the blocks an SM it leaves."""
    last = ConvView(32, 960, 960, 960, (1, 7, 7), (1, 7, 7), (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1))
    m14 = dataclasses.replace(last, C=576, K=576, G=576, X=(1, 14, 14), Y=(1, 14, 14))
    dw_planes, dwp_build = depthwise.dw_planes, depthwise.dwp_build
    assert dw_planes(last, "fwd", 4) == (36, 36 * 147 * 4 + 32)  # 252 columns; 36 x 196 bytes: 16-byte steps
    assert dw_planes(last, "bwd_data", 2)[0] == 32  # 98-byte planes: 8 a 16-byte step
    assert dw_planes(m14, "fwd", 4)[0] == 18 and dw_planes(m14, "fwd", 8)[0] == 10  # 48 KiB at most
    assert dwp_build(last, 4, "sm_90") == (24576, 6) and dwp_build(m14, 4, "sm_90") == (49152, 4)
    assert dwp_build(m14, 4, "sm_80") == (49152, 3) and dwp_build(last, 2, "gfx90a") == (16384, 3)
    assert dwp_build(last, 2, "sm_90") == (16384, 5) and dwp_build(last, 8, "sm_90") == (49152, 4)
    pad0 = dataclasses.replace(last, Y=(1, 5, 5), P=(0, 0, 0))  # the larger direction sizes the module
    fwd, bwd = dw_planes(pad0, "fwd", 4), dw_planes(pad0, "bwd_data", 4)
    assert fwd == (48, 48 * (2 * 49 + 25) * 4 + 32) and bwd == (36, 36 * (2 * 25 + 49) * 4 + 32)
    assert dwp_build(pad0, 4, "sm_90") == (24576, 6)
    monkeypatch.setattr(depthwise, "DWP_UNITS", 64)
    monkeypatch.setattr(depthwise, "DWP_BLOCKS", {2: 0, 4: 0, 8: 0})
    assert dw_planes(last, "fwd", 4)[0] == 8 and dwp_build(last, 4, "sm_90")[1] == 0


@pytest.mark.parametrize("sizes", [None, (8, 0), (8, 1)], ids=["default", "small-chunks", "sm-blocks"])
@pytest.mark.parametrize("case", PLANES_CASES, ids=lambda c: f"n{c.n}c{c.c}s{c.size}p{c.padding}{c.layout}")
def test_depthwise_planes_on_cpu(emu_backend, case, sizes, monkeypatch):
    """Note [depthwise planes]: forward (with bias) and grad_input through portconv_depthwise_*_planes in all four
    dtypes against aten in float64, outputs poisoned. 'small-chunks' (DWP_UNITS 8, DWP_BLOCKS 0) gives a chunk 1 to 8
    planes and a block each: many blocks, a short last chunk, chunk starts off 16 bytes (the element-wise copies);
    'sm-blocks' (DWP_BLOCKS 1) runs them on one block an emulated SM (2), each block several chunks, through both
    source buffers. A view whose planes are not back to back runs rows3s1."""
    if sizes:
        monkeypatch.setattr(depthwise, "DWP_UNITS", sizes[0])
        monkeypatch.setattr(depthwise, "DWP_BLOCKS", dict.fromkeys((2, 4, 8), sizes[1]))
    launches = []
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        x, w, b, problem, go, ref = _setup(case, dtype)
        p = run_plan(emu_backend, monkeypatch, problem)
        _check(_all(p, x, w, b, go), ref, dtype, f"planes ({'; '.join(p.kernels[0].lines())})")
        launches += emu_backend.launches()
    names = {x_.kernel for x_ in launches}
    strided = case.layout == "strided"
    assert ("portconv_depthwise_fwd" + ("_rows3s1" if strided else "_planes")) in names, names
    assert "portconv_depthwise_bwd_data_planes" in names, names  # dY and dX are dense
    grids = {x_.grid[0] for x_ in launches if x_.kernel.endswith("_planes")}
    if sizes:
        assert max(grids) <= 2 if sizes[1] == 1 else max(grids) >= 2, grids


BANDS_CASES = [  # Note [depthwise bands]: NCHW filters with no 3-tap kernel
    EmuCase(2, 2, 3, 3, 9, 5, padding=2, groups=3),  # 5x5 stride 1: fwd and bwd-data, 3 planes a block
    EmuCase(2, 2, 4, 4, 7, 7, padding=3, groups=4),  # ConvNeXt's last stage: 7x7 planes, one row group a plane
    EmuCase(2, 1, 2, 2, 48, 5, padding=2, groups=2),  # 48x48: bands of 40 rows (5 groups of 8), the last 8 rows
    EmuCase(2, 2, 3, 3, 11, 13, padding=6, groups=3),  # 13 filter rows in steps of 7 (14, one zero row)
    EmuCase(2, 2, 3, 3, 7, 13, padding=6, groups=3),  # 13x13 on 7x7: 7 columns a thread (Note [bands columns])
    EmuCase(2, 1, 2, 2, 5, 13, padding=13, groups=2),  # clipped forward whose edge outputs read no column
    EmuCase(2, 1, 4, 4, 12, 5, stride=2, padding=2, groups=4),  # stride 2: bands_s2, bwd-data in 4 phases
    EmuCase(2, 2, 3, 3, 11, 4, stride=2, padding=1, groups=3),  # odd X, even filter: phases of 2 and 2 taps
    EmuCase(2, 1, 2, 2, 10, 7, stride=2, padding=1, groups=2),  # 7 taps, padding 1: sub-filters of 4 and 3
    EmuCase(2, 2, 3, 6, 8, 4, padding=1, groups=3),  # even filter, multiplier 2: bands forward, rows bwd-data
    EmuCase(2, 1, 4, 4, 10, 5, padding=0, groups=4, layout="strided"),  # no padding, a strided X
    EmuCase(2, 2, 4, 8, 9, 5, padding=2, groups=4, layout="chlast"),  # channels-last (multiplier 2: not 'clw')
    EmuCase(2, 1, 3, 3, 12, 10, stride=2, padding=4, groups=3, layout="chlast"),  # channels-last phases, 10 taps
]


def _family_launches(emu_backend, case, monkeypatch, what: str) -> list:
    """Every direction of ``case``'s plan in the four dtypes against aten in float64 (outputs poisoned); the
    launches they made."""
    launches = []
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        x, w, b, problem, go, ref = _setup(case, dtype)
        p = run_plan(emu_backend, monkeypatch, problem)
        assert p.algorithm == "depthwise"
        _check(_all(p, x, w, b, go), ref, dtype, f"{what} ({'; '.join(p.kernels[0].lines())})")
        launches += emu_backend.launches()
    return launches


@pytest.mark.parametrize("case", BANDS_CASES, ids=lambda c: f"r{c.rank}k{c.kernel}s{c.stride}m{c.k // c.c}"
                         f"{c.size}{c.layout}")
def test_depthwise_bands_on_cpu(emu_backend, case, monkeypatch):
    """Note [depthwise bands]: forward (with bias) and grad_input of the 'bands' kernels in all four dtypes against
    aten in float64, outputs poisoned; the forward and grad_weight run 'bands' on every case, grad_input where the
    multiplier is 1 (stride 2: Note [bands phases])."""
    launches = _family_launches(emu_backend, case, monkeypatch, "bands")
    names = {x_.kernel for x_ in launches}
    assert f"portconv_depthwise_fwd_bands_s{case.stride}" in names, names
    assert (f"portconv_depthwise_bwd_data_bands_s{case.stride}" in names) == (case.k == case.c), names
    assert f"portconv_depthwise_bwd_weight_bands_s{case.stride}" in names, names
    splits = {view.arg_field(x_, "splits") for x_ in launches if "weight_bands" in x_.kernel}
    if case.size == 48:  # two bands: two units, split over the two emulated SMs (the finalize's path)
        assert max(splits) >= 2, splits


def test_depthwise_bands_planes_past_the_float_division(emu_backend, monkeypatch):
    """Note [staged loads]: where a view has 2**22 planes or more (N K + P > 2**22), the bands forward and
    backward-data find a staged plane's image by integer division (pc_dwb_div is exact below 2**22 only): at stride 2
    the forward stages in the row form and the backward-data (phases) in the element form, so one case runs both.
    Two channels-last images of 2**21 + 20 channels of 2 x 3 with a 2 x 2 filter (the clw kernels off), float32
    against float64 formed tap by tap, outputs poisoned (the OpenCL set's twin, at both strides:
    tests/test_opencl_depthwise.py). About 40 s in the emulator."""
    stride = 2
    monkeypatch.setattr(depthwise, "clw_kernels", lambda *a: ("", "", ""))
    c = (1 << 21) + 20
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, c, 2, 3, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(c, 1, 2, 2, generator=g), torch.randn(c, generator=g)
    params = ConvParams.make(2, stride, 0, 1, False, 0, c, weight_shape=tuple(w.shape))
    p = run_plan(emu_backend, monkeypatch, Problem(params, spec_of(x), spec_of(w), True))
    y = p.forward(x, w, b)
    go = torch.randn(y.shape, generator=g)
    gx = p.backward(go, x, w, (True, False, False))[0]
    names = {x_.kernel for x_ in emu_backend.launches()}
    assert {f"portconv_depthwise_fwd_bands_s{stride}", f"portconv_depthwise_bwd_data_bands_s{stride}"} <= names, names
    ry, rgx = depthwise_tap_reference(x, w, b, go, stride)
    for name, got, ref in (("output", y, ry), ("grad_input", gx, rgx)):
        assert not torch.isnan(got).any(), f"{name}: unwritten (NaN) elements"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err < _tol(torch.float32), f"{name}: relative error {err:.3g}"


CLW_CASES = [  # Note [depthwise clw]: channels-last filters of 2 to 9 taps an axis, not 3 along the last
    EmuCase(2, 2, 8, 8, 9, 5, padding=2, groups=8, layout="chlast"),  # vector path in every dtype
    EmuCase(2, 2, 12, 12, 10, 7, padding=3, groups=12, layout="chlast"),  # ConvNeXt's 7x7; weight splits > 1
    EmuCase(2, 1, 8, 8, 11, 5, stride=2, padding=2, groups=8, layout="chlast"),  # stride 2: Note [clw phases]
    EmuCase(2, 2, 8, 8, 10, 4, stride=2, padding=1, groups=8, layout="chlast"),  # even filter, even size: phases
    EmuCase(2, 1, 4, 4, 9, 7, stride=2, padding=0, groups=4, layout="chlast"),  # no padding: d >= TM - 1
    EmuCase(2, 1, 6, 6, 9, 4, padding=1, groups=6, layout="chlast"),  # even filter; 16-bit: C % 4, one a lane
    EmuCase(2, 1, 66, 66, 5, 5, padding=2, groups=66, layout="chlast"),  # channel tiles of 32 groups and a rest
]


@pytest.mark.parametrize("case", CLW_CASES, ids=lambda c: f"k{c.kernel}s{c.stride}c{c.c}")
def test_depthwise_clw_on_cpu(emu_backend, case, monkeypatch):
    """Note [depthwise clw]: forward (with bias), grad_input and grad_weight of the 'clw' kernels in all four dtypes
    against aten in float64, outputs poisoned; the stride-2 backward-data by phases (Note [clw phases])."""
    launches = _family_launches(emu_backend, case, monkeypatch, "clw")
    names = {x_.kernel for x_ in launches}
    assert {f"portconv_depthwise_fwd_clw_s{case.stride}", f"portconv_depthwise_bwd_weight_clw_s{case.stride}"} <= names
    assert f"portconv_depthwise_bwd_data_clw_s{case.stride}" in names, names
    splits = {view.arg_field(x_, "splits") for x_ in launches if "weight_clw" in x_.kernel}
    if case.kernel == 7:
        assert max(splits) >= 2, splits


def test_depthwise_clw_any_grid_computes_every_output(emu_backend, monkeypatch):
    """Note [depthwise clw]: channel tiles and spatial tiles are grid-stride loops: one block of one channel tile
    (grid (1, 1)) computes the whole forward and backward-data of a problem with several of each."""
    from portconv import dwclw as D

    monkeypatch.setattr(D, "DWC_BLOCKS_PER_UNIT", 0)
    monkeypatch.setattr(D, "clw_groups", lambda view_, dtype, lanes: (min(view_.C, D.DWC_CTMAX, lanes), 1))
    launches = _family_launches(emu_backend, CLW_CASES[-1], monkeypatch, "clw (one block)")
    grids = {x_.grid for x_ in launches if "_clw_" in x_.kernel and "weight" not in x_.kernel}
    assert grids == {(1, 1, 1)}, grids


def test_depthwise_clw_rule():
    """Note [depthwise clw]: where the 'clw' kernels run, and their grids."""
    from portconv import dwclw as D
    from portconv.backends.simt import depthwise

    def view_(hw, r, s=1, c=96, k=None, r1=None):
        r1 = r1 or r
        y = (hw + 2 * (r // 2) - r) // s + 1
        return ConvView(64, c, k or c, c, (1, hw, hw), (1, y, y), (1, r1, r), (1, s, s), (0, r1 // 2, r // 2),
                        (1, 1, 1))

    assert D.clw_kernels(view_(56, 7), True, "bfloat16") == ("clw_s1", "clw_s1", "clw_s1")
    assert D.clw_kernels(view_(56, 5, 2), True, "float32") == ("clw_s2",) * 3  # Note [clw phases]
    assert D.clw_kernels(view_(56, 7), False, "bfloat16") == ("", "", "")  # NCHW results: 'bands'
    assert D.clw_kernels(view_(56, 3), True, "bfloat16") == ("", "", "")  # 3 taps: the tile kernels
    assert D.clw_kernels(view_(56, 5, r1=3), True, "float32") == ("clw_s1",) * 3  # 3 rows, 5 columns
    assert D.clw_kernels(view_(56, 13), True, "float32") == ("", "", "")  # 13 taps: 'bands'
    assert D.clw_kernels(view_(56, 7, k=192), True, "float32") == ("", "", "")  # multiplier 2
    assert D.clw_kernels(view_(56, 9), True, "float16") == ("clw_s1",) * 3  # 81 x 32 x 4 x 4 bytes: 41 KB
    assert depthwise.depthwise_kernels(view_(56, 7), True, "bfloat16") == {
        "fwd": "clw_s1", "bwd_data": "clw_s1", "bwd_weight": "clw_s1"}
    assert D.clw_groups(view_(56, 7), "bfloat16", 256) == (24, 1)  # 96 channels: 24 groups of 4
    assert D.clw_groups(view_(14, 7, c=384), "float32", 256 // 7) == (32, 6)  # 192 groups of 2, 32 a block
    vc = D.DWC_GEOMETRY["bfloat16"].vc
    assert D.clw_groups(view_(56, 5, c=36 * vc), "bfloat16", 256) == (18, 2)  # 36 groups: 2 tiles of 18, not 32 + 4
    assert D.clw_groups(view_(56, 5, c=30 * vc), "bfloat16", 256 // 5) == (30, 1)
    assert D.clw_groups(view_(56, 5, c=67), "bfloat16", 256) == (23, 3)  # odd C: one channel a group, 23 + 22 + 22


def test_depthwise_clw_constants():
    """cuda/conv_depthwise_clw.cuh's defaults are portconv/dwclw.py's values (the 16-bit geometry)."""
    from portconv import dwclw as D

    src = (pathlib.Path(__file__).resolve().parents[1] / "cuda" / "conv_depthwise_clw.cuh").read_text()
    _, th, vw, _, vww, minb, minbw, row_loop = D.DWC_GEOMETRY["bfloat16"]  # VC, VW by stride: the host's always
    for name, value in (("PC_DWC_TH", th), ("PC_DWC_VW", vw), ("PC_DWC_VWW", vww), ("PC_DWC_MINB", minb),
                        ("PC_DWC_MINBW", minbw), ("PC_DWC_ROWLOOP", int(row_loop)),
                        ("PC_DWC_CTMAX", D.DWC_CTMAX), ("PC_DWC_THREADS", view.THREADS)):
        assert re.search(rf"#define {name} {value}\b", src), name


def test_depthwise_bands_geometry():
    """Note [depthwise bands]: planes a block, bands a plane and shared bytes per direction, the filter-row step."""
    def view_(hw, r, s=1, n=64, c=96):
        y = (hw + 2 * (r // 2) - r) // s + 1
        return ConvView(n, c, c, c, (1, hw, hw), (1, y, y), (1, r, r), (1, s, s), (0, r // 2, r // 2), (1, 1, 1))

    assert [dwbands.dwb_ch(r) for r in (1, 5, 7, 8, 9, 13, 31)] == [1, 5, 7, 8, 5, 7, 8]
    st1 = view_(56, 7)  # G = 4 row groups of 8: bands of 32 rows; 38 x 62 staged + 7 x 7 weights
    assert dwbands.dw_bands(st1, "fwd", "float32") == (1, 2, (38 * 62 + 49) * 4)
    assert dwbands.dw_bands(view_(14, 7), "fwd", "float32") == (9, 1, 9 * (22 * 20 + 49) * 4)
    assert dwbands.dw_bands(view_(56, 5, s=2), "fwd", "bfloat16") == (2, 1, 2 * (67 * 59 + 25) * 4)
    assert dwbands.dw_bands(view_(56, 5, s=2), "bwd_data", "float32")[:2] == (2, 1)  # 4 phases of 28 x 28
    assert dwbands.dwb_phases(view_(56, 5, s=2), "bwd_data") == [((28, 3), (28, 3)), ((28, 3), (28, 2)),
                                                                   ((28, 2), (28, 3)), ((28, 2), (28, 2))]
    assert dwbands.dwb_step(view_(56, 5, s=2), "bwd_data") == 3 and dwbands.dwb_step(view_(56, 5), "fwd") == 5
    assert dwbands.THREADS == view.THREADS  # one group size for every bands launch
    assert dwbands.GRID_SPLITS_MAX == view.GRID_YZ_MAX
    assert dwbands.dwb_vh(view_(56, 31)) == 16 and dwbands.dwb_vh(view_(56, 7)) == 8  # tall filters: 16 rows
    assert dwbands.dw_bands(view_(56, 31), "fwd", "float32") == (1, 1, (95 * 86 + 32 * 31) * 4)  # 4 groups of 16
    assert dwbands.dw_bands(view_(56, 31), "fwd", "float64") is None  # 73 KB a plane
    # Note [small planes]: 7 rows, 7 a thread, all 13 filter rows a step: 19 x 19 staged, no zero filter rows
    r13 = view_(7, 13, n=32, c=1024)
    assert dwbands.dwb_vh(r13) == 7 and dwbands.dwb_step(r13, "fwd") == dwbands.dwb_step(r13, "bwd_data") == 13
    assert dwbands.dw_bands(r13, "fwd", "float32") == (23, 1, 23 * (19 * 19 + 13 * 13) * 4)  # shared memory, not
    # threads (36), limits the planes
    assert dwbands.dwb_vh(view_(7, 7)) == 7 and dwbands.dwb_step(view_(7, 7), "fwd") == 7
    assert dwbands.dwb_vh(view_(9, 13)) == 8 and dwbands.dwb_step(view_(9, 13), "fwd") == 7  # 9 rows: 2 a column
    # one define (PC_DWB_CH) serves the forward and stride-1 backward-data: one step for both, also where only one
    # direction's rows fit a column (7 input rows under padding 8: 11 output rows; 9 input rows, padding 4: 5)
    for hw, pad in ((7, 8), (9, 4), (7, 6)):
        v = dataclasses.replace(view_(hw, 13), Y=(1, hw + 2 * pad - 12, hw + 2 * pad - 12), P=(0, pad, pad))
        assert dwbands.dwb_step(v, "fwd") == dwbands.dwb_step(v, "bwd_data"), (hw, pad)
    assert dwbands.dw_bands(dataclasses.replace(st1, X=(1, 300, 300), Y=(1, 300, 300)), "fwd", "float32") is None
    src = (pathlib.Path(__file__).resolve().parents[1] / "cuda" / "conv_depthwise_bands.cuh").read_text()
    d = {k: int(v) for k, v in re.findall(r"#define (PC_DWB_\w+) +(\d+)", src)}
    assert (d["PC_DWB_VH"], d["PC_DWB_U"], d["PC_DWB_ROWS"], d["PC_DWB_MAX"]) == (
        dwbands.DWB_VH, dwbands.DWB_U, dwbands.DWB_ROWS, dwbands.DWB_MAX_BYTES)  # the kernel's own sizes
    wg = dwbands.dwb_wgeometry  # weight gradient: units of about DWB_ROWS positions
    assert wg(st1, "float32") == (1, 2, (42 * 62 + 36 * 56) * 4)  # 36-row bands of 56 (8-column runs)
    assert wg(view_(14, 7), "float32") == (9, 1, 9 * (20 * 22 + 14 * 16) * 4)  # 9 planes of 14 rows
    assert wg(view_(7, 13, n=32, c=1024), "float32") == (27, 1, 27 * (19 * 21 + 7 * 8) * 4)  # as many as fit
    assert wg(view_(56, 31), "float64") is None and wg(view_(56, 31), "float32")[:2] == (1, 2)
    # Note [bands columns]: clipped only where no output column reaches every filter column
    clips = dwbands.dwb_clips
    assert clips(view_(7, 13), "fwd") and clips(view_(7, 13), "bwd_data")  # 7 of 13 columns everywhere
    assert not any(clips(v_, d) for v_ in (view_(7, 7), view_(14, 5), view_(56, 5, s=2), view_(56, 31))
                   for d in ("fwd", "bwd_data"))
    pad13 = dataclasses.replace(view_(5, 13), Y=(1, 19, 19), P=(0, 13, 13))
    assert clips(pad13, "fwd") and not clips(pad13, "bwd_data")
    assert [dwbands.dwb_columns(13 - o, 5, 1, 13) for o in (0, 8, 9, 17, 18)] == [0, 5, 5, 1, 0]
    assert dwbands.dwb_defines(view_(7, 13), "float32")["CLIP"] == 3 and dwbands.dwb_defines(pad13, "float32")[
        "CLIP"] == 1 and dwbands.dwb_defines(view_(7, 7), "float32")["CLIP"] == 0


@pytest.mark.parametrize("extra", [{"PC_DWT_RING": 1, "PC_DWT_RD": 2, "PC_DWT_FRING": 1, "PC_DWT_FRD": 4,
                                    "PC_DWT_NRING": 1},
                                   {"PC_DWT_RING": 1, "PC_DWT_RD": 4, "PC_DWT_FRING": 1, "PC_DWT_FRD": 2,
                                    "PC_DWT_NRING": 1},
                                   {"PC_DWT_QD": 3}],
                         ids=["ring2", "ring4", "quad-qd3"])
def test_depthwise_tile_switches_on_cpu(extra, knob_env, tmp_path, monkeypatch):
    """The tile kernels' compile-time parameters that keep the tile shape stay correct: Note [async row ring] on in
    every kernel that has it, with 2 and 4 slots (the GPU's default with cp.async; the CPU prelude copies
    synchronously, so the ring is off there by default), and Note [quad rows] with 3 rows in flight: every DW3 case,
    tiles everywhere, every dtype. The defaults run in test_depthwise_tile_bodies_on_cpu."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of the CUDA bodies needs a C++20 compiler")
    knob_env("PORTCONV_POISON", "1")
    monkeypatch.setattr(depthwise, "DW_TILE_MIN_ROWS", 0)
    monkeypatch.setattr(depthwise, "DW_TILE_MIN_WORK", 0)
    be = EmuBackend(EmuKernels(tmp_path, extra=extra))
    for case in DW3_CASES:
        _depthwise_all_dtypes(be, case, monkeypatch)


def test_depthwise_selection(monkeypatch):
    """Which depthwise kernel runs where (depthwise.depthwise_kernels), per layout, and the strip width."""
    def view_(s, rank=2, k=144, r=3):
        lead = 3 - rank
        return ConvView(32, 144, k, 144, (1,) * lead + (56,) * rank, (1,) * lead + (56 // s,) * rank,
                        (1,) * lead + (r,) * rank, (1,) * lead + (s,) * rank, (0,) * lead + (1,) * rank, (1, 1, 1))

    ks = depthwise.depthwise_kernels
    assert ks(view_(1), cl=True) == {"fwd": "tile_s1", "bwd_data": "tile_s1", "bwd_weight": "tile2d_s1"}
    assert ks(view_(2), cl=True) == {"fwd": "tile_s2", "bwd_data": "rows3s2", "bwd_weight": "tile2d_s2"}
    assert ks(view_(1)) == {"fwd": "tilen_s1", "bwd_data": "tilen_s1", "bwd_weight": "rows2d_s1"}  # big enough
    assert ks(view_(2)) == {"fwd": "tilen_s2", "bwd_data": "rows3s2", "bwd_weight": "rows2d_s2"}
    assert ks(view_(2, rank=3))["fwd"] == "tilen3d_s2"
    small = dataclasses.replace(view_(1), X=(1, 7, 7), Y=(1, 7, 7))  # mbv2-dw3x3-last: Note [depthwise planes]
    assert ks(small) == {"fwd": "planes", "bwd_data": "planes", "bwd_weight": "rows2d_s1"}
    assert ks(small, cl=True)["fwd"] == "tile_s1"
    assert ks(dataclasses.replace(small, X=(1, 16, 16), Y=(1, 16, 16)))["fwd"] == "tilen_s1"  # the tile's first
    assert ks(dataclasses.replace(small, N=1, X=(1, 16, 16), Y=(1, 16, 16)))["fwd"] == "planes"  # 256 elements
    assert ks(dataclasses.replace(small, X=(1, 15, 19), Y=(1, 15, 19)))["fwd"] == "rows3s1"  # 285 > DWP_PLANE
    assert ks(dataclasses.replace(small, X=(1, 14, 14), Y=(1, 7, 7), S=(1, 2, 2)))["fwd"] == "rows3s2"  # stride 2
    assert ks(dataclasses.replace(small, K=288))["fwd"] == "rows3s1"  # channel multiplier 2
    assert ks(view_(1, rank=3), cl=True)["bwd_weight"] == "tile3d_s1"
    assert ks(view_(1, k=288), cl=True)["fwd"] == "rows3s1"  # channel multiplier 2: no tile kernel
    assert ks(view_(1, r=5)) == {"fwd": "bands_s1", "bwd_data": "bands_s1", "bwd_weight": "bands_s1"}  # any filter
    assert ks(view_(2, r=5))["fwd"] == ks(view_(2, r=5))["bwd_data"] == "bands_s2"  # Note [bands phases]
    assert ks(view_(1, r=5), cl=True) == {"fwd": "clw_s1", "bwd_data": "clw_s1", "bwd_weight": "clw_s1"}  # clw
    assert ks(view_(2, r=5), cl=True) == {"fwd": "clw_s2", "bwd_data": "clw_s2", "bwd_weight": "clw_s2"}
    assert ks(view_(1, r=5, k=288), cl=True)["fwd"] == "bands_s1"  # multiplier 2: not 'clw'
    assert ks(view_(1, r=5, k=288))["bwd_data"] == "rows" and ks(view_(1, rank=3, r=5))["fwd"] == "rows"
    assert ks(view_(1, rank=1, r=7)) == ks(dataclasses.replace(view_(1), R=(1, 1, 1))) == {
        "fwd": "rows", "bwd_data": "rows", "bwd_weight": "plain"}  # 1-D, 1x1: no filter rows for a column

    def v(view__, dtype, cl):  # Note [whole-row strips]
        return depthwise.dw_v(view__, dtype, cl, ks(view__, cl=cl))

    assert v(small, "float32", False) == v(small, "bfloat16", True) == 8 and v(view_(1), "float32", False) == 4
    assert v(dataclasses.replace(view_(2), X=(1, 14, 14), Y=(1, 7, 7)), "float32", False) == 4  # 14-wide X: 2 strips
    assert v(view_(1), "bfloat16", False) == v(view_(1), "float16", False) == 16  # only the weight gradient on 'rows'
    assert v(view_(1), "bfloat16", True) == v(view_(2), "bfloat16", False) == v(view_(1, rank=3), "float16", False) == 4
    b1 = dataclasses.replace(view_(1), N=1, C=32, K=32, G=32, X=(1, 112, 112), Y=(1, 112, 112))  # mbv2-dw3x3-b1
    assert ks(b1) == {"fwd": "tilen_s1", "bwd_data": "tilen_s1", "bwd_weight": "rows2d_s1"}  # 8 x 2 tiles win
    assert ks(dataclasses.replace(b1, C=16, K=16, G=16))["fwd"] == "rows3s1"  # 12544 tiles: under DW_TILE_MIN_WORK
    monkeypatch.setattr(depthwise, "DW_TILE_MIN_ROWS", 10**9)  # tiles for channels-last only
    assert ks(view_(1)) == {"fwd": "rows3s1", "bwd_data": "rows3s1", "bwd_weight": "rows2d_s1"}  # 56x56: too big
    assert ks(view_(1), cl=True)["fwd"] == "tile_s1"


IGEMM_TC_CASES = [c for c in EMU_CASES if c.groups == 1] + [
    EmuCase(2, 2, 5, 7, 9, 4, stride=3, padding=2),  # 9 phases, taps 4 over stride 3: phases with 1 or 2 taps
    EmuCase(2, 1, 3, 4, 6, 1, stride=2),  # 1x1 stride 2: three of four phases reach no tap (zeros + bias)
    EmuCase(2, 1, 4, 5, 9, 3, padding=3, dilation=3),  # stride 1, dilation 3: one phase, dY steps of 3
    EmuCase(1, 2, 3, 4, 12, 3, padding="same", dilation=2, transposed=False, layout="strided"),
    EmuCase(2, 2, 4, 6, 5, 3, stride=2, padding=1, transposed=True, output_padding=1, layout="chlast"),
    # Note [tap-major steps]: C/G (forward) and K/G (phase backward-data) multiples of 16
    EmuCase(2, 2, 16, 16, 6, 3, padding=1),
    EmuCase(2, 1, 32, 16, 7, 3, stride=2, padding=1, layout="chlast"),  # two steps per tap; 4 phases
    EmuCase(1, 2, 16, 32, 9, 5, padding=2, dilation=2, layout="strided"),
    EmuCase(3, 1, 16, 16, 4, 3, padding=1),
    EmuCase(2, 1, 16, 32, 4, 3, stride=2, padding=1, transposed=True, output_padding=1),
]


def _tc_plan(emu_backend, monkeypatch, problem: Problem) -> Plan:
    """The igemm-tc plan of ``problem``: options(algorithm='igemm-tc') for the 16-bit types; float64, which the tensor
    cores refuse, takes the same host path through the tensor-core family's Choice (the emulator's FMA tile computes
    it in float64, so the host path is checked to 1e-10)."""
    if problem.dtype != "float64":
        return run_plan(emu_backend, monkeypatch, problem, Options(algorithm="igemm-tc"))
    with pytest.raises(Unsupported, match="no tensor-core tile for float64"):
        emu_backend.choose(problem, _DEVICE, Options(algorithm="igemm-tc"))
    fma = emu_backend.choose(problem, _DEVICE, Options(algorithm="implicit_gemm"))
    return run_plan(emu_backend, monkeypatch, problem, choice=dataclasses.replace(fma, algorithm="igemm-tc"))


@pytest.mark.parametrize("case", IGEMM_TC_CASES,
                         ids=lambda c: f"r{c.rank}s{c.stride}k{c.kernel}{'t' if c.transposed else ''}{c.layout}")
def test_igemm_tc_host_path_on_cpu(emu_backend, case, monkeypatch):
    """The igemm-tc plan's host path (tile defines, grids, Note [bwd-data phases] kernel) with the emulator's FMA
    tile in place of the tensor cores (PC_TENSOR_CORES stays 0 there; the tile is pinned to the FMA tile's 64x64)."""
    monkeypatch.setattr(igemm, "tc_tile", lambda *a, **k: (64, 64, 2))
    for dtype in (torch.float64, torch.bfloat16):
        x, w, b, problem, go, ref = _setup(case, dtype)
        p = _tc_plan(emu_backend, monkeypatch, problem)
        _check(_all(p, x, w, b, go), ref, dtype, "igemm-tc")
        tc = [x_ for x_ in emu_backend.launches() if x_.kernel.startswith("portconv_igemm")]
        assert tc and all(("PC_TENSOR_CORES", "1") in x_.module.defines for x_ in tc)
        v = ConvView.of(problem)
        phase = any(x_.kernel == "portconv_igemm_bwd_data_phase" for x_ in tc)
        assert phase == (v.phased and not igemm.narrow_col(v, w.shape, w.stride())), [x_.kernel for x_ in tc]


@pytest.mark.parametrize("case", [
    EmuCase(2, 2, 16, 8, 24, 3, padding=1),  # NCHW: staged in bfloat16, element gathers in float64; split over z
    EmuCase(2, 2, 16, 16, 24, 3, padding=1, layout="chlast"),  # split over z
    EmuCase(1, 3, 8, 16, 40, 3, padding=1),  # 1-D
    EmuCase(2, 2, 8, 16, 5, 3, stride=2, padding=1, transposed=True, output_padding=1),  # X and dY roles swapped
], ids=lambda c: f"r{c.rank}{'t' if c.transposed else ''}{c.layout}")
def test_tn_host_path_on_cpu(emu_backend, case, monkeypatch):
    """Note [TN tiles]' host side on the emulator (whose FMA tile stands in for the TN tile and gathers in its column
    order, channel-innermost, keeping W's order in the split workspace): the weight-gradient launch carries FLAG_VA |
    FLAG_VB for channels-last operands and for NCHW bfloat16 ones after staging (stage_pays overruled), not for NCHW
    float64 (only 16-bit operands are staged for it); all four results match the float64 reference."""
    monkeypatch.setattr(igemm, "tc_tile", lambda *a, **k: (64, 64, 2))
    monkeypatch.setattr(igemm, "stage_pays", lambda macs, elems, direction: bool(elems))
    vec = view.FLAG_VA | view.FLAG_VB
    for dtype in (torch.float64, torch.bfloat16):
        x, w, b, problem, go, ref = _setup(case, dtype)
        if case.layout == "chlast":  # dY channels-last too
            go = go.contiguous(memory_format=torch.channels_last)
        p = _tc_plan(emu_backend, monkeypatch, problem)
        _check(_all(p, x, w, b, go), ref, dtype, "igemm-tc TN")
        (wg,) = [x_ for x_ in emu_backend.launches() if x_.kernel == "portconv_igemm_bwd_weight"]
        assert (view.arg_field(wg, "flags") & vec == vec) == (case.layout == "chlast" or dtype == torch.bfloat16), wg
        if case.rank == 2 and case.size > 20:  # split: the workspace keeps W's order whatever the columns' (out_col)
            assert wg.grid[2] > 1, wg


def _operand(t, role: str = "x") -> view.Operand:
    return view.Operand(role, Layout(tuple(t.shape), t.stride(), t.data_ptr() % 16))


def test_vector_ok():
    """Note [vector gathers]: the host lets a tensor's channels be read 16 bytes at a time only when its channel axis is
    contiguous, its other axes (of extent > 1) step by 16-byte multiples and its address is 16-byte aligned."""
    x = torch.empty(2, 32, 5, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert x.data_ptr() % 16 == 0
    assert view.vector_ok(_operand(x), 2)
    assert not view.vector_ok(_operand(x.contiguous()), 2)  # NCHW: channels HW apart
    buf = torch.empty(x.numel() + 1, dtype=torch.float16)
    assert not view.vector_ok(_operand(buf[1:].as_strided(x.shape, x.stride())), 2)  # 2 bytes past alignment
    odd = torch.empty(2, 12, 5, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert not view.vector_ok(_operand(odd), 2)  # a pixel is 24 bytes: its neighbour is not 16-byte aligned
    one = torch.empty(1, 12, 1, 1, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert view.vector_ok(_operand(one), 2) == (one.data_ptr() % 16 == 0)  # extent-1 axes never step
    f = torch.empty(2, 4, 3, 3, dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    assert view.vector_ok(_operand(f), 4)
    assert not view.vector_ok(None, 2)


def test_stage_pays():
    """Note [channels-last staging]: the measured rule, per staged element and in all."""
    stage_pays = igemm.stage_pays
    assert stage_pays(1 << 30, [1 << 20], "fwd") and stage_pays(1 << 28, [1 << 20], "bwd_data")
    assert not stage_pays(64 * 25_690_112, [25_690_112], "bwd_data")  # resnet50-1x1-expand: 64 / element
    assert not stage_pays(925_000_000, [802_816, 73_728], "fwd")  # deepbench-b1-3x3's forward
    assert stage_pays(925_000_000, [802_816, 73_728], "bwd_data")  # ... its backward-data
    assert not stage_pays(1 << 30, [], "fwd")  # nothing to stage
    assert not stage_pays(3_699_376_128, [12_845_056], "bwd_weight")  # resnet50-l1-3x3's weight gradient
    assert stage_pays(10_060_038_144, [19_652_608], "bwd_weight")  # wav2vec2-conv1d's
