"""Note [fuzzer]: random problems and layouts against PyTorch in float64, a fixed-seed budget on PoCL."""
from __future__ import annotations

import random

import pytest
from conftest import require_backend

from portconv import cli
from portconv.backends.aten import AtenRunner
from portconv.conformance.fuzz import FUZZ_LAYOUTS, fuzz, random_case
from portconv.planner import clear_cache


def test_cases_cover_the_axes():
    rng = random.Random(5)
    cases = [random_case(rng) for _ in range(400)]
    assert all(c.valid() for c in cases)
    assert {c.layout for c in cases} == set(FUZZ_LAYOUTS) and {c.rank for c in cases} == {1, 2, 3}
    assert any(c.transposed for c in cases) and any(c.padding == "same" for c in cases)
    assert any(c.groups > 1 and c.c == c.groups and c.k > c.c for c in cases)  # depthwise with a multiplier
    assert len({c.id for c in cases}) > 350


def test_fixed_seed_budget_on_opencl():
    """The CI budget: 1500 random cases in the four dtypes on the opencl backend (PoCL), no failure."""
    require_backend("opencl")
    rep = fuzz("opencl", 1500, seed=20261127, dtypes=("float32", "float64", "float16", "bfloat16"))
    assert not rep.failures, str(rep)
    assert rep.count("pass") >= 1400, str(rep)


def test_the_fuzzer_finds_a_planted_defect(monkeypatch):
    """A weight gradient 1% off on one element fails, with the case to reproduce it."""
    real = AtenRunner.backward

    def wrong(self, grad_output, input, weight, mask):
        gi, gw, gb = real(self, grad_output, input, weight, mask)
        if gw is not None and gw.numel():
            gw = gw.clone()
            gw.view(-1)[0] *= 1.01
        return gi, gw, gb

    monkeypatch.setattr(AtenRunner, "backward", wrong)
    clear_cache()
    rep = fuzz("aten", 40, seed=1, dtypes=("float64",))
    clear_cache()
    assert rep.failures and "grad_weight" in rep.failures[0]["reason"], str(rep)
    assert str(rep).count("FAIL #") == len(rep.failures)


def test_cli_fuzz(capsys):
    require_backend("opencl")
    assert cli.main(["conform", "--fuzz", "30", "--seed", "4", "--backend", "opencl", "-q"]) == cli.EXIT_OK
    assert "fuzz opencl seed 4: 30 runs, 30 passed, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("layout", FUZZ_LAYOUTS)
def test_every_layout_runs_on_opencl(layout):
    require_backend("opencl")
    from portconv.conformance.runner import run_case

    rng = random.Random(11)
    case = next(c for c in (random_case(rng) for _ in range(500)) if c.layout == layout and c.rank == 2)
    r = run_case(case, "opencl", "float32")
    assert r.status == "pass", r.reason
