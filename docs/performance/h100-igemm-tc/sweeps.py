"""Shared by the versions' compare.py: load a sweep (`scripts/gpu/igemm_tc.py` JSON), the geomean, the table."""
import json
import math
import statistics

DIRS = ("fwd", "bwd-data", "bwd-weight")
DTYPES = ("float16", "bfloat16", "float32")


def load(path, entry):
    """{(row, dtype, direction): (cuDNN ms, ``entry``'s ms)} of one sweep file, cells ``entry`` timed."""
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        for d in DIRS:
            ms = r["ms"].get(entry, {}).get(d)
            if ms:
                out[(r["row"], r["dtype"], d)] = (r["ms"]["cudnn"][d], ms)
    return out


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def table(before, after, cudnn, old, new):
    """Per dtype and direction (and all): cuDNN ms / ms geomean before and after, and the speed-up."""
    print(f"{'dtype':9s} {'dir':10s} {old:>6s} {new:>6s} {'speed-up':>8s}   (cuDNN ms / igemm-tc ms, geomean over "
          f"14 rows)")
    for dt in DTYPES + ("all",):
        for d in DIRS + ("all",):
            keys = [k for k in after if (dt == "all" or k[1] == dt) and (d == "all" or k[2] == d)]
            b = gm([cudnn[k] / before[k][1] for k in keys])
            a = gm([cudnn[k] / after[k][1] for k in keys])
            print(f"{dt:9s} {d:10s} {b:6.2f} {a:6.2f} {gm([before[k][1] / after[k][1] for k in keys]):7.2f}x")


def pooled_cudnn(root, versions, cells):
    """{cell: the median of every cuDNN time the sweeps under root/<versions> (a glob, 'v[456]') measured for it}
    for ``cells`` (cuDNN moved up to 4x, once 14x, between processes); and how many sweeps there were."""
    runs = []
    for p in sorted(root.glob(f"{versions}/**/*.json")):
        if "bench" in str(p) or "small" in p.name:
            continue
        rows = json.loads(p.read_text()).get("rows", [])
        if rows and "ms" in rows[0]:
            runs.append(load(p, "cudnn"))
    return {k: statistics.median([r[k][0] for r in runs if k in r]) for k in cells}, len(runs)


def moved(before, after, cudnn, runs, old, new):
    """The pool's size and the cells whose time moved by more than 10% between before and after."""
    print(f"\ncuDNN pooled over {runs} sweeps. Cells that moved by more than 10%: {old} ms -> {new} ms (cuDNN ms, "
          f"{new} ratio)")
    for k in sorted(after):
        if abs(before[k][1] / after[k][1] - 1) > 0.1:
            print(f"  {k[0]:26s} {k[1]:9s} {k[2]:10s} {before[k][1]:7.3f} -> {after[k][1]:7.3f}  ({cudnn[k]:.3f}, "
                  f"{cudnn[k] / after[k][1]:.2f}x)")
