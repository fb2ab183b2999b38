"""Where a cached plan's per-call host time goes on the GPU: per-call times per backend (plan calls, and forward +
backward through autograd), a cProfile of the slow ones, and the cost of the primitives a call is made of.
Usage: python3 scripts/gpu/overhead_profile.py [CALLS] [--shape N,C,H,G] [--backends aten,cudnn,cuda,hip,auto]
--shape (default 1,4,8,1: a 1x4x8x8 input, 3x3 filter, pad 1, G groups) times another square conv2d, e.g.
1,32,112,32 for the suite's mbv2-dw3x3-b1 row."""
import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity
from torch.profiler import profile as tprofile

import portconv

dev = "cuda"
ap = argparse.ArgumentParser()
ap.add_argument("calls", nargs="?", type=int, default=3000)
ap.add_argument("--shape", default="1,4,8,1")
ap.add_argument("--backends", default="aten,cudnn,cuda,hip,auto")
args = ap.parse_args()
n_, c_, h_, g_ = (int(v) for v in args.shape.split(","))
x = torch.randn(n_, c_, h_, h_, device=dev)
w = torch.randn(c_, c_ // g_, 3, 3, device=dev)
go = torch.randn(n_, c_, h_, h_, device=dev)
BACKENDS = [None if b == "auto" else b for b in args.backends.split(",")]
N = args.calls


def per_call(fn, n=N):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
print(f"F.conv2d                 {per_call(lambda: F.conv2d(x, w, None, 1, 1, 1, g_)):7.1f} us")
bw = torch.ops.aten.convolution_backward.default
t = per_call(lambda: bw(go, x, w, [c_], [1, 1], [1, 1], [1, 1], False, [0, 0], g_, [True, True, False]))
print(f"aten bwd (1,1,0)         {t:7.1f} us")
plans = {}
for b in BACKENDS:
    try:
        p = portconv.plan(x, w, None, 1, 1, 1, False, 0, g_, backend=b)
    except Exception as e:  # noqa: BLE001
        print(b, "unavailable", e)
        continue
    plans[b or "auto"] = p
    f = per_call(lambda p=p: p.forward(x, w, None))
    g = per_call(lambda p=p: p.backward(go, x, w, (True, True, False)))
    c = per_call(lambda b=b: portconv.conv2d(x, w, None, 1, 1, 1, g_, backend=b))
    print(f"{(b or 'auto') + '->' + str(p.backend):10s} plan.forward {f:7.1f} us  plan.backward(1,1,0) {g:7.1f} us  "
          f"conv2d {c:7.1f} us")

def profile(title: str, fn, calls: int = 2000, rows: int = 28) -> None:
    """A cProfile of ``calls`` calls of ``fn``, by own time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(rows)
    print(f"===== cProfile {title} ({calls} calls)")
    print("\n".join(s.getvalue().splitlines()[:rows + 17]))


for name in ("cuda", "cudnn", "auto"):
    p = plans.get(name)
    if p is None:
        continue
    profile(f"{name} forward", lambda p=p: p.forward(x, w, None))
    profile(f"{name} backward", lambda p=p: p.backward(go, x, w, (True, True, False)))

# forward + backward through autograd, as a training step calls them (bench --overhead's "fwd+bwd autograd"), in
# interleaved rounds beside the floor of any Python autograd.Function: one that runs F.conv2d and ATen's backward
# (what a Function costs over PyTorch's own node) and one that runs the plan's forward and backward (the plan's
# kernels behind the leanest Function), then portconv's calls and a converted module against torch.nn's.
xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
bw_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], g_)


class AtenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return F.conv2d(x, w, None, 1, 1, 1, g_)

    @staticmethod
    def backward(ctx, go):
        x, w = ctx.saved_tensors
        return bw(go, x, w, None, *bw_args, [True, True, False])[:2]


class PlanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, p):
        ctx.save_for_backward(x, w)
        ctx.p = p
        return p.forward(x, w, None)

    @staticmethod
    def backward(ctx, go):
        x, w = ctx.saved_tensors
        return (*ctx.p.backward(go, x, w, (True, True, False))[:2], None)


tmod = torch.nn.Conv2d(c_, c_, 3, padding=1, groups=g_, bias=False).to(dev)
ladder = {"F.conv2d": lambda: F.conv2d(xg, wg, None, 1, 1, 1, g_).sum().backward(),
          "torch.nn.Conv2d": lambda: tmod(xg).sum().backward(),
          "Function(F.conv2d, ATen bwd)": lambda: AtenFunction.apply(xg, wg).sum().backward()}
for name, p in plans.items():
    b = None if name == "auto" else name
    if not p.aten_autograd:
        ladder[f"Function(plan {name})"] = lambda p=p: PlanFunction.apply(xg, wg, p).sum().backward()
    ladder[f"portconv.conv2d {name}"] = lambda b=b: portconv.conv2d(xg, wg, None, 1, 1, 1, g_, backend=b).sum(
        ).backward()
    m = portconv.convert(torch.nn.Conv2d(c_, c_, 3, padding=1, groups=g_, bias=False), backend=b).to(dev)
    ladder[f"convert(Conv2d) {name}"] = lambda m=m: m(xg).sum().backward()
times = {k: [] for k in ladder}
for fn in ladder.values():
    per_call(fn, 100)
for _ in range(11):
    for k, fn in ladder.items():
        times[k].append(per_call(fn, 200))
print("forward + backward through autograd, median of 11 interleaved rounds (each the best of 5 x 200 calls):")
base = sorted(times["F.conv2d"])[5]
for k, v in times.items():
    med = sorted(v)[5]
    print(f"  {k:34s} {med:7.1f} us  {med - base:+7.1f} us")
for name in ("cuda", "auto"):
    if name in plans:
        b = None if name == "auto" else name
        profile(f"{name} fwd+bwd autograd", lambda b=b: portconv.conv2d(xg, wg, None, 1, 1, 1, g_, backend=b).sum(
            ).backward())

# the GPU's side of one forward + backward: is a call bound by the host or by its kernels?
for name in ["torch"] + list(plans):
    def fb(b=None if name == "auto" else name):
        if b == "torch":
            F.conv2d(xg, wg, None, 1, 1, 1, g_).sum().backward()
        else:
            portconv.conv2d(xg, wg, None, 1, 1, 1, g_, backend=b).sum().backward()

    for _ in range(20):
        fb()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(100):
            fb()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_time_total > 0 and e.count >= 100]
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 100
    print(f"===== GPU kernels of {name} fwd+bwd autograd: {gpu:.1f} us of device time a call")
    for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:12]:
        print(f"  {e.count // 100:3d}x {e.self_device_time_total / e.count:8.2f} us  {e.key[:90]}")

# primitives
import cupy  # noqa: E402
import numpy as np  # noqa: E402

d = torch.device("cuda:0")
prims = {
    "torch.cuda.current_stream(0).cuda_stream": lambda: torch.cuda.current_stream(0).cuda_stream,
    "torch._C._cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
    "torch.empty_strided(dev str)": lambda: torch.empty_strided((1, 4, 8, 8), (256, 64, 8, 1), dtype=torch.float32,
                                                                device="cuda:0"),
    "torch.empty_strided(dev obj)": lambda: torch.empty_strided((1, 4, 8, 8), (256, 64, 8, 1), dtype=torch.float32,
                                                                device=d),
    "torch.empty(tuple, dev obj)": lambda: torch.empty((1, 4, 8, 8), dtype=torch.float32, device=d),
    "x.data_ptr()": lambda: x.data_ptr(),
    "with cupy.cuda.Device(0)": lambda: cupy.cuda.Device(0).__enter__(),
    "np.array(60 ints).view(void)": lambda: np.array(list(range(60)), dtype=np.int64).view(np.dtype((np.void, 480))),
    "template.copy()+5 sets": None,
    "cupy.cuda.runtime.getDevice()": lambda: cupy.cuda.runtime.getDevice(),
    "torch.cuda.current_device()": lambda: torch.cuda.current_device(),
}
tmpl = np.zeros(60, dtype=np.int64)


def _tc():
    a = tmpl.copy()
    a[0] = 1
    a[1] = 2
    a[2] = 3
    a[3] = 4
    a[4] = 5
    return a.view(np.dtype((np.void, 480)))


prims["template.copy()+5 sets"] = _tc
for k, fn in prims.items():
    print(f"{k:45s} {per_call(fn, 20000):7.2f} us")
# a bare CuPy launch of an empty kernel with one 480-byte struct argument
src = r'''struct A { long long v[60]; };
extern "C" __global__ void k(const A a) { if (a.v[0] == -1) asm("trap;"); }'''
mod = cupy.RawModule(code=src)
kf = mod.get_function("k")
arg = _tc()
s = cupy.cuda.ExternalStream(torch.cuda.current_stream(0).cuda_stream, 0)
t = per_call(lambda: kf((1, 1, 1), (32, 1, 1), (arg,), stream=s), 20000)
print(f"{'cupy launch (1 struct arg)':45s} {t:7.2f} us")
t = per_call(lambda: (cupy.cuda.Device(0).__enter__(), kf((1, 1, 1), (32, 1, 1), (arg,), stream=s)), 20000)
print(f"{'cupy launch (1 struct arg) in Device ctx':45s} {t:7.2f} us")
