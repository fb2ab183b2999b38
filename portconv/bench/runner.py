"""The benchmark run: every row x (PyTorch variants, portconv backends) x direction, timed, checked, rooflined."""
from __future__ import annotations

import dataclasses
import datetime
import math
import sys
from collections.abc import Callable, Sequence

from .. import backends as _backends
from .. import functional
from ..backends import BackendId
from ..errors import BackendUnavailable, ConvError, Unsupported
from ..planner import tune
from . import data, roofline, settings, timing
from .report import summary
from .suite import DIRECTIONS, MASKS, Row

# ||out - ref|| / ||ref|| allowed against PyTorch's IEEE result in the row's dtype (a flag in the report, no stop)
INTERLEAVE_TURN = 5  # Note [interleaved entries] (timing.measure_interleaved): timed runs a turn
CHECK_LIMITS = {"float64": 1e-10, "float32": 1e-4, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}


@dataclasses.dataclass
class Options:
    runs: int = 50
    min_runs: int = 5
    warmup: int | None = None  # None: 10 on a GPU, 2 on a CPU
    warmup_s: float = 0.05  # and at least this long
    budget_s: float | None = 10.0  # per (entry, direction); None: always `runs`
    directions: tuple[str, ...] = DIRECTIONS
    backends: Sequence[str] | None = None  # None: every available backend plus 'auto'
    device: str | None = None  # torch device (default cuda when torch has one, else cpu)
    torch_variants: bool = True  # on CUDA: also IEEE float32 and cudnn.benchmark on
    peaks: bool | dict = True  # True: measured (cached); False: no roofline; a dict: these peaks
    remeasure_peaks: bool = False
    check: bool = True
    interleave: bool = True  # Note [interleaved entries]: torch-tensor entries (not cudnn.benchmark ones) in turns
    hold_stream: bool = False  # Note [held stream] (timing.CudaClock): CUDA device time without the launch cost
    seed: int = 0
    log: Callable[[str], None] | None = None
    on_row: Callable[[dict], None] | None = None  # called with the partial report after each row


@dataclasses.dataclass(frozen=True)
class Entry:
    label: str  # 'torch', 'torch+benchmark', 'torch-ieee', 'torch-ieee+benchmark', a backend id, 'auto'
    kind: str  # 'torch' or 'portconv'
    backend: str | None = None  # portconv backend id; None with kind 'portconv' = portconv's automatic plan
    benchmark: bool | None = None
    ieee: bool = False
    tuned: bool = False  # 'auto+tune': the automatic plan made under portconv.tune() (timed candidates, persisted)

    @property
    def data_kind(self) -> str:
        return "opencl" if self.backend == "opencl" else "torch"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def availability() -> list[dict]:
    out = []
    for bid in _backends.all_ids():
        try:
            a = _backends.get(bid).probe()
            ok, why = a.ok, a.reason
        except Exception as e:  # noqa: BLE001 - a probe must not raise; if it does, the report says so
            ok, why = False, f"probe raised {type(e).__name__}: {e}"
        out.append({"backend": str(bid), "available": ok, "reason": why})
    return out


