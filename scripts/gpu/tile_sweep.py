"""Which tensor-core tile is fastest on each dense suite row and direction? The cuda backend's igemm-tc plan per tile
(portconv.options(igemm_tile=...); 'auto' is Note [tile rule]'s choice) against cuDNN, same process, same data,
CUDA events, median.

    PYTHONPATH=. python3 scripts/gpu/tile_sweep.py --dtypes float16,float32 --tiles auto,128x128,128x64,64x128 \
        --out $OUT/tiles.json [--rows resnet50-l1-3x3,...] [--dirs fwd,bwd-weight] [--budget 90]

float32 runs under torch's default conv precision (TF32 allowed), so cuDNN and igemm-tc both use TF32.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

DENSE = ("resnet50-stem,resnet50-l1-3x3,resnet50-l1-3x3-bf16-cl,resnet50-l3-3x3,resnet50-1x1-expand,"
         "resnet50-1x1-reduce,resnet50-1x1-downsample,deepbench-b1-3x3,deeplabv3-aspp-d12,dcgan-gen-transposed,"
         "vae-dec-transposed-bf16,deepbench-speech-c1,wav2vec2-conv1d,r3d18-l1-3d")
DIRS = {"fwd": None, "bwd-data": (True, False, False), "bwd-weight": (False, True, False)}


def call(plan, direction: str):
    """One direction of a plan on a buffer set: plan.forward, or plan.backward for that gradient."""
    mask = DIRS[direction]
    if mask is None:
        return lambda s: plan.forward(s.input, s.weight, s.bias)
    return lambda s: plan.backward(s.grad_output, s.input, s.weight, mask)


def median_ms(fn, sets, runs: int) -> float:
    import torch

    for i in range(2):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    events = []
    for i in range(runs):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(sets[i % len(sets)])
        e1.record()
        events.append((e0, e1))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=DENSE)
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--tiles", default="auto,128x128,128x64,64x128")
    ap.add_argument("--dirs", default=",".join(DIRS), help="directions to time (default: all three)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--budget", type=float, default=90.0, help="seconds; rows not started by then are skipped")
    ap.add_argument("--out", default="tiles.json")
    a = ap.parse_args()

    import torch

    import portconv
    from portconv.bench.data import host_random, plan_layout, torch_sets
    from portconv.bench.suite import load_suite, select

    rows = select(load_suite()[0], a.rows)
    dev = torch.device("cuda", 0)
    dirs = [d for d in DIRS if d in a.dirs.split(",")]
    t0, out = time.time(), []
    for dtype in a.dtypes.split(","):
        for row in rows:
            if time.time() - t0 > a.budget:
                print(f"budget spent: skipping {row.name} {dtype}", flush=True)
                continue
            row = dataclasses.replace(row, dtype=dtype)
            lay = plan_layout(row.case, dtype)
            sets = torch_sets(lay, host_random(lay, 2, 1), 2, dev)
            s0 = sets[0]
            res = {"row": row.name, "dtype": dtype, "ms": {}, "plans": {}}
            for label, backend, tile in [("cudnn", "cudnn", None)] + [(f"tc-{t}", "cuda", t)
                                                                       for t in a.tiles.split(",")]:
                opts = {} if tile in (None, "auto") else {"igemm_tile": tile}
                try:
                    with portconv.options(**opts):
                        plan = portconv.plan(s0.input, s0.weight, s0.bias, **row.case.conv_args(), backend=backend)
                except portconv.BackendUnavailable as e:
                    res.setdefault("errors", []).append(f"{label}: {e}"[:400])
                    continue
                res["plans"][label] = plan.explain()
                for d in dirs:
                    try:
                        res["ms"].setdefault(label, {})[d] = median_ms(call(plan, d), sets, a.runs)
                    except Exception as e:  # noqa: BLE001 - report and go on
                        res["ms"].setdefault(label, {})[d] = None
                        res.setdefault("errors", []).append(f"{label} {d}: {type(e).__name__}: {e}"[:400])
            ms = res["ms"]
            line = [f"{row.name:28s} {dtype:8s}"]
            for d in dirs:
                c = ms.get("cudnn", {}).get(d)
                best = min(((v[d], k) for k, v in ms.items() if k != "cudnn" and v.get(d)), default=(None, "-"))
                auto = ms.get("tc-auto", {}).get(d)
                ratio = c / auto if c and auto else float("nan")
                line.append(f"{d} cudnn {c} auto {auto} best {best[1]} {best[0]} cudnn/auto {ratio:.2f}")
            print(" | ".join(line), flush=True)
            out.append(res)
            with open(a.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
