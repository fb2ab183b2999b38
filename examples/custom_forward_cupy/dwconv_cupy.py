"""The seed user's depthwise forward (dwconv.cu, one CUDA/HIP source) run by CuPy, with portconv's gradients.

    import dwconv_cupy                                     # from this folder (or with it on sys.path)
    y = dwconv_cupy.dw_forward(x, w, b, 1, 1, 1, groups)   # F.conv2d's signature, on CUDA or ROCm torch tensors

CuPy compiles dwconv.cu with NVRTC on an NVIDIA GPU and with hiprtc on an AMD GPU (cupy-rocm): the same text, no
#ifdef (Note [one source for CUDA and HIP] in dwconv.cu). portconv.custom_forward makes ``dw_forward`` the torch op
``example_cupy::dw_forward``: autograd through portconv.convolution_backward on the tensors' vendor, torch.compile,
autocast, PyTorch's argument checks. Problems ``supports`` rejects run portconv's own forward instead.
"""
from __future__ import annotations

import pathlib
import warnings

import cupy
import numpy as np
import torch

import portconv

SOURCE = (pathlib.Path(__file__).resolve().parent / "dwconv.cu").read_text()
ENTRIES = {"float32": "dw_forward_f32", "float64": "dw_forward_f64", "bfloat16": "dw_forward_bf16"}
THREADS = 256  # DW_THREADS in dwconv.cu (its __launch_bounds__)
GRID_Y = 65535  # the largest grid y extent on both vendors; the kernel loops over more planes


def supports(problem) -> bool:
    """What dwconv.cu computes: 2-D depthwise (any channel multiplier, kernel size, stride and padding), dilation 1,
    contiguous NCHW input and weight as CUDA/ROCm torch tensors in float32, float64 or bfloat16, planes of fewer
    than 2^31 elements (the kernel's 32-bit in-plane offsets)."""
    x, w, params = problem.input, problem.weight, problem.params
    if params.rank != 2:
        return False
    plane = max(x.shape[2] * x.shape[3], problem.output_shape[2] * problem.output_shape[3])
    return (problem.is_depthwise and tuple(params.dilation) == (1, 1)
            and problem.dtype in ENTRIES and x.device_type == "cuda" and x.kind == "torch"
            and x.is_contiguous() and w.is_contiguous() and plane < 2**31)


class DepthwiseKernel:
    """dwconv.cu (after ``prefix``) compiled by CuPy for each device it meets, launched on torch's current stream
    with torch's memory: no copy, no synchronization. ``prefix`` and ``options`` let a test compile the same text
    behind another prelude (HIP-on-NVIDIA)."""

    def __init__(self, prefix: str = "", options: tuple[str, ...] = ()):
        # RawKernels compile at their first launch on a device (CuPy keeps one module a code, options and device)
        self.kernels = {dtype: cupy.RawKernel(prefix + SOURCE, name, options=tuple(options))
                        for dtype, name in ENTRIES.items()}
        self.streams: dict[tuple[int, int], object] = {}

    def stream(self, device: torch.device):
        """torch's current stream on ``device`` as a CuPy stream object (kept: CuPy launches on its own objects)."""
        ptr = torch.cuda.current_stream(device).cuda_stream
        s = self.streams.get((ptr, device.index))
        if s is None:
            with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; older CuPy has nothing else
                warnings.simplefilter("ignore", DeprecationWarning)
                s = self.streams[(ptr, device.index)] = cupy.cuda.ExternalStream(ptr, device.index)
        return s

    def __call__(self, input, weight, bias, stride, padding, dilation, groups):
        n, c, h, w = input.shape
        k, _, r, s = weight.shape
        p = (h + 2 * padding[0] - r) // stride[0] + 1
        q = (w + 2 * padding[1] - s) // stride[1] + 1
        out = torch.empty((n, k, p, q), dtype=input.dtype, device=input.device)
        if out.numel() == 0:
            return out
        # Pointer parameters get the tensors' addresses as 64-bit integers; the int parameters numpy.int32 (CuPy
        # passes a scalar with its own width, and a Python int would be 64 bits).
        b = None if bias is None else bias.contiguous()
        ptrs = [np.uint64(0 if t is None else t.data_ptr()) for t in (input, weight, b, out)]
        dims = (c, k // c, h, w, p, q, r, s, stride[0], stride[1], padding[0], padding[1])
        args = (*ptrs, np.int64(n * k), *(np.int32(v) for v in dims))
        grid = (-(-p * q // THREADS), min(n * k, GRID_Y))
        with cupy.cuda.Device(input.device.index):  # .kernel: this device's compiled function (built once)
            fn = self.kernels[str(input.dtype).removeprefix("torch.")].kernel
            fn(grid, (THREADS,), args, stream=self.stream(input.device))
        return out


dw_forward = portconv.custom_forward("example_cupy::dw_forward", supports=supports, rank=2)(DepthwiseKernel())
