"""The hip backend: its rule, modes and result layout (pure), the shared bodies' wave64 paths on the CPU emulator, and
on a GPU (AMD through hiprtc, NVIDIA through HIP-on-NVIDIA) its kernels against float64 PyTorch.

The GPU tests run when pytest is given --backend hip (tox -e hip) and then FAIL if the backend is unavailable.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import shutil
import tempfile
import types

import pytest
import torch
from conftest import gpu_for
from emu import EmuKernels, EmuLoader
from gpu_refs import assert_close as _assert_close
from gpu_refs import make
from gpu_refs import reference as _reference

import portconv
from portconv import backends
from portconv.backends import BackendId
from portconv.backends.simt import compile, hip, select
from portconv.backends.simt.hip import HipBackend
from portconv.device import DeviceInfo
from portconv.errors import Unsupported
from portconv.knobs import Options
from portconv.params import ConvParams
from portconv.planner import build, clear_cache
from portconv.problem import Problem
from portconv.rules import TorchContext
from portconv.tensors import TensorSpec, dense_strides, spec_of

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
# Device descriptions typed in from the vendors' published specifications (no AMD GPU is reachable here).
MI250X = DeviceInfo(vendor="amd", kind="gpu", name="AMD Instinct MI250X/MI250", arch="gfx90a", runtime="hip",
                    wavefront=64, compute_units=110, memory_bytes=64 * 2**30, local_mem_bytes=65536,
                    max_work_group=1024, fp16=True, bf16=True, versions=(("hip", "7.0.51831"),), index="cuda:0")
MI300X = dataclasses.replace(MI250X, name="AMD Instinct MI300X", arch="gfx942", compute_units=304,
                             memory_bytes=192 * 2**30)
RX7900 = dataclasses.replace(MI250X, name="AMD Radeon RX 7900 XTX", arch="gfx1100", wavefront=32, compute_units=48,
                             memory_bytes=24 * 2**30)
H100 = DeviceInfo(vendor="nvidia", kind="gpu", name="NVIDIA H100", arch="sm_90", runtime="cuda", wavefront=32,
                  compute_units=132, fp16=True, bf16=True)
# Recorded ROCm contexts (tests/test_plan.py's MI300 and its variants): what MIOpen's layout rule reads.
ROCM_NHWC_OFF = TorchContext(device_type="cuda", torch_version="2.13.0+rocm7.0", is_hip=True, miopen_version=30500,
                             gpu_arch="gfx942", miopen_nhwc_default=False)
ROCM_NHWC_ON = dataclasses.replace(ROCM_NHWC_OFF, miopen_nhwc_default=True)
ROCM_ENV_ON = dataclasses.replace(ROCM_NHWC_OFF, miopen_suggest_nhwc="1")
ROCM_ENV_OFF = dataclasses.replace(ROCM_NHWC_ON, miopen_suggest_nhwc="0")


def _spec(shape, dtype="float32", fmt="contiguous"):
    return TensorSpec(tuple(shape), dense_strides(shape, fmt), dtype, "cuda", 0, "torch")


def _problem(x_shape, w_shape, dtype="float32", fmt="contiguous", **kw) -> Problem:
    p = ConvParams.make(len(x_shape) - 2, weight_shape=w_shape, **kw)
    return Problem(p, _spec(x_shape, dtype, fmt), _spec(w_shape, dtype), True)


@pytest.fixture
def recorded(monkeypatch):
    """HipBackend().choose reading a recorded ROCm context instead of this machine's torch: returns a setter."""
    def use(ctx: TorchContext):
        monkeypatch.setattr(HipBackend, "context", lambda self, problem, device: ctx)
    use(ROCM_NHWC_OFF)
    return use


