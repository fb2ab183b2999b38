"""Bring your own forward kernel (Note [custom forward]): portconv.custom_forward, check_forward, the CLI, and the
pybind11 example built and trained here."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import portconv
from portconv import cli
from portconv.conformance import cases as C

ROOT = pathlib.Path(__file__).resolve().parents[1]
CALLS: list[tuple] = []


def _good(input, weight, bias, stride, padding, dilation, groups):
    """A stand-in user kernel (PyTorch's own forward), recording what it was given."""
    CALLS.append((tuple(input.shape), tuple(stride), tuple(padding), tuple(dilation), groups))
    return F.conv2d(input, weight, bias, stride, padding, dilation, groups)


def _depthwise_2d(problem) -> bool:
    return problem.is_depthwise and problem.params.rank == 2


good = portconv.custom_forward("portconv_test::good", supports=_depthwise_2d, rank=2)(_good)
unchecked_wrong = portconv.custom_forward("portconv_test::wrong", check=False)(
    lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, p, d, g) * 1.001)
checked_wrong = portconv.custom_forward("portconv_test::checked_wrong")(
    lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, p, d, g) * 1.001)
good_t = portconv.custom_forward("portconv_test::good_t", transposed=True)(
    lambda x, w, b, s, p, op, g, d: F.conv_transpose2d(x, w, b, s, p, op, g, d))


def _operands(dtype=torch.float64, c=8, m=1, k=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, c, 9, 10, dtype=dtype, generator=g).requires_grad_()
    w = torch.randn(c * m, 1, k, k, dtype=dtype, generator=g).requires_grad_()
    b = torch.randn(c * m, dtype=dtype, generator=g).requires_grad_()
    return x, w, b


def test_gradients_are_portconvs_and_match_torch():
    x, w, b = _operands()
    CALLS.clear()
    y = good(x, w, b, 2, 1, 1, 8)
    assert CALLS == [((2, 8, 9, 10), (2, 2), (1, 1), (1, 1), 8)]  # arguments expanded per axis, batched
    want = F.conv2d(x, w, b, 2, 1, 1, 8)
    assert torch.equal(y, want) and y.is_contiguous()
    g = torch.randn_like(want)
    got, ref = torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(want, (x, w, b), g)
    assert all(torch.allclose(a, e, rtol=1e-10, atol=1e-10) for a, e in zip(got, ref))
    small = tuple(t.detach()[:c].requires_grad_() for t, c in zip((x[:1, :2, :5, :6], w, b), (1, 2, 2)))
    torch.autograd.gradcheck(lambda *t: good(*t, 2, 1, 1, 2), small)
    torch.autograd.gradgradcheck(lambda *t: good(*t, 2, 1, 1, 2), small)  # portconv's backward is differentiable


def test_unbatched_same_padding_and_the_fallback():
    x, w, b = _operands()
    CALLS.clear()
    y = good(x[0], w[:, :, :2, :2], b, 1, "same", 1, 8)  # even kernel: F.conv2d's extra high-side padding
    assert torch.allclose(y, F.conv2d(x[0], w[:, :, :2, :2], b, 1, "same", 1, 8)) and len(CALLS) == 1
    dense = torch.randn(4, 8, 3, 3, dtype=torch.float64)
    z = good(x, dense, None, 1, 1)  # not depthwise: supports() says no, portconv's own forward runs
    assert len(CALLS) == 1 and torch.allclose(z, F.conv2d(x, dense, None, 1, 1))
    assert "portconv's own: portconv_test::good's supports() rejects" in good.explain(x, dense, None, 1, 1)
    text = good.explain(x, w, b, 1, 1, 1, 8)
    assert text.startswith("forward      user kernel portconv_test::good") and "grad_weight" in text
    assert all(len(line) <= 120 for line in text.splitlines())


def test_bad_input_gets_pytorchs_error_before_the_kernel_runs():
    x, w, b = _operands()
    CALLS.clear()
    for args, kw in (((x, w[:, :, :, :, None], b), {}), ((x, w, b[:3]), {"groups": 8}),
                     ((x.float(), w, b), {"groups": 8}), ((x, w, b), {"stride": 0, "groups": 8})):
        with pytest.raises(RuntimeError) as ours:
            good(args[0], args[1], args[2], kw.get("stride", 1), 0, 1, kw.get("groups", 1))
        with pytest.raises(RuntimeError) as theirs:
            F.conv2d(args[0], args[1], args[2], kw.get("stride", 1), 0, 1, kw.get("groups", 1))
        assert str(ours.value).split("\n")[0] == str(theirs.value).split("\n")[0]
    assert CALLS == []


