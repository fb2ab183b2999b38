"""Geomeans of igemm-tc vs cuDNN before (start of the session, v3 code) and after (v4, tap-major steps + M-lane
gathers) over the 14 dense rows x 3 directions, from the sweeps in this folder. Run: python3 compare.py"""
import json
import math
import pathlib
import re
import statistics

HERE = pathlib.Path(__file__).parent
DIRS = ("fwd", "bwd-data", "bwd-weight")


def from_json(path):
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        for d in DIRS:
            out[(r["row"], r["dtype"], d)] = (r["ms"]["cudnn"][d], r["ms"]["tc-auto"][d])
    return out


def from_text(path):
    out = {}
    for line in path.read_text().splitlines():
        row, dtype = line.split()[:2]
        for d in DIRS:
            m = re.search(rf"\| {d} cudnn ([\d.]+) auto ([\d.]+)", line)
            out[(row, dtype, d)] = (float(m.group(1)), float(m.group(2)))
    return out


before = from_text(HERE / "before-sweep-float16-float32.txt") | from_json(HERE / "before-sweep-bfloat16.json")
after = {}
for dt in ("float16", "bfloat16", "float32"):
    after |= from_json(HERE / f"after-sweep-{dt}.json")
extra = [from_json(p) for p in sorted((HERE / "cudnn-extra").glob("run*/*.json"))]


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


print(f"{'dtype':9s} {'dir':10s} {'before':>7s} {'after':>7s} {'before*':>7s} {'after*':>7s} {'speed-up':>8s}\n"
      "(ratio = cuDNN ms / igemm-tc ms, geomean over the 14 dense rows; * = cuDNN as the median of its 2-4 runs this "
      "session, the same for before and after; speed-up = geomean of igemm-tc ms before / after)")
for dt in ("float16", "bfloat16", "float32", "all"):
    for d in DIRS + ("all",):
        keys = [k for k in after if (dt == "all" or k[1] == dt) and (d == "all" or k[2] == d)]
        b = gm([before[k][0] / before[k][1] for k in keys])
        a = gm([after[k][0] / after[k][1] for k in keys])
        cud = {k: statistics.median([before[k][0], after[k][0]] + [e[k][0] for e in extra if k in e]) for k in keys}
        pb = gm([cud[k] / before[k][1] for k in keys])
        pa = gm([cud[k] / after[k][1] for k in keys])
        sp = gm([before[k][1] / after[k][1] for k in keys])
        print(f"{dt:9s} {d:10s} {b:7.2f} {a:7.2f} {pb:7.2f} {pa:7.2f} {sp:7.2f}x")
print("\nper cell, igemm-tc ms before -> after (x = before/after):")
for k in sorted(after):
    b, a = before[k][1], after[k][1]
    print(f"  {k[0]:26s} {k[1]:9s} {k[2]:10s} {b:7.3f} -> {a:7.3f}  {b / a:5.2f}x")
