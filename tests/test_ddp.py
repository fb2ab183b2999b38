"""Distributed and multi-GPU use: a converted model under DDP (gloo on CPU processes, NCCL on 2 GPUs), and cuda:1."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import require_backend  # noqa: E402

import portconv  # noqa: E402
from portconv.bench.models import precision  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "ddp_train.py"


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _two_gpus() -> None:
    """Skip, with the reason, where fewer than 2 GPUs are present (a skip: these tests never pass empty)."""
    if _gpus() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, found {_gpus()}")


def torchrun(*args, timeout: float = 600) -> dict:
    """scripts/gpu/ddp_train.py on 2 processes; its DDP-RESULT (the run must exit 0)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                                       "")]))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    line = next((s for s in p.stdout.splitlines() if s.startswith("DDP-RESULT ")), None)
    assert p.returncode == 0 and line is not None, f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return json.loads(line[len("DDP-RESULT "):])


@pytest.mark.parametrize("backend", ["aten", "opencl"])
def test_ddp_gloo_cpu_processes(backend):
    """The mechanism on any machine: 2 CPU processes over gloo, losses of the converted model equal to PyTorch DDP's
    at every step, and the parameters the same on both ranks."""
    if backend == "opencl":
        from portconv import backends

        avail = backends.get("opencl").probe()
        if not avail:  # the aten run proves the mechanism; this one adds portconv's own kernels where they exist
            pytest.skip(f"the opencl backend is unavailable: {avail.reason}")
    r = torchrun("--device", "cpu", "--backend", backend, "--steps", "3", timeout=300)
    assert r["ok"] and r["dist_backend"] == "gloo" and r["world"] == 2 and r["params_synced"], r
    assert r["converted"] == 5 and len(r["torch"]) == len(r["portconv"]) == 3 and r["max_rel"] <= 1e-4


@pytest.mark.parametrize(("model", "backend"), [("small", "auto"), ("small", "cuda"), ("resnet18", "auto")])
def test_ddp_nccl_two_gpus(model, backend):
    """The converted model under DistributedDataParallel on 2 GPUs over NCCL: losses equal to PyTorch DDP's (TF32
    off on both sides)."""
    _two_gpus()
    if backend != "auto":
        require_backend(backend)
    if model == "resnet18":
        pytest.importorskip("torchvision", reason="resnet18 comes from torchvision")
    r = torchrun("--device", "cuda", "--backend", backend, "--model", model, "--steps", "8")
    assert r["ok"] and r["dist_backend"] == "nccl" and r["params_synced"] and r["max_rel"] <= 1e-4, r


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_cuda1_conv2d_and_converted_model():
    """Tensors on cuda:1 while cuda:0 is current: portconv.conv2d and a converted model on the cuda backend run
    there, and match PyTorch's results and gradients (IEEE float32)."""
    _two_gpus()
    require_backend("cuda")
    from torch import nn

    dev = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    gen = torch.Generator().manual_seed(0)
    with precision(True, dev):
        x = torch.randn(4, 8, 20, 20, generator=gen).to(dev).requires_grad_()
        w = torch.randn(16, 8, 3, 3, generator=gen).to(dev).requires_grad_()
        b = torch.randn(16, generator=gen).to(dev).requires_grad_()
        g = torch.randn(4, 16, 10, 10, generator=gen).to(dev)
        y = portconv.conv2d(x, w, b, stride=2, padding=1, backend="cuda")
        ref = torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)
        assert y.device == dev and torch.cuda.current_device() == 0
        assert portconv.plan(x, w, b, stride=2, padding=1, backend="cuda").device.index == "cuda:1"
        assert _rel(y, ref) < 1e-5
        for got, want in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g)):
            assert got.device == dev and _rel(got, want) < 1e-5

        torch.manual_seed(0)
        # no bias before BatchNorm: its true gradient is 0, the computed one rounding noise (1e-8) on both sides
        net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                            nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ConvTranspose2d(16, 4, 2, stride=2),
                            nn.Flatten(), nn.Linear(4 * 40 * 40, 10)).to(dev)
        conv = portconv.convert(net, backend="cuda")
        xin = torch.randn(2, 8, 20, 20, generator=gen).to(dev)
        out, want = conv(xin), net(xin)
        assert out.device == dev and _rel(out, want) < 1e-5
        out.square().sum().backward()
        want.square().sum().backward()
        for (name, p), q in zip(conv.named_parameters(), net.parameters()):
            assert p.grad.device == dev and _rel(p.grad, q.grad) < 1e-4, name
