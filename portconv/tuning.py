"""Tuning mode: time every backend that can run a problem (forward + both gradients) once, persist the fastest."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
import warnings

from . import diskcache, knobs, validate
from .backends import BackendId
from .errors import BackendUnavailable, Unsupported
from .policy import candidates
from .problem import Problem
from .rules.context import torch_flags
from .tensors import dense_strides

FORMAT_VERSION = 1
REPS = 7  # timed forward + backward runs per candidate (at least MIN_REPS, more while within BUDGET_S)
MIN_REPS = 3
BUDGET_S = 1.0
stats = {"timed": 0, "reused": 0}  # problems timed / answered from the cache file, in this process


class TuneCacheWarning(UserWarning):
    """The tuning cache file could not be read or written; tuning goes on without it."""


def cache_path() -> str:
    return os.path.join(knobs.env().cache_dir, "tune", f"tune-v{FORMAT_VERSION}.json")


# --- the cache file ----------------------------------------------------------------------------------------------
# Note [tuning cache file]
# One JSON file of entries keyed by a hash of (problem signature, the candidates' device descriptions and versions,
# portconv's version and kernel-source digests, the torch flags that change timings). A writer takes an exclusive
# lock on a sidecar file (fcntl.flock, where the platform has it), re-reads the file, merges its entries and writes a
# temporary file in the same directory that os.replace() puts in place: readers (who take no lock) see the old or
# the new file, never a torn one, and concurrent writers lose no entries. Any content is survived: an entry that is
# not {"winner": name, "times_ms": {name: finite number}} with the winner among the times is ignored (one warning a
# file and process) and left out when the file is next written; a file that cannot be parsed at all is moved aside
# to <name>.bad (with a warning) and a new one begins. export_entries / import_entries (portconv tune --export /
# --import) copy the valid entries between machines.
def _valid(entry) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("winner"), str):
        return False
    times = entry.get("times_ms")
    if not isinstance(times, dict) or entry["winner"] not in times:
        return False
    return all(type(t) in (int, float) and math.isfinite(t) and t >= 0 for t in times.values())


def _good(entries: dict) -> dict:
    """The well-formed entries of a file's entries (Note [tuning cache file])."""
    return {k: e for k, e in entries.items() if isinstance(k, str) and _valid(e)}


def _warn_once(path: str, why: str, stacklevel: int) -> None:
    diskcache.warn_once(f"tune {path}: {why}", f"tuning cache {path}: {why}", TuneCacheWarning, stacklevel + 1)


def _read(path: str) -> tuple[dict | None, str]:
    """(the file's entries, '') or (None, why it is unusable); ({}, '') when absent."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError, RecursionError) as e:
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    if isinstance(data, dict) and data.get("version") == FORMAT_VERSION and isinstance(data.get("entries"), dict):
        return data["entries"], ""
    return None, f"not a portconv tuning cache of format version {FORMAT_VERSION}"


def load(path: str | None = None, warn: bool = True) -> dict:
    """The valid entries of the cache file ({} when absent or unreadable; TuneCacheWarning once for what is not)."""
    path = path or cache_path()
    entries, why = _read(path)
    if entries is None:
        if warn:
            _warn_once(path, f"ignoring it ({why}); its problems are timed again and the file is rewritten", 2)
        return {}
    good = _good(entries)
    if warn and len(good) < len(entries):
        _warn_once(path, f"ignoring {len(entries) - len(good)} malformed entries (kept {len(good)}); they are left "
                   "out when the file is next written", 2)
    return good


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive lock on ``path``.lock for a read-merge-write (no lock where fcntl is absent)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path + ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _merge(path: str, new: dict) -> int:
    """Merge ``new`` entries (valid ones only) into the file under the lock; how many were written in all."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with _locked(path):
        entries, why = _read(path)
        if entries is None:
            bad = path + ".bad"
            os.replace(path, bad)
            _warn_once(path, f"moved aside to {bad} ({why}); a new file begins", 3)
            entries = {}
        entries = {**_good(entries), **_good(new)}
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tune-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return len(entries)


