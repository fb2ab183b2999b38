"""The native executor (Note [native executor]): its Executables against the Python path's on the CUDA bodies in the
CPU emulator (poisoned), its autograd node (masks, create_graph, in-place checks, hooks), the knob and a failed
build; on an NVIDIA GPU (pytest --backend cuda) a converted model's layers on it against float64."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from test_cuda_compile import EMU_CASES, EmuBackend, _check, _setup, run_plan

from portconv import functional, knobs, native
from portconv.knobs import Options


@pytest.fixture(scope="module")
def native_module():
    if native._compiler() is None:
        if os.environ.get("PORTCONV_REQUIRE_NATIVE") == "1":
            pytest.fail("PORTCONV_REQUIRE_NATIVE=1 but no C++ compiler (c++, g++, clang++ or $CXX)", pytrace=False)
        pytest.skip("no C++ compiler: the native executor cannot be built here (every call stays in Python; set "
                    "PORTCONV_REQUIRE_NATIVE=1 to make this a failure)")
    m = native.wait()
    assert m is not None, f"the native executor did not build: {native.status()}"
    return m


@pytest.fixture
def native_backend(native_module, emu_kernels, knob_env):
    """The emulated cuda backend whose plans get the native executor, results NaN-poisoned."""
    knob_env("PORTCONV_POISON", "1")
    return EmuBackend(emu_kernels, native=True)


CASES = [EMU_CASES[i] for i in (0, 2, 6, 7)]  # dense 2-D, 1-D 'same' strided, depthwise channels-last, transposed


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"r{c.rank}g{c.groups}{'t' if c.transposed else ''}{c.layout}")
def test_native_matches_float64(native_backend, case, monkeypatch):
    """Every result of each family's plan, run by the native Executables (two calls of a layout, the second on
    other storage), against aten in float64; outputs and workspaces NaN-poisoned."""
    for dtype in (torch.float64, torch.float32):
        x, w, b, problem, go, ref = _setup(case, dtype)
        for alg in ["direct", "implicit_gemm"] + (["depthwise"] if problem.is_depthwise else []):
            p = run_plan(native_backend, monkeypatch, problem, Options(algorithm=alg))
            n = p.runner.native
            assert n is not None, native.status()
            x0, w0, b0, *_ = _setup(case, dtype)
            p.forward(x0, w0, b0)
            got = (p.forward(x, w, b), *p.backward(go, x, w, (True, True, True)))
            _check(got, ref, dtype, f"native {alg}")
            assert n.size() == 2 and len(native_backend.loaders[-1].programs) == 2  # forward, backward: native
            gi, gw, gb = p.backward(go, x, w, (False, True, False))
            assert gi is None and gb is None and gw is not None and n.size() == 3


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


def test_native_autograd_node(native_backend, monkeypatch):
    """functional's call of a plan with the native executor records its C++ node: gradients of every mask against
    float64, a second backward over a retained graph, hooks, create_graph (the Python differentiable backward),
    and autograd's in-place check."""
    case = EMU_CASES[0]
    x, w, b, problem, go, ref = _setup(case, torch.float64)
    p = run_plan(native_backend, monkeypatch, problem, Options(algorithm="implicit_gemm"))
    params = problem.params
    xr, wr, br = _leaves(x, w, b)
    seen = []
    out = functional._execute(p, xr, wr, br, params)
    assert out.grad_fn is not None and out.requires_grad
    out.register_hook(lambda g: seen.append(g.shape))
    out.backward(go, retain_graph=True)
    _check((out.detach(), xr.grad, wr.grad, br.grad), ref, torch.float64, "native node")
    out.backward(go)
    assert torch.allclose(xr.grad, 2 * ref[1]) and seen == [out.shape, out.shape]
    for need in ((True, False, False), (False, True, False), (False, False, True)):
        leaves = [t.detach().clone().requires_grad_(r) for t, r in zip((x, w, b), need)]
        functional._execute(p, *leaves, params).backward(go)
        for t, r, want in zip(leaves, need, ref[1:]):
            assert (t.grad is not None) == r
            if r:
                assert torch.allclose(t.grad, want)
    xr, wr = _leaves(x, w)  # create_graph: an input-gradient penalty, against PyTorch's in float64
    gx, = torch.autograd.grad(functional._execute(p, xr, wr, None, params), xr, go, create_graph=True)
    gx.pow(2).sum().backward()
    xt, wt = _leaves(x, w)
    gxt, = torch.autograd.grad(F.conv2d(xt, wt, None, 1, 1), xt, go, create_graph=True)
    gxt.pow(2).sum().backward()
    assert torch.allclose(wr.grad, wt.grad) and wt.grad.norm() > 0
    xr, wr = _leaves(x, w)
    y = xr * 1
    out = functional._execute(p, y, wr, None, params)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(go)
    with torch.no_grad():
        assert functional._execute(p, xr, wr, None, params).grad_fn is None