# --- the rule, the modes and the result layout (no GPU) ------------------------------------------------------------
@pytest.mark.parametrize("device,words", [
    (MI250X, "hiprtc on gfx90a (wave64)"), (MI300X, "hiprtc on gfx942 (wave64)"),
    (RX7900, "hiprtc on gfx1100 (wave32)"), (H100, "HIP-on-NVIDIA via the prelude (NVRTC on sm_90, wave32)"),
])
def test_reason_names_the_mode_and_the_algorithm_is_the_simt_sets(device, words, recorded):
    problems = [_problem((8, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144),
                _problem((8, 64, 28, 28), (64, 64, 3, 3), "bfloat16", "channels_last", padding=1),
                _problem((2, 32, 14, 14), (64, 8, 3, 3), "float64", groups=4, padding=1),
                _problem((2, 16, 7, 7), (16, 8, 4, 4), "float16", stride=2, transposed=True)]
    for pr in problems:
        ctx = ROCM_NHWC_OFF if device.vendor == "amd" else TorchContext(device_type="cuda")
        c, ref = HipBackend().choose(pr, device, Options()), select.choose(pr, device, Options(), ctx, "HIP")
        assert c.reason.startswith(words + "; ") and c.reason.endswith(ref.reason), c.reason
        assert (c.algorithm, c.memory_format, c.math) == (ref.algorithm, ref.memory_format, ref.math)
        assert c.algorithm != "igemm-tc"  # no tensor-core tile in the HIP set


def test_rule_rejects_other_vendors_and_dtypes(recorded):
    with pytest.raises(Unsupported, match="AMD GPUs"):
        HipBackend().choose(_problem((1, 2, 5, 5), (2, 2, 3, 3)), dataclasses.replace(H100, vendor="intel"), Options())
    with pytest.raises(Unsupported, match="not int32"):
        HipBackend().choose(_problem((1, 2, 5, 5), (2, 2, 3, 3), "int32"), MI250X, Options())
    with pytest.raises(Unsupported, match="no tensor-core tile"):
        HipBackend().choose(_problem((1, 16, 5, 5), (16, 16, 3, 3), "float16"), H100, Options(algorithm="igemm-tc"))


LAYOUT_TABLE = [  # (context, device, input format, dtype, result format): Note [own kernels' result layout]
    (ROCM_NHWC_OFF, MI300X, "channels_last", "float32", "contiguous"),  # MIOpen 3.5, NHWC off: ATen's contiguous
    (ROCM_NHWC_ON, MI300X, "channels_last", "float32", "channels_last"),
    (ROCM_NHWC_ON, MI300X, "contiguous", "float32", "contiguous"),
    (ROCM_NHWC_ON, MI300X, "channels_last", "float64", "contiguous"),  # no NHWC for float64
    (ROCM_ENV_ON, MI250X, "channels_last", "bfloat16", "channels_last"),  # PYTORCH_MIOPEN_SUGGEST_NHWC=1
    (ROCM_ENV_OFF, MI300X, "channels_last", "float16", "contiguous"),  # ... =0 overrides the default
    (TorchContext(device_type="cuda"), H100, "channels_last", "float32", "channels_last"),  # cuDNN's rule on NVIDIA
    (ROCM_NHWC_OFF, H100, "channels_last", "float32", "channels_last"),  # whatever a context says of MIOpen
    (TorchContext(device_type="cuda"), H100, "channels_last", "float64", "contiguous"),
]


@pytest.mark.parametrize("ctx,device,fmt,dtype,result", LAYOUT_TABLE)
def test_result_layout_is_miopens_on_amd_and_cudnns_on_nvidia(ctx, device, fmt, dtype, result, recorded):
    """Issue 28: on ROCm the HIP set returns what ATen with MIOpen returns (MIOpen's NHWC rule), on NVIDIA cuDNN's;
    through select.choose and HipBackend.choose, and the reason says which rule."""
    recorded(ctx)
    pr = _problem((2, 16, 9, 9), (16, 16, 3, 3), dtype, fmt, padding=1)
    for c in (select.choose(pr, device, Options(), ctx, "HIP"), HipBackend().choose(pr, device, Options())):
        assert c.memory_format == result, c.reason
        assert ("MIOpen's rule" if device.vendor == "amd" else "cuDNN's rule") in c.reason
    assert select.result_rule(device) == ("miopen" if device.vendor == "amd" else "cudnn")


def test_plans_allocate_results_in_the_rules_layout(recorded):
    """The plan's results (Buffers with result=True) are dense in the chosen layout: contiguous under MIOpen's rule
    with NHWC off, though the input is channels-last."""
    pr = _problem((2, 16, 9, 9), (16, 16, 3, 3), fmt="channels_last", padding=1)
    c = HipBackend().choose(pr, MI300X, Options())
    kernels, _ = _prepare(HipBackend(), pr, MI300X, c)
    results = {b.role: b for k in kernels for b in k.buffers if b.result}
    assert results["output"].strides == dense_strides((2, 16, 9, 9)) and c.memory_format == "contiguous"
    assert results["grad_input"].strides == dense_strides((2, 16, 9, 9))
    assert all(x.module.source in hip.MODULES.values() for k in kernels for x in k.launches)
    assert not any(x.dependent for k in kernels for x in k.launches)  # hip/prelude_hip.h does not wait


def _prepare(be: HipBackend, pr: Problem, device: DeviceInfo, choice):
    """KernelPlans of the implied layouts without a loader (no CuPy here)."""
    from portconv.backends.simt.base import implied_plans

    def build_(call, mask, layouts):
        return select.build(pr, device, Options(), choice, be.entries, call, mask, layouts, be.dependent_waits)
    return implied_plans(pr, choice, build_), build_


@pytest.mark.parametrize("arch,wave", [("gfx90a", 64), ("gfx90a:sramecc+:xnack-", 64), ("gfx940", 64),
                                       ("gfx942", 64), ("gfx950", 64), ("gfx908", 64), ("gfx1030", 32),
                                       ("gfx1100", 32), ("gfx1201", 32), ("gfx9-generic", 64),
                                       ("gfx10-3-generic", 32)])
def test_wave_of_gfx_targets(arch, wave):
    assert hip.wave_of(arch) == wave


def test_compile_options_per_platform():
    amd = hip.compile_options("amd", 64, 70051831)
    assert "-DWAVE_SIZE=64" in amd and "-DPC_HIP_VERSION=70051831" in amd and "-O3" in amd
    assert not any("NVIDIA" in o for o in amd)
    nv = hip.compile_options("nvidia", 32)
    assert "-DPC_HIP_ON_NVIDIA=1" in nv and "-DWAVE_SIZE=32" in nv
    with pytest.raises(ValueError):
        hip.compile_options("intel", 32)


@pytest.mark.parametrize("platform", ["amd", "nvidia"])
def test_kernel_set_compiles_the_hip_entries_over_the_cuda_bodies(platform):
    BODY = {"direct": "conv_direct.cuh", "depthwise": "conv_depthwise.cuh", "implicit_gemm": "conv_igemm.cuh"}
    ks = hip.kernel_set(platform)
    for alg, entry in hip.MODULES.items():
        text = ks.text(entry)
        assert f'#line 1 "{entry}"' in text and '#line 1 "prelude_hip.h"' in text
        assert f'#line 1 "{BODY[alg]}"' in text
        assert '"prelude.cuh"' not in text  # the CUDA prelude is never part of a HIP module
        for name in (*hip.KERNELS[alg], *hip.COMMON_KERNELS):
            assert f" {name}(" in text
    assert ks.compiler == ("hiprtc" if platform == "amd" else "nvrtc") and ks.vendor == f"hip-{platform}"


def test_build_check_covers_every_define_the_runtime_uses(recorded):
    """scripts/hip_build.py compiles hip.DEFINE_SETS for every module: every HIP launch's module has one of them as its
    base (dtype, index width), the other defines being the depthwise module's sizes (strips, planes)."""
    sizes = {"PC_DW_V", "PC_DWP_BYTES", "PC_DWP_MINB"}
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for pr in (_problem((2, 8, 9, 9), (8, 8, 3, 3), dtype, padding=1),
                   _problem((2, 8, 7, 7), (8, 1, 3, 3), dtype, padding=1, groups=8),
                   _problem((2, 16, 9, 9), (16, 4, 3, 3), dtype, padding=1, groups=4)):
            for alg in ("direct", "implicit_gemm") + (("depthwise",) if pr.is_depthwise else ()):
                c = HipBackend().choose(pr, MI250X, Options(algorithm=alg))
                for k in _prepare(HipBackend(), pr, MI250X, c)[0]:
                    for x in k.launches:
                        d = dict(x.module.defines)
                        base = {"PC_DTYPE": int(d.pop("PC_DTYPE")), "PC_INDEX64": int(d.pop("PC_INDEX64"))}
                        assert base in [dict(s) for s in hip.DEFINE_SETS], x.module
                        assert set(d) <= sizes and x.module.source == hip.MODULES[alg], x.module
                        assert x.kernel in (*hip.KERNELS[alg], *hip.COMMON_KERNELS), x.kernel


def test_probe_without_cupy_names_the_rocm_extra_on_amd(monkeypatch):
    """Note [ctypes toolchain]: CuPy is the runtime on AMD only. Where torch is built for ROCm and CuPy is missing,
    the probe names the pip extra; on NVIDIA (here: no driver) it names the driver, not CuPy."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    rocm = types.SimpleNamespace(version=types.SimpleNamespace(hip="7.0"))
    monkeypatch.setattr(compile, "torch_with_gpu", lambda: rocm)
    a = HipBackend().probe()
    assert not a and "CuPy is not installed" in a.reason and "portconv[rocm]" in a.reason, a


def test_probe_without_any_gpu_names_the_driver_and_the_rocm_extra(monkeypatch):
    """Note [ctypes toolchain]: on NVIDIA the hip set needs the driver and NVRTC, not CuPy; with neither an NVIDIA
    driver nor an AMD GPU torch or CuPy knows of, the probe names the driver and what AMD GPUs need."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has the NVIDIA driver")
    except OSError:
        pass
    monkeypatch.setattr(compile, "torch_with_gpu", lambda: None)
    monkeypatch.setattr(compile.importlib.util, "find_spec", lambda name: None)  # no CuPy: platform 'nvidia'
    a = HipBackend().probe()
    assert not a and "libcuda.so.1" in a.reason and "portconv[rocm]" in a.reason, a


