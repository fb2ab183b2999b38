"""Note [fork]: the RuntimeGuard that the opencl and the cuda/hip backends share, with real forks and no device: its
bookkeeping, and the cuda/hip backends' answers in a forked child (OpenCL's own fork test, with PoCL, is in
test_opencl.py; CUDA's, on the GPU, in test_cuda.py). Each scenario runs in a fresh interpreter, so a hang is the
timeout and no fork copies pytest's threads."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
ROOT = pathlib.Path(__file__).resolve().parents[1]

# The scripts' helpers (test_cuda.py's fork test uses them too): in_child(fn) runs fn in a forked child, whose failure
# (an assertion, any exception) is its exit status 1; error_of(call) is the exception the call raised.
PRELUDE = r"""
import os, sys, traceback


def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"{fn.__name__} failed in the child"


def error_of(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - what the caller asserts on
        return e
    raise AssertionError("the call raised nothing")
"""

GUARD = PRELUDE + r"""
from portconv.errors import BackendUnavailable
from portconv.forks import RuntimeGuard

unused, used = RuntimeGuard("A", "a cannot"), RuntimeGuard("B", "b cannot")
by_others = RuntimeGuard("C", "c cannot", inherited=lambda: os.environ.get("C_USED") == "1")
used.use("b backend")
assert not used.forked and not by_others.forked  # the parent itself is not forked
os.environ["C_USED"] = "1"  # another library's use of C: read in the child


def child():
    assert used.forked and by_others.forked and not unused.forked
    e = error_of(lambda: used.check("b backend"))
    assert type(e) is BackendUnavailable and str(e).startswith(
        "portconv's b backend: this process was forked after its parent used B, and b cannot; start such workers "
        "with the 'spawn' or 'forkserver' method"), repr(e)
    unused.use("a backend")  # the runtime the parent never used is the child's to use

    def grandchild():  # forked is inherited; and the child's own use of A counts for its children
        assert used.forked and by_others.forked and unused.forked

    in_child(grandchild)
    assert RuntimeGuard("D", "d cannot", inherited=lambda: True).forked  # made in a child of a user of D


in_child(child)
assert not unused.used and not used.forked  # nothing came back from the child
print("GUARD-OK")
"""

# No CuPy here: import_cupy() marks the runtime used before the import fails, as on a GPU machine before it succeeds.
SIMT = PRELUDE + r"""
import torch
import portconv
from portconv.backends import get
from portconv.backends.simt import compile
from portconv.errors import BackendUnavailable, VendorImportError

x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)


def forced_cuda_error():
    e = error_of(lambda: portconv.conv2d(x, w, backend="cuda"))
    assert type(e) is BackendUnavailable, repr(e)
    return str(e)


def unused_parent():  # a parent that never reached the CUDA/HIP runtime: the children's answers are the usual ones
    assert not compile.FORK.forked
    assert "forked" not in get("cuda").probe().reason and "forked" not in forced_cuda_error()


in_child(unused_parent)
try:
    compile.import_cupy()
except VendorImportError:
    pass


def used_parent():
    for name in ("cuda", "hip"):
        avail = get(name).probe()
        assert not avail and "forked after its parent used the CUDA/HIP runtime" in avail.reason, avail
        assert "'spawn' or 'forkserver'" in avail.reason, avail
    assert "forked after its parent used the CUDA/HIP runtime" in forced_cuda_error()
    e = error_of(compile.import_cupy)
    assert type(e) is BackendUnavailable and "portconv's cuda/hip backends: this process was forked" in str(e), e
    torch.testing.assert_close(portconv.conv2d(x, w), torch.nn.functional.conv2d(x, w))  # automatic plans: CPU


in_child(used_parent)
print("SIMT-OK")
"""


def run_script(script: str, ok: str) -> None:
    """Run ``script`` in a fresh interpreter at the repository root; it must print ``ok`` within two minutes."""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and ok in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_guard_marks_children_of_users_and_their_children():
    """A child of a process that used the runtime (or whose ``inherited`` says another library did) is forked, and so
    are its own children; a runtime the parent never used is free in the child; the error names cause and fix."""
    run_script(GUARD, "GUARD-OK")


def test_cuda_and_hip_backends_refuse_in_a_child_of_a_runtime_user():
    """Once the parent reached the CUDA/HIP runtime (import_cupy), a forked child's cuda and hip probes say why, a
    forced call raises BackendUnavailable at once, and CPU tensors still convolve on the automatic plan."""
    run_script(SIMT, "SIMT-OK")
