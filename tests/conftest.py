"""Shared pytest options: which backends the conformance and vendor tests must run on (absent ones FAIL)."""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", default=[],
                     help="backend the conformance/vendor tests must run on (repeatable); an unavailable one fails")
    parser.addoption("--full-grid", action="store_true", help="run the whole conformance grid, not the CI subset")
    parser.addoption("--dtype", action="append", default=[],
                     help="dtype(s) of the conformance run (repeatable; default float32 and float64)")


def _parametrized(metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if name in ([n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)):
            return True
    return False


def pytest_generate_tests(metafunc):
    """A test that takes ``backend`` (and does not parametrize it itself) runs once per requested backend
    (--backend; default opencl)."""
    if "backend" in metafunc.fixturenames and not _parametrized(metafunc, "backend"):
        metafunc.parametrize("backend", metafunc.config.getoption("--backend") or ["opencl"])


@pytest.fixture(scope="session")
def requested_backends(request) -> list[str]:
    return request.config.getoption("--backend") or ["opencl"]


def require_backend(name: str):
    """Fail (never skip) when a requested backend is unavailable; return its Backend object otherwise."""
    from portconv import backends

    impl = backends.get(name)
    avail = impl.probe()
    if not avail:
        pytest.fail(f"backend '{name}' was requested but is unavailable: {avail.reason}", pytrace=False)
    return impl


def gpu_for(name: str, requested_backends, knob_env):
    """The GPU tests' setup for backend ``name``: skipped unless requested (pytest --backend NAME), failed when
    requested and unavailable; outputs poisoned and the plan cache cleared. Returns the current torch GPU device."""
    if name not in requested_backends:
        pytest.skip(f"the {name} backend was not requested (pytest --backend {name})")
    require_backend(name)
    import torch

    from portconv.planner import clear_cache

    knob_env("PORTCONV_POISON", "1")
    clear_cache()
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def knob_env(monkeypatch):
    """Set PORTCONV_* variables for one test: ``knob_env("PORTCONV_POISON", "1")`` sets (None: unsets) and reloads
    portconv's knobs (Note [knobs]); the environment and the knobs are restored afterwards."""
    from portconv import knobs

    def set_(name: str, value: str | None):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        knobs.reload()

    yield set_
    monkeypatch.undo()
    knobs.reload()


@pytest.fixture
def opencl_env(knob_env):
    """The OpenCL kernel-set tests' setting: outputs NaN-poisoned (an unwritten element stays NaN and fails), the
    opencl backend required, the FMA tiles unless a test asks for the tensor-core tile."""
    import portconv

    knob_env("PORTCONV_POISON", "1")
    require_backend("opencl")
    with portconv.options(opencl_tc="off"):
        yield


@pytest.fixture(scope="module")
def emu_kernels():
    """The CPU emulator's kernel builds (tests/emu.py) for one test module: test_cuda_compile, test_native."""
    import pathlib
    import shutil
    import tempfile

    from emu import EmuKernels

    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU emulation of the CUDA bodies needs a C++20 compiler")
    with tempfile.TemporaryDirectory() as tmp:
        yield EmuKernels(pathlib.Path(tmp))
