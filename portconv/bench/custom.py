"""`portconv bench --custom MODULE:OP`: a user forward (portconv.custom_forward) with portconv's backward, timed
against portconv's own forward and backward and PyTorch's on suite rows or one shape (issue 31 point 4)."""
from __future__ import annotations

import datetime
import math
import sys

from .. import custom, functional
from ..custom import CustomForward
from ..errors import BackendUnavailable, ConvError, Unsupported
from . import data, roofline, settings, timing
from .report import ms, write_outputs
from .runner import CHECK_LIMITS, INTERLEAVE_TURN, Options, _device_info, _Run, check

DIRECTIONS = ("fwd", "fwd+bwd")

# Note [custom bench]
# Each row is timed in one process on the same rotated data (timing.rotation, data.torch_sets), its entries in turns
# (Note [interleaved entries]):
#   torch       torch.nn.functional.conv*d, PyTorch's own forward and autograd;
#   auto, B     portconv.conv*d on the automatic plan (always timed) and on each --backend B: portconv's own forward
#               and its backward through portconv's autograd;
#   custom      the user's op: its forward, and as its backward portconv.convolution_backward on the automatic plan.
# 'fwd' is one forward without autograd; 'fwd+bwd' a forward of operands that require grad plus torch.autograd.grad of
# input, weight and bias with the set's grad_output: what a training step spends on the layer, host work included.
# 'custom / auto' is custom's median over auto's: at most 1 means the user forward plus portconv's backward trains
# as fast as portconv's own forward plus backward, i.e. the op adds no copy, sync or host cost that outweighs what its
# forward saves. A row the op does not take (its supports(), kind or rank) is reported as skipped: its forward would
# be portconv's own. Each entry's first call is checked against PyTorch in IEEE precision (per result, relative L2
# error within runner.CHECK_LIMITS of the dtype; TF32's limit for float32 where PyTorch's convolutions run on TF32).


def load(ref: str) -> CustomForward:
    """The op named by 'module:attr' (portconv.custom.load)."""
    try:
        op = custom.load(ref)
    except ValueError as e:
        raise ValueError(f"--custom {e}") from e
    if not isinstance(op, CustomForward):
        raise ValueError(f"--custom {ref!r} is a {type(op).__name__}, not an op of portconv.custom_forward (the "
                         "bench times the user forward with portconv's backward)")
    return op


def _rejects(op: CustomForward, row, s) -> str | None:
    """Why ``op`` does not run its own forward on ``row`` (set ``s``'s tensors), or None."""
    c = row.case
    if c.transposed != op.transposed or op.rank not in (None, c.rank):
        return f"{op.name} is not a {'transposed ' if c.transposed else ''}conv{c.rank}d"
    a = c.conv_args()
    rest = (a["output_padding"], a["groups"], a["dilation"]) if c.transposed else (a["dilation"], a["groups"])
    if not op.takes(s.input, s.weight, s.bias, a["stride"], a["padding"], *rest):
        return f"{op.name}'s supports() rejects it (portconv's own forward would run)"
    return None


def _convs(row, op: CustomForward, backends: list[str], s) -> tuple[dict, dict]:
    """({label: f(x, w, b)} with the row's F.conv*d arguments, {label: its result dict}); a backend that cannot run
    the row gets its reason and no function."""
    import torch.nn.functional as F

    c, a = row.case, row.case.conv_args()
    rest = (a["output_padding"], a["groups"], a["dilation"]) if c.transposed else (a["dilation"], a["groups"])
    name = f"conv{'_transpose' if c.transposed else ''}{c.rank}d"
    torch_f, ours_f = getattr(F, name), getattr(functional, name)
    fns = {"torch": lambda x, w, b: torch_f(x, w, b, a["stride"], a["padding"], *rest)}
    res = {"torch": {"kind": "torch", "status": "ok", "directions": {}}}
    for label in backends:
        bk = None if label == "auto" else label
        res[label] = {"kind": "portconv", "status": "ok", "directions": {}}
        try:
            plan = functional.plan(s.input, s.weight, s.bias, **a, backend=bk)
        except (BackendUnavailable, Unsupported, ConvError) as e:
            res[label].update(status="unsupported", reason=str(e).split("\n")[0])
            continue
        res[label].update(backend=str(plan.backend), algorithm=plan.algorithm)
        fns[label] = lambda x, w, b, bk=bk: ours_f(x, w, b, a["stride"], a["padding"], *rest, backend=bk)
    fns["custom"] = lambda x, w, b: op(x, w, b, a["stride"], a["padding"], *rest)
    res["custom"] = {"kind": "custom", "status": "ok", "directions": {}, "op": op.name,
                     "explain": op.explain(s.input, s.weight, s.bias, a["stride"], a["padding"], *rest).splitlines()}
    return fns, res


