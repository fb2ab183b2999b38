"""Per-call overhead of a cached plan on a tiny problem vs torch's F.conv2d, and first-call (compile) times."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from .. import knobs
from ..errors import Unsupported
from .timing import Stats

TARGET_US = 25.0  # issue 5 target 6: within 25 microseconds of F.conv2d's wall time on the GPU


def _device(device):
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def tiny_inputs(backend: str | None, device, shape=(1, 4, 8, 8), kernel: int = 3, seed: int = 0):
    """(x, w, sync, where) for a tiny conv2d: pyopencl arrays for the opencl backend, else torch tensors."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n, c, h, w_ = shape
    x = torch.empty(shape).uniform_(-1, 1, generator=gen)
    w = torch.empty(c, c, kernel, kernel).uniform_(-1, 1, generator=gen)
    if backend == "opencl":
        import pyopencl.array as cla

        from ..backends.opencl import runtime as rt

        p, d = rt.default_index()
        dev = next(e[2] for e in rt.all_devices() if (e[0], e[1]) == (p, d))
        mod = rt.cl()
        queue = mod.CommandQueue(mod.Context([dev]), dev)
        return (cla.to_device(queue, x.numpy()), cla.to_device(queue, w.numpy()), queue.finish,
                f"pyopencl arrays on {dev.name.strip()}")
    device = _device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return x.to(device), w.to(device), sync, f"torch tensors on {device}"


