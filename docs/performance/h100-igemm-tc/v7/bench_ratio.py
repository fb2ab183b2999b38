"""cuDNN ms / portconv cuda ms per row and direction from `portconv bench` JSON reports, over the dense (groups = 1)
rows the cuda backend runs on igemm-tc (target 3's set: the 15 dense non-depthwise rows of the suite), and over every
row. The grouped rows (resnext50-g32, wav2vec2-posconv-g16) are not in the first set, whatever they run on (direct
kernels before Note [grouped implicit GEMM], posconv on igemm-tc after it). Two references from the same process:
'cudnn', portconv's cudnn backend entry (the measure of the v5 and v6 reports), and 'best', the faster of it and
PyTorch's own entry (both run cuDNN; cuDNN's time for one call moved up to 4x between entries of one process, so
this is the conservative reference).

    python3 bench_ratio.py A.json [B.json ...]
"""
import json
import math
import sys

DIRS = ("fwd", "bwd-data", "bwd-weight")


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


for f in sys.argv[1:]:
    rep = json.load(open(f))
    print(f)
    acc = {(ref, sel): {d: [] for d in DIRS} for ref in ("cudnn", "best") for sel in ("dense", "all")}
    for r in rep["rows"]:
        res = r["results"]
        alg = res["cuda"]["plan"]["algorithm"]
        dense = alg == "igemm-tc" and r["groups"] == 1
        cells = []
        for d in DIRS:
            cu = res["cuda"]["directions"][d]["median_ms"]
            cd = res["cudnn"]["directions"][d]["median_ms"]
            best = min(cd, res["torch"]["directions"][d]["median_ms"])
            for sel in ("dense", "all"):
                if sel == "all" or dense:
                    acc["cudnn", sel][d].append(cd / cu)
                    acc["best", sel][d].append(best / cu)
            cells.append(f"{cd / cu:5.2f} ({best / cu:4.2f})")
        print(f"  {r['name'][:26]:26s} {r['dtype'][:8]:8s} {alg:9s}" + " ".join(cells))
    for (ref, sel), a in acc.items():
        if not a["fwd"]:
            continue
        print(f"  {sel:5s} rows vs {ref:5s}:", " ".join(f"{d} {gm(x):.3f}" for d, x in a.items()),
              f"all {gm(sum(a.values(), [])):.3f} ({len(a['fwd'])} rows)")
