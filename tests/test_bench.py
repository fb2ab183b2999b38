"""portconv bench on the CPU: roofline arithmetic, statistics, rotation, the harness end to end on PoCL and aten."""
from __future__ import annotations

import gzip
import json
import math
import pathlib
import sys
import time
import types

import numpy as np
import pytest

from portconv.bench import report, roofline, suite, timing
from portconv.conformance.cases import Case

pytest.importorskip("torch")

TINY = {"rows": [
    {"name": "tiny-dw", "n": 2, "c": 8, "k": 8, "spatial": [12, 12], "kernel": [3, 3], "stride": [1, 1],
     "padding": [1, 1], "dilation": [1, 1], "groups": 8, "transposed": False, "output_padding": [0, 0],
     "dtype": "float32", "layout": "nchw"},
    {"name": "tiny-tconv-cl", "n": 2, "c": 8, "k": 4, "spatial": [5, 5], "kernel": [4, 4], "stride": [2, 2],
     "padding": [1, 1], "dilation": [1, 1], "groups": 1, "transposed": True, "output_padding": [0, 0],
     "dtype": "float32", "layout": "channels_last"},
]}


def _case(**kw) -> Case:
    rank = len(kw["spatial"])
    base = dict(rank=rank, stride=(1,) * rank, padding=(0,) * rank, dilation=(1,) * rank, bias=False)
    base.update(kw)
    return Case(**base)


# --- roofline arithmetic, against hand-computed numbers ------------------------------------------------------
def test_flops_and_bytes_grouped_conv2d():
    c = _case(n=2, c=4, k=6, spatial=(10, 10), kernel=(3, 3), padding=(1, 1), groups=2, bias=True)
    assert c.output_shape == (2, 6, 10, 10)
    assert roofline.flops(c) == 2 * 2 * 6 * 2 * 9 * 100 == 43200
    # input 2*4*100, weight 6*2*9, output 2*6*100, bias 6 elements; float32
    assert roofline.min_bytes(c, "float32", "fwd") == (800 + 108 + 1200 + 6) * 4 == 8456
    assert roofline.min_bytes(c, "float32", "bwd-data") == (1200 + 108 + 800) * 4 == 8432
    assert roofline.min_bytes(c, "float32", "bwd-weight") == (800 + 1200 + 108) * 4 == 8432
    assert roofline.min_bytes(c, "bfloat16", "bwd-weight") == 8432 // 2
    assert roofline.input_bytes(c, "float32", "bwd-weight") == (800 + 1200) * 4


def test_flops_suite_rows_by_hand():
    rows = {r.name: r for r in suite.load_suite(suite.PACKAGED)[0]}
    dw = rows["mbv2-dw3x3"].case  # 32 x 144 x 56 x 56, 3x3 depthwise, stride 1, pad 1
    assert roofline.flops(dw) == 2 * 32 * 144 * 1 * 9 * 56 * 56 == 260_112_384
    assert roofline.min_bytes(dw, "float32", "fwd") == (2 * 32 * 144 * 3136 + 144 * 9) * 4 == 115_610_688
    t = rows["dcgan-gen-transposed"].case  # 64 x 512 x 4x4 -> 64 x 256 x 8x8, 4x4 kernel, stride 2
    assert t.output_shape == (64, 256, 8, 8)
    assert roofline.flops(t) == 2 * 64 * 256 * 512 * 16 * 16 == 4_294_967_296  # positions of its 4x4 input
    assert roofline.min_bytes(t, "float32", "fwd") == (64 * 512 * 16 + 512 * 256 * 16 + 64 * 256 * 64) * 4
    w = rows["wav2vec2-conv1d"].case  # 3199 -> (3199 - 3) // 2 + 1 = 1599
    assert roofline.flops(w) == 2 * 8 * 512 * 512 * 3 * 1599


