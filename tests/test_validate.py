"""Every validation message against PyTorch's own exception on the same input, and ATen's empty-input results."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import portconv
from portconv import backends, functional, validate
from portconv.params import ConvParams
from portconv.rules.context import CpuFacts
from portconv.tensors import spec_of

A = torch.ops.aten
f64, f32 = torch.float64, torch.float32
TORCH_FN = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d, "conv_transpose1d": F.conv_transpose1d,
            "conv_transpose2d": F.conv_transpose2d, "conv_transpose3d": F.conv_transpose3d,
            "convolution": A.convolution, "convolution_backward": A.convolution_backward}


def r(*shape, dtype=f32):
    return torch.randn(*shape, dtype=dtype) if dtype.is_floating_point else torch.ones(*shape, dtype=dtype)


def _spread(w, *values):
    n = w.dim() - 2
    return [[v] * n if isinstance(v, int) else list(v) for v in values]


def conv(x, w, b=None, s=1, p=0, d=1, t=False, op=0, g=1):
    """aten::convolution arguments with ints spread to the weight's spatial rank."""
    s, p, d, op = _spread(w, s, p, d, op)
    return "convolution", (x, w, b, s, p, d, t, op, g)


def bwd(go, x, w, bs=None, s=1, p=0, d=1, t=False, op=0, g=1, mask=(True, True, True)):
    s, p, d, op = _spread(w, s, p, d, op)
    return "convolution_backward", (go, x, w, bs, s, p, d, t, op, g, list(mask))


def fn(name, *args, **kw):
    return name, args, kw


