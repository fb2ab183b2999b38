"""The conformance suite under pytest: a test per (backend, dtype, case), gradcheck, and proof the harness can fail."""
from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
from conftest import require_backend

from portconv import backends
from portconv.backends import BackendId
from portconv.backends.aten import AtenBackend, AtenRunner
from portconv.conformance import cases as C
from portconv.conformance.reference import make_inputs
from portconv.conformance.runner import gradcheck_case, run, run_case
from portconv.errors import BackendUnavailable, Unsupported
from portconv.planner import clear_cache

DEFAULT_DTYPES = ("float32", "float64")


def pytest_generate_tests(metafunc):
    cfg = metafunc.config
    requested = cfg.getoption("--backend") or ["opencl"]
    if "conf_case" in metafunc.fixturenames:
        dtypes = cfg.getoption("--dtype", default=None) or DEFAULT_DTYPES
        chosen = C.all_cases() if cfg.getoption("--full-grid") else C.ci_subset()
        metafunc.parametrize("conf_backend,conf_dtype,conf_case",
                             [pytest.param(b, d, c, id=f"{b}-{d}-{c.id}") for b in requested for d in dtypes
                              for c in chosen])
    if "grad_case" in metafunc.fixturenames:
        metafunc.parametrize("grad_backend,grad_case", [pytest.param(b, c, id=f"{b}-{c.id}") for b in requested
                                                        for c in C.gradcheck_cases()])


def _explain(r, backend: str) -> str:
    repro = f"portconv conv {' '.join(r.case.cli_args())} --backend {backend} --dtype {r.dtype} --verify"
    return "\n".join([f"{r.id} ({r.dtype}): {r.case.describe()}", *r.errors(), f"repro: {repro}"])


def test_case(conf_backend, conf_dtype, conf_case):
    require_backend(conf_backend)
    r = run_case(conf_case, conf_backend, conf_dtype)
    if r.status == "unsupported":  # reported with the plan's reason, never counted as a pass
        pytest.skip(f"unsupported on {conf_backend}: {r.reason}")
    if r.status == "fail" and conf_backend in ("cudnn", "miopen"):
        # a vendor library's own accuracy: PyTorch's default call (the aten backend) fails the problem too, in the
        # case's layout or in channels-last (the layout in which ATen sends a depthwise problem to the library)
        for case in {conf_case.layout: conf_case, "chlast": dataclasses.replace(conf_case, layout="chlast")}.values():
            own = run_case(case, "aten", conf_dtype)
            if own.status == "fail":
                pytest.xfail(f"{conf_backend} fails as PyTorch's own call ({case.layout}) does: the library's "
                             f"accuracy, not portconv's routing: {r.errors()[0]}; aten: {own.errors()[0]}")
    assert r.status == "pass", _explain(r, conf_backend)


@pytest.mark.parametrize("dtype", DEFAULT_DTYPES)
def test_backend_runs_most_of_the_grid(requested_backends, dtype):
    """Unsupported cases are skips with the plan's reason; this keeps a backend that refuses much from going green.
    The vendor libraries are counted without the depthwise family: ATen sends most depthwise problems to its own
    CUDA kernels, not cuDNN or MIOpen (always in float64), and the cudnn and miopen backends run only what ATen would
    send to their library."""
    from portconv.conformance.runner import default_device, plan_for

    for b in requested_backends:
        require_backend(b)
        refused = {}
        cases = [c for c in C.ci_subset() if b not in ("cudnn", "miopen") or c.family != "depthwise"]
        for c in cases:
            try:
                plan_for(c, make_inputs(c, dtype, default_device(b), None), b)
            except (BackendUnavailable, Unsupported) as e:
                refused[c.id] = str(e).split("\n")[0]
        share = 1 - len(refused) / len(cases)
        assert share >= 0.6, f"{b} runs only {share:.0%} of the {dtype} subset: {list(refused.items())[:5]}"


def test_gradcheck(grad_backend, grad_case):
    require_backend(grad_backend)
    r = gradcheck_case(grad_case, grad_backend)
    if r.status == "unsupported":
        pytest.skip(f"unsupported on {grad_backend}: {r.reason}")
    assert r.status == "pass", f"{grad_case.describe()}\n{r.reason}"


# --- the grid itself ------------------------------------------------------------------------------------------
def test_grid_size_ids_and_determinism():
    grid, cur = C.grid(), C.curated()
    assert len(grid) >= 500
    ids = [c.id for c in grid + cur]
    assert len(ids) == len(set(ids))
    assert [c.key for c in C.grid()] == [c.key for c in grid]  # deterministic order and content
    assert all(c.valid() for c in grid + cur)
    sub = C.ci_subset()
    assert set(c.id for c in cur) <= set(c.id for c in sub) and len(sub) < len(grid)