def test_floor_and_efficiency():
    f = roofline.floor(2_000_000_000, 1_000_000, peak_flops=1e12, peak_bw=1e9)  # 2 ms compute vs 1 ms memory
    assert f["bound"] == "compute" and f["floor_ms"] == pytest.approx(2.0) and f["memory_ms"] == pytest.approx(1.0)
    f = roofline.floor(1_000_000, 3_000_000, peak_flops=1e12, peak_bw=1e9)  # 0.001 ms vs 3 ms
    assert f["bound"] == "memory" and f["floor_ms"] == pytest.approx(3.0)
    assert roofline.efficiency(3.0, 12.0) == pytest.approx(0.25)
    assert roofline.floor(10, 10, None, None)["floor_ms"] is None
    assert roofline.peak_key("float32", "tf32") == "tf32" and roofline.peak_key("bfloat16", "tf32") == "bfloat16"


# --- statistics and rotation ----------------------------------------------------------------------------------
def test_percentile_by_hand():
    assert timing.percentile([4, 1, 3, 2], 50) == 2.5
    assert timing.percentile([1, 2, 3, 4], 10) == pytest.approx(1.3)
    assert timing.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    with pytest.raises(ValueError):
        timing.Stats.of([1.0, float("nan")])


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_measure_statistics_come_from_the_samples():
    sets = [0.2, 1.5, 0.6]  # each call busy-waits this many ms; rotation visits every set
    seen = []

    def call(ms):
        seen.append(ms)
        _spin(ms)
        return ms

    m = timing.measure(timing.WallClock(), call, sets, runs=12, warmup=3)
    assert m.first_output == 0.2 and m.warmup == 3 and len(m.samples_ms) == 12 == m.stats.runs
    assert seen[:3] == [0.2, 1.5, 0.6] and sorted(set(seen)) == sorted(sets)
    assert m.stats.median == pytest.approx(float(np.median(m.samples_ms)))
    assert m.stats.p10 == pytest.approx(float(np.percentile(m.samples_ms, 10)))
    assert m.stats.p90 == pytest.approx(float(np.percentile(m.samples_ms, 90)))
    assert m.stats.min >= 0.2 and m.stats.p90 >= 1.5 * 0.9  # the samples really are the calls' durations
    assert m.stats.p10 < m.stats.median < m.stats.p90


def test_measure_budget_cuts_runs_but_not_below_min_runs():
    m = timing.measure(timing.WallClock(), lambda ms: _spin(ms), [5.0], runs=50, warmup=10, min_runs=4,
                       budget_s=0.02)
    assert m.stats.runs == 4 and m.requested_runs == 50 and m.warmup == 2


def test_interleaved_entries_take_turns():
    """Note [interleaved entries]: every member warms up (its first call on set 0, the one the check compares), then
    takes its runs in turns of turn_runs timed calls after one untimed lead-in call, the order rotating each round,
    inside its own context; the sets rotate over the whole sequence; a member that raises is reported with its
    exception and the others go on."""
    import contextlib

    seen = []

    def member(name, fail_on=None):
        def call(s):
            seen.append((name, s))
            if fail_on is not None and len([1 for n, _ in seen if n == name]) == fail_on:
                raise RuntimeError(f"{name} broke")
            return (name, s)

        @contextlib.contextmanager
        def ctx():
            seen.append(("enter", name))
            try:
                yield
            finally:
                seen.append(("exit", name))
        return call, ctx

    sets = list(range(5))
    ms = timing.measure_interleaved(timing.WallClock(), [member("a"), member("b"), member("c", fail_on=6)], sets,
                                    turn_runs=2, runs=6, warmup=2)
    assert [m.first_output for m in ms[:2]] == [("a", 0), ("b", 0)]
    assert isinstance(ms[2], RuntimeError) and "c broke" in str(ms[2])
    assert [len(m.samples_ms) for m in ms[:2]] == [6, 6] and all(m.warmup == 2 for m in ms[:2])
    turns, cur = [], None  # (member, calls) per entered context, in order
    for ev in seen:
        if ev[0] == "enter":
            cur = [ev[1], []]
        elif ev[0] == "exit":
            turns.append((cur[0], cur[1]))
        else:
            assert cur is not None and ev[0] == cur[0], "every call runs inside its own member's context"
            cur[1].append(ev[1])
    # warm-ups a b c; round 0 a b c; round 1 from the second: b, c (its lead-in is its 6th call: it fails), a;
    # round 2 without c: a b. A timed turn is 1 lead-in + 2 timed calls.
    assert [t[0] for t in turns] == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "a", "b"]
    assert [t[1][0] for t in turns[:3]] == [0, 0, 0]  # every first call on set 0
    assert [len(t[1]) for t in turns[3:]] == [3, 3, 3, 3, 1, 3, 3, 3]
    for part in (turns[3:7], turns[8:]):  # one rotation over the turns (c's broken turn had taken 3 sets)
        used = [x for t in part for x in t[1]]
        assert used == [(used[0] + i) % 5 for i in range(len(used))]
    one = timing.measure(timing.WallClock(), lambda s: seen.append(("one", s)), sets, runs=4, warmup=2)
    assert len(one.samples_ms) == 4 and [s for n, s in seen if n == "one"] == [0, 1, 2, 3, 4, 0]  # no lead-in


