"""Split count of the channels-last depthwise weight gradient ('tile2d_s*', Note [depthwise tile]), swept on one
suite row: the grid's split count forced to each value (the kernel shares its units out over the splits itself),
kernel time per call (torch.profiler, split finalize included; each kernel's share), device time as `portconv bench
--hold-stream` measures it (launch gaps included) and agreement with PyTorch in float64.

Usage (repository root, CUDA machine): PYTHONPATH=.:scripts/gpu python3 scripts/gpu/dw_weight_splits.py [ROW [S,...]]
"""
from __future__ import annotations

import sys

import depthwise_bench as db  # scripts/gpu/depthwise_bench.py

from portconv.backends import cuda

FORCE: list[int] = []
_orig = cuda.depthwise_weight_grid


def _forced(view, kernel, cl, dtype, units, rows_v):
    grid, splits, chunk = _orig(view, kernel, cl, dtype, units, rows_v)
    if FORCE and kernel.startswith("tile"):
        return (grid[0], FORCE[0], 1), FORCE[0], chunk
    return grid, splits, chunk


cuda.depthwise_weight_grid = _forced


def kernels(fn, sets, runs) -> str:
    """Each kernel's device time per call (torch.profiler), e.g. the weight kernel and the split finalize."""
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    db.torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            fn(i % sets)
        db.torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0) or 0
        if t:
            out.append(f"{ev.key.replace('portconv_', '')} {t / runs / 1000:.4f}")
    return ", ".join(out)


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "mbv2-dw3x3-bf16-cl"
    counts = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "0,8,16,25,33,49,66,98,132,196,264").split(",")]
    c = db.suite_rows()[name] if name in db.suite_rows() else None
    c = c or {r["name"]: r for r in __import__("json").load(open("portconv/bench/suite.json"))["rows"]}[name]
    be, plan, xs, w, gos, conv, args = db.make(c)
    d = "bwd_weight"

    def tfn(i):
        return db.torch_call(d, conv, args, xs[i], w, gos[i])

    print(f"{name} {d}: torch kern {db.kernel_ms(tfn, 3, 40):.4f} ms, held {db.held_ms(tfn, 3, 60):.4f} ms", flush=True)
    for s in counts:
        FORCE[:] = [s] if s else []
        pl = plan()
        default = _orig(cuda.ConvView.of(pl.problem), "tile2d_s1", True, c["dtype"], pl.device.compute_units)[1]
        err = db.check_full(d, be, pl, xs[0], w, gos[0], conv, args)

        def pfn(i, pl=pl):
            return db.pc_call(d, be, pl, xs[i], w, gos[i])

        print(f"splits {s or f'default ({default})'}: kern {db.kernel_ms(pfn, 3, 40):.4f} ms "
              f"({kernels(pfn, 3, 40)}), held {db.held_ms(pfn, 3, 60):.4f} ms, "
              f"call {db.per_call_ms(pfn, 3, 40):.4f} ms, rel err {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
