"""The conformance tolerance: scales with dtype and reduction length, rejects NaN/inf and bugs, accepts rounding."""
from __future__ import annotations

import math

import pytest
import torch

from portconv.conformance import tolerance as tol
from portconv.conformance.cases import Case
from portconv.conformance.reference import make_inputs, reference


def _dot_problem(length: int, dtype: torch.dtype, seed: int = 0):
    """Rows of ``length`` products: float64 reference, |.| bound, and the dtype's own computation of them."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(64, length, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    b = (torch.rand(64, length, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    ref = (a.double() * b.double()).sum(1)
    absref = (a.double() * b.double()).abs().sum(1)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    got = (a.to(acc) * b.to(acc)).sum(1).to(dtype)
    return got, ref, absref


def test_roundoffs_per_dtype_and_math():
    assert tol.roundoffs("float64") == (2.0**-53, 2.0**-53, 0.0)
    assert tol.roundoffs("float32") == (2.0**-24, 2.0**-24, 0.0)
    assert tol.roundoffs("float16") == (2.0**-11, 2.0**-24, 0.0)  # half types accumulate in float32
    assert tol.roundoffs("bfloat16") == (2.0**-8, 2.0**-24, 0.0)
    assert tol.roundoffs("float32", "tf32") == (2.0**-24, 2.0**-24, 2.0**-10)
    with pytest.raises(ValueError, match="unknown Choice.math"):
        tol.roundoffs("float32", "magic")
    with pytest.raises(ValueError, match="no tolerance"):
        tol.roundoffs("int8")


def test_bound_grows_with_length_dtype_and_tf32():
    ref, absref = torch.tensor([1.0]), torch.tensor([10.0])
    b = {L: float(tol.bound(ref, absref, L, "float32")) for L in (1, 100, 10000)}
    assert b[1] < b[100] < b[10000]
    assert b[10000] / b[100] == pytest.approx(10.0, rel=0.05)  # sqrt(L) scaling of the accumulation term
    order = [float(tol.bound(ref, absref, 100, dt)) for dt in ("float64", "float32", "float16", "bfloat16")]
    assert order == sorted(order)
    assert float(tol.bound(ref, absref, 100, "float32", "tf32")) > 10 * b[100]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 9, 300, 5000])
def test_honest_computation_passes(dtype, length):
    got, ref, absref = _dot_problem(length, dtype)
    r = tol.check("forward", got, ref, absref, length, str(dtype).replace("torch.", ""))
    assert r.status == "pass", r.message
    if dtype in (torch.float32, torch.float64):  # half types: the final rounding alone may use the whole eps_out term
        assert r.max_ratio < 0.5  # margin: honest accumulation sits well inside the bound


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_a_missing_term_fails(dtype):
    length = 27  # a 3x3x3 kernel: dropping one tap is the typical indexing bug
    g = torch.Generator().manual_seed(1)
    a = (torch.rand(64, length, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    b = (torch.rand(64, length, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    ref = (a.double() * b.double()).sum(1)
    absref = (a.double() * b.double()).abs().sum(1)
    got = (a.double()[:, 1:] * b.double()[:, 1:]).sum(1).to(dtype)
    r = tol.check("grad_input", got, ref, absref, length, str(dtype).replace("torch.", ""))
    assert r.status == "fail"
    assert r.bad > 32  # nearly every row is off


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf])
def test_nonfinite_never_passes(bad_value):
    got, ref, absref = _dot_problem(8, torch.float32)
    got = got.clone()
    got[5] = bad_value
    r = tol.check("grad_weight", got, ref, absref, 8, "float32")
    assert r.status == "fail" and r.bad == 1 and r.nonfinite == 1
    assert r.worst["index"] == [5]
    assert math.isinf(r.max_abs) and math.isinf(r.max_ratio)
    assert "not finite" in r.message


def test_nan_reference_position_with_zero_bound_rejects_garbage():
    # grad_input elements that no kernel tap reaches are exact zeros with a zero bound: only ~0 passes
    ref = torch.zeros(4, dtype=torch.float64)
    absref = torch.zeros(4, dtype=torch.float64)
    assert tol.check("grad_input", torch.zeros(4), ref, absref, 9, "float32").status == "pass"
    r = tol.check("grad_input", torch.tensor([0.0, 1e-30, 0.0, 0.0]), ref, absref, 9, "float32")
    assert r.status == "fail" and r.worst["index"] == [1]


def test_structural_mismatches_fail_with_a_reason():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    cases = {
        "shape": (torch.zeros(3, 2), "shape"),
        "dtype": (torch.zeros(2, 3, dtype=torch.float64), "dtype"),
        "none": (None, "returned None"),
        "type": ([0.0] * 6, "expected a torch.Tensor"),
    }
    for got, words in cases.values():
        r = tol.check("forward", got, ref, ref, 1, "float32")
        assert r.status == "fail" and words in r.message
    assert tol.not_requested("grad_bias", None).status == "n/a"
    r = tol.not_requested("grad_bias", torch.zeros(3))
    assert r.status == "fail" and "not requested" in r.message


def test_empty_tensor_passes_and_as_dict_is_json_safe():
    import json

    e = torch.zeros(0, 4, dtype=torch.float64)
    assert tol.check("forward", torch.zeros(0, 4), e, e, 3, "float32").status == "pass"
    got, ref, absref = _dot_problem(8, torch.float32)
    got[0] = math.nan
    json.dumps(tol.check("forward", got, ref, absref, 8, "float32").as_dict(), allow_nan=False)


def test_reference_absolute_bound_dominates_the_reference():
    case = Case(2, 2, 4, 6, (7, 8), (3, 2), (2, 1), (1, 0), (1, 2), groups=2, layout="strided")
    inputs = make_inputs(case, "float32")
    ref = reference(case, inputs)
    for name in ("forward", "grad_input", "grad_weight", "grad_bias"):
        v, a = ref.value[name], ref.absolute[name]
        assert v.dtype == torch.float64 and v.shape == a.shape
        assert bool((v.abs() <= a * (1 + 1e-12) + 1e-300).all()), name
        assert bool((a > 0).any()), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bias_added_after_rounding_is_accepted_only_with_the_partial(dtype):
    """fl(fl(conv) + b): PyTorch's CUDA path rounds the convolution, then adds the bias in the output dtype."""
    got, ref, absref = _dot_problem(9, dtype, seed=3)
    conv = ref.clone()
    bias = (-conv + torch.linspace(-0.01, 0.01, conv.numel(), dtype=torch.float64)).to(dtype)  # cancels conv
    want = conv + bias.double()
    twice = (conv.to(dtype) + bias).to(dtype)  # half + half in half: the second rounding
    name = str(dtype).replace("torch.", "")
    assert tol.check("forward", twice, want, absref + bias.double().abs(), 10, name, partial=conv).status == "pass"
    assert tol.check("forward", twice, want, absref + bias.double().abs(), 10, name).status == "fail"
    off = twice.clone()
    off[3] += 0.05  # a real error is still caught with the partial
    assert tol.check("forward", off, want, absref + bias.double().abs(), 10, name, partial=conv).status == "fail"


def test_math_mode_per_tensor():
    assert tol.mode_for("tf32", "grad_weight") == "tf32"
    assert tol.mode_for("tf32,grad_weight=fp16-accumulate", "grad_weight") == "fp16-accumulate"
    assert tol.mode_for("tf32,grad_weight=fp16-accumulate", "forward") == "tf32"
    assert tol.mode_for("grad_weight=fp16-accumulate", "grad_input") == "ieee"
    got, ref, absref = _dot_problem(300, torch.float16)
    half_acc = ref.to(torch.float16)  # exact up to the output rounding: passes either way
    assert tol.check("grad_weight", half_acc, ref, absref, 300, "float16", "grad_weight=fp16-accumulate").status \
        == "pass"
    off = half_acc.double() + 8 * 2.0**-11 * 2.0 * absref / 300**0.5  # beyond float32 accumulation, within half's
    assert tol.check("grad_weight", off.to(torch.float16), ref, absref, 300, "float16").status == "fail"
    assert tol.check("grad_weight", off.to(torch.float16), ref, absref, 300, "float16",
                     "ieee,grad_weight=fp16-accumulate").status == "pass"
