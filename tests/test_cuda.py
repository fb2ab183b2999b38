"""The cuda backend: its selection (pure tables of Choice and KernelPlan, on a CPU), and on an NVIDIA GPU its kernels
against float64 PyTorch, zero copy, streams, device indices, CuPy arrays, the compile cache and proof
(torch.profiler) that portconv's kernels ran."""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

import pytest
import torch
from conftest import gpu_for
from gpu_refs import assert_close, reference, spy_launches
from gpu_refs import make as _make
from test_forks import PRELUDE, run_script

import portconv
from portconv.backends import BackendId
from portconv.backends.program import Module
from portconv.backends.simt import compile, igemm, runtime, select, view
from portconv.backends.simt.base import implied_plans
from portconv.backends.simt.cuda import CudaBackend
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.knobs import DEFAULT_OPTIONS, Options
from portconv.params import ConvParams
from portconv.planner import WIDTH, clear_cache
from portconv.problem import ConvView, Layout, Problem
from portconv.rules import TorchContext
from portconv.tensors import TensorSpec, dense_strides, spec_of

SIMT = pathlib.Path(__file__).resolve().parents[1] / "portconv" / "backends" / "simt"
H100 = DeviceInfo(vendor="nvidia", kind="gpu", name="H100", arch="sm_90", compute_units=132, fp16=True, bf16=True)
CTX = TorchContext(device_type="cuda", has_cudnn=True)


def _spec(shape, dtype="float32", fmt="contiguous"):
    return TensorSpec(tuple(shape), dense_strides(shape, fmt), dtype, "cuda", 0, "torch")


def _problem(x_shape, w_shape, dtype="float32", fmt="contiguous", wfmt="contiguous", **kw) -> Problem:
    p = ConvParams.make(len(x_shape) - 2, weight_shape=w_shape, **kw)
    return Problem(p, _spec(x_shape, dtype, fmt), _spec(w_shape, dtype, wfmt), True)


def choose(problem, device=H100, tf32=False, kernel_set="CUDA", options=DEFAULT_OPTIONS):
    return select.choose(problem, device, options, CTX, kernel_set, (tf32, "test setting" if tf32 else ""))