X4, W4 = (2, 4, 8, 8), (6, 4, 3, 3)
# id -> builder of (function name, args[, kwargs]); each one is a bad input that PyTorch rejects
CASES = {
    # batchify
    "batchify-2d-to-conv2d": lambda: fn("conv2d", r(8, 8), r(*W4)),
    "batchify-5d-to-conv2d": lambda: fn("conv2d", r(1, *X4), r(*W4)),
    "batchify-conv1d": lambda: fn("conv1d", r(4), r(6, 4, 3)),
    "batchify-conv_transpose3d": lambda: fn("conv_transpose3d", r(2, 4, 3, 3), r(4, 2, 3, 3, 3)),
    "batchify-same": lambda: fn("conv2d", r(8, 8), r(*W4), padding="same"),
    "batchify-before-padding-string": lambda: fn("conv2d", r(6, 6), r(*W4), padding="foo"),
    # conv1d/2d/3d's own bias dtype check
    "functional-bias-dtype": lambda: fn("conv2d", r(*X4), r(*W4), r(6, dtype=f64)),
    "functional-bias-dtype-half": lambda: fn("conv1d", r(2, 4, 8), r(6, 4, 3), r(6, dtype=torch.float16)),
    "functional-bias-dtype-int": lambda: fn("conv3d", r(2, 4, 5, 5, 5), r(6, 4, 3, 3, 3), r(6, dtype=torch.int64)),
    "functional-bias-dtype-before-batchify": lambda: fn("conv2d", r(8, 8), r(*W4), r(6, dtype=f64)),
    # expand_param_if_needed
    "expand-stride": lambda: fn("conv2d", r(*X4), r(*W4), stride=(1, 1, 1)),
    "expand-padding": lambda: fn("conv2d", r(*X4), r(*W4), padding=(1, 1, 1)),
    "expand-dilation": lambda: fn("conv3d", r(2, 4, 6, 6, 6), r(6, 4, 3, 3, 3), dilation=(1, 2)),
    "expand-output-padding": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), output_padding=(1, 1, 1)),
    "expand-empty-stride": lambda: fn("conv2d", r(*X4), r(*W4), stride=()),
    "expand-int-spreads-to-call-rank": lambda: fn("conv2d", r(*X4), r(6, 4, 3)),
    "expand-padding-before-dilation": lambda: fn("conv2d", r(*X4), r(*W4), padding=(1, 1, 1), dilation=(1, 1, 1)),
    "expand-aten-stride": lambda: conv(r(*X4), r(*W4), s=(1, 1, 1)),
    "expand-backward-padding": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), p=(0, 0, 0)),
    # padding strings and padding='same' (convolution_same)
    "padding-invalid-string": lambda: fn("conv2d", r(*X4), r(*W4), padding="full"),
    "padding-invalid-string-before-weight-rank": lambda: fn("conv2d", r(*X4), r(6, 4), padding="foo"),
    "same-strided": lambda: fn("conv2d", r(*X4), r(*W4), padding="same", stride=2),
    "same-strided-tuple": lambda: fn("conv1d", r(2, 4, 8), r(6, 4, 3), padding="same", stride=(2,)),
    "same-stride-broadcast": lambda: fn("conv2d", r(*X4), r(*W4), padding="same", stride=(1, 1, 1)),
    "same-dilation-broadcast": lambda: fn("conv2d", r(*X4), r(*W4), padding="same", dilation=(1, 1, 1)),
    "same-weight-rank": lambda: fn("conv2d", r(*X4), r(6, 4, 3), padding="same"),
    "same-groups": lambda: fn("conv2d", r(*X4), r(*W4), padding="same", groups=0),
    "same-weight-2d": lambda: fn("conv2d", r(*X4), r(6, 4), padding="same"),
    "same-negative-dilation": lambda: fn("conv2d", r(*X4), r(*W4), padding="same", dilation=-1),
    "same-asymmetric-zero-size-input": lambda: fn("conv2d", r(2, 4, 0, 8), r(6, 4, 4, 3), padding="same"),
    "same-asymmetric-channels": lambda: fn("conv2d", r(*X4), r(6, 3, 4, 4), padding="same"),
    "same-bias-dtype-mkldnn": lambda: fn("conv2d", r(*X4), r(*W4), r(6, dtype=f64), padding="same"),
    "valid-stride-zero": lambda: fn("conv2d", r(*X4), r(*W4), padding="valid", stride=0),
    # _convolution before check_shape_forward
    "weight-2d": lambda: conv(r(*X4), r(6, 4), s=[1], p=[0], d=[1], op=[0]),
    "weight-2d-functional": lambda: fn("conv2d", r(*X4), r(6, 4)),
    "groups-zero": lambda: fn("conv2d", r(*X4), r(*W4), groups=0),
    "groups-negative-before-expand": lambda: fn("conv2d", r(*X4), r(*W4), stride=(1, 1, 1), groups=-1),
    # check_shape_forward
    "negative-padding": lambda: fn("conv2d", r(*X4), r(*W4), padding=-1),
    "negative-padding-transposed": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), padding=(0, -2)),
    "negative-output-padding": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), output_padding=-1),
    "stride-zero": lambda: fn("conv2d", r(*X4), r(*W4), stride=0),
    "stride-negative": lambda: fn("conv3d", r(2, 4, 6, 6, 6), r(6, 4, 3, 3, 3), stride=(1, -1, 1)),
    "dilation-negative": lambda: fn("conv2d", r(*X4), r(*W4), dilation=-1),
    "dilation-negative-transposed": lambda: fn("conv_transpose1d", r(2, 4, 8), r(4, 6, 3), dilation=-2),
    "weight-rank": lambda: conv(r(*X4), r(6, 4, 3)),
    "weight-rank-functional": lambda: fn("conv2d", r(*X4), r(6, 4, 3), stride=(1,), padding=(0,), dilation=(1,)),
    "groups-above-out-channels": lambda: fn("conv2d", r(2, 8, 8, 8), r(6, 1, 3, 3), groups=8),
    "groups-not-dividing-out-channels": lambda: fn("conv2d", r(2, 8, 8, 8), r(6, 2, 3, 3), groups=4),
    "channels": lambda: fn("conv2d", r(*X4), r(6, 3, 3, 3)),
    "channels-grouped": lambda: fn("conv2d", r(*X4), r(6, 1, 3, 3), groups=2),
    "channels-transposed": lambda: fn("conv_transpose2d", r(*X4), r(5, 3, 3, 3)),
    "bias-size": lambda: fn("conv2d", r(*X4), r(*W4), r(5)),
    "bias-2d": lambda: conv(r(*X4), r(*W4), r(6, 1)),
    "bias-size-transposed": lambda: fn("conv_transpose2d", r(*X4), r(4, 3, 3, 3), r(5), groups=2),
    "padding-limit": lambda: fn("conv2d", r(*X4), r(*W4), padding=2**62),
    "padding-limit-transposed": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), padding=(0, 2**62)),
    "kernel-larger-than-input": lambda: fn("conv2d", r(*X4), r(6, 4, 10, 3)),
    "kernel-larger-than-input-dilated": lambda: fn("conv2d", r(*X4), r(*W4), dilation=4, padding=(0, 1)),
    "kernel-larger-than-input-1d": lambda: fn("conv1d", r(2, 4, 2), r(6, 4, 3)),
    "zero-size-spatial-unpadded": lambda: fn("conv2d", r(2, 4, 0, 8), r(*W4)),
    # _select_conv_backend: other empty inputs
    "zero-size-spatial": lambda: fn("conv2d", r(2, 4, 6, 0), r(*W4), padding=2),
    "zero-size-spatial-1d": lambda: fn("conv1d", r(2, 4, 0), r(6, 4, 3), padding=2),
    "zero-size-spatial-transposed": lambda: fn("conv_transpose2d", r(2, 4, 6, 0), r(4, 6, 3, 3)),
    # check_input_same_type_as_parameters, oneDNN flavour (float32 CPU)
    "dtype-weight-mkldnn": lambda: fn("conv2d", r(*X4), r(*W4, dtype=f64)),
    "dtype-weight-mkldnn-bfloat16": lambda: conv(r(*X4), r(*W4, dtype=torch.bfloat16)),
    "dtype-weight-mkldnn-transposed": lambda: fn("conv_transpose3d", r(2, 4, 3, 3, 3), r(4, 2, 3, 3, 3, dtype=f64)),
    "dtype-bias-mkldnn": lambda: conv(r(*X4), r(*W4), r(6, dtype=f64)),
    # ... and the slow kernels' dtype check
    "dtype-weight-double-input": lambda: fn("conv2d", r(*X4, dtype=f64), r(*W4)),
    "dtype-weight-small-float-problem": lambda: conv(r(1, 4, 6, 6), r(4, 4, 3, 3, dtype=f64)),
    "dtype-weight-int-input": lambda: fn("conv3d", r(2, 4, 5, 5, 5, dtype=torch.int64), r(6, 4, 3, 3, 3)),
    "dtype-weight-transposed-double": lambda: fn("conv_transpose2d", r(*X4, dtype=f64), r(4, 6, 3, 3)),
    # zero dilation: oneDNN's argument check, the slow kernels' shape checks
    "dilation-zero-mkldnn": lambda: fn("conv2d", r(*X4), r(*W4), dilation=0),
    "dilation-zero-mkldnn-1d": lambda: fn("conv1d", r(2, 4, 8), r(6, 4, 3), dilation=(0,)),
    "dilation-zero-mkldnn-after-dtype": lambda: conv(r(*X4), r(*W4, dtype=f64), d=0),
    "dilation-zero-slow": lambda: fn("conv2d", r(*X4, dtype=f64), r(*W4, dtype=f64), dilation=(1, 0)),
    "dilation-zero-slow-1d": lambda: fn("conv1d", r(2, 4, 8, dtype=f64), r(6, 4, 3, dtype=f64), dilation=0),
    "dilation-zero-slow-3d": lambda: fn("conv3d", r(2, 4, 5, 5, 5, dtype=f64), r(6, 4, 3, 3, 3, dtype=f64),
                                        dilation=0),
    "dilation-zero-slow-before-dtype": lambda: conv(r(*X4, dtype=f64), r(*W4), d=0),
    "dilation-zero-transposed": lambda: fn("conv_transpose2d", r(*X4, dtype=f64), r(4, 6, 3, 3, dtype=f64),
                                           dilation=(1, 0)),
    "dilation-zero-transposed-3d": lambda: fn("conv_transpose3d", r(2, 4, 3, 3, 3, dtype=f64),
                                              r(4, 2, 3, 3, 3, dtype=f64), dilation=0),
    # the transposed kernels' output_padding rule and output size
    "output-padding-big": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), output_padding=1),
    "output-padding-big-strided": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), stride=2, output_padding=2),
    "output-padding-big-1d": lambda: fn("conv_transpose1d", r(2, 4, 6), r(4, 4, 3), stride=2, output_padding=2),
    "output-padding-big-3d": lambda: fn("conv_transpose3d", r(2, 4, 3, 3, 3), r(4, 2, 3, 3, 3),
                                        output_padding=(0, 0, 1)),
    "transposed-output-too-small": lambda: fn("conv_transpose2d", r(2, 4, 1, 1, dtype=f64),
                                              r(4, 4, 1, 1, dtype=f64), padding=1),
    "transposed-output-too-small-1d": lambda: fn("conv_transpose1d", r(2, 4, 1, dtype=f64),
                                                 r(4, 4, 1, dtype=f64), padding=1),
    "transposed-output-too-small-3d": lambda: fn("conv_transpose3d", r(2, 4, 8, 8, 1, dtype=f64),
                                                 r(4, 4, 1, 1, 1, dtype=f64), padding=1),
    # zero-size kernels
    "kernel-zero": lambda: fn("conv2d", r(*X4, dtype=f64), r(6, 4, 3, 0, dtype=f64)),
    "kernel-zero-dilated": lambda: fn("conv2d", r(*X4, dtype=f64), r(6, 4, 3, 0, dtype=f64), dilation=2),
    "kernel-zero-3d": lambda: fn("conv3d", r(2, 4, 5, 5, 5, dtype=f64), r(6, 4, 3, 3, 0, dtype=f64)),
    "kernel-zero-transposed": lambda: fn("conv_transpose2d", r(*X4, dtype=f64), r(4, 6, 3, 0, dtype=f64)),
    "weight-empty-transposed": lambda: fn("conv_transpose2d", r(*X4, dtype=f64), r(4, 0, 3, 3, dtype=f64)),
    "weight-empty-transposed-3d": lambda: fn("conv_transpose3d", r(2, 4, 3, 3, 3, dtype=f64),
                                             r(4, 0, 3, 3, 3, dtype=f64)),
    # Empty backend (N == 0): the same ops as ATen, so the same IndexError
    "empty-batch-weight-without-elements": lambda: fn("conv_transpose2d", r(0, 4, 6, 6), r(4, 0, 3, 3)),
    # convolution_backward
    "backward-weight-2d": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(6, 4), s=[1], p=[0], d=[1], op=[0]),
    "backward-groups-zero": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), g=0),
    "backward-negative-padding": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), p=(0, -1)),
    "backward-channels": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(6, 3, 3, 3)),
    "backward-grad-output-rank": lambda: bwd(r(2, 6, 6), r(*X4), r(*W4)),
    "backward-output-padding": lambda: bwd(r(2, 6, 3, 3), r(*X4), r(*W4), s=2, op=1),
    "backward-output-padding-1d": lambda: bwd(r(2, 6, 6), r(2, 4, 8), r(6, 4, 3), op=1),
    "backward-output-mask-length": lambda: bwd(r(2, 6, 6, 6), r(*X4), r(*W4), mask=(True, True)),
    "backward-grad-output-channels": lambda: bwd(r(2, 5, 6, 6, dtype=f64), r(*X4, dtype=f64), r(*W4, dtype=f64)),
    "backward-grad-output-spatial": lambda: bwd(r(2, 6, 6, 5, dtype=f64), r(*X4, dtype=f64), r(*W4, dtype=f64)),
    "backward-grad-output-spatial-1d": lambda: bwd(r(2, 6, 5, dtype=f64), r(2, 4, 8, dtype=f64),
                                                   r(6, 4, 3, dtype=f64)),
    "backward-grad-output-channels-grouped": lambda: bwd(r(2, 9, 6, 6, dtype=f64), r(*X4, dtype=f64),
                                                         r(6, 2, 3, 3, dtype=f64), g=2),
    "backward-grad-output-dilated-batch": lambda: bwd(r(3, 6, 4, 4, dtype=f64), r(*X4, dtype=f64),
                                                      r(*W4, dtype=f64), d=2),
    "backward-grad-output-dilated-channels": lambda: bwd(r(2, 4, 4, 4, dtype=f64), r(*X4, dtype=f64),
                                                         r(*W4, dtype=f64), d=2),
    "backward-grad-output-dilated-spatial": lambda: bwd(r(2, 6, 4, 5, dtype=f64), r(*X4, dtype=f64),
                                                        r(*W4, dtype=f64), d=2),
    "backward-grad-output-3d-grouped": lambda: bwd(r(2, 4, 3, 3, 3, dtype=f64), r(2, 4, 5, 5, 5, dtype=f64),
                                                   r(6, 2, 3, 3, 3, dtype=f64), g=2),
    "backward-grad-output-transposed": lambda: bwd(r(2, 6, 10, 9, dtype=f64), r(*X4, dtype=f64),
                                                   r(4, 6, 3, 3, dtype=f64), t=True),
    "backward-grad-output-dtype": lambda: bwd(r(2, 6, 6, 6), r(*X4, dtype=f64), r(*W4, dtype=f64)),
}


