"""How close can any kernel get to a depthwise row's bandwidth floor? The held-stream device time (Note [held stream],
as `portconv bench --hold-stream` measures) of a plain device copy with the same bytes as the row's forward (read the
input, write the output: torch's copy_ of a flat buffer; rows whose output size differs are left out) and of a
one-element kernel launch, against the floor (bytes / the copy bandwidth portconv bench's roofline measures,
portconv.bench.roofline.measure_bandwidth, in this process).

Run from the repository root on a CUDA machine: PYTHONPATH=. python3 scripts/gpu/copy_floor.py [ROWS]
(ROWS: comma-separated suite row names, default the depthwise rows). Prints a markdown table.
"""
from __future__ import annotations

import statistics
import sys

import torch

from portconv.bench.roofline import ITEMSIZE, measure_bandwidth, tensor_bytes
from portconv.bench.suite import load_suite, select
from portconv.bench.timing import CudaClock

ROWS = ["mbv2-dw3x3", "mbv2-dw3x3-bf16", "mbv2-dw3x3-bf16-cl", "mbv2-dw3x3-s2", "mbv2-dw3x3-last", "mbv2-dw3x3-b1",
        "dw3d-3x3x3"]


def held_ms(call, sets, runs: int = 60) -> float:
    clock = CudaClock(torch.device("cuda"), hold=True)
    for _ in range(3):
        clock.samples(call, sets[:10])
    got = []
    while len(got) < runs:
        got += clock.samples(call, sets)
    return statistics.median(got)


def main() -> None:
    rows = select(load_suite()[0], sys.argv[1] if len(sys.argv) > 1 else ",".join(ROWS))
    bw = measure_bandwidth(torch.device("cuda"))["bytes_per_s"] / 1e3  # bytes / ms
    print(f"copy bandwidth {bw / 1e6:.1f} GB/s; {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| row | bytes (fwd) | floor ms | copy held ms (% of floor) | one-element kernel held ms |")
    print("|---|---|---|---|---|")
    tiny = [torch.zeros(1, device="cuda") for _ in range(4)]
    launch = held_ms(lambda t: t.add_(1), tiny)
    for row in rows:
        b = tensor_bytes(row.case, row.dtype)
        if b["input"] != b["output"]:  # a copy moves equal bytes in and out: rows whose output differs are left out
            continue
        nbytes, dt = b["input"] + b["output"], getattr(torch, row.dtype)
        n = b["input"] // ITEMSIZE[row.dtype]
        count = max(3, -(-2 * 50 * 2**20 // nbytes) + 1)  # rotate past the 50 MB L2
        sets = [(torch.randn(n, device="cuda").to(dt), torch.empty(n, device="cuda", dtype=dt)) for _ in range(count)]
        ms = held_ms(lambda s: s[1].copy_(s[0]), sets)
        floor = nbytes / bw
        print(f"| {row.name} | {nbytes} | {floor:.4f} | {ms:.4f} ({100 * floor / ms:.0f}%) | {launch:.4f} |",
              flush=True)


if __name__ == "__main__":
    main()
