"""Note [compile ahead] without a GPU: KernelSet.prefetch makes binaries on worker threads (a KernelSet whose
compiler is a Python function), _binary takes them from the disk cache, and ProgramRunner hands a plan's kernels to
its loader once, before its first load."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from portconv.backends.program import KernelPlan, Launch, Module, Program, ProgramRunner
from portconv.backends.simt import compile

ARCH = ("sm_90", ("-arch=sm_90",), "cubin")


class FakeSet(compile.KernelSet):
    """The CUDA set's machinery with a compiler that records where it ran and fails on a define of 'bad'."""

    def __init__(self):
        super().__init__()
        self.built: list[tuple[str, str]] = []  # (module description, thread name)
        self.release = threading.Event()

    def compiler_version(self) -> str:
        return "test"

    def arch_options(self, device: int):
        return ARCH

    def build(self, text, name, options, kind) -> bytes:
        if threading.current_thread() is not threading.main_thread():  # workers wait for the test's go
            assert self.release.wait(10)
        if any(o.endswith("=bad") for o in options):
            raise RuntimeError("nvrtc failed to compile (test)")
        self.built.append((" ".join(options), threading.current_thread().name))
        return ("binary " + " ".join(options)).encode()


def _module(v: str) -> Module:
    return Module.of("direct.cu", {"PC_DTYPE": v}, kernel="portconv_direct_fwd")


def test_prefetch_compiles_on_workers_and_load_takes_the_result(knob_env, tmp_path):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    knob_env("PORTCONV_COMPILE_THREADS", "2")
    ks = FakeSet()
    m0, m1 = _module("0"), _module("1")
    ks.prefetch([m0, m1, m0], 0)
    assert set(ks._ahead) == {(m0, 0), (m1, 0)}  # each module once
    ks.release.set()
    got = {k: f.result(10) for k, f in ks._ahead.items()}
    assert all(how == "nvrtc" for _, how in got.values())
    assert len(ks.built) == 2 and all(name.startswith("portconv-compile") for _, name in ks.built)
    assert got[(m0, 0)][0] != got[(m1, 0)][0]
    # a second process (a new set) reads the same binaries back from the disk cache, compiling nothing
    again = FakeSet()
    assert again._binary(m0, ARCH) == (got[(m0, 0)][0], "disk") and again.built == []


def test_prefetch_skips_loaded_modules_and_can_be_turned_off(knob_env, tmp_path):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    knob_env("PORTCONV_COMPILE_THREADS", "0")
    ks = FakeSet()
    ks.prefetch([_module("0")], 0)
    assert ks._ahead == {}
    knob_env("PORTCONV_COMPILE_THREADS", "1")
    ks._modules[(_module("0"), 0)] = object()  # loaded already
    ks.prefetch([_module("0")], 0)
    assert ks._ahead == {}


def test_a_failed_compile_ahead_raises_where_the_module_is_needed(knob_env, tmp_path):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    knob_env("PORTCONV_COMPILE_THREADS", "1")
    ks = FakeSet()
    bad = _module("bad")
    ks.prefetch([bad], 0)
    ks.release.set()
    with pytest.raises(RuntimeError, match="failed to compile"):
        ks._ahead[(bad, 0)].result(10)


def test_a_module_still_queued_is_made_by_the_thread_that_needs_it(knob_env, tmp_path):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path))
    knob_env("PORTCONV_COMPILE_THREADS", "1")
    ks = FakeSet()
    m0, m1 = _module("0"), _module("1")
    ks.prefetch([m0, m1], 0)  # one worker: m0 starts (and waits), m1 stays queued
    started = ks._ahead[(m0, 0)]
    for _ in range(1000):
        if started.running():
            break
        time.sleep(0.01)
    assert started.running()
    binary, how = ks._take(m1, 0, ARCH)
    assert how == "nvrtc" and ks.built == [(ks.built[0][0], "MainThread")] and (m1, 0) not in ks._ahead
    ks.release.set()
    assert ks._take(m0, 0, ARCH)[1] == "nvrtc" and ks.built[1][1].startswith("portconv-compile")


_SLOW_EXIT = """
import sys, time
sys.path[:0] = [{tests!r}]
from test_compile_ahead import FakeSet, _module
from portconv import knobs
ks = FakeSet()
ks.build = lambda *args: time.sleep(60) or b"never"
ks.prefetch([_module(str(i)) for i in range(4)], 0)
for _ in range(200):
    if sum(f.running() for f in ks._ahead.values()) == 2:
        break
    time.sleep(0.05)
print("started", sum(f.running() for f in ks._ahead.values()), flush=True)
"""


def test_a_process_ends_without_waiting_for_compiles_ahead(tmp_path):
    """Note [compile ahead]: the workers are daemon threads, so a script that ends while modules it never launched
    still compile exits at once (here: compiles of a minute each, two running, two queued)."""
    env = dict(os.environ, PORTCONV_CACHE_DIR=str(tmp_path), PORTCONV_COMPILE_THREADS="2")
    code = _SLOW_EXIT.format(tests=str(pathlib.Path(__file__).parent))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["started", "2"] and time.perf_counter() - t0 < 30


def test_hiprtc_on_amd_compiles_inline():
    """Note [compile ahead]: concurrent hiprtc compiles never ran here (no AMD GPU), so the AMD HIP set starts none;
    HIP-on-NVIDIA compiles with NVRTC and does."""
    from portconv.backends.simt.hip import kernel_set

    assert kernel_set("amd").ahead is False and kernel_set("nvidia").ahead is True
    amd = kernel_set("amd")
    amd.prefetch([_module("0")], 0)  # returns before asking the device anything
    assert amd._ahead == {}


def test_compile_threads_knob_is_validated(knob_env):
    with pytest.raises(ValueError, match="PORTCONV_COMPILE_THREADS"):
        knob_env("PORTCONV_COMPILE_THREADS", "-1")


class RecordingLoader:
    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    def key(self, t):
        return t

    def layout(self, t):
        return None

    def prefetch(self, program: Program, anchor) -> None:
        self.calls.append(("prefetch", tuple(x.kernel for x in program.launches)))

    def load(self, program: Program, anchor):
        self.calls.append(("load", tuple(x.kernel for x in program.launches)))
        return lambda operands: (program.outputs,)


def _plan(result: str, kernel: str) -> KernelPlan:
    launch = Launch(_module("0"), kernel, (1, 1, 1), (32, 1, 1), (), ())
    return KernelPlan(result, kernel, launches=(launch,))


def test_program_runner_prefetches_the_plans_kernels_once_before_its_first_load():
    ahead = (_plan("output", "fwd"), _plan("grad_input", "bwd_data"), _plan("grad_weight", "bwd_weight"))
    loader = RecordingLoader()
    runner = ProgramRunner(lambda call, mask, layouts: ahead[:1] if call == "forward" else ahead[1:], loader, ahead)
    runner.forward(1, 2, None)
    runner.backward(3, 1, 2, (True, True, False))
    runner.forward(1, 2, None)
    assert loader.calls == [("prefetch", ("fwd", "bwd_data", "bwd_weight")), ("load", ("fwd",)),
                            ("load", ("bwd_data", "bwd_weight"))]
