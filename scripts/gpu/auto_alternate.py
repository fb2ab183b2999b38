"""Issue 5 target 2: which of identical cuDNN calls runs the slower plan? PyTorch's own call as the bench made it
until 2026-11-24 (`torch.ops`: torch.ops.aten.convolution / convolution_backward with keywords) and as it makes it
now (`torch`: torch.convolution and the .default overload, positional), portconv's aten backend (`aten`) and the
default plan (`auto`, `auto->aten` on these rows), timed
alternately in one process on one suite row, round after round, with the cuDNN kernels each ran (torch.profiler).

Usage (repository root, CUDA machine):
    PYTHONPATH=.:scripts/gpu python3 scripts/gpu/auto_alternate.py ROW [ROUNDS [RUNS]]
Prints per round and direction each entry's median (ms, CUDA events, inputs rotated over 4 sets), then per entry
the kernel names with their device time per call. Default row resnet50-l3-3x3, 6 rounds of 50 runs.
"""
from __future__ import annotations

import json
import pathlib
import sys
from collections import defaultdict

import torch
from sweep import median_ms  # scripts/gpu/sweep.py (PYTHONPATH=.:scripts/gpu)

import portconv

MASKS = {"bwd-data": [True, False, False], "bwd-weight": [False, True, False]}


def row_of(name: str) -> dict:
    rows = json.loads(pathlib.Path("portconv/bench/suite.json").read_text())["rows"]
    return next(r for r in rows if r["name"] == name)


def calls(r: dict, sets: list, plans: dict) -> dict:
    """{entry: {direction: fn(i)}} for torch, aten, auto on the row's rotated buffer sets."""
    a = dict(stride=r["stride"], padding=r["padding"], dilation=r["dilation"], transposed=r["transposed"],
             output_padding=r["output_padding"], groups=r["groups"])
    op, fwd = torch.ops.aten.convolution_backward, torch.ops.aten.convolution
    out = {"torch.ops": {"fwd": lambda i: fwd(sets[i][0], sets[i][1], None, **a)}}
    for d, m in MASKS.items():
        out["torch.ops"][d] = lambda i, m=m: op(sets[i][2], sets[i][0], sets[i][1], [r["k"]], **a, output_mask=m)
    pos = tuple(a.values())  # the bench's call since Note [PyTorch's fastest binding]
    out["torch"] = {"fwd": lambda i: torch.convolution(sets[i][0], sets[i][1], None, *pos)}
    for d, m in MASKS.items():
        out["torch"][d] = lambda i, m=m: op.default(sets[i][2], sets[i][0], sets[i][1], [r["k"]], *pos, m)
    for name, p in plans.items():
        out[name] = {"fwd": lambda i, p=p: p.forward(sets[i][0], sets[i][1], None)}
        for d, m in MASKS.items():
            out[name][d] = lambda i, p=p, m=m: p.backward(sets[i][2], sets[i][0], sets[i][1], tuple(m))
    return out


def timed(fn, n: int, runs: int) -> float:
    """sweep.py's CUDA-event median, the buffer sets rotating from call to call."""
    it = iter(range(1 << 30))
    return median_ms(lambda: fn(next(it) % n), "cuda", runs)


def kernels(fn, n: int, runs: int = 20) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            fn(i % n)
        torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", 0) or 0
        if t > 0:
            out.append((ev.key[:110], t / runs / 1000.0))
    return sorted(out, key=lambda kv: -kv[1])


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50-l3-3x3"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    r = row_of(name)
    dt = getattr(torch, r["dtype"])
    fmt = torch.channels_last if r["layout"] == "channels_last" else torch.contiguous_format
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(4):
        x = torch.rand((r["n"], r["c"], *r["spatial"]), device="cuda", generator=g).to(dt).mul_(2).sub_(1)
        w = torch.rand((r["k"], r["c"] // r["groups"], *r["kernel"]), device="cuda", generator=g).to(dt)
        y = torch.ops.aten.convolution(x, w, None, r["stride"], r["padding"], r["dilation"], r["transposed"],
                                       r["output_padding"], r["groups"])
        sets.append((x.contiguous(memory_format=fmt), w, torch.rand_like(y).mul_(2).sub_(1)))
    kw = dict(stride=r["stride"], padding=r["padding"], dilation=r["dilation"], groups=r["groups"])
    plans = {"aten": portconv.plan(sets[0][0], sets[0][1], None, backend="aten", **kw),
             "auto": portconv.plan(sets[0][0], sets[0][1], None, **kw)}
    print(f"{name}: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}; auto -> {plans['auto'].backend.value} ({plans['auto'].algorithm})")
    fns = calls(r, sets, plans)
    med = defaultdict(list)
    for k in range(rounds):
        order = list(fns) if k % 2 == 0 else list(reversed(fns))  # alternate who goes first
        line = []
        for d in ("fwd", "bwd-data", "bwd-weight"):
            for e in order:
                t = timed(fns[e][d], len(sets), runs)
                med[(e, d)].append(t)
                line.append(f"{d} {e} {t:.4f}")
        print(f"round {k} ({'>'.join(order)}): " + "  ".join(line), flush=True)
    print("\nmedian of rounds (ms), ratio torch.ops / entry:")
    for d in ("fwd", "bwd-data", "bwd-weight"):
        tm = sorted(med[("torch.ops", d)])[rounds // 2]
        cells = []
        for e in fns:
            m = sorted(med[(e, d)])[rounds // 2]
            cells.append(f"{e} {m:.4f} ({tm / m:.2f}x) [{min(med[(e, d)]):.4f}-{max(med[(e, d)]):.4f}]")
        print(f"  {d:10s} " + "  ".join(cells))
    print("\nkernels per call (device ms):")
    for d in ("fwd", "bwd-data", "bwd-weight"):
        for e in fns:
            ks = kernels(fns[e][d], len(sets))
            print(f"  {d} {e}: " + "; ".join(f"{n} {t:.4f}" for n, t in ks[:4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