def _step(f, direction: str):
    """One timed call of ``f`` on a BufferSet: its forward, or its forward and the gradients of its operands."""
    import torch

    if direction == "fwd":
        return lambda s: f(s.input, s.weight, s.bias)

    def train(s):
        leaves = [t for t in (s.input, s.weight, s.bias) if t is not None]
        return torch.autograd.grad(f(s.input, s.weight, s.bias), leaves, s.grad_output)
    return train


def _check(out, ref, limit: float) -> dict:
    """runner.check of a result, or of every gradient of a tuple (the worst error)."""
    if not isinstance(ref, tuple):
        return check(out, ref, limit)
    parts = [check(o, r, limit) for o, r in zip(out, ref)]
    errs = [p["rel_err"] for p in parts]
    worst = None if None in errs else max(errs)
    return {"ok": all(p["ok"] for p in parts), "rel_err": worst, "limit": limit}


def run_row(r: _Run, op: CustomForward, row, backends: list[str]) -> dict:
    import torch

    o, case, dtype = r.opts, row.case, row.dtype
    gpu = r.device.type == "cuda"
    lay = data.plan_layout(case, dtype)
    rot = timing.rotation(lay.set_bytes, roofline.input_bytes(case, dtype, "fwd"), r.cache, r.budget)
    sets = data.torch_sets(lay, data.host_random(lay, rot.sets, data.row_seed(row.name, o.seed)), rot.sets, r.device)
    out = {**row.as_dict(), "rotation": rot.as_dict(), "results": {}}
    why = _rejects(op, row, sets[0])
    if why:
        out["skipped"] = why
        return out
    leaves = [data.BufferSet(*(None if t is None else t.detach().requires_grad_() for t in (s.input, s.weight, s.bias)),
                             s.grad_output) for s in sets]
    fns, out["results"] = _convs(row, op, backends, sets[0])
    limit = CHECK_LIMITS["tf32" if dtype == "float32" and gpu and r.tf32[0] else dtype]
    with settings.torch_variant(ieee=gpu):
        with torch.no_grad():
            refs = {"fwd": _step(fns["torch"], "fwd")(sets[0])}
        refs["fwd+bwd"] = _step(fns["torch"], "fwd+bwd")(leaves[0])
    for d in DIRECTIONS:
        members = [(_step(f, d), None) for f in fns.values()]
        with torch.set_grad_enabled(d != "fwd"):
            got = timing.measure_interleaved(r.clock, members, sets if d == "fwd" else leaves,
                                             turn_runs=INTERLEAVE_TURN, runs=o.runs, warmup=r.warmup(gpu),
                                             min_runs=o.min_runs, budget_s=o.budget_s, warmup_s=o.warmup_s)
        for label, m in zip(fns, got):
            res = out["results"][label]
            if isinstance(m, BaseException):  # reported in its cell; the other entries go on
                res["directions"][d] = {"status": "error", "error": f"{type(m).__name__}: {m}"}
                res["status"] = "error"
                continue
            res["directions"][d] = {"status": "ok", **m.as_dict(), "check": _check(m.first_output, refs[d], limit)}
            r.log(f"  {row.name:<24} {label:<10} {d:<8} median {m.stats.median:10.4f} ms ({m.stats.runs} runs)")
        res_t, res_a, res_c = (out["results"][k]["directions"].get(d, {}) for k in ("torch", "auto", "custom"))
        for res in out["results"].values():
            cell = res["directions"].get(d, {})
            if cell.get("status") == "ok" and res_t.get("status") == "ok":
                res.setdefault("speedup_vs_torch", {})[d] = res_t["median_ms"] / cell["median_ms"]
        if res_a.get("status") == "ok" and res_c.get("status") == "ok":
            out.setdefault("custom_over_auto", {})[d] = res_c["median_ms"] / res_a["median_ms"]
    del sets, leaves, refs
    if gpu:
        torch.cuda.empty_cache()
    return out