# Note [benchmark entries last]: PyTorch's cuDNN plan cache (benchmark_cache in aten/src/ATen/native/cudnn/
# Conv_v8.cpp) is keyed without the benchmark flag, and a cudnn.benchmark call stores the plan it found there: every
# later call of that shape in the process runs it, benchmark on or off. Measured on the H100 (deepbench-b1-3x3
# forward, scripts/gpu/cudnn_cache_order.py): defaults 0.048 ms, then benchmark 0.072 ms, then defaults again 0.074
# ms. So the entries that run with cudnn.benchmark on time last in each row; the others (the torch defaults and every
# portconv entry, which reaches cuDNN with torch's settings as found) all meet the plan the defaults chose.
def entries_for(names: Sequence[str] | None, avail: list[dict], device, variants: bool) -> list[Entry]:
    """The torch baselines with cudnn.benchmark off, the requested portconv backends (default: every available one
    plus 'auto'), then the baselines with cudnn.benchmark on (Note [benchmark entries last])."""
    cuda = device.type == "cuda" and variants
    out = [Entry("torch", "torch")] + ([Entry("torch-ieee", "torch", ieee=True)] if cuda else [])
    last = ([Entry("torch+benchmark", "torch", benchmark=True),
             Entry("torch-ieee+benchmark", "torch", benchmark=True, ieee=True)] if cuda else [])
    ok = [a["backend"] for a in avail if a["available"]]
    if names is None:
        chosen = ok + ["auto"]
    else:
        chosen = []
        for n in names:
            n = n.strip().lower()
            if n in ("torch", ""):
                continue
            if n == "all":
                chosen += ok + ["auto"]
            elif n in ("auto", "auto+tune"):
                chosen.append(n)
            else:
                chosen.append(str(BackendId.parse(n)))  # ValueError names the known ones
    seen = []
    for n in chosen:
        if n not in seen:
            seen.append(n)
    ours = [Entry(n, "portconv", None if n.startswith("auto") else n, tuned=n == "auto+tune") for n in seen]
    return out + ours + last


def _clean_reason(e: BaseException) -> str:
    text = str(e)
    marker = "cannot run this problem: "
    if marker in text:
        text = text.split(marker, 1)[1]
    return text.split("\n  problem:")[0].strip()


class _Calls:
    """The three directions as functions of one BufferSet, for PyTorch (aten ops) or a portconv plan."""

    def __init__(self, row: Row, plan=None):
        self.row, self.plan = row, plan
        self.p = row.case.params

    def _pad(self, x):
        if not any(self.p.padding_extra):
            return x
        import torch.nn.functional as F

        pads = []
        for e in reversed(self.p.padding_extra):
            pads += [0, e]
        return F.pad(x, pads)

    def get(self, direction: str):
        import torch

        aten, a, plan = torch.ops.aten, self.p.as_aten(), self.plan
        if plan is not None:
            if direction == "fwd":
                return lambda s: plan.forward(s.input, s.weight, s.bias)
            mask, pick = MASKS[direction], 0 if direction == "bwd-data" else 1
            return lambda s: plan.backward(s.grad_output, s.input, s.weight, mask)[pick]
        # Note [PyTorch's fastest binding]: torch.convolution and the .default overload, positional, as the aten
        # backend calls them; torch.ops.aten.convolution with keywords costs ~10 us more of host time a call (H100),
        # which would show as a 'speed-up' of any backend over the same cuDNN kernels
        pos = (a["stride"], a["padding"], a["dilation"], a["transposed"], a["output_padding"], a["groups"])
        if direction == "fwd":
            conv = torch.convolution
            return lambda s: conv(self._pad(s.input), s.weight, s.bias, *pos)
        mask, pick = list(MASKS[direction]), 0 if direction == "bwd-data" else 1
        sizes, op = [self.row.case.k], aten.convolution_backward.default

        def back(s):
            r = op(s.grad_output, self._pad(s.input), s.weight, sizes, *pos, mask)
            g = r[pick]
            if pick == 0 and any(self.p.padding_extra):
                g = g[(slice(None), slice(None)) + tuple(slice(0, n) for n in s.input.shape[2:])]
            return g
        return back


def check(out, ref, limit: float) -> dict:
    """||out - ref|| / ||ref|| in float64 (NaN never passes)."""
    import torch

    o = data.to_torch(out, ref.device)
    if tuple(o.shape) != tuple(ref.shape):
        return {"ok": False, "rel_err": None, "limit": limit, "error": f"shape {list(o.shape)} != {list(ref.shape)}"}
    o, r = o.to(torch.float64), ref.to(torch.float64)
    rel = float((o - r).norm() / r.norm())
    return {"ok": bool(math.isfinite(rel) and rel <= limit), "rel_err": rel, "limit": limit}


