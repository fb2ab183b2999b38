"""Where a converted model's training step spends host time that PyTorch's does not. Per cell: each side's host time
with the GPU idle at the step's start (what the host alone takes to enqueue it) and its synchronised step, sides
interleaved in turns of 5; with ':full', each convolution module's forward host time by kind, GPU time by kernel
(model_profile.profiled) and a cProfile of both sides, functions by the difference of their own time. Sides:
PyTorch, convert() (auto) and convert() with the depthwise layers forced onto --dw-backend (default cuda): whether
portconv's own kernels, launched from C++ (Note [native executor]), win a step that cuDNN's host time bounds.
Public APIs only (portconv.convert, the modules' backend attribute, torch.profiler, cProfile).

  python3 scripts/gpu/host_profile.py mobilenet_v2:float32:channels_last:full efficientnet_b0:bfloat16:channels_last
"""
from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import pathlib
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # portconv from this checkout

from model_profile import host_and_step, profiled, step_fn, sync  # noqa: E402

import portconv  # noqa: E402
from portconv.bench import models  # noqa: E402


def sides_of(model, dw_backend: str) -> dict:
    dw = portconv.convert(copy.deepcopy(model))
    for m in dw.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd) and m.groups > 1 and m.groups == m.in_channels:
            m.backend = dw_backend
    return {"torch": copy.deepcopy(model), "auto": portconv.convert(copy.deepcopy(model)), f"dw-{dw_backend}": dw}


def module_host(model, step, n: int = 10) -> str:
    """Median forward host time of each kind of convolution module (groups, kernel, stride), us, and count a step."""
    acc, hooks = collections.defaultdict(list), []
    for m in model.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            kind = f"{'dw' if m.groups > 1 else 'g1'}-k{m.kernel_size[0]}-s{m.stride[0]}"
            hooks.append(m.register_forward_pre_hook(lambda mod, a: setattr(mod, "_t0", time.perf_counter())))
            hooks.append(m.register_forward_hook(
                lambda mod, a, o, kind=kind: acc[kind].append(time.perf_counter() - mod._t0)))
    for _ in range(n):
        sync()
        step()
    for h in hooks:
        h.remove()
    sync()
    return ", ".join(f"{k} {statistics.median(v) * 1e6:.1f} us x{len(v) // n}" for k, v in sorted(acc.items()))


def own_time(step, n: int = 5) -> dict:
    prof = cProfile.Profile()
    sync()
    prof.enable()
    for _ in range(n):
        step()
    sync()
    prof.disable()
    return {f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}": (v[0] / n, v[2] / n) for k, v in pstats.Stats(prof).stats.items()}


def cell(text: str, dw_backend: str) -> None:
    name, dtype, layout, *full = text.split(":")
    spec = models.resolve(name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    fmt = models.memory_format(layout, spec)
    model = spec.build().to(device).to(memory_format=fmt)
    x = torch.rand(spec.batch, *spec.sample, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, spec.classes, (spec.batch,), device=device) if spec.classes else None
    sides = sides_of(model, dw_backend)
    steps = {side: step_fn(m, x, y, spec, dtype) for side, m in sides.items()}
    for fn in steps.values():
        for _ in range(5):
            fn()
    print(f"\n== {text}", flush=True)
    host_and_step(steps)
    if not full:
        return
    for side in ("torch", "auto"):
        print(f"  {side} convolution forward host time: {module_host(sides[side], steps[side])}")
    if device == "cuda":
        (kt, _), (ka, _) = profiled(steps["torch"]), profiled(steps["auto"])
        print(f"  GPU us a step: torch {sum(kt.values()):.0f}, auto {sum(ka.values()):.0f}")
    t, a = own_time(steps["torch"]), own_time(steps["auto"])
    print(f"  cProfile own time a step: torch {sum(v[1] for v in t.values()) * 1e3:.2f} ms, "
          f"auto {sum(v[1] for v in a.values()) * 1e3:.2f} ms; largest differences (ms, calls):")
    zero = (0.0, 0.0)
    for k in sorted(set(t) | set(a), key=lambda k: -abs(a.get(k, zero)[1] - t.get(k, zero)[1]))[:25]:
        (tc, tt), (ac, at) = t.get(k, zero), a.get(k, zero)
        print(f"   {tt * 1e3:7.3f} {at * 1e3:7.3f}  ({tc:6.1f} {ac:6.1f})  {k}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", help="model:dtype:layout[:full]")
    ap.add_argument("--dw-backend", default="cuda")
    args = ap.parse_args(argv)
    with models.precision(True, torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        for c in args.cells:
            cell(c, args.dw_backend)


if __name__ == "__main__":
    main()
