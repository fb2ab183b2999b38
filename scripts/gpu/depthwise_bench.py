"""GPU check of the depthwise kernels: conformance of the default ('rows') set, full-size agreement, and timing
of the per-element ('v1') and 'rows' kernels against PyTorch on the suite's depthwise rows.

Run from the repository root on a CUDA machine: PYTHONPATH=. python3 scripts/gpu/depthwise_bench.py OUTDIR
Writes OUTDIR/depthwise.json and OUTDIR/depthwise.md. Times are per call (CUDA events around one call,
median of --runs, inputs rotated over 3 buffer sets) and kernel-only (torch.profiler device time per call).
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from portconv.backends import BackendId, Problem, cuda
from portconv.params import ConvParams
from portconv.plan import Plan
from portconv.tensors import spec_of

ROWS = ["mbv2-dw3x3", "mbv2-dw3x3-bf16", "mbv2-dw3x3-bf16-cl", "mbv2-dw3x3-s2", "mbv2-dw3x3-last", "mbv2-dw3x3-b1",
        "dw3d-3x3x3"]
DIRS = ("fwd", "bwd_data", "bwd_weight")
MASKS = {"bwd_data": (True, False, False), "bwd_weight": (False, True, False)}


def conform(out: pathlib.Path) -> dict:
    """portconv conform on the depthwise cases (grid 'g4' ids hold depthwise x1/x2; 'dw' the model cases)."""
    res = {}
    for filt in ("dw", "g4"):
        t0 = time.time()
        cmd = [sys.executable, "-m", "portconv.cli", "conform", "--backend", "cuda", "--filter", filt, "-q",
               "--no-gradcheck", "--dtype", "float32,float64,float16,bfloat16",
               "--json", str(out / f"conf_{filt}.json")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=int(os.environ.get("DW_CONF_S", "110")))
            rc, tail = r.returncode, (r.stdout + r.stderr)[-1500:]
        except subprocess.TimeoutExpired as e:
            rc, tail = "timeout", str(e.stdout or "")[-1500:]
        res[filt] = {"rc": rc, "tail": tail, "s": round(time.time() - t0, 1)}
        print(f"conform {filt}: rc={rc} in {res[filt]['s']} s\n{res[filt]['tail']}", flush=True)
    return res


def suite_rows() -> dict:
    spec = json.loads(pathlib.Path("portconv/bench/suite.json").read_text())
    return {c["name"]: c for c in spec["rows"] if c["name"] in ROWS}


def make(c: dict, sets: int = 3):
    dt = getattr(torch, c["dtype"])
    rank = len(c["spatial"])
    shape = (c["n"], c["c"], *c["spatial"])
    wshape = (c["k"], c["c"] // c["groups"], *c["kernel"])
    fmt = None
    if c["layout"] == "channels_last":
        fmt = torch.channels_last if rank == 2 else torch.channels_last_3d
    xs = []
    for _ in range(sets):
        x = torch.randn(shape, device="cuda", dtype=dt)
        xs.append(x.contiguous(memory_format=fmt) if fmt else x)
    w = torch.randn(wshape, device="cuda", dtype=dt)
    params = ConvParams.make(rank, tuple(c["stride"]), tuple(c["padding"]), tuple(c["dilation"]), False,
                             (0,) * rank, c["groups"], weight_shape=tuple(w.shape))
    problem = Problem(params, spec_of(xs[0]), spec_of(w), False)
    be = cuda.CudaBackend()
    dev = be.device_for(problem)
    ch = be.choose(problem, dev)
    plan = Plan(problem, BackendId.CUDA, ch.algorithm, ch.memory_format, ch.reason, dev, ch.math)
    gos = [torch.randn(problem.output_shape, device="cuda", dtype=dt) for _ in range(sets)]
    if fmt:
        gos = [g.contiguous(memory_format=fmt) for g in gos]
    conv = (F.conv2d, F.conv3d)[rank - 2]
    args = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"])
    return be, plan, xs, w, gos, conv, args


def torch_call(d, conv, args, x, w, go):
    if d == "fwd":
        return conv(x, w, None, **args)
    mask = list(MASKS[d])
    return torch.ops.aten.convolution_backward(go, x, w, None, args["stride"], args["padding"], args["dilation"],
                                               False, [0] * (x.dim() - 2), args["groups"], mask)


def pc_call(d, be, plan, x, w, go):
    if d == "fwd":
        return be.forward(plan, x, w, None)
    return be.backward(plan, go, x, w, MASKS[d])


def per_call_ms(fn, sets, runs):
    for i in range(3):
        fn(i % sets)
    torch.cuda.synchronize()
    ts = []
    for i in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i % sets)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


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


def check_full(d, be, plan, x, w, go, conv, args):
    """Full-size agreement of portconv (current variant) with PyTorch in float64 (relative L2 error)."""
    got = pc_call(d, be, plan, x, w, go)
    ref = torch_call(d, conv, args, x.double(), w.double(), go.double())
    if d != "fwd":
        got = got[0] if d == "bwd_data" else got[1]
        ref = ref[0] if d == "bwd_data" else ref[1]
    got = torch.as_tensor(got, device="cuda").double()
    return ((got - ref).norm() / ref.norm()).item()


def bench_row(name: str, c: dict, runs: int) -> dict:
    be, plan, xs, w, gos, conv, args = make(c)
    row = {"reason": plan.reason}
    for d in DIRS:
        cell = {}

        def tfn(i, d=d):
            return torch_call(d, conv, args, xs[i], w, gos[i])

        def pfn(i, d=d):
            return pc_call(d, be, plan, xs[i], w, gos[i])

        cell["torch"] = (per_call_ms(tfn, 3, runs), kernel_ms(tfn, 3, runs))
        for var in ("v1", "rows"):
            os.environ[cuda.DW_ENV] = var
            cell[var] = (per_call_ms(pfn, 3, runs), kernel_ms(pfn, 3, runs))
            cell[var + "_err"] = check_full(d, be, plan, xs[0], w, gos[0], conv, args)
        os.environ[cuda.DW_ENV] = "rows"
        row[d] = cell
        print(name, d, {k: (tuple(round(v, 4) for v in val) if isinstance(val, tuple) else f"{val:.2e}")
                        for k, val in cell.items()}, flush=True)
    return row


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "dw_out")
    out.mkdir(parents=True, exist_ok=True)
    runs = int(os.environ.get("DW_RUNS", "40"))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": runs}
    report["conform"] = conform(out)
    rows = {}
    for name, c in suite_rows().items():
        rows[name] = bench_row(name, c, runs)
        torch.cuda.empty_cache()
    report["rows"] = rows
    (out / "depthwise.json").write_text(json.dumps(report, indent=1))
    lines = ["| row | dir | torch call/kern ms | v1 call/kern ms | rows call/kern ms | rows err | x torch (kern) |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        for d in DIRS:
            c = row[d]
            lines.append(f"| {name} | {d} | {c['torch'][0]:.4f}/{c['torch'][1]:.4f} | {c['v1'][0]:.4f}/{c['v1'][1]:.4f}"
                         f" | {c['rows'][0]:.4f}/{c['rows'][1]:.4f} | {c['rows_err']:.1e} | "
                         f"{c['torch'][1] / max(c['rows'][1], 1e-9):.2f}x |")
    (out / "depthwise.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
