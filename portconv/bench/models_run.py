"""The model benchmark's run: each cell's sides timed in turns, their losses compared, the report, resuming one."""
from __future__ import annotations

import datetime
import time

from .. import native
from . import models, settings, timing


def run_cell(spec: models.ModelSpec, dtype: str, layout: str, mode: str, opts: models.Options, bases: models.Bases,
             device, clock, log) -> dict:
    """Both sides' training steps of one (model, dtype, layout, mode), timed in turns; losses compared."""
    import torch

    fmt = models.memory_format(layout, spec)
    batch = opts.batch_of(spec)
    cell = {"model": spec.name, "dtype": dtype, "layout": layout, "memory_format": str(fmt).replace("torch.", ""),
            "mode": mode, "batch": batch, "input_shape": [batch, *spec.sample], "status": "done", "sides": {}}
    if mode == "compile":
        cell["compile_backend"] = opts.compile_backend
        torch._dynamo.reset()  # each cell compiles afresh: the same forward code would otherwise hit recompile limits
    try:
        base, cell["dropout_modules_disabled"] = bases.get(spec)
        data = models.batches(spec, batch, device, fmt, opts.seed)
    except Exception as e:  # noqa: BLE001
        cell.update(status="error", error=models.error_text(e))
        log(f"  {models.key(cell)}: {cell['error']}")
        return cell
    members, host = [], {}
    for side in ("torch", *opts.backends):
        res = cell["sides"][side] = {"status": "ok"}
        try:
            call, opt = models.build_side(base, side, device, fmt, mode, opts)
        except Exception as e:  # noqa: BLE001 - this side fails, the others run
            res.update(status="error", error=models.error_text(e))
            log(f"  {models.key(cell)} {side}: {res['error']}")
            continue
        losses, host[side] = [], []
        members.append((side, models.make_step(call, opt, data, spec, dtype, device, losses, host[side]), losses))
    firsts = loss_phase(cell, members, opts, device, log)
    if opts.loss_f64 and dtype == "float32" and firsts:
        cell["float64_losses"] = float64_losses(base, spec, data, fmt, opts, device, log)
    members = [m for m in members if m[0] in firsts]
    native.wait()  # Note [native executor]: the timed steps are the steady state, once its build (if any) is done
    cell["native"] = native.status()
    timed = _TimedHost(clock, host)  # Note [host phases]: the timed steps' phases
    ms = timing.measure_interleaved(timed, [(m[1], None) for m in members], [None],
                                    turn_runs=models.TURN if len(members) > 1 else None, runs=opts.steps,
                                    warmup=opts.warmup, min_runs=opts.steps, budget_s=None, warmup_s=0.0)
    for (side, _, losses), m in zip(members, ms):
        res = cell["sides"][side]
        if isinstance(m, BaseException):
            res.update(status="error", error=models.error_text(m))
            log(f"  {models.key(cell)} {side}: {res['error']}")
            continue
        curve = torch.stack(losses).float().cpu().tolist() if losses else []
        at = min(opts.loss_steps, len(curve))
        res.update(median_ms=m.stats.median, p10_ms=m.stats.p10, p90_ms=m.stats.p90, mean_ms=m.stats.mean,
                   runs=m.stats.runs, first_step_in_process_ms=firsts[side], warmup_steps=m.warmup,
                   steps_taken=len(curve), loss_step=at, loss=curve[at - 1] if at else None, losses=curve,
                   samples_ms=list(m.samples_ms), timing=m.method, host_ms=host_medians(timed.phases[side]))
        if len(members) > 1:
            res["interleaved_with"] = [s for s, _, _ in members if s != side]
        log(f"  {models.key(cell):<44} {side:<8} median {m.stats.median:9.3f} ms  first "
            f"{firsts[side] / 1e3:7.2f} s  loss@{at} {res['loss']}")
    del members, ms, data
    compare(cell, opts)
    if mode == "compile":
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return cell