# --- the family rule, as a table (no GPU needed) ------------------------------------------------------------------
RULE_TABLE = [
    # (input, weight, kwargs, dtype, algorithm, words the reason must contain)
    ((8, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144), "float32", "depthwise", "multiplier 1"),
    ((2, 16, 9, 9), (32, 1, 3, 3), dict(groups=16, stride=2), "float16", "depthwise", "multiplier 2"),
    ((2, 8, 5, 9, 9), (8, 1, 3, 3, 3), dict(groups=8, padding=1), "bfloat16", "depthwise", "depthwise"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", "implicit_gemm", "M=25088 N=64 K=576"),
    ((4, 3, 16), (8, 3, 5), dict(padding="same"), "float64", "implicit_gemm", "implicit GEMM"),
    ((2, 16, 7, 7), (16, 8, 4, 4), dict(stride=2, transposed=True), "float32", "implicit_gemm", "M="),
    # Note [grouped implicit GEMM]: 8 / 16 channels a group run the per-group GEMMs; ResNeXt's 4 stay direct
    ((2, 32, 14, 14), (64, 8, 3, 3), dict(groups=4, padding=1), "float32", "implicit_gemm", "8 / 16 channels a group"),
    ((2, 128, 14, 14), (128, 4, 3, 3), dict(groups=32, padding=1), "float32", "direct", "under 8 channels a group"),
    ((2, 64, 9), (64, 8, 5), dict(groups=8, transposed=True), "float32", "implicit_gemm", "groups = 8, 8 / 8"),
    ((2, 16, 7, 7), (16, 1, 3, 3), dict(groups=16, transposed=True), "float32", "direct", "not depthwise"),
]


@pytest.mark.parametrize("x,w,kw,dtype,alg,words", RULE_TABLE)
def test_rule_table(x, w, kw, dtype, alg, words):
    c = choose(_problem(x, w, dtype, **kw))
    assert c.algorithm == alg and words in c.reason, c
    assert c.math == ("fp32-accumulate" if dtype in ("float16", "bfloat16") else "ieee")
    assert all(len(part) <= WIDTH - 13 for part in c.reason.split("; ")), c.reason  # explain(): a line a part


def test_rule_layout_index_width_and_dtypes():
    c = choose(_problem((2, 8, 9, 9), (8, 8, 3, 3), fmt="channels_last"))
    assert c.memory_format == "channels_last" and "cuDNN's rule" in c.reason
    # cuDNN's rule: float64 results stay contiguous (Note [own kernels' result layout])
    assert choose(_problem((2, 8, 9, 9), (8, 8, 3, 3), "float64", "channels_last")).memory_format == "contiguous"
    assert choose(_problem((2, 8, 9), (8, 8, 3))).memory_format == "contiguous"  # 1-D: no channels-last
    big = choose(_problem((2**16, 64, 32, 32), (64, 64, 3, 3), padding=1))  # 2**32 elements
    assert "64-bit indexing" in big.reason
    forced = choose(_problem((2, 8, 9, 9), (8, 8, 3, 3)), options=Options(index64=True))
    assert "64-bit indexing (forced by options(index64))" in forced.reason
    with pytest.raises(Unsupported, match="not int32"):
        choose(_problem((1, 2, 5, 5), (2, 2, 3, 3), "int32"))
    with pytest.raises(Unsupported, match="NVIDIA"):
        CudaBackend().choose(_problem((1, 2, 5, 5), (2, 2, 3, 3)), dataclasses.replace(H100, vendor="amd"), Options())


def test_forced_families():
    """options(algorithm=...) forces a family where its kernels compute the problem and raises Unsupported with the
    reason where they do not; options(igemm_tile=...) applies to tensor-core plans only."""
    assert set(select.FAMILIES) == set(portconv.knobs.ALGORITHMS)
    dense = _problem((2, 16, 9, 9), (16, 16, 3, 3), "float16", padding=1)
    dw = _problem((2, 16, 9, 9), (16, 1, 3, 3), "float16", padding=1, groups=16)
    for alg in ("direct", "implicit_gemm", "igemm-tc"):
        c = choose(dense, options=Options(algorithm=alg))
        assert c.algorithm == alg and f"forced by options(algorithm='{alg}')" in c.reason
    for alg in ("direct", "implicit_gemm", "igemm-tc", "depthwise"):
        assert choose(dw, options=Options(algorithm=alg)).algorithm == alg
    with pytest.raises(Unsupported, match="depthwise kernels take groups == C_in"):
        choose(dense, options=Options(algorithm="depthwise"))
    with pytest.raises(Unsupported, match="no tensor-core tile for float64"):
        choose(_problem((2, 16, 9, 9), (16, 16, 3, 3), "float64"), options=Options(algorithm="igemm-tc"))
    with pytest.raises(Unsupported, match="no tensor-core tile for float32"):
        choose(_problem((2, 16, 9, 9), (16, 16, 3, 3)), options=Options(algorithm="igemm-tc"))  # TF32 not allowed
    with pytest.raises(Unsupported, match="no tensor-core tile"):
        choose(dense, dataclasses.replace(H100, arch="sm_75"), options=Options(algorithm="igemm-tc"))
    assert choose(dense, options=Options(igemm_tile="64x128")).algorithm == "igemm-tc"
    with pytest.raises(Unsupported, match="igemm_tile='64x128'.*this plan runs depthwise"):
        choose(dw, options=Options(igemm_tile="64x128"))


TC_TABLE = [  # (input, weight, kwargs, dtype, tf32 allowed, algorithm, words)
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float16", False, "igemm-tc", "fp16 m16n8k16"),
    ((2, 16, 7, 7), (16, 8, 4, 4), dict(stride=2, transposed=True), "bfloat16", False, "igemm-tc", "bf16 m16n8k16"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", True, "igemm-tc", "tf32 m16n8k8"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", False, "implicit_gemm", "shared-memory tiles"),
    ((4, 3, 16), (8, 3, 5), dict(padding="same"), "float64", True, "implicit_gemm", "shared-memory tiles"),
    ((2, 32, 14, 14), (64, 8, 3, 3), dict(groups=4, padding=1), "float16", True, "igemm-tc", "groups = 4, 8 / 16"),
    ((2, 64, 7, 7), (64, 16, 3, 3), dict(groups=4, padding=1), "float32", True, "igemm-tc", "tf32 m16n8k8"),
    ((2, 128, 14, 14), (128, 4, 3, 3), dict(groups=32, padding=1), "float16", True, "direct", "groups = 32"),
    # Note [narrow backward-data]: the reason says when grad_input (a transposed forward) takes the column GEMM
    ((32, 1, 161, 700), (32, 1, 5, 20), dict(stride=2), "float32", True, "igemm-tc", "backward-data as a column GEMM"),
    ((2, 3, 64, 64), (16, 3, 7, 7), dict(stride=2, padding=3), "float64", True, "implicit_gemm", "and col2im (3"),
    ((2, 16, 8, 8), (16, 3, 4, 4), dict(stride=2, transposed=True), "float16", False, "igemm-tc", "the forward as a"),
]


@pytest.mark.parametrize("x,w,kw,dtype,tf32,alg,words", TC_TABLE)
def test_tensor_core_rule(x, w, kw, dtype, tf32, alg, words):
    """Note [tensor-core implicit GEMM]: half types on sm_80+ always, float32 only with TF32 allowed (math 'tf32',
    which the conformance tolerance reads), never float64, never the HIP set, never before sm_80."""
    pr = _problem(x, w, dtype, **kw)
    c = choose(pr, tf32=tf32)
    assert c.algorithm == alg and words in c.reason, c
    assert c.math == ("tf32" if alg == "igemm-tc" and dtype == "float32" else
                      "fp32-accumulate" if dtype in ("float16", "bfloat16") else "ieee")
    if alg == "igemm-tc":
        assert "tensor cores" in c.reason
        assert choose(pr, tf32=tf32, kernel_set="HIP").algorithm == "implicit_gemm"
        assert choose(pr, dataclasses.replace(H100, arch="sm_75"), tf32).algorithm == "implicit_gemm"
        if dtype == "float32":
            assert "TF32 allowed for float32 (test setting)" in c.reason


def test_tensor_core_tiles():
    tc_tile, tiles = igemm.tc_tile, igemm.TC_TILES
    assert tc_tile(25088, 64, 132) == tiles["128x64"]
    assert tc_tile(64, 1152, 132) == tiles["64x128"]
    assert tc_tile(100352, 256, 132) == tiles["128x128"]
    assert tc_tile(901_600, 1, 132) == tiles["128x16"]  # deepbench-speech-c1's backward-data phases
    assert tc_tile(401_408, 17, 132) == tiles["128x64"]
    # Note [tile rule]: TF32 forward / backward-data (ring of 3 stages at 128 x 64, 2 at 128 x 128) and reductions
    # of under 8 steps (resnet50-1x1-expand's forward, 64 long) take 128 x 64 where 128 x 128 would be chosen
    assert tc_tile(100352, 256, 132, reduction=576) == tiles["128x128"]
    assert tc_tile(100352, 256, 132, reduction=576, tf32_ring=True) == tiles["128x64"]
    assert tc_tile(100352, 256, 132, reduction=64) == tiles["128x64"]
    assert tc_tile(64, 1152, 132, reduction=64, tf32_ring=True) == tiles["64x128"]
    # wide weight gradients (wav2vec2-conv1d's 512 x 1536) take 128 x 128; narrower ones keep the rule above
    assert tc_tile(512, 1536, 132, reduction=12792, weight=True) == tiles["128x128"]
    assert tc_tile(512, 1536, 132, reduction=12792) == tiles["128x64"]
    assert tc_tile(1024, 512, 132, reduction=6272, weight=True) == tiles["128x64"]
    assert tc_tile(64, 1536, 132, reduction=6272, weight=True) == tiles["64x128"]
    assert tiles["64x128"] == (64, 128, 2)  # 32 x 32 warp tiles
    assert set(tiles) == set(portconv.knobs.TC_TILES)  # Options(igemm_tile=...) names every tile
    assert tc_tile(100352, 256, 132, forced="64x128") == tiles["64x128"]  # options(igemm_tile=...)
    assert igemm.tile_rule(100352, 256, 132, forced="64x128")[1] == "forced by options(igemm_tile)"
    assert select.sm_version("sm_90a") == 90 and select.sm_version("gfx90a") == 0


def test_ring_steps():
    """Note [stage rows]: a ring stage's channels stay inside one tap: steps a stage halve until 16 x steps divides
    the channel count (64, 96, 32: 2; 48, 144, 16: 1)."""
    assert igemm.ring_steps(64) == igemm.RING_STEPS == 2
    assert igemm.ring_steps(96) == igemm.ring_steps(32) == igemm.ring_steps(0) == 2
    assert igemm.ring_steps(48) == igemm.ring_steps(144) == igemm.ring_steps(16) == 1


def test_narrow_col_rule():
    """Note [narrow backward-data]: the column GEMM and col2im take backward-data for one group, at most NARROW_C
    channels of dX, 2+ taps, at least NARROW_K of dY, a dense weight and a column buffer of at most NARROW_COL_MAX."""
    def view_(n=32, c=1, k=32, g=1, r=(1, 5, 20), y=(1, 79, 341)):
        return ConvView(n, c, k, g, (1, 161, 700), y, r, (1, 2, 2), (0, 0, 0), (1, 1, 1))

    def ok(v, w_strides=None):
        shape = (v.K, v.C // v.G) + v.R[1:]
        return igemm.narrow_col(v, shape, w_strides or dense_strides(shape))

    assert ok(view_()) and ok(view_(c=3, k=64, r=(1, 7, 7), y=(1, 112, 112)))  # deepbench-speech-c1, resnet50-stem
    shape = (64, 3, 7, 7)
    assert igemm.narrow_col(view_(c=3, k=64, r=(1, 7, 7)), shape, dense_strides(shape, "channels_last"))
    assert not igemm.narrow_col(view_(c=3, k=64, r=(1, 7, 7)), shape, (3 * 7 * 8, 7 * 8, 8, 1))  # a strided W
    assert not ok(view_(c=5)) and not ok(view_(c=4, g=2)) and not ok(view_(k=8)) and not ok(view_(r=(1, 1, 1)))
    assert not ok(view_(n=4096))  # 4096 x 26939 positions x 100 columns: over NARROW_COL_MAX
    assert not ok(dataclasses.replace(view_(), DL=(1, 2, 1)))  # stride 2 and dilation 2 on one axis


def test_rocm_and_cpu_tensors_are_not_the_cuda_backends(monkeypatch):
    be = CudaBackend()
    cpu = Problem(ConvParams.make(2), dataclasses.replace(_spec((1, 2, 5, 5)), device_type="cpu", device_index=None),
                  _spec((2, 2, 3, 3)), False)
    with pytest.raises(Unsupported, match="CUDA tensors and CuPy arrays"):
        be.device_for(cpu)
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    with pytest.raises(Unsupported, match="ROCm"):
        be.device_for(_problem((1, 2, 5, 5), (2, 2, 3, 3)))


def test_simt_reads_no_environment_and_hip_does_not_import_cuda():
    """Note [knobs]: no module of the simt set reads the environment (hiprtc's include search reads ROCm's own
    ROCM_PATH / HIP_PATH, the NVRTC search CUDA's CUDA_PATH / CUDA_HOME, not portconv's) or names a PORTCONV_*
    variable in its code; the hip backend shares code with the cuda one through the simt modules, never by importing
    simt/cuda.py."""
    for path in sorted(SIMT.glob("*.py")):
        text = path.read_text()
        uses = re.findall(r"os\.(?:environ|getenv|putenv)[^\n]*", text)
        allowed = {"hip.py": ['os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"):'],
                   "nvidia.py": ['os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):  '
                                 "# the toolkit's own"]}.get(path.name, [])
        assert uses == allowed, (path.name, uses)
        tree = ast.parse(text)
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        code = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in docs]
        assert not [c for c in code if "PORTCONV_" in c], path.name
    tree = ast.parse((SIMT / "hip.py").read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            assert (n.module or "").split(".")[-1] != "cuda", n.module
            assert "cuda" not in [a.name for a in n.names], [a.name for a in n.names]
        assert not isinstance(n, ast.Import) or all("simt.cuda" not in a.name for a in n.names)
    assert "CudaBackend" not in (SIMT / "hip.py").read_text()


# --- the KernelPlans, as a table: (problem, device, options) -> what each result launches (no GPU needed) ---------
def _kernel_plans(problem, tf32=False, options=DEFAULT_OPTIONS, device=H100):
    c = choose(problem, device, tf32, options=options)

    def build_(call, mask, layouts):
        return select.build(problem, device, options, c, select.ENTRY, call, mask, layouts)
    return c, {k.result: k for k in implied_plans(problem, c, build_)}


def test_every_conformance_case_plans_on_both_vendors():
    """prepare() of the whole conformance grid (empty batches included, whose plan runs no kernel), four dtypes, on an
    NVIDIA and an AMD device: every family and every forced family the problem can take plans without error, and
    every explain() line fits its 120 columns."""
    from portconv.backends.program import EmptyRunner
    from portconv.backends.simt.hip import HipBackend
    from portconv.conformance import cases as C

    mi250 = DeviceInfo(vendor="amd", kind="gpu", name="MI250X", arch="gfx90a", wavefront=64, compute_units=110,
                       fp16=True, bf16=True)
    cuda_be, hip_be = CudaBackend(), HipBackend()
    planned = 0
    for case in C.all_cases():
        fmt = "channels_last" if case.layout == "chlast" and len(case.input_shape) == 4 else "contiguous"
        for dtype in ("float32", "float64", "float16", "bfloat16"):
            pr = Problem(case.params, _spec(case.input_shape, dtype, fmt), _spec(case.weight_shape, dtype), case.bias)
            for be, device, kset in ((cuda_be, H100, "CUDA"), (hip_be, mi250, "HIP")):
                for alg in (None, *select.FAMILIES):
                    try:
                        c = choose(pr, device, tf32=dtype == "float32", kernel_set=kset, options=Options(algorithm=alg))
                    except Unsupported:
                        continue
                    opts = Options(algorithm=alg)
                    if pr.input.shape[0] == 0 or pr.input.shape[1] == 0:  # before any loader (CuPy) is needed
                        kernels, runner = be.prepare(pr, device, c, opts)
                        assert isinstance(runner, EmptyRunner) and not any(k.launches for k in kernels), case.id
                    else:
                        def build(call, mask, lays, pr=pr, device=device, opts=opts, c=c, be=be):
                            return select.build(pr, device, opts, c, be.entries, call, mask, lays, be.dependent_waits)

                        kernels = implied_plans(pr, c, build)
                        assert all(k.launches for k in kernels), case.id
                    for line in [*c.reason.split("; "), *(x for k in kernels for x in k.lines())]:
                        assert len(line) <= WIDTH, (case.id, line)
                    planned += 1
    assert planned > 4000



TC16 = {"PC_TENSOR_CORES": "1", "PC_TC_BM": "128", "PC_TC_BN": "64", "PC_TC_WM": "4", "PC_TC_KS": "2"}
TC_W = {"PC_TENSOR_CORES": "1", "PC_TC_BM": "64", "PC_TC_BN": "128", "PC_TC_WM": "2", "PC_TC_KS": "2"}
PLAN_TABLE = [  # (name, problem, tf32, options, {result: [(kernel, grid, splits), ...]}, {result: defines}, staged)
    ("resnet50-l1-3x3 fp16 NCHW", _problem((8, 64, 56, 56), (64, 64, 3, 3), "float16", padding=1), False, Options(),
     {"output": [("portconv_igemm_fwd", (196, 1, 1), 1)],
      "grad_input": [("portconv_stage_transpose", (98, 2, 8), 1), ("portconv_stage_transpose", (18, 2, 1), 1),
                     ("portconv_igemm_bwd_data_phase", (196, 1, 1), 1)],
      "grad_weight": [("portconv_igemm_bwd_weight", (1, 5, 49), 49), ("portconv_split_finalize", (144, 1, 1), 49)],
      "grad_bias": [("portconv_bias_grad", (64, 9, 1), 9), ("portconv_split_finalize", (1, 1, 1), 9)]},
     {"output": TC16, "grad_input": TC16, "grad_weight": TC_W}, {"grad_input": ("grad_output", "weight")}),
    ("resnet50-l1-3x3 fp16 channels-last",
     _problem((8, 64, 56, 56), (64, 64, 3, 3), "float16", "channels_last", "channels_last", padding=1), False,
     Options(),
     {"output": [("portconv_igemm_fwd", (196, 1, 1), 1)],
      "grad_input": [("portconv_stage_transpose", (18, 2, 1), 1), ("portconv_igemm_bwd_data_phase", (196, 1, 1), 1)],
      "grad_weight": [("portconv_igemm_bwd_weight", (1, 5, 49), 49), ("portconv_split_finalize", (144, 1, 1), 49)]},
     {"output": TC16, "grad_weight": TC_W}, {"grad_input": ("weight",)}),
    ("resnet50-1x1-reduce TF32", _problem((32, 256, 56, 56), (64, 256, 1, 1)), True, Options(),
     {"output": [("portconv_igemm_fwd", (784, 1, 1), 1)],
      "grad_input": [("portconv_stage_transpose", (98, 2, 32), 1), ("portconv_stage_transpose", (8, 2, 1), 1),
                     ("portconv_igemm_bwd_data_phase", (784, 4, 1), 1)],
      "grad_weight": [("portconv_igemm_bwd_weight", (1, 2, 196), 196), ("portconv_split_finalize", (2048, 1, 1), 196)]},
     {"output": TC16}, {"grad_input": ("grad_output", "weight")}),  # TF32 stages for backward-data, never for TN
    ("deepbench-speech-c1 fp16 (Note [narrow backward-data])",
     _problem((32, 1, 161, 700), (32, 1, 5, 20), "float16", stride=2), False, Options(),
     {"output": [("portconv_igemm_fwd", (6735, 1, 1), 1)],
      "grad_input": [("portconv_igemm_col", (6735, 2, 1), 1), ("portconv_col2im", (4224, 1, 1), 1)],
      "grad_weight": [("portconv_igemm_bwd_weight", (1, 1, 524), 524), ("portconv_split_finalize", (400, 1, 1), 524)],
      "grad_bias": [("portconv_bias_grad", (32, 17, 1), 17), ("portconv_split_finalize", (4, 1, 1), 17)]},
     {"output": {**TC16, "PC_TC_KS": "1"}, "grad_input": TC16}, {}),
    ("options(igemm_tile='64x128')", _problem((8, 64, 56, 56), (64, 64, 3, 3), "float16", padding=1), False,
     Options(igemm_tile="64x128"),
     {"output": [("portconv_igemm_fwd", (392, 1, 1), 1)],
      "grad_input": [("portconv_igemm_bwd_data_phase", (392, 1, 1), 1)]},  # 64 rows: no vectors, no staging
     {"output": TC_W, "grad_input": TC_W, "grad_weight": TC_W}, {}),
    ("mbv2-dw3x3-last (Note [depthwise planes])",
     _problem((32, 960, 7, 7), (960, 1, 3, 3), padding=1, groups=960), False, Options(),
     {"output": [("portconv_depthwise_fwd_planes", (792, 1, 1), 1)],
      "grad_input": [("portconv_depthwise_bwd_data_planes", (792, 1, 1), 1)],
      "grad_weight": [("portconv_depthwise_bwd_weight_rows2d_s1", (960, 1, 1), 1)],
      "grad_bias": [("portconv_bias_grad", (960, 1, 1), 1)]},
     {"output": {"PC_DWP_BYTES": "24576", "PC_DWP_MINB": "6"}, "grad_weight": {"PC_DW_V": "8"}}, {}),
    ("mbv2-dw3x3-bf16 NCHW (tiles, 16-wide weight strips)",
     _problem((32, 144, 56, 56), (144, 1, 3, 3), "bfloat16", padding=1, groups=144), False, Options(),
     {"output": [("portconv_depthwise_fwd_tilen_s1", (1764, 1, 1), 1)],
      "grad_input": [("portconv_depthwise_bwd_data_tilen_s1", (1764, 1, 1), 1)],
      "grad_weight": [("portconv_depthwise_bwd_weight_rows2d_s1", (144, 14, 1), 14),
                      ("portconv_split_finalize", (6, 1, 1), 14)]},
     {"output": {"PC_DWT_N16": "4"}, "grad_input": {"PC_DWT_N16": "4"}, "grad_weight": {"PC_DW_V": "16"}}, {}),
    ("mbv2-dw3x3-bf16 channels-last",
     _problem((32, 144, 56, 56), (144, 1, 3, 3), "bfloat16", "channels_last", padding=1, groups=144), False, Options(),
     {"output": [("portconv_depthwise_fwd_tile_s1", (504, 1, 1), 1)],
      "grad_weight": [("portconv_depthwise_bwd_weight_tile2d_s1", (5, 49, 1), 49),
                      ("portconv_split_finalize", (162, 1, 1), 49)]},
     {"output": {}}, {}),
    ("depthwise 5x5, multiplier 2 (Note [depthwise bands]; backward-data on the generic strips)",
     _problem((3, 8, 40, 40), (16, 1, 5, 5), padding=2, groups=8), False, Options(),
     {"output": [("portconv_depthwise_fwd_bands_s1", (48, 1, 1), 1)],
      "grad_input": [("portconv_depthwise_bwd_data_rows", (38, 1, 1), 1)],
      "grad_weight": [("portconv_depthwise_bwd_weight_bands_s1", (16, 3, 1), 3),
                      ("portconv_split_finalize", (2, 1, 1), 3)]},
     {"output": {"PC_DWB_BYTES": "16384", "PC_DWB_CH": "5", "PC_DWB_CHP": "5", "PC_DWB_CLIP": "0", "PC_DWB_TW": "5",
                 "PC_DWB_VH": "8"}},
     {}),
    ("resnext (4 channels a group: direct)", _problem((2, 128, 14, 14), (128, 4, 3, 3), groups=32, padding=1), False,
     Options(),
     {"output": [("portconv_direct_fwd", (196, 1, 1), 1)], "grad_input": [("portconv_direct_bwd_data", (196, 1, 1), 1)],
      "grad_weight": [("portconv_direct_bwd_weight", (4608, 1, 1), 1)]},
     {"output": {}}, {}),
    ("transposed float64 (roles swapped)",
     _problem((2, 16, 7, 7), (16, 8, 4, 4), "float64", stride=2, transposed=True), False, Options(),
     {"output": [("portconv_igemm_bwd_data", (8, 1, 1), 1)], "grad_input": [("portconv_igemm_fwd", (2, 1, 1), 1)],
      "grad_weight": [("portconv_igemm_bwd_weight", (1, 2, 1), 1)],
      "grad_bias": [("portconv_bias_grad", (8, 1, 1), 1)]},
     {"output": {}}, {}),
]


@pytest.mark.parametrize("name,problem,tf32,options,launches,defines,staged", PLAN_TABLE,
                         ids=[r[0] for r in PLAN_TABLE])
def test_kernel_plan_table(name, problem, tf32, options, launches, defines, staged):
    """Each result's KernelPlan for the layouts the problem implies: its kernels in order, their grids and split
    counts, the module defines beyond dtype and index width, the staged operands, results dense in the plan's layout,
    and explain()'s lines within 120 columns."""
    c, plans = _kernel_plans(problem, tf32, options)
    assert set(plans) == {"output", "grad_input", "grad_weight", "grad_bias"}
    for result, want in launches.items():
        got = [(x.kernel, x.grid, view.arg_field(x, "splits")) for x in plans[result].launches]
        assert got == want, (result, got)
    for result, want in defines.items():
        got = {k: v for k, v in plans[result].launches[0].module.defines if k not in ("PC_DTYPE", "PC_INDEX64")}
        assert got == want, (result, got)
        dtype = dict(plans[result].launches[0].module.defines)["PC_DTYPE"]
        assert dtype == str(view.DTYPE_CODE[problem.dtype])
    for result, k in plans.items():
        stages = tuple(b.role.split(".stage.")[1] for b in k.buffers if ".stage." in b.role)
        assert stages == staged.get(result, ()), (result, stages)
        (res,) = [b for b in k.buffers if b.result]
        assert res.role == result and res.strides == dense_strides(res.shape, c.memory_format if result != "grad_bias"
                                                                   else "contiguous")
        assert all(len(line) <= WIDTH - 13 for line in k.lines()), k.lines()
        assert k.summary.startswith(c.algorithm + ": ")
        assert all(x.dependent == (x.kernel == "portconv_split_finalize") for x in k.launches)


N16_TABLE = [
    # (padding, stride, input strides or None for dense, input misalign in bytes, PC_DWT_N16 of the forward)
    (1, 1, None, 0, 4),  # Note [quad rows]: P2 1, rows of 56, strides multiples of 4, aligned
    (1, 1, None, 4, 2),  # 4-byte aligned only: pairs (P2 odd)
    (2, 1, None, 0, 1),  # P2 2: pairs, P2 even
    (1, 2, None, 0, 2),  # stride 2 never takes quads: pairs (P2 odd)
    (0, 2, None, 0, 0),  # 27 output columns: dY rows odd, one element an access
    (1, 1, None, 2, 0),  # a 2-byte-misaligned input: one element an access
    (1, 1, (144 * 56 * 58, 56 * 58, 58, 1), 0, 2),  # rows 58 apart (even, not a multiple of 4): pairs
    (1, 1, (144 * 56 * 57, 56 * 57, 57, 1), 0, 0),  # rows 57 apart (odd): one element an access
]


@pytest.mark.parametrize("padding,stride,strides,misalign,want", N16_TABLE)
def test_16bit_nchw_rows_are_the_plans_choice(padding, stride, strides, misalign, want):
    """Note [rows by plan]: a 16-bit 2-D NCHW tile launch's module names the one row path its layouts allow."""
    pr = _problem((32, 144, 56, 56), (144, 1, 3, 3), "bfloat16", padding=padding, stride=stride, groups=144)
    x = Layout(pr.input.shape, strides or pr.input.strides, misalign)
    (k,) = select.build(pr, H100, Options(), choose(pr), select.ENTRY, "forward", (),
                        (x, Layout(pr.weight.shape, pr.weight.strides), None))
    (launch,) = k.launches
    assert launch.kernel == f"portconv_depthwise_fwd_tilen_s{stride}"
    assert dict(launch.module.defines)["PC_DWT_N16"] == str(want)
    assert any("Note [rows by plan]" in line for line in k.decisions)


N16_RUNS = [  # (padding, stride, row pitch of the input, input offset in elements, PC_DWT_N16 of the forward)
    (1, 1, 56, 0, 4), (1, 1, 56, 2, 2), (2, 1, 56, 0, 1), (1, 2, 56, 0, 2), (0, 2, 56, 0, 0), (1, 1, 56, 1, 0),
    (1, 1, 58, 0, 2), (1, 1, 57, 0, 0),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("padding,stride,pitch,offset,want", N16_RUNS)
def test_16bit_nchw_rows_run(gpu, padding, stride, pitch, offset, want, dtype, monkeypatch):
    """Note [rows by plan] on the GPU: each row path (quads, pairs with P2 even and odd, one element an access) is
    the one its input's layout gets, and the forward and grad_input it computes match float64 (outputs poisoned)."""
    seen = []
    real = runtime.Loader.load

    def spy(self, program, anchor):
        seen.extend((x.kernel, dict(x.module.defines).get("PC_DWT_N16")) for x in program.launches)
        return real(self, program, anchor)

    monkeypatch.setattr(runtime.Loader, "load", spy)
    x, w, b, p = _make((32, 144, 56, 56), (144, 1, 3, 3), dict(padding=padding, stride=stride, groups=144),
                       "contig", dtype, gpu)  # N16_TABLE's problem: its stride-2 forward runs 'tilen' too
    buf = torch.full((offset + x.shape[0] * 144 * 56 * pitch,), float("nan"), device=gpu, dtype=dtype)
    x = buf.as_strided(x.shape, (144 * 56 * pitch, 56 * pitch, pitch, 1), offset).copy_(x)
    plan = portconv.plan(x, w, b, padding=padding, stride=stride, groups=144, backend="cuda")
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    ref = reference(x, w, b, p, go, (True, False, False))
    assert_close(plan.forward(x, w, b), ref[0], dtype, "output")
    gi = plan.backward(go, x, w, (True, False, False))[0]
    assert_close(gi, ref[1], dtype, "grad_input")
    assert (f"portconv_depthwise_fwd_tilen_s{stride}", str(want)) in seen, seen


def test_plans_depend_on_the_operands_layouts():
    """The same problem builds other launches for other layouts of its operands: a misaligned channels-last input
    loses the vector gathers (Note [vector gathers]), a grad_output in NCHW is staged where a channels-last one is not
    (Note [channels-last staging]), a strided input runs 'rows3s1' where 'planes' needs NCHW-dense planes (Note
    [depthwise planes]), and 64-bit indexing follows from any operand's extent."""
    pr = _problem((8, 64, 56, 56), (64, 64, 3, 3), "float16", "channels_last", "channels_last", padding=1)
    c = choose(pr)

    def launches(call, mask, layouts):
        return [x for k in select.build(pr, H100, Options(), c, select.ENTRY, call, mask, layouts) for x in k.launches]

    x = Layout(pr.input.shape, pr.input.strides)
    w = Layout(pr.weight.shape, pr.weight.strides)
    aligned = launches("forward", (), (x, w, None))
    misaligned = launches("forward", (), (dataclasses.replace(x, misalign=2), w, None))
    flags = view.arg_field(aligned[0], "flags"), view.arg_field(misaligned[0], "flags")
    assert flags[0] & view.FLAG_VA and not flags[1] & view.FLAG_VA
    go_cl = Layout(pr.output_shape, dense_strides(pr.output_shape, "channels_last"))
    go_nchw = Layout(pr.output_shape, dense_strides(pr.output_shape))
    stage = [x_.kernel for x_ in launches("backward", (True, False, False), (go_nchw, x, w))]
    assert stage.count("portconv_stage_transpose") == 2  # dY and W
    assert [x_.kernel for x_ in launches("backward", (True, False, False), (go_cl, x, w))].count(
        "portconv_stage_transpose") == 1  # W only
    dw = _problem((32, 960, 7, 7), (960, 1, 3, 3), padding=1, groups=960)
    cdw = choose(dw)
    xs = Layout(dw.input.shape, (960 * 7 * 14, 7 * 14, 14, 2))  # every other column
    names = [x_.kernel for k in select.build(dw, H100, Options(), cdw, select.ENTRY, "forward", (),
                                             (xs, Layout(dw.weight.shape, dw.weight.strides), None))
             for x_ in k.launches]
    assert names == ["portconv_depthwise_fwd_rows3s1"]
    huge_go = Layout(pr.output_shape, (2**31,) + dense_strides(pr.output_shape)[1:])
    (bw,) = select.build(pr, H100, Options(), c, select.ENTRY, "backward", (False, True, False), (huge_go, x, w))
    assert ("PC_INDEX64", "1") in bw.launches[0].module.defines
    assert ("PC_INDEX64", "0") in aligned[0].module.defines


def test_hip_set_on_nvidia_builds_no_tensor_cores_and_no_dependent_launch():
    """The HIP kernel set's plans (hip/ entries) never take the tensor-core family and never launch the finalize as a
    dependent launch: hip/prelude_hip.h's pc_grid_dependency_wait does not wait (Note [dependent launch])."""
    from portconv.backends.simt import hip

    pr = _problem((8, 64, 56, 56), (64, 64, 3, 3), "float16", padding=1)
    c = choose(pr, kernel_set="HIP")
    plans = select.build(pr, H100, Options(), c, hip.MODULES, "backward", (True, True, True),
                         (Layout(pr.output_shape, dense_strides(pr.output_shape)),
                          Layout(pr.input.shape, pr.input.strides), Layout(pr.weight.shape, pr.weight.strides)),
                         waits=False)
    launches = [x for k in plans for x in k.launches]
    assert c.algorithm == "implicit_gemm" and any(x.kernel == "portconv_split_finalize" for x in launches)
    assert not any(x.dependent for x in launches)
    assert {x.module.source for x in launches} == {"igemm.hip"}


# --- the runtime on the CPU: a fake device, the Executable and the Loader's launch heads ------------------------------
class _Addr:
    """A stand-in tensor with an address."""

    def __init__(self, addr: int):
        self.addr = addr


def _fake_program():
    """A call of two launches: the main kernel (input, weight, bias, output, workspace) and a dependent finalize."""
    from portconv.backends.program import Bind, Buffer, Launch, Program

    m = Module.of("direct.cu", {"PC_DTYPE": 0, "PC_INDEX64": 0})
    args = (0,) * 5 + (5, 6) + (0,) * (view.ARG_COUNT - 7)
    main = Launch(m, "main", (4, 1, 1), (256, 1, 1), args,
                  (Bind(0, "input"), Bind(1, "weight"), Bind(2, "output"), Bind(3, "bias"), Bind(4, "output.ws")))
    fin = Launch(m, "portconv_split_finalize", (1, 1, 1), (256, 1, 1), (0,) * 5 + (9,) + (0,) * (view.ARG_COUNT - 6),
                 (Bind(1, "output"), Bind(4, "output.ws")), dependent=True)
    bufs = (Buffer("output", (2, 3), (3, 1), "float32", True), Buffer("output.ws", (12,), (1,), "float32"))
    return Program(bufs, (main, fin), ("output",))


def _executable(program, launched, allocated):
    addr = iter(range(0x9000, 0x10000, 0x100))

    def alloc_for(b):
        return lambda poison: (allocated.append((b.role, poison)), _Addr(next(addr)))[1]
    steps = tuple((runtime._BLOCK(*x.args), tuple((b.slot, b.role) for b in x.binds), x.kernel)
                  for x in program.launches)
    return runtime.Executable(tuple((b.role, alloc_for(b), b.result) for b in program.buffers), steps,
                              program.outputs, lambda t: t.addr, lambda: 77,
                              lambda launches, stream: launched.extend((h, list(a[:6]), stream) for h, a in launches))


def test_executable_binds_this_calls_addresses(knob_env):
    """Note [programs]: each call allocates the program's buffers (results NaN-poisoned under PORTCONV_POISON, never
    workspaces), writes this call's addresses into a copy of each argument block and launches it on the caller's
    stream; the blocks loaded are templates no call changes."""
    knob_env("PORTCONV_POISON", "1")
    launched, allocated = [], []
    run = _executable(_fake_program(), launched, allocated)
    (out,) = run({"input": _Addr(0x500), "weight": _Addr(0x600), "bias": _Addr(0x700)})
    assert allocated == [("output", True), ("output.ws", False)]
    ws = out.addr + 0x100
    assert launched == [("main", [0x500, 0x600, out.addr, 0x700, ws, 5], 77),
                        ("portconv_split_finalize", [0, out.addr, 0, 0, ws, 9], 77)]
    knob_env("PORTCONV_POISON", "0")
    launched.clear()
    allocated.clear()
    (out2,) = run({"input": _Addr(0x800), "weight": _Addr(0x900), "bias": _Addr(0xA00)})
    assert allocated == [("output", False), ("output.ws", False)] and out2.addr != out.addr
    assert launched[0][1][:4] == [0x800, 0x900, out2.addr, 0xA00]
    assert all(v == 0 for v in run.steps[0][0][:5])  # the template keeps its address fields zero


class _FakeDriver:
    """What runtime.Loader asks of the driver (Note [ctypes toolchain]), on a machine without one: a device of
    compute capability ``cc`` whose primary context is 0xC0, and this thread's current context (``ctx``)."""

    def __init__(self, cc: str, ctx: int | None = 0xC0):
        self.cc, self.ctx, self.switches = int(cc), ctx, []

    def compute_capability(self, device):
        return self.cc

    def primary(self, device):
        return 0xC0

    def current(self):
        return self.ctx

    def make_current(self, device):
        old, self.ctx = self.ctx, 0xC0
        self.switches.append(("make_current", device, old))
        return old

    def restore(self, old):
        self.switches.append(("restore", old))
        self.ctx = old


@pytest.mark.parametrize("cc,pdl,ex", [("90", "1", True), ("90", "0", False), ("80", "1", False)])
def test_loader_launches_dependent_finalizes_with_pdl_on_sm90(cc, pdl, ex, monkeypatch, knob_env):
    """Note [dependent launch]: the Loader gives a dependent Launch cuLaunchKernelEx's programmatic-serialization
    head on sm_90+ unless PORTCONV_CUDA_PDL=0, every other launch cuLaunchKernel's; the driver gets the caller's
    stream and the patched block, in the device's primary context (Note [ctypes toolchain]: made current for the
    call where the thread has another or none, and the thread's restored after)."""
    knob_env("PORTCONV_CUDA_PDL", pdl)
    calls = []

    class Driver:
        has_ex = True
        head, head_ex = staticmethod(runtime.DriverLaunch.head), staticmethod(runtime.DriverLaunch.head_ex)

        def __call__(self, head, block_args, stream, device):
            assert nv.ctx == 0xC0, "launched outside the device's primary context"
            calls.append((head[0] == "ex", stream, block_args[0]))

    class Kernels:
        pip_hint, platform = "", "nvidia"

        def function(self, module, device, name):
            return type("Fn", (), {"ptr": 0x1234})()

    class CpuLoader(runtime.Loader):
        def _device(self, anchor):
            return 0

        def _alloc(self, b, device):
            return lambda poison: _Addr(0x4000)

        def _stream(self, device):
            return lambda: 42

    from portconv.backends.simt import nvidia

    nv = _FakeDriver(cc)
    monkeypatch.setattr(nvidia, "driver", lambda: nv)
    monkeypatch.setattr(runtime, "_driver", Driver())
    run = CpuLoader(Kernels(), "torch").load(_fake_program(), None)
    monkeypatch.setattr(run, "ptr", lambda t: t.addr)
    run({"input": _Addr(0x500), "weight": _Addr(0x600), "bias": _Addr(0x700)})
    assert calls == [(False, 42, 0x500), (ex, 42, 0)] and nv.switches == []
    for other in (0xAA, None):  # another device's context, or none: the device's for the call, the thread's after
        calls.clear()
        nv.ctx = other
        run({"input": _Addr(0x500), "weight": _Addr(0x600), "bias": _Addr(0x700)})
        assert calls == [(False, 42, 0x500), (ex, 42, 0)]
        assert nv.switches[-2:] == [("make_current", 0, other), ("restore", other)] and nv.ctx == other


def test_launch_config_matches_the_driver_abi():
    """cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out on 64-bit hosts."""
    import ctypes

    attr_t, cfg_t = runtime._LaunchAttribute, runtime._LaunchConfig
    assert ctypes.sizeof(attr_t) == 72 and attr_t.value.offset == 8
    assert ctypes.sizeof(cfg_t) == 56
    assert (cfg_t.shared.offset, cfg_t.stream.offset, cfg_t.attrs.offset, cfg_t.count.offset) == (24, 32, 40, 48)
    kind, cfg, attr, fn = runtime.DriverLaunch.head_ex(0x1234, (7, 2, 1), (256, 1, 1))
    assert kind == "ex" and fn.value == 0x1234 and list(cfg.grid) == [7, 2, 1] and list(cfg.block) == [256, 1, 1]
    assert cfg.count == 1 and cfg.attrs.contents.id == 6 and cfg.attrs.contents.value[0] == 1  # PDL allowed
    assert ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attr)  # kept alive with the config
    head = runtime.DriverLaunch.head(0x1234, (7, 2, 1), (256, 1, 1))
    assert [v.value for v in head] == [0x1234, 7, 2, 1, 256, 1, 1, 0]


# --- on the GPU ---------------------------------------------------------------------------------------------------
@pytest.fixture
def gpu(requested_backends, knob_env):
    """A CUDA device, poisoned outputs, and IEEE float32 (torch's TF32 conv policy off: float32 dense problems keep
    the FMA tile here; the tensor-core tests turn TF32 on themselves)."""
    from portconv.bench.settings import torch_variant

    device = gpu_for("cuda", requested_backends, knob_env)
    # these tests look into the Python Executable's loads and launches (spies): the native executor, which runs the
    # same Programs, is tested in test_native.py and by the conformance grid (Note [native executor])
    knob_env("PORTCONV_NATIVE", "off")
    with torch_variant(ieee=True):
        yield device
    clear_cache()


def _plan(x, w, b, kw, **options):
    """portconv.plan on the cuda backend, with these Options fields set (options(algorithm=...) forces a family)."""
    with portconv.options(**options):
        return portconv.plan(x, w, b, **kw, backend="cuda")


def _all(plan, x, w, b, go):
    return (plan.forward(x, w, b), *plan.backward(go, x, w, (True, True, True)))


GPU_CASES = [  # (input, weight, conv kwargs, layout)
    ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1), "contig"),
    ((2, 24, 17, 15), (24, 1, 3, 3), dict(padding=1, stride=2, groups=24), "chlast"),
    ((2, 8, 33), (16, 4, 4), dict(padding="same", dilation=2, groups=2), "strided"),
    ((1, 4, 6, 7, 8), (6, 4, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "chlast"),
    ((2, 12, 9, 9), (12, 8, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
    ((3, 8, 40, 40), (16, 1, 5, 5), dict(padding=2, groups=8), "contig"),
    ((2, 32, 11, 11), (48, 16, 3, 3), dict(padding=1, groups=2), "chlast"),  # Note [grouped implicit GEMM]
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_every_algorithm_matches_float64(gpu, case, dtype):
    xs, ws, kw, layout = GPU_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    problem = Problem(p, spec_of(x), spec_of(w), True)
    choice = _plan(x, w, b, kw)
    go = torch.randn(problem.output_shape, device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    algs = ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else [])
    for alg in algs + (["igemm-tc"] if choice.algorithm == "igemm-tc" else []):
        plan = _plan(x, w, b, kw, algorithm=alg)
        assert plan.algorithm == alg
        for name, got, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), _all(plan, x, w, b, go), ref):
            assert_close(got, r, dtype, f"{alg} {name}")
            assert got.device == gpu and got.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_loaded_programs_match_float64(gpu, case, dtype, monkeypatch):
    """Note [programs]: a plan's later calls run the Program its first call of that mask and layout loaded, with
    their own tensors' addresses: one Program a (call, mask, layouts), every family and direction, still float64's."""
    launches = spy_launches(monkeypatch)
    loads = []
    real = runtime.Loader.load
    monkeypatch.setattr(runtime.Loader, "load", lambda self, program, anchor: (loads.append(program),
                                                                               real(self, program, anchor))[1])
    xs, ws, kw, layout = GPU_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    x0, w0, b0, _ = _make(xs, ws, kw, layout, dtype, gpu, seed_mult=7)  # the first call's data
    problem = Problem(p, spec_of(x), spec_of(w), True)
    go = torch.randn(problem.output_shape, device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    masks = ((True, True, True), (True, False, False), (False, True, False))
    for alg in ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else []):
        loads.clear()
        plan = _plan(x, w, b, kw, algorithm=alg)
        for mask in masks:
            plan.forward(x0, w0, b0)
            plan.backward(torch.randn_like(go), x0, w0, mask)
            y = plan.forward(x, w, b)
            grads = plan.backward(go, x, w, mask)
            for name, got, r, m in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), ref,
                                       (True, *mask)):
                if m:
                    assert_close(got, r, dtype, f"{alg} {name} (second call)")
                else:
                    assert got is None
        assert len(loads) == 1 + len(masks), alg
    assert launches


