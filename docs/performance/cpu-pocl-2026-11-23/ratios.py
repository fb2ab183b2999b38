"""PyTorch CPU ms / portconv opencl (PoCL) ms per depthwise row and direction, for every run here (b<N>-r<K>: before
Note [channels-last depthwise]; cl-b<N>: after it). Run: python3 ratios.py"""
import json
import pathlib

HERE = pathlib.Path(__file__).parent
DIRS = ("fwd", "bwd-data", "bwd-weight")
for b in (1, 2):
    cells = {}
    runs = sorted(HERE.glob(f"b{b}-r*/bench.json")) + sorted(HERE.glob(f"cl-b{b}/bench.json"))
    for run in runs:
        for row in json.loads(run.read_text())["rows"]:
            res = row["results"]
            for d in DIRS:
                r = res["torch"]["directions"][d]["median_ms"] / res["opencl"]["directions"][d]["median_ms"]
                cells.setdefault(row["name"], {}).setdefault(d, []).append(r)
    print(f"batch {b} (runs {', '.join(p.parent.name for p in runs)})")
    for name, v in cells.items():
        print(f"  {name:20s}" + "".join(f"  {d} {' / '.join(f'{x:.2f}x' for x in xs):16s}" for d, xs in v.items()))
