"""GPU check of the depthwise kernels: conformance of the default set, full-size agreement, and timing of the
depthwise kernel versions (PORTCONV_CUDA_DEPTHWISE = v1, v2, v3; 'v3all' is v3 with the tile kernels on NCHW
too, PORTCONV_CUDA_DEPTHWISE_TILE=all) against PyTorch on the suite's depthwise rows, with % of the copy-bandwidth
floor (bytes of the direction / best 1 GiB copy_ bandwidth measured in the same process).

Run from the repository root on a CUDA machine: PYTHONPATH=. python3 scripts/gpu/depthwise_bench.py OUTDIR
Writes OUTDIR/depthwise.json and OUTDIR/depthwise.md. DW_VARIANTS (default v2,v3,v3all), DW_ROWS (any 2-D or 3-D,
not transposed suite row), DW_DTYPES (the rows again in these dtypes), DW_DIRS, DW_RUNS, DW_CONFORM=0 (skip the
conformance part). Times are per call (CUDA events around one call, median of --runs, inputs rotated over 3 buffer
sets), kernel-only (torch.profiler device time per call) and held (Note [held stream]).
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from math import prod

import torch
import torch.nn.functional as F

from portconv.backends import BackendId, Problem, _replay, cuda
from portconv.params import ConvParams
from portconv.plan import Plan
from portconv.tensors import spec_of

ROWS = ["mbv2-dw3x3", "mbv2-dw3x3-bf16", "mbv2-dw3x3-bf16-cl", "mbv2-dw3x3-s2", "mbv2-dw3x3-last", "mbv2-dw3x3-b1",
        "dw3d-3x3x3"]
DIRS = tuple(os.environ.get("DW_DIRS", "fwd,bwd_data,bwd_weight").split(","))  # DW_DIRS: some of them
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


# MobileNetV2's stride-1 14 x 14 depthwise layer (576 channels), not a suite row: Note [depthwise planes] sizes
EXTRA_ROWS = [{"name": "mbv2-dw3x3-14", "n": 32, "c": 576, "k": 576, "spatial": [14, 14], "kernel": [3, 3],
               "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 576, "transposed": False,
               "output_padding": [0, 0], "dtype": "float32", "layout": "nchw"}]


def suite_rows() -> dict:
    spec = json.loads(pathlib.Path("portconv/bench/suite.json").read_text())
    want = os.environ.get("DW_ROWS", ",".join(ROWS)).split(",")
    rows = {c["name"]: c for c in spec["rows"] + EXTRA_ROWS if c["name"] in want}
    dtypes = [d for d in os.environ.get("DW_DTYPES", "").split(",") if d]  # the rows again in other dtypes
    return {**rows, **{f"{n}-{d}": {**c, "name": f"{n}-{d}", "dtype": d} for n, c in rows.items() for d in dtypes
                       if d != c["dtype"]}}


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

    def plan():  # a fresh plan per variant: a plan replays the launches its first call recorded
        ch = be.choose(problem, dev)
        return Plan(problem, BackendId.CUDA, ch.algorithm, ch.memory_format, ch.reason, dev, ch.math)
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


def held_ms(fn, sets, runs):
    """Median device time per call as `portconv bench --hold-stream` measures it (Note [held stream]: CUDA events
    around each call, the calls enqueued behind a spin kernel, so launch gaps count and host time does not)."""
    from portconv.bench.timing import CudaClock

    fn(0)
    torch.cuda.synchronize()
    return statistics.median(CudaClock(torch.device("cuda"), hold=True).samples(fn, [i % sets for i in range(runs)]))


def check_full(d, be, plan, x, w, go, conv, args):
    """Full-size agreement of portconv (current variant) with PyTorch in float64 (relative L2 error)."""
    got = pc_call(d, be, plan, x, w, go)
    ref = torch_call(d, conv, args, x.double(), w.double(), go.double())
    if d != "fwd":
        got = got[0] if d == "bwd_data" else got[1]
        ref = ref[0] if d == "bwd_data" else ref[1]
    got = torch.as_tensor(got, device="cuda").double()
    return ((got - ref).norm() / ref.norm()).item()


VARIANTS = {"v1": ("v1", "cl"), "v2": ("v2", "cl"), "v3": ("v3", "auto"), "v3cl": ("v3", "cl"), "v3all": ("v3", "all"),
            "v4": ("v4", "auto")}  # v4: v3 + Note [depthwise planes]
HALF = ("float16", "bfloat16")
KNOBS = {  # variant key: (-D define, the cuda.DW_TILE entries.index the host sizes grids from, 16-bit only)
    "thn": ("PC_DWT_THN", "nchw.0", False), "vwn": ("PC_DWT_VWN", "nchw.1", False), "pf": ("PC_DWT_PF", None, False),
    "thn16": ("PC_DWT_THN16", "nchw16.0", True), "vwn16": ("PC_DWT_VWN16", "nchw16.1", True),
    "pf16": ("PC_DWT_PF16", None, True), "pk": ("PC_DWT_PK", None, True), "vc": ("PC_DWT_VC", None, True),
    "th3": ("PC_DWT_TH3", "nchw3d.0", False), "vw3": ("PC_DWT_VW3", "nchw3d.1", False),
    "thc": ("PC_DWT_THC", "cl.0", False), "thc3": ("PC_DWT_THC3", "cl3d.0", False),
    "vwc": ("PC_DWT_VWC", "cl.1+cl3d.1", False), "la": ("PC_DWT_LA", None, False),
    "thw4": ("PC_DWT_THW4", "w4.0", True), "vww4": ("PC_DWT_VWW4", "w4.1", True),
    "ring": ("PC_DWT_RING", None, True), "rd": ("PC_DWT_RD", None, True),
    "fring": ("PC_DWT_FRING", None, False), "frd": ("PC_DWT_FRD", None, False),
    "wminb": ("PC_DWT_WMINB", None, True), "nring": ("PC_DWT_NRING", None, True),
    "di": ("PC_DWT_DI", None, False), "dila": ("PC_DWT_DILA", None, False), "minb3": ("PC_DWT_3MINB", None, False),
    "dz": ("PC_DWT_DZ", None, False), "q4": ("PC_DWT_Q4", None, True), "qd": ("PC_DWT_QD", None, True),
    "cvt": ("PC_BF16_CVT", None, True), "dwv": ("PC_DW_V", "DW_V", False),
    "wfin": (None, None, False), "wfmax": (None, None, False),  # Note [warp finalize]: cuda.WARP_FINALIZE(_MAX)
    "pdl": (None, None, False)}  # Note [dependent launch]: pdl=0 replays the finalize with an ordinary launch
SAVED = {k: dict(getattr(cuda, k)) for k in ("DW_TILE", "DW_TILE_VC")}
DW_V = cuda.DW_V, cuda.DW_V_ROW, cuda.DW_V_WIDE16
WARP_FINALIZE = (cuda.WARP_FINALIZE, cuda.WARP_FINALIZE_MAX)
EXTRA: dict = {}  # (define, value, 16-bit only) of the variant
_init = cuda._Run.__init__


def _init_with_tile(self, *args, **kw):  # experiments: the tile shape of the variant as extra -D defines
    _init(self, *args, **kw)
    half = self.plan.problem.dtype in HALF
    more = {d: v for d, v, h in EXTRA.values() if half or not h}
    if more:
        self.defines = {**self.defines, **more}


cuda._Run.__init__ = _init_with_tile


def set_variant(var: str) -> None:
    """'v3' etc., or 'v3@key=value,...' for the tile kernels compiled with other -D defines (KNOBS: thn, vwn, pf,
    th3, vw3, thc, thc3, vwc, la, fring, frd, di, dila, minb3, dz; thn16, vwn16, pf16, pk, vc, thw4, vww4, ring, rd,
    wminb, nring, q4, qd, cvt (PC_BF16_CVT) for 16-bit dtypes only; dwv: PC_DW_V of the 'rows' kernels; wfin,
    wfmax: the host's Note [warp finalize] limits; pdl=0: no Note [dependent launch]; Note [depthwise planes]:
    planes=UNITS.BLOCKS the host's result columns a chunk and most blocks an SM), the host's grid sizes set to
    match (grids only size grid-stride loops; the weight gradient splits its units itself)."""
    name, _, shape = var.partition("@")
    os.environ[cuda.DW_ENV], os.environ[cuda.DW_TILE_ENV] = VARIANTS[name]
    os.environ.pop(cuda.DWP_ENV, None)
    EXTRA.clear()
    cuda.WARP_FINALIZE, cuda.WARP_FINALIZE_MAX = WARP_FINALIZE
    driver = _replay.driver_launch()
    if driver is not None:
        driver.pdl = driver._launch_ex is not None
    for k, v in SAVED.items():
        getattr(cuda, k).update(v)
    cuda.DW_V, cuda.DW_V_ROW, cuda.DW_V_WIDE16 = DW_V
    for item in filter(None, shape.split(",")):
        key, _, val = item.partition("=")
        if key == "planes":  # Note [depthwise planes]: "UNITS.BLOCKS" (read per plan, in its cache key)
            os.environ[cuda.DWP_ENV] = val.replace(".", ",")
            continue
        define, mirror, half = KNOBS[key]
        if key == "pdl":  # read when a plan's replay first launches its finalize (a new plan per variant)
            if driver is not None:
                driver.pdl = driver.pdl and val != "0"
            continue
        if key in ("wfin", "wfmax"):  # host constants: the finalize's mode travels in its flags (PC_FLAG_WARP)
            setattr(cuda, "WARP_FINALIZE" if key == "wfin" else "WARP_FINALIZE_MAX", int(val))
            continue
        EXTRA[key] = (define, int(val), half)
        if key == "vc":
            cuda.DW_TILE_VC.update({h: int(val) for h in HALF})
        elif mirror == "DW_V":  # the 'rows' kernels' strip on every view (grid sizes and the plan reason)
            cuda.DW_V = cuda.DW_V_ROW = cuda.DW_V_WIDE16 = int(val)
        elif mirror:
            for m in mirror.split("+"):
                entry, i = m.split(".")
                t = list(cuda.DW_TILE[entry])
                t[int(i)] = int(val)
                cuda.DW_TILE[entry] = tuple(t)


def copy_bandwidth() -> float:
    """Best bytes/ms of a 1 GiB device copy (read + write), as portconv bench measures its roofline."""
    a = torch.empty(1 << 28, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e))
    del a, b
    return 2 * (1 << 30) / best


def floor_ms(c: dict, d: str, bw: float) -> float:
    """Minimum bytes of direction d (README 'Roofline') / copy bandwidth."""
    es = torch.empty((), dtype=getattr(torch, c["dtype"])).element_size()
    x = c["n"] * c["c"] * prod(c["spatial"])
    y = c["n"] * c["k"] * prod((s + 2 * p - dl * (r - 1) - 1) // st + 1 for s, p, dl, r, st in
                               zip(c["spatial"], c["padding"], c["dilation"], c["kernel"], c["stride"]))
    w = c["k"] * (c["c"] // c["groups"]) * prod(c["kernel"])
    return (x + y + w) * es / bw


def registers(be) -> list[str]:
    """Registers and local (spill) bytes of every depthwise kernel this process built, as the runtime compiler
    (NVRTC) gave them: they can differ from an offline nvcc build of the same source."""
    from cupy.cuda import driver

    def attr(fn, a):  # CU_FUNC_ATTRIBUTE_NUM_REGS = 4, _LOCAL_SIZE_BYTES = 3
        try:
            return driver.funcGetAttribute(a, fn.ptr)
        except Exception as e:  # noqa: BLE001 - a report line, not a check
            return f"? ({type(e).__name__})"
    out = []
    for key, fn in be.kernels()._functions.items():
        name, defs = key[3], dict(key[1])
        if "depthwise" in name:
            extra = ",".join(f"{k}={v}" for k, v in sorted(defs.items()) if k not in ("PC_DTYPE", "PC_INDEX64"))
            out.append(f"{name} dtype={defs.get('PC_DTYPE')} {extra}: {attr(fn, 4)} registers, "
                       f"{attr(fn, 3)} local bytes")
    return sorted(set(out))


def bench_row(name: str, c: dict, runs: int, variants: list[str], bw: float) -> dict:
    be, plan, xs, w, gos, conv, args = make(c)
    row = {}
    for d in DIRS:
        cell = {"floor": floor_ms(c, d, bw)}

        def tfn(i, d=d):
            return torch_call(d, conv, args, xs[i], w, gos[i])

        cell["torch"] = (per_call_ms(tfn, 3, runs), kernel_ms(tfn, 3, runs), held_ms(tfn, 3, runs))
        for var in variants:
            set_variant(var)
            pl = plan()
            row.setdefault("reason", {})[var] = pl.reason

            def pfn(i, d=d, pl=pl):
                return pc_call(d, be, pl, xs[i], w, gos[i])

            cell[var + "_err"] = check_full(d, be, pl, xs[0], w, gos[0], conv, args)
            cell[var] = (per_call_ms(pfn, 3, runs), kernel_ms(pfn, 3, runs), held_ms(pfn, 3, runs))
        set_variant("v3")
        row[d] = cell
    row["registers"] = registers(be)
    for r in row["registers"]:
        print("registers", r, flush=True)
        print(name, d, {k: (tuple(round(v, 4) for v in val) if isinstance(val, tuple) else f"{val:.2e}")
                        for k, val in cell.items()}, flush=True)
    return row


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "dw_out")
    out.mkdir(parents=True, exist_ok=True)
    runs = int(os.environ.get("DW_RUNS", "40"))
    variants = os.environ.get("DW_VARIANTS", "v2,v3,v3all").split(os.environ.get("DW_SEP", ","))
    bw = copy_bandwidth()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": runs,
              "copy_GBps": bw / 1e6}
    print(report, flush=True)
    if os.environ.get("DW_CONFORM", "1") != "0":
        report["conform"] = conform(out)
    rows = {}
    lines = [f"device {report['device']}, torch {report['torch']}, copy {bw / 1e6:.0f} GB/s; ms call/kern/held; "
             f"x = torch kern / ours kern; % = floor / kern", "",
             "| row | dir | floor | torch call/kern/held | "
             + " | ".join(f"{v} call/kern/held (x, %)" for v in variants) + " |", "|---" * (4 + len(variants)) + "|"]
    for name, c in suite_rows().items():
        row = rows[name] = bench_row(name, c, runs, variants, bw)
        for d in DIRS:
            cl = row[d]
            tk = cl["torch"][1]
            cells = [f"{cl[v][0]:.4f}/{cl[v][1]:.4f}/{cl[v][2]:.4f} ({tk / max(cl[v][1], 1e-9):.2f}x, "
                     f"{100 * cl['floor'] / max(cl[v][1], 1e-9):.0f}%){' ERR' if cl[v + '_err'] > 3e-2 else ''}"
                     for v in variants]
            lines.append(f"| {name} | {d} | {cl['floor']:.4f} | {cl['torch'][0]:.4f}/{tk:.4f}/{cl['torch'][2]:.4f} | "
                         + " | ".join(cells) + " |")
        (out / "depthwise.json").write_text(json.dumps({**report, "rows": rows}, indent=1))
        (out / "depthwise.md").write_text("\n".join(lines) + "\n")
        torch.cuda.empty_cache()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
