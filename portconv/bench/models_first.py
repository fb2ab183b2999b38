"""`portconv bench --models --first-step`: each side's first training step in fresh processes, cold then warm caches."""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from .. import knobs
from . import models, models_run, settings

MARK = "MODELS-JSON "
_CHILD = "import time; t0 = time.perf_counter(); from portconv.bench.models_first import child; child(t0)"


# Note [first step cold and warm]
# A side's first training step is timed in a fresh process, so nothing the other side or an earlier cell did (CUDA
# context, cuDNN handles, compiled kernels in memory) helps it: from the first call of the step to its end, after the
# process has imported torch and portconv, created the CUDA context, built the model and put it and the data on the
# device (those are reported apart: import_s, setup_s). Every cache a first step can fill lives in one temporary
# directory per (cell, side): portconv's (PORTCONV_CACHE_DIR: NVRTC modules, OpenCL binaries, tuning), inductor's and
# Triton's (compiled mode), CuPy's, PoCL's and the CUDA driver's JIT cache. The cold process starts with it empty;
# the warm one, the same command again, finds what the cold one left: PyTorch's side gets the same treatment, so its
# compiled mode is warm too. The step is the one the timed bench runs (same init, data, optimizer, precision).
def child_env(tmp: str) -> dict:
    caches = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"), ("CUPY_CACHE_DIR", "cupy"),
              ("POCL_CACHE_DIR", "pocl"), ("CUDA_CACHE_PATH", "cuda"))
    env = knobs.child_environ(os.path.join(tmp, "portconv"), **{var: os.path.join(tmp, sub) for var, sub in caches})
    # the child imports what this process imports (portconv from a checkout, a test module's model spec)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    paths = [root] + [os.path.abspath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + env.get("PYTHONPATH", "").split(os.pathsep)))
    return env


def _files(path: str) -> int:
    return sum(1 for p in pathlib.Path(path).rglob("*") if p.is_file()) if os.path.isdir(path) else 0


def first_step(spec: models.ModelSpec, dtype: str, layout: str, mode: str, side: str, opts: models.Options,
               timeout: float = 600) -> dict:
    """{'cold': {...}, 'warm': {...}}: the side's first (and second) step in two fresh processes sharing one cache
    directory, empty for the first (Note [first step cold and warm])."""
    args = {"model": spec.ref or spec.name, "dtype": dtype, "layout": layout, "mode": mode, "side": side,
            "batch": opts.batch_of(spec), "device": opts.device, "seed": opts.seed,
            "compile_backend": opts.compile_backend, "tf32": opts.tf32, "lr": opts.lr, "momentum": opts.momentum}
    out = {}
    with tempfile.TemporaryDirectory(prefix="portconv-first-step-") as tmp:
        env = child_env(tmp)
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], env=env, capture_output=True,
                                   text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                out[label] = {"error": f"timed out after {timeout:g} s"}
                continue
            line = next((s for s in reversed(p.stdout.splitlines()) if s.startswith(MARK)), None)
            if p.returncode != 0 or line is None:
                out[label] = {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-3000:]}"}
                continue
            out[label] = json.loads(line[len(MARK):])
            out[label].update(process_s=time.perf_counter() - t0,
                              portconv_cache_files=_files(env["PORTCONV_CACHE_DIR"]))
    return out


