"""Note [long reductions] (portconv/conformance/longred.py): float32 weight and bias gradients over 67M random
positions within 1e-5 of float64, and exact over 2.4e9 ones (past 2^31), for every own kernel family of the backend
under test (opencl on PoCL in CI; cuda and hip in their tox envs on the GPU machine)."""
from __future__ import annotations

import pathlib
import re

import pytest
from conftest import require_backend

from portconv.backends.opencl import igemm
from portconv.conformance import longred
from portconv.conformance.runner import default_device

OWN_SETS = ("opencl", "cuda", "hip")


def _own(backend: str) -> None:
    if backend not in OWN_SETS:
        pytest.skip(f"{backend} is a vendor library reached through PyTorch, not one of portconv's kernel sets")
    require_backend(backend)


def _cpu_device(backend: str) -> bool:
    from portconv import knobs
    from portconv.backends.opencl import runtime

    return backend == "opencl" and runtime.info(*runtime.select(knobs.env().opencl_device)[1]).kind == "cpu"


@pytest.mark.parametrize("family", longred.FAMILIES)
def test_float32_gradients_over_67m_random_positions(backend, family):
    _own(backend)
    r = longred.random_case(family, backend, default_device(backend))
    assert r.ok, r.line()


@pytest.mark.parametrize("family", longred.FAMILIES)
def test_float32_gradients_over_2_4e9_ones_are_exact(backend, family):
    """On a CPU OpenCL device the implicit GEMM (10M positions a second there) sums 1.6e8 ones: still 9.5x the
    2^24 at which one float32 accumulator stops, and 1.2x the 64 splits x 2^24 of a split-only sum."""
    _own(backend)
    count = 160_000_000 if family == "implicit_gemm" and _cpu_device(backend) else longred.ONES
    r = longred.ones_case(family, backend, default_device(backend), count)
    assert r.ok, r.line()


def test_block_length_is_the_kernels():
    """The host rounds implicit-GEMM splits to the kernels' RED_BLOCK (Note [blocked sums]): one number."""
    text = (pathlib.Path(__file__).parents[1] / "opencl" / "common.h").read_text()
    assert int(re.search(r"#define RED_BLOCK (\d+)", text).group(1)) == igemm.RED_BLOCK
