"""The model benchmark's output: terminal table, models.md, models.json and models.png (step-time ratio per cell)."""
from __future__ import annotations

import math
import pathlib

from .report import geomean, write_outputs


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def _s(ms_value) -> str:
    return "-" if ms_value is None else f"{ms_value / 1e3:.2f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _loss(v) -> str:
    return "-" if v is None else f"{v:.6g}"


def _rel(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def sides(rep: dict) -> list[str]:
    """The portconv sides (every side but 'torch'), in the order the cells have them."""
    out = []
    for c in rep["cells"]:
        out += [s for s in c.get("sides", {}) if s != "torch" and s not in out]
        out += [s for s in c.get("first_step", {}).get("sides", {}) if s != "torch" and s not in out]
    return out


def _first(cell: dict, side: str) -> str:
    """'cold / warm' seconds of the side's first step in fresh processes, or '-'."""
    got = cell.get("first_step", {}).get("sides", {}).get(side)
    if not got:
        return "-"
    return " / ".join("error" if "error" in got.get(k, {"error": 1}) else _s(got[k]["first_step_ms"])
                      for k in ("cold", "warm"))


def rows(rep: dict) -> list[dict]:
    """One row per (cell, portconv side), the numbers as text, plus the flags and errors."""
    out = []
    for c in rep["cells"]:
        t = c.get("sides", {}).get("torch", {})
        for side in sides(rep):
            r = c.get("sides", {}).get(side, {})
            if not r and side not in c.get("first_step", {}).get("sides", {}):
                continue
            flags = []
            if r.get("loss_ok") is False:
                flags.append("LOSS")
                if r.get("loss_f64_rel_diff", 1.0) <= t.get("loss_f64_rel_diff", 0.0):
                    flags.append("(nearer float64 than PyTorch)")
            for who, res in (("torch", t), (side, r)):
                if res.get("status") == "error":
                    flags.append(f"{who} failed")
            if c["status"] == "not run":
                flags.append("not run")
            out.append({"cell": c, "side": side, "model": c["model"], "dtype": c["dtype"], "layout": c["layout"],
                        "mode": c["mode"], "torch_ms": _ms(t.get("median_ms")), "side_ms": _ms(r.get("median_ms")),
                        "x": _x(r.get("x_torch")),
                        "first": f"{_s(t.get('first_step_in_process_ms'))} / {_s(r.get('first_step_in_process_ms'))}",
                        "cold_warm_torch": _first(c, "torch"), "cold_warm_side": _first(c, side),
                        "loss_step": r.get("loss_step") or t.get("loss_step"), "loss_torch": _loss(t.get("loss")),
                        "loss_side": _loss(r.get("loss")), "rel": _rel(r.get("loss_rel_diff")),
                        "f64": (f"{_rel(t.get('loss_f64_rel_diff'))} / {_rel(r.get('loss_f64_rel_diff'))}"
                                if "loss_f64_rel_diff" in r else "-"),
                        "flags": " ".join(flags)})
    return out


def _phases(res: dict) -> str:
    h = res.get("host_ms")
    return "-" if not h else " / ".join(_ms(h[k]) for k in ("forward", "backward", "optimizer"))


def host_rows(rep: dict) -> list[str]:
    """Note [host phases]: a markdown row per (cell, side, PyTorch's included) with host phase times."""
    out = []
    for c in rep["cells"]:
        t = c.get("sides", {}).get("torch", {})
        for side, r in c.get("sides", {}).items():
            if not r.get("host_ms"):
                continue
            total, med = sum(r["host_ms"].values()), r.get("median_ms")
            more = "-" if side == "torch" or not t.get("host_ms") else _ms(total - sum(t["host_ms"].values()))
            out.append(f"| {c['model']} | {c['dtype']} | {c['layout']} | {c['mode']} | {side} | {_phases(r)} | "
                       f"{_ms(total)} | {more} | {_ms(med)} | {'-' if not med else f'{total / med:.2f}'} |")
    return out


def summary(rep: dict) -> dict:
    """Geomean and min of PyTorch / portconv step time per (side, dtype, mode) over the models."""
    out: dict = {}
    for c in rep["cells"]:
        for side, r in c.get("sides", {}).items():
            if r.get("x_torch"):
                out.setdefault(f"{side} {c['dtype']} {c['mode']}", []).append(r["x_torch"])
    return {k: {"geomean": geomean(v), "min": min(v), "cells": len(v)} for k, v in out.items()}


def failures(rep: dict) -> list[str]:
    out = []
    for c in rep["cells"]:
        name = f"{c['model']}/{c['dtype']}/{c['layout']}/{c['mode']}"
        if c.get("error"):
            out.append(f"{name}: {c['error']}")
        for side, r in c.get("sides", {}).items():
            if r.get("status") == "error":
                out.append(f"{name} {side}: {r['error']}")
        for side, got in c.get("first_step", {}).get("sides", {}).items():
            for k, v in got.items():
                if "error" in v:
                    out.append(f"{name} {side} first step {k}: {v['error']}")
    return out


_HEAD = ("model", "dtype", "layout", "mode", "side", "PyTorch ms", "side ms", "x PyTorch", "1st step s (in process)",
         "1st step PyTorch s (cold / warm)", "1st step side s (cold / warm)", "loss step", "loss PyTorch", "loss side",
         "rel diff", "vs float64 (PyTorch / side)", "flags")
_KEYS = ("model", "dtype", "layout", "mode", "side", "torch_ms", "side_ms", "x", "first", "cold_warm_torch",
         "cold_warm_side", "loss_step", "loss_torch", "loss_side", "rel", "f64", "flags")


def table(rep: dict) -> str:
    rs = rows(rep)
    body = [[str(r[k] if r[k] is not None else "-") for k in _KEYS] for r in rs]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(_HEAD)]
    dev = rep["device"]
    lines = [f"device: {dev['name']} ({dev['torch_device']}); x PyTorch = PyTorch's step median / portconv's (>1: "
             f"portconv faster); LOSS: the loss differs from PyTorch's beyond the limit"]
    if not rep.get("complete", True):
        lines.append("WARNING: partial run: cells are missing (not run); run the same command with --resume")
    lines.append("  ".join(h.ljust(w) for h, w in zip(_HEAD, widths)).rstrip())
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip() for b in body]
    s = summary(rep)
    if s:
        lines += ["", "geomean x PyTorch over the models (min):"]
        lines += [f"  {k:<28} {v['geomean']:.2f}x ({v['min']:.2f}x, {v['cells']} cells)" for k, v in s.items()]
    errs = failures(rep)
    if errs:
        lines += ["", "failures:"] + [f"  {e.splitlines()[0][:400]}" for e in errs]
    return "\n".join(lines)


