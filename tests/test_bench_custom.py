"""`portconv bench --custom` on the CPU (Note [custom bench]): a user forward with portconv's backward timed against
portconv's own and PyTorch's, forward and forward + backward through autograd, numbers recomputed from the report."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from portconv import cli

ROWS = {"rows": [
    {"name": "tiny-dw", "n": 2, "c": 8, "k": 16, "spatial": [10, 12], "kernel": [3, 3], "stride": [2, 1],
     "padding": [1, 1], "dilation": [1, 1], "groups": 8, "transposed": False, "output_padding": [0, 0],
     "dtype": "float32", "layout": "nchw", "bias": True},
    {"name": "tiny-dense", "n": 2, "c": 8, "k": 4, "spatial": [9, 9], "kernel": [3, 3], "stride": [1, 1],
     "padding": [1, 1], "dilation": [1, 1], "groups": 1, "transposed": False, "output_padding": [0, 0],
     "dtype": "float32", "layout": "nchw"},
]}
# The user kernels: PyTorch's forward behind custom_forward, counting its calls; depthwise 2-D only.
OPS = '''
import portconv, torch.nn.functional as F
CALLS = []
def _kernel(x, w, b, s, p, d, g):
    CALLS.append(tuple(x.shape))
    return F.conv2d(x, w, b, s, p, d, g)
dw = portconv.custom_forward("bench_custom_test::dw", supports=lambda p: p.is_depthwise and p.params.rank == 2)(
    _kernel)
plain = _kernel
'''


@pytest.fixture
def bench_dir(tmp_path, monkeypatch, knob_env):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "bench_custom_ops.py").write_text(OPS)
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    monkeypatch.chdir(tmp_path)  # --custom finds its module from the current folder, as `python -c` would
    return tmp_path


def test_custom_bench_times_the_user_forward_with_portconvs_backward(bench_dir, capsys):
    out = bench_dir / "out"
    rc = cli.main(["bench", "--custom", "bench_custom_ops:dw", "--suite", "rows.json", "--backend", "aten", "--runs",
                   "4", "--min-runs", "3", "--quiet", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == cli.EXIT_OK, text
    rep = json.loads((out / "custom.json").read_text())
    assert rep["custom"] == {"ref": "bench_custom_ops:dw", "op": "bench_custom_test::dw"}
    dw, dense = rep["rows"]
    assert dense["skipped"].startswith("bench_custom_test::dw's supports() rejects it") and not dense["results"]
    assert list(dw["results"]) == ["torch", "auto", "aten", "custom"]
    assert dw["results"]["aten"]["backend"] == "aten" and dw["results"]["auto"]["backend"]
    assert dw["results"]["custom"]["explain"][0] == "forward      user kernel bench_custom_test::dw"
    for d in ("fwd", "fwd+bwd"):
        for label, res in dw["results"].items():
            c = res["directions"][d]
            assert c["status"] == "ok" and len(c["samples_ms"]) == c["runs"] >= 3, (label, d, c)
            assert c["median_ms"] == pytest.approx(float(np.median(c["samples_ms"])))
            assert c["check"]["ok"] and c["check"]["rel_err"] < 1e-5, (label, d, c["check"])
            t = dw["results"]["torch"]["directions"][d]["median_ms"]
            assert res["speedup_vs_torch"][d] == pytest.approx(t / c["median_ms"])
        auto, custom = (dw["results"][k]["directions"][d]["median_ms"] for k in ("auto", "custom"))
        assert dw["custom_over_auto"][d] == pytest.approx(custom / auto)
        assert rep["summary"][d]["rows"] == 1 and rep["summary"][d]["max"] == pytest.approx(custom / auto)
    calls = sys.modules["bench_custom_ops"].CALLS  # the module the bench loaded
    assert calls and set(calls) == {(2, 8, 10, 12)}  # the user kernel ran, on the depthwise row only
    assert "custom / auto" in text and "skipped: bench_custom_test::dw's supports() rejects it" in text
    md = (out / "custom.md").read_text()
    assert "| tiny-dw | custom |" in md and "**custom / auto**" in md and "tiny-dense: skipped" in md


def test_custom_bench_takes_only_a_custom_forward_op(bench_dir, capsys):
    for ref, words in (("bench_custom_ops:plain", "not an op of portconv.custom_forward"),
                       ("no_such_module:dw", "cannot load it"), ("bench_custom_ops", "give module:attr")):
        assert cli.main(["bench", "--custom", ref, "--suite", "rows.json", "--quiet"]) == cli.EXIT_USAGE
        assert words in capsys.readouterr().err
    assert cli.main(["bench", "--custom", "bench_custom_ops:dw", "--suite", "rows.json", "--backend", "nope",
                     "--quiet"]) == cli.EXIT_USAGE
