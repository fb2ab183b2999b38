"""igemm-tc v5 -> v6 against cuDNN over the 14 dense rows x 3 directions, per dtype. Run: python3 compare.py

before: v5 (`tc-v5` of sweep-<dtype>.json: PORTCONV_CUDA_IGEMM_TC_V5=1, no TN tile; and `tc-128x64` of
narrow-<dtype>.json for the backward-data of resnet50-stem and deepbench-speech-c1, the tile v5 took there). after:
v6 (`tc-auto` of sweep-<dtype>.json; `tc-auto` of narrow-<dtype>.json for those two cells, measured after the narrow
tile's swizzle fix). Both from the same processes. cuDNN: the median of every cuDNN time the v4, v5 and v6 sweeps
measured for the cell (it moved up to 4x, once 14x, between processes), the same for before and after.
"""
import json
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from sweeps import DTYPES, load, table  # noqa: E402
NARROW = ("resnet50-stem", "deepbench-speech-c1")

before, after = {}, {}
for dt in DTYPES:
    before |= load(HERE / f"sweep-{dt}.json", "tc-v5")
    after |= load(HERE / f"sweep-{dt}.json", "tc-auto")
    nb, na = load(HERE / f"narrow-{dt}.json", "tc-128x64"), load(HERE / f"narrow-{dt}.json", "tc-auto")
    for k in na:
        if k[0] in NARROW and k[2] == "bwd-data":
            before[k], after[k] = nb[k], na[k]
sweeps = [p for p in HERE.parent.glob("v[456]/**/*.json") if "bench" not in str(p) and "small" not in p.name]
runs = []
for p in sorted(sweeps):
    rows = json.loads(p.read_text()).get("rows", [])
    if rows and "ms" in rows[0]:
        runs.append(load(p, "cudnn"))
cudnn = {k: statistics.median([r[k][0] for r in runs if k in r]) for k in after}

table(before, after, cudnn, "v5", "v6")
print(f"\ncuDNN pooled over {len(runs)} sweeps. Cells that moved by more than 10%: v5 ms -> v6 ms (cuDNN ms, v6 ratio)")
for k in sorted(after):
    if abs(before[k][1] / after[k][1] - 1) > 0.1:
        print(f"  {k[0]:26s} {k[1]:9s} {k[2]:10s} {before[k][1]:7.3f} -> {after[k][1]:7.3f}  ({cudnn[k]:.3f}, "
              f"{cudnn[k] / after[k][1]:.2f}x)")
