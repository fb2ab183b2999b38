"""cuDNN ms / portconv cuda ms per row and direction from `portconv bench` terminal logs (the 15 rows the cuda backend
runs on igemm-tc: every dense row but the grouped resnext50-g32 and wav2vec2-posconv-g16, which run direct kernels).
'cudnn': portconv's cudnn backend entry (as v5/v6's bench-ratio.txt); 'best': the faster of it and the torch entry of
the same process (both are cuDNN; the conservative reference)."""
import math
import re
import sys
from collections import defaultdict

GROUPED = {"resnext50-g32", "wav2vec2-posconv-g16"}
DIRS = ("fwd", "bwd-data", "bwd-weight")


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


for f in sys.argv[1:]:
    ms = defaultdict(dict)
    for line in open(f):
        m = re.match(r"\s+(\S+)\s+(torch|cuda|cudnn)\s+(fwd|bwd-data|bwd-weight)\s+median\s+([\d.]+) ms", line)
        if m:
            ms[m.group(1)][(m.group(2), m.group(3))] = float(m.group(4))
    print(f)
    acc = {k: defaultdict(list) for k in ("cudnn", "best")}
    for row, v in ms.items():
        if row in GROUPED:
            continue
        cells = []
        for d in DIRS:
            cu, cd, to = v.get(("cuda", d)), v.get(("cudnn", d)), v.get(("torch", d))
            if not (cu and cd and to):
                continue
            acc["cudnn"][d].append(cd / cu), acc["best"][d].append(min(cd, to) / cu)
            cells.append(f"{cd / cu:.2f} ({min(cd, to) / cu:.2f})")
        print(f"  {row:26s} " + "  ".join(cells))
    for k, a in acc.items():
        print(f"  vs {k:5s}:", {d: (round(gm(x), 3), len(x)) for d, x in a.items()}, round(gm(sum(a.values(), [])), 3))
