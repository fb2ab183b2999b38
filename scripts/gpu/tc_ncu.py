"""Calls of one dense suite row on the cuda backend's igemm-tc plan, for Nsight Compute.

Run from the repository root on a CUDA machine, under ncu, e.g.
  ncu --clock-control none -k regex:portconv_igemm --section SpeedOfLight --section WarpStateStats \
      --section InstructionStats python3 scripts/gpu/tc_ncu.py resnet50-l1-3x3 float16 fwd,bwd-data,bwd-weight
Each direction runs twice (the first call records the replayed launches); the row runs in the dtype given.
A fourth argument `torch` runs PyTorch's own call (cuDNN) instead, three times a direction, for its kernels.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

import portconv
from portconv.bench.data import host_random, plan_layout, torch_sets
from portconv.bench.runner import _Calls
from portconv.bench.suite import load_suite, select


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50-l1-3x3"
    dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
    dirs = (sys.argv[3] if len(sys.argv) > 3 else "fwd,bwd-data,bwd-weight").split(",")
    rows, _ = load_suite()
    (row,) = select(rows, name)
    row = dataclasses.replace(row, dtype=dtype)
    lay = plan_layout(row.case, dtype)
    (s,) = torch_sets(lay, host_random(lay, 1, 1), 1, torch.device("cuda", 0))
    torch_call = len(sys.argv) > 4 and sys.argv[4] == "torch"
    if torch_call:
        calls = _Calls(row)
    else:
        plan = portconv.plan(s.input, s.weight, s.bias, **row.case.conv_args(), backend="cuda")
        print(f"{name} {dtype}: {plan.algorithm}: {plan.reason}", flush=True)
        calls = _Calls(row, plan)
    for d in dirs:
        for _ in range(3 if torch_call else 2):
            calls.get(d)(s)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
