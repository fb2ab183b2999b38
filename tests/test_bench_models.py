"""portconv bench --models on the CPU: a tiny model end to end (aten, opencl), resume, budget, failures, first step."""
from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from portconv.bench import models  # noqa: E402


class Tiny(nn.Module):
    """A few Conv2d (one depthwise, one strided), a ConvTranspose2d (stride 2, output_padding), BatchNorm, ReLU,
    dropout (the bench turns it off) and a Linear head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(8, 10))

    def forward(self, x):
        return self.body(x)


TINY = models.ModelSpec("tiny", Tiny, (3, 12, 12), 10, 2)
NEEDS_NOTHING_THERE = dataclasses.replace(TINY, name="tiny-needs", needs="portconv_no_such_module")
REF = f"{__name__}:TINY"  # the child process of --first-step imports this module to find the spec


def _bench(*args, device="cpu", dtypes="float32") -> int:
    from portconv import cli

    return cli.main(["bench", "--models", REF, "--device", device, "--dtypes", dtypes, "--steps", "3", "--warmup",
                     "2", "--quiet", *args])


def _opencl() -> bool:
    """Is the opencl backend there (always in CI; a GPU machine's tox env may lack pyopencl)?"""
    from portconv import backends

    return bool(backends.get("opencl").probe())


def _cells(out) -> dict:
    rep = json.loads((out / "models.json").read_text())
    return rep, {models.key(c): c for c in rep["cells"]}


def test_models_end_to_end_then_resume(tmp_path, capsys):
    """Eager cells on aten and opencl (PoCL) beside PyTorch: timed in turns, the same steps, equal losses; then a
    resumed run adds compiled cells and keeps the eager ones as they were."""
    out = tmp_path / "m"
    sides = ["torch", "aten", "opencl"] if _opencl() else ["torch", "aten"]
    assert _bench("--backend", ",".join(sides[1:]), "--layouts", "nchw,channels_last", "--modes", "eager",
                  "--out", str(out)) == 0
    text = capsys.readouterr().out
    rep, cells = _cells(out)
    assert rep["complete"] and list(cells) == ["tiny/float32/nchw/eager", "tiny/float32/channels_last/eager"]
    for c in cells.values():
        assert c["status"] == "done" and c["dropout_modules_disabled"] == 1 and c["input_shape"] == [2, 3, 12, 12]
        assert list(c["sides"]) == sides
        taken = {s: r["steps_taken"] for s, r in c["sides"].items()}
        steps = rep["settings"]["loss_steps"]  # Note [loss phase], then 2 warm-up + 3 timed + lead-ins
        assert len(set(taken.values())) == 1 and taken["torch"] >= steps + 5, taken
        for side, r in c["sides"].items():
            assert r["status"] == "ok" and r["runs"] == 3 and r["median_ms"] > 0 and r["first_step_in_process_ms"] > 0
            assert r["timing"].startswith("wall clock") and r["loss_step"] == steps
            assert len(r["losses"]) == taken["torch"]
            if side != "torch":
                assert r["x_torch"] == pytest.approx(c["sides"]["torch"]["median_ms"] / r["median_ms"])
                assert r["loss_ok"] and r["loss_rel_diff"] <= 1e-4 and r["loss_limit"] == 1e-4, (side, r)
                assert sorted(r["interleaved_with"]) == sorted(set(sides) - {side})
            # Note [host phases]: every side's phases, inside its step (the CPU's wall clock)
            h = r["host_ms"]
            assert list(h) == list(models.HOST_PHASES) and all(v > 0 for v in h.values()), (side, h)
            # over the timed steps, those of the step median (models_run._TimedHost)
            assert sum(h.values()) <= 1.5 * r["median_ms"], (side, h, r["median_ms"])
        # float32: portconv on aten runs PyTorch's own kernels, so the whole loss curve matches
        assert c["sides"]["aten"]["loss_max_rel_diff"] <= 1e-4
        assert c["memory_format"] == ("channels_last" if c["layout"] == "channels_last" else "contiguous_format")
    assert rep["settings"]["precision"] == ["CPU: float32 is IEEE"] and rep["settings"]["sides"][0] == "torch"
    md = (out / "models.md").read_text()
    assert "| tiny | float32 | nchw | eager | aten |" in md and "## Method" in md and "tiny" in text
    assert "## Host time a step" in md and "| tiny | float32 | channels_last | eager | torch |" in md
    png = out / "models.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "matplotlib" in rep["outputs"]["chart_skipped"] and "Chart skipped" in md
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep["outputs"]["chart_skipped"] is None

    # --resume: the finished eager cells stay (their samples unchanged), the compiled cell runs (aot_eager: the
    # machinery, not inductor's C++ build), the channels-last eager cell not planned now is kept at the end
    before = {k: c["sides"]["aten"]["samples_ms"] for k, c in cells.items()}
    assert _bench("--backend", ",".join(sides[1:]), "--layouts", "nchw", "--modes", "eager,compile",
                  "--compile-backend", "aot_eager", "--resume", "--out", str(out)) == 0
    rep, cells = _cells(out)
    assert list(cells) == ["tiny/float32/nchw/eager", "tiny/float32/nchw/compile", "tiny/float32/channels_last/eager"]
    assert all(cells[k]["sides"]["aten"]["samples_ms"] == v for k, v in before.items())
    comp = cells["tiny/float32/nchw/compile"]
    assert comp["compile_backend"] == "aot_eager" and comp["status"] == "done", comp
    assert all(r["loss_ok"] for s, r in comp["sides"].items() if s != "torch")
    # the losses of compiled and eager steps agree too: the same function of the same data
    assert comp["sides"]["torch"]["loss"] == pytest.approx(cells["tiny/float32/nchw/eager"]["sides"]["torch"]["loss"],
                                                           rel=1e-4)
    assert f"| tiny | float32 | nchw | compile | {sides[-1]} |" in (out / "models.md").read_text()
    # a resume under other settings is refused
    assert _bench("--backend", "aten", "--resume", "--out", str(out)) == 2
    assert "other settings (sides)" in capsys.readouterr().err


def test_compiled_inductor_cell(tmp_path):
    """One compiled cell through inductor (C++ on the CPU), portconv's aten backend beside PyTorch."""
    out = tmp_path / "c"
    assert _bench("--backend", "aten", "--layouts", "channels_last", "--modes", "compile", "--out", str(out)) == 0
    _, cells = _cells(out)
    c = cells["tiny/float32/channels_last/compile"]
    assert c["compile_backend"] == "inductor" and c["sides"]["aten"]["loss_ok"], c


def test_float64_reference_losses(tmp_path):
    """Note [loss phase]: --loss-float64 takes the loss steps with PyTorch's model in float64 too; every side's loss
    is reported against it (a float32 side is near it, not equal; aten's equals PyTorch's distance exactly)."""
    out = tmp_path / "r"
    assert _bench("--backend", "aten", "--layouts", "nchw", "--modes", "eager", "--loss-float64", "--out",
                  str(out)) == 0
    rep, cells = _cells(out)
    c = cells["tiny/float32/nchw/eager"]
    steps = rep["settings"]["loss_steps"]
    assert len(c["float64_losses"]) == steps
    t, a = c["sides"]["torch"], c["sides"]["aten"]
    want = abs(t["losses"][steps - 1] - c["float64_losses"][steps - 1]) / abs(c["float64_losses"][steps - 1])
    assert t["loss_f64_rel_diff"] == pytest.approx(want) and 0 < want < 1e-3
    assert a["loss_f64_rel_diff"] == pytest.approx(t["loss_f64_rel_diff"])
    md = (out / "models.md").read_text()
    assert "vs float64 (PyTorch / side)" in md and f"{t['loss_f64_rel_diff']:.1e} / " in md


def test_host_phases_time_each_phase():
    """Note [host phases]: a step's forward, backward and optimizer each get their own wall time. Each phase sleeps
    its own time (30, 300 and 100 ms), so only lower bounds and their order are asserted: a loaded machine adds
    time to every phase, never takes any away."""
    import time

    from portconv.bench.models_run import host_medians

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 10)

        def forward(self, x):
            time.sleep(0.03)
            y = self.lin(x)
            y.register_hook(lambda g: time.sleep(0.3))
            return y

    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_pre_hook(lambda *a: time.sleep(0.1))
    spec = models.ModelSpec("slow", Slow, (4,), 10, 2)
    data = [(torch.randn(2, 4), torch.tensor([1, 2]))]
    phases, losses = [], []
    step = models.make_step(model, opt, data, spec, "float32", torch.device("cpu"), losses, phases)
    for _ in range(3):
        step(None)
    assert len(phases) == 3 and len(losses) == 3 and all(len(p) == 3 for p in phases)
    h = host_medians(phases)
    assert h["forward"] >= 30 and h["backward"] >= 300 and h["optimizer"] >= 100, h
    assert h["forward"] < h["optimizer"] < h["backward"], h
    assert host_medians([]) is None