class _Run:
    """State shared by the rows of one run: devices, clocks, the OpenCL queue, peaks."""

    def __init__(self, opts: Options):
        import torch

        self.opts = opts
        self.log = opts.log or (lambda m: None)
        self.device = torch.device(opts.device) if opts.device else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        gpu = self.device.type == "cuda"
        self.clock = timing.CudaClock(self.device, opts.hold_stream) if gpu else timing.WallClock()
        self.cache = timing.cuda_cache_bytes(self.device) if gpu else timing.cpu_cache_bytes()
        self.budget = timing.memory_budget(self.device.type, self.device)
        self.tf32 = settings.conv_tf32_default() if gpu else (False, "no TF32 on the CPU")
        self.avail = availability()
        self.entries = entries_for(opts.backends, self.avail, self.device, opts.torch_variants)
        self.cl = None  # (queue, clock, cache, DeviceInfo, is_gpu) once an OpenCL entry needs it

    def available(self, entry: Entry) -> bool:
        if entry.kind != "portconv" or entry.backend is None:
            return True
        return next(a["available"] for a in self.avail if a["backend"] == entry.backend)

    def probe_reason(self, entry: Entry) -> str:
        return next(a["reason"] for a in self.avail if a["backend"] == entry.backend)

    def warmup(self, gpu: bool) -> int:
        return self.opts.warmup if self.opts.warmup is not None else (10 if gpu else 2)

    def opencl(self):
        if self.cl is None:
            from ..backends.opencl import runtime as rt

            p, d = rt.default_index()  # raises Unsupported with the reason
            dev = next(e[2] for e in rt.all_devices() if (e[0], e[1]) == (p, d))
            mod = rt.cl()
            ctx = mod.Context([dev])
            queue = mod.CommandQueue(ctx, dev, properties=mod.command_queue_properties.PROFILING_ENABLE)
            is_gpu = bool(dev.type & mod.device_type.GPU)
            self.cl = (queue, timing.OpenCLClock(queue), timing.opencl_cache_bytes(dev), rt.info(p, d), is_gpu)
        return self.cl

    def same_device(self, entry: Entry) -> bool:
        """Does the entry run on the device the peaks were measured on (an OpenCL GPU beside a CUDA device)?"""
        if entry.data_kind != "opencl" or self.cl is None:
            return True
        return self.cl[4] == (self.device.type == "cuda")


def _math_of(run: _Run, entry: Entry, plan, dtype: str) -> str:
    if entry.kind == "torch":
        tf32 = dtype == "float32" and run.device.type == "cuda" and run.tf32[0] and not entry.ieee
        return "tf32" if tf32 else "ieee" if dtype in ("float32", "float64") else "fp32-accumulate"
    return plan.math if plan is not None else "ieee"