def test_grid_covers_every_axis():
    g = C.grid()

    def some(pred):
        return sum(1 for c in g if pred(c))

    assert {c.rank for c in g} == {1, 2, 3}
    assert some(lambda c: any(s > 1 for s in c.stride)) > 50
    assert some(lambda c: c.padding == "same" and any(c.params.padding_extra)) >= 10  # even kernels
    assert some(lambda c: c.padding == "valid") >= 10
    assert some(lambda c: any(d > 1 for d in c.dilation)) > 50
    assert some(lambda c: c.groups > 1 and c.groups not in (c.c,)) > 20
    for mult in (1, 2):
        assert some(lambda c, m=mult: c.params.is_depthwise(c.input_shape, c.weight_shape) and c.k == m * c.c) >= 10
    assert some(lambda c: c.transposed and any(c.output_padding)) >= 20
    assert {c.bias for c in g} == {True, False}
    assert {c.mask for c in g} == set(C.MASKS)
    assert {c.layout for c in g} == set(C.LAYOUTS)
    assert {0, 1}.issubset({c.n for c in g}) and some(lambda c: c.n >= 3) > 20
    assert some(lambda c: c.c == 0) >= 1
    assert some(lambda c: any(s % 2 == 1 for s in c.spatial)) > 100
    names = " ".join(c.id for c in C.curated())
    for model in ("mobilenetv2-dw", "dcgan-g", "wav2vec2", "r3d18", "x3d-dw3x3x3"):
        assert model in names


def test_inputs_are_seeded_random_and_laid_out():
    case = next(c for c in C.grid() if c.layout == "strided" and c.rank == 2 and c.n > 0 and c.bias)
    a, b = make_inputs(case, "float32"), make_inputs(case, "float32")
    for name, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[name]), name  # same seed, same data
        assert bool((t != 0).all()), name  # never zeros
    assert not a.input.is_contiguous() and a.input.storage_offset() == 1
    assert a.bias.stride() == (2,)
    cl = make_inputs(next(c for c in C.grid() if c.layout == "chlast" and c.rank == 2 and c.n > 1), "float64")
    assert cl.input.is_contiguous(memory_format=torch.channels_last) and not cl.input.is_contiguous()
    cl1 = make_inputs(next(c for c in C.grid() if c.layout == "chlast" and c.rank == 1 and c.n > 1), "float32")
    assert cl1.input.stride()[1] == 1  # 1-D channels-last: (N, L, C) storage
    other = make_inputs(C.grid()[1], "float32")
    assert not torch.equal(other.weight.flatten()[:3], a.weight.flatten()[:3])
    bf = make_inputs(case, "bfloat16")
    assert torch.equal(bf.input.double(), a.input.double().to(torch.bfloat16).double())  # rounded, same values