# Note [loss phase]
# Before the timed steps each side alone takes the cell's first loss_steps steps in deterministic mode
# (models.deterministic), from the same init on the same batches: the losses compared are then those of one
# function computed twice, not of cuDNN's run-to-run atomics (float32 losses of identical cuDNN kernels differed by
# up to 5.9e-3 after 13 steps without it, H100). The first of these steps is the side's first step in this process.
# The timed steps continue from there in the default (fast) mode. With --loss-float64 a float32 cell also takes the
# steps with PyTorch's model in float64 (float64_losses): float32 training drifts from it by rounding alone, and the
# drift of PyTorch's own float32 step is the scale a portconv side's difference from PyTorch's is read against
# (mobilenet_v2 on an H100, 20 steps: PyTorch 2.3e-3 from float64, portconv 1.5e-3, the two 8.2e-4 apart).
def loss_phase(cell: dict, members: list, opts: models.Options, device, log) -> dict[str, float]:
    """Each side's loss steps (Note [loss phase]); {side: its first step's wall time in ms} for the sides that ran."""
    import torch

    firsts = {}
    for side, step, _ in members:
        try:
            with models.deterministic(device):
                for k in range(max(1, opts.loss_steps)):
                    t0 = time.perf_counter()
                    step(None)
                    if k == 0:
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        firsts[side] = (time.perf_counter() - t0) * 1e3
        except Exception as e:  # noqa: BLE001 - this side fails, the others run
            cell["sides"][side].update(status="error", error=models.error_text(e))
            log(f"  {models.key(cell)} {side}: {cell['sides'][side]['error']}")
            firsts.pop(side, None)
    return firsts


class _TimedHost:
    """Note [host phases]: the clock of a cell's timed runs, keeping the host phases of the steps it times (the
    warm-up and lead-in steps run outside its samples()); ``host``: the side's phase lists each step appends to."""

    def __init__(self, clock, host: dict[str, list]):
        self.clock, self.host = clock, host
        self.phases: dict[str, list] = {side: [] for side in host}

    def samples(self, call, args) -> list[float]:
        before = {side: len(h) for side, h in self.host.items()}
        out = self.clock.samples(call, args)
        for side, h in self.host.items():
            self.phases[side] += h[before[side]:]
        return out

    def __getattr__(self, name):
        return getattr(self.clock, name)


def host_medians(phases: list[tuple]) -> dict[str, float] | None:
    """Note [host phases]: the median ms of each phase over the steps taken (None: none)."""
    import statistics

    if not phases:
        return None
    return {name: statistics.median(p[k] for p in phases) * 1e3 for k, name in enumerate(models.HOST_PHASES)}


def float64_losses(base, spec: models.ModelSpec, data: list, fmt, opts: models.Options, device, log) -> list:
    """Note [loss phase]: PyTorch's model in float64 through the same loss steps (eager, deterministic mode), from
    the same init on the same batches in float64; [] where it fails (logged)."""
    import copy

    import torch

    try:
        model = copy.deepcopy(base).to(device).double().to(memory_format=fmt).train()
        opt = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
        data64 = [(x.double(), y.double() if y.is_floating_point() else y) for x, y in data]
        losses: list = []
        step = models.make_step(model, opt, data64, spec, "float64", device, losses)
        with models.deterministic(device):
            for _ in range(max(1, opts.loss_steps)):
                step(None)
        return torch.stack(losses).cpu().tolist()
    except Exception as e:  # noqa: BLE001 - the reference is extra evidence; the cell stands without it
        log(f"  float64 reference: {models.error_text(e)}")
        return []


def compare(cell: dict, opts: models.Options) -> None:
    """Per portconv side: PyTorch's median / its median, and its loss against PyTorch's at the same step."""
    ref = cell["sides"].get("torch", {})
    limit = models.LOSS_LIMITS["tf32" if cell["dtype"] == "float32" and opts.tf32 else cell["dtype"]]
    f64 = cell.get("float64_losses") or []
    for side, res in cell["sides"].items():
        if res.get("status") == "ok" and f64 and res.get("losses"):
            at = min(len(f64), len(res["losses"]), opts.loss_steps)
            res["loss_f64_rel_diff"] = abs(res["losses"][at - 1] - f64[at - 1]) / max(abs(f64[at - 1]), 1e-30)
        if side == "torch" or res.get("status") != "ok" or ref.get("status") != "ok":
            continue
        res["x_torch"] = ref["median_ms"] / res["median_ms"]
        n = min(len(ref["losses"]), len(res["losses"]), opts.loss_steps)
        if not n:
            continue
        rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(res["losses"][:n], ref["losses"][:n])]
        res.update(loss_rel_diff=rel[-1], loss_max_rel_diff=max(rel), loss_limit=limit,
                   loss_ok=bool(rel[-1] <= limit))  # NaN compares False: a NaN loss never passes
    if any(r.get("status") == "error" for r in cell["sides"].values()):
        cell["status"] = "error"


def plan_cells(specs: list[models.ModelSpec], opts: models.Options) -> list[tuple]:
    """(spec, dtype, layout, mode): eager cells first (cheap), then compiled ones (each compiles both sides)."""
    return [(s, d, lay, m) for m in opts.modes for s in specs for d in opts.dtypes for lay in opts.layouts]


