"""A user's C++ depthwise forward (pybind11) trained with portconv's gradients: dwconv.cpp on the CPU, and the same
extension's CUDA kernel (dwconv_cuda.cu, built by nvcc) on CUDA tensors.

    cd examples/custom_forward_cpp && python setup.py build_ext --inplace && python example.py
    DWCONV_CUDA=1 python setup.py build_ext --inplace && python example.py --cuda

dw_forward below is the user kernel; portconv.custom_forward makes it the torch op ``example::dw_forward`` with
F.conv2d's signature: validated arguments, autograd through portconv.convolution_backward, torch.compile and
autocast. Problems the kernel does not take (not depthwise, not 2-D, 16-bit, non-contiguous CUDA tensors) go to
portconv's own forward. ../dwtrain.py checks it and trains it beside PyTorch.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import torch

import portconv

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/: dwtrain
import dwtrain  # noqa: E402

try:
    import dwconv  # the extensions built by setup.py
except ImportError as e:
    raise SystemExit(f"build the extension first: python setup.py build_ext --inplace ({e})") from e
try:
    import dwconv_cuda
except ImportError:
    dwconv_cuda = None  # built with DWCONV_CUDA=1 only


def _takes(problem) -> bool:
    x = problem.input
    if not (problem.is_depthwise and problem.params.rank == 2 and problem.dtype in ("float32", "float64")):
        return False
    if x.device_type == "cpu":
        return True
    plane = max(x.shape[2] * x.shape[3], problem.output_shape[2] * problem.output_shape[3])
    return (x.device_type == "cuda" and x.kind == "torch" and x.is_contiguous() and problem.weight.is_contiguous()
            and plane < 2**31)  # dwconv_cuda.cu: NCHW, 32-bit offsets inside a plane


def _cuda_forward(input, weight, bias, stride, padding, dilation):
    """dwconv_cuda's kernel on torch's memory and current stream: no copy, no synchronization."""
    if dwconv_cuda is None:
        raise RuntimeError("CUDA tensors need the CUDA kernel: DWCONV_CUDA=1 python setup.py build_ext --inplace")
    n, c, h, w = input.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    out = torch.empty((n, k, p, q), dtype=input.dtype, device=input.device)
    b = None if bias is None else bias.contiguous()
    with torch.cuda.device(input.device):  # the kernel launches on the current device
        dwconv_cuda.forward(input.data_ptr(), weight.data_ptr(), 0 if b is None else b.data_ptr(), out.data_ptr(),
                            [n, c, k, h, w, p, q, r, s, *stride, *padding, *dilation], input.dtype == torch.float64,
                            torch.cuda.current_stream(input.device).cuda_stream)
    return out


@portconv.custom_forward("example::dw_forward", supports=_takes)
def dw_forward(input, weight, bias, stride, padding, dilation, groups):
    if input.is_cuda:
        return _cuda_forward(input, weight, bias, stride, padding, dilation)
    f = dwconv.forward_f32 if input.dtype == torch.float32 else dwconv.forward_f64
    b = None if bias is None else bias.detach().numpy()
    y = f(input.detach().numpy(), weight.detach().numpy(), b, stride, padding, dilation, groups)
    return torch.from_numpy(np.asarray(y))


if __name__ == "__main__":
    raise SystemExit(dwtrain.run(dw_forward, "cuda" if "--cuda" in sys.argv[1:] else "cpu"))
