"""`portconv bench`: the parser (MIOpenDriver's problem flags plus the suite's) and its main()."""
from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3  # as portconv.cli's
_OVERRIDES = ("dtype", "layout")  # problem flags that also apply to suite rows (they never select one-shape mode)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `bench` on a subparsers object (portconv.cli's)."""
    from ..driverflags import add_problem_flags

    p = subparsers.add_parser(
        "bench", help="time every backend and PyTorch over the benchmark suite (or one shape), with a roofline",
        description="Time forward, backward-data and backward-weight of each suite row (or the one shape the "
                    "problem flags give) on every available portconv backend and on PyTorch in the same process. "
                    "Any problem flag other than --dtype/--layout selects one-shape mode.")
    before = {a.dest for a in p._actions}
    add_problem_flags(p)
    # Note [bench problem flags]: the shared problem flags have concrete defaults; here every one defaults to
    # None so that main() can tell a flag the user gave (one-shape mode) from a default (suite mode).
    p.set_defaults(_problem_defaults={})
    for a in p._actions:
        if a.dest not in before and a.dest not in ("backend", "device"):
            p.get_default("_problem_defaults")[a.dest] = a.default
            a.default = None
    p.get_default("_problem_defaults")["dtype"] = None
    for a in p._actions:
        if a.dest == "backend":
            a.help = ("comma-separated portconv backends to time beside PyTorch, 'auto' for the default plan, "
                      "'auto+tune' for the default plan under portconv.tune(), "
                      "'all' (default: every available backend plus auto)")
        elif a.dest == "device":
            a.help = "torch device of PyTorch and the torch-tensor backends (default: cuda if present, else cpu)"
    g = p.add_argument_group("benchmark")
    g.add_argument("--suite", default=None, metavar="FILE",
                   help="suite JSON (default: the suite shipped as portconv/bench/suite.json)")
    g.add_argument("--rows", default=None, metavar="NAMES", help="comma-separated row names or globs (mbv2-*)")
    g.add_argument("--directions", default="all", help="fwd,bwd-data,bwd-weight or all (default all)")
    g.add_argument("--scale-batch", type=int, default=None, metavar="N", help="cap every row's batch at N")
    g.add_argument("--runs", type=int, default=50, help="timed runs per cell (default 50)")
    g.add_argument("--min-runs", type=int, default=5, help="fewest timed runs when the budget cuts (default 5)")
    g.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 10 on a GPU, 2 on a CPU)")
    g.add_argument("--warmup-seconds", type=float, default=0.05, metavar="S",
                   help="and warm up for at least this long (default 0.05)")
    g.add_argument("--cell-seconds", type=float, default=10.0, metavar="S",
                   help="time budget per cell: slower cells get fewer runs, never under --min-runs (0: none)")
    g.add_argument("--out", default=None, metavar="DIR", help="write bench.json, bench.md and bench.png here")
    g.add_argument("--no-peaks", action="store_true", help="skip the peak measurements (no roofline)")
    g.add_argument("--remeasure-peaks", action="store_true", help="measure the peaks again, ignoring the cache")
    g.add_argument("--no-check", action="store_true", help="skip comparing each result with PyTorch's")
    g.add_argument("--no-torch-variants", action="store_true",
                   help="on CUDA, time PyTorch with its defaults only (not IEEE float32, not cudnn.benchmark)")
    g.add_argument("--no-interleave", action="store_true",
                   help="time the entries one after the other, not in turns (Note [interleaved entries])")
    g.add_argument("--hold-stream", action="store_true",
                   help="CUDA: enqueue each batch of calls behind a spin kernel, so the events time the GPU's work "
                        "without the host's launch cost (Note [held stream], nvbench's blocking kernel)")
    g.add_argument("--overhead", action="store_true",
                   help="also measure per-call overhead and first-call compile times (portconv.bench.overhead)")
    g.add_argument("--custom", default=None, metavar="MODULE:OP",
                   help="time a user forward (an op of portconv.custom_forward) with portconv's backward against "
                        "portconv's own (the automatic plan and each --backend) and PyTorch: forward, and forward + "
                        "backward through autograd (Note [custom bench])")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="time nothing: merge bench.json files of one device (e.g. a suite split over several "
                        "commands) into one table/report (with --out)")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    from .models_cli import add_flags as add_model_flags

    add_model_flags(p)
    p.set_defaults(func=main)
    return p


