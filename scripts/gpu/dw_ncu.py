"""One call per direction of a depthwise suite row on PyTorch and on the cuda backend, for Nsight Compute.

Run from the repository root on a CUDA machine, under ncu, e.g.
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats python3 scripts/gpu/dw_ncu.py mbv2-dw3x3-bf16-cl
Each direction runs twice per entry (the first call records the replayed launches); DW_VARIANT as
scripts/gpu/depthwise_bench.py's set_variant (default v3).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import depthwise_bench as db  # noqa: E402


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "mbv2-dw3x3-bf16-cl"
    c = db.suite_rows().get(name) or {r["name"]: r for r in __import__("json").load(
        open("portconv/bench/suite.json"))["rows"]}[name]
    db.set_variant(os.environ.get("DW_VARIANT", "v3"))
    be, plan, xs, w, gos, conv, args = db.make(c, sets=1)
    pl = plan()
    print(pl.reason, flush=True)
    for d in db.DIRS:
        for _ in range(2):
            db.torch_call(d, conv, args, xs[0], w, gos[0])
            db.pc_call(d, be, pl, xs[0], w, gos[0])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
