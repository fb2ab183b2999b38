"""The PNG chart: speed-up vs PyTorch per row, one panel per direction (and their sum), one bar per entry."""
from __future__ import annotations

import math
import pathlib


def _series(report: dict) -> tuple[list[str], list[str], list[str], dict]:
    """(rows, entries, panels, values[panel][entry] = list aligned with rows, None where no number)."""
    dirs = report["settings"]["directions"]
    panels = list(dirs) + (["sum"] if len(dirs) > 1 else [])
    rows = [r["name"] for r in report["rows"]]
    entries = []
    for r in report["rows"]:
        entries += [k for k in r["results"] if k != "torch" and k not in entries]
    values = {p: {e: [r["results"].get(e, {}).get("speedup_vs_torch", {}).get(p) for r in report["rows"]]
                  for e in entries} for p in panels}
    entries = [e for e in entries if any(v for p in panels for v in values[p][e])]
    return rows, entries, panels, values


def chart(report: dict, path: str | pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """Write the chart; returns (path, None), or (None, the reason it was not drawn)."""
    try:
        import matplotlib
    except ImportError:
        return None, "matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows, entries, panels, values = _series(report)
    if not rows or not entries:
        return None, "no entry besides torch has a speed-up to draw"
    width = max(8.0, 0.45 * len(rows) * max(1, len(entries)) ** 0.5 + 3)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 2.6 * len(panels) + 1.2), squeeze=False, sharex=True)
    bar = 0.8 / len(entries)
    cmap = plt.get_cmap("tab10")
    for ax, panel in zip(axes[:, 0], panels):
        for j, e in enumerate(entries):
            xs = [i - 0.4 + bar * (j + 0.5) for i in range(len(rows))]
            vals = values[panel][e]
            ax.bar([x for x, v in zip(xs, vals) if v], [v for v in vals if v], bar, color=cmap(j % 10), label=e)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        got = [v for e in entries for v in values[panel][e] if v]
        if got:
            lo, hi = min(got + [1.0]), max(got + [1.0])
            ax.set_ylim(10 ** (math.floor(math.log10(lo) * 2) / 2), 10 ** (math.ceil(math.log10(hi) * 2) / 2))
        fmt = FuncFormatter(lambda v, _: f"{v:g}x")
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_ylabel(f"{panel}\nx PyTorch")
        ax.grid(axis="y", which="both", alpha=0.3)
    ax = axes[-1, 0]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(rows, rotation=60, ha="right", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    top = 1 - 0.9 / (2.6 * len(panels) + 1.2)
    fig.legend(handles, labels, fontsize=8, ncol=min(len(entries), 6), loc="upper center",
               bbox_to_anchor=(0.5, top + 0.02))
    dev = report["device"]
    fig.suptitle(f"portconv speed-up vs PyTorch (median, >1 is faster) on {dev['name']} ({dev['torch_device']})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, top - 0.01))
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None