def run_row(run: _Run, row: Row, pk: dict | None) -> dict:
    import torch

    o, case, dtype = run.opts, row.case, row.dtype
    lay = data.plan_layout(case, dtype)
    min_in = min(roofline.input_bytes(case, dtype, d) for d in o.directions)
    rot = timing.rotation(lay.set_bytes, min_in, run.cache, run.budget)
    want_cl = any(e.data_kind == "opencl" and run.available(e) for e in run.entries)
    rot_cl, cl_reason = None, None
    if want_cl:
        try:
            queue, _, cl_cache, _, cl_gpu = run.opencl()
            budget = run.budget if cl_gpu == (run.device.type == "cuda") else 1 << 30
            rot_cl = timing.rotation(lay.set_bytes, min_in, cl_cache, timing.opencl_budget(budget, queue.device))
        except Unsupported as e:
            cl_reason = e.reason
    flat = data.host_random(lay, max(rot.sets, rot_cl.sets if rot_cl else 0), data.row_seed(row.name, o.seed))
    tsets = data.torch_sets(lay, flat, rot.sets, run.device)
    flop = roofline.flops(case)
    out = {**row.as_dict(), "flops": flop, "rotation": rot.as_dict(),
           "rotation_opencl": rot_cl.as_dict() if rot_cl else None, "directions": {}, "results": {}}
    default_key = roofline.peak_key(dtype, "tf32" if run.tf32[0] and run.device.type == "cuda" else "ieee")
    for d in o.directions:
        nbytes = roofline.min_bytes(case, dtype, d)
        out["directions"][d] = {"bytes": nbytes, "peak": default_key,
                                **roofline.floor(flop, nbytes, *roofline.peak_values(pk, default_key))}
    refs = {}
    if o.check:
        with settings.torch_variant(ieee=run.device.type == "cuda"), torch.no_grad():
            calls = _Calls(row)
            refs = {d: calls.get(d)(tsets[0]) for d in o.directions}
    clsets, group = None, []  # group: Note [interleaved entries] (timing.measure_interleaved)
    for entry in run.entries:
        if entry.benchmark and group:  # Note [benchmark entries last]: after the interleaved ones too
            _time_entries(run, row, group, tsets, run.clock, run.device.type == "cuda", refs, pk)
            group = []
        res = out["results"][entry.label] = {"kind": entry.kind, "status": "ok", "directions": {}}
        if entry.ieee and dtype != "float32":
            res.update(status="skipped", reason="the same as torch: the IEEE/TF32 choice concerns float32 only")
            continue
        if not run.available(entry):
            res.update(status="unavailable", reason=run.probe_reason(entry))
            continue
        if entry.data_kind == "opencl":
            if cl_reason:
                res.update(status="unsupported", reason=cl_reason)
                continue
            if clsets is None:
                try:
                    clsets = data.opencl_sets(lay, flat, rot_cl.sets, run.cl[0])
                except Unsupported as e:
                    clsets = e
            if isinstance(clsets, Unsupported):
                res.update(status="unsupported", reason=clsets.reason)
                continue
            sets, clock, gpu = clsets, run.cl[1], run.cl[4]
        else:
            sets, clock, gpu = tsets, run.clock, run.device.type == "cuda"
        prepared = _prepare_entry(run, row, entry, res, sets)
        if prepared is None:
            continue
        if o.interleave and entry.data_kind == "torch" and not entry.benchmark:
            group.append(prepared)
        else:
            _time_entries(run, row, [prepared], sets, clock, gpu, refs, pk)
    if group:
        _time_entries(run, row, group, tsets, run.clock, run.device.type == "cuda", refs, pk)
    del tsets, clsets, refs, flat, group
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    _derive(out, o.directions)
    return out


@dataclasses.dataclass
class _Prepared:
    """An entry ready to time: its result dict, its calls and the torch settings its calls run under."""

    entry: Entry
    res: dict
    calls: _Calls

    def context(self):
        e = self.entry
        return settings.torch_variant(e.benchmark, e.ieee) if e.kind == "torch" else _null()


def _prepare_entry(run: _Run, row: Row, entry: Entry, res: dict, sets) -> _Prepared | None:
    """The entry's plan (portconv entries; None with the reason in ``res`` when it cannot run), math, settings."""
    dtype, plan = row.dtype, None
    if entry.kind == "portconv":
        s0 = sets[0]
        try:
            with tune(entry.tuned):
                plan = functional.plan(s0.input, s0.weight, s0.bias, **row.case.conv_args(), backend=entry.backend)
        except (BackendUnavailable, Unsupported, ConvError) as e:
            res.update(status="unsupported", reason=_clean_reason(e))
            return None
        res["plan"] = plan.as_dict()
        res["backend"] = str(plan.backend)
    res["math"] = _math_of(run, entry, plan, dtype)
    res["same_device_as_peaks"] = run.same_device(entry)
    p = _Prepared(entry, res, _Calls(row, plan))
    if entry.kind == "torch":
        with p.context() as said:
            res["settings"] = said
    return p


