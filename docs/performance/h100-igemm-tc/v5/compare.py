"""igemm-tc v4 -> v5 against cuDNN over the 14 dense rows x 3 directions, per dtype. Run: python3 compare.py

before: v4 as it landed (../v4/after-sweep-<dtype>.json, the previous session's final code, and float16's `tc-v4`
column of first-sweep-float16.json, this session's first process, before split stores). after: v5
(sweep-<dtype>.json, `tc-auto`). cuDNN: the median of every cuDNN time this and the v4 session measured for the cell
(its time moved up to 4x between processes), the same for before and after.
"""
import json
import math
import pathlib
import statistics

HERE = pathlib.Path(__file__).parent
DIRS = ("fwd", "bwd-data", "bwd-weight")
DTYPES = ("float16", "bfloat16", "float32")


def load(path, entry):
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        for d in DIRS:
            out[(r["row"], r["dtype"], d)] = (r["ms"]["cudnn"][d], r["ms"][entry][d])
    return out


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


after, before, cudnn = {}, {}, {}
for dt in DTYPES:
    after |= load(HERE / f"sweep-{dt}.json", "tc-auto")
    before |= load(HERE.parent / "v4" / f"after-sweep-{dt}.json", "tc-auto")
before |= load(HERE / "first-sweep-float16.json", "tc-v4")  # the same v4 code, this session's process
runs = [load(p, "tc-auto") for p in sorted(HERE.parent.glob("v4/*sweep-*.json")) if "small" not in p.name]
runs += [load(p, "tc-auto") for p in sorted(HERE.glob("*sweep-*.json"))]
runs += [load(p, "tc-auto") for p in sorted(HERE.parent.glob("v4/cudnn-extra/run*/*.json"))]
for k in after:
    cudnn[k] = statistics.median([r[k][0] for r in runs if k in r])

print(f"{'dtype':9s} {'dir':10s} {'v4':>6s} {'v5':>6s} {'speed-up':>8s}   (cuDNN ms / igemm-tc ms, geomean over 14 rows)")
for dt in DTYPES + ("all",):
    for d in DIRS + ("all",):
        keys = [k for k in after if (dt == "all" or k[1] == dt) and (d == "all" or k[2] == d)]
        b = gm([cudnn[k] / before[k][1] for k in keys])
        a = gm([cudnn[k] / after[k][1] for k in keys])
        print(f"{dt:9s} {d:10s} {b:6.2f} {a:6.2f} {gm([before[k][1] / after[k][1] for k in keys]):7.2f}x")
print("\nper cell: v4 ms -> v5 ms (cuDNN ms, v5 ratio)")
for k in sorted(after):
    print(f"  {k[0]:26s} {k[1]:9s} {k[2]:10s} {before[k][1]:7.3f} -> {after[k][1]:7.3f}  ({cudnn[k]:.3f}, "
          f"{cudnn[k] / after[k][1]:.2f}x)")