def _rows(a):
    from .suite import adjust, load_suite, row_from_case, select

    defaults = a._problem_defaults
    given = [k for k in defaults if k not in _OVERRIDES and getattr(a, k) is not None]
    if given:
        if a.suite or a.rows:
            raise ValueError(f"problem flags ({', '.join(given)}) time one shape; they do not mix with --suite/--rows")
        from ..driverflags import case_from_args

        for k, v in defaults.items():
            if getattr(a, k) is None and k != "dtype":
                setattr(a, k, v)
        case = case_from_args(a)
        if not case.valid():
            raise ValueError(f"invalid problem: {'; '.join(case.problems())}")
        rows, source = [row_from_case(case, a.dtype or "float32")], "problem flags"
        return adjust(rows, a.scale_batch), source
    rows, source = load_suite(a.suite)
    return adjust(select(rows, a.rows), a.scale_batch, a.dtype, a.layout), source


def _unavailable(names) -> list[str]:
    """'backend B is unavailable: why' for every backend named in --backend that is absent here."""
    from .. import backends

    named = [n.strip().lower() for n in names or ()]
    whys = [backends.unavailable(n) for n in named if n not in ("torch", "auto", "auto+tune", "all", "")]
    return [w for w in whys if w]


def main(a) -> int:
    from ..errors import Unsupported
    from . import report as _report
    from .overhead import overhead
    from .runner import Options, run
    from .settings import check_device
    from .suite import parse_directions

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    if a.merge:
        return _merge(a)
    if a.custom is not None:  # a user forward against portconv's own: portconv.bench.custom
        from .custom import main as custom_main

        return custom_main(a, log)
    if a.models is not None:  # the model benchmark: portconv.bench.models_cli
        from .models_cli import main as models_main

        return models_main(a)
    try:
        rows, source = _rows(a)
        directions = parse_directions(a.directions)
        if a.runs < 1 or a.min_runs < 1:
            raise ValueError("--runs and --min-runs must be at least 1")
        names = None if not a.backend else [s for s in a.backend.split(",") if s.strip()]
        unavailable = _unavailable(names)
        if unavailable:  # a backend asked for by name must be present: exit 3 with the reason, as conv and explain
            print("portconv bench: " + "; ".join(unavailable), file=sys.stderr)
            return EXIT_UNAVAILABLE
        check_device(a.device)
        opts = Options(runs=a.runs, min_runs=min(a.min_runs, a.runs), warmup=a.warmup, warmup_s=a.warmup_seconds,
                       budget_s=a.cell_seconds or None, directions=directions, backends=names, device=a.device,
                       torch_variants=not a.no_torch_variants, peaks=not a.no_peaks,
                       remeasure_peaks=a.remeasure_peaks, check=not a.no_check, interleave=not a.no_interleave,
                       hold_stream=a.hold_stream,
                       seed=a.seed, log=log,
                       on_row=(lambda rep: _partial(rep, a.out)) if a.out else None)
        log(f"suite: {source}; {len(rows)} row(s)")
        rep = run(rows, opts)
    except ValueError as e:
        print(f"portconv bench: {e}", file=sys.stderr)
        return EXIT_USAGE
    rep["suite"] = source
    if a.overhead:
        rep["overhead"] = []
        for label, res in rep["rows"][0]["results"].items() if rep["rows"] else []:
            if res["kind"] != "portconv" or res.get("status") not in ("ok", "error") or label == "auto+tune":
                continue
            log(f"overhead: {label}")
            try:
                rep["overhead"].append(overhead(None if label == "auto" else label, a.device))
            except (Unsupported, RuntimeError) as e:
                rep["overhead"].append({"backend": label, "error": f"{type(e).__name__}: {e}"})
    print(_report.table(rep))
    if a.overhead:
        print("\n" + overhead_table(rep["overhead"]))
    if a.out:
        paths = _report.write_all(rep, a.out, log=lambda m: print(m))
        print("\nwrote " + ", ".join(paths.values()))
    failed = [(r["name"], k) for r in rep["rows"] for k, res in r["results"].items()
              if res.get("status") == "error" or any(c.get("check", {}).get("ok") is False
                                                     for c in res.get("directions", {}).values())]
    if failed:
        print("errors or failed checks: " + ", ".join(f"{n}/{k}" for n, k in failed), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK



def _partial(rep: dict, out: str) -> None:
    """bench.json after each row, so a run cut short (a time limit) still leaves its rows behind."""
    import pathlib

    from .report import write_json

    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    write_json(rep, pathlib.Path(out) / "bench.json")


def _merge(a) -> int:
    import gzip

    from . import report as _report
    from .report import merge

    try:
        reps = []
        for path in a.merge:  # the committed reports under docs/performance are gzipped (bench.json.gz)
            with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
                reps.append(json.load(f))
        rep = merge(reps)
    except (OSError, ValueError, KeyError) as e:
        print(f"portconv bench --merge: {e}", file=sys.stderr)
        return EXIT_USAGE
    rep["suite"] = ", ".join(sorted({str(r.get("suite")) for r in reps}))
    print(_report.table(rep))
    if a.out:
        paths = _report.write_all(rep, a.out, log=print)
        print("\nwrote " + ", ".join(paths.values()))
    return EXIT_OK


def overhead_table(results: list[dict]) -> str:
    lines = [f"per-call overhead, tiny conv2d (us per call, back-to-back; target: portconv within "
             f"{results[0]['target_us'] if results and 'target_us' in results[0] else 25:.0f} us of torch)"]
    for r in results:
        if "error" in r:
            lines.append(f"  {r['backend']:<8} error: {r['error']}")
            continue
        fc = r.get("first_call", {})
        first = "  first forward cold/warm " + "/".join(
            f"{fc[k]['first_forward_ms']:.1f}" if "first_forward_ms" in fc.get(k, {}) else "error"
            for k in ("cold", "warm")) + " ms" if fc else ""
        lines.append(f"  {r['backend']:<8} torch {r['torch']['per_call_us']:8.1f}  portconv "
                     f"{r['portconv']['per_call_us']:8.1f}  plan.forward {r['plan_forward']['per_call_us']:8.1f}  "
                     f"diff {r['portconv_minus_torch_us']:+8.1f} {'ok' if r['within_target'] else 'OVER'}{first}")
        t = r.get("train")  # forward + backward through autograd (overhead.train_overhead)
        if t:
            lines.append(f"  {'':<8} fwd+bwd autograd: " + (
                f"skipped: {t['skipped']}" if "skipped" in t else f"error: {t['error']}" if "error" in t else
                f"torch {t['torch']['per_call_us']:8.1f}  portconv {t['portconv']['per_call_us']:8.1f}  "
                f"diff {t['portconv_minus_torch_us']:+8.1f} {'ok' if t['within_target'] else 'OVER'}"))
            if "module_minus_torch_us" in t:
                lines.append(f"  {'':<8} module fwd+bwd:   torch {t['torch_module']['per_call_us']:8.1f}  portconv "
                             f"{t['portconv_module']['per_call_us']:8.1f}  diff {t['module_minus_torch_us']:+8.1f}")
    return "\n".join(lines)


def standalone(argv=None) -> int:
    """`python -m portconv.bench` without portconv.cli's other commands."""
    p = argparse.ArgumentParser(prog="portconv")
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = p.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)