def _time_entries(run: _Run, row: Row, group: list[_Prepared], sets, clock, gpu: bool, refs: dict, pk) -> None:
    """Time every direction of the entries in ``group`` (one entry: alone; several: in turns, Note [interleaved
    entries]) and fill their cells: median and samples, correctness check, floor and efficiency."""
    import torch

    o, case, dtype = run.opts, row.case, row.dtype
    for d in o.directions:
        members = [(p.calls.get(d), p.context) for p in group]
        with torch.no_grad():
            ms = timing.measure_interleaved(clock, members, sets, turn_runs=INTERLEAVE_TURN if len(group) > 1 else None,
                                            runs=o.runs, warmup=run.warmup(gpu), min_runs=o.min_runs,
                                            budget_s=o.budget_s, warmup_s=o.warmup_s)
        for p, m in zip(group, ms):
            res, label = p.res, p.entry.label
            cell = res["directions"][d] = {}
            if isinstance(m, BaseException):  # a failing kernel is reported in its cell, the run goes on
                cell.update(status="error", error=f"{type(m).__name__}: {m}")
                res["status"] = "error"
                run.log(f"  {row.name} {label} {d}: {type(m).__name__}: {m}")
                continue
            cell.update(status="ok", **m.as_dict())
            if len(group) > 1:
                cell["interleaved_with"] = [q.entry.label for q in group if q is not p]
            if d in refs:
                limit = CHECK_LIMITS[roofline.peak_key(dtype, res["math"])]
                cell["check"] = check(m.first_output, refs[d], limit)
            key = roofline.peak_key(dtype, res["math"])
            nbytes = roofline.min_bytes(case, dtype, d)
            fl = roofline.floor(roofline.flops(case), nbytes, *roofline.peak_values(pk, key))
            if res["same_device_as_peaks"] and fl["floor_ms"]:
                cell["floor_ms"], cell["bound"] = fl["floor_ms"], fl["bound"]
                cell["efficiency"] = roofline.efficiency(fl["floor_ms"], m.stats.median)
            run.log(f"  {row.name:<24} {label:<22} {d:<10} median {m.stats.median:10.4f} ms "
                    f"({m.stats.runs} runs)" + ("" if cell.get("check", {}).get("ok", True) else "  CHECK FAILED"))
    for p in group:
        p.res["timing"] = clock.method  # after the cells: an OpenCL clock may have fallen back to the wall clock


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _median(res: dict, d: str) -> float | None:
    c = res.get("directions", {}).get(d)
    return c["median_ms"] if c and c.get("status") == "ok" else None


def _derive(out: dict, directions: Sequence[str]) -> None:
    """Sums, 'torch-best' (best of cudnn.benchmark off/on), speed-ups vs torch and torch-best, sum efficiency."""
    results = out["results"]
    if "torch+benchmark" in results:
        best = {"kind": "torch", "status": "ok", "derived": "per direction, the faster of torch and "
                "torch+benchmark", "math": results["torch"].get("math"), "directions": {}}
        for d in directions:
            pair = [(m, k) for k in ("torch", "torch+benchmark") if (m := _median(results[k], d)) is not None]
            if pair:
                m, k = min(pair)
                best["directions"][d] = {"status": "ok", "median_ms": m, "from": k}
        results["torch-best"] = best
    sum_dirs = list(directions) if len(directions) > 1 else []
    floor_sum = None
    if sum_dirs and all(out["directions"][d].get("floor_ms") for d in sum_dirs):
        floor_sum = sum(out["directions"][d]["floor_ms"] for d in sum_dirs)
    for res in results.values():
        meds = [_median(res, d) for d in sum_dirs]
        if sum_dirs and all(m is not None for m in meds):
            res["sum_ms"] = sum(meds)
            if floor_sum and res.get("same_device_as_peaks", True) and "derived" not in res:
                res["sum_efficiency"] = floor_sum / res["sum_ms"]
    for base in ("torch", "torch-best"):
        if base not in results:
            continue
        for res in results.values():
            sp = res.setdefault("speedup_vs_" + base.replace("-", "_"), {})
            for d in directions:
                m, b = _median(res, d), _median(results[base], d)
                if m and b:
                    sp[d] = b / m
            if res.get("sum_ms") and results[base].get("sum_ms"):
                sp["sum"] = results[base]["sum_ms"] / res["sum_ms"]


