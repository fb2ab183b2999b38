"""Benchmark output: the terminal table, the markdown report, the JSON file, geomean summaries and merges."""
from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence

SHORT = {"fwd": "fwd", "bwd-data": "bwd-data", "bwd-weight": "bwd-weight", "sum": "sum"}


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.3f}"
    if v >= 0.01:
        return f"{v:.4f}"
    return f"{v:.2e}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%" if v >= 0.1 else f"{100 * v:.1f}%"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def cell(res: dict, d: str) -> dict:
    """{'ms', 'x', 'eff', 'flags'} for one entry and direction (d 'sum' included); 'na' with a reason."""
    sp = res.get("speedup_vs_torch", {})
    if d == "sum":
        if res.get("sum_ms") is None:
            return {"na": True}
        return {"ms": res["sum_ms"], "x": sp.get("sum"), "eff": res.get("sum_efficiency"), "flags": ""}
    c = res.get("directions", {}).get(d)
    if not c:
        return {"na": True}
    if c.get("status") == "error":
        return {"na": True, "error": c.get("error")}
    flags = ""
    if c.get("runs") is not None and c.get("requested_runs") and c["runs"] < c["requested_runs"]:
        flags += f" n={c['runs']}"
    if c.get("check") and not c["check"]["ok"]:
        flags += " CHECK"
    if (c.get("efficiency") or 0) > 1:
        flags += " >FLOOR"
    return {"ms": c["median_ms"], "x": sp.get(d), "eff": c.get("efficiency"), "flags": flags}


def _why(res: dict) -> str | None:
    if res.get("status") in ("unsupported", "unavailable", "skipped"):
        return f"{res['status']}: {res.get('reason', '')}"
    errs = [f"{d}: {c['error']}" for d, c in res.get("directions", {}).items() if c.get("status") == "error"]
    return "error: " + "; ".join(errs) if errs else None


def _label(label: str, res: dict) -> str:
    if label in ("auto", "auto+tune") and res.get("backend"):
        return f"{label}->{res['backend']}"
    return label


def busy(report: dict) -> str | None:
    """A warning when the host was loaded beyond its CPU count (CPU timings then include other work)."""
    env = report["environment"]
    loads = [x[0] for x in (env.get("loadavg_before"), env.get("loadavg")) if x]
    cpus = env.get("cpus") or 0
    if loads and cpus and max(loads) > cpus:
        return (f"the host's 1-minute load average reached {max(loads):.1f} on {cpus} CPUs during the run: "
                f"other processes competed for the CPU and CPU-side timings are inflated")
    return None


def table(report: dict) -> str:
    """The terminal table: per row a floor line, then one line per entry (median ms, x torch, % of floor)."""
    dirs = report["settings"]["directions"]
    cols = list(dirs) + (["sum"] if len(dirs) > 1 else [])
    w = 28
    lines = [f"device: {report['device']['name']} ({report['device']['torch_device']}); "
             f"cells: median ms  speed-up vs torch  % of roofline floor; n=K: fewer runs than asked (budget); "
             f"CHECK: result differs from PyTorch; >FLOOR: faster than the floor (peaks measured low)"]
    warn = busy(report)
    if warn:
        lines.append(f"WARNING: {warn}")
    if not report.get("complete", True):
        lines.append(f"WARNING: partial run: {len(report['rows'])} of {report.get('rows_planned')} rows")
    head = f"  {'':<22}" + "".join(f"{SHORT[c]:<{w}}" for c in cols)
    for r in report["rows"]:
        rot = r["rotation"]
        lines += ["", f"{r['name']}  [{r['describe']}]  {r['flops'] / 1e9:.3g} GFLOP, rotation {rot['sets']} x "
                      f"{_mib(rot['set_bytes'])}" + ("" if rot["exceeds_cache"] else " (cannot exceed the cache)")]
        fl = "".join(f"{(ms(r['directions'][d]['floor_ms']) + ' ' + (r['directions'][d]['bound'] or ''))[:w - 1]:<{w}}"
                     for d in dirs)
        lines += [f"  {'floor (ms, bound)':<22}{fl}", head]
        for label, res in r["results"].items():
            name = _label(label, res)[:21]
            why = _why(res)
            if res.get("status") in ("unsupported", "unavailable", "skipped"):
                lines.append(f"  {name:<22}{why}")
                continue
            parts = []
            for c in cols:
                x = cell(res, c)
                if x.get("na"):
                    parts.append(f"{'error' if x.get('error') else '-':<{w}}")
                else:
                    s = f"{ms(x['ms'])} {_x(x['x'])} {_pct(x['eff'])}{x['flags']}"
                    parts.append(f"{s:<{w}}")
            lines.append(f"  {name:<22}" + "".join(parts).rstrip())
            if why:
                lines.append(f"  {'':<22}{why}")
    s = report.get("summary", {})
    if s and any(k not in ("torch",) for k in s):
        lines += ["", "geomean speed-up vs torch over rows (min):"]
        for label, per in s.items():
            if label == "torch" or not per:
                continue
            lines.append(f"  {label:<22}" + "  ".join(f"{d} {v['geomean']:.2f}x ({v['min']:.2f}x, {v['rows']} rows)"
                                                       for d, v in per.items()))
    return "\n".join(line.rstrip() for line in lines)