def child(t_start: float, argv: list[str] | None = None) -> None:
    """The fresh process: set up one side of one cell, time its first two steps, print MARK + JSON. ``t_start``: the
    clock before this module's import (import_s: torch and portconv's imports)."""
    a = json.loads((sys.argv[1:] if argv is None else argv)[0])
    import torch

    import portconv  # noqa: F401 - imported before the clock starts, as a user's script has

    out = {"import_s": time.perf_counter() - t_start}
    device = models.torch_device(a["device"])
    if device.type == "cuda":  # the CUDA context: not part of either side's first step
        torch.zeros(1, device=device).add_(1)
        torch.cuda.synchronize(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    spec = models.resolve(a["model"])
    is3d = spec.spatial == 3
    opts = models.Options(batch=None if is3d else a["batch"], batch_3d=a["batch"] if is3d else None, seed=a["seed"],
                          compile_backend=a["compile_backend"], tf32=a["tf32"], lr=a["lr"], momentum=a["momentum"])
    t0 = time.perf_counter()
    with settings.no_poison(), models.precision(not opts.tf32, device):
        base, _ = models.Bases(opts.seed).get(spec)
        fmt = models.memory_format(a["layout"], spec)
        data = models.batches(spec, opts.batch_of(spec), device, fmt, opts.seed)
        if a["mode"] == "compile":
            torch._dynamo.reset()
        call, opt = models.build_side(base, a["side"], device, fmt, a["mode"], opts)
        losses: list = []
        step = models.make_step(call, opt, data, spec, a["dtype"], device, losses)
        sync()
        out["setup_s"] = time.perf_counter() - t0
        for name in ("first_step_ms", "second_step_ms"):
            t0 = time.perf_counter()
            step(None)
            sync()
            out[name] = (time.perf_counter() - t0) * 1e3
    out["losses"] = torch.stack(losses).float().cpu().tolist()
    try:
        from portconv.backends.simt import compile as _simt

        events = _simt.compile_events()
        out["modules_compiled"] = sum(1 for e in events if e.how != "disk")  # NVRTC / hiprtc in this process
        out["modules_from_disk"] = sum(1 for e in events if e.how == "disk")
        out["module_seconds"] = sum(e.seconds for e in events)
    except (ImportError, AttributeError):
        pass
    print(MARK + json.dumps(out), flush=True)


def run_first(specs: list[models.ModelSpec], opts: models.Options, timeout: float = 600) -> dict:
    """--first-step over every planned cell and side; merged into the resumed report's cells (opts.done)."""
    log = opts.log or (lambda m: None)
    device = models.torch_device(opts.device)
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    load_before, cells = settings.loadavg(), []
    planned = models_run.plan_cells(specs, opts)
    with models.precision(not opts.tf32, device) as said:  # what the children set, for the report
        pass
    for i, (spec, dtype, layout, mode) in enumerate(planned):
        k = "/".join((spec.name, dtype, layout, mode))
        cell = dict(opts.done.get(k) or {"model": spec.name, "dtype": dtype, "layout": layout, "mode": mode,
                                         "batch": opts.batch_of(spec), "status": "first step only", "sides": {}})
        fs = cell["first_step"] = dict(cell.get("first_step", {}), status="done")
        fs["sides"] = dict(fs.get("sides", {}))
        cells.append(cell)
        for side in ("torch", *opts.backends):
            have = fs["sides"].get(side, {})
            if have and all("error" not in have.get(x, {"error": 1}) for x in ("cold", "warm")):
                continue
            if opts.budget_s is not None and time.perf_counter() - t0 > opts.budget_s:
                fs.update(status="not run", reason=f"--budget-seconds {opts.budget_s:g} was spent")
                break
            log(f"[{i + 1}/{len(planned)}] first step {k} {side}")
            fs["sides"][side] = got = first_step(spec, dtype, layout, mode, side, opts, timeout)
            for label, r in got.items():
                log(f"  {label}: " + (r["error"].splitlines()[-1][:300] if "error" in r else
                                      f"first step {r['first_step_ms'] / 1e3:.2f} s, second {r['second_step_ms']:.1f} "
                                      f"ms, process {r['process_s']:.1f} s"))
        if opts.on_cell is not None:
            opts.on_cell(models_run.report(specs, opts, device, models_run.with_old(cells, opts.done), started, t0,
                                       load_before, said))
    return models_run.report(specs, opts, device, models_run.with_old(cells, opts.done), started, t0, load_before, said)