def test_public_api_autograd_and_output_mask(gpu):
    x, w, b, p = _make((2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    x.requires_grad_(True)
    y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    assert portconv.plan(x, w, b, padding=1, backend="cuda").backend == BackendId.CUDA
    y.sum().backward()
    ref = reference(x, w, b, p, torch.ones_like(y))
    assert_close(y.detach(), ref[0], torch.float32, "output")
    assert_close(x.grad, ref[1], torch.float32, "grad_input")
    gi, gw, gb = portconv.convolution_backward(torch.ones_like(y), x.detach(), w, [16], [1, 1], [1, 1], [1, 1],
                                               False, [0, 0], 1, output_mask=(False, True, False), backend="cuda")
    assert gi is None and gb is None
    assert_close(gw, ref[2], torch.float32, "grad_weight")


@pytest.mark.parametrize("again", [False, True])
def test_zero_copy_and_current_stream(gpu, again):
    """Inputs are read in place and work is queued on torch's current stream: a copy into x queued behind a
    long sleep on a side stream must be seen by the convolution issued on that same stream. ``again``: the
    plan's first call ran on the default stream, so the side-stream call runs its loaded Program (Note [programs])."""
    x, w, b, p = _make((4, 16, 64, 64), (16, 16, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    if again:
        portconv.conv2d(x, w, b, padding=1, backend="cuda")
    ptr = x.data_ptr()
    new = torch.randn_like(x)
    side = torch.cuda.Stream(gpu)
    torch.cuda.synchronize(gpu)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        x.copy_(new)
        y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    side.synchronize()
    assert x.data_ptr() == ptr and y.device == gpu
    assert_close(y, reference(new, w, b, p, torch.zeros(y.shape))[0], torch.float32, "output on the side stream")


def test_non_default_device(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the non-default device index cannot be exercised here")
    dev = torch.device("cuda", 1)
    x, w, b, p = _make((2, 8, 10, 10), (8, 8, 3, 3), dict(padding=1), "contig", torch.float32, dev)
    y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
    assert y.device == dev
    assert_close(y, reference(x, w, b, p, torch.zeros(y.shape))[0], torch.float32, "output on cuda:1")


def test_cupy_arrays_in_and_out(gpu, monkeypatch):
    cupy = pytest.importorskip("cupy")
    x, w, b, p = _make((2, 6, 11, 11), (12, 6, 3, 3), dict(padding=1, stride=2), "contig", torch.float32, gpu)
    xc, wc, bc = (cupy.asarray(t.cpu().numpy()) for t in (x, w, b))
    y = portconv.conv2d(xc, wc, bc, padding=1, stride=2, backend="cuda")
    assert isinstance(y, cupy.ndarray) and y.device.id == gpu.index
    assert_close(torch.from_numpy(cupy.asnumpy(y)), reference(x, w, b, p, torch.zeros(1, 12, 6, 6))[0],
                 torch.float32, "cupy output")
    from portconv import fastpath, planner  # Note [fast path]: a repeated call runs the cached plan, same numbers

    assert fastpath.get(fastpath.key("conv2d", xc, wc, bc, (2, 1, 1, 1, 0), "cuda")) is not None
    for name in ("make_problem", "select"):
        monkeypatch.setattr(planner, name, lambda *a, **k: pytest.fail("validated and planned again"))
    y2 = portconv.conv2d(xc, wc, bc, padding=1, stride=2, backend="cuda")
    assert isinstance(y2, cupy.ndarray) and bool((y2 == y).all())
    monkeypatch.undo()  # convolution_backward validates every call (no fast path)
    gi, gw, gb = portconv.convolution_backward(cupy.ones_like(y), xc, wc, [12], [2, 2], [1, 1], [1, 1], False,
                                               [0, 0], 1, backend="cuda")
    ref = reference(x, w, b, p, torch.ones(2, 12, 6, 6))
    for name, g_, r in zip(("grad_input", "grad_weight", "grad_bias"), (gi, gw, gb), ref[1:]):
        assert isinstance(g_, cupy.ndarray)
        assert_close(torch.from_numpy(cupy.asnumpy(g_)), r, torch.float32, f"cupy {name}")


# Note [fork], as DataLoader users meet it. Every call of a forked child that would reach the CUDA runtime raises
# portconv's BackendUnavailable at once, naming the cause and the fix; an automatic plan on torch tensors raises torch's
# own error as torch does. A hang is run_script's timeout.
_FORK_COMMON = PRELUDE + r"""
import torch, portconv
from portconv.errors import BackendUnavailable

WHY = "forked after its parent used the CUDA/HIP runtime"
x, w = torch.randn(2, 4, 8, 8, device="cuda"), torch.randn(4, 4, 3, 3, device="cuda")


def refused(call):
    e = error_of(call)
    assert type(e) is BackendUnavailable and WHY in str(e) and "'spawn' or 'forkserver'" in str(e), repr(e)
"""

_FORK_AFTER_PORTCONV = _FORK_COMMON + r"""
import cupy

xc, wc = cupy.asarray(x.cpu().numpy()), cupy.asarray(w.cpu().numpy())
portconv.conv2d(x, w, padding=1, backend="cuda")  # the parent runs portconv's CUDA kernels
portconv.conv2d(xc, wc, padding=1, backend="cuda")
torch.cuda.synchronize()


class Convs(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return portconv.conv2d(xc, wc, padding=1, backend="cuda")  # the parent's plan in a forked worker


refused(lambda: list(torch.utils.data.DataLoader(Convs(), batch_size=None, num_workers=2,
                                                 multiprocessing_context="fork", timeout=60)))


def child():
    refused(lambda: portconv.conv2d(x, w, padding=1, backend="cuda"))  # the parent's plans
    refused(lambda: portconv.conv2d(xc, wc, padding=1, backend="cuda"))
    refused(lambda: portconv.conv2d(xc, wc, stride=2, backend="cuda"))  # new plans: the probes say why
    refused(lambda: portconv.conv2d(x, w, stride=2, backend="hip"))
    e = error_of(lambda: portconv.conv2d(xc, wc, stride=2))  # automatic on CuPy arrays: each candidate says why
    assert type(e) is BackendUnavailable and WHY in str(e), repr(e)
    e = error_of(lambda: portconv.conv2d(x, w, stride=2))  # automatic on torch tensors: torch's own error
    t = error_of(lambda: torch.nn.functional.conv2d(x, w, stride=2))
    assert type(e) is type(t) and str(e).splitlines()[0] == str(t).splitlines()[0], (repr(e), repr(t))


in_child(child)
print("FORK-OK")
"""

_FORK_AFTER_TORCH = _FORK_COMMON + r"""
portconv.conv2d(x, w, padding=1)  # CUDA through torch only (ATen's route): portconv's CUDA kernels never ran
assert portconv.plan(x, w, padding=1).backend.value not in ("cuda", "hip")
in_child(lambda: refused(lambda: portconv.conv2d(x, w, padding=1, backend="cuda")))
print("FORK-OK")
"""


@pytest.mark.parametrize("script", [_FORK_AFTER_PORTCONV, _FORK_AFTER_TORCH], ids=["portconv", "torch"])
def test_forked_children_refuse_at_once(gpu, script):
    """After the parent ran portconv's CUDA kernels (or only torch's CUDA), DataLoader(num_workers=2) workers and
    os.fork children that call the cuda or hip backend raise BackendUnavailable naming the fork and the fix."""
    run_script(script, "FORK-OK")


def test_new_threads_run_plans_in_the_devices_context(gpu):
    """Note [ctypes toolchain]: a thread that never used CUDA loads and launches a new plan and runs a cached one
    (the launcher makes the device's primary context current for the call and restores the thread's), with the
    same numbers as the main thread."""
    import threading

    x, w, b, p = _make((2, 8, 9, 9), (8, 1, 3, 3), dict(padding=1, groups=8), "contig", torch.float32, gpu)
    y = portconv.conv2d(x, w, b, padding=1, groups=8, backend="cuda")
    got = {}

    def worker():
        try:
            got["cached"] = portconv.conv2d(x, w, b, padding=1, groups=8, backend="cuda")
            got["new"] = portconv.conv2d(x, w, b, padding=1, stride=2, groups=8, backend="cuda")
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            got["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert "error" not in got, got.get("error")
    torch.cuda.synchronize()
    assert torch.equal(got["cached"], y)
    ref = reference(x, w, b, ConvParams.make(2, weight_shape=w.shape, padding=1, stride=2, groups=8),
                    torch.zeros(2, 8, 5, 5))
    assert_close(got["new"], ref[0], torch.float32, "new plan in a new thread")


def test_index64_variant(gpu):
    """The 64-bit-index build computes the same numbers (forced here on a small problem: options(index64=True))."""
    x, w, b, p = _make((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    with portconv.options(index64=True):
        y = portconv.conv2d(x, w, b, padding=1, backend="cuda")
        plan = portconv.plan(x, w, b, padding=1, backend="cuda")
    assert "64-bit" in plan.reason and ("PC_INDEX64", "1") in plan.kernels[0].launches[0].module.defines
    assert_close(y, reference(x, w, b, p, torch.zeros(y.shape))[0], torch.float32, "64-bit index output")


def test_compile_cache_on_disk(gpu, tmp_path, knob_env):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    module = Module.of("direct.cu", {"PC_DTYPE": 0, "PC_INDEX64": 0})
    for expect in ("nvrtc", "disk"):
        ks = compile.KernelSet()
        n = len(compile.compile_events())
        ks.module(module, gpu.index)
        ks.module(module, gpu.index)  # the memory cache: no new event
        events = compile.compile_events()[n:]
        assert [e.how for e in events] == [expect] and events[0].seconds > 0
    assert len(list((tmp_path / "cuda").glob("*.bin"))) == 1


def test_profiler_sees_portconv_kernels(gpu):
    from torch.profiler import ProfilerActivity, profile

    x, w, b, _ = _make((2, 16, 24, 24), (16, 1, 3, 3), dict(padding=1, groups=16), "contig", torch.float32, gpu)
    x.requires_grad_(True)
    portconv.conv2d(x, w, b, padding=1, groups=16, backend="cuda").sum().backward()  # compile outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        portconv.conv2d(x, w, b, padding=1, groups=16, backend="cuda").sum().backward()
        torch.cuda.synchronize(gpu)
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert all(any(n.startswith(k + "_") for n in names)  # a variant (_rows3s1, _planes ...)
               for k in ("portconv_depthwise_fwd", "portconv_depthwise_bwd_data")), sorted(names)
    assert not [n for n in names if re.search(r"cudnn|xmma|conv_depthwise[23]d", n, re.I)], sorted(names)


def test_dependent_finalize_on_sm90(gpu, monkeypatch, knob_env):
    """Note [dependent launch]: on sm_90+ a split finalize is launched with programmatic stream serialization (unless
    PORTCONV_CUDA_PDL=0), and the weight gradient it sums matches float64 either way."""
    heads = []
    real = runtime.DriverLaunch.head_ex
    monkeypatch.setattr(runtime.DriverLaunch, "head_ex", staticmethod(lambda *a: (heads.append(a), real(*a))[1]))
    x, w, b, p = _make((8, 64, 28, 28), (64, 64, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    go = torch.randn(8, 64, 28, 28, device=gpu)
    ref = reference(x, w, b, p, go)
    for pdl in ("1", "0"):
        knob_env("PORTCONV_CUDA_PDL", pdl)
        heads.clear()
        gw = portconv.plan(x, w, b, padding=1, backend="cuda").backward(go, x, w, (False, True, False))[1]
        assert_close(gw, ref[2], torch.float32, f"grad_weight, PDL {pdl}")
        sm90 = torch.cuda.get_device_capability(gpu) >= (9, 0)
        assert bool(heads) == (pdl == "1" and sm90 and runtime.driver_launch().has_ex), heads


TC_CASES = [  # (input, weight, conv kwargs, layout): edges, dilation, strides, 1-D/3-D, transposed, channels-last
    ((3, 40, 13, 11), (72, 40, 3, 3), dict(padding=1), "contig"),
    ((2, 24, 17, 15), (136, 24, 3, 3), dict(padding=2, stride=2, dilation=2), "chlast"),
    ((2, 8, 33), (20, 8, 4), dict(padding="same", dilation=2), "strided"),
    ((1, 12, 6, 7, 8), (18, 12, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "chlast"),
    ((2, 36, 9, 9), (36, 20, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
    ((4, 64, 28, 28), (160, 64, 1, 1), dict(), "chlast"),
    ((2, 3, 64, 64), (16, 3, 7, 7), dict(stride=2, padding=3), "contig"),  # 147-long reduction, split-K weight grad
]
TC_TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 2e-3}  # float32 on TF32: 10-bit mantissas


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(TC_CASES)))
def test_tensor_core_igemm(gpu, case, dtype):
    """Note [tensor-core implicit GEMM] on the GPU: the plan picks 'igemm-tc' (float32: with TF32 allowed),
    every direction matches float64, and the profiler sees portconv's igemm kernels, no cuDNN."""
    from torch.profiler import ProfilerActivity, profile

    xs, ws, kw, layout = TC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    conv = getattr(torch.backends.cudnn, "conv", None)
    old = conv.fp32_precision if conv is not None and hasattr(conv, "fp32_precision") else None
    old_legacy = None if old is not None else torch.backends.cudnn.allow_tf32
    try:
        if old is not None:
            conv.fp32_precision = "tf32"
        else:
            torch.backends.cudnn.allow_tf32 = True
        clear_cache()
        problem = Problem(p, spec_of(x), spec_of(w), True)
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        assert "tensor cores" in plan.reason and plan.math == ("tf32" if dtype == torch.float32 else "fp32-accumulate")
        go = torch.randn(problem.output_shape, device=gpu).to(dtype)
        ref = reference(x, w, b, p, go)
        for name, got, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), _all(plan, x, w, b, go), ref):
            assert got is not None and torch.isfinite(got).all(), name
            err = ((got.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
            assert err < TC_TOL[dtype], f"igemm-tc {dtype} {name}: relative error {err:.3g}"
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            plan.forward(x, w, b)
            plan.backward(go, x, w, (True, True, False))
            torch.cuda.synchronize(gpu)
        names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        phase = "_phase" if all(s == 1 or d == 1 for s, d in zip(p.stride, p.dilation)) else ""  # [bwd-data phases]
        narrow = igemm.narrow_col(ConvView.of(problem), w.shape, w.stride())  # Note [narrow backward-data]
        bwd = "portconv_col2im" if narrow else f"portconv_igemm_bwd_data{phase}"
        assert {"portconv_igemm_fwd", bwd, "portconv_igemm_bwd_weight"} <= names, names
        assert not [n for n in names if re.search(r"cudnn|xmma|sm\d+_", n, re.I)], sorted(names)
    finally:
        if old is not None:
            conv.fp32_precision = old
        else:
            torch.backends.cudnn.allow_tf32 = old_legacy
        clear_cache()
    if dtype == torch.float32:  # IEEE float32 (the gpu fixture's policy): the FMA tile again
        assert portconv.plan(x, w, b, **kw, backend="cuda").algorithm == "implicit_gemm"


@pytest.fixture
def tf32_conv():
    """torch's cuDNN conv float32 policy set to TF32 for one test (igemm-tc takes float32 only then), restored after."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        pytest.skip("this torch has no torch.backends.cudnn.conv.fp32_precision")
    old = conv.fp32_precision
    conv.fp32_precision = "tf32"
    yield
    conv.fp32_precision = old
    clear_cache()


def _misaligned(t):
    """The same values as t, one element past a 16-byte boundary (the kernels can take no 16-byte vectors of it)."""
    buf = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    return buf[1:].as_strided(t.shape, t.stride()).copy_(t)


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


def _tc_check(got, ref, dtype, what: str) -> None:
    """The four results of a tensor-core plan: finite, and within TC_TOL of the float64 reference."""
    for name, g_, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
        assert torch.isfinite(g_).all(), f"{what} {name}"
        err = ((g_.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
        assert err < TC_TOL[dtype], f"{what} {dtype} {name}: relative error {err:.3g}"


def _igemm_flags(launches) -> list[int]:
    """Note [vector gathers]: the PC_FLAG_VA / PC_FLAG_VB bits of each implicit-GEMM launch, in launch order."""
    return [f & (view.FLAG_VA | view.FLAG_VB) for n, f, _ in launches if n.startswith("portconv_igemm")]


@pytest.mark.parametrize("tile", sorted(igemm.TC_TILES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tensor_core_every_tile(gpu, tile, dtype, tf32_conv):
    """Every tile of igemm.TC_TILES (forced through options(igemm_tile=...)) on an edge-heavy problem per kind:
    channels-last with stride and dilation (generic gathers) and a transposed one (Note [bwd-data phases])."""
    for case in (1, 4, 6):
        xs, ws, kw, layout = TC_CASES[case]
        x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
        plan = _plan(x, w, b, kw, igemm_tile=tile)
        assert plan.algorithm == "igemm-tc", plan.reason
        bm, bn, wm = igemm.TC_TILES[tile]
        tiled = [x_ for k in plan.kernels for x_ in k.launches if x_.kernel.startswith("portconv_igemm")]
        assert all(("PC_TC_BM", str(bm)) in x_.module.defines and ("PC_TC_BN", str(bn)) in x_.module.defines
                   for x_ in tiled)
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        ref = reference(x, w, b, p, go)
        for name, g_, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), _all(plan, x, w, b, go), ref):
            err = ((g_.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
            assert err < TC_TOL[dtype], f"{tile} case {case} {dtype} {name}: relative error {err:.3g}"


NARROW_TC = [  # Note [narrow backward-data] on the tensor-core tiles
    ((4, 1, 41, 70), (32, 1, 5, 20), dict(stride=2), "contig"),  # C_in = 1 (deepbench-speech-c1's shape, smaller)
    ((2, 3, 30, 30), (64, 3, 7, 7), dict(stride=2, padding=3), "chlast"),  # an RGB stem; W channels-last too
    ((2, 32, 9, 9), (32, 3, 4, 4), dict(stride=2, padding=1, transposed=True), "contig"),  # a transposed forward to 3
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(NARROW_TC)))
def test_tensor_core_narrow_backward_data(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [narrow backward-data]: few dX channels run grad_input (a transposed problem's forward, with its bias) as
    the 1 x 1 column GEMM on tensor cores and portconv_col2im; the plan says so, every direction matches float64
    with outputs poisoned, and the caller's tensors are unchanged."""
    launches = spy_launches(monkeypatch)
    xs, ws, kw, layout = NARROW_TC[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    if layout == "chlast":
        w = _channels_last(w)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc" and "col2im" in plan.reason, plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    keep = [t.clone() for t in (x, w, b, go)]
    ref = reference(x, w, b, p, go)
    _tc_check(_all(plan, x, w, b, go), ref, dtype, f"narrow case {case}")
    assert all(torch.equal(a, k) for a, k in zip((x, w, b, go), keep))
    names = [n for n, _, _ in launches]
    assert names.count("portconv_col2im") == names.count("portconv_igemm_col") == 1, names
    assert not [n for n in names if "bwd_data" in n], names


VEC_CASES = [  # Note [vector gathers]: channel counts of A's reduction multiples of 16; edges of every tile
    ((3, 32, 13, 11), (48, 32, 3, 3), dict(padding=1, stride=2)),  # phase bwd-data over 4 phases, K = 48
    ((2, 48, 5, 9, 7), (32, 48, 3, 3, 3), dict(padding=1)),  # taps along depth
    ((2, 16, 11, 12), (32, 16, 3, 3), dict(padding=(1, 2), dilation=(1, 2))),  # C = 16, dilation
    ((2, 32, 9, 9), (32, 24, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True)),
    ((5, 16, 7, 7), (144, 16, 1, 1), dict()),  # 144 columns: a partial second column tile
    ((2, 64, 9, 10), (64, 64, 3, 3), dict(padding=1)),  # C = K = 64: 2 steps a ring stage
]


@pytest.mark.parametrize("w_layout", ["chlast", "contig"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(VEC_CASES)))
def test_tensor_core_vector_gathers(gpu, case, dtype, w_layout, monkeypatch, tf32_conv):
    """Note [vector gathers]: channels-last problems whose reduction channels come in 16s read A (and, forward with a
    channels-last weight, B) 16 bytes at a time: the launches carry FLAG_VA (FLAG_VB), every direction matches
    float64; the same problem from a misaligned address runs the element gathers (no flag) and matches too. The ring
    stages take 2 steps where 32 channels divide a tap's and 1 where they do not (Note [stage rows]: the cases' 1, 3,
    9, 27 steps leave part-empty stages)."""
    launches = spy_launches(monkeypatch)
    xs, ws, kw = VEC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, "chlast", dtype, gpu)
    if w_layout == "chlast":
        w = _channels_last(w)
    for misaligned in (False, True):
        if misaligned:
            x = _misaligned(x)
        launches.clear()
        clear_cache()
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        go = _channels_last(go)
        ref = reference(x, w, b, p, go)
        _tc_check(_all(plan, x, w, b, go), ref, dtype, f"case {case} {w_layout} misaligned={misaligned}")
        flags = _igemm_flags(launches)
        used = 0
        for f in flags:
            used |= f
        if not misaligned:
            assert used & view.FLAG_VA, flags
        elif not p.transposed:  # the forward's A is the misaligned x
            assert not flags[0] & view.FLAG_VA, flags
        if not p.transposed:  # B of the forward is W: vectors when its channels are contiguous (a 1x1 W is)
            wl = view.Operand("weight", Layout(tuple(w.shape), w.stride(), w.data_ptr() % 16))
            assert bool(flags[0] & view.FLAG_VB) == view.vector_ok(wl, w.element_size()), flags


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(VEC_CASES)))
def test_tensor_core_channels_last_staging(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [channels-last staging]: dense NCHW operands of a vector-eligible launch (at every size here: stage_pays
    overruled) are first transposed into channel-contiguous workspaces; the launches then carry FLAG_VA and
    FLAG_VB, every direction matches float64, and the caller's tensors are unchanged."""
    monkeypatch.setattr(igemm, "stage_pays", lambda macs, elems, direction: bool(elems))
    launches = spy_launches(monkeypatch)
    xs, ws, kw = VEC_CASES[case]
    x, w, b, p = _make(xs, ws, kw, "contig", dtype, gpu)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc", plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    ref = reference(x, w, b, p, go)
    keep = [t.clone() for t in (x, w, go)]
    _tc_check(_all(plan, x, w, b, go), ref, dtype, f"case {case}")
    assert all(torch.equal(a, k) for a, k in zip((x, w, go), keep))
    assert [n for n, _, _ in launches if n == "portconv_stage_transpose"], "no operand was staged"
    flags = _igemm_flags(launches)
    assert any(f & view.FLAG_VA and f & view.FLAG_VB for f in flags), flags


GROUPED_CASES = [  # Note [grouped implicit GEMM]: 8+ channels a group; vectors where a group's channels come in 16s
    ((2, 32, 9, 9), (64, 16, 3, 3), dict(padding=1, groups=2), "chlast"),  # vector A, B; TN weight gradient
    ((2, 48, 37), (48, 8, 5), dict(padding=2, groups=6), "contig"),  # 8 a group: element gathers, M lanes
    ((2, 32, 7, 7), (32, 8, 4, 4), dict(stride=2, padding=1, groups=4, transposed=True), "chlast"),  # phases
    ((2, 48, 499), (48, 16, 32), dict(padding=16, groups=3), "contig"),  # posconv-like: a long kernel
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(GROUPED_CASES)))
def test_tensor_core_grouped(gpu, case, dtype, monkeypatch, tf32_conv):
    """Note [grouped implicit GEMM]: grouped problems with 8+ channels a group plan igemm-tc and match float64 in
    every direction; channels-last ones whose groups' channels come in 16s take the vector modes and the TN tile."""
    launches = spy_launches(monkeypatch)
    xs, ws, kw, layout = GROUPED_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    clear_cache()
    plan = portconv.plan(x, w, b, **kw, backend="cuda")
    assert plan.algorithm == "igemm-tc" and "grouped" in plan.reason, plan.reason
    go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
    go = _channels_last(go) if layout == "chlast" else go
    ref = reference(x, w, b, p, go)
    _tc_check(_all(plan, x, w, b, go), ref, dtype, f"grouped case {case}")
    flags = _igemm_flags(launches)
    if case == 0:
        assert any(f & view.FLAG_VA for f in flags), flags
        assert any(f & view.FLAG_VA and f & view.FLAG_VB for f in flags), flags  # the weight gradient's TN tile


TN_CASES = [  # Note [TN tiles]: weight gradients whose dY and X channels come in whole 16-byte vectors
    ((3, 16, 5, 7), (24, 16, 3, 3), dict(padding=1)),  # rows of 7 (a step crosses rows), K = 24: a partial M tile
    ((8, 64, 28, 28), (64, 64, 3, 3), dict(padding=1)),  # a long reduction: split over grid z, the workspace
    ((2, 16, 5, 6, 7), (16, 16, 3, 3, 3), dict(padding=1, stride=(1, 2, 1))),  # 3-D
    ((4, 32, 37), (16, 32, 5), dict(stride=2, padding=1)),  # 1-D (NCHW only: staged)
    ((2, 16, 9, 9), (16, 8, 4, 4), dict(stride=2, padding=1, transposed=True)),  # transposed: roles swapped
]


@pytest.mark.parametrize("layout", ["chlast", "contig"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(TN_CASES)))
def test_tensor_core_tn_weight_gradient(gpu, case, dtype, layout, monkeypatch, tf32_conv):
    """Note [TN tiles]: the weight gradient of a channels-last problem (or a dense NCHW 16-bit one, staged:
    stage_pays overruled) launches with FLAG_VA | FLAG_VB and matches float64 (Note [TN copy order]); from a
    misaligned channels-last X (no vectors) and for TF32 NCHW (never staged) it launches without them and matches
    too."""
    xs, ws, kw = TN_CASES[case]
    if layout == "chlast" and len(xs) == 3:
        pytest.skip("1-D tensors have no channels-last memory format; the contig run stages this case")
    monkeypatch.setattr(igemm, "stage_pays", lambda macs, elems, direction: bool(elems))
    launches = spy_launches(monkeypatch)
    x, w, b, p = _make(xs, ws, kw, layout, dtype, gpu)
    vec = view.FLAG_VA | view.FLAG_VB
    for variant in ("tn", "misaligned"):
        if variant == "misaligned":
            x = _misaligned(x)
        launches.clear()
        clear_cache()
        plan = portconv.plan(x, w, b, **kw, backend="cuda")
        assert plan.algorithm == "igemm-tc", plan.reason
        go = torch.randn(tuple(plan.problem.output_shape), device=gpu).to(dtype)
        if layout == "chlast":
            go = _channels_last(go)
        keep = [t.clone() for t in (x, go)]
        ref = reference(x, w, b, p, go)
        gw = plan.backward(go, x, w, (False, True, False))[1]
        assert torch.isfinite(gw).all()
        err = ((gw.double().cpu() - ref[2]).norm() / ref[2].norm()).item()
        assert err < TC_TOL[dtype], f"case {case} {dtype} {layout} {variant}: relative error {err:.3g}"
        assert all(torch.equal(a, k) for a, k in zip((x, go), keep))
        (flags,) = [f for n, f, _ in launches if n == "portconv_igemm_bwd_weight"]
        # a staged copy is aligned: vectors again; TF32 never stages for the weight gradient (Note [channels-last
        # staging]), so its NCHW problems keep the element gathers
        stages = layout == "contig" and dtype != torch.float32
        expect = (variant == "tn" and (layout == "chlast" or stages)) or (variant == "misaligned" and stages)
        assert (flags & vec == vec) == expect, (variant, launches)
    if case == 1:  # the long reduction was split
        assert [g for n, _, g in launches if n == "portconv_igemm_bwd_weight"][0][2] > 1, launches
