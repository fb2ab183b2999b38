"""How close can any kernel get to a depthwise row's bandwidth floor? The held-stream device time (Note [held stream],
as `portconv bench --hold-stream` measures) of a plain device copy with the same bytes as the row's forward (read the
input, write the output: torch's copy_ of a flat buffer; rows whose output size differs are left out) and of a
one-element kernel launch, against the floor (bytes / the best 1 GiB copy bandwidth of this process, as
depthwise_bench.py computes it).

Run from the repository root on a CUDA machine: PYTHONPATH=. python3 scripts/gpu/copy_floor.py [ROWS]
(ROWS: comma-separated suite row names, default the depthwise rows). Prints a markdown table.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys
from math import prod

import torch

from portconv.bench.timing import CudaClock

ROWS = ["mbv2-dw3x3", "mbv2-dw3x3-bf16", "mbv2-dw3x3-bf16-cl", "mbv2-dw3x3-s2", "mbv2-dw3x3-last", "mbv2-dw3x3-b1",
        "dw3d-3x3x3"]


def copy_bandwidth() -> float:
    a = torch.empty(1 << 28, device="cuda")
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        best = max(best, 2 * a.numel() * 4 / s.elapsed_time(e))
    return best  # bytes / ms


def held_ms(call, sets, runs: int = 60) -> float:
    clock = CudaClock(torch.device("cuda"), hold=True)
    for _ in range(3):
        clock.samples(call, sets[:10])
    got = []
    while len(got) < runs:
        got += clock.samples(call, sets)
    return statistics.median(got)


def main() -> None:
    want = sys.argv[1].split(",") if len(sys.argv) > 1 else ROWS
    spec = json.loads(pathlib.Path("portconv/bench/suite.json").read_text())
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e6:.1f} GB/s; {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| row | bytes (fwd) | floor ms | copy held ms (% of floor) | one-element kernel held ms |")
    print("|---|---|---|---|---|")
    tiny = [torch.zeros(1, device="cuda") for _ in range(4)]
    launch = held_ms(lambda t: t.add_(1), tiny)
    for c in spec["rows"]:
        if c["name"] not in want:
            continue
        es = torch.finfo(getattr(torch, c["dtype"])).bits // 8
        nin = c["n"] * c["c"] * prod(c["spatial"])
        out_sp = [(i + 2 * p - k) // s + 1 for i, p, k, s in zip(c["spatial"], c["padding"], c["kernel"], c["stride"])]
        nout = c["n"] * c["k"] * prod(out_sp)
        nbytes = (nin + nout) * es
        count = max(3, -(-2 * 50 * 2**20 // nbytes) + 1)  # rotate past the 50 MB L2
        sets = [(torch.randn(nin, device="cuda").to(getattr(torch, c["dtype"])),
                 torch.empty(nout, device="cuda", dtype=getattr(torch, c["dtype"]))) for _ in range(count)]
        if nin != nout:  # a copy moves equal bytes in and out: rows whose output is smaller are left out
            continue
        ms = held_ms(lambda s: s[1].copy_(s[0]), sets)
        floor = nbytes / bw
        print(f"| {c['name']} | {nbytes} | {floor:.4f} | {ms:.4f} ({100 * floor / ms:.0f}%) | {launch:.4f} |",
              flush=True)


if __name__ == "__main__":
    main()