# --- wave64 on the CPU: the shared bodies under tests/cuda_emu with 64-lane warps ------------------------------------
class _Wave64Backend(HipBackend):
    def __init__(self, tmp):
        super().__init__(wave=64)
        self.emu = EmuKernels(tmp, 64)

    def loader(self, problem):
        return EmuLoader(self.emu, wave=64)


@pytest.fixture(scope="module")
def wave64():
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of the bodies needs a C++20 compiler")
    emu = (TESTS / "cuda_emu" / "prelude.cuh").read_text()
    assert "#ifndef PC_WARP_SIZE" in emu, "the emulator must take PC_WARP_SIZE from the command line"
    with tempfile.TemporaryDirectory() as tmp:
        yield _Wave64Backend(pathlib.Path(tmp))


WAVE64_CASES = [  # reductions (grad_weight, grad_bias) over 64-lane waves, split and unsplit
    ((2, 4, 9, 9), (6, 4, 3, 3), dict(padding=1)),
    ((2, 6, 11, 11), (12, 1, 3, 3), dict(padding=1, stride=2, groups=6)),
    ((3, 2, 800), (3, 2, 1), dict()),  # a long 1x1 row: the bias gradient splits over the two emulated units
]


@pytest.mark.parametrize("case", range(len(WAVE64_CASES)))
def test_bodies_with_wave64_reductions_match_float64_on_the_cpu(wave64, case, knob_env, monkeypatch):
    """The bodies compiled with PC_WARP_SIZE 64 (the AMD CDNA value) run every family, all four tensors, against
    aten in float64: the 6-step shuffle folds and 4-wave block sums of wave64 are exercised."""
    knob_env("PORTCONV_POISON", "1")
    monkeypatch.setattr(HipBackend, "context", lambda self, problem, device: ROCM_NHWC_OFF)
    monkeypatch.setitem(backends._INSTANCES, BackendId.HIP, wave64)
    xs, ws, kw = WAVE64_CASES[case]
    g = torch.Generator().manual_seed(case)
    x, w = torch.randn(xs, generator=g, dtype=torch.float64), torch.randn(ws, generator=g, dtype=torch.float64)
    b = torch.randn(ws[0], generator=g, dtype=torch.float64)
    p = ConvParams.make(len(xs) - 2, weight_shape=ws, **kw)
    problem = Problem(p, spec_of(x), spec_of(w), True)
    dev = dataclasses.replace(MI250X, compute_units=2)
    go = torch.randn(problem.output_shape, generator=g, dtype=torch.float64)
    ref = _reference(x, w, b, p, go)
    for alg in ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else []):
        opts = Options(algorithm=alg)
        plan = build(problem, BackendId.HIP, dev, wave64.choose(problem, dev, opts), opts)
        got = (plan.forward(x, w, b), *plan.backward(go, x, w, (True, True, True)))
        for name, g_, r_ in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, ref):
            _assert_close(g_, r_, torch.float64, f"wave64 {alg} {name}")