def test_check_catches_a_wrong_kernel_at_first_use_with_the_numbers():
    x, w, b = (t.detach().float() for t in _operands())
    with pytest.raises(ValueError, match=r"portconv_test::checked_wrong: the user kernel's output is wrong on .*"
                                         r"outside tolerance"):
        checked_wrong(x, w, b, 1, 1, 1, 8)
    assert not torch.equal(unchecked_wrong(x, w, b, 1, 1, 1, 8), F.conv2d(x, w, b, 1, 1, 1, 8))  # check=False


def test_check_forward_reports_every_accepted_case():
    cases = [c for c in C.all_cases() if c.rank == 2 and not c.transposed]
    rep = portconv.check_forward(good, cases=cases)
    assert rep.ok and not rep.failures and any(r["status"] == "skipped" for r in rep.rows)
    assert sum(r["status"] == "pass" for r in rep.rows) >= 2
    bad = portconv.check_forward(unchecked_wrong, cases=cases)
    assert not bad.ok and bad.failures and "outside tolerance" in bad.failures[0]["reason"]
    assert "failed" in str(bad) and "FAIL" in str(bad)
    rt = portconv.check_forward(good_t, cases=[c for c in C.all_cases() if c.transposed and c.rank == 2][:10])
    assert rt.ok, str(rt)


def test_compile_fullgraph_and_autocast():
    x, w, b = (t.detach().float() for t in _operands())
    f = torch.compile(lambda a, c, d: good(a, c, d, 1, 1, 1, 8).relu().sum(), fullgraph=True, backend="aot_eager")
    want = F.conv2d(x, w, b, 1, 1, 1, 8).relu().sum()
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    got = f(xr, wr, br)
    got.backward()
    assert torch.allclose(got, want, rtol=1e-5) and wr.grad is not None and torch.isfinite(wr.grad).all()
    with pytest.raises(Exception, match=r"expected input\[2, 8, 9, 10\] to have 16 channels"):  # under the tracer
        torch.compile(lambda a, c: good(a, c, None, 1, 1, 1, 4), fullgraph=True, backend="aot_eager")(
            x, torch.randn(8, 4, 3, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, ref = good(x, w, b, 1, 1, 1, 8), F.conv2d(x, w, b, 1, 1, 1, 8)
    assert y.dtype == ref.dtype == torch.bfloat16


def test_cli_checks_a_custom_kernel(capsys, tmp_path, monkeypatch):
    mod = tmp_path / "my_kernels.py"
    mod.write_text("import portconv, torch.nn.functional as F\n"
                   "bad = lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, p, d, g) * 1.01\n"
                   "ok = lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, p, d, g)\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["conform", "--custom", "my_kernels:ok", "--filter", "conv2d-n1c4k8"]) == cli.EXIT_OK
    assert "0 failed" in capsys.readouterr().out
    assert cli.main(["conform", "--custom", "my_kernels:bad", "--filter", "conv2d-n1c4k8"]) == cli.EXIT_FAIL
    assert cli.main(["conform", "--custom", "no_such_module:f"]) == cli.EXIT_USAGE


def test_the_pybind11_example_builds_and_trains(tmp_path):
    """examples/custom_forward_cpp: the C++ extension built with pybind11 and setuptools, registered with
    custom_forward, checked over the conformance cases and trained beside PyTorch (equal losses)."""
    pytest.importorskip("pybind11", reason="the example builds with pybind11 (the test extra installs it)")
    src = tmp_path / "examples" / "custom_forward_cpp"  # beside ../dwtrain.py, the examples' training check
    shutil.copytree(ROOT / "examples" / "custom_forward_cpp", src, ignore=shutil.ignore_patterns("build", "*.so"))
    shutil.copy(ROOT / "examples" / "dwtrain.py", src.parent)
    b = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src, capture_output=True,
                       text=True, timeout=600)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    r = subprocess.run([sys.executable, "example.py"], cwd=src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "EXAMPLE-RESULT" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert " 0 failed" in r.stdout and "forward      user kernel example::dw_forward" in r.stdout