def device_info(device) -> dict:
    import torch

    from ..device import from_torch_cuda, host_cpu
    from .roofline import cpu_name

    info = (from_torch_cuda(device.index) if device.type == "cuda" else host_cpu()).as_dict()
    if device.type == "cpu":
        info.update(name=cpu_name(), torch_threads=torch.get_num_threads())
    info["torch_device"] = str(device)
    return info


def run(specs: list[models.ModelSpec], opts: models.Options | None = None) -> dict:
    """Every (model, dtype, layout, mode) cell of ``specs``: the report as a dict (models.json)."""
    opts = opts or models.Options()
    log = opts.log or (lambda m: None)
    device = models.torch_device(opts.device)
    clock = timing.CudaClock(device) if device.type == "cuda" else timing.WallClock()
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    load_before, bases, cells = settings.loadavg(), models.Bases(opts.seed), []
    planned = plan_cells(specs, opts)

    def rep():
        return report(specs, opts, device, with_old(cells, opts.done), started, t0, load_before, said)
    with settings.no_poison(), models.precision(not opts.tf32, device) as said:
        for i, (spec, dtype, layout, mode) in enumerate(planned):
            k = "/".join((spec.name, dtype, layout, mode))
            old = opts.done.get(k, {})
            if old.get("status") == "done" and old.get("compile_backend") == (
                    opts.compile_backend if mode == "compile" else None):
                cells.append(old)
                continue
            if opts.budget_s is not None and time.perf_counter() - t0 > opts.budget_s:
                cells.append({**old, "model": spec.name, "dtype": dtype, "layout": layout, "mode": mode,
                              "status": "not run", "reason": f"--budget-seconds {opts.budget_s:g} was spent",
                              "sides": {}})
                continue
            log(f"[{i + 1}/{len(planned)}] {k} batch {opts.batch_of(spec)}")
            cell = run_cell(spec, dtype, layout, mode, opts, bases, device, clock, log)
            if "first_step" in old:  # measured by --first-step into the report this run resumes
                cell["first_step"] = old["first_step"]
            cells.append(cell)
            if opts.on_cell is not None:
                opts.on_cell(rep())
        return rep()


def with_old(cells: list[dict], old: dict) -> list[dict]:
    """``cells`` and then the cells of the resumed report that this run did not plan (kept as they were)."""
    have = {models.key(c) for c in cells}
    return cells + [c for k, c in old.items() if k not in have]


def report(specs, opts: models.Options, device, cells, started, t0, load_before, said) -> dict:
    return {
        "format": "portconv-bench-models/1", "started": started.isoformat(timespec="seconds"),
        "seconds": time.perf_counter() - t0,
        "complete": all(c["status"] != "not run" and c.get("first_step", {}).get("status") != "not run"
                        for c in cells),
        "device": device_info(device), "environment": {**settings.environment(), "loadavg_before": load_before},
        "settings": settings_of(specs, opts, said), "cells": cells}


def settings_of(specs, opts: models.Options, said=None) -> dict:
    """What a resumed run must share with the report it extends (resume_check compares these)."""
    return {"models": {s.name: {"batch": opts.batch_of(s), "sample": list(s.sample), "classes": s.classes}
                       for s in specs},
            "dtypes": list(opts.dtypes), "layouts": list(opts.layouts), "modes": list(opts.modes),
            "sides": ["torch", *opts.backends], "steps": opts.steps, "warmup": opts.warmup,
            "loss_steps": opts.loss_steps, "seed": opts.seed, "compile_backend": opts.compile_backend,
            "tf32": opts.tf32, "precision": said, "optimizer": f"SGD lr={opts.lr} momentum={opts.momentum}",
            "turn_steps": models.TURN, "loss_limits": models.LOSS_LIMITS}


RESUME_KEYS = ("sides", "steps", "warmup", "loss_steps", "seed", "tf32", "optimizer")  # the compile backend: per cell


def resume_check(old: dict, new_settings: dict, device_name: str) -> dict:
    """The cells of ``old`` by key, when it was made on this device with these settings; else ValueError."""
    if old.get("format") != "portconv-bench-models/1":
        raise ValueError(f"not a models report (format {old.get('format')!r})")
    if old["device"]["name"] != device_name:
        raise ValueError(f"the report was made on {old['device']['name']}, this is {device_name}")
    diff = [k for k in RESUME_KEYS if old["settings"].get(k) != new_settings.get(k)]
    diff += [f"batch of {m}" for m, v in new_settings["models"].items()
             if m in old["settings"]["models"] and old["settings"]["models"][m] != v]
    if diff:
        raise ValueError(f"the report was made with other settings ({', '.join(diff)}): use another --out")
    return {models.key(c): c for c in old["cells"]}  # run() reuses the done ones; failed and unrun cells run again