def run(op: CustomForward, rows: list, opts: Options, backends: list[str], ref: str = "") -> dict:
    """Time every row (Note [custom bench]); ``backends``: 'auto' and the portconv backends to time beside it."""
    r = _Run(opts)
    started = datetime.datetime.now(datetime.timezone.utc)
    with settings.no_poison():
        out_rows = []
        for i, row in enumerate(rows):
            r.log(f"[{i + 1}/{len(rows)}] {row.name}: {row.describe()}")
            out_rows.append(run_row(r, op, row, backends))
    ratios = {d: [x["custom_over_auto"][d] for x in out_rows if d in x.get("custom_over_auto", {})]
              for d in DIRECTIONS}
    return {"format": "portconv-bench-custom/1", "started": started.isoformat(timespec="seconds"),
            "seconds": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
            "custom": {"ref": ref, "op": op.name}, "device": _device_info(r), "environment": settings.environment(),
            "settings": {"runs": opts.runs, "min_runs": opts.min_runs, "warmup": r.warmup(r.device.type == "cuda"),
                         "warmup_s": opts.warmup_s, "budget_s_per_cell": opts.budget_s, "seed": opts.seed,
                         "directions": list(DIRECTIONS), "entries": ["torch", *backends, "custom"],
                         "interleave_turn_runs": INTERLEAVE_TURN, "hold_stream": opts.hold_stream and r.device.type
                         == "cuda", "conv_tf32_default": {"tf32": r.tf32[0], "why": r.tf32[1]}},
            "rows": out_rows,
            "summary": {d: {"geomean_custom_over_auto": math.exp(sum(map(math.log, v)) / len(v)), "rows": len(v),
                            "max": max(v)} for d, v in ratios.items() if v}}


def _cell(res: dict, d: str) -> str:
    c = res["directions"].get(d, {})
    if c.get("status") != "ok":
        return "error" if c.get("status") == "error" else "-"
    x = res.get("speedup_vs_torch", {}).get(d)
    return f"{ms(c['median_ms'])}" + (f" {x:.2f}x" if x and res["kind"] != "torch" else "") + (
        "" if c["check"]["ok"] else " CHECK")


def _label(label: str, res: dict) -> str:
    return f"{label}->{res['backend']}" if label == "auto" and res.get("backend") else label


def _head(report: dict) -> str:
    dev, c = report["device"], report["custom"]
    return (f"user forward {c['op']} ({c['ref']}) + portconv's backward against portconv's own and PyTorch on "
            f"{dev['name']} ({dev['torch_device']})")


def table(report: dict) -> str:
    """Per row: each entry's median ms and speed-up vs torch per direction, then custom / auto (Note [custom
    bench]: at most 1 is as fast as portconv's own)."""
    w = 26
    lines = [_head(report), "cells: median ms, x torch; CHECK: result differs from PyTorch's; custom / auto: the "
             "user forward + portconv's backward over portconv's own forward + backward (<= 1: as fast or faster)"]
    for row in report["rows"]:
        lines += ["", f"{row['name']}  [{row['describe']}]"]
        if "skipped" in row:
            lines.append(f"  skipped: {row['skipped']}")
            continue
        lines.append(f"  {'':<16}" + "".join(f"{d:<{w}}" for d in DIRECTIONS))
        for label, res in row["results"].items():
            if res["status"] == "unsupported":
                lines.append(f"  {label:<16}unsupported: {res['reason']}")
                continue
            lines.append(f"  {_label(label, res)[:15]:<16}" + "".join(f"{_cell(res, d):<{w}}" for d in DIRECTIONS))
        ratio = row.get("custom_over_auto", {})
        lines.append(f"  {'custom / auto':<16}" + "".join(f"{f'{ratio[d]:.3f}' if d in ratio else '-':<{w}}"
                                                          for d in DIRECTIONS))
    for d, s in report["summary"].items():
        lines.append(f"\ncustom / auto, {d}: geomean {s['geomean_custom_over_auto']:.3f}, worst {s['max']:.3f} over "
                     f"{s['rows']} row(s)")
    return "\n".join(line.rstrip() for line in lines)