def _per_call_us(cells: dict, calls: int, repeats: int) -> dict:
    """``cells``: name -> (call, sync). Back-to-back calls with one sync at the end: host cost per call (median over
    repeats), and single-call latency (median). The cells take turns batch by batch, so host noise (clocks, other
    processes) falls on each alike."""
    for fn, sync in cells.values():
        fn()
        sync()
    batches, single = {k: [] for k in cells}, {k: [] for k in cells}
    for _ in range(repeats):
        for k, (fn, sync) in cells.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            batches[k].append((time.perf_counter() - t0) * 1e6 / calls)
    for _ in range(max(calls // 4, 10)):
        for k, (fn, sync) in cells.items():
            t0 = time.perf_counter()
            fn()
            sync()
            single[k].append((time.perf_counter() - t0) * 1e6)
    return {k: {"per_call_us": Stats.of(batches[k]).median, "per_call_stats_us": Stats.of(batches[k]).as_dict(),
                "synced_call_us": Stats.of(single[k]).median, "synced_call_stats_us": Stats.of(single[k]).as_dict()}
            for k in cells}


def overhead(backend: str | None = None, device=None, calls: int = 200, repeats: int = 15, compile: bool = True,
             shape=(1, 4, 8, 8), kernel: int = 3, train: bool = True) -> dict:
    """Per-call overhead of portconv on a cached plan for a tiny conv2d, against torch.nn.functional.conv2d.

    ``per_call_us``: back-to-back calls with one device sync at the end (the host cost that issue 5 target 6
    bounds); ``synced_call_us``: one call plus a sync. portconv is timed through ``portconv.conv2d`` (validation,
    plan-cache lookup, launch) and through ``Plan.forward`` directly. With ``compile`` the first call is also
    timed in fresh processes: once with empty kernel caches (cold) and once with the caches it left (warm). With
    ``train``, ``out['train']`` is train_overhead(): the same conv's forward + backward through autograd.
    """
    import torch
    import torch.nn.functional as F

    import portconv

    from .settings import no_poison

    tdev = _device(device)
    with no_poison(), torch.no_grad():
        x, w, sync, where = tiny_inputs(backend, tdev, shape, kernel)
        tx, tw = x, w
        if backend == "opencl":  # torch's own call runs on the torch device
            from .data import to_torch

            tx, tw = to_torch(x, tdev), to_torch(w, tdev)
        tsync = (lambda: torch.cuda.synchronize(tdev)) if tdev.type == "cuda" else (lambda: None)
        pad = kernel // 2
        plan = portconv.plan(x, w, padding=pad, backend=backend)
        out = {"backend": backend or "auto", "plan_backend": str(plan.backend), "data": where,
               "torch_device": str(tdev), "shape": list(shape), "kernel": kernel, "calls": calls,
               "repeats": repeats, "target_us": TARGET_US}
        out.update(_per_call_us({"torch": (lambda: F.conv2d(tx, tw, padding=pad), tsync),
                                 "portconv": (lambda: portconv.conv2d(x, w, padding=pad, backend=backend), sync),
                                 "plan_forward": (lambda: plan.forward(x, w, None), sync)}, calls, repeats))
    for k in ("portconv", "plan_forward"):
        out[f"{k}_minus_torch_us"] = out[k]["per_call_us"] - out["torch"]["per_call_us"]
    out["within_target"] = out["portconv_minus_torch_us"] <= TARGET_US
    if train:  # a backend whose gradients fail keeps its forward numbers
        try:
            out["train"] = train_overhead(backend, tdev, calls, repeats, shape, kernel)
        except (Unsupported, RuntimeError) as e:
            out["train"] = {"error": f"{type(e).__name__}: {e}"}
    if compile:
        out["first_call"] = first_call_times(backend, str(tdev))
    return out


def train_overhead(backend: str | None, device, calls: int = 200, repeats: int = 15, shape=(1, 4, 8, 8),
                   kernel: int = 3) -> dict:
    """Forward + backward of the tiny conv2d through autograd (torch.autograd.grad of input and weight), portconv
    against F.conv2d: a training step's host cost per convolution (issue 29 point 5: at most PyTorch's + 25 us).

    Torch tensors on ``device`` (the opencl backend takes CPU ones); the same calls and syncs as ``per_call_us``.
    """
    import torch
    import torch.nn.functional as F

    import portconv

    from .settings import no_poison

    tdev = _device(device)
    if backend == "opencl" and tdev.type != "cpu":
        return {"skipped": f"the opencl backend takes CPU torch tensors (or pyopencl arrays), not {tdev.type} ones"}
    gen = torch.Generator().manual_seed(0)
    n, c, h, w_ = shape
    x = torch.empty(shape).uniform_(-1, 1, generator=gen).to(tdev).requires_grad_()
    w = torch.empty(c, c, kernel, kernel).uniform_(-1, 1, generator=gen).to(tdev).requires_grad_()
    pad = kernel // 2
    g = torch.empty(n, c, h + 2 * pad - kernel + 1, w_ + 2 * pad - kernel + 1).uniform_(-1, 1, generator=gen).to(tdev)
    sync = (lambda: torch.cuda.synchronize(tdev)) if tdev.type == "cuda" else (lambda: None)

    def step(conv):
        def call():
            torch.autograd.grad(conv(x, w, padding=pad), (x, w), g)
        return call

    def ours(a, b, padding):
        return portconv.conv2d(a, b, padding=padding, backend=backend)

    # the same call as a model makes it: a torch.nn.Conv2d and its portconv.convert() (Note [module memo])
    theirs = torch.nn.Conv2d(c, c, kernel, padding=pad, bias=False).to(tdev)
    with torch.no_grad():
        theirs.weight.copy_(w)
    mine = portconv.convert(theirs, backend)

    def module_step(mod):
        def call():
            torch.autograd.grad(mod(x), (x, mod.weight), g)
        return call

    with no_poison():
        out = {"calls": "torch.autograd.grad(conv2d(x, w, padding), (x, w), grad_output)",
               "data": f"torch tensors on {tdev}",
               "module_calls": "torch.autograd.grad(module(x), (x, module.weight), grad_output): torch.nn.Conv2d "
                               "and portconv.convert() of it",
               **_per_call_us({"torch": (step(F.conv2d), sync), "portconv": (step(ours), sync),
                               "torch_module": (module_step(theirs), sync),
                               "portconv_module": (module_step(mine), sync)}, calls, repeats)}
    out["portconv_minus_torch_us"] = out["portconv"]["per_call_us"] - out["torch"]["per_call_us"]
    out["module_minus_torch_us"] = out["portconv_module"]["per_call_us"] - out["torch_module"]["per_call_us"]
    out["within_target"] = out["portconv_minus_torch_us"] <= TARGET_US
    return out


_SCRIPT = r"""
import json, sys, time
import torch, portconv
from portconv.bench.overhead import tiny_inputs
backend = None if sys.argv[1] == "auto" else sys.argv[1]
x, w, sync, where = tiny_inputs(backend, sys.argv[2])
t = {}
t0 = time.perf_counter(); y = portconv.conv2d(x, w, padding=1, backend=backend); sync()
t["first_forward_ms"] = (time.perf_counter() - t0) * 1e3
t0 = time.perf_counter(); portconv.conv2d(x, w, padding=1, backend=backend); sync()
t["second_forward_ms"] = (time.perf_counter() - t0) * 1e3
p = portconv.plan(x, w, padding=1, backend=backend)
t0 = time.perf_counter(); p.backward(y, x, w, (True, True, False)); sync()
t["first_backward_ms"] = (time.perf_counter() - t0) * 1e3
t0 = time.perf_counter(); p.backward(y, x, w, (True, True, False)); sync()
t["second_backward_ms"] = (time.perf_counter() - t0) * 1e3
t["plan_backend"] = str(p.backend)
try:
    from portconv.backends.simt import compile as _cupy
    t["compile_events"] = [dict(entry=e.entry, how=e.how, seconds=e.seconds) for e in _cupy.compile_events()]
except ImportError:
    pass
if str(p.backend) == "opencl":
    from portconv.backends.opencl import runtime as _cl_runtime
    t["opencl_programs_built"] = _cl_runtime.stats["programs_built"]
print("BENCH-JSON " + json.dumps(t))
"""


def first_call_times(backend: str | None, device: str, timeout: float = 600) -> dict:
    """First forward/backward wall times in fresh processes: cold (empty caches), then warm (the caches it left).

    The caches are portconv's (PORTCONV_CACHE_DIR: NVRTC modules, pyopencl binaries), PoCL's and CuPy's, all
    pointed into one temporary directory so the machine's own caches neither help nor change.
    """
    out = {}
    with tempfile.TemporaryDirectory(prefix="portconv-bench-") as tmp:
        env = knobs.child_environ(os.path.join(tmp, "portconv"), POCL_CACHE_DIR=os.path.join(tmp, "pocl"),
                                  CUPY_CACHE_DIR=os.path.join(tmp, "cupy"))
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, "-c", _SCRIPT, backend or "auto", device], env=env,
                                   capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                out[label] = {"error": f"timed out after {timeout} s"}
                continue
            line = next((s for s in p.stdout.splitlines() if s.startswith("BENCH-JSON ")), None)
            if p.returncode != 0 or line is None:
                out[label] = {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}"}
                continue
            out[label] = json.loads(line[len("BENCH-JSON "):])
            out[label]["process_s"] = time.perf_counter() - t0
    return out
