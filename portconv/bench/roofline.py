"""Roofline: FLOPs and minimum bytes per direction, peaks measured once on the device (cached), floors."""
from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import time

from .. import knobs
from ..conformance.cases import Case
from .timing import Stats

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
PEAKS_VERSION = 2


# Note [bench FLOPs]: every direction of a convolution does the same multiply-adds: one per (batch, output
# channel, input channel of its group, kernel tap, position of the small side). For a normal convolution the
# small side is its output; a transposed convolution is the backward-data of the convolution that maps its
# output to its input, so there the positions are those of its input (the formula 2*N*K*(C/groups)*
# prod(kernel)*prod(output) of that underlying convolution). Taps over padding are counted, as is usual.
def flops(case: Case) -> int:
    """2 * N * K * (C / groups) * prod(kernel) * prod(output positions of the underlying convolution)."""
    small = case.spatial if case.transposed else case.output_shape[2:]
    return 2 * case.n * case.k * (case.c // case.groups) * math.prod(case.kernel) * math.prod(small)


def tensor_bytes(case: Case, dtype: str) -> dict[str, int]:
    it = ITEMSIZE[dtype]
    return {"input": math.prod(case.input_shape) * it, "weight": math.prod(case.weight_shape) * it,
            "output": math.prod(case.output_shape) * it, "bias": case.k * it if case.bias else 0}


def min_bytes(case: Case, dtype: str, direction: str) -> int:
    """Every input of the direction read once plus every output written once.

    fwd reads input, weight (and bias), writes output; bwd-data reads grad_output and weight, writes grad_input;
    bwd-weight reads input and grad_output, writes grad_weight (grad_bias is not requested).
    """
    b = tensor_bytes(case, dtype)
    if direction == "fwd":
        return b["input"] + b["weight"] + b["bias"] + b["output"]
    if direction == "bwd-data":
        return b["output"] + b["weight"] + b["input"]
    if direction == "bwd-weight":
        return b["input"] + b["output"] + b["weight"]
    raise ValueError(f"unknown direction {direction!r}")


def input_bytes(case: Case, dtype: str, direction: str) -> int:
    """Bytes one call reads (the part of min_bytes that buffer rotation must keep out of the cache)."""
    b = tensor_bytes(case, dtype)
    return {"fwd": b["input"] + b["weight"] + b["bias"], "bwd-data": b["output"] + b["weight"],
            "bwd-weight": b["input"] + b["output"]}[direction]


def peak_key(dtype: str, math_mode: str) -> str:
    """Which measured compute peak bounds a computation: 'tf32' when float32 ran on TF32, else its dtype."""
    return "tf32" if dtype == "float32" and math_mode == "tf32" else dtype


def floor(flop: int, nbytes: int, peak_flops: float | None, peak_bw: float | None) -> dict:
    """max(flops / peak_flops, bytes / peak_bandwidth) in ms, and which term bounds it."""
    t_c = flop / peak_flops * 1e3 if peak_flops else None
    t_m = nbytes / peak_bw * 1e3 if peak_bw else None
    if t_c is None and t_m is None:
        return {"floor_ms": None, "bound": None, "compute_ms": None, "memory_ms": None}
    if t_m is None or (t_c is not None and t_c >= t_m):
        bound, ms = "compute", t_c
    else:
        bound, ms = "memory", t_m
    return {"floor_ms": ms, "bound": bound, "compute_ms": t_c, "memory_ms": t_m}


def efficiency(floor_ms: float | None, measured_ms: float | None) -> float | None:
    if not floor_ms or not measured_ms:
        return None
    return floor_ms / measured_ms


# --- peaks: measured on the device, never datasheet numbers ----------------------------------------------
def _timer(device):
    import torch

    if device.type == "cuda":
        def run(fn, n):
            evs = []
            for _ in range(n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                evs.append((s, e))
            torch.cuda.synchronize(device)
            return [s.elapsed_time(e) for s, e in evs]
        return run

    def run(fn, n):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    return run


def measure_bandwidth(device, nbytes: int | None = None, runs: int | None = None) -> dict:
    """A large device-to-device copy (torch Tensor.copy_): bytes read plus bytes written over the median time."""
    import torch

    gpu = device.type == "cuda"
    if nbytes is None:
        nbytes = min(1 << 30, torch.cuda.get_device_properties(device).total_memory // 16) if gpu else 256 << 20
    runs = runs or (20 if gpu else 8)
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_(-1, 1)
    dst = torch.empty_like(src)
    run = _timer(device)
    run(lambda: dst.copy_(src), 2)
    st = Stats.of(run(lambda: dst.copy_(src), runs))
    moved = 2 * n * 4
    return {"bytes_per_s": moved / (st.min * 1e-3), "median_bytes_per_s": moved / (st.median * 1e-3),
            "method": f"Tensor.copy_ of {n * 4 >> 20} MiB float32 on {device}, (read + write) / best of {runs}",
            "stats": st.as_dict()}


def measure_matmul(device, key: str, size: int | None = None, runs: int | None = None) -> dict:
    """A large square matmul (torch.mm) in dtype ``key`` ('tf32' = float32 with TF32 allowed): 2*n^3 / median."""
    import torch

    from ..conformance.reference import torch_dtype

    gpu = device.type == "cuda"
    dtype = torch_dtype("float32" if key == "tf32" else key)
    if size is None:
        size = (8192 if key != "float64" else 4096) if gpu else (1024 if key in ("float32", "float64") else 512)
    runs = runs or (10 if gpu else 5)
    a = torch.empty(size, size, dtype=dtype, device=device).uniform_(-1, 1)
    b = torch.empty(size, size, dtype=dtype, device=device).uniform_(-1, 1)
    with _matmul_precision(torch, "tf32" if key == "tf32" else "ieee"):
        run = _timer(device)
        run(lambda: torch.mm(a, b), 2)
        st = Stats.of(run(lambda: torch.mm(a, b), runs))
    work = 2 * size ** 3
    return {"flops_per_s": work / (st.min * 1e-3), "median_flops_per_s": work / (st.median * 1e-3),
            "method": f"torch.mm {size}x{size} {key} on {device}, 2n^3 / best of {runs}", "stats": st.as_dict()}


class _matmul_precision:
    """Set torch's float32 matmul precision ('tf32' or 'ieee') inside the block and restore it after."""

    def __init__(self, torch, mode: str):
        self.torch, self.mode = torch, mode

    def __enter__(self):
        m = self.torch.backends.cuda.matmul
        self.new_api = hasattr(m, "fp32_precision")
        self.old = m.fp32_precision if self.new_api else m.allow_tf32
        if self.new_api:
            m.fp32_precision = self.mode
        else:
            m.allow_tf32 = self.mode == "tf32"

    def __exit__(self, *exc):
        m = self.torch.backends.cuda.matmul
        if self.new_api:
            m.fp32_precision = self.old
        else:
            m.allow_tf32 = self.old


def device_key(device) -> str:
    """Peaks are cached per physical device and software that moves them (name, torch, threads or driver)."""
    import torch

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"cuda:{p.name}|sm{p.major}{p.minor}|torch {torch.__version__}|cuda {torch.version.cuda}"
    return f"cpu:{cpu_name()}|{os.cpu_count()} cpus|{torch.get_num_threads()} threads|torch {torch.__version__}"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (platform.processor() is often just the architecture)."""
    import platform

    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # no /proc/cpuinfo: the name from platform stands
    return platform.processor() or platform.machine()


def peaks_path() -> pathlib.Path:
    return pathlib.Path(knobs.env().cache_dir) / "bench" / "peaks.json"


def peaks(device, keys, remeasure: bool = False, cache: pathlib.Path | None = None, log=None) -> dict:
    """Bandwidth and the compute peak of each key for ``device``: from the cache file, measuring what it lacks.

    Returns {"device_key", "bandwidth": {...}, "compute": {key: {...}}, "cache": path, "measured_now": [...]}.
    """
    path = cache or peaks_path()
    key = device_key(device)
    store = {}
    if path.is_file():
        try:
            store = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            store = {}  # an unreadable cache is measured again and rewritten
    if store.get("version") != PEAKS_VERSION:
        store = {"version": PEAKS_VERSION, "devices": {}}
    entry = {} if remeasure else dict(store["devices"].get(key, {}))
    entry.setdefault("compute", {})
    now = []
    if "bandwidth" not in entry:
        if log:
            log(f"measuring memory bandwidth on {device} (cached in {path})")
        entry["bandwidth"] = measure_bandwidth(device)
        now.append("bandwidth")
    for k in keys:
        if k not in entry["compute"]:
            if log:
                log(f"measuring {k} matmul peak on {device}")
            entry["compute"][k] = measure_matmul(device, k)
            now.append(k)
    busy = None
    if now:
        entry["measured"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        entry["loadavg_when_measured"] = round(load, 2)
        if device.type == "cpu" and load > (os.cpu_count() or 1):
            busy = (f"not cached: the host's load average was {load:.1f} on {os.cpu_count()} CPUs while measuring, "
                    f"so these CPU peaks are low; the next run measures them again")
            if log:
                log(f"peaks {busy}")
    if now and busy is None:
        store["devices"][key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(store, indent=1))
            os.replace(tmp, path)
        except OSError as e:  # a read-only cache directory: measured again next time
            if log:
                log(f"could not write the peaks cache {path}: {e}")
    return {"device_key": key, "cache": str(path), "measured_now": now, "not_cached": busy, **entry}


def peak_values(pk: dict | None, key: str) -> tuple[float | None, float | None]:
    """(flops/s of compute key, bytes/s) from a peaks() result; None where not measured."""
    if not pk:
        return None, None
    comp = pk.get("compute", {}).get(key)
    bw = pk.get("bandwidth")
    return (comp["flops_per_s"] if comp else None), (bw["bytes_per_s"] if bw else None)
