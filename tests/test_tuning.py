"""Tuning mode on the CPU: real timing of the opencl and aten backends, the cache file across processes."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import require_backend

import portconv
from portconv.planner import clear_cache
from portconv.tuning import TuneCacheWarning, _store, cache_path, load, stats

X_SHAPE, W_SHAPE = (2, 4, 8, 8), (4, 4, 3, 3)


@pytest.fixture
def tuning(tmp_path, monkeypatch, knob_env, requested_backends):
    if "opencl" not in requested_backends:
        pytest.skip("tuning is tested against the opencl backend (pytest --backend opencl)")
    require_backend("opencl")
    for name in ("PORTCONV_BACKEND", "PORTCONV_DISABLE", "PORTCONV_TUNE"):
        knob_env(name, None)
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(stats, "timed", 0)
    monkeypatch.setitem(stats, "reused", 0)
    clear_cache()
    yield tmp_path
    clear_cache()


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.empty(X_SHAPE).uniform_(-1, 1, generator=g), torch.empty(W_SHAPE).uniform_(-1, 1, generator=g),
            torch.empty(W_SHAPE[0]).uniform_(-1, 1, generator=g))


def _entries():
    with open(cache_path(), encoding="utf-8") as f:
        data = json.load(f)
    assert data["version"] == 1
    return data["entries"]


def test_tune_times_both_backends_and_persists_the_winner(tuning):
    x, w, b = _data()
    with portconv.tune():
        pl = portconv.plan(x, w, b, padding=1)
        y = portconv.conv2d(x, w, b, padding=1)
    assert stats == {"timed": 1, "reused": 0}
    assert pl.reason.startswith(f"tuned: {pl.backend} fastest (") and "timed now" in pl.reason
    loser = {"opencl": "aten", "aten": "opencl"}[str(pl.backend)]
    assert [b_ for b_, why in pl.rejected if "slower than" in why] == [loser]
    (entry,) = _entries().values()
    assert entry["winner"] == str(pl.backend) and set(entry["times_ms"]) == {"opencl", "aten"}
    assert all(math.isfinite(t) and t > 0 for t in entry["times_ms"].values())
    assert entry["times_ms"][entry["winner"]] == min(entry["times_ms"].values())
    assert torch.allclose(y, F.conv2d(x, w, b, padding=1), atol=1e-5)
    assert [p for p in os.listdir(os.path.dirname(cache_path())) if p.endswith(".tmp")] == []
    # not tuned: a forced backend, tune(False), and the default again outside the block
    with portconv.tune():
        assert not portconv.plan(x, w, b, padding=1, backend="aten").reason.startswith("tuned")
        with portconv.tune(False):
            assert not portconv.plan(x, w, b, padding=1).reason.startswith("tuned")
    assert portconv.plan(x, w, b, padding=1).backend == "aten"  # Note [CPU wins]: ATen's route for a dense problem
    assert stats["timed"] == 1


_SCRIPT = f"""
import json, torch, portconv
from portconv.tuning import stats
g = torch.Generator().manual_seed(0)
x = torch.empty({X_SHAPE}).uniform_(-1, 1, generator=g); w = torch.empty({W_SHAPE}).uniform_(-1, 1, generator=g)
b = torch.empty({W_SHAPE[0]}).uniform_(-1, 1, generator=g)
pl = portconv.plan(x, w, b, padding=1)
y = portconv.conv2d(x, w, b, padding=1)
ok = bool(torch.allclose(y, torch.nn.functional.conv2d(x, w, b, padding=1), atol=1e-5))
print("RESULT " + json.dumps(dict(stats=stats, backend=str(pl.backend), reason=pl.reason, ok=ok)))
"""


def _other_process(env_extra: dict) -> dict:
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(next(s for s in p.stdout.splitlines() if s.startswith("RESULT "))[len("RESULT "):])


def test_a_second_process_reuses_the_file_without_timing(tuning):
    x, w, b = _data()
    with portconv.tune():
        pl = portconv.plan(x, w, b, padding=1)
    got = _other_process({"PORTCONV_TUNE": "1"})  # PORTCONV_CACHE_DIR comes from the fixture
    assert got["stats"] == {"timed": 0, "reused": 1} and got["ok"]
    assert got["backend"] == str(pl.backend)
    assert got["reason"].startswith(f"tuned: {pl.backend} fastest") and f"from {cache_path()}" in got["reason"]
    assert len(_entries()) == 1


def test_a_corrupt_cache_file_is_reported_and_moved_aside(tuning):
    os.makedirs(os.path.dirname(cache_path()))
    with open(cache_path(), "w") as f:
        f.write('{"version": 1, "entries": {"trunc')
    x, w, b = _data()
    with pytest.warns(TuneCacheWarning, match=r"tuning cache .*ignoring it \(JSONDecodeError"), portconv.tune():
        pl = portconv.plan(x, w, b, padding=1)
    assert stats["timed"] == 1 and pl.reason.startswith("tuned:")
    assert [e["winner"] for e in _entries().values()] == [str(pl.backend)]
    with open(cache_path() + ".bad") as f:
        assert f.read().endswith('"trunc')  # the unreadable file is kept for a look, not lost
    with open(cache_path(), "w") as f:
        json.dump({"version": 99, "entries": {}}, f)
    with pytest.warns(TuneCacheWarning, match="not a portconv tuning cache of format version 1"):
        assert load() == {}


def test_the_key_separates_problems_and_env_turns_tuning_on(tuning, knob_env):
    x, w, b = _data()
    knob_env("PORTCONV_TUNE", "1")
    portconv.plan(x, w, b, padding=1)
    portconv.plan(x.contiguous(memory_format=torch.channels_last), w, b, padding=1)  # other strides: timed again
    portconv.plan(x, w, None, padding=1)  # no bias: timed again
    assert stats == {"timed": 3, "reused": 0} and len(_entries()) == 3
    clear_cache()  # this process forgets its plans; the file answers
    portconv.plan(x, w, None, padding=1)
    assert stats == {"timed": 3, "reused": 1}


_WRITER = """
import sys
from portconv.tuning import _store
for i in range(40):
    _store(sys.argv[1], f"{sys.argv[2]}-{i}", {"winner": "aten", "times_ms": {"aten": 1.0}, "pad": "x" * 4000})
