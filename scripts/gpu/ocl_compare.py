"""Per-direction geomean of the opencl medians of bench A over bench B (rows both ran), with the per-row ratios:
python3 scripts/gpu/ocl_compare.py A.json B.json 'label'."""
import json
import math
import sys

a, b = (json.load(open(p)) for p in sys.argv[1:3])
label = sys.argv[3] if len(sys.argv) > 3 else "A ms / B ms"


def med(row, d):
    return (row["results"].get("opencl", {}).get("directions", {}).get(d) or {}).get("median_ms")


rb = {r["name"]: r for r in b["rows"]}
for d in ("fwd", "bwd-data", "bwd-weight"):
    pairs = [(r["name"], med(r, d) / med(rb[r["name"]], d)) for r in a["rows"]
             if r["name"] in rb and med(r, d) and med(rb[r["name"]], d)]
    if pairs:
        g = math.exp(sum(math.log(v) for _, v in pairs) / len(pairs))
        print(f"  {d}: {label}, geomean {g:.3f} over {len(pairs)} rows: "
              + " ".join(f"{n.split('-', 1)[-1][:14]}={v:.2f}" for n, v in pairs))