def test_control_side_is_pytorch_again(tmp_path):
    """--backend torch-copy times PyTorch's model again beside the portconv sides: the spread a cell resolves. Its
    losses are PyTorch's exactly (the same model, the same steps)."""
    out = tmp_path / "k"
    assert _bench("--backend", "aten,torch-copy", "--layouts", "nchw", "--modes", "eager", "--out", str(out)) == 0
    _, cells = _cells(out)
    c = cells["tiny/float32/nchw/eager"]
    assert list(c["sides"]) == ["torch", "aten", "torch-copy"]
    ctl = c["sides"]["torch-copy"]
    assert ctl["losses"] == c["sides"]["torch"]["losses"] and ctl["x_torch"] > 0 and ctl["loss_rel_diff"] == 0
    assert "| tiny | float32 | nchw | eager | torch-copy |" in (out / "models.md").read_text()


def test_failing_side_is_reported_and_the_rest_goes_on(tmp_path, capsys):
    out = tmp_path / "f"
    assert _bench("--backend", "cuda,aten", "--layouts", "nchw", "--modes", "eager", "--out", str(out)) == 1
    rep, cells = _cells(out)
    c = cells["tiny/float32/nchw/eager"]
    assert c["status"] == "error" and c["sides"]["cuda"]["status"] == "error" and c["sides"]["cuda"]["error"]
    assert c["sides"]["torch"]["status"] == "ok" and c["sides"]["aten"]["loss_ok"]
    assert "cuda failed" in (out / "models.md").read_text() and "## Failures" in (out / "models.md").read_text()
    assert "failure" in capsys.readouterr().err


