"""Device-machine sweep: every family of the cuda backend (portconv.options(algorithm=...)) and the cudnn backend on a
case list, in all four dtypes, results NaN-poisoned, against float64 PyTorch on the CPU; then a few timings. Prints
a short table; writes JSON to --out (default ./out). scripts/gpu/reports.sh runs it under compute-sanitizer."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import portconv  # noqa: E402
from portconv import knobs  # noqa: E402
from portconv.backends.simt import compile as simt_compile  # noqa: E402
from portconv.params import ConvParams  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}  # relative L2 error
CASES = [  # name, input shape, weight shape, conv kwargs, layout
    ("dense3x3", (4, 32, 20, 20), (48, 32, 3, 3), dict(padding=1), "contig"),
    ("dense3x3-cl", (2, 24, 15, 17), (40, 24, 3, 3), dict(padding=1, stride=2), "chlast"),
    ("dense1x1-long", (8, 64, 28, 28), (16, 64, 1, 1), {}, "contig"),
    ("dense7x7-s2", (2, 3, 33, 33), (16, 3, 7, 7), dict(stride=2, padding=3), "contig"),
    ("dilated", (2, 8, 21, 19), (8, 8, 3, 3), dict(dilation=(2, 3), padding=(2, 1)), "strided"),
    ("grouped", (2, 32, 14, 14), (64, 8, 3, 3), dict(groups=4, padding=1), "contig"),
    ("grouped-cl", (2, 12, 10, 10), (12, 4, 3, 3), dict(groups=3, stride=2), "chlast"),
    ("dw3x3", (4, 64, 28, 28), (64, 1, 3, 3), dict(groups=64, padding=1), "contig"),
    ("dw3x3-cl", (2, 48, 20, 21), (48, 1, 3, 3), dict(groups=48, padding=1), "chlast"),
    ("dw3x3-s2-cl", (2, 48, 29, 29), (48, 1, 3, 3), dict(groups=48, padding=1, stride=2), "chlast"),
    ("dw5x5-m2", (2, 16, 19, 19), (32, 1, 5, 5), dict(groups=16, padding=2), "contig"),
    ("dw7x7-dil", (1, 8, 30, 30), (8, 1, 7, 7), dict(groups=8, padding=6, dilation=2), "strided"),
    ("conv1d-same", (4, 16, 101), (24, 16, 4), dict(padding="same", dilation=3), "contig"),
    ("conv1d-dw", (2, 32, 200), (32, 1, 9), dict(groups=32, padding=4, stride=2), "contig"),
    ("conv3d", (2, 8, 9, 10, 11), (16, 8, 3, 3, 3), dict(padding=1, stride=(1, 2, 2)), "contig"),
    ("conv3d-cl", (1, 16, 6, 12, 12), (16, 16, 3, 3, 3), dict(padding=1), "chlast"),
    ("dw3d", (2, 16, 8, 12, 12), (16, 1, 3, 3, 3), dict(groups=16, padding=1), "contig"),
    ("tconv-s2", (2, 32, 8, 8), (32, 16, 4, 4), dict(stride=2, padding=1, transposed=True), "contig"),
    ("tconv-op", (2, 8, 7, 9), (8, 12, 3, 3), dict(stride=3, padding=1, output_padding=2, transposed=True), "chlast"),
    ("tconv-grp", (1, 12, 6, 6), (12, 2, 3, 3), dict(stride=2, groups=3, output_padding=1, transposed=True), "contig"),
    ("tconv1d", (2, 16, 30), (16, 8, 5), dict(stride=2, padding=2, dilation=2, transposed=True), "contig"),
    ("batch1-big-wgrad", (1, 64, 64, 64), (64, 64, 3, 3), dict(padding=1), "contig"),
]
SMALL = ("dense3x3", "grouped", "dw3x3", "conv1d-same", "dw3d", "tconv-op")


def make(case, dtype, dev):
    name, xs, ws, kw, layout = case
    g = torch.Generator().manual_seed(sum(xs) * 7 + sum(ws))
    x = torch.randn(xs, generator=g, dtype=torch.float64)
    w = torch.randn(ws, generator=g, dtype=torch.float64) / (ws[1] * ws[2]) ** 0.5
    p = ConvParams.make(len(xs) - 2, weight_shape=ws, **kw)
    b = torch.randn(ws[1] * p.groups if p.transposed else ws[0], generator=g, dtype=torch.float64)
    x, w, b = (t.to(DTYPES[dtype]) for t in (x, w, b))
    xd = x.to(dev)
    if layout == "chlast":
        xd = xd.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    elif layout == "strided":
        big = torch.zeros(xs[:-1] + (2 * xs[-1],), dtype=x.dtype, device=dev)
        big[..., ::2] = xd
        xd = big[..., ::2]
    return (x, w, b, p), (xd, w.to(dev), b.to(dev))


def reference(x, w, b, p, go):
    x64, w64, b64, go64 = (t.double() for t in (x, w, b, go))
    xp = F.pad(x64, [v for e in reversed(p.padding_extra) for v in (0, e)]) if any(p.padding_extra) else x64
    y = torch.ops.aten.convolution(xp, w64, b64, **p.as_aten())
    gi, gw, gb = torch.ops.aten.convolution_backward(go64, xp, w64, [b.shape[0]], **p.as_aten(),
                                                     output_mask=[True, True, True])
    if any(p.padding_extra):
        gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in x.shape[2:])]
    return y, gi, gw, gb


def rel(got, ref) -> float:
    g = got.detach().double().cpu()
    if g.shape != ref.shape:
        return float("inf")
    if not torch.isfinite(g).all():
        return float("nan")
    return ((g - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _plan(xd, wd, bd, kw, backend, **options):
    with portconv.options(**options):
        return portconv.plan(xd, wd, bd, **kw, backend=backend)


def correctness(cases, dev, rows, dtypes=tuple(DTYPES), with_cudnn=True):
    torch.backends.cudnn.allow_tf32 = False
    for case in cases:
        kw = case[3]
        for dtype in dtypes:
            (x, w, b, p), (xd, wd, bd) = make(case, dtype, dev)
            chosen = _plan(xd, wd, bd, kw, "cuda")
            go = torch.randn(chosen.problem.output_shape, dtype=torch.float64).to(DTYPES[dtype])
            ref = reference(x, w, b, p, go)
            algs = ["direct", "implicit_gemm"] + (["depthwise"] if chosen.problem.is_depthwise else [])
            if p.groups == 1 and dtype in ("float16", "bfloat16") and torch.cuda.get_device_capability(dev)[0] >= 8:
                algs.append("igemm-tc")  # Note [tensor-core implicit GEMM] (float32 would run TF32: not this TOL)
            runs = [(a, "cuda", {"algorithm": a}) for a in algs] + ([("cudnn", "cudnn", {})] if with_cudnn else [])
            for alg, backend, options in runs:
                row = dict(case=case[0], dtype=dtype, alg=alg, chosen=alg == chosen.algorithm)
                try:
                    plan = _plan(xd, wd, bd, kw, backend, **options)
                except portconv.BackendUnavailable as e:
                    rows.append(dict(row, status="unsupported", reason=str(e)[:400]))
                    continue
                try:
                    with knobs.with_env(poison=True):
                        y = plan.forward(xd, wd, bd)
                        grads = plan.backward(go.to(dev), xd, wd, (True, True, True))
                    torch.cuda.synchronize(dev)
                    errs = [rel(g_, r_) for g_, r_ in zip((y, *grads), ref)]
                    row.update(errs=errs, status="pass" if all(e < TOL[dtype] for e in errs) else "FAIL")
                except Exception as e:  # noqa: BLE001 - a sweep records every failure and goes on
                    row.update(status="ERROR", reason=f"{type(e).__name__}: {e}"[:400], tb=traceback.format_exc())
                rows.append(row)
                if row["status"] != "pass":
                    print("  ", row["case"], dtype, alg, row["status"], row.get("errs"), row.get("reason", ""))


def median_ms(fn, dev, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def _time_shape(name, xs, ws, kw, dtype, dev):
    x = torch.randn(xs, device=dev, dtype=DTYPES[dtype])
    w = torch.randn(ws, device=dev, dtype=DTYPES[dtype])
    p = ConvParams.make(2, weight_shape=ws, **kw)
    chosen = _plan(x, w, None, kw, "cuda")
    go = torch.randn(chosen.problem.output_shape, device=dev, dtype=x.dtype)
    row = dict(shape=name, dtype=dtype, chosen=chosen.algorithm)
    masks = ((True, False, False), (False, True, False))
    for alg in ("direct", "implicit_gemm") + (("depthwise",) if chosen.problem.is_depthwise else ()):
        plan = _plan(x, w, None, kw, "cuda", algorithm=alg)
        row[alg] = [median_ms(lambda plan=plan: plan.forward(x, w, None), dev)] + [
            median_ms(lambda m=m, plan=plan: plan.backward(go, x, w, m), dev) for m in masks]
    bs = [w.shape[0]]
    row["torch"] = [median_ms(lambda: F.conv2d(x, w, None, **kw), dev)] + [
        median_ms(lambda m=m: torch.ops.aten.convolution_backward(go, x, w, bs, p.stride, p.padding, p.dilation,
                                                                  False, [0, 0], p.groups, list(m)), dev)
        for m in masks]
    return row


def timings(dev, rows):
    torch.backends.cudnn.allow_tf32 = True
    shapes = [("mbv2-dw3x3", (32, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144)),
              ("resnet-3x3", (32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1))]
    for name, xs, ws, kw in shapes:
        for dtype in ("float32", "float16"):
            rows.append(_time_shape(name, xs, ws, kw, dtype, dev))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="a few cases (for compute-sanitizer)")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all, or --small's)")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--out", default="out", help="folder of the JSON report")
    a = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    out = a.out
    os.makedirs(out, exist_ok=True)
    names = a.cases.split(",") if a.cases else (SMALL if a.small else [c[0] for c in CASES])
    cases = [c for c in CASES if c[0] in names]
    rows, trows = [], []
    t0 = time.time()
    correctness(cases, dev, rows, a.dtypes.split(","), not a.no_cudnn)
    t1 = time.time()
    if not a.no_time:
        timings(dev, trows)
    info = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), cupy=simt_compile.import_cupy().__version__,
                compile=[e.__dict__ for e in simt_compile.compile_events()], seconds=dict(correct=t1 - t0))
    with open(os.path.join(out, "sweep-small.json" if a.small or a.cases else "sweep.json"), "w") as f:
        json.dump(dict(info=info, rows=rows, timings=trows), f, indent=1, default=str)
    bad = [r for r in rows if r["status"] not in ("pass", "unsupported")]
    by = {}
    for r in rows:
        by.setdefault((r["alg"], r["dtype"]), []).append(r["status"])
    print(f"device {info['device']}; torch {info['torch']} CUDA {info['cuda']} cuDNN {info['cudnn']} "
          f"CuPy {info['cupy']}; {len(rows)} runs in {t1 - t0:.1f} s, {len(bad)} not passing")
    for (alg, dt), st in sorted(by.items()):
        print(f"  {alg:<14}{dt:<9} pass {st.count('pass'):>3}  fail {st.count('FAIL'):>2}  error {st.count('ERROR'):>2}"
              f"  unsupported {st.count('unsupported'):>2}")
    comp = simt_compile.compile_events()
    if comp:
        print(f"  first compile {comp[0].seconds:.2f} s ({comp[0].how}); {len(comp)} modules, "
              f"{sum(e.seconds for e in comp):.1f} s in all")
    for r in trows:
        print("  time ms [fwd, bwd_data, bwd_weight]", r)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