def markdown(rep: dict) -> str:
    dev, env, st = rep["device"], rep["environment"], rep["settings"]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v is not None)
    models = ", ".join(f"{m} (batch {v['batch']}, sample {'x'.join(map(str, v['sample']))})"
                       for m, v in st["models"].items())
    lines = [f"# portconv bench --models on {dev['name']}", "",
             f"- device: {dev['name']} ({dev['torch_device']}); started {rep['started']}, {rep['seconds']:.0f} s; "
             f"git {env.get('git') or 'unknown'}",
             f"- versions: {vers}",
             "- torch flags: " + ", ".join(f"{k}={v}" for k, v in env["torch_flags"].items()),
             f"- native executor (Note [native executor]): {env.get('native', 'not recorded')}",
             f"- models: {models}",
             f"- sides: {', '.join(st['sides'])} (`auto`: `portconv.convert(model)` with the default plan); "
             f"{st['steps']} timed steps per side after {st['warmup']} untimed, in turns of {st['turn_steps']} "
             f"after one untimed step (Note [interleaved entries]); {st['optimizer']}; seed {st['seed']}; "
             f"compile backend `{st['compile_backend']}`",
             f"- float32 precision: {'; '.join(st['precision'] or [])}",
             f"- host load average (1/5/15 min) before {env.get('loadavg_before')}, after {env.get('loadavg')} "
             f"on {env.get('cpus')} CPUs"]
    if not rep.get("complete", True):
        lines.append("- **WARNING: partial run: some cells were not run (`--resume` runs them)**")
    lines += ["", "## Results", "",
              "`x PyTorch`: PyTorch's step median / portconv's (>1: portconv faster). `1st step (in process)`: "
              "PyTorch / portconv, each side's first step in this process (compile included in compiled mode; "
              "PyTorch's side warms up first). Cold / warm: the first step in a fresh process with empty caches, "
              "then with the caches the cold one left (`--first-step`). Loss: after `loss step` steps of the same "
              "data, each side alone in deterministic mode before its timed steps (Note [loss phase]); "
              "`rel diff` = |portconv - PyTorch| / |PyTorch|; `vs float64`: each side's |loss - float64 loss| / "
              "|float64 loss|, PyTorch's model in float64 through the same steps (`--loss-float64`, float32 "
              "cells); `LOSS`: beyond the limit "
              f"({', '.join(f'{k} {v:g}' for k, v in st['loss_limits'].items())}).", "",
              "| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    lines += ["| " + " | ".join(str(r[k] if r[k] is not None else "-") for k in _KEYS) + " |" for r in rows(rep)]
    s = summary(rep)
    if s:
        lines += ["", "## Geomean over the models", "", "| side dtype mode | geomean x PyTorch | min | cells |",
                  "|---|---|---|---|"]
        lines += [f"| {k} | {v['geomean']:.2f}x | {v['min']:.2f}x | {v['cells']} |" for k, v in s.items()]
    host = host_rows(rep)
    if host:
        lines += ["", "## Host time a step", "",
                  "Note [host phases]: each phase's median wall time on the host over a side's timed "
                  "steps, with no synchronisation inside a step (on a GPU, the time to enqueue it). `host / step`: "
                  "their sum over the step's median; near 1 (or above: the host works ahead of the device) the step is "
                  "host-bound and `more than PyTorch` is step time.", "",
                  "| model | dtype | layout | mode | side | host ms: forward / backward / optimizer | host ms | "
                  "more than PyTorch | step ms | host / step |", "|" + "---|" * 10] + host
    errs = failures(rep)
    if errs:
        lines += ["", "## Failures", ""] + [f"- {e.splitlines()[0][:600]}" for e in errs]
    lines += ["", "## Method", "", METHOD]
    return "\n".join(lines) + "\n"


METHOD = """\
- One training step = forward and loss (cross-entropy on random labels; the autoencoder: MSE against its input),
  backward, SGD with momentum, zero_grad. Float32, or forward and loss under `torch.autocast(dtype=bfloat16)`.
- Both sides start from one model built under the seed (dropout and stochastic depth set to 0, so both compute one
  deterministic function): PyTorch's side is a deep copy of it, portconv's `portconv.convert()` of another copy.
  Both see the same fixed-seed batches in the same order and take the same number of steps.
- Compiled mode: `torch.compile(model)` (the loss and the optimizer stay eager); dynamo is reset before each cell.
- Timing: CUDA events around each step on the current stream (GPU) or the wall clock (CPU); the sides take their
  timed steps in turns so drift in clocks and host load hits both (Note [interleaved entries]).
"""


def chart(rep: dict, path) -> tuple[pathlib.Path | None, str | None]:
    """x PyTorch per model, one panel per mode, one bar per (dtype, layout, side); (path, None) or (None, why)."""
    try:
        import matplotlib
    except ImportError:
        return None, "matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    cells = [c for c in rep["cells"] if any(r.get("x_torch") for r in c.get("sides", {}).values())]
    if not cells:
        return None, "no cell has a step-time ratio to draw"
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    names = list(dict.fromkeys(c["model"] for c in cells))
    series = list(dict.fromkeys((c["dtype"], c["layout"], s) for c in cells for s, r in c["sides"].items()
                                if r.get("x_torch")))
    val = {(c["mode"], c["model"], c["dtype"], c["layout"], s): r["x_torch"] for c in cells
           for s, r in c["sides"].items() if r.get("x_torch")}
    ncol = min(len(series), 4)
    height = 2.8 * len(modes) + 0.7 + 0.25 * math.ceil(len(series) / ncol)
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(8.0, 1.3 * len(names) * max(1, len(series)) ** 0.5 + 3),
                                                     height), squeeze=False, sharex=True)
    bar, cmap = 0.8 / len(series), plt.get_cmap("tab10")
    got = list(val.values()) + [1.0]
    lo, hi = 10 ** (math.floor(math.log10(min(got)) * 4) / 4), 10 ** (math.ceil(math.log10(max(got)) * 4) / 4)
    for ax, mode in zip(axes[:, 0], modes):
        for j, (d, lay, s) in enumerate(series):
            xs = [(i - 0.4 + bar * (j + 0.5), val.get((mode, m, d, lay, s))) for i, m in enumerate(names)]
            xs = [(x, v) for x, v in xs if v]  # bars from 1x: up where portconv is faster, down where slower
            ax.bar([x for x, _ in xs], [v - 1 for _, v in xs], bar, bottom=1.0, color=cmap(j % 10),
                   label=f"{s} {d} {lay}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.05, hi * 1.05)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_ylabel(f"{mode}\nx PyTorch")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[-1, 0].set_xticks(range(len(names)))
    axes[-1, 0].set_xticklabels(names, rotation=20, ha="right", fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    head = 1 - 0.45 / height  # below the title
    fig.legend(handles, labels, fontsize=8, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, head))
    fig.suptitle("training step, PyTorch time / portconv time (median, >1: portconv faster) on "
                 f"{rep['device']['name']}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, head - (0.25 * math.ceil(len(series) / ncol) + 0.1) / height))
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None


def write_all(rep: dict, out_dir, log=print) -> dict[str, str]:
    """models.json, models.md and models.png under ``out_dir`` (report.write_outputs), with the summary."""
    rep["summary"] = summary(rep)
    return write_outputs(rep, out_dir, "models", chart, markdown, "x PyTorch per model", log)