def _first_line(e: BaseException) -> str:
    return str(e).split("\n", 1)[0]  # debug builds of PyTorch append the C++ stack after the first line


@pytest.fixture
def no_backend(monkeypatch):
    """Fail loudly if anything tries to select or load a backend: validation must raise before that."""
    def boom(*a, **k):
        raise AssertionError("a backend was selected before validation finished")

    monkeypatch.setattr(functional, "select", boom)
    monkeypatch.setattr(backends, "get", boom)


def _snapshot(args):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return tensors, [(t.clone(), t.stride(), t._version) for t in tensors]


@pytest.mark.parametrize("case", list(CASES))
def test_message_matches_pytorch(case, no_backend):
    torch.manual_seed(0)
    _compare(*(CASES[case]() + ({},))[:3])


def _compare(name, args, kw):
    with pytest.raises(Exception) as theirs:
        TORCH_FN[name](*args, **kw)
    tensors, before = _snapshot(args)
    with pytest.raises(Exception) as ours:
        getattr(portconv, name)(*args, **kw, backend="aten")
    assert isinstance(ours.value, type(theirs.value)), (type(ours.value), type(theirs.value), str(ours.value))
    expected = _first_line(theirs.value)
    assert expected and str(ours.value) == expected
    for t, (copy, stride, version) in zip(tensors, before):
        assert t._version == version and t.stride() == stride and torch.equal(t, copy)


