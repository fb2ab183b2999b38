"""`portconv bench --models`: its flags (on the bench parser) and its main()."""
from __future__ import annotations

import json
import pathlib
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_flags(p) -> None:
    """The model benchmark's flags; --backend, --device, --warmup, --out, --seed and --quiet are the bench's own."""
    g = p.add_argument_group(
        "model benchmark (--models): a training step of whole models, PyTorch against portconv.convert() of the same "
        "model; --backend names the portconv sides (default auto; torch-copy: PyTorch's model again, a control), "
        "--warmup the untimed steps (default 3)")
    g.add_argument("--models", nargs="?", const="all", default=None, metavar="LIST",
                   help="time training steps of these models (comma-separated; no value or 'all': mobilenet_v2, "
                        "efficientnet_b0, convnext_tiny, resnet50, r3d_18, autoencoder; 'module:attr' names a "
                        "portconv.bench.models.ModelSpec of your own)")
    g.add_argument("--dtypes", default=None, help="float32,bfloat16 (AMP); default both (--first-step: float32)")
    g.add_argument("--layouts", default=None,
                   help="nchw,channels_last (channels_last_3d for 3-D models); default both (--first-step: nchw)")
    g.add_argument("--modes", default=None, help="eager,compile (torch.compile); default both (--first-step: eager)")
    g.add_argument("--steps", type=int, default=20, help="timed steps per side and cell (default 20)")
    g.add_argument("--batch", type=int, default=None, help="batch of the 2-D models (default 64)")
    g.add_argument("--batch-3d", type=int, default=None, help="batch of the 3-D models (r3d_18; default 8)")
    g.add_argument("--loss-steps", type=int, default=20,
                   help="compare the losses after this many steps (or the last step taken; default 20)")
    g.add_argument("--loss-float64", action="store_true",
                   help="float32 cells: PyTorch's model in float64 also takes the loss steps (same init and batches); "
                        "each side's loss is reported against it too")
    g.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    g.add_argument("--allow-tf32", action="store_true",
                   help="keep torch's TF32 settings (default: IEEE float32 convolutions and matmuls on both sides)")
    g.add_argument("--first-step", action="store_true",
                   help="time nothing else: each side's first step in two fresh processes, empty caches then the "
                        "caches the first left (cold / warm)")
    g.add_argument("--resume", action="store_true",
                   help="extend DIR/models.json of --out: keep its finished cells (and first steps), run the rest")
    g.add_argument("--budget-seconds", type=float, default=None, metavar="S",
                   help="start no cell after S seconds; the rest is reported as not run (--resume runs it)")


def _list(text: str | None, allowed: tuple[str, ...], default: tuple[str, ...], flag: str) -> tuple[str, ...]:
    if text is None:
        return default
    got = tuple(dict.fromkeys(s.strip().lower() for s in text.split(",") if s.strip()))
    bad = [s for s in got if s not in allowed]
    if bad or not got:
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(allowed)}")
    return got


def options(a, log):
    """(specs, models.Options) from the parsed flags; ValueError for a usage error."""
    import importlib.util

    from ..backends import BackendId
    from . import models

    mixed = [f"--{k}" for k in ("rows", "suite") if getattr(a, k, None)] + [
        f"--{k}" for k in getattr(a, "_problem_defaults", {}) if getattr(a, k, None) is not None]
    if mixed:  # --dtype / --layout are the row bench's; the model bench takes --dtypes / --layouts
        raise ValueError(f"{', '.join(mixed)}: a row-bench flag; --models takes --dtypes, --layouts, --modes, ...")
    names = list(models.BUILTIN) if a.models.strip().lower() in ("", "all") else [
        s.strip() for s in a.models.split(",") if s.strip()]
    specs = [models.resolve(n) for n in names]
    missing = sorted({s.needs for s in specs if s.needs and importlib.util.find_spec(s.needs) is None})
    if missing:
        raise ValueError(f"{', '.join(missing)} is not installed: needed by "
                         f"{', '.join(s.name for s in specs if s.needs in missing)}")
    first = a.first_step
    sides = ["auto"] if not a.backend else [s.strip().lower() for s in a.backend.split(",") if s.strip()]
    sides = [s if s in ("auto", models.CONTROL) else str(BackendId.parse(s)) for s in sides if s != "torch"]
    for n, v in (("--steps", a.steps), ("--loss-steps", a.loss_steps), ("--batch", a.batch),
                 ("--batch-3d", a.batch_3d), ("--warmup", a.warmup)):
        if v is not None and v < 1:
            raise ValueError(f"{n} must be at least 1")
    opts = models.Options(
        dtypes=_list(a.dtypes, models.DTYPES, ("float32",) if first else models.DTYPES, "--dtypes"),
        layouts=_list(a.layouts, models.LAYOUTS, ("nchw",) if first else models.LAYOUTS, "--layouts"),
        modes=_list(a.modes, models.MODES, ("eager",) if first else models.MODES, "--modes"),
        backends=tuple(dict.fromkeys(sides)) or ("auto",), steps=a.steps,
        warmup=a.warmup if a.warmup is not None else 3, loss_steps=a.loss_steps, batch=a.batch,
        batch_3d=a.batch_3d, device=a.device, seed=a.seed, compile_backend=a.compile_backend, tf32=a.allow_tf32,
        loss_f64=a.loss_float64,
        budget_s=a.budget_seconds, log=log)
    return specs, opts


def _resume(a, specs, opts) -> dict | None:
    """The report in --out that --resume extends (its cells go into opts.done), or None."""
    from . import models, models_run

    if not a.resume:
        return None
    if not a.out:
        raise ValueError("--resume extends DIR/models.json: give --out DIR")
    path = pathlib.Path(a.out) / "models.json"
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    name = models_run.device_info(models.torch_device(opts.device))["name"]
    opts.done = models_run.resume_check(old, models_run.settings_of(specs, opts), name)
    return old


def main(a) -> int:
    from ..errors import BackendUnavailable
    from . import models_report
    from .models_first import run_first
    from .models_run import run
    from .report import write_json
    from .settings import check_device

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)
    try:
        check_device(a.device)
        specs, opts = options(a, log)
        old = _resume(a, specs, opts)
    except (ValueError, BackendUnavailable, ImportError, AttributeError) as e:
        print(f"portconv bench --models: {e}", file=sys.stderr)
        return EXIT_USAGE
    if a.out:
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        opts.on_cell = lambda rep: write_json(rep, pathlib.Path(a.out) / "models.json")
    if old:
        log(f"resuming {a.out}/models.json: {sum(c['status'] == 'done' for c in old['cells'])} cell(s) done")
    rep = run_first(specs, opts) if a.first_step else run(specs, opts)
    if old:  # models of the resumed report that this run did not name keep their settings
        rep["settings"]["models"] = {**old["settings"]["models"], **rep["settings"]["models"]}
    print(models_report.table(rep))
    if a.out:
        paths = models_report.write_all(rep, a.out, log=print)
        print("\nwrote " + ", ".join(paths.values()))
    print("complete" if rep["complete"] else "partial: run the same command with --resume for the rest")
    bad = models_report.failures(rep) + [f"{c['model']}/{c['dtype']}/{c['layout']}/{c['mode']} {s}: loss"
                                         for c in rep["cells"] for s, r in c.get("sides", {}).items()
                                         if r.get("loss_ok") is False]
    if bad:
        print(f"{len(bad)} failure(s) or loss difference(s) beyond the limit", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