def test_held_stream_retries_a_spin_that_ended_early():
    """Note [held stream]: each batch is enqueued behind a spin; a spin that ended before the last call was enqueued
    (its event already complete) makes the batch run again with a 4x longer spin, kept for later batches; after 4
    tries the batch counts as a failure. A fake torch.cuda stands in for the GPU (CI has none)."""
    import contextlib

    log, early = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.timed = enable_timing

        def record(self, stream):
            log.append("event")

        def query(self):
            return early.pop(0)

        def elapsed_time(self, other):
            return 0.5

    cuda = types.SimpleNamespace(Event=Event, current_stream=lambda d: "stream", synchronize=lambda d: None,
                                 device=lambda d: contextlib.nullcontext(),
                                 _sleep=lambda cycles: log.append(("spin", cycles)))
    clock = timing.CudaClock("cuda:0", hold=True)
    clock.torch = types.SimpleNamespace(cuda=cuda)
    assert "spin kernel" in clock.method
    early[:] = [True, False]  # the first spin ended too soon, the second did not
    out = clock.samples(lambda a: log.append(("call", a)), [1, 2])
    assert out == [0.5, 0.5] and clock.hold_failures == 0 and clock.spin_us_per_call == 400.0
    spins = [e[1] for e in log if e[0] == "spin"]
    assert spins == [(200 + 100 * 2) * 2000, (200 + 400 * 2) * 2000]
    assert [e for e in log if e[0] == "call"] == [("call", 1), ("call", 2)] * 2  # the batch ran again
    log.clear()
    early[:] = [True] * 4
    assert clock.samples(lambda a: None, [1]) == [0.5] and clock.hold_failures == 1
    assert len([e for e in log if e[0] == "spin"]) == 4


def test_rotation_count():
    r = timing.rotation(set_bytes=3 << 20, min_input_bytes=1 << 20, cache=(32 << 20, "test"), budget_bytes=1 << 30)
    assert r.sets == 64 and r.exceeds_cache  # 2 * 32 MiB / 1 MiB
    r = timing.rotation(3 << 20, 1 << 20, (32 << 20, "test"), budget_bytes=30 << 20)
    assert r.sets == 10 and not r.exceeds_cache  # the memory budget wins, and the report says so
    r = timing.rotation(1 << 30, 1 << 29, (50 << 20, "test"), budget_bytes=8 << 30)
    assert r.sets == 2  # never fewer than two sets when memory allows


def test_opencl_rotation_fits_one_allocation():
    """The OpenCL sets are one buffer: the budget never passes the device's CL_DEVICE_MAX_MEM_ALLOC_SIZE (PoCL with a
    260 MiB reported cache asked for more than its 2 GiB limit and failed with INVALID_BUFFER_SIZE)."""
    dev = types.SimpleNamespace(max_mem_alloc_size=2 << 30)
    assert timing.opencl_budget(4 << 30, dev) == 2 << 30
    assert timing.opencl_budget(1 << 30, dev) == 1 << 30
    assert timing.opencl_budget(1 << 30, types.SimpleNamespace(max_mem_alloc_size=0)) == 1 << 30
    r = timing.rotation(10 << 20, 2 << 20, (260 << 20, "test"), timing.opencl_budget(4 << 30, dev))
    assert r.sets == 204 and r.sets * r.set_bytes <= 2 << 30  # 260 sets wanted, 2 GiB / 10 MiB allowed