def _cuda(*shape, dtype=f32):
    return r(*shape, dtype=dtype).cuda()


CUDA_CASES = {  # cuDNN's and the CUDA kernels' texts (checked on an H100/H200 with torch 2.11 and cuDNN 9)
    "cuda-dtype-weight": lambda: conv(_cuda(*X4), _cuda(*W4, dtype=f64)),
    "cuda-dtype-bias-bfloat16": lambda: conv(_cuda(*X4), _cuda(*W4), _cuda(6, dtype=torch.bfloat16)),
    "cuda-dtype-input-int": lambda: conv(_cuda(*X4, dtype=torch.int64), _cuda(*W4)),
    "cuda-weight-on-cpu": lambda: conv(_cuda(*X4), r(*W4)),
    "cuda-weight-on-cpu-transposed": lambda: fn("conv_transpose2d", _cuda(*X4), r(4, 6, 3, 3)),
    "cuda-bias-on-cpu-functional": lambda: fn("conv2d", _cuda(*X4), _cuda(*W4), r(6)),
    "cpu-input-cuda-weight-mkldnn": lambda: conv(r(*X4), _cuda(*W4)),
    "cpu-input-cuda-weight-slow": lambda: conv(r(*X4, dtype=f64), _cuda(*W4)),
    "cuda-dilation-zero": lambda: fn("conv2d", _cuda(*X4), _cuda(*W4), dilation=(1, 0)),
    "cuda-dilation-zero-transposed": lambda: fn("conv_transpose1d", _cuda(2, 4, 8), _cuda(4, 6, 3), dilation=0),
    "cuda-depthwise-dtype": lambda: fn("conv2d", _cuda(*X4), _cuda(4, 1, 3, 3, dtype=f64), groups=4),
    "cuda-output-padding-big": lambda: fn("conv_transpose2d", _cuda(*X4), _cuda(4, 6, 3, 3), output_padding=1),
    "cuda-backward-grad-output-dtype": lambda: bwd(_cuda(2, 6, 6, 6, dtype=torch.float16), _cuda(*X4), _cuda(*W4)),
    "cuda-backward-grad-output-on-cpu": lambda: bwd(r(2, 6, 6, 6), _cuda(*X4), _cuda(*W4)),
}