# --- the harness can fail: a backend that is wrong in one small way must be reported ----------------------------
class _BrokenRunner(AtenRunner):
    """The aten backend's runner with its owner's defect (correct with mode=None). Its backward is not what ATen
    records for its forward, so eager autograd must call it (Note [ATen-recorded plans])."""

    aten_autograd = False

    def __init__(self, problem, math: str, owner):
        super().__init__(problem)
        self.math, self.owner = math, owner

    def forward(self, input, weight, bias):
        from portconv import knobs

        mode = self.owner.mode
        y = super().forward(input, weight, bias)
        if mode == "perturb":
            y = y.clone()
            # 16 ulp in bfloat16; under TF32 (aten on a GPU) the bound is ~1e-3 relative, so step over it
            rel = 1e-2 if self.math == "tf32" else max(1e-4, 16 * torch.finfo(y.dtype).eps)
            y.view(-1)[y.numel() // 2] *= 1 + rel
        elif mode == "unwritten":  # a kernel that misses the last element of its poisoned output buffer
            out = torch.full_like(y, float("nan")) if knobs.env().poison else torch.zeros_like(y)
            out.view(-1)[:-1] = y.reshape(-1)[:-1]
            y = out
        elif mode == "dtype":
            y = y.float() if y.dtype == torch.float64 else y.double()
        elif mode == "modify":
            with torch.no_grad():
                input.mul_(1.5)
        elif mode == "record":
            self.owner.seen_poison = knobs.env().poison
        elif mode == "raise":
            raise RuntimeError("kernel launch failed")
        return y

    def backward(self, grad_output, input, weight, output_mask):
        mode = self.owner.mode
        gi, gw, gb = super().backward(grad_output, input, weight, output_mask)
        gi, gw, gb = (t if m else None for t, m in zip((gi, gw, gb), output_mask))
        if mode == "nan" and gw is not None:
            gw = gw.clone()
            gw.view(-1)[0] = float("nan")
        elif mode == "extra":
            gw = torch.zeros_like(weight)
        elif mode == "drop-tap" and gi is not None:  # grad_input computed with the last kernel tap missing
            w = weight.clone()
            w[..., -1] = 0
            gi = super().backward(grad_output, input, w, (True, False, False))[0]
        return gi, gw, gb


class _Broken(AtenBackend):
    """The aten backend with one defect (correct with mode=None)."""

    def __init__(self, mode=None):
        self.mode = mode

    def choose(self, problem, device, options):
        if self.mode == "unsupported":
            raise Unsupported("this test backend refuses every problem")
        return super().choose(problem, device, options)

    def prepare(self, problem, device, choice, options):
        kernels, _ = super().prepare(problem, device, choice, options)
        return kernels, _BrokenRunner(problem, choice.math, self)


@pytest.fixture
def broken(monkeypatch):
    def install(mode):
        monkeypatch.setitem(backends._INSTANCES, BackendId.ATEN, _Broken(mode))
        clear_cache()

    yield install
    clear_cache()


_META = C.Case(2, 2, 4, 6, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), groups=2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_correct_wrapper_passes(broken, dtype):
    broken(None)
    for layout in C.LAYOUTS:
        r = run_case(dataclasses.replace(_META, layout=layout), "aten", dtype)
        assert r.status == "pass", r.errors()


@pytest.mark.parametrize("mode,tensor,words", [
    ("perturb", "forward", "outside tolerance"),
    ("unwritten", "forward", "not finite"),
    ("dtype", "forward", "dtype"),
    ("nan", "grad_weight", "not finite"),
    ("drop-tap", "grad_input", "outside tolerance"),
    ("raise", "forward", "kernel launch failed"),
])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_wrong_results_are_failures(broken, mode, tensor, words, dtype):
    broken(mode)
    r = run_case(_META, "aten", dtype)
    assert r.status == "fail"
    assert r.tensors[tensor].status == "fail" and words in r.tensors[tensor].message
    assert any(words in e for e in r.errors())


def test_backends_run_poisoned(broken, knob_env):
    from portconv import knobs

    knob_env("PORTCONV_POISON", None)
    broken("record")
    impl = backends._INSTANCES[BackendId.ATEN]
    assert run_case(_META, "aten", "float32").status == "pass"
    assert impl.seen_poison is True
    assert knobs.env().poison is False  # restored after the case


def test_masked_off_gradient_returned_is_a_failure(broken):
    broken("extra")
    r = run_case(dataclasses.replace(_META, mask=(True, False, True)), "aten", "float64")
    assert r.status == "fail" and "not requested" in r.tensors["grad_weight"].message


def test_modifying_the_callers_tensors_is_a_failure(broken):
    broken("modify")
    r = run_case(_META, "aten", "float32")
    assert r.status == "fail" and "modified the caller's" in r.reason


def test_unsupported_is_reported_never_passed(broken):
    broken("unsupported")
    r = run_case(_META, "aten", "float32")
    assert r.status == "unsupported" and "refuses every problem" in r.reason
    g = gradcheck_case(C.gradcheck_cases()[0], "aten")
    assert g.status == "unsupported"


def test_gradcheck_catches_a_wrong_gradient(broken):
    broken("nan")
    r = gradcheck_case(C.gradcheck_cases()[1], "aten")
    assert r.status == "fail" and "gradcheck raised" in r.reason


def test_run_report_counts_and_json(broken, tmp_path):
    broken("drop-tap")
    chosen = [c for c in C.ci_subset() if c.rank == 1][:12]
    path = tmp_path / "r.json"
    rep = run("aten", dtypes=("float32", "float64"), cases=chosen, progress=False, json_path=str(path),
              gradcheck=False)
    bad = [r for r in rep.cases if r.status == "fail"]
    assert bad and not rep.ok
    want = collections.Counter(r.dtype for r in rep.cases if r.case.mask[0] and r.case.n > 0 and r.case.c > 0)
    s = rep.summary()
    for dt in ("float32", "float64"):
        assert s["dtypes"][dt]["cases"] == len(chosen)
        assert s["dtypes"][dt]["tensors"]["grad_input"]["fail"] >= want[dt] - 1
    data = json.loads(path.read_text())
    assert data["backend"] == "aten" and data["ok"] is False and len(data["cases"]) == 2 * len(chosen)
    assert data["versions"]["torch"] == torch.__version__ and "PORTCONV_POISON" in data["knobs"]
    assert data["devices"] and all("vendor" in d for d in data["devices"])
    failing = [c for c in data["cases"] if c["status"] == "fail"]
    assert failing and all(c["errors"] for c in failing)
    table = rep.table()
    assert "FAIL:" in table and "repro: portconv conv" in table


def test_unavailable_backend_raises_with_reason(monkeypatch):
    from portconv.device import Availability

    monkeypatch.setattr(AtenBackend, "probe", lambda self: Availability.no("switched off for this test"))
    with pytest.raises(BackendUnavailable, match="switched off for this test"):
        run("aten", cases=C.curated()[:1], progress=False)