# --- workloads -------------------------------------------------------------------------------------------------
def test_suite_selection_and_scaling():
    rows, _ = suite.load_suite(suite.PACKAGED)
    picked = suite.select(rows, "mbv2-dw3x3-b1,wav2vec2-*")
    assert [r.name for r in picked] == ["mbv2-dw3x3-b1", "wav2vec2-conv1d", "wav2vec2-posconv-g16"]
    scaled = suite.adjust(picked, scale_batch=2, dtype="float16")
    assert [r.case.n for r in scaled] == [1, 2, 2] and [r.batch_original for r in scaled] == [1, 8, 8]
    assert {r.dtype for r in scaled} == {"float16"}
    with pytest.raises(ValueError, match="matches no row"):
        suite.select(rows, "no-such-row")
    assert suite.parse_directions("bwd,fwd") == ("fwd", "bwd-data") and suite.parse_directions("all") == \
        suite.DIRECTIONS
    assert suite.load_suite()[1] == str(suite.PACKAGED)


# --- the harness end to end -------------------------------------------------------------------------------------
@pytest.fixture()
def tiny_suite(tmp_path, knob_env):
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "cache"))
    knob_env("PORTCONV_OPENCL_DEVICE", "cpu")
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def _check_cell_numbers(rep: dict, row: dict, label: str) -> None:
    """Every number of one entry recomputed from the JSON's own samples, peaks and shapes."""
    res, torch_res = row["results"][label], row["results"]["torch"]
    assert res["status"] == "ok", res
    bw = rep["peaks"]["bandwidth"]["bytes_per_s"]
    peak = rep["peaks"]["compute"]["float32"]["flops_per_s"]
    for d in suite.DIRECTIONS:
        c = res["directions"][d]
        s = c["samples_ms"]
        assert len(s) == c["runs"] >= 3 and all(math.isfinite(v) and v > 0 for v in s)
        assert c["median_ms"] == pytest.approx(float(np.median(s)))
        assert c["p10_ms"] == pytest.approx(float(np.percentile(s, 10)))
        assert c["p90_ms"] == pytest.approx(float(np.percentile(s, 90)))
        assert c["check"]["ok"] and c["check"]["rel_err"] < 1e-4, c["check"]
        floor = max(row["flops"] / peak, row["directions"][d]["bytes"] / bw) * 1e3
        assert c["floor_ms"] == pytest.approx(floor)
        assert c["efficiency"] == pytest.approx(floor / c["median_ms"])
        assert res["speedup_vs_torch"][d] == pytest.approx(torch_res["directions"][d]["median_ms"] / c["median_ms"])
    assert res["sum_ms"] == pytest.approx(sum(res["directions"][d]["median_ms"] for d in suite.DIRECTIONS))
    assert res["speedup_vs_torch"]["sum"] == pytest.approx(torch_res["sum_ms"] / res["sum_ms"])