def test_budget_leaves_cells_for_resume(tmp_path, capsys):
    out = tmp_path / "b"
    assert _bench("--backend", "aten", "--budget-seconds", "0", "--out", str(out)) == 0
    rep, cells = _cells(out)
    assert not rep["complete"] and {c["status"] for c in cells.values()} == {"not run"} and len(cells) == 4
    assert "partial" in capsys.readouterr().out


def test_usage_errors(capsys):
    from portconv import cli

    assert _bench("--dtypes", "float16") == 2
    assert _bench("--modes", "jit") == 2
    assert _bench("--backend", "nosuch") == 2
    assert _bench("--steps", "0") == 2
    assert _bench("--resume") == 2  # needs --out
    assert _bench("--dtype", "bfloat16") == 2 and _bench("--rows", "mbv2-*") == 2  # the row bench's flags
    assert cli.main(["bench", "--models", "nosuchmodel", "--quiet"]) == 2
    assert cli.main(["bench", "--models", f"{__name__}:NEEDS_NOTHING_THERE", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "portconv_no_such_module is not installed: needed by tiny-needs" in err and "unknown model" in err
    assert "--dtype: a row-bench flag" in err


@pytest.mark.skipif(not hasattr(torch.backends.cudnn, "conv"), reason="this torch has no per-op fp32_precision")
def test_precision_sets_and_restores_the_cuda_flags():
    """Note [model bench precision]: IEEE float32 convolutions and matmuls inside, the flags as found after (the
    flags exist in a CPU build too, so the GPU path is checked here)."""
    b = torch.backends
    before = (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision)
    with models.precision(True, torch.device("cuda", 0)) as said:
        assert (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision) == ("ieee", "ieee")
        assert any("cudnn.conv.fp32_precision" in s for s in said)
    assert (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision) == before
    with models.precision(False, torch.device("cuda", 0)) as said:
        assert (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision) == before and "as found" in said[0]


def test_builtin_models_and_the_autoencoder():
    import portconv

    assert list(models.BUILTIN) == ["mobilenet_v2", "efficientnet_b0", "convnext_tiny", "resnet50", "r3d_18",
                                    "autoencoder"]
    assert models.BUILTIN["r3d_18"].spatial == 3 and models.BUILTIN["r3d_18"].batch == 8
    assert str(models.memory_format("channels_last", models.BUILTIN["r3d_18"])) == "torch.channels_last_3d"
    assert models.Options(batch=4, batch_3d=2).batch_of(models.BUILTIN["r3d_18"]) == 2
    ae = models.BUILTIN["autoencoder"]
    m = ae.build()
    tconv = [x for x in m.modules() if isinstance(x, nn.ConvTranspose2d)]
    assert len(tconv) == 4 and all(t.stride == (2, 2) and t.output_padding == (1, 1) for t in tconv)
    x = torch.rand(1, *ae.sample)
    assert m(x).shape == x.shape and ae.classes is None
    conv = portconv.convert(m, backend="aten")
    assert all(type(x).__module__ == "portconv.nn" for x in conv.modules() if isinstance(x, nn.modules.conv._ConvNd))


def test_first_step_cold_and_warm(tmp_path):
    """--first-step: each side's first step in two fresh processes sharing one cache directory, merged into the
    report it resumes."""
    out = tmp_path / "fs"
    assert _bench("--backend", "aten", "--first-step", "--out", str(out)) == 0
    rep, cells = _cells(out)
    c = cells["tiny/float32/nchw/eager"]
    assert list(cells) == ["tiny/float32/nchw/eager"] and c["status"] == "first step only"
    for side in ("torch", "aten"):
        got = c["first_step"]["sides"][side]
        for label in ("cold", "warm"):
            r = got[label]
            assert "error" not in r, r
            assert r["first_step_ms"] > 0 and r["second_step_ms"] > 0 and r["process_s"] > r["setup_s"]
            assert 0.05 < r["import_s"] < r["process_s"]  # torch's import is in it
            assert len(r["losses"]) == 2
        assert got["cold"]["losses"] == got["warm"]["losses"]
    assert c["first_step"]["sides"]["torch"]["cold"]["losses"] == c["first_step"]["sides"]["aten"]["cold"]["losses"]
    assert " / " in (out / "models.md").read_text().split("| tiny | float32 | nchw | eager | aten |")[1]


def test_models_on_cuda(tmp_path):
    """The GPU path (tox -e cuda): CUDA events, IEEE float32 on both sides, autocast bfloat16, channels_last, the
    default plan and the cuda backend beside PyTorch, eager and one compiled cell."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU, found none")
    from conftest import require_backend

    require_backend("cuda")
    out = tmp_path / "g"
    assert _bench("--backend", "auto,cuda", "--batch", "4", "--modes", "eager", "--out", str(out), device="cuda",
                  dtypes="float32,bfloat16") == 0
    assert _bench("--backend", "auto,cuda", "--batch", "4", "--modes", "compile", "--layouts", "channels_last",
                  "--resume", "--out", str(out), device="cuda") == 0
    rep, cells = _cells(out)
    assert len(cells) == 5 and all(c["status"] == "done" for c in cells.values()), cells
    assert any("fp32_precision = 'ieee'" in s or "allow_tf32 = False" in s for s in rep["settings"]["precision"])
    for c in cells.values():
        for side in ("auto", "cuda"):
            r = c["sides"][side]
            assert r["timing"].startswith("CUDA events") and r["loss_ok"], (c["model"], c["dtype"], side, r)
            assert r["loss_limit"] == models.LOSS_LIMITS[c["dtype"]]
