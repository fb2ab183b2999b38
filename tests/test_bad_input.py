"""The bad-input sweep of issue 32 as a differential table test against PyTorch (Note [bad-input sweep])."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from test_validate import TORCH_FN, _first_line, bwd, conv, fn, r

import portconv
from portconv.errors import BackendUnavailable, ConvError

# Note [bad-input sweep]
# Each row of CASES is one call of F.conv*d / F.conv_transpose*d or aten.convolution(_backward) with bad or edge
# arguments, made once through PyTorch and once through portconv's function of the same name on each route: the
# opencl backend, forced, and the default plan. The outcomes must agree: both raise, portconv's exception an instance
# of PyTorch's type (ConvError is a RuntimeError) with PyTorch's first line; or both return, the same shapes, dtypes,
# devices and strides, values equal in float64 within the dtype's tolerance, NaN and infinities where PyTorch has
# them. Results are NaN-filled before kernels run (PORTCONV_POISON), so an element no kernel wrote (a partial
# result) fails the comparison. No call may change a caller's tensor (values, strides, version counter, conj and neg
# bits). Where an outcome legitimately differs, DIFFERS says why and what portconv does instead; anything else fails.
# test_validate.py holds the message table of validation proper (before any backend is chosen, on the aten backend);
# this sweep runs whole calls, on the routes where kernels run.

f64, f32, f16, bf16, c64, c128 = torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, \
    torch.complex128
A = torch.ops.aten
ROUTES = ("opencl", None)  # a forced backend, and the default plan (ATen on CPU tensors, opencl where it wins)
X1, W1 = (2, 4, 9), (6, 4, 3)
X4, W4 = (2, 4, 8, 8), (6, 4, 3, 3)
X5, W5 = (2, 4, 5, 5, 5), (6, 4, 3, 3, 3)
NAN, INF = float("nan"), float("inf")


def at(t, index, value=NAN):
    """``t`` with ``value`` at ``index``."""
    t = t.clone()
    t[index] = value
    return t


def c(*shape, dtype=c64):
    return torch.randn(*shape, dtype=dtype)


CASES = {
    # wrong ranks
    "rank-conv3d-4d-input": lambda: fn("conv3d", r(*X4), r(*W5)),
    "rank-conv1d-2d-weight": lambda: fn("conv1d", r(*X1), r(6, 4)),
    "rank-conv_transpose1d-4d-input": lambda: fn("conv_transpose1d", r(*X4), r(4, 6, 3)),
    "rank-aten-1d-input": lambda: conv(r(8), r(*W1)),
    "rank-aten-weight-above-input": lambda: conv(r(*X1), r(*W4)),
    "rank-backward-input-below-weight": lambda: bwd(r(2, 6, 7), r(*X4), r(*W1)),
    "rank-backward-grad-output-5d": lambda: bwd(r(2, 6, 6, 6, 1), r(*X4), r(*W4)),
    # zero and negative strides
    "stride-zero-conv1d": lambda: fn("conv1d", r(*X1), r(*W1), stride=0),
    "stride-negative-conv_transpose2d": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), stride=(2, -1)),
    "stride-zero-aten-transposed": lambda: conv(r(*X4), r(4, 6, 3, 3), s=(0, 1), t=True),
    "stride-negative-backward": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), s=(1, -1)),
    "stride-zero-backward": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), s=0),
    # negative padding
    "padding-negative-conv1d": lambda: fn("conv1d", r(*X1), r(*W1), padding=-1),
    "padding-negative-conv3d": lambda: fn("conv3d", r(*X5), r(*W5), padding=(0, 0, -1)),
    "padding-negative-conv_transpose1d": lambda: fn("conv_transpose1d", r(*X1), r(4, 6, 3), padding=-1),
    "padding-negative-aten-float64": lambda: conv(r(*X4, dtype=f64), r(*W4, dtype=f64), p=-1),
    # zero and negative dilation
    "dilation-zero-conv_transpose2d-float32": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), dilation=0),
    "dilation-zero-conv3d": lambda: fn("conv3d", r(*X5), r(*W5), dilation=(1, 0, 1)),
    "dilation-zero-backward-float32": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), d=0),
    "dilation-zero-backward-float64": lambda: bwd(r(2, 6, 6, 6, dtype=f64), r(*X4, dtype=f64), r(*W4, dtype=f64),
                                                 d=0),
    "dilation-negative-backward": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), d=-1),
    # groups that do not divide the channels
    "groups-in-channels": lambda: fn("conv2d", r(2, 5, 8, 8), r(6, 2, 3, 3), groups=2),
    "groups-out-channels-conv1d": lambda: fn("conv1d", r(*X1), r(5, 2, 3), groups=2),
    "groups-conv_transpose2d-in-channels": lambda: fn("conv_transpose2d", r(2, 5, 8, 8), r(5, 3, 3, 3), groups=2),
    "groups-negative-conv1d": lambda: fn("conv1d", r(*X1), r(*W1), groups=-1),
    "groups-backward": lambda: bwd(r(2, 6, 6, 6), r(2, 5, 8, 8), r(6, 2, 3, 3), g=2),
    "groups-zero-backward-float64": lambda: bwd(r(2, 6, 6, 6, dtype=f64), r(*X4, dtype=f64), r(*W4, dtype=f64),
                                                g=0),
    # weight channels that are not the input's
    "channels-conv1d": lambda: fn("conv1d", r(*X1), r(6, 3, 3)),
    "channels-conv3d": lambda: fn("conv3d", r(*X5), r(6, 5, 3, 3, 3)),
    "channels-conv_transpose1d": lambda: fn("conv_transpose1d", r(*X1), r(3, 6, 3)),
    "channels-backward-float64": lambda: bwd(r(2, 6, 6, 6, dtype=f64), r(*X4, dtype=f64), r(6, 5, 3, 3, dtype=f64)),
    # dtypes: input against weight, bias, grad_output; integer and bool tensors
    "dtype-float64-input-float32-weight-conv1d": lambda: fn("conv1d", r(*X1, dtype=f64), r(*W1)),
    "dtype-float32-input-float64-weight-conv3d": lambda: fn("conv3d", r(*X5), r(*W5, dtype=f64)),
    "dtype-float16-input-float32-weight": lambda: fn("conv2d", r(*X4, dtype=f16), r(*W4)),
    "dtype-bias-float64-conv_transpose2d": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), r(6, dtype=f64)),
    "dtype-bias-float16-aten-float64": lambda: conv(r(*X4, dtype=f64), r(*W4, dtype=f64), r(6, dtype=f16), p=1),
    "dtype-bias-float32-conv_transpose2d-float64": lambda: fn("conv_transpose2d", r(*X4, dtype=f64),
                                                              r(4, 6, 3, 3, dtype=f64), r(6), stride=2),
    "dtype-bias-float16-same-float64": lambda: fn("conv2d", r(*X4, dtype=f64), r(*W4, dtype=f64), r(6, dtype=f16),
                                                  padding="same"),
    "dtype-bias-float32-conv_transpose3d-float64": lambda: fn("conv_transpose3d", r(*X5, dtype=f64),
                                                              r(4, 6, 3, 3, 3, dtype=f64), r(6)),
    "dtype-bias-float64-small-float32-problem": lambda: conv(r(1, 4, 6, 6), r(*W4), r(6, dtype=f64)),
    "dtype-int32": lambda: fn("conv2d", r(*X4, dtype=torch.int32), r(*W4, dtype=torch.int32)),
    "dtype-int64-aten": lambda: conv(r(*X4, dtype=torch.int64), r(*W4, dtype=torch.int64)),
    "dtype-bool": lambda: fn("conv1d", r(*X1, dtype=torch.bool), r(*W1, dtype=torch.bool)),
    "dtype-backward-float64-weight": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4, dtype=f64)),
    "dtype-backward-float32-weight-float64-input": lambda: bwd(r(2, 6, 6, 6, dtype=f64), r(*X4, dtype=f64), r(*W4)),
    "dtype-complex-input-real-weight": lambda: fn("conv2d", c(*X4), r(*W4)),
    "dtype-real-input-complex-weight": lambda: fn("conv2d", r(*X4), c(*W4)),
    "dtype-complex-input-real-bias": lambda: fn("conv2d", c(*X4), c(*W4), r(6)),
    # bias of the wrong size
    "bias-size-conv1d": lambda: fn("conv1d", r(*X1), r(*W1), r(7)),
    "bias-size-conv3d": lambda: fn("conv3d", r(*X5), r(*W5), r(3)),
    "bias-0d": lambda: fn("conv2d", r(*X4), r(*W4), torch.tensor(1.0)),
    "bias-size-conv_transpose1d-grouped": lambda: fn("conv_transpose1d", r(*X1), r(4, 3, 3), r(3), groups=2),
    "bias-sizes-backward": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), bs=[5]),
    # padding='same' with stride 2, and on a transposed convolution
    "same-stride-2-conv3d": lambda: fn("conv3d", r(*X5), r(*W5), padding="same", stride=2),
    "same-stride-2-conv1d-float64": lambda: fn("conv1d", r(*X1, dtype=f64), r(*W1, dtype=f64), padding="same",
                                               stride=(2,)),
    "same-conv_transpose2d": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), padding="same"),
    # output_padding >= stride
    "output-padding-stride-conv_transpose1d": lambda: fn("conv_transpose1d", r(*X1), r(4, 6, 3), stride=2,
                                                         output_padding=2),
    "output-padding-conv_transpose3d": lambda: fn("conv_transpose3d", r(*X5), r(4, 6, 3, 3, 3), stride=(1, 2, 1),
                                                  output_padding=(1, 1, 0)),
    "output-padding-aten-float64": lambda: conv(r(*X4, dtype=f64), r(4, 6, 3, 3, dtype=f64), s=2, t=True, op=3),
    "output-padding-backward": lambda: bwd(r(2, 6, 19, 19), r(*X4), r(4, 6, 3, 3), s=2, t=True, op=2),
    # kernels larger than the padded input
    "kernel-large-padded": lambda: fn("conv2d", r(*X4), r(6, 4, 11, 3), padding=1),
    "kernel-large-conv3d": lambda: fn("conv3d", r(*X5), r(6, 4, 3, 3, 6)),
    "kernel-large-dilated-conv1d": lambda: fn("conv1d", r(*X1), r(*W1), dilation=5),
    "kernel-large-backward": lambda: bwd(r(2, 6, 1, 1), r(*X4), r(6, 4, 9, 9)),
    # empty batch
    "batch-0-conv1d": lambda: fn("conv1d", r(0, 4, 9), r(*W1), r(6), padding=1),
    "batch-0-conv_transpose3d": lambda: fn("conv_transpose3d", r(0, 4, 3, 3, 3), r(4, 2, 3, 3, 3), stride=2),
    "batch-0-backward": lambda: bwd(r(0, 6, 6, 6), r(0, 4, 8, 8), r(*W4), bs=[6]),
    "batch-0-backward-mask": lambda: bwd(r(0, 6, 6, 6), r(0, 4, 8, 8), r(*W4), bs=[6], mask=(False, True, True)),
    # zero channels
    "channels-0-in": lambda: fn("conv2d", r(2, 0, 8, 8), r(6, 0, 3, 3), r(6)),
    "channels-0-out": lambda: fn("conv2d", r(*X4), r(0, 4, 3, 3)),
    "channels-0-out-bias": lambda: fn("conv1d", r(*X1), r(0, 4, 3), r(0)),
    "channels-0-out-conv_transpose2d-float32": lambda: fn("conv_transpose2d", r(*X4), r(4, 0, 3, 3)),
    "channels-0-backward": lambda: bwd(r(2, 6, 6, 6), r(2, 0, 8, 8), r(6, 0, 3, 3), bs=[6]),
    # devices: a CPU-only machine has one other, meta
    "device-weight-meta": lambda: fn("conv2d", r(*X4), r(*W4).to("meta")),
    "device-bias-meta": lambda: fn("conv2d", r(*X4), r(*W4), r(6).to("meta")),
    "device-input-meta": lambda: conv(r(*X4).to("meta"), r(*W4)),
    "device-all-meta": lambda: conv(r(*X4).to("meta"), r(*W4).to("meta")),
    "device-backward-grad-output-meta": lambda: bwd(r(2, 6, 6, 6).to("meta"), r(*X4), r(*W4), bs=[6]),
    # arguments that are not tensors, or not ints
    "arg-input-list": lambda: fn("conv1d", [[[1.0, 2.0, 3.0]]], r(1, 1, 2)),
    "arg-input-numpy": lambda: fn("conv1d", r(*X1).numpy(), r(*W1)),
    "arg-weight-none": lambda: fn("conv2d", r(*X4), None),
    "arg-bias-float": lambda: fn("conv2d", r(*X4), r(*W4), 1.0),
    "arg-stride-float": lambda: fn("conv2d", r(*X4), r(*W4), stride=1.5),
    "arg-stride-none": lambda: fn("conv2d", r(*X4), r(*W4), stride=None),
    "arg-padding-float": lambda: fn("conv1d", r(*X1), r(*W1), padding=1.0),
    "arg-padding-strings": lambda: fn("conv2d", r(*X4), r(*W4), padding=("same", "same")),
    "arg-groups-float": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), groups=1.0),
    "arg-groups-tensor": lambda: fn("conv2d", r(*X4), r(*W4), groups=torch.tensor(1)),
    "arg-aten-stride-int": lambda: ("convolution", (r(*X4), r(*W4), None, 1, [0, 0], [1, 1], False, [0, 0], 1)),
    "arg-backward-mask-ints": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), bs=[6], mask=(1, 0, 1)),
    "arg-backward-mask-none-set": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), mask=(False, False, False)),
    # NaN and infinities: valid inputs, compared as results
    "nan-input": lambda: fn("conv2d", at(r(*X4), (0, 1, 2, 3)), r(*W4), r(6), padding=1),
    "inf-input": lambda: fn("conv2d", at(r(*X4), (1, 0, 4, 4), INF), r(*W4), padding=1),
    "inf-and-minus-inf-input": lambda: fn("conv1d", at(at(r(*X1), (0, 0, 3), INF), (0, 1, 4), -INF), r(*W1).abs()),
    "nan-weight-unpadded": lambda: fn("conv2d", r(*X4), at(r(*W4), (2, 1, 1, 1))),
    "nan-weight-padded": lambda: fn("conv2d", r(*X4), at(r(*W4), (2, 1, 0, 0)), padding=1),
    "inf-weight-padded-float64": lambda: fn("conv2d", r(*X4, dtype=f64), at(r(*W4, dtype=f64), (0, 0, 0, 0), INF),
                                            padding=1),
    "nan-bias-conv3d": lambda: fn("conv3d", r(*X5), r(*W5), at(r(6), 3)),
    "inf-input-conv_transpose2d": lambda: fn("conv_transpose2d", at(r(*X4), (0, 2, 0, 7), INF),
                                             r(4, 6, 3, 3).abs(), stride=2),
    "nan-depthwise-3x3x3": lambda: fn("conv3d", at(r(2, 4, 8, 16, 32), (0, 3, 2, 2, 2)), r(4, 1, 3, 3, 3), padding=1,
                                      groups=4),  # the default plan's own kernel on the CPU (OWN_KERNEL_WINS_CPU)
    "nan-backward-grad-output": lambda: bwd(at(r(2, 6, 6, 6), (1, 5, 0, 0)), r(*X4), r(*W4), bs=[6]),
    "inf-backward-input": lambda: bwd(r(2, 6, 6, 6).abs(), at(r(*X4), (0, 0, 7, 7), INF), r(*W4)),
    "overflowing-products": lambda: fn("conv2d", r(*X4) * 1e30, r(*W4) * 1e30),
    # unbatched inputs
    "unbatched-conv1d": lambda: fn("conv1d", r(4, 9), r(*W1), r(6), padding=1),
    "unbatched-conv3d-grouped": lambda: fn("conv3d", r(4, 5, 5, 5), r(6, 2, 3, 3, 3), groups=2),
    "unbatched-conv_transpose2d": lambda: fn("conv_transpose2d", r(4, 5, 5), r(4, 3, 3, 3), stride=2,
                                             output_padding=1),
    "unbatched-aten": lambda: conv(r(4, 8, 8), r(*W4)),
    "unbatched-channels": lambda: fn("conv2d", r(3, 8, 8), r(*W4)),
    # views with the negative bit, conjugate views
    "neg-view-input": lambda: fn("conv2d", torch._neg_view(r(*X4)), r(*W4), padding=1),
    "neg-view-weight-and-bias": lambda: fn("conv1d", r(*X1), torch._neg_view(r(*W1)), torch._neg_view(r(6))),
    "neg-view-backward": lambda: bwd(torch._neg_view(r(2, 6, 6, 6)), r(*X4), torch._neg_view(r(*W4)), bs=[6]),
    "neg-view-conj-imag": lambda: fn("conv2d", c(*X4).conj().imag, r(*W4)),
    "conj-input": lambda: fn("conv2d", c(*X4).conj(), c(*W4)),
    "conj-weight-and-bias": lambda: fn("conv1d", c(*X1), c(*W1).conj(), c(6).conj()),
    # complex tensors
    "complex64-conv2d": lambda: fn("conv2d", c(*X4), c(*W4), padding=1),
    "complex128-conv_transpose1d": lambda: fn("conv_transpose1d", c(*X1, dtype=c128), c(4, 6, 3, dtype=c128),
                                              c(6, dtype=c128), stride=2),
    "complex-aten": lambda: conv(c(*X4), c(*W4)),
    "complex-backward": lambda: bwd(c(2, 6, 6, 6), c(*X4), c(*W4)),
    # layouts and low precision: edge inputs that compute
    "layout-channels-last": lambda: fn("conv2d", r(*X4).to(memory_format=torch.channels_last), r(*W4), r(6),
                                       padding=1),
    "layout-stride-0": lambda: fn("conv2d", r(1, 4, 1, 8).expand(*X4), r(*W4)),
    "layout-storage-offset": lambda: fn("conv1d", r(2 * 4 * 9 + 5)[5:].view(*X1), r(*W1), stride=2),
    "layout-transposed-weight-view": lambda: fn("conv_transpose2d", r(*X4), r(6, 4, 3, 3).transpose(0, 1)),
    "bfloat16-conv2d": lambda: fn("conv2d", r(*X4, dtype=bf16), r(*W4, dtype=bf16), padding=1),
    "float16-conv1d": lambda: fn("conv1d", r(*X1, dtype=f16), r(*W1, dtype=f16)),
}


def _through_float64(name, args, kw):
    """The call on float64 copies of its float32 tensors, its result back in float32."""
    return TORCH_FN[name](*(a.double() if isinstance(a, torch.Tensor) and a.dtype == f32 else a for a in args),
                          **kw).float()


@dataclasses.dataclass(frozen=True)
class Differs:
    """A documented difference: ``why``, and what portconv does on ``routes``: raise ``raises`` with a first line
    matching ``match``, or (``raises`` None) return what ``reference(name, args, kwargs)`` returns."""

    why: str
    raises: type[BaseException] | None = None
    match: str = ""
    reference: Callable | None = None
    routes: tuple = ROUTES


ONEDNN_INTERNAL = ("PyTorch fails inside oneDNN with an internal text (no argument check precedes it); portconv "
                   "raises the text of ATen's slow kernel for the same argument (Note [Which ATen kernel's text], "
                   "validate.py)")
ARGUMENT_PARSER = ("PyTorch's C++ argument parser puts the function's name first (and, for conv1d/2d/3d with two "
                   "overloads, lists every signature); portconv's functions are Python and name the argument")
FORCED = ("a forced backend that cannot run a problem raises BackendUnavailable with its reason (README, Backends); "
          "the OpenCL kernels take floating-point tensors")
META = ("PyTorch sends a call with any meta operand to its Meta kernels (shapes, no device check); portconv "
        "computes values and checks devices as ATen's CPU kernels do")
FORCED_OPENCL = r"backend 'opencl' was requested but cannot run this problem: "
DIFFERS = {
    "dilation-zero-conv_transpose2d-float32": Differs(ONEDNN_INTERNAL, ConvError, r"dilation should be greater "),
    "channels-0-out-conv_transpose2d-float32": Differs(ONEDNN_INTERNAL, ConvError, r"non-empty 2D or 4D weight "),
    "dtype-backward-float64-weight": Differs(ONEDNN_INTERNAL, ConvError, r"Input type \(torch.FloatTensor\) and "
                                             r"weight type \(torch.DoubleTensor\) should be the same or input"),
    "dilation-zero-backward-float32": Differs(
        "PyTorch's oneDNN backward takes dilation 0 without a check and returns numbers for a convolution its "
        "forward refuses; portconv refuses the backward with the forward's text", ConvError,
        r"non-positive dilation is not supported$"),
    "nan-weight-padded": Differs(
        "PyTorch's CPU kernels disagree where a non-finite weight meets padding: oneDNN (float32) skips padded taps, "
        "the slow kernels (float64) multiply the zeros (0 x NaN = NaN); portconv's implicit GEMM multiplies them, "
        "as PyTorch does in float64", reference=_through_float64, routes=("opencl",)),
    "arg-aten-stride-int": Differs(
        "portconv.convolution spreads an int over the spatial dims as its conv*d do; aten::convolution's schema "
        "takes only lists", reference=lambda name, args, kw: A.convolution(args[0], args[1], args[2], [1, 1],
                                                                            *args[4:])),
    "complex-aten": Differs(
        "portconv.convolution takes complex tensors as portconv.conv*d do (Note [complex convolution]); "
        "aten::convolution has no complex CPU kernel", reference=lambda name, args, kw: F.conv2d(args[0], args[1])),
    "dtype-int32": Differs(FORCED, BackendUnavailable, FORCED_OPENCL + r"the OpenCL kernels take float32, float64, "
                           r"float16 and bfloat16 tensors, not int32$", routes=("opencl",)),
    "dtype-int64-aten": Differs(FORCED, BackendUnavailable, FORCED_OPENCL + ".*not int64$", routes=("opencl",)),
    "dtype-bool": Differs(FORCED + "; PyTorch has no bool kernel (NotImplementedError)", BackendUnavailable,
                          FORCED_OPENCL + ".*not bool$", routes=("opencl",)),
    "complex-backward": Differs(FORCED + "; aten::convolution_backward has no complex CPU kernel either "
                                "(NotImplementedError)", BackendUnavailable, FORCED_OPENCL + ".*not complex64$",
                                routes=("opencl",)),
    "device-weight-meta": Differs(META, ConvError, r"Input type \(torch.FloatTensor\) and weight type "
                                  r"\(MetaFloatType\) should be the same or input should be a MKLDNN tensor"),
    "device-bias-meta": Differs(META, ConvError, r"Input type \(torch.FloatTensor\) and bias type \(MetaFloatType\)"),
    "device-input-meta": Differs(META, ConvError, r"Input type \(MetaFloatType\) and weight type "
                                 r"\(torch.FloatTensor\) should be the same$"),
    "device-backward-grad-output-meta": Differs(META, ConvError, r"Expected all tensors to be on the same device, "
                                                r"but got input is on cpu, different from other tensors on meta"),
    "device-all-meta": Differs(META + "; no portconv backend runs on meta tensors", BackendUnavailable,
                               r"no portconv backend can run this problem|" + FORCED_OPENCL
                               + r"the OpenCL backend takes CPU tensors or pyopencl arrays"),
    **{case: Differs(ARGUMENT_PARSER, TypeError, match) for case, match in {
        "arg-input-list": r"portconv takes torch tensors, pyopencl arrays or cupy arrays, not list$",
        "arg-input-numpy": r"portconv takes torch tensors, pyopencl arrays or cupy arrays, not ndarray$",
        "arg-weight-none": r"portconv takes torch tensors, pyopencl arrays or cupy arrays, not NoneType$",
        "arg-bias-float": r"portconv takes torch tensors, pyopencl arrays or cupy arrays, not float$",
        "arg-stride-float": r"argument 'stride' must be tuple of ints, not float$",
        "arg-stride-none": r"argument 'stride' must be tuple of ints, not NoneType$",
        "arg-padding-float": r"argument 'padding' must be tuple of ints, not float$",
        "arg-padding-strings": r"argument 'padding' must be tuple of ints, not tuple$",
        "arg-groups-float": r"argument 'groups' must be int, not float$",
        "same-conv_transpose2d": r"argument 'padding' must be tuple of ints, not str$",
    }.items()},
}
TOLERANCE = {f64: 1e-10, c128: 1e-10, f32: 1e-4, c64: 1e-4, f16: 1e-2, bf16: 2e-2}  # rtol = atol; exact otherwise


def _tensors(args, kw) -> list[torch.Tensor]:
    return [a for a in (*args, *kw.values()) if isinstance(a, torch.Tensor)]


def _state(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.storage_offset(), t._version, t.is_conj(), t.is_neg()


def _snapshot(tensors):
    return [(_state(t), None if t.is_meta else t.clone()) for t in tensors]


def _assert_unchanged(tensors, before, who: str) -> None:
    for i, (t, (state, copy)) in enumerate(zip(tensors, before)):
        assert _state(t) == state, f"{who} changed operand {i}: {state} -> {_state(t)}"
        if copy is not None:
            torch.testing.assert_close(t, copy, rtol=0, atol=0, equal_nan=True, msg=f"{who} wrote into operand {i}")


def _outcome(call, *args, **kw):
    """(what ``call(*args, **kw)`` returns, None) or (None, what it raises)."""
    try:
        return call(*args, **kw), None
    except Exception as e:  # noqa: BLE001 - the outcome is what the test compares
        return None, e


def _assert_same_results(name, args, got, want) -> None:
    """Results as PyTorch's: the same None pattern, shapes, dtypes, devices, strides; values within the dtype's
    tolerance in float64 (complex128), NaN and infinities in the same places."""
    got, want = (got, want) if name == "convolution_backward" else ((got,), (want,))
    if name == "convolution_backward":  # oneDNN returns grad_weight with grad_bias whatever the mask says (ATen's
        mask = [bool(m) for m in args[-1]]  # runner in backends/aten.py honours it): masked-out results are None
        assert all(g is None for g, m in zip(got, mask) if not m), got
        got, want = [g for g, m in zip(got, mask) if m], [w for w, m in zip(want, mask) if m]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is None:
            continue
        assert (g.shape, g.dtype, g.device) == (w.shape, w.dtype, w.device)
        if g.numel() > 1:
            assert g.stride() == w.stride(), (g.stride(), w.stride())
        wide = c128 if w.is_complex() else f64
        tol = TOLERANCE.get(w.dtype, 0.0)
        torch.testing.assert_close(g.to(wide), w.to(wide), rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("route", ROUTES, ids=("opencl", "default"))
@pytest.mark.parametrize("case", list(CASES))
def test_portconv_does_what_pytorch_does(case, route, opencl_env):
    torch.manual_seed(0)
    name, args, kw = (CASES[case]() + ({},))[:3]
    tensors = _tensors(args, kw)
    before = _snapshot(tensors)
    want, theirs = _outcome(TORCH_FN[name], *args, **kw)
    _assert_unchanged(tensors, before, "PyTorch")
    got, ours = _outcome(getattr(portconv, name), *args, **kw, backend=route)
    _assert_unchanged(tensors, before, "portconv")
    differs = DIFFERS.get(case)
    if differs is not None and route in differs.routes:
        if differs.raises is not None:
            assert isinstance(ours, differs.raises) and re.match(differs.match, _first_line(ours)), \
                f"{ours!r}; documented: {differs.why}"
        else:
            assert ours is None, f"{ours!r}; documented: {differs.why}"
            _assert_same_results(name, args, got, differs.reference(name, args, kw))
        return
    if theirs is not None:
        assert ours is not None, f"PyTorch raises {theirs!r}; portconv returns"
        assert isinstance(ours, type(theirs)), (ours, theirs)
        assert _first_line(ours) == _first_line(theirs)
        return
    assert ours is None, f"PyTorch returns; portconv raises {ours!r}"
    _assert_same_results(name, args, got, want)


def test_every_difference_is_a_case_and_still_differs_from_pytorch():
    """DIFFERS names only rows of CASES, and each entry still describes a difference: PyTorch does not raise what
    portconv raises instead, and does not return what portconv returns instead (else the entry is stale)."""
    assert set(DIFFERS) <= set(CASES), set(DIFFERS) - set(CASES)
    for case, differs in DIFFERS.items():
        torch.manual_seed(0)
        name, args, kw = (CASES[case]() + ({},))[:3]
        want, theirs = _outcome(TORCH_FN[name], *args, **kw)
        if differs.raises is not None:
            assert theirs is None or not re.match(differs.match, _first_line(theirs)), (case, theirs)
        elif theirs is None:
            with pytest.raises(AssertionError):
                _assert_same_results(name, args, want, differs.reference(name, args, kw))


@pytest.mark.parametrize("route", ROUTES, ids=("opencl", "default"))
@pytest.mark.parametrize("case", ["dtype-bias-float16-aten-float64", "dtype-bias-float32-conv_transpose2d-float64",
                                  "dtype-bias-float64-small-float32-problem"])
def test_bias_of_another_dtype_gets_pytorchs_gradients(case, route, opencl_env):
    """Note [slow kernels' bias dtype]: where ATen takes a bias whose dtype is not the input's, portconv computes the
    same gradients, each in its operand's dtype."""
    torch.manual_seed(0)
    name, args, kw = (CASES[case]() + ({},))[:3]
    leaves = [a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    grads = []
    for call in (TORCH_FN[name], lambda *a, **k: getattr(portconv, name)(*a, **k, backend=route)):
        out = call(*leaves, **kw)
        grads.append(torch.autograd.grad(out, leaves[:3], torch.ones_like(out)))
    theirs, ours = grads
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.double(), want.double(), rtol=TOLERANCE[want.dtype], atol=TOLERANCE[want.dtype])
