"""Tensor-core implicit GEMM (Note [tensor-core implicit GEMM]): time the cuda backend's igemm-tc per tile config
against cuDNN on the suite's dense rows, per direction, same process, same data (CUDA events, median).

    PYTHONPATH=. python3 scripts/gpu/igemm_tc.py --dtypes float16,float32 --tiles auto,128x128,128x64,64x128 \
        --out $OUT/sweep.json [--budget 90]

Tile `v4` is the auto tile with PORTCONV_CUDA_IGEMM_TC_V4=1 (the v4 kernel: no ldmatrix, no vector gathers), `v5`
the auto tile with PORTCONV_CUDA_IGEMM_TC_V5=1 (the v5 kernels: weight gradient without Note [TN tiles]), `v6` with
PORTCONV_CUDA_IGEMM_TC_V6=1 (v6: TF32 without Note [TF32 ldmatrix] and the cp.async ring, v6's tile rule); `ks1`,
`ks2`, `ks4` the auto tile with PORTCONV_CUDA_IGEMM_TC_KS=1/2/4 (steps a ring stage, Note [deep stages]; ks1: v7's
schedule); `v8` with PORTCONV_CUDA_IGEMM_TC_V8=1 (v8's TN copy order, Note [TN copy order]); `nocol` with
PORTCONV_CUDA_IGEMM_NARROW=0 (backward-data without Note [narrow backward-data]).

float32 runs under torch's default conv precision (TF32 allowed), so cuDNN and igemm-tc both use TF32.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

DENSE = ("resnet50-stem,resnet50-l1-3x3,resnet50-l1-3x3-bf16-cl,resnet50-l3-3x3,resnet50-1x1-expand,"
         "resnet50-1x1-reduce,resnet50-1x1-downsample,deepbench-b1-3x3,deeplabv3-aspp-d12,dcgan-gen-transposed,"
         "vae-dec-transposed-bf16,deepbench-speech-c1,wav2vec2-conv1d,r3d18-l1-3d")
DIRS = ("fwd", "bwd-data", "bwd-weight")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=DENSE)
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--tiles", default="auto,128x128,128x64,64x128")
    ap.add_argument("--dirs", default=",".join(DIRS), help="directions to time (default: all three)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--budget", type=float, default=90.0, help="seconds; rows not started by then are skipped")
    ap.add_argument("--out", default="sweep.json")
    a = ap.parse_args()

    import torch

    import portconv
    from portconv.backends import cuda
    from portconv.bench.data import host_random, plan_layout, torch_sets
    from portconv.bench.runner import _Calls
    from portconv.bench.suite import load_suite, select

    rows, _ = load_suite()
    rows = select(rows, a.rows)
    dev = torch.device("cuda", 0)
    dirs = tuple(d for d in DIRS if d in a.dirs.split(","))
    # earlier kernel versions, for before / after
    knobs = {"v4": (cuda.TC_V4_ENV, "1"), "v5": (cuda.TC_V5_ENV, "1"), "v6": (cuda.TC_V6_ENV, "1"),
             "v8": (cuda.TC_V8_ENV, "1"), "nocol": (cuda.NARROW_ENV, "0"),
             **{f"ks{k}": (cuda.TC_KS_ENV, k) for k in cuda.TC_KS}}
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
            res = {"row": row.name, "dtype": dtype, "ms": {}}
            entries = [("cudnn", "cudnn", None)] + [(f"tc-{t}", "cuda", t) for t in a.tiles.split(",")]
            for label, backend, tile in entries:
                for env, _ in knobs.values():
                    os.environ.pop(env, None)
                if tile in knobs:  # an earlier kernel (auto tile), for before / after in one process
                    os.environ[knobs[tile][0]] = knobs[tile][1]
                if tile is None or tile == "auto" or tile in knobs:
                    os.environ.pop(cuda.TC_TILE_ENV, None)
                else:
                    os.environ[cuda.TC_TILE_ENV] = tile
                plan = portconv.plan(s0.input, s0.weight, s0.bias, **row.case.conv_args(), backend=backend)
                res.setdefault("plans", {})[label] = f"{plan.algorithm}: {plan.reason}"
                calls = _Calls(row, plan)
                for d in dirs:
                    fn = calls.get(d)
                    try:
                        for i in range(2):
                            fn(sets[i % 2])
                        torch.cuda.synchronize()
                        ts = []
                        for i in range(a.runs):
                            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            e0.record()
                            fn(sets[i % 2])
                            e1.record()
                            ts.append((e0, e1))
                        torch.cuda.synchronize()
                        res["ms"].setdefault(label, {})[d] = statistics.median(x.elapsed_time(y) for x, y in ts)
                    except Exception as e:  # noqa: BLE001 - report and go on
                        res["ms"].setdefault(label, {})[d] = None
                        res.setdefault("errors", []).append(f"{label} {d}: {type(e).__name__}: {e}"[:400])
            for env in (cuda.TC_TILE_ENV, *(e for e, _ in knobs.values())):
                os.environ.pop(env, None)
            ms = res["ms"]
            line = [f"{row.name:28s} {dtype:8s}"]
            for d in dirs:
                c = ms["cudnn"][d]
                best = min(((v[d], k) for k, v in ms.items() if k != "cudnn" and v[d]), default=(None, "-"))
                auto = ms.get("tc-auto", {}).get(d)
                line.append(f"{d} cudnn {c:.3f} auto {auto if auto is None else round(auto, 3)} best {best[1]} "
                            f"{best[0] if best[0] is None else round(best[0], 3)} "
                            f"ratio(auto) {c / auto if c and auto else float('nan'):.2f}")
            print(" | ".join(line), flush=True)
            out.append(res)
            with open(a.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
