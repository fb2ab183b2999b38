"""Where a converted model's training step spends GPU time that PyTorch's does not: kernels and aten ops of a few
profiled steps, both sides, largest differences first. Public APIs only (portconv.convert, torch.profiler).

  python3 scripts/gpu/model_profile.py resnet50:bfloat16:channels_last [mobilenet_v2:float32:nchw:compile ...]
"""
from __future__ import annotations

import collections
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import portconv
from portconv.bench import models


def step_fn(model, x, y, spec, dtype):
    """models.make_step's training step (the bench's), on one batch, as a call without arguments."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = models.make_step(model, opt, [(x, x if y is None else y)], spec, dtype, x.device, [])
    return lambda: step(None)


def profiled(step, n=3):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kern, ops = collections.Counter(), collections.Counter()
    for e in prof.key_averages():
        if e.device_time_total > 0 and not e.key.startswith("aten::") and e.cpu_time_total == 0:
            kern[e.key[:90]] += e.device_time_total / n
        if e.key.startswith("aten::"):
            ops[e.key] += e.count / n
    return kern, ops


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_and_step(steps: dict, rounds: int = 6) -> None:
    """Each side's median host time with the GPU idle at the step's start and its synchronised step, the sides
    interleaved in turns of 5 (``steps``: side -> step, PyTorch's as 'torch')."""
    times = collections.defaultdict(list)
    for _ in range(rounds):
        for side, fn in steps.items():
            for _ in range(5):
                sync()
                t0 = time.perf_counter()
                fn()
                times[side, "host"].append(time.perf_counter() - t0)
                sync()
                times[side, "step"].append(time.perf_counter() - t0)
    base = statistics.median(times["torch", "step"])
    for side in steps:
        h, s = statistics.median(times[side, "host"]), statistics.median(times[side, "step"])
        print(f"  {side:>10}: host (idle GPU) {h * 1e3:7.2f} ms, step {s * 1e3:7.2f} ms, x PyTorch {base / s:.3f}")


def plans_of(model, step, dtype) -> collections.Counter:
    """The plan of each convolution module's call in one step (under the step's autocast): its backend, and whether
    ATen records it (Plan.aten_autograd: no portconv autograd.Function on the call)."""
    seen, hooks = collections.Counter(), []

    def hook(m, args, out):
        x = args[0]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):
            dt = x.dtype if dtype != "bfloat16" else torch.bfloat16
            p = portconv.plan(x.to(dt), m.weight.to(dt), None if m.bias is None else m.bias.to(dt), m.stride,
                              m.padding, m.dilation, m.transposed, m.output_padding, m.groups, backend=m.backend)
        seen[(p.backend, "aten-recorded" if p.aten_autograd else "autograd.Function")] += 1

    for m in model.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            hooks.append(m.register_forward_hook(hook))
    step()
    for h in hooks:
        h.remove()
    return seen


def main(argv):
    with models.precision(True, torch.device("cuda")):  # IEEE float32, as the model bench runs
        for cell in argv:
            profile_cell(cell)


def profile_cell(cell: str):
    name, dtype, layout, *mode = cell.split(":")
    spec = models.resolve(name)
    torch.manual_seed(0)
    model = spec.build().cuda()
    fmt = models.memory_format(layout, spec)
    model = model.to(memory_format=fmt)
    x = torch.rand(spec.batch, *spec.sample, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(0, spec.classes, (spec.batch,), device="cuda") if spec.classes else None
    sides = {"torch": copy.deepcopy(model), "auto": portconv.convert(copy.deepcopy(model))}
    if mode == ["compile"]:  # torch.compile of each side's model (the loss and the optimizer stay eager)
        torch._dynamo.reset()
        sides = {side: torch.compile(m) for side, m in sides.items()}
    steps = {side: step_fn(m, x, y, spec, dtype) for side, m in sides.items()}
    res = {side: profiled(fn) for side, fn in steps.items()}
    print(f"\n== {cell}")
    if not mode:  # (hooks on a compiled model's modules would recompile it)
        print("  auto's plans (backend, ATen records the call, per conv module): "
              + ", ".join(f"{k} x{v}" for k, v in plans_of(sides["auto"], steps["auto"], dtype).most_common()))
    host_and_step(steps)  # host time: a step enqueued on an idle GPU, then the whole step
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        steps["auto"]()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    print("  auto, 5 steps, cProfile by own time:\n" + "\n".join(out.getvalue().splitlines()[6:30]))
    (kt, ot), (ka, oa) = res["torch"], res["auto"]
    print(f"  {cell}: GPU us/step torch {sum(kt.values()):.0f}, auto {sum(ka.values()):.0f}")
    diff = sorted(set(kt) | set(ka), key=lambda k: -abs(ka[k] - kt[k]))
    for k in diff[:14]:
        print(f"  {kt[k]:9.1f} {ka[k]:9.1f}  {k}")
    print("  aten ops whose count per step differs (torch, auto):")
    for k in sorted(set(ot) | set(oa), key=lambda k: -abs(oa[k] - ot[k]))[:12]:
        if ot[k] != oa[k]:
            print(f"  {ot[k]:7.1f} {oa[k]:7.1f}  {k}")


if __name__ == "__main__":
    main(sys.argv[1:])
