"""Issue 31's GPU examples on an NVIDIA GPU, each a user forward with portconv's gradients (Note [custom forward]):
the CuPy kernel (examples/custom_forward_cupy: on CUDA, and the same source behind portconv's HIP->CUDA prelude,
HIP-on-NVIDIA), the pybind11 extension's CUDA kernel (examples/custom_forward_cpp, built here with nvcc) and the
Triton kernel (examples/custom_forward_triton). Each is checked with portconv.check_forward over the conformance cases
it accepts, in every dtype it takes, and trained beside PyTorch (examples/dwtrain.py): first-step gradients and every
step's loss against the same model on F.conv2d, its depthwise layers shown to run the user kernel.

They run when pytest is given --backend cuda (tox -e cuda, scripts/gpu/custom_examples.sh) and then FAIL when CUDA,
CuPy, nvcc, pybind11 or Triton is missing; without --backend cuda they skip, so no GPU work runs on a CPU machine.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import require_backend

import portconv

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def gpu(requested_backends):
    """A CUDA device (the cuda backend requested and available: CUDA and CuPy), PyTorch's float32 convolutions in
    IEEE precision (no TF32) so that the training comparisons compare the kernels."""
    if "cuda" not in requested_backends:
        pytest.skip("the cuda backend was not requested (pytest --backend cuda)")
    require_backend("cuda")
    from portconv.bench.settings import torch_variant

    with torch_variant(ieee=True):
        yield torch.device("cuda", torch.cuda.current_device())


def _load(path: pathlib.Path):
    """An example module by its path (examples/ is no package), once a process: a second import would register its
    torch op again."""
    if path.stem not in sys.modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = mod
        spec.loader.exec_module(mod)
    return sys.modules[path.stem]


def _require(what: str, available) -> None:
    if not available:
        pytest.fail(f"--backend cuda was requested but {what}", pytrace=False)


def _check_and_train(op, device, dtypes) -> None:
    """check_forward passes in every dtype, training matches PyTorch's, the model's depthwise layers run ``op``."""
    dwtrain = _load(EXAMPLES / "dwtrain.py")
    rep = portconv.check_forward(op, dtypes=dtypes, device=device)
    assert rep.ok and {r["dtype"] for r in rep.rows if r["status"] == "pass"} == set(dtypes), str(rep)
    grad_err, losses = dwtrain.compare(op, device)
    assert grad_err <= dwtrain.GRAD_TOL, f"first-step gradients differ from PyTorch's by {grad_err:.2e}"
    worst = max(abs(p - q) / abs(p) for p, q in losses)
    assert worst <= dwtrain.LOSS_TOL, f"losses (PyTorch, ours): {losses}"
    net = dwtrain.model(op).to(device)
    x = torch.randn(2, 16, 12, 12, device=device)
    for layer in (net[2], net[5]):
        text = op.explain(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups)
        assert text.startswith(f"forward      user kernel {op.name}"), text


def test_cupy_kernel_on_cuda(gpu):
    dw = _load(EXAMPLES / "custom_forward_cupy" / "dwconv_cupy.py")
    _check_and_train(dw.dw_forward, gpu, ("float32", "float64", "bfloat16"))


def test_cupy_kernel_in_hip_on_nvidia_mode(gpu):
    """The same dwconv.cu behind hip/prelude.h with the hip backend's NVIDIA options (Note [HIP modes]): the text an
    AMD GPU compiles with hiprtc, executed here through the HIP->CUDA mapping; its results are the CUDA build's."""
    from portconv import sources
    from portconv.backends.simt import hip
    from portconv.backends.simt.compile import inline_source

    dw = _load(EXAMPLES / "custom_forward_cupy" / "dwconv_cupy.py")
    prelude = inline_source("prelude.h", [sources.folder("hip"), sources.folder("cuda")])
    kernel = dw.DepthwiseKernel(prefix=prelude + "\n", options=hip.compile_options("nvidia", 32))
    op = portconv.custom_forward("portconv_test::dw_cupy_hip_on_nvidia", supports=dw.supports, rank=2)(kernel)
    _check_and_train(op, gpu, ("float32", "float64", "bfloat16"))
    g = torch.Generator(device=gpu).manual_seed(0)
    x = torch.randn(2, 24, 19, 17, device=gpu, generator=g)
    w, b = torch.randn(48, 1, 3, 3, device=gpu, generator=g), torch.randn(48, device=gpu, generator=g)
    args = ([2, 2], [1, 1], [1, 1], 24)
    assert torch.equal(kernel(x, w, b, *args), dw.dw_forward.fn(x, w, b, *args))


def test_cpp_extension_cuda_kernel(gpu, tmp_path):
    """examples/custom_forward_cpp built with DWCONV_CUDA=1 (nvcc), then `example.py --cuda`: the check, the
    training beside PyTorch and the plan, in a process of its own as a user runs it."""
    _require("pybind11 is not installed", importlib.util.find_spec("pybind11"))
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = shutil.which("nvcc") or shutil.which(os.path.join(home, "bin", "nvcc"))
    _require("nvcc is not on PATH or in $CUDA_HOME/bin", nvcc)
    src = tmp_path / "examples" / "custom_forward_cpp"
    shutil.copytree(EXAMPLES / "custom_forward_cpp", src, ignore=shutil.ignore_patterns("build", "*.so"))
    shutil.copy(EXAMPLES / "dwtrain.py", src.parent)
    env = dict(os.environ, DWCONV_CUDA="1", PATH=f"{os.path.dirname(nvcc)}{os.pathsep}{os.environ.get('PATH', '')}")
    b = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src, capture_output=True,
                       text=True, env=env, timeout=600)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    r = subprocess.run([sys.executable, "example.py", "--cuda"], cwd=src, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "EXAMPLE-RESULT" in r.stdout, out[-4000:]
    # cases passed on CUDA tensors ran dwconv_cuda (the CPU kernel takes none; a missing module fails its rows)
    checked = re.search(r"example::dw_forward: (\d+) passed, 0 failed", r.stdout)
    assert checked and int(checked.group(1)) > 0, out[-4000:]
    assert "forward      user kernel example::dw_forward" in r.stdout, out[-4000:]


def test_triton_kernel(gpu):
    _require("Triton is not installed", importlib.util.find_spec("triton"))
    dw = _load(EXAMPLES / "custom_forward_triton" / "dwconv_triton.py")
    _check_and_train(dw.dw_forward, gpu, ("float32", "float16", "bfloat16"))