def rate(flops_per_s: float) -> str:
    return (f"{flops_per_s / 1e12:.2f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.2f} GFLOP/s")


def _peaks_md(pk: dict | None) -> list[str]:
    if not pk:
        return ["No peaks were measured (--no-peaks): no floors or efficiencies."]
    out = [f"Peaks measured on this device (cache `{pk.get('cache')}`, key `{pk.get('device_key')}`, "
           f"measured {pk.get('measured', '?')}, host load average then {pk.get('loadavg_when_measured', '?')}):"]
    if pk.get("not_cached"):
        out.append(f"**{pk['not_cached']}**")
    out += ["", "| peak | value | how |", "|---|---|---|"]
    bw = pk.get("bandwidth")
    if bw:
        out.append(f"| memory bandwidth | {bw['bytes_per_s'] / 1e9:.1f} GB/s | {bw['method']} |")
    for k, v in pk.get("compute", {}).items():
        out.append(f"| {k} matmul | {rate(v['flops_per_s'])} | {v['method']} |")
    return out


def markdown(report: dict) -> str:
    dev, env, st = report["device"], report["environment"], report["settings"]
    dirs = st["directions"]
    cols = list(dirs) + (["sum"] if len(dirs) > 1 else [])
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v is not None)
    lines = [f"# portconv bench on {dev['name']}", "",
             f"- device: {dev['name']} ({dev['torch_device']}, {dev.get('vendor', '')} {dev.get('arch', '')}); "
             f"cache {_mib(dev['cache_bytes'])} ({dev['cache_source']})",
             f"- started {report['started']}, {report['seconds']:.0f} s; git {env.get('git') or 'unknown'}",
             f"- versions: {vers}",
             "- torch flags: " + ", ".join(f"{k}={v}" for k, v in env["torch_flags"].items()),
             f"- native executor (Note [native executor]): {env.get('native', 'not recorded')}",
             f"- float32 convolutions on TF32 by default: {st['conv_tf32_default']['tf32']} "
             f"({st['conv_tf32_default']['why']})",
             f"- runs {st['runs']} (at least {st['min_runs']} within {st['budget_s_per_cell']} s per cell), "
             f"warm-up {st['warmup']} calls and {st.get('warmup_s', 0)} s, directions {', '.join(dirs)}, "
             f"seed {st['seed']}; " + (f"torch-tensor entries timed in turns of {st['interleave_turn_runs']} runs "
                                       "after one untimed call (Note [interleaved entries]), cudnn.benchmark "
                                       "entries after them" if st.get("interleave_turn_runs")
                                       else "entries timed one after the other")
             + ("; **held stream** (Note [held stream]: device time without the host's launch cost; batches whose "
                f"spin ended early: {st.get('hold_failures', 0)})" if st.get("hold_stream") else ""),
             f"- host load average (1/5/15 min) before {env.get('loadavg_before')}, after {env.get('loadavg')} "
             f"on {env.get('cpus')} CPUs"]
    if busy(report):
        lines.append(f"- **WARNING: {busy(report)}**")
    if not report.get("complete", True):
        lines.append(f"- **WARNING: partial run: {len(report['rows'])} of {report.get('rows_planned')} rows**")
    if "opencl" in dev:
        lines.append(f"- OpenCL device: {dev['opencl']['name']} ({dev['opencl']['vendor']}, "
                     f"cache {_mib(dev['opencl']['cache_bytes'])})")
    lines += ["", "Backends:", ""] + [f"- {a['backend']}: {'available' if a['available'] else 'unavailable'} — "
                                      f"{a['reason']}" for a in report["backends"]]
    lines += ["", "## Roofline peaks", ""] + _peaks_md(report.get("peaks"))
    lines += ["", "## Results", "", "Each cell: median ms / speed-up vs `torch` (PyTorch defaults) / % of the "
              "roofline floor. `n=K`: fewer timed runs than asked (per-cell budget). `CHECK`: the first call's "
              "result differs from PyTorch's IEEE result beyond the dtype's limit. `>FLOOR`: faster than the "
              "roofline floor, so a peak was measured low (a loaded host: measure again with --remeasure-peaks).", ""]
    lines.append("| row | entry | " + " | ".join(SHORT[c] for c in cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    notes = []
    for r in report["rows"]:
        lines.append(f"| **{r['name']}** | floor ms | " + " | ".join(
            f"{ms(r['directions'][c]['floor_ms'])} {r['directions'][c]['bound'] or ''}" if c != "sum" else ""
            for c in cols) + " |")
        for label, res in r["results"].items():
            why = _why(res)
            if res.get("status") in ("unsupported", "unavailable", "skipped"):
                lines.append(f"| {r['name']} | {_label(label, res)} | " + " | ".join("n/a" for _ in cols) + " |")
                notes.append(f"- {r['name']} / {label}: {why}")
                continue
            parts = []
            for c in cols:
                x = cell(res, c)
                parts.append("error" if x.get("error") else "-" if x.get("na") else
                             f"{ms(x['ms'])} / {_x(x['x'])} / {_pct(x['eff'])}{x['flags']}")
            lines.append(f"| {r['name']} | {_label(label, res)} | " + " | ".join(parts) + " |")
            if why:
                notes.append(f"- {r['name']} / {label}: {why}")
    if notes:
        lines += ["", "Entries without a number, and why:", ""] + notes
    timings = {}
    for r in report["rows"]:
        for label, res in r["results"].items():
            if res.get("timing"):
                timings.setdefault(f"{label} ({res.get('backend', label)})" if label.startswith("auto") else label,
                                   set()).add(res["timing"])
    if timings:
        lines += ["", "How each entry was timed:", ""] + [f"- {k}: {'; '.join(sorted(v))}"
                                                        for k, v in timings.items()]
    s = report.get("summary", {})
    if s:
        lines += ["", "## Geomean speed-up vs torch", "", "| entry | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for label, per in s.items():
            lines.append(f"| {label} | " + " | ".join(
                f"{per[c]['geomean']:.2f}x (min {per[c]['min']:.2f}x, {per[c]['rows']} rows)" if c in per else "-"
                for c in cols) + " |")
    lines += ["", "## Method", "", METHOD]
    return "\n".join(lines) + "\n"


METHOD = """\
- Every row runs each direction on the same data: fwd = aten::convolution, bwd-data and bwd-weight =
  aten::convolution_backward with output_mask (1,0,0) and (0,1,0). PyTorch runs in the same process through
  torch.ops.aten; portconv backends through `portconv.plan(..., backend=b).forward/backward`.
- Timing: CUDA events per call on the current stream (GPU tensors), OpenCL profiling markers around each call
  on device-resident pyopencl arrays (opencl backend), or the wall clock with a device sync (CPU tensors).
  Warm-up calls (the first included) are not timed; the median, p10 and p90 come from the timed samples.
- Inputs rotate over several sets of fresh uniform [-1, 1) data (never zeros) whose inputs together exceed
  twice the device's last cache, so a call does not find its inputs in the cache.
- Floor = max(FLOPs / peak FLOP/s, minimum bytes / peak bandwidth), with FLOPs = 2*N*K*(C/groups)*prod(kernel)*
  prod(output positions) (same for each direction; for a transposed convolution the positions of its input), and
  minimum bytes = each input of the direction read once + each output written once. Peaks are measured on the
  device (a large copy; a large matmul per dtype, TF32 for float32 where the entry ran on TF32), cached per device.
  Efficiency = floor / median.
- Speed-up = PyTorch's median / the entry's median; `sum` adds the directions' medians. `torch-best` is the faster
  of cudnn.benchmark off and on per direction; `torch-ieee` sets float32 convolutions to IEEE precision.
"""


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summary(rows: list[dict], directions: Sequence[str]) -> dict:
    """Geomean speed-up vs torch per entry and direction (+sum), over the rows where both have a number."""
    labels = []
    for r in rows:
        labels += [k for k in r["results"] if k not in labels]
    out = {}
    for label in labels:
        per = {}
        for d in (*directions, "sum"):
            vals = [r["results"][label].get("speedup_vs_torch", {}).get(d) for r in rows if label in r["results"]]
            vals = [v for v in vals if v]
            if vals:
                per[d] = {"geomean": geomean(vals), "min": min(vals), "rows": len(vals)}
        out[label] = per
    return out


def merge(reports: list[dict]) -> dict:
    """One report from several runs on one device (e.g. the suite split over several commands)."""
    if not reports:
        raise ValueError("nothing to merge")
    names = {(r["device"]["name"], r["device"]["torch_device"]) for r in reports}
    if len(names) > 1:
        raise ValueError(f"reports from different devices cannot be merged: {sorted(names)}")
    out = dict(reports[0])
    out["rows"] = [row for r in reports for row in r["rows"]]
    out["seconds"] = sum(r["seconds"] for r in reports)
    out["complete"] = all(r.get("complete", True) for r in reports)
    out["merged_from"] = [{"started": r["started"], "rows": [x["name"] for x in r["rows"]],
                           "settings": r["settings"], "argv": r["environment"].get("argv")} for r in reports]
    out["summary"] = summary(out["rows"], out["settings"]["directions"])
    return out


def write_json(report: dict, path: str | pathlib.Path) -> None:
    pathlib.Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n")


def write_outputs(report: dict, out_dir: str | pathlib.Path, stem: str, chart, markdown, caption: str,
                  log=print) -> dict[str, str]:
    """<stem>.json, <stem>.md and <stem>.png (``chart``'s, or the printed reason it was skipped) under ``out_dir``;
    the report records where they went."""
    d = pathlib.Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(d / f"{stem}.json"), "markdown": str(d / f"{stem}.md")}
    png, why = chart(report, d / f"{stem}.png")
    if png:
        paths["chart"] = str(png)
    else:
        log(f"chart skipped: {why}")
    report["outputs"] = {**paths, "chart_skipped": why}
    write_json(report, paths["json"])
    tail = f"\n![{caption}]({stem}.png)\n" if png else f"\nChart skipped: {why}\n"
    pathlib.Path(paths["markdown"]).write_text(markdown(report) + tail)
    return paths


def write_all(report: dict, out_dir: str | pathlib.Path, log=print) -> dict[str, str]:
    """bench.json, bench.md and bench.png under ``out_dir`` (write_outputs)."""
    from .chart import chart

    return write_outputs(report, out_dir, "bench", chart, markdown, "speed-up vs PyTorch", log)