def _store(path: str, key: str, entry: dict) -> None:
    try:
        _merge(path, {key: entry})
    except OSError as e:
        warnings.warn(f"portconv: could not write the tuning cache {path} ({e}); the result holds for this process "
                      "only", TuneCacheWarning, stacklevel=3)


def export_entries(dest: str, path: str | None = None) -> int:
    """Write the cache file's valid entries to ``dest`` (a tuning cache file of its own); how many."""
    entries = load(path)
    with open(dest, "w", encoding="utf-8") as f:
        json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
    return len(entries)


def import_entries(src: str, path: str | None = None) -> tuple[int, int]:
    """Merge the valid entries of ``src`` into the cache file: (entries taken from src, entries in the file now).
    Raises ValueError when ``src`` is not a tuning cache file."""
    entries, why = _read(src)
    if entries is None or not os.path.exists(src):
        raise ValueError(f"{src} is not a portconv tuning cache file ({why or 'not found'})")
    good = _good(entries)
    return len(good), _merge(path or cache_path(), good)


@functools.cache
def _source_digest(bid: BackendId) -> str:
    from . import sources

    vendor = {BackendId.OPENCL: "opencl", BackendId.CUDA: "cuda", BackendId.HIP: "hip"}.get(bid)
    if vendor is None:
        return ""
    try:
        return sources.digest(vendor) + (sources.digest("cuda") if vendor == "hip" else "")
    except FileNotFoundError:
        return "no sources"


def signature(problem: Problem) -> str:
    """The problem as the cache file keys it (shapes, strides, dtypes, parameters; not the device index)."""
    i, w = problem.input, problem.weight
    return (f"{problem.params!r}; input {list(i.shape)} strides {list(i.strides)} {i.dtype} {i.kind} "
            f"{i.device_type}; weight {list(w.shape)} strides {list(w.strides)} {w.dtype}; bias={problem.has_bias}")


def cache_key(problem: Problem, cands) -> tuple[str, dict]:
    from . import __version__

    ident = {"problem": signature(problem), "portconv": __version__,
             "candidates": [[str(b), d.describe(), d.index, _source_digest(b)] for b, d, _ in cands],
             "torch_flags": repr(torch_flags(problem.input.device_type))}
    blob = json.dumps(ident, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], ident


# --- timing -------------------------------------------------------------------------------------------------------
def _tensors(problem: Problem):
    """Fresh uniform [-1, 1) data (never zeros) with the problem's exact shapes, strides, dtype and device."""
    import torch

    dev = torch.device(problem.input.device)
    dtype = getattr(torch, problem.dtype)
    gen = torch.Generator().manual_seed(0)

    def make(shape, strides):
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
        base = torch.empty(max(extent, 1)).uniform_(-1, 1, generator=gen).to(dtype=dtype, device=dev)
        return base.as_strided(shape, strides)

    p, i, w = problem.params, problem.input, problem.weight
    bias = None
    if problem.has_bias:
        k = w.shape[1] * p.groups if p.transposed else w.shape[0]
        bias = make((k,), (1,))
    out = problem.output_shape
    go = make(out, dense_strides(out, i.memory_format))
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    return make(i.shape, i.strides), make(w.shape, w.strides), bias, go, sync


