"""Host time of converted depthwise layers against torch.nn, forward and backward over a retained graph, the GPU held
so that only the host is timed (best of 9 rounds of 100 calls). PORTCONV_NATIVE picks the executor (Note [native
executor]): run it once with =wait and once with =off."""
import copy
import os
import time

import torch

import portconv
from portconv import native

HOLD = int(2.5e8)
t0 = time.perf_counter()
if os.environ.get("PORTCONV_NATIVE") == "wait":
    native.wait()

print("native", native.status(), f"{time.perf_counter() - t0:.1f} s", flush=True)


def rounds(fns, calls=100, n=9):
    best = {k: 1e9 for k in fns}
    for f in fns.values():
        for _ in range(5):
            f()
    torch.cuda.synchronize()
    for _ in range(n):
        for k, f in fns.items():
            torch.cuda._sleep(HOLD)
            t = time.perf_counter()
            for _ in range(calls):
                f()
            best[k] = min(best[k], (time.perf_counter() - t) / calls * 1e6)
            torch.cuda.synchronize()
    return best

for dt, shape, k, s in ((torch.float32, (64, 144, 56, 56), 3, 1), (torch.bfloat16, (64, 144, 56, 56), 3, 1),
                        (torch.bfloat16, (64, 144, 56, 56), 5, 2), (torch.float32, (64, 32, 112, 112), 3, 1)):
    torch.manual_seed(0)
    base = torch.nn.Conv2d(shape[1], shape[1], k, stride=s, padding=k // 2, groups=shape[1], bias=False).cuda()
    conv = portconv.convert(copy.deepcopy(base))
    x = torch.randn(*shape, device="cuda", requires_grad=True)
    amp = dt == torch.bfloat16
    fns = {}
    for name, m in (("torch", base), ("portconv", conv)):
        def fwd(m=m, x=x, amp=amp):
            with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                return m(x)
        y = fwd()
        g = torch.ones_like(y)
        fns[name + " fwd"] = fwd
        fns[name + " bwd"] = (lambda y=y, g=g: y.backward(g, retain_graph=True))
    r = rounds(fns)
    p = portconv.plan(x.to(torch.bfloat16 if amp else dt), conv.weight.to(torch.bfloat16 if amp else dt), None,
                      s, k // 2, 1, groups=shape[1])
    print(f"{str(dt):15s} {shape} k{k} s{s} [{p.backend}, native executor {native.status()}]: "
          + ", ".join(f"{n} {v:.1f}" for n, v in r.items())
          + f"  | excess fwd {r['portconv fwd'] - r['torch fwd']:+.1f}"
          + f" bwd {r['portconv bwd'] - r['torch bwd']:+.1f} us",
          flush=True)
