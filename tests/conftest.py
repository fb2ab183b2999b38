"""Shared pytest options: which backends the conformance and vendor tests must run on (absent ones FAIL)."""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", default=[],
                     help="backend the conformance/vendor tests must run on (repeatable); an unavailable one fails")
    parser.addoption("--full-grid", action="store_true", help="run the whole conformance grid, not the CI subset")
    parser.addoption("--dtype", action="append", default=[],
                     help="dtype(s) of the conformance run (repeatable; default float32 and float64)")


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
