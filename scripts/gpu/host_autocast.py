"""Host time of one converted depthwise convolution's forward + backward through autograd, in float32 and under
autocast bfloat16, against torch.nn's (efficientnet_b0's 5x5 stride-2 layer, batch 64). The GPU waits behind
torch.cuda._sleep while the host enqueues, so only the host's time is measured (best of 5 rounds of 50 calls);
then a cProfile of the autocast call. Public APIs only (portconv.convert, torch).

  python3 scripts/gpu/host_autocast.py
"""
import copy
import cProfile
import io
import pstats
import time

import torch

import portconv

ROUNDS, CALLS, HOLD_CYCLES = 5, 50, int(3e8)  # the hold outlasts a round's enqueue


def step(module, x, autocast: bool) -> None:
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        y = module(x)
    y.backward(torch.ones_like(y))


def host_us(module, x, autocast: bool) -> float:
    for _ in range(5):
        step(module, x, autocast)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(ROUNDS):
        torch.cuda._sleep(HOLD_CYCLES)
        t0 = time.perf_counter()
        for _ in range(CALLS):
            step(module, x, autocast)
        best = min(best, (time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    torch.manual_seed(0)
    base = torch.nn.Conv2d(144, 144, 5, stride=2, padding=2, groups=144, bias=False).cuda()
    conv = portconv.convert(copy.deepcopy(base))
    x = torch.randn(64, 144, 56, 56, device="cuda", requires_grad=True)
    xb = x.detach().bfloat16().requires_grad_()
    for name, module, inp, ac in (("torch.nn float32", base, x, False), ("portconv float32", conv, x, False),
                                  ("torch.nn autocast (x float32)", base, x, True),
                                  ("portconv autocast (x float32)", conv, x, True),
                                  ("torch.nn autocast (x bfloat16)", base, xb, True),
                                  ("portconv autocast (x bfloat16)", conv, xb, True)):
        print(f"{name:32s} {host_us(module, inp, ac):8.1f} us of host time a forward + backward", flush=True)
    prof = cProfile.Profile()
    torch.cuda._sleep(HOLD_CYCLES)
    prof.enable()
    for _ in range(CALLS):
        step(conv, xb, True)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


if __name__ == "__main__":
    main()
