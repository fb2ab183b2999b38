"""igemm-tc v4 -> v5 against cuDNN over the 14 dense rows x 3 directions, per dtype. Run: python3 compare.py

before: v4 as it landed (../v4/after-sweep-<dtype>.json, the previous session's final code, and float16's `tc-v4`
column of first-sweep-float16.json, this session's first process, before split stores). after: v5
(sweep-<dtype>.json, `tc-auto`). cuDNN: the median of every cuDNN time this and the v4 session measured for the cell
(its time moved up to 4x between processes), the same for before and after.
"""
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from sweeps import DTYPES, load, table  # noqa: E402

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

table(before, after, cudnn, "v4", "v5")
print("\nper cell: v4 ms -> v5 ms (cuDNN ms, v5 ratio)")
for k in sorted(after):
    print(f"  {k[0]:26s} {k[1]:9s} {k[2]:10s} {before[k][1]:7.3f} -> {after[k][1]:7.3f}  ({cudnn[k]:.3f}, "
          f"{cudnn[k] / after[k][1]:.2f}x)")