def time_plans(plans: dict, tensors, reps: int = REPS, budget_s: float = BUDGET_S) -> dict[str, list[float]]:
    """Wall seconds of forward + backward (all gradients) per plan, device-synchronized, after one warm-up each.

    The candidates take turns (one run each per round), so a disturbance (another process, a runtime's worker
    threads still spinning) falls on all of them alike. Returns {"samples": {name: [s, ...]}, "errors": {name:
    exception}}: a candidate that raises in its warm-up is left out.
    """
    x, w, b, go, sync = tensors
    mask = (True, True, b is not None)
    samples: dict[str, list[float]] = {}
    errors: dict[str, BaseException] = {}

    def once(plan):
        plan.forward(x, w, b)
        plan.backward(go, x, w, mask)
        sync()

    for name, plan in plans.items():  # warm-up: compiles, allocates, picks its algorithms
        try:
            once(plan)
            samples[name] = []
        except Exception as e:  # noqa: BLE001 - reported by the caller in the plan's rejected list
            errors[name] = e
    start = time.perf_counter()
    rounds = 0
    while samples and (rounds < MIN_REPS or (rounds < reps and time.perf_counter() - start < budget_s * len(samples))):
        for name in samples:
            t0 = time.perf_counter()
            once(plans[name])
            samples[name].append(time.perf_counter() - t0)
        rounds += 1
    return {"samples": samples, "errors": errors}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def select_tuned(problem: Problem, disabled: frozenset[str], options, attempt, build):
    """The tuned plan: every backend that can run ``problem`` timed once (or the persisted winner). ``attempt`` and
    ``build`` are portconv.planner's: (device, choice) of a backend, and the Plan of a choice."""
    rejected: list[tuple[str, str]] = []
    cands = []
    for bid in candidates(problem):
        if bid.value in disabled:
            rejected.append((bid.value, "disabled by PORTCONV_DISABLE"))
            continue
        try:
            device, choice = attempt(bid, problem, options)
        except Unsupported as e:
            rejected.append((bid.value, e.reason))
            continue
        cands.append((bid, device, choice))
    if not cands:
        reasons = "\n".join(f"  {b}: {why}" for b, why in rejected)
        raise BackendUnavailable(f"no portconv backend can run this problem ({problem.describe()}):\n{reasons}")
    if len(cands) == 1 or problem.input.kind != "torch" or validate.is_empty_problem(problem):
        bid, device, choice = cands[0]
        why = ("the only backend that can run it" if len(cands) == 1 else "tuning times torch tensors only"
               if problem.input.kind != "torch" else "an empty problem runs no kernel")
        return _with(build, options, problem, cands[0], f"tuned: {bid}, nothing timed ({why})", rejected)
    path = cache_path()
    key, ident = cache_key(problem, cands)
    entry = load(path).get(key)
    by_id = {str(c[0]): c for c in cands}
    if isinstance(entry, dict) and entry.get("winner") in by_id and isinstance(entry.get("times_ms"), dict):
        stats["reused"] += 1
        times = {b: float(t) / 1e3 for b, t in entry["times_ms"].items()}
        return _tuned(build, options, problem, by_id[entry["winner"]], times, cands, rejected, f"from {path}")
    plans = {str(bid): build(problem, bid, device, choice, options) for bid, device, choice in cands}
    timed = time_plans(plans, _tensors(problem))
    times = {name: statistics.median(v) for name, v in timed["samples"].items()}
    runs = min((len(v) for v in timed["samples"].values()), default=0)
    for name, e in timed["errors"].items():
        rejected.append((name, f"failed while tuning: {type(e).__name__}: {e}"))
        warnings.warn(f"portconv: tuning: the {name} backend failed on {problem.describe()}: {e}", stacklevel=3)
    if not times:
        raise BackendUnavailable(f"every candidate failed while tuning {problem.describe()}:\n"
                                 + "\n".join(f"  {b}: {why}" for b, why in rejected))
    stats["timed"] += 1
    winner = min(times, key=times.get)
    _store(path, key, {"winner": winner, "times_ms": {b: t * 1e3 for b, t in times.items()}, **ident,
                       "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    return _tuned(build, options, problem, by_id[winner], times, [c for c in cands if str(c[0]) in times], rejected,
                  f"timed now: median of {runs} forward + backward runs each")


def _tuned(build, options, problem, cand, times, cands, rejected, how):
    winner = str(cand[0])
    listing = ", ".join(f"{b} {_ms(t)}" for b, t in sorted(times.items(), key=lambda kv: kv[1]))
    losers = [(str(b), f"tuned: {_ms(times[str(b)])} forward + backward, slower than {winner}")
              for b, _, _ in cands if str(b) != winner and str(b) in times]
    return _with(build, options, problem, cand, f"tuned: {winner} fastest ({listing}; {how})", rejected + losers)


def _with(build, options, problem, cand, why, rejected):
    bid, device, choice = cand
    choice = dataclasses.replace(choice, reason=f"{why}; {choice.reason}")
    return build(problem, bid, device, choice, options, tuple(rejected), False)