# --- on the GPU ----------------------------------------------------------------------------------------------------
@pytest.fixture
def gpu(requested_backends, knob_env):
    return gpu_for("hip", requested_backends, knob_env)


def _on_amd() -> bool:
    return bool(getattr(torch.version, "hip", None))


GPU_CASES = [  # (input, weight, conv kwargs, layout)
    ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1), "contig"),
    ((2, 24, 17, 15), (24, 1, 3, 3), dict(padding=1, stride=2, groups=24), "chlast"),
    ((2, 8, 33), (16, 4, 4), dict(padding="same", dilation=2, groups=2), "strided"),
    ((1, 4, 6, 7, 8), (6, 4, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "chlast"),
    ((2, 12, 9, 9), (12, 8, 4, 4), dict(stride=2, padding=1, output_padding=1, transposed=True), "contig"),
    ((3, 8, 40, 40), (16, 1, 5, 5), dict(padding=2, groups=8), "contig"),
    ((4, 3, 5000), (4, 3, 1), dict(), "contig"),  # long reductions: split partial sums
]


def _check_all_algorithms(be, dev, case, dtype, monkeypatch):
    monkeypatch.setitem(backends._INSTANCES, BackendId.HIP, be)
    xs, ws, kw, layout = GPU_CASES[case]
    x, w, b, p = _make(xs, ws, kw, layout, dtype, dev)
    x_before = x.clone()
    problem = Problem(p, spec_of(x), spec_of(w), True)
    device = be.device_for(problem)
    go = torch.randn(problem.output_shape, device=dev).to(dtype)
    ref = _reference(x, w, b, p, go)
    for alg in ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else []):
        opts = Options(algorithm=alg)
        plan = build(problem, BackendId.HIP, device, be.choose(problem, device, opts), opts)
        y = plan.forward(x, w, b)
        grads = plan.backward(go, x, w, (True, True, True))
        for name, got, r in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), ref):
            _assert_close(got, r, dtype, f"{alg} {name}")
            assert got.device == dev and got.dtype == dtype
    assert torch.equal(x, x_before), "the caller's input was modified"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_every_algorithm_matches_float64(gpu, case, dtype, monkeypatch):
    _check_all_algorithms(HipBackend(), gpu, case, dtype, monkeypatch)


