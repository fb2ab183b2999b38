"""CPU-only checks of the CUDA kernel set: nvcc builds every cuda/*.cu for sm_80 and sm_90, and the bodies run
under a CPU prelude (tests/cuda_emu) through the cuda backend's own host code, checked against PyTorch."""
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
from emu import EmuKernels, EmuTensors
from gpu_refs import reference, spy_launches

from portconv.backends import BackendId, Problem, cuda
from portconv.backends._cupy import inline_source
from portconv.backends._replay import Program
from portconv.device import DeviceInfo
from portconv.params import ConvParams
from portconv.plan import Plan
from portconv.tensors import spec_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "cuda"
EMU_DIR = pathlib.Path(__file__).resolve().parent / "cuda_emu"
ENTRIES = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
ARCHS = ("sm_80", "sm_90")


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
    jobs = [(e, a, {"PC_DTYPE": dt, "PC_INDEX64": 0}) for e in ENTRIES for a in ARCHS for dt in range(4)]
    jobs += [(e, "sm_90", {"PC_DTYPE": 0, "PC_INDEX64": 1}) for e in ENTRIES]
    # the tensor-core tiles (Note [tensor-core implicit GEMM]): float32 (TF32), float16, bfloat16, every tile
    tc = [{"PC_TENSOR_CORES": 1, "PC_TC_BM": bm, "PC_TC_BN": bn, "PC_TC_WM": wm}
          for bm, bn, wm in cuda.TC_TILES.values()]
    # every tile on sm_90, the first on the other archs (the tile is arch-independent code; CI time)
    jobs += [("igemm.cu", a, {"PC_DTYPE": dt, "PC_INDEX64": 0, **t}) for a in ARCHS for dt in (0, 2, 3)
             for t in (tc if a == "sm_90" else tc[:1])]
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": 2, "PC_INDEX64": 1, **tc[0]})]
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": 0, "PC_INDEX64": 0, "PC_TC_V6": 1, **t}) for t in tc]  # v6's TF32
    # Note [deep stages]: the other steps-a-stage of the ring (PC_TC_KS; 2 is the default above), TF32 and 16-bit
    ks = [k for k in map(int, cuda.TC_KS) if k != 2]
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_TC_KS": k, **tc[i]}) for k in ks
             for dt in (0, 2) for i in (0, 1)]
    # Note [TN copy order]: v8's order (PC_TC_V8), kept for before / after timings
    jobs += [("igemm.cu", "sm_90", {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_TC_V8": 1, **tc[i]}) for dt in (0, 2)
             for i in (0, 1)]
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        results = list(ex.map(lambda j: _compile(nvcc, *j, tmp), jobs))
    failures = [f"{cmd}\n{err}" for cmd, rc, err in results if rc != 0 or "warning" in err.lower()]
    assert not failures, "\n\n".join(failures)
    assert len(results) == (len(ENTRIES) * (len(ARCHS) * 4 + 1) + 3 * (len(tc) + len(ARCHS) - 1) + 1 + len(tc)
                            + 4 * len(ks) + 4)


def test_nvrtc_keeps_the_hot_depthwise_kernels_at_two_blocks_an_sm():
    """What runs is NVRTC's build, and its registers can differ from nvcc's: 130 registers made the bfloat16
    channels-last weight gradient 1.4x slower (one 256-thread block an SM), and `__launch_bounds__(256, 1)` gave the
    forward 154 (docs/performance/notes-depthwise-v3.md "v7", "v8"). mbv2-dw3x3-bf16-cl's three kernels, as NVRTC 13
    builds them for sm_90 (scripts/nvrtc_regs.py), must fit two blocks an SM (<= 128 registers) with no spills."""
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
    rows = tool.summary(tool.report("depthwise.cu", "sm_90", {"PC_DTYPE": 3, "PC_INDEX64": 0}))
    got = {}
    for line in rows:
        name, regs, spill = re.match(r"(\w+): (\d+) registers, (\d+) bytes spilled", line).groups()
        got[name] = (int(regs), int(spill))
    for k in ("fwd_tile_s1", "bwd_data_tile_s1", "bwd_weight_tile2d_s1"):
        regs, spill = got[f"portconv_depthwise_{k}"]
        assert regs <= 128 and spill == 0, f"{k}: {regs} registers, {spill} bytes spilled under NVRTC"


def test_the_finalize_waits_before_it_reads():
    """Note [dependent launch]: a replayed finalize may start before the kernel that writes its partial sums has
    finished; its first statement waits for it, so no read comes before (griddepcontrol.wait on sm_90+)."""
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


def test_tensor_core_tile_is_cuda_only():
    """igemm.cu carries the tensor-core tile under PC_TENSOR_CORES; the HIP prelude refuses it; the emulator is
    pinned to the FMA tile."""
    text = inline_source("igemm.cu", [CUDA_DIR])
    assert "pc_igemm_tc_run" in text and "mma.sync.aligned.m16n8k16" in text and "#if PC_TENSOR_CORES" in text
    hip = (ROOT / "hip" / "prelude_hip.h").read_text()
    assert re.search(r"#if PC_TENSOR_CORES\s*\n#error", hip)
    assert "#define PC_TENSOR_CORES 0" in (EMU_DIR / "prelude.cuh").read_text()


def test_argument_block_matches_common_cuh():
    """cuda.py packs the kernel argument block in exactly the order cuda/common.cuh declares it."""
    body = re.search(r"struct pc_conv_args \{(.*?)\};", (CUDA_DIR / "common.cuh").read_text(), re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for decl in re.findall(r"long long ([^;]+);", body):
        for item in decl.split(","):
            m = re.fullmatch(r"\s*(\w+)(?:\[(\d+)\])?\s*", item)
            fields.append((m.group(1), int(m.group(2) or 1)))
    assert tuple(fields) == cuda.ARG_FIELDS


def test_every_launched_kernel_exists():
    for alg, entry in cuda.ENTRY.items():
        text = inline_source(entry, [CUDA_DIR])
        for d in ("fwd", "bwd_data", "bwd_weight"):
            assert re.search(rf"PC_KERNEL void PC_LAUNCH_BOUNDS\(\w+\) {cuda.PREFIX[alg]}_{d}\(", text), (alg, d)
        for shared in ("portconv_bias_grad", "portconv_split_finalize"):
            assert f" {shared}(" in text
        if alg in cuda.IGEMM_ALGS:  # Note [narrow backward-data]
            assert " portconv_igemm_col(" in text and " portconv_col2im(" in text


# --- the bodies on the CPU -------------------------------------------------------------------------------------

class _EmuBackend(cuda.CudaBackend):
    def __init__(self, tmp):
        super().__init__()
        self._kernels = EmuKernels(tmp)

    def tensors(self, like):
        return EmuTensors()


_DEVICE = DeviceInfo(vendor="nvidia", kind="gpu", name="emulated", arch="sm_90", compute_units=2, fp16=True,
                     bf16=True)


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


@pytest.fixture(scope="module")
def emu_backend():
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of the CUDA bodies needs a C++20 compiler")
    with tempfile.TemporaryDirectory() as tmp:
        yield _EmuBackend(pathlib.Path(tmp))


def _tol(dtype):
    return {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]


def _setup(emu_backend, case: EmuCase, dtype):
    """(x, w, b, problem, the emulated backend's choice, grad_output, the float64 aten reference of all four)."""
    x, w, b = _data(case, dtype)
    params = ConvParams.make(case.rank, case.stride, case.padding, case.dilation, case.transposed,
                             case.output_padding, case.groups, weight_shape=tuple(w.shape))
    problem = Problem(params, spec_of(x), spec_of(w), True)
    choice = emu_backend.choose(problem, _DEVICE)
    go = torch.randn(problem.output_shape, dtype=torch.float64).to(dtype)
    return x, w, b, problem, choice, go, reference(x, w, b, params, go, (True, True, True))


def _check(got, ref, dtype, what: str) -> None:
    """output, grad_input, grad_weight, grad_bias against the reference: shape, no NaN (unwritten), relative error."""
    for name, g_, r_ in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
        assert tuple(g_.shape) == tuple(r_.shape), f"{what} {name}: shape"
        assert not torch.isnan(g_).any(), f"{what} {dtype} {name}: unwritten (NaN) elements"
        err = ((g_.double() - r_).norm() / r_.norm().clamp_min(1e-30)).item()
        assert err < _tol(dtype), f"{what} {dtype} {name}: relative error {err:.3g}"


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"r{c.rank}g{c.groups}{'t' if c.transposed else ''}"
                         f"s{c.stride}{c.layout}")
def test_bodies_on_cpu_match_pytorch(emu_backend, case, monkeypatch):
    """Forward, grad_input, grad_weight, grad_bias of every algorithm that applies, in float64 (and one half
    type per case), against aten in float64; outputs are NaN-poisoned first so unwritten elements fail."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    dtypes = [torch.float64, (torch.float32, torch.float16, torch.bfloat16)[_seed(case) % 3]]
    for dtype in dtypes:
        x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
        algs = ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else [])
        # 'igemm-tc' (tensor cores: half types, and float32 where torch allows TF32, on sm_80+) cannot run here:
        # the emulator keeps PC_TENSOR_CORES=0 and runs the same gather through the FMA tile ('implicit_gemm')
        assert choice.algorithm in algs + (["igemm-tc"] if dtype != torch.float64 else [])
        for alg in algs:
            plan = Plan(problem, BackendId.CUDA, alg, choice.memory_format, choice.reason, _DEVICE)
            x0, w0, b0 = _data(case, dtype)  # the recorded first call: same layouts, other storage
            emu_backend.forward(plan, x0, w0, b0)
            emu_backend.backward(plan, go.clone(), x0, w0, (True, True, True))
            y = emu_backend.forward(plan, x, w, b)  # replayed (Note [replayed launches])
            got = (y, *emu_backend.backward(plan, go, x, w, (True, True, True)))
            assert all(isinstance(v, Program) for v in plan.state["replay"].values()), alg
            _check(got, ref, dtype, alg)
        masked = emu_backend.backward(plan, go, x, w, (False, True, False))
        assert masked[0] is None and masked[2] is None and masked[1] is not None


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

    launched = []
    finalize = cuda._Run._finalize

    def spy(self, count, splits, extra=None, **args):
        launched.append((splits, splits >= cuda.WARP_FINALIZE and count <= cuda.WARP_FINALIZE_MAX))
        return finalize(self, count, splits, extra, **args)

    flags = spy_launches(monkeypatch)
    monkeypatch.setattr(cuda, "_splits", many)
    monkeypatch.setattr(cuda, "WARP_FINALIZE", 2)
    monkeypatch.setattr(cuda, "WARP_FINALIZE_MAX", limit)
    monkeypatch.setattr(cuda._Run, "_finalize", spy)
    monkeypatch.setenv("PORTCONV_POISON", "1")
    for case in EMU_CASES[:2] if limit else EMU_CASES[:1]:  # a thread a value: the path of every unforced split too
        for dtype in (torch.float64, torch.float32) if limit else (torch.float64,):
            x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
            for alg in ("direct", "implicit_gemm"):
                plan = Plan(problem, BackendId.CUDA, alg, choice.memory_format, choice.reason, _DEVICE)
                got = (emu_backend.forward(plan, x, w, b), *emu_backend.backward(plan, go, x, w, (True, True, True)))
                _check(got, ref, dtype, f"{alg}, warp finalize up to {limit} values")
    assert launched and min(s for s, _ in launched) >= 2 and all(w == bool(limit) for _, w in launched), launched
    fin = [f for n, f, _ in flags if n == "portconv_split_finalize"]
    assert fin and all(bool(f & cuda.FLAG_WARP) == bool(limit) for f in fin), fin


@pytest.mark.parametrize("case", [c for c in EMU_CASES if c.groups == c.c and not c.transposed],
                         ids=lambda c: f"r{c.rank}m{c.k // c.c}s{c.stride}{c.layout}")
def test_depthwise_per_element_kernels_on_cpu(emu_backend, case, monkeypatch):
    """PORTCONV_CUDA_DEPTHWISE=v1: portconv_depthwise_fwd/_bwd_data (the direct bodies) and the per-element
    weight gradient, in float64 against aten."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.setenv(cuda.DW_ENV, "v1")
    x, w, b, problem, choice, go, ref = _setup(emu_backend, case, torch.float64)
    plan = Plan(problem, BackendId.CUDA, "depthwise", choice.memory_format, choice.reason, _DEVICE)
    got = (emu_backend.forward(plan, x, w, b), *emu_backend.backward(plan, go, x, w, (True, True, True)))
    _check(got, ref, torch.float64, "depthwise v1")


NARROW_CASES = [  # Note [narrow backward-data]: C_in <= cuda.NARROW_C, K >= cuda.NARROW_K, 2+ taps
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
    monkeypatch.setenv("PORTCONV_POISON", "1")
    launches = spy_launches(monkeypatch)
    for dtype in (torch.float64, torch.float32):
        x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
        for w_layout in ("contig", "chlast") if case.rank >= 2 else ("contig",):
            if w_layout == "chlast":
                w = w.contiguous(memory_format=torch.channels_last if case.rank == 2 else torch.channels_last_3d)
                problem = Problem(problem.params, problem.input, spec_of(w), True)
            view = cuda.ConvView.of(problem)
            assert cuda.narrow_col(view, w.shape, w.stride()), case
            plan = Plan(problem, BackendId.CUDA, "implicit_gemm", choice.memory_format, choice.reason, _DEVICE)
            launches.clear()
            got = (emu_backend.forward(plan, x, w, b), *emu_backend.backward(plan, go, x, w, (True, True, True)))
            _check(got, ref, dtype, f"narrow {w_layout} W")
            names = [n for n, _, _ in launches]
            assert names.count("portconv_col2im") == names.count("portconv_igemm_col") == 1, names
            assert "portconv_igemm_bwd_data" not in names, names
            (f,) = [f for n, f, _ in launches if n == "portconv_col2im"]
            assert bool(f & cuda.FLAG_COLTAP) == (w_layout == "chlast" and view.C > 1), f


# --- depthwise v3 (Note [depthwise tile] of cuda/conv_depthwise_tile.cuh, stride-2 backward-data window) ------

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


def test_depthwise_tile_shapes_match_the_header():
    """cuda.DW_TILE sizes the tile kernels' grids and names their shape in plan reasons: it must say what
    cuda/conv_depthwise_tile.cuh compiles by default, family by family."""
    src = (CUDA_DIR / "conv_depthwise_tile.cuh").read_text()
    d = {k: int(v) for k, v in re.findall(r"#define (PC_DWT_\w+) (\d+)", src)}
    fam = {"nchw": ("THN", "VWN"), "nchw16": ("THN16", "VWN16"), "nchw3d": ("TH3", "VW3"), "cl": ("THC", "VWC"),
           "cl3d": ("THC3", "VWC"), "w4": ("THW4", "VWW4")}
    assert cuda.DW_TILE == {k: (d["PC_DWT_" + th], d["PC_DWT_" + vw]) for k, (th, vw) in fam.items()}
    assert [cuda.dw_tile_key(cl, r, dt) for cl, r, dt in [(False, 2, "float32"), (False, 2, "bfloat16"),
            (False, 3, "float16"), (True, 2, "float16"), (True, 3, "float32"), (False, 1, "float64")]] == [
            "nchw", "nchw16", "nchw3d", "cl", "cl3d", "nchw"]


@pytest.mark.parametrize("tile", ["cl", "all"])
@pytest.mark.parametrize("case", DW3_CASES, ids=lambda c: f"r{c.rank}s{c.stride}p{c.padding}c{c.c}{c.layout}"
                         f"{'t' if c.transposed else ''}")
def test_depthwise_v3_bodies_on_cpu(emu_backend, case, tile, monkeypatch):
    """The depthwise v3 kernels (tile, stride-2 backward-data) in every dtype against aten in float64."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.setenv(cuda.DW_TILE_ENV, tile)
    _depthwise_all_dtypes(emu_backend, case)


def _depthwise_all_dtypes(emu_backend, case):
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
        if case.layout == "chlast" and case.rank >= 2:  # dY in x's layout too, as autograd gives it: the vector paths
            go = go.contiguous(memory_format=torch.channels_last if case.rank == 2 else torch.channels_last_3d)
        assert choice.algorithm == "depthwise"
        plan = Plan(problem, BackendId.CUDA, "depthwise", choice.memory_format, choice.reason, _DEVICE)
        y = emu_backend.forward(plan, x, w, b)
        got = (y, *emu_backend.backward(plan, go, x, w, (True, True, True)))
        _check(got, ref, dtype, f"depthwise ({choice.reason})")


def test_depthwise_planes_sizes(monkeypatch):
    """Note [depthwise planes]: planes a chunk (about DWP_UNITS result columns, 16-byte aligned chunk starts, within
    DWP_MAX_BYTES), the module's shared memory in DWP_STEP steps and the blocks an SM it leaves."""
    monkeypatch.delenv(cuda.DWP_ENV, raising=False)
    last = cuda.ConvView(32, 960, 960, 960, (1, 7, 7), (1, 7, 7), (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1))
    m14 = dataclasses.replace(last, C=576, K=576, G=576, X=(1, 14, 14), Y=(1, 14, 14))
    assert cuda.dw_planes(last, "fwd", 4) == (36, 36 * 147 * 4 + 32)  # 252 columns; 36 x 196 bytes: 16-byte steps
    assert cuda.dw_planes(last, "bwd_data", 2)[0] == 32  # 98-byte planes: 8 a 16-byte step
    assert cuda.dw_planes(m14, "fwd", 4)[0] == 18 and cuda.dw_planes(m14, "fwd", 8)[0] == 10  # 48 KiB at most
    assert cuda.dwp_build(last, 4, "sm_90") == (24576, 6) and cuda.dwp_build(m14, 4, "sm_90") == (49152, 4)
    assert cuda.dwp_build(m14, 4, "sm_80") == (49152, 3) and cuda.dwp_build(last, 2, "gfx90a") == (16384, 3)
    assert cuda.dwp_build(last, 2, "sm_90") == (16384, 5) and cuda.dwp_build(last, 8, "sm_90") == (49152, 4)
    pad0 = dataclasses.replace(last, Y=(1, 5, 5), P=(0, 0, 0))  # the larger direction sizes the module
    fwd, bwd = cuda.dw_planes(pad0, "fwd", 4), cuda.dw_planes(pad0, "bwd_data", 4)
    assert fwd == (48, 48 * (2 * 49 + 25) * 4 + 32) and bwd == (36, 36 * (2 * 25 + 49) * 4 + 32)
    assert cuda.dwp_build(pad0, 4, "sm_90") == (24576, 6)
    monkeypatch.setenv(cuda.DWP_ENV, "64,0")
    assert cuda.dw_planes(last, "fwd", 4)[0] == 8 and cuda.dwp_build(last, 4, "sm_90")[1] == 0


PLANES_CASES = [  # Note [depthwise planes]: 2-D NCHW 3x3 stride 1 on planes of at most DWP_PLANE elements
    EmuCase(2, 2, 5, 5, 7, 3, padding=1, groups=5),  # mbv2-dw3x3-last's 7x7 planes, one strip a row
    EmuCase(2, 1, 3, 3, 14, 3, padding=1, groups=3),  # 14x14: strips of 4, 4, 4, 2
    EmuCase(2, 3, 4, 4, 9, 3, padding=0, groups=4),  # no padding: Y 7x7 inside X 9x9 (backward padding 2)
    EmuCase(2, 1, 4, 4, 6, 3, padding=2, groups=4),  # padding 2: Y 8x8 around X 6x6 (backward padding 0)
    EmuCase(2, 4, 10, 10, 7, 3, padding=1, groups=10),  # 40 planes: a block of 32 and one of 8
    EmuCase(2, 2, 4, 4, 7, 3, padding=1, groups=4, layout="strided"),  # X not plane-contiguous: rows3s1 forward
]


@pytest.mark.parametrize("sizes", [None, "8,0", "8,1"], ids=["default", "small-chunks", "sm-blocks"])
@pytest.mark.parametrize("case", PLANES_CASES, ids=lambda c: f"n{c.n}c{c.c}s{c.size}p{c.padding}{c.layout}")
def test_depthwise_planes_on_cpu(emu_backend, case, sizes, monkeypatch):
    """Note [depthwise planes]: forward (with bias) and grad_input through portconv_depthwise_*_planes in all four
    dtypes against aten in float64, outputs poisoned. 'small-chunks' gives a chunk 1 to 8 planes and a block each:
    many blocks, a short last chunk, chunk starts off 16 bytes (the element-wise copies); 'sm-blocks' runs them on
    one block an emulated SM (2), each block several chunks, through both source buffers. A view whose planes are
    not back to back runs rows3s1."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.delenv(cuda.DW_ENV, raising=False)
    if sizes:
        monkeypatch.setenv(cuda.DWP_ENV, sizes)
    launches = spy_launches(monkeypatch)
    _depthwise_all_dtypes(emu_backend, case)
    names = {n for n, _, _ in launches}
    strided = case.layout == "strided"
    assert ("portconv_depthwise_fwd" + ("_rows3s1" if strided else "_planes")) in names, names
    assert "portconv_depthwise_bwd_data_planes" in names, names  # dY and dX are dense
    grids = {g[0] for n, _, g in launches if n.endswith("_planes")}
    if sizes:
        assert max(grids) <= 2 if sizes.endswith(",1") else max(grids) >= 2, grids


@pytest.mark.parametrize("extra", [{"PC_DWT_LA": 0}, {"PC_DWT_PF": 0, "PC_DWT_PF16": 1}, {"PC_DWT_PK": 0},
                                   {"PC_DWT_RING": 1, "PC_DWT_RD": 2, "PC_DWT_FRING": 1, "PC_DWT_FRD": 4,
                                    "PC_DWT_NRING": 1},
                                   {"PC_DWT_RING": 1, "PC_DWT_RD": 4, "PC_DWT_FRING": 1, "PC_DWT_FRD": 2,
                                    "PC_DWT_NRING": 1},
                                   {"PC_DWT_Q4": 0}, {"PC_DWT_QD": 3}],
                         ids=["no-lookahead", "pf-swapped", "unpacked", "ring2", "ring4", "no-quad", "quad-qd3"])
def test_depthwise_tile_switches_on_cpu(emu_backend, extra, monkeypatch):
    """The tile kernels' compile-time switches that keep the tile shape (Note [row lookahead] off, prefetch or
    rolling window per dtype class swapped, Note [packed rows] off, Note [quad rows] off or with 3 rows in flight,
    Note [async row ring] on in every kernel that has it, with 2 and 4 slots: the CPU prelude copies synchronously, so
    the ring is off there by default) stay correct: every DW3 case, tiles everywhere, every dtype. The defaults run in
    test_depthwise_v3_bodies_on_cpu."""
    init = cuda._Run.__init__

    def with_defines(self, *args, **kw):
        init(self, *args, **kw)
        self.defines = {**self.defines, **extra}

    monkeypatch.setattr(cuda._Run, "__init__", with_defines)
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.setenv(cuda.DW_TILE_ENV, "all")
    for case in DW3_CASES:
        _depthwise_all_dtypes(emu_backend, case)


def test_depthwise_v3_selection(monkeypatch):
    """Which depthwise kernel runs where (cuda.depthwise_kernels), per layout and PORTCONV_CUDA_DEPTHWISE."""
    def view(s, rank=2, k=144, r=3):
        lead = 3 - rank
        return cuda.ConvView(32, 144, k, 144, (1,) * lead + (56,) * rank, (1,) * lead + (56 // s,) * rank,
                             (1,) * lead + (r,) * rank, (1,) * lead + (s,) * rank, (0,) * lead + (1,) * rank,
                             (1, 1, 1))

    monkeypatch.delenv(cuda.DW_ENV, raising=False)
    monkeypatch.delenv(cuda.DW_TILE_ENV, raising=False)
    ks = cuda.depthwise_kernels
    assert ks(view(1), cl=True) == {"fwd": "tile_s1", "bwd_data": "tile_s1", "bwd_weight": "tile2d_s1"}
    assert ks(view(2), cl=True) == {"fwd": "tile_s2", "bwd_data": "rows3s2", "bwd_weight": "tile2d_s2"}
    assert ks(view(1)) == {"fwd": "tilen_s1", "bwd_data": "tilen_s1", "bwd_weight": "rows2d_s1"}  # auto: big
    assert ks(view(2)) == {"fwd": "tilen_s2", "bwd_data": "rows3s2", "bwd_weight": "rows2d_s2"}
    small = dataclasses.replace(view(1), X=(1, 7, 7), Y=(1, 7, 7))  # mbv2-dw3x3-last: Note [depthwise planes]
    assert ks(small) == {"fwd": "planes", "bwd_data": "planes", "bwd_weight": "rows2d_s1"}
    assert ks(small, cl=True)["fwd"] == "tile_s1"
    assert ks(dataclasses.replace(small, X=(1, 16, 16), Y=(1, 16, 16)))["fwd"] == "tilen_s1"  # the tile's first
    assert ks(dataclasses.replace(small, N=1, X=(1, 16, 16), Y=(1, 16, 16)))["fwd"] == "planes"  # 256 elements
    assert ks(dataclasses.replace(small, X=(1, 15, 19), Y=(1, 15, 19)))["fwd"] == "rows3s1"  # 285 > DWP_PLANE
    assert ks(dataclasses.replace(small, X=(1, 14, 14), Y=(1, 7, 7), S=(1, 2, 2)))["fwd"] == "rows3s2"  # stride 2
    assert ks(dataclasses.replace(small, K=288))["fwd"] == "rows3s1"  # channel multiplier 2
    monkeypatch.setenv(cuda.DW_ENV, "v3")  # before Note [depthwise planes]
    assert ks(small) == {"fwd": "rows3s1", "bwd_data": "rows3s1", "bwd_weight": "rows2d_s1"}
    monkeypatch.delenv(cuda.DW_ENV)

    def v(view_, dtype, cl):  # Note [whole-row strips]
        return cuda.dw_v(view_, dtype, cl, ks(view_, cl=cl))

    assert v(small, "float32", False) == v(small, "bfloat16", True) == 8 and v(view(1), "float32", False) == 4
    assert v(dataclasses.replace(view(2), X=(1, 14, 14), Y=(1, 7, 7)), "float32", False) == 4  # 14-wide X: 2 strips
    assert v(view(1), "bfloat16", False) == v(view(1), "float16", False) == 16  # only the weight gradient on 'rows'
    assert v(view(1), "bfloat16", True) == v(view(2), "bfloat16", False) == v(view(1, rank=3), "float16", False) == 4
    b1 = dataclasses.replace(view(1), N=1, C=32, K=32, G=32, X=(1, 112, 112), Y=(1, 112, 112))  # mbv2-dw3x3-b1
    assert ks(b1) == {"fwd": "tilen_s1", "bwd_data": "tilen_s1", "bwd_weight": "rows2d_s1"}  # 8 x 2 tiles win ("v11")
    assert ks(dataclasses.replace(b1, C=16, K=16, G=16))["fwd"] == "rows3s1"  # 12544 tiles: under DW_TILE_MIN_WORK
    monkeypatch.setenv(cuda.DW_TILE_ENV, "cl")
    assert ks(view(1)) == {"fwd": "rows3s1", "bwd_data": "rows3s1", "bwd_weight": "rows2d_s1"}  # 56x56: too big
    assert ks(view(1, rank=3), cl=True)["bwd_weight"] == "tile3d_s1"
    assert ks(view(1, k=288), cl=True)["fwd"] == "rows3s1"  # channel multiplier 2: no tile kernel
    monkeypatch.setenv(cuda.DW_TILE_ENV, "all")
    assert ks(view(1)) == {"fwd": "tilen_s1", "bwd_data": "tilen_s1", "bwd_weight": "rows2d_s1"}
    assert ks(view(2, rank=3))["fwd"] == "tilen3d_s2"
    monkeypatch.setenv(cuda.DW_ENV, "v2")
    assert ks(view(2), cl=True) == {"fwd": "rows3s2", "bwd_data": "rows", "bwd_weight": "rows2d_s2"}
    monkeypatch.setenv(cuda.DW_ENV, "v1")
    assert set(ks(view(1), cl=True).values()) == {"plain"}


@pytest.mark.parametrize("case", [c for c in EMU_CASES if c.groups == 1] + [
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
], ids=lambda c: f"r{c.rank}s{c.stride}k{c.kernel}{'t' if c.transposed else ''}{c.layout}")
def test_igemm_tc_host_path_on_cpu(emu_backend, case, monkeypatch):
    """The igemm-tc plan's host path (tile defines, grids, Note [bwd-data phases] kernel) with the emulator's FMA
    tile in place of the tensor cores (PC_TENSOR_CORES stays 0 there; the tile is pinned to the FMA tile's 64x64)."""
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.setattr(cuda, "tc_tile", lambda *a, **k: (64, 64, 2))
    for dtype in (torch.float64, torch.bfloat16):
        x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
        plan = Plan(problem, BackendId.CUDA, "igemm-tc", choice.memory_format, choice.reason, _DEVICE)
        got = (emu_backend.forward(plan, x, w, b), *emu_backend.backward(plan, go, x, w, (True, True, True)))
        _check(got, ref, dtype, "igemm-tc")


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
    monkeypatch.setenv("PORTCONV_POISON", "1")
    monkeypatch.setattr(cuda, "tc_tile", lambda *a, **k: (64, 64, 2))
    monkeypatch.setattr(cuda, "stage_pays", lambda macs, elems, direction: bool(elems))
    launches = spy_launches(monkeypatch)
    vec = cuda.FLAG_VA | cuda.FLAG_VB
    for dtype in (torch.float64, torch.bfloat16):
        launches.clear()
        x, w, b, problem, choice, go, ref = _setup(emu_backend, case, dtype)
        if case.layout == "chlast":  # dY channels-last too
            go = go.contiguous(memory_format=torch.channels_last)
        plan = Plan(problem, BackendId.CUDA, "igemm-tc", choice.memory_format, choice.reason, _DEVICE)
        got = (emu_backend.forward(plan, x, w, b), *emu_backend.backward(plan, go, x, w, (True, True, True)))
        _check(got, ref, dtype, "igemm-tc TN")
        (flags,) = [f for n, f, _ in launches if n == "portconv_igemm_bwd_weight"]
        assert (flags & vec == vec) == (case.layout == "chlast" or dtype == torch.bfloat16), launches
    if case.rank == 2 and case.size > 20:  # split: the workspace keeps W's order whatever the columns' (out_col)
        assert [g for n, _, g in launches if n == "portconv_igemm_bwd_weight"][0][2] > 1, launches


def test_vector_ok():
    """Note [vector gathers]: the host lets a tensor's channels be read 16 bytes at a time only when its channel axis is
    contiguous, its other axes (of extent > 1) step by 16-byte multiples and its address is 16-byte aligned."""
    x = torch.empty(2, 32, 5, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert x.data_ptr() % 16 == 0
    assert cuda.vector_ok(x, 2)
    assert not cuda.vector_ok(x.contiguous(), 2)  # NCHW: channels HW apart
    buf = torch.empty(x.numel() + 1, dtype=torch.float16)
    assert not cuda.vector_ok(buf[1:].as_strided(x.shape, x.stride()), 2)  # 2 bytes past alignment
    odd = torch.empty(2, 12, 5, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert not cuda.vector_ok(odd, 2)  # a pixel is 24 bytes: its neighbour is not 16-byte aligned
    one = torch.empty(1, 12, 1, 1, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    assert cuda.vector_ok(one, 2) == (one.data_ptr() % 16 == 0)  # extent-1 axes never step
    f = torch.empty(2, 4, 3, 3, dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    assert cuda.vector_ok(f, 4)


def test_stage_pays():
    """Note [channels-last staging]: the measured rule, per staged element and in all."""
    assert cuda.stage_pays(1 << 30, [1 << 20], "fwd") and cuda.stage_pays(1 << 28, [1 << 20], "bwd_data")
    assert not cuda.stage_pays(64 * 25_690_112, [25_690_112], "bwd_data")  # resnet50-1x1-expand: 64 / element
    assert not cuda.stage_pays(925_000_000, [802_816, 73_728], "fwd")  # deepbench-b1-3x3's forward
    assert cuda.stage_pays(925_000_000, [802_816, 73_728], "bwd_data")  # ... its backward-data
    assert not cuda.stage_pays(1 << 30, [], "fwd")  # nothing to stage
    assert not cuda.stage_pays(3_699_376_128, [12_845_056], "bwd_weight")  # resnet50-l1-3x3's weight gradient
    assert cuda.stage_pays(10_060_038_144, [19_652_608], "bwd_weight")  # wav2vec2-conv1d's