def run(rows: list[Row], opts: Options | None = None) -> dict:
    """Benchmark ``rows``; returns the whole report (the JSON written by --out)."""
    opts = opts or Options()
    r = _Run(opts)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = settings.loadavg()
    with settings.no_poison() as poison_was:
        pk = None
        if isinstance(opts.peaks, dict):
            pk = opts.peaks
        elif opts.peaks:
            keys = sorted({row.dtype for row in rows} | ({"tf32"} if r.device.type == "cuda" and any(
                row.dtype == "float32" for row in rows) else set()))
            pk = roofline.peaks(r.device, keys, opts.remeasure_peaks, log=r.log)
        out_rows = []
        for i, row in enumerate(rows):
            r.log(f"[{i + 1}/{len(rows)}] {row.name}: {row.describe()}")
            out_rows.append(run_row(r, row, pk))
            if opts.on_row is not None and i + 1 < len(rows):
                opts.on_row(_report(r, opts, started, load_before, poison_was, pk, out_rows, len(rows)))
    return _report(r, opts, started, load_before, poison_was, pk, out_rows, len(rows))


def _report(r: _Run, opts: Options, started, load_before, poison_was, pk, out_rows, planned: int) -> dict:
    return {
        "format": "portconv-bench/1", "started": started.isoformat(timespec="seconds"),
        "seconds": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
        "complete": len(out_rows) == planned, "rows_planned": planned,
        "device": _device_info(r), "environment": {**settings.environment(), "loadavg_before": load_before},
        "settings": {"runs": opts.runs, "min_runs": opts.min_runs, "warmup": r.warmup(r.device.type == "cuda"),
                     "warmup_s": opts.warmup_s,
                     "budget_s_per_cell": opts.budget_s, "directions": list(opts.directions), "seed": opts.seed,
                     "check": opts.check, "check_limits": CHECK_LIMITS, "torch_variants": opts.torch_variants,
                     "conv_tf32_default": {"tf32": r.tf32[0], "why": r.tf32[1]},
                     "poison_was_set": poison_was, "entries": [e.label for e in r.entries],
                     "interleave_turn_runs": INTERLEAVE_TURN if opts.interleave else None,
                     "hold_stream": opts.hold_stream and r.device.type == "cuda",
                     "hold_failures": getattr(r.clock, "hold_failures", 0)},
        "backends": r.avail, "peaks": pk, "rows": out_rows, "summary": summary(out_rows, opts.directions)}


def _device_info(r: _Run) -> dict:
    import torch

    from ..device import from_torch_cuda, host_cpu

    info = (from_torch_cuda(r.device.index) if r.device.type == "cuda" else host_cpu()).as_dict()
    if r.device.type == "cpu":
        info["name"] = roofline.cpu_name()
    info.update(torch_device=str(r.device), cache_bytes=r.cache[0], cache_source=r.cache[1],
                rotation_budget_bytes=r.budget)
    if r.device.type == "cpu":
        info["torch_threads"] = torch.get_num_threads()
    if r.cl is not None:
        info["opencl"] = r.cl[3].as_dict()
        info["opencl"].update(cache_bytes=r.cl[2][0], is_gpu=r.cl[4])
    return info