@pytest.mark.parametrize("case", [0, 1, 5, 6])
def test_other_wave_size_matches_float64(gpu, case, monkeypatch):
    """Wave-size-generic paths on real hardware: on NVIDIA the bodies compiled with WAVE_SIZE 16 (16-lane
    shuffles inside each warp, 16 partial sums per block); on AMD with the device's own wavefront, checked."""
    be = HipBackend(wave=None if _on_amd() else 16)
    _check_all_algorithms(be, gpu, case, torch.float32, monkeypatch)
    arch, opts, _ = be.kernels().arch_options(gpu.index)
    want = hip.wave_of(arch) if _on_amd() else 16
    assert f"-DWAVE_SIZE={want}" in opts, opts


def test_plan_names_the_mode_and_the_hip_set_ran(gpu, tmp_path, knob_env, monkeypatch):
    from torch.profiler import ProfilerActivity, profile

    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(backends._INSTANCES, BackendId.HIP, HipBackend())  # no modules in memory yet
    clear_cache()
    x, w, b, _ = _make((2, 16, 24, 24), (16, 1, 3, 3), dict(padding=1, groups=16), "contig", torch.float32, gpu)
    plan = portconv.plan(x, w, b, padding=1, groups=16, backend="hip")
    assert plan.backend == BackendId.HIP
    words = "hiprtc on gfx" if _on_amd() else "HIP-on-NVIDIA via the prelude"
    assert words in plan.reason, plan.explain()
    x.requires_grad_(True)
    portconv.conv2d(x, w, b, padding=1, groups=16, backend="hip").sum().backward()  # compile outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        portconv.conv2d(x, w, b, padding=1, groups=16, backend="hip").sum().backward()
        torch.cuda.synchronize(gpu)
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert all(any(n.startswith(k + "_") for n in names)  # a variant (_rows3s1, _tilen_s1 ...)
               for k in ("portconv_depthwise_fwd", "portconv_depthwise_bwd_data")), sorted(names)
    platform = "amd" if _on_amd() else "nvidia"
    assert list((tmp_path / f"hip-{platform}").glob("*.bin")), "no hip/ module was compiled into the cache"
    assert not (tmp_path / "cuda").exists(), "the cuda/ kernel set ran instead of hip/"


