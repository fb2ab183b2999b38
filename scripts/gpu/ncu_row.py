"""Calls of one suite row on a backend (or PyTorch's own call), for Nsight Compute.

Run from the repository root on a CUDA machine, under ncu, e.g.
  ncu --clock-control none -k regex:portconv --section SpeedOfLight --section WarpStateStats \
      python3 scripts/gpu/ncu_row.py resnet50-l1-3x3 float16 fwd,bwd-data,bwd-weight [cuda|cudnn|hip|aten] [TILE]
Each direction runs three times on the plan of the backend given (default cuda; `aten`: PyTorch's own convolution,
whatever ATen picks); TILE sets portconv.options(igemm_tile=TILE) for the cuda plan.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

import portconv
from portconv.bench.data import host_random, plan_layout, torch_sets
from portconv.bench.suite import load_suite, select

MASKS = {"fwd": None, "bwd-data": (True, False, False), "bwd-weight": (False, True, False)}


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50-l1-3x3"
    dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
    dirs = (sys.argv[3] if len(sys.argv) > 3 else "fwd,bwd-data,bwd-weight").split(",")
    backend = sys.argv[4] if len(sys.argv) > 4 else "cuda"
    tile = sys.argv[5] if len(sys.argv) > 5 else None
    (row,) = select(load_suite()[0], name)
    row = dataclasses.replace(row, dtype=dtype)
    lay = plan_layout(row.case, dtype)
    (s,) = torch_sets(lay, host_random(lay, 1, 1), 1, torch.device("cuda", 0))
    with portconv.options(**({"igemm_tile": tile} if tile else {})):
        plan = portconv.plan(s.input, s.weight, s.bias, **row.case.conv_args(), backend=backend)
    print(plan.explain(), flush=True)
    for d in dirs:
        for _ in range(3):
            if MASKS[d] is None:
                plan.forward(s.input, s.weight, s.bias)
            else:
                plan.backward(s.grad_output, s.input, s.weight, MASKS[d])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
