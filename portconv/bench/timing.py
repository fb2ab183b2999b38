"""Timing: per-call samples (CUDA events, OpenCL profiling markers, wall clock), their statistics, buffer rotation."""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import time
from collections.abc import Callable, Sequence

DEFAULT_CACHE = 64 << 20  # used only when a device does not say how large its last cache is


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of per-call times in milliseconds."""

    runs: int
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Stats:
        if not samples_ms:
            raise ValueError("no timing samples")
        bad = [v for v in samples_ms if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise ValueError(f"timing samples must be finite and non-negative, got {bad[:3]}")
        return cls(len(samples_ms), percentile(samples_ms, 50), percentile(samples_ms, 10),
                   percentile(samples_ms, 90), sum(samples_ms) / len(samples_ms), min(samples_ms), max(samples_ms))

    def as_dict(self) -> dict:
        return {"runs": self.runs, "median_ms": self.median, "p10_ms": self.p10, "p90_ms": self.p90,
                "mean_ms": self.mean, "min_ms": self.min, "max_ms": self.max}


# --- clocks: how one call's time is taken ---------------------------------------------------------------
class WallClock:
    """Host wall clock around each call, with ``sync`` (a device wait) before the clock is read."""

    method = "wall clock (time.perf_counter) around each call, device synchronized after it"

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync

    def samples(self, call, args) -> list[float]:
        out = []
        for a in args:
            t0 = time.perf_counter()
            call(a)
            self.sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return out


class CudaClock:
    """torch.cuda.Event pairs around each call on the current stream; read after one synchronize.

    Note [held stream]: with ``hold`` each batch of calls is enqueued behind a spin kernel (torch.cuda._sleep) that
    keeps the stream busy until the host has enqueued every call of the batch (nvbench's blocking kernel), so the
    events time the GPU's work alone: a call whose host cost exceeds its kernels' no longer leaves the GPU idle
    between its start event and its first kernel. An event recorded after the spin tells whether the spin outlasted
    the enqueueing; if not, the batch is timed again with a spin 4x longer (the length is kept for later batches),
    and after 4 tries the samples are kept and ``hold_failures`` counts the batch.
    """

    def __init__(self, device, hold: bool = False):
        import torch

        self.torch = torch
        self.device = device
        self.hold = hold
        self.spin_us_per_call = 100.0  # grows when a spin ended before the host had enqueued its batch
        self.hold_failures = 0
        self.method = ("CUDA events around each call, each batch enqueued behind a spin kernel that holds the stream "
                       "until the host has enqueued it (Note [held stream]): device time without the host's launch "
                       "cost" if hold else "CUDA events (torch.cuda.Event) around each call on the current stream")

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def _enqueue(self, call, args, stream) -> list:
        cuda = self.torch.cuda
        pairs = []
        for a in args:
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record(stream)
            call(a)
            end.record(stream)
            pairs.append((start, end))
        return pairs

    def samples(self, call, args) -> list[float]:
        cuda = self.torch.cuda
        stream = cuda.current_stream(self.device)
        if not self.hold:
            pairs = self._enqueue(call, args, stream)
            self.sync()
            return [s.elapsed_time(e) for s, e in pairs]
        for _ in range(4):
            with cuda.device(self.device):
                cuda._sleep(int((200 + self.spin_us_per_call * len(args)) * 2000))  # ~2000 cycles a us
            held = cuda.Event()
            held.record(stream)
            pairs = self._enqueue(call, args, stream)
            early = held.query()  # the spin ended before the last call was enqueued
            self.sync()
            if not early:
                break
            self.spin_us_per_call *= 4
        else:
            self.hold_failures += 1
        return [s.elapsed_time(e) for s, e in pairs]


class OpenCLClock:
    """Profiling markers enqueued before and after each call on a profiling-enabled in-order queue.

    The time of a call is end(marker after) - end(marker before): from the moment all earlier work was done to
    the moment this call's last command was, as CUDA events measure it.
    """

    method = "OpenCL profiling events (markers around each call on a profiling-enabled in-order queue)"

    def __init__(self, queue):
        import pyopencl

        self.cl = pyopencl
        self.queue = queue
        self.fallback: WallClock | None = None

    def sync(self) -> None:
        self.queue.finish()

    def samples(self, call, args) -> list[float]:
        if self.fallback is not None:
            return self.fallback.samples(call, args)
        marks = []
        for a in args:
            m0 = self.cl.enqueue_marker(self.queue)
            call(a)
            marks.append((m0, self.cl.enqueue_marker(self.queue)))
        self.queue.finish()
        try:
            stamps = [(m0.profile.end, m1.profile.end) for m0, m1 in marks]
            why = None if all(0 < e0 < e1 for e0, e1 in stamps) else "markers carry no usable timestamps"
        except self.cl.Error as e:  # some drivers give no profiling info for markers
            why = f"marker profiling info unavailable ({e})"
        if why is None:
            return [(e1 - e0) * 1e-6 for e0, e1 in stamps]
        # Note [OpenCL marker fallback]: a driver that cannot time markers is timed by the wall clock with a
        # queue.finish() after each call, and every later cell says so in its method.
        self.fallback = WallClock(self.sync)
        self.method = f"wall clock with queue.finish() after each call ({why})"
        return self.fallback.samples(call, args)


# --- one measurement ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Measurement:
    stats: Stats
    samples_ms: list[float]
    first_call_ms: float  # wall clock of the very first call (includes compiling, plan, handle creation)
    warmup: int  # calls made before the timed ones (the first call included)
    requested_runs: int
    method: str
    first_output: object = None  # what the first call returned (for the correctness check)

    def as_dict(self) -> dict:
        d = self.stats.as_dict()
        d.update(first_call_ms=self.first_call_ms, warmup_calls=self.warmup, requested_runs=self.requested_runs,
                 method=self.method, samples_ms=list(self.samples_ms))
        return d


@dataclasses.dataclass
class _Warm:
    """A call after its warm-up: what the first call returned and took, how many calls warmed it, the runs to time."""

    first: object
    first_ms: float
    warmup: int
    target: int


def _warm_up(clock, call: Callable, sets: Sequence, at: int, *, runs: int, warmup: int, min_runs: int,
             budget_s: float | None, warmup_s: float) -> tuple[_Warm, int]:
    """The warm-up of measure(): the first call on set 0 (the one the correctness check compares), the next ones on
    the sets from ``at`` + 1; returns it and the next set's index."""
    n = len(sets)
    t0 = time.perf_counter()
    first = call(sets[0])
    clock.sync()
    first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    call(sets[(at + 1) % n])
    clock.sync()
    est = max(time.perf_counter() - t0, 1e-7)
    extra = max(0, warmup - 2, math.ceil(warmup_s / est) - 2)
    target = runs
    if budget_s is not None:
        extra = min(extra, int(0.25 * budget_s / est))
        target = min(runs, max(min_runs, int(budget_s / est)))
    i = at + 2
    for _ in range(extra):
        call(sets[i % n])
        i += 1
    clock.sync()
    return _Warm(first, first_ms, 2 + extra, target), i


def measure(clock, call: Callable, sets: Sequence, *, runs: int, warmup: int, min_runs: int = 5,
            budget_s: float | None = None, warmup_s: float = 0.0) -> Measurement:
    """Warm up, then time ``runs`` calls, set i of ``sets`` on call i (rotating).

    The first call is timed alone (wall clock: it includes compilation), the second gives an estimate of one
    call's cost. Warm-up lasts ``warmup`` calls and at least ``warmup_s`` seconds (allocator, thread pools and
    clocks settle: seen on a CPU, where the first cell of a process ran 5x slower after two warm-up calls).
    With ``budget_s`` the warm-up is cut to a quarter of the budget and the timed runs to what fits in it, never
    below ``min_runs`` (the report shows the count).
    """
    (m,) = measure_interleaved(clock, [(call, None)], sets, turn_runs=None, runs=runs, warmup=warmup,
                               min_runs=min_runs, budget_s=budget_s, warmup_s=warmup_s)
    if isinstance(m, BaseException):
        raise m
    return m


def measure_interleaved(clock, members: Sequence[tuple[Callable, Callable | None]], sets: Sequence, *,
                        turn_runs: int | None, runs: int, warmup: int, min_runs: int = 5,
                        budget_s: float | None = None, warmup_s: float = 0.0) -> list[Measurement | BaseException]:
    """measure() for several calls of the same data at once, their timed runs taken in turns.

    Note [interleaved entries]: calls timed one after the other are compared across moments: clocks, power state
    and the host's other work drift between them, and identical calls (portconv's aten backend and PyTorch's own
    call, the same cuDNN kernels) measured 0.66x-1.2x of each other in one process on an H100. Here each member (call,
    context factory or None: entered around each of its turns, e.g. a torch setting) warms up in turn, then takes
    ``turn_runs`` timed runs a turn, round after round, the order rotated by one each round, until it has its runs; the
    buffer sets rotate over the whole sequence, so no turn starts on data the previous one left in the cache. A turn
    opens with one untimed call: a turn starts after the previous one's synchronize, and the lead-in gives the device
    work to do while the host enqueues the first timed call, as every later call of the turn has. A member whose call
    raises is dropped from later turns and gets the exception in its place.
    ``turn_runs`` None: all runs in one turn, no lead-in (measure()).
    """
    import contextlib

    n = len(sets)
    out: list = [None] * len(members)
    warm: dict[int, _Warm] = {}
    samples: dict[int, list[float]] = {}
    at = 0

    def turn(k, fn):
        ctx = members[k][1]
        with ctx() if ctx is not None else contextlib.nullcontext():
            return fn()

    for k, (call, _) in enumerate(members):
        try:
            warm[k], at = turn(k, lambda call=call, at=at: _warm_up(
                clock, call, sets, at, runs=runs, warmup=warmup, min_runs=min_runs, budget_s=budget_s,
                warmup_s=warmup_s))
            samples[k] = []
        except Exception as e:  # noqa: BLE001 - reported in the member's cell
            out[k] = e
    most = max((w.target for w in warm.values()), default=1)
    rounds = 1 if turn_runs is None else -(-most // max(1, turn_runs))
    for r in range(rounds):
        live = [k for k in samples if out[k] is None]
        if not live:
            break
        for k in live[r % len(live):] + live[:r % len(live)]:
            want = min(warm[k].target - len(samples[k]), warm[k].target if turn_runs is None else turn_runs)
            if want <= 0:
                continue
            lead = None if turn_runs is None else sets[at % n]
            at += lead is not None
            args = [sets[(at + j) % n] for j in range(want)]
            at += want

            def timed(call=members[k][0], lead=lead, args=args):
                if lead is not None:
                    call(lead)
                return clock.samples(call, args)
            try:
                samples[k] += turn(k, timed)
            except Exception as e:  # noqa: BLE001
                out[k] = e
    for k, w in warm.items():
        if out[k] is None:
            out[k] = Measurement(Stats.of(samples[k]), samples[k], w.first_ms, w.warmup, runs, clock.method, w.first)
    return out


# --- caches and buffer rotation -----------------------------------------------------------------------------
def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def cpu_cache_bytes() -> tuple[int, str]:
    """The largest CPU cache (the last level) from sysfs, with where it came from."""
    best = 0
    for d in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            best = max(best, _size((d / "size").read_text()))
        except (OSError, ValueError):
            continue
    if best:
        return best, "sysfs /sys/devices/system/cpu/cpu0/cache (largest data cache)"
    return DEFAULT_CACHE, f"unknown (sysfs has no cache sizes): assumed {DEFAULT_CACHE >> 20} MiB"


def cuda_cache_bytes(device) -> tuple[int, str]:
    import torch

    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    if size:
        return size, "torch.cuda.get_device_properties().L2_cache_size"
    return DEFAULT_CACHE, f"unknown (torch reports no L2 size): assumed {DEFAULT_CACHE >> 20} MiB"


def opencl_cache_bytes(device) -> tuple[int, str]:
    size = int(device.global_mem_cache_size or 0)
    if size:
        return size, "CL_DEVICE_GLOBAL_MEM_CACHE_SIZE"
    return DEFAULT_CACHE, f"unknown (the OpenCL device reports no cache): assumed {DEFAULT_CACHE >> 20} MiB"


def opencl_budget(budget: int, device) -> int:
    """The rotation budget on an OpenCL device: every set lives in one buffer (data.opencl_sets), so no more than
    the device allocates at once (CL_DEVICE_MAX_MEM_ALLOC_SIZE). PoCL on a host whose caches it reports as 260 MiB
    wanted 2 x 260 MiB of inputs in rotation, over its 2 GiB allocation limit with every set's outputs
    (INVALID_BUFFER_SIZE)."""
    return min(budget, int(device.max_mem_alloc_size or budget))


def memory_budget(device_type: str, device=None) -> int:
    """Bytes the rotated buffer sets of one row may take: a quarter of free memory, at most 4 GiB."""
    free = 0
    if device_type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(device)[0]
    elif hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(4 << 30, free // 4) if free else 1 << 30


@dataclasses.dataclass(frozen=True)
class Rotation:
    sets: int
    set_bytes: int  # every tensor of one set (all directions' inputs)
    min_input_bytes: int  # the inputs one call of the lightest direction reads
    cache_bytes: int
    cache_source: str

    @property
    def exceeds_cache(self) -> bool:
        """Do the inputs read by consecutive calls, over all sets, exceed the cache (so none stays in it)?"""
        return self.sets * self.min_input_bytes > self.cache_bytes

    def as_dict(self) -> dict:
        return {"sets": self.sets, "set_bytes": self.set_bytes, "total_bytes": self.sets * self.set_bytes,
                "min_input_bytes": self.min_input_bytes, "cache_bytes": self.cache_bytes,
                "cache_source": self.cache_source, "exceeds_cache": self.exceeds_cache}


def rotation(set_bytes: int, min_input_bytes: int, cache: tuple[int, str], budget_bytes: int,
             min_sets: int = 2, max_sets: int = 1024) -> Rotation:
    """How many buffer sets to rotate: the lightest direction's inputs over all sets reach twice the cache."""
    cache_bytes, source = cache
    need = math.ceil(2 * cache_bytes / max(min_input_bytes, 1))
    count = min(max(min_sets, need), max_sets)
    if count * set_bytes > budget_bytes:
        count = max(1, budget_bytes // max(set_bytes, 1))
    return Rotation(int(count), set_bytes, min_input_bytes, cache_bytes, source)