def test_rocm_result_layout_matches_aten(gpu):
    """On ROCm the HIP set's results take the layout ATen with MIOpen gives the same call (issue 28)."""
    if not _on_amd():
        pytest.skip("MIOpen's rule is ROCm's")
    x, w, b, _ = _make((2, 16, 12, 12), (16, 16, 3, 3), dict(padding=1), "chlast", torch.float32, gpu)
    y = portconv.conv2d(x, w, b, padding=1, backend="hip")
    ref = torch.nn.functional.conv2d(x, w, b, padding=1)
    assert y.stride() == ref.stride(), (y.stride(), ref.stride())


def test_public_api_autograd_and_output_mask(gpu):
    x, w, b, p = _make((2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    x.requires_grad_(True)
    y = portconv.conv2d(x, w, b, padding=1, backend="hip")
    y.sum().backward()
    ref = _reference(x, w, b, p, torch.ones_like(y))
    _assert_close(y.detach(), ref[0], torch.float32, "output")
    _assert_close(x.grad, ref[1], torch.float32, "grad_input")
    gi, gw, gb = portconv.convolution_backward(torch.ones_like(y), x.detach(), w, [16], [1, 1], [1, 1], [1, 1],
                                               False, [0, 0], 1, output_mask=(False, True, False), backend="hip")
    assert gi is None and gb is None
    _assert_close(gw, ref[2], torch.float32, "grad_weight")


def test_cupy_arrays_in_and_out(gpu):
    cupy = pytest.importorskip("cupy")
    x, w, b, p = _make((2, 6, 11, 11), (12, 6, 3, 3), dict(padding=1, stride=2), "contig", torch.float32, gpu)
    xc, wc, bc = (cupy.asarray(t.cpu().numpy()) for t in (x, w, b))
    y = portconv.conv2d(xc, wc, bc, padding=1, stride=2, backend="hip")
    assert isinstance(y, cupy.ndarray) and y.device.id == gpu.index
    _assert_close(torch.from_numpy(cupy.asnumpy(y)), _reference(x, w, b, p, torch.zeros(1, 12, 6, 6))[0],
                  torch.float32, "cupy output")


def test_current_stream(gpu):
    """Work is queued on torch's current stream: a copy queued behind a long sleep on a side stream is seen."""
    x, w, b, p = _make((4, 16, 64, 64), (16, 16, 3, 3), dict(padding=1), "contig", torch.float32, gpu)
    new = torch.randn_like(x)
    side = torch.cuda.Stream(gpu)
    torch.cuda.synchronize(gpu)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x.copy_(new)
        y = portconv.conv2d(x, w, b, padding=1, backend="hip")
    side.synchronize()
    _assert_close(y, _reference(new, w, b, p, torch.zeros(y.shape))[0], torch.float32, "output on the side stream")


def _make(xs, ws, kw, layout, dtype, dev):
    return make(xs, ws, kw, layout, dtype, dev, seed_mult=37)