def test_bench_runs_opencl_and_aten(tiny_suite, tmp_path, capsys):
    from conftest import require_backend

    from portconv import cli

    require_backend("opencl")
    out = tmp_path / "out"
    rc = cli.main(["bench", "--suite", str(tiny_suite), "--backend", "opencl,aten", "--runs", "5", "--quiet",
                   "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rep = json.loads((out / "bench.json").read_text())
    assert [r["name"] for r in rep["rows"]] == ["tiny-dw", "tiny-tconv-cl"]
    for row in rep["rows"]:
        assert list(row["results"]) == ["torch", "opencl", "aten"]
        assert row["results"]["opencl"]["timing"].startswith("OpenCL profiling events")
        assert row["results"]["torch"]["timing"].startswith("wall clock")
        assert row["results"]["opencl"]["plan"]["backend"] == "opencl"
        for label in ("torch", "opencl", "aten"):
            _check_cell_numbers(rep, row, label)
        assert row["rotation"]["sets"] >= 2
        # Note [interleaved entries]: the torch-tensor entries took turns; the OpenCL one (its own clock) ran alone
        assert all(c["interleaved_with"] == ["aten"] for c in row["results"]["torch"]["directions"].values())
        assert all("interleaved_with" not in c for c in row["results"]["opencl"]["directions"].values())
    assert rep["settings"]["interleave_turn_runs"] == 5 and "timed in turns" in (out / "bench.md").read_text()
    assert rep["rows"][1]["results"]["opencl"]["plan"]["algorithm"] == "igemm-transposed"
    assert rep["environment"]["versions"]["torch"] and rep["settings"]["runs"] == 5
    assert "tiny-tconv-cl" in text and "opencl" in text and "floor" in text
    md = (out / "bench.md").read_text()
    assert "| tiny-dw | opencl |" in md and "Roofline peaks" in md
    png = out / "bench.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "matplotlib" in rep["outputs"]["chart_skipped"] and "Chart skipped" in md
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep["outputs"]["chart_skipped"] is None
    # two runs of one device merge into one report (the GPU suite is split over several commands)
    merged = tmp_path / "merged"
    gz = tmp_path / "bench.json.gz"  # as committed under docs/performance
    gz.write_bytes(gzip.compress((out / "bench.json").read_bytes()))
    assert cli.main(["bench", "--merge", str(out / "bench.json"), str(gz), "--out", str(merged)]) == 0
    both = json.loads((merged / "bench.json").read_text())
    assert [r["name"] for r in both["rows"]] == ["tiny-dw", "tiny-tconv-cl"] * 2
    assert both["summary"]["opencl"]["fwd"]["rows"] == 4
    other = dict(rep, device=dict(rep["device"], name="another device"))
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert cli.main(["bench", "--merge", str(out / "bench.json"), str(tmp_path / "other.json")]) == 2


def test_opencl_clock_falls_back_to_the_wall_clock_without_marker_times(monkeypatch):
    from conftest import require_backend

    from portconv.backends.opencl import runtime as rt

    require_backend("opencl")
    mod = rt.cl()
    dev = rt.all_devices()[0][2]
    queue = mod.CommandQueue(mod.Context([dev]), dev, properties=mod.command_queue_properties.PROFILING_ENABLE)
    clock = timing.OpenCLClock(queue)
    real = clock.samples(lambda ms: _spin(ms), [0.5, 0.5])
    assert all(v > 0 for v in real) and clock.method.startswith("OpenCL profiling")

    class Stamp:
        class profile:
            end = 0

    monkeypatch.setattr(clock.cl, "enqueue_marker", lambda q: Stamp())
    got = clock.samples(lambda ms: _spin(ms), [1.0, 1.0, 1.0])
    assert len(got) == 3 and min(got) >= 1.0 and "no usable timestamps" in clock.method


def test_chart_absence_is_explained(monkeypatch, tmp_path):
    from portconv.bench import chart

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path, why = chart.chart({"rows": [], "settings": {"directions": ["fwd"]}}, tmp_path / "x.png")
    assert path is None and "matplotlib is not installed" in why and not (tmp_path / "x.png").exists()


def test_a_backend_that_cannot_run_a_row_gives_the_plans_reason(tiny_suite, monkeypatch):
    """The opencl backend made to reject grouped problems: that row shows the reason and no number."""
    from conftest import require_backend

    from portconv.bench import runner
    from portconv.errors import Unsupported
    from portconv.planner import clear_cache

    impl = require_backend("opencl")
    real = type(impl).choose

    def choose(self, problem, device, options):
        if problem.params.groups > 1:
            raise Unsupported("no kernel for grouped problems in this test")
        return real(self, problem, device, options)

    monkeypatch.setattr(type(impl), "choose", choose)
    clear_cache()
    try:
        rows = suite.load_suite(tiny_suite)[0]
        rep = runner.run(rows, runner.Options(runs=3, backends=["opencl"], peaks=False))
    finally:
        clear_cache()
    dw, tconv = rep["rows"]
    assert dw["results"]["opencl"]["status"] == "unsupported"
    assert dw["results"]["opencl"]["reason"] == "no kernel for grouped problems in this test"
    assert dw["results"]["opencl"]["directions"] == {} and "sum_ms" not in dw["results"]["opencl"]
    assert not dw["results"]["opencl"]["speedup_vs_torch"]
    assert tconv["results"]["opencl"]["status"] == "ok"
    assert dw["directions"]["fwd"]["floor_ms"] is None  # peaks=False: no roofline, and none invented
    text = report.table(rep)
    assert "unsupported: no kernel for grouped problems in this test" in text


def test_an_unavailable_backend_gives_its_probe_reason(tiny_suite):
    from portconv.bench import runner

    missing = [a for a in runner.availability() if not a["available"]]
    if not missing:
        pytest.skip("every backend is available on this machine")
    name, reason = missing[0]["backend"], missing[0]["reason"]
    rows = suite.load_suite(tiny_suite)[0][:1]
    rep = runner.run(rows, runner.Options(runs=3, backends=[name], peaks=False, directions=("fwd",)))
    res = rep["rows"][0]["results"][name]
    assert res["status"] == "unavailable" and res["reason"] == reason and res["directions"] == {}


def test_one_shape_from_problem_flags(tmp_path, knob_env, capsys):
    from portconv import cli

    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "cache"))
    rc = cli.main(["bench", "-n", "1", "-c", "4", "-k", "6", "-H", "9", "-W", "7", "-p", "1", "-q", "1",
                   "--backend", "aten", "--runs", "3", "--no-peaks", "--directions", "fwd,bwd-weight", "--quiet",
                   "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr()
    rep = json.loads((tmp_path / "bench.json").read_text())
    (row,) = rep["rows"]
    assert row["source"] == "flags" and row["input_shape"] == [1, 4, 9, 7] and row["output_shape"] == [1, 6, 9, 7]
    assert set(row["results"]["aten"]["directions"]) == {"fwd", "bwd-weight"}
    assert row["results"]["aten"]["directions"]["fwd"]["check"]["ok"]
    assert cli.main(["bench", "-n", "2", "--rows", "mbv2-dw3x3"]) == 2  # one shape and --rows do not mix


def test_overhead_on_a_cached_plan(monkeypatch):
    from portconv.bench import overhead

    res = overhead(backend="aten", device="cpu", calls=20, repeats=3, compile=False)
    for k in ("torch", "portconv", "plan_forward"):
        assert res[k]["per_call_us"] > 0 and res[k]["synced_call_us"] > 0
    assert res["portconv_minus_torch_us"] == pytest.approx(res["portconv"]["per_call_us"]
                                                           - res["torch"]["per_call_us"])
    assert res["plan_backend"] == "aten" and res["within_target"] == (res["portconv_minus_torch_us"] <= 25.0)


@pytest.mark.parametrize("backend", ["aten", "opencl"])
def test_overhead_of_the_training_style_call(backend):
    """Issue 29 point 5: forward + backward through autograd, per backend, against F.conv2d's."""
    from portconv.bench import overhead

    res = overhead(backend=backend, device="cpu", calls=10, repeats=3, compile=False)["train"]
    assert res["torch"]["per_call_us"] > 0 and res["portconv"]["synced_call_us"] > 0 and "autograd" in res["calls"]
    assert res["portconv_minus_torch_us"] == pytest.approx(res["portconv"]["per_call_us"]
                                                           - res["torch"]["per_call_us"])
    assert res["within_target"] == (res["portconv_minus_torch_us"] <= 25.0)
    assert res["torch_module"]["per_call_us"] > 0 and res["portconv_module"]["per_call_us"] > 0
    assert res["module_minus_torch_us"] == pytest.approx(res["portconv_module"]["per_call_us"]
                                                         - res["torch_module"]["per_call_us"])
    from portconv.bench.overhead import train_overhead

    assert "CPU torch tensors" in train_overhead("opencl", "meta")["skipped"]


def test_first_call_times_in_fresh_processes(tmp_path):
    from portconv.bench.overhead import first_call_times

    res = first_call_times("aten", "cpu", timeout=120)
    for k in ("cold", "warm"):
        assert "error" not in res[k], res[k]
        assert res[k]["plan_backend"] == "aten" and res[k]["first_forward_ms"] > 0 and res[k]["process_s"] > 0


def test_peaks_are_measured_once_and_cached_unless_the_host_was_busy(tmp_path, monkeypatch):
    import os

    import torch

    cpu, cache = torch.device("cpu"), tmp_path / "peaks.json"
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    busy = roofline.peaks(cpu, ["float32"], cache=cache)
    assert busy["not_cached"] and not cache.exists() and busy["bandwidth"]["bytes_per_s"] > 0
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    first = roofline.peaks(cpu, ["float32"], cache=cache)
    assert first["measured_now"] == ["bandwidth", "float32"] and cache.exists() and first["not_cached"] is None
    st = first["compute"]["float32"]["stats"]
    assert first["compute"]["float32"]["flops_per_s"] == pytest.approx(2 * 1024 ** 3 / (st["min_ms"] * 1e-3))
    again = roofline.peaks(cpu, ["float32"], cache=cache)
    assert again["measured_now"] == [] and again["compute"] == first["compute"]


def test_tuned_auto_entry(tiny_suite, tmp_path, knob_env, capsys):
    """'auto+tune' times the default plan made under portconv.tune(): its candidates are timed once and the winner
    persisted in the tuning cache, and the table names the backend it chose."""
    from conftest import require_backend

    from portconv import cli
    from portconv.tuning import cache_path, stats

    require_backend("opencl")
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "cache"))
    before = stats["timed"]
    rc = cli.main(["bench", "--suite", str(tiny_suite), "--rows", "tiny-dw", "--backend", "auto,auto+tune",
                   "--runs", "5", "--quiet", "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"][0]["results"]
    assert list(res) == ["torch", "auto", "auto+tune"]
    assert "tun" in res["auto+tune"]["plan"]["reason"].lower() and "tun" not in res["auto"]["plan"]["reason"].lower()
    assert stats["timed"] == before + 1 and pathlib.Path(cache_path()).is_file()
    assert f"auto+tune->{res['auto+tune']['backend']}" in text


def test_benchmark_entries_time_last():
    """Note [benchmark entries last]: on CUDA the cudnn.benchmark baselines run after every portconv entry, so those
    meet the plans PyTorch's defaults chose (its cuDNN plan cache ignores the benchmark flag)."""
    import types

    from portconv.bench.runner import entries_for

    avail = [{"backend": "cudnn", "available": True}, {"backend": "cuda", "available": True}]
    got = [e.label for e in entries_for(None, avail, types.SimpleNamespace(type="cuda"), True)]
    assert got == ["torch", "torch-ieee", "cudnn", "cuda", "auto", "torch+benchmark", "torch-ieee+benchmark"], got
    assert [e.label for e in entries_for(["auto"], avail, types.SimpleNamespace(type="cpu"), True)] == ["torch", "auto"]


def test_environment_records_the_knobs_and_options(knob_env):
    """A report names the knobs it ran under, set or not, and the developer options in force (which kernels it
    timed)."""
    import portconv
    from portconv import knobs, native
    from portconv.bench import settings

    knob_env("PORTCONV_OPENCL_DENSE", "direct")
    got = settings.environment()
    assert got["knobs"]["PORTCONV_OPENCL_DENSE"] == "direct" and set(got["knobs"]) == set(knobs.KNOB_NAMES)
    assert got["native"] == native.status()  # Note [native executor]: which executor the calls ran on
    with portconv.options(igemm_tile="128x64"):
        assert settings.environment()["options"] == "igemm_tile=128x64"