def test_native_off(native_module, emu_kernels, knob_env, monkeypatch):
    """PORTCONV_NATIVE=off: plans keep the Python path."""
    knob_env("PORTCONV_NATIVE", "off")
    x, w, b, problem, go, ref = _setup(EMU_CASES[0], torch.float64)
    p = run_plan(EmuBackend(emu_kernels, native=True), monkeypatch, problem, Options(algorithm="direct"))
    assert p.runner.native is None and native.status() == "off"
    _check((p.forward(x, w, b), *p.backward(go, x, w, (True, True, True))), ref, torch.float64, "python")


def test_a_built_module_loads_without_a_build_toolchain(native_module):
    """A later process finds the module in the cache and loads it without importing torch.utils.cpp_extension and
    setuptools, whose import (only a build needs its header paths) held the GIL through a warm first step."""
    env = {**os.environ, "PORTCONV_CACHE_DIR": str(knobs.env().cache_dir)}
    code = ("import sys; from portconv import native; m = native.wait(); print(m is not None, native.status(), "
            "sorted({'setuptools', 'torch.utils.cpp_extension'} & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["True", "ready", "[]"], (r.stdout, r.stderr[-2000:])


def test_native_build_failure_keeps_python(tmp_path):
    """A compiler that fails leaves the executor unavailable with the compiler's reason; nothing raises."""
    env = {**os.environ, "CXX": shutil.which("false") or "/bin/false", "PORTCONV_CACHE_DIR": str(tmp_path)}
    code = "from portconv import native; print(native.wait() is None, native.status())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("True unavailable: ") and "failed" in r.stdout


def test_native_build_outlives_its_process(tmp_path):
    """A build started by a process that exits at once (PORTCONV_NATIVE=auto, a short script) still puts the module
    in the cache: here a stand-in compiler that takes 2 s and writes its output file."""
    cxx = tmp_path / "slow-cxx"
    cxx.write_text('#!/bin/sh\nsleep 2\nwhile [ "$1" != "-o" ]; do shift; done\necho built > "$2"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "CXX": str(cxx), "PORTCONV_CACHE_DIR": str(tmp_path / "cache"), "PORTCONV_NATIVE": "auto"}
    code = ("import pathlib, sys, time; from portconv import native; native._start(); f = pathlib.Path(sys.argv[1])\n"
            "while not (f.is_dir() and any(p.suffix == '.log' for p in f.iterdir())): time.sleep(0.05)\n"
            "print(native.status())")  # exits as soon as the compiler has started
    folder = tmp_path / "cache" / "native"
    r = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "building", (r.stdout, r.stderr[-2000:])
    for _ in range(100):
        done = [f.name for f in folder.iterdir() if f.name.startswith("portconv_native_")]
        if done and all(not n.endswith((".tmp", ".log")) for n in done):
            break
        time.sleep(0.1)
    assert len(done) == 1 and (folder / done[0]).read_text() == "built\n", done


# --- on an NVIDIA GPU ----------------------------------------------------------------------------------------------
@pytest.fixture
def cuda_native(requested_backends, native_module, knob_env):
    from conftest import gpu_for

    from portconv.planner import clear_cache

    yield gpu_for("cuda", requested_backends, knob_env)
    clear_cache()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_gpu_layers(cuda_native, dtype):
    """A converted stack (depthwise 3x3 on the own kernels, a 1x1 on ATen) trained one step under autocast where
    the dtype is 16-bit, on a side stream: the depthwise plan runs natively and every gradient matches float64."""
    import portconv

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(96, 96, 3, padding=1, groups=96), torch.nn.Conv2d(96, 32, 1)).to(
        cuda_native)
    model = portconv.convert(copy.deepcopy(base))
    x = torch.randn(8, 96, 40, 40, device=cuda_native)
    s = torch.cuda.Stream()
    for m in (base, model):
        with torch.cuda.stream(s), torch.autocast("cuda", dtype, enabled=dtype != torch.float32):
            m(x).float().square().mean().backward()
    torch.cuda.synchronize()
    conv = model[0]
    xs = x.to(dtype)
    plan = portconv.plan(xs, conv.weight.to(dtype), conv.bias.to(dtype), 1, 1, 1, groups=96)
    assert plan.backend == "cuda" and plan.runner.native is not None, (plan.backend, native.status())
    ref = copy.deepcopy(base).double()
    for p_ in ref.parameters():
        p_.grad = None
    ref(x.double()).square().mean().backward()
    floor = 1e-6 if dtype == torch.float32 else 1e-3  # held to PyTorch's own error against float64, and this
    for a, t, r in zip(model.parameters(), base.parameters(), ref.parameters()):
        err, torch_err = (((g.grad.double() - r.grad).norm() / r.grad.norm()).item() for g in (a, t))
        assert err <= 2 * torch_err + floor, (err, torch_err)
    assert knobs.env().native in ("auto", "wait")