def markdown(report: dict) -> str:
    st, env = report["settings"], report["environment"]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v is not None)
    lines = [f"# {_head(report)}", "", f"- started {report['started']}, {report['seconds']:.0f} s; git "
             f"{env.get('git') or 'unknown'}; versions: {vers}",
             f"- runs {st['runs']} (at least {st['min_runs']} within {st['budget_s_per_cell']} s per cell), warm-up "
             f"{st['warmup']} calls, entries in turns of {st['interleave_turn_runs']} runs"
             + (", held stream (device time)" if st["hold_stream"] else ""),
             f"- float32 convolutions on TF32 by default: {st['conv_tf32_default']['tf32']}", "",
             "| row | entry | " + " | ".join(DIRECTIONS) + " |", "|---|---|" + "---|" * len(DIRECTIONS)]
    notes = []
    for row in report["rows"]:
        if "skipped" in row:
            notes.append(f"- {row['name']}: skipped: {row['skipped']}")
            continue
        for label, res in row["results"].items():
            if res["status"] == "unsupported":
                notes.append(f"- {row['name']} / {label}: unsupported: {res['reason']}")
                continue
            lines.append(f"| {row['name']} | {_label(label, res)} | " + " | ".join(_cell(res, d) for d in DIRECTIONS)
                         + " |")
        ratio = row.get("custom_over_auto", {})
        lines.append(f"| {row['name']} | **custom / auto** | " + " | ".join(
            f"**{ratio[d]:.3f}**" if d in ratio else "-" for d in DIRECTIONS) + " |")
    if notes:
        lines += ["", "Rows and entries without a number:", "", *notes]
    lines += ["", "## Method", "", "Cells: median ms and speed-up vs torch. 'fwd': one forward without autograd; "
              "'fwd+bwd': a forward of operands that require grad and torch.autograd.grad of input, weight and bias. "
              "'custom' is the user's forward with portconv.convolution_backward on the automatic plan; 'auto' is "
              "portconv's own forward and backward on that plan; custom / auto at most 1 means the user forward with "
              "portconv's backward trains as fast as portconv's own (Note [custom bench], portconv/bench/custom.py)."]
    return "\n".join(lines) + "\n"


def _chart(report: dict, path):
    """bench's chart of the 'fwd+bwd' speed-ups vs torch: one bar per entry and row."""
    from .chart import chart

    return chart(dict(report, settings=dict(report["settings"], directions=["fwd+bwd"])), path)


def write_all(report: dict, out_dir, log=print) -> dict[str, str]:
    """custom.json, custom.md and custom.png under ``out_dir`` (report.write_outputs)."""
    return write_outputs(report, out_dir, "custom", _chart, markdown, "fwd+bwd speed-up vs PyTorch", log)


def main(a, log) -> int:
    """`portconv bench --custom`: the rows (suite or problem flags), --backend beside 'auto', the timing flags."""
    from ..backends import BackendId
    from .cli import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, _rows, _unavailable

    try:
        if a.models is not None:
            raise ValueError("--custom times suite rows or one shape, --models whole models: give one")
        op = load(a.custom)
        rows, source = _rows(a)
        named = [n.strip().lower() for n in (a.backend or "").split(",") if n.strip()]
        backends = ["auto", *dict.fromkeys(str(BackendId.parse(n)) for n in named if n != "auto")]
        missing = _unavailable(backends)
        if missing:
            print("portconv bench: " + "; ".join(missing), file=sys.stderr)
            return EXIT_UNAVAILABLE
        settings.check_device(a.device)
        if a.runs < 1 or a.min_runs < 1:
            raise ValueError("--runs and --min-runs must be at least 1")
        opts = Options(runs=a.runs, min_runs=min(a.min_runs, a.runs), warmup=a.warmup, warmup_s=a.warmup_seconds,
                       budget_s=a.cell_seconds or None, backends=["auto"], device=a.device, torch_variants=False,
                       peaks=False, hold_stream=a.hold_stream, seed=a.seed, log=log)
        log(f"suite: {source}; {len(rows)} row(s); user forward {op.name}")
        rep = run(op, rows, opts, backends, a.custom)
    except ValueError as e:
        print(f"portconv bench --custom: {e}", file=sys.stderr)
        return EXIT_USAGE
    rep["suite"] = source
    print(table(rep))
    if a.out:
        paths = write_all(rep, a.out, log=print)
        print("\nwrote " + ", ".join(paths.values()))
    bad = [f"{row['name']}/{label}" for row in rep["rows"] for label, res in row["results"].items()
           if res["status"] == "error" or any(not c.get("check", {}).get("ok", True)
                                               for c in res["directions"].values())]
    if bad:
        print("errors or failed checks: " + ", ".join(bad), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