@pytest.mark.vendor("cuda")
@pytest.mark.parametrize("case", list(CUDA_CASES))
def test_cuda_message_matches_pytorch(case, no_backend):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run on the GPU machine)")
    torch.manual_seed(0)
    _compare(*(CUDA_CASES[case]() + ({},))[:3])


def test_type_strings_match_pytorch():
    x = torch.zeros(2, 2, 5, 5)  # float32, two samples: oneDNN runs it and prints both types
    for dt in (f64, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64):
        w = torch.zeros(2, 2, 3, 3, dtype=dt)
        with pytest.raises(RuntimeError) as e:
            A.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        assert f"weight type ({validate.type_string(spec_of(w))})" in str(e.value)


# --- accepted corner cases: portconv runs what PyTorch runs ------------------------------------------------------
ACCEPTED = {
    "output-padding-below-dilation": lambda: fn("conv_transpose2d", r(*X4), r(4, 6, 3, 3), output_padding=1,
                                                dilation=2),
    "same-even-kernel-dilated": lambda: fn("conv2d", r(*X4), r(6, 4, 4, 2), padding="same", dilation=(1, 3)),
    "same-unbatched": lambda: fn("conv2d", r(4, 8, 8), r(6, 4, 4, 4), padding="same"),
    "valid": lambda: fn("conv1d", r(2, 4, 8), r(6, 4, 3), padding="valid"),
    "output-padding-ignored-non-transposed": lambda: conv(r(*X4), r(*W4), s=2, op=1),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_like_pytorch(case):
    torch.manual_seed(0)
    name, args, kw = (ACCEPTED[case]() + ({},))[:3]
    expected = TORCH_FN[name](*args, **kw)
    got = getattr(portconv, name)(*args, **kw, backend="aten")
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


# --- Empty backend: N == 0 or C == 0 ------------------------------------------------------------------------------
EMPTY = {
    "batch-0": lambda: conv(r(0, 4, 6, 6), r(*W4), r(6)),
    "channels-0": lambda: conv(r(2, 0, 6, 6), r(6, 0, 3, 3), r(6)),
    "channels-0-grouped": lambda: conv(r(2, 0, 6, 6), r(4, 0, 3, 3), g=2),
    "batch-0-transposed": lambda: conv(r(0, 4, 6, 6), r(4, 3, 3, 3), r(6), s=2, t=True, op=1, g=2),
    "batch-0-1d": lambda: conv(r(0, 4, 9), r(6, 4, 3), r(6), s=2),
    "batch-0-3d-dilated": lambda: conv(r(0, 4, 6, 6, 6), r(6, 4, 3, 3, 3), d=2),
    "batch-0-channels-last": lambda: conv(r(0, 4, 6, 6).to(memory_format=torch.channels_last), r(*W4)),
    "batch-0-zero-size-spatial": lambda: conv(r(0, 4, 0, 6), r(*W4), p=2),
    "batch-0-dtype-mismatch": lambda: conv(r(0, 4, 6, 6), r(*W4, dtype=f64), r(6, dtype=f64)),
    "batch-0-int-input": lambda: conv(r(0, 4, 6, 6, dtype=torch.int64), r(*W4)),
    "batch-0-same": lambda: fn("conv2d", r(0, 4, 5, 6), r(6, 4, 4, 3), padding="same"),
    "batch-0-functional-unbatched-channels-0": lambda: fn("conv1d", r(0, 7), r(6, 0, 3)),
}


@pytest.mark.parametrize("case", list(EMPTY))
def test_empty_forward_matches_pytorch(case, no_backend):
    torch.manual_seed(0)
    name, args, kw = (EMPTY[case]() + ({},))[:3]
    args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    expected = TORCH_FN[name](*args, **kw)
    got = getattr(portconv, name)(*args, **kw, backend="aten")
    assert (got.shape, got.dtype, got.device, got.stride()) == \
        (expected.shape, expected.dtype, expected.device, expected.stride())
    assert got.requires_grad == expected.requires_grad


def _backward_case(x, w, t=False, g=1, s=1, mask=(True, True, True), bs=True):
    n = w.dim() - 2
    bias_sizes = [w.shape[1] * g if t else w.shape[0]] if bs is True else bs
    out = ConvParams.make(n, s, 0, 1, t, 0, g, weight_shape=w.shape).output_shape(x.shape, w.shape)
    return bwd(r(*out, dtype=x.dtype), x, w, bias_sizes, s=s, t=t, g=g, mask=mask)


EMPTY_BACKWARD = {
    "batch-0": lambda: _backward_case(r(0, 4, 6, 6), r(*W4)),
    "channels-0": lambda: _backward_case(r(2, 0, 6, 6), r(6, 0, 3, 3)),
    "batch-0-transposed-grouped": lambda: _backward_case(r(0, 4, 5, 5), r(4, 3, 3, 3), t=True, g=2, s=2),
    "batch-0-1d-noncontiguous": lambda: _backward_case(r(0, 9, 4).transpose(1, 2), r(6, 4, 3)),
    "batch-0-channels-last-weight": lambda: _backward_case(
        r(0, 4, 6, 6), r(*W4).to(memory_format=torch.channels_last)),
    "batch-0-mask": lambda: _backward_case(r(0, 4, 6, 6, dtype=f64), r(*W4, dtype=f64), mask=(False, True, False)),
    "batch-0-odd-bias-sizes": lambda: _backward_case(r(0, 4, 6, 6), r(*W4), bs=[3, 2]),
}


@pytest.mark.parametrize("case", list(EMPTY_BACKWARD))
def test_empty_backward_matches_pytorch(case, no_backend):
    torch.manual_seed(0)
    name, args = EMPTY_BACKWARD[case]()
    expected = A.convolution_backward(*args)
    got = portconv.convolution_backward(*args, backend="aten")
    for e, o in zip(expected, got):
        assert (e is None) == (o is None)
        if e is not None:
            assert (o.shape, o.dtype, o.stride()) == (e.shape, e.dtype, e.stride())
            assert torch.equal(o, e) and not o.isnan().any()


def test_empty_backward_without_bias_sizes_gives_bias_shaped_zeros(no_backend):
    # ATen aborts the process here (std::bad_optional_access); portconv returns what the bias would get
    gi, gw, gb = portconv.convolution_backward(r(0, 6, 4, 4), r(0, 4, 6, 6), r(*W4), None, [1, 1], [0, 0], [1, 1],
                                               False, [0, 0], 1, backend="aten")
    assert gi.shape == (0, 4, 6, 6) and torch.equal(gw, torch.zeros(W4)) and torch.equal(gb, torch.zeros(6))


def test_empty_with_pyopencl_arrays(no_backend):
    cl = pytest.importorskip("pyopencl")
    import numpy as np
    import pyopencl.array as cla

    from portconv.backends.opencl import runtime as rt

    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    q = cl.CommandQueue(cl.Context([dev]))
    x = cla.to_device(q, np.zeros((0, 4, 6, 6), np.float32))
    w = cla.to_device(q, np.ones(W4, np.float32))
    b = cla.to_device(q, np.ones(6, np.float32))
    y = portconv.conv2d(x, w, b, padding=1)
    assert isinstance(y, cla.Array) and y.shape == (0, 6, 6, 6) and y.dtype == np.float32
    go = cla.to_device(q, np.zeros((0, 6, 6, 6), np.float32))
    gi, gw, gb = portconv.convolution_backward(go, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert gi.shape == (0, 4, 6, 6) and gw.shape == W4 and gb.shape == (6,)
    assert (gw.get() == 0).all() and (gb.get() == 0).all()
    text = r"Input type \(pyopencl float32 array on opencl(:0)?\) and weight type \(pyopencl float64"
    with pytest.raises(portconv.ConvError, match=text):
        portconv.conv2d(x, cla.to_device(q, np.ones(W4, np.float64)))


# --- the kernel-family model against ATen's own selection ----------------------------------------------------------
def _random_cpu_case(rng: random.Random):
    rank, t = rng.choice((1, 2, 3)), rng.random() < 0.4
    n, c, g = rng.choice((1, 2, 16)), rng.choice((1, 2, 4)), 1
    if rng.random() < 0.3 and c > 1:
        g = c
    k = rng.choice((1, 3, 5)) if rng.random() < 0.8 else 1
    s, d = rng.choice((1, 1, 2)), rng.choice((1, 1, 2))
    op = rng.choice((0, 1)) if t and s > 1 else 0
    size = rng.choice((9, 12, 40))
    dtype = rng.choice((f32, f32, f64, torch.bfloat16, torch.float16))
    x = torch.empty(n, c, *([size] * rank), dtype=dtype)
    w = torch.empty(*((c, 2 * c // g) if t else (2 * c, c // g)), *([k] * rank), dtype=dtype)
    return x, w, ConvParams.make(rank, s, 0, d, t, op, g, weight_shape=w.shape)


# ConvBackend::Mkldnn and the next value, MkldnnTranspose, which torch 2.13's Python enum leaves unnamed ('???')
MKLDNN = (int(torch._C._ConvBackend.Mkldnn), int(torch._C._ConvBackend.Mkldnn) + 1)
assert int(torch._C._ConvBackend.MkldnnEmpty) == MKLDNN[1] + 1


@pytest.mark.parametrize("threads", [1, 2])
def test_mkldnn_choice_matches_select_conv_backend(threads):
    rng = random.Random(7)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    seen = set()
    try:
        for _ in range(300):
            x, w, p = _random_cpu_case(rng)
            which = torch._C._select_conv_backend(x, w, None, list(p.stride), list(p.padding), list(p.dilation),
                                                  p.transposed, list(p.output_padding), p.groups, None)
            ours = validate.use_mkldnn(x.shape, w.shape, str(x.dtype)[6:], p, CpuFacts.from_torch())
            assert ours == (int(which) in MKLDNN), (which, tuple(x.shape), tuple(w.shape), p)
            seen.add((ours, p.transposed))
    finally:
        torch.set_num_threads(old)
    assert seen == {(True, True), (True, False), (False, True), (False, False)}


def test_validate_is_pure():
    """No vendor or torch import at module level; only the empty-result helpers import torch or vendors."""
    import ast

    for mod in (validate, portconv.params):
        tree = ast.parse(open(mod.__file__).read())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name.split(".")[0] for n in top for a in n.names} | {(n.module or "").split(".")[0] for n in top
                                                                        if isinstance(n, ast.ImportFrom)}
        assert not names & {"torch", "numpy", "pyopencl", "cupy"}, (mod.__name__, names)
        importers = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                     for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        assert importers <= {"empty_backward", "_vendor_array"}, importers
