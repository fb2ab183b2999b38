"""How close can any kernel get to a depthwise row's bandwidth floor? Device times, held (Note [held stream], as
`portconv bench --hold-stream` measures) and kernel-only (torch.profiler), against the floor (bytes / the copy
bandwidth portconv bench's roofline measures, portconv.bench.roofline.measure_bandwidth, in this process), of:

- nothing between the two events, an empty kernel (CuPy, one warp) and a one-element torch kernel (add_): what the
  timing method costs before any work;
- a plain device copy with the same bytes as the row's forward (read the input, write the output; rows whose output
  size differs are left out): torch's copy_ of a flat buffer, and the fastest of hand-written 16-byte copies (CuPy,
  grid-stride, U vectors a thread loaded before any is stored, one pass or SMS x k blocks);
- portconv's cuda forward of the row (the default plan's kernels).

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
COPY = r"""
extern "C" __global__ void copy16(const uint4 *__restrict__ s, uint4 *__restrict__ d, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x * U;
    for (long long i = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; i < n; i += step) {
        uint4 r[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * blockDim.x < n) r[u] = s[i + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * blockDim.x < n) d[i + u * blockDim.x] = r[u];
    }
}
extern "C" __global__ void empty() {}
"""


def kernel_ms(fn, sets, runs):
    """Device time of the kernels per call, from torch.profiler (CUPTI sees CuPy's launches too)."""
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            fn(i % sets)
        torch.cuda.synchronize()
    tot = 0.0
    for ev in prof.key_averages():
        tot += getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0) or 0
    return tot / runs / 1000.0


def held_ms(call, sets, runs: int = 60) -> float:
    clock = CudaClock(torch.device("cuda"), hold=True)
    for _ in range(3):
        clock.samples(call, sets[:10])
    got = []
    while len(got) < runs:
        got += clock.samples(call, sets)
    return statistics.median(got)


def both(call, sets) -> tuple[float, float]:
    """(held ms, kernel ms) of a call over rotating argument sets."""
    return held_ms(call, sets), kernel_ms(lambda i: call(sets[i % len(sets)]), len(sets), 60)


class Raw:
    """The hand-written kernels, launched by CuPy on torch's current stream."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        mods = {u: cupy.RawModule(code=COPY, options=(f"-DU={u}",)) for u in (1, 2, 4, 8)}
        self.copies = {u: m.get_function("copy16") for u, m in mods.items()}
        self.empty_fn = mods[1].get_function("empty")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.streams = {}

    def stream(self):
        key = (torch.cuda.current_stream().cuda_stream, torch.cuda.current_device())
        if key not in self.streams:
            self.streams[key] = self.cupy.cuda.ExternalStream(*key)
        return self.streams[key]

    def empty(self, _):
        with self.stream():
            self.empty_fn((1,), (32,), ())

    def copy(self, u: int, blocks: int):
        import numpy as np

        fn = self.copies[u]

        def call(s):
            n = s[0].numel() * s[0].element_size() // 16
            with self.stream():
                fn((blocks or -(-n // (256 * u)),), (256,), (np.uint64(s[0].data_ptr()), np.uint64(s[1].data_ptr()),
                                                             np.int64(n)))
        return call


def forward(row, count: int):
    """portconv's cuda forward of the row on rotating inputs: (call, sets)."""
    import portconv

    c, dt = row.case, getattr(torch, row.dtype)
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(len(c.input_shape) - 2)
    w = torch.randn(c.weight_shape, device="cuda").to(dt)
    xs = [torch.randn(c.input_shape, device="cuda").to(dt) for _ in range(count)]
    if c.layout == "chlast":
        xs = [x.contiguous(memory_format=fmt) for x in xs]
    conv = portconv.functional.conv2d if len(c.input_shape) == 4 else portconv.functional.conv3d

    def call(x):
        return conv(x, w, None, c.stride, c.padding, c.dilation, c.groups, backend="cuda")
    return call, xs


def main() -> None:
    rows = select(load_suite()[0], sys.argv[1] if len(sys.argv) > 1 else ",".join(ROWS))
    bw = measure_bandwidth(torch.device("cuda"))["bytes_per_s"] / 1e3  # bytes / ms
    raw = Raw()
    print(f"copy bandwidth {bw / 1e6:.1f} GB/s; {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"ms held / kernel-only (% of the floor held / kernel-only)\n")
    tiny = [torch.zeros(1, device="cuda") for _ in range(4)]
    fixed = {"nothing between the events": both(lambda t: None, tiny), "empty kernel (CuPy)": both(raw.empty, tiny),
             "one-element add_ (torch)": both(lambda t: t.add_(1), tiny)}
    print("| what | held ms | kernel ms |\n|---|---|---|")
    for k, (h, kern) in fixed.items():
        print(f"| {k} | {h:.4f} | {kern:.4f} |")
    print("\n| row | bytes (fwd) | floor ms | torch copy_ | best hand-written copy (U, blocks) | portconv forward |")
    print("|---|---|---|---|---|---|")

    def cell(hk, floor):
        return f"{hk[0]:.4f} / {hk[1]:.4f} ({100 * floor / hk[0]:.0f}% / {100 * floor / max(hk[1], 1e-9):.0f}%)"
    for row in rows:
        b = tensor_bytes(row.case, row.dtype)
        if b["input"] != b["output"]:  # a copy moves equal bytes in and out: rows whose output differs are left out
            continue
        nbytes, dt = b["input"] + b["output"], getattr(torch, row.dtype)
        n = b["input"] // ITEMSIZE[row.dtype]
        count = max(3, -(-2 * 50 * 2**20 // nbytes) + 1)  # rotate past the 50 MB L2
        sets = [(torch.randn(n, device="cuda").to(dt), torch.empty(n, device="cuda", dtype=dt)) for _ in range(count)]
        floor = nbytes / bw
        tcopy = both(lambda s: s[1].copy_(s[0]), sets)
        hand = {(u, k): both(raw.copy(u, k * raw.sms), sets) for u in (1, 2, 4, 8) for k in (0, 1, 2, 4, 8)}
        (u, k), best = min(hand.items(), key=lambda kv: kv[1][0])
        del sets
        call, xs = forward(row, count)
        fwd = both(call, xs)
        del xs
        print(f"| {row.name} | {nbytes} | {floor:.4f} | {cell(tcopy, floor)} | {cell(best, floor)} "
              f"(U {u}, {'one pass' if k == 0 else f'{k} x SMs'}) | {cell(fwd, floor)} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