"""


def test_concurrent_writers_never_leave_a_torn_file_nor_lose_entries(tuning):
    path = cache_path()
    _store(path, "first", {"winner": "aten", "times_ms": {"aten": 1.0}})
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, f"w{i}"]) for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneCacheWarning)  # a torn read would warn
        reads = 0
        while any(p.poll() is None for p in procs):
            assert isinstance(load(path), dict)
            reads += 1
    assert all(p.returncode == 0 for p in procs) and reads > 0
    entries = load(path)
    assert all(entries[k]["winner"] == "aten" for k in entries)
    assert sorted(k for k in entries if k.startswith("w")) == sorted(f"w{i}-{j}" for i in range(3) for j in range(40))
    assert [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")] == []


_GOOD = {"winner": "aten", "times_ms": {"aten": 1.0, "opencl": 2.5}}
_BAD_ENTRIES = {"text-times": {"winner": "aten", "times_ms": {"aten": "fast"}}, "none": None, "list": [1, 2],
                "nan": {"winner": "aten", "times_ms": {"aten": float("nan")}},
                "winner-not-timed": {"winner": "cuda", "times_ms": {"aten": 1.0}},
                "nested": {"winner": "aten", "times_ms": {"aten": {"x": 1}}}}


def test_bad_entries_are_ignored_with_one_warning_and_good_ones_kept(tuning):
    """Note [tuning cache file]: malformed entries never raise on a tuned call; the good ones answer, and the next
    write leaves the bad ones out."""
    path = cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"version": 1, "entries": {"good": _GOOD, **_BAD_ENTRIES}}, f)
    with pytest.warns(TuneCacheWarning, match=f"ignoring {len(_BAD_ENTRIES)} malformed entries \\(kept 1\\)"):
        assert load(path) == {"good": _GOOD}
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneCacheWarning)  # once a file and process
        assert load(path) == {"good": _GOOD}
    x, w, b = _data()
    with portconv.tune():
        pl = portconv.plan(x, w, b, padding=1)  # a problem of its own: timed, written beside "good"
    assert pl.reason.startswith("tuned:") and stats["timed"] == 1
    entries = _entries()
    assert entries["good"] == _GOOD and len(entries) == 2 and not set(entries) & set(_BAD_ENTRIES)


def test_a_deeply_nested_file_is_survived(tuning):
    path = cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    with pytest.warns(TuneCacheWarning, match="RecursionError"):
        assert load(path) == {}
    x, w, b = _data()
    with portconv.tune():
        portconv.plan(x, w, b, padding=1)
    assert len(_entries()) == 1


def test_export_and_import_pre_warm_another_cache(tuning, knob_env, tmp_path, capsys):
    from portconv.cli import main

    x, w, b = _data()
    with portconv.tune():
        portconv.plan(x, w, b, padding=1)
    dump = tmp_path / "cluster.json"
    assert main(["tune", "--export", str(dump)]) == 0 and "exported 1 entries" in capsys.readouterr().out
    knob_env("PORTCONV_CACHE_DIR", str(tmp_path / "other"))  # another machine's cache
    _store(cache_path(), "theirs", _GOOD)
    assert main(["tune", "--import", str(dump)]) == 0
    assert "imported 1 entries" in capsys.readouterr().out and len(_entries()) == 2
    clear_cache()
    with portconv.tune():
        portconv.plan(x, w, b, padding=1)
    assert stats == {"timed": 1, "reused": 1}  # the imported entry answered without timing
    (tmp_path / "junk.json").write_text("{}")
    assert main(["tune", "--import", str(tmp_path / "junk.json")]) == 2
    assert "not a portconv tuning cache" in capsys.readouterr().err
