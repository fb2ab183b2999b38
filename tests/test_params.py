"""ConvParams: expansion, 'same'/'valid', output shapes against PyTorch's real results, is_depthwise."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from portconv.errors import ConvError
from portconv.params import ConvParams, expand_param_if_needed, same_padding

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@pytest.mark.parametrize("value,dim,expected", [
    (3, 2, (3, 3)), ((3,), 3, (3, 3, 3)), ([1, 2], 2, (1, 2)), ((4, 5, 6), 3, (4, 5, 6)), (0, 1, (0,)),
    (-1, 2, (-1, -1)),
])
def test_expand(value, dim, expected):
    assert expand_param_if_needed(value, "stride", dim) == expected


@pytest.mark.parametrize("value,dim,shown", [((1, 2), 3, "[1, 2]"), ((), 2, "[]"), ([1, 2, 3], 2, "[1, 2, 3]")])
def test_expand_message(value, dim, shown):
    with pytest.raises(ConvError) as e:
        expand_param_if_needed(value, "dilation", dim)
    assert str(e.value) == (f"expected dilation to be a single integer value or a list of {dim} values to match the "
                            f"convolution dimensions, but got dilation={shown}")


@pytest.mark.parametrize("bad", [1.5, "2", True, (1, 2.0), None])
def test_non_integers_are_type_errors_like_torch(bad):
    x, w = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 2, 2)
    with pytest.raises(TypeError):
        F.conv2d(x, w, stride=bad)
    with pytest.raises(TypeError):
        ConvParams.make(2, stride=bad, weight_shape=w.shape)


def test_make_expands_to_the_weight_rank_after_spreading_ints_to_the_call_rank():
    p = ConvParams.make(2, stride=(2,), padding=1, dilation=[1, 3], weight_shape=(4, 4, 3, 3))
    assert (p.stride, p.padding, p.dilation, p.output_padding, p.padding_extra) == \
        ((2, 2), (1, 1), (1, 3), (0, 0), (0, 0))
    p = ConvParams.make(3, stride=(1,), padding=(0,), dilation=(1,), output_padding=(0,), weight_shape=(4, 4, 3))
    assert p.rank == 1
    with pytest.raises(ConvError, match=r"list of 1 values .* but got output_padding=\[0, 0, 0\]$"):
        ConvParams.make(3, stride=(1,), padding=(0,), dilation=(1,), weight_shape=(4, 4, 3))  # as F.conv3d says
    with pytest.raises(ConvError, match=r"list of 1 values .* but got stride=\[1, 1\]$"):
        ConvParams.make(2, weight_shape=(4, 4, 3))  # conv2d(stride=1) with a 1-d weight, as torch's parser does
    with pytest.raises(ConvError, match="^weight should have at least three dimensions$"):
        ConvParams.make(2, weight_shape=(4, 4))
    with pytest.raises(ConvError, match="^non-positive groups is not supported$"):
        ConvParams.make(2, groups=0, weight_shape=(4, 4, 3, 3))
    assert ConvParams.make(2, groups=0, weight_shape=(4, 4, 3, 3), backward=True).groups == 0


def test_valid_and_same():
    assert ConvParams.make(2, padding="valid", stride=2, weight_shape=(4, 4, 5, 5)).padding == (0, 0)
    p = ConvParams.make(2, padding="same", weight_shape=(4, 4, 5, 5))
    assert (p.padding, p.padding_extra) == ((2, 2), (0, 0))
    p = ConvParams.make(2, padding="same", dilation=(1, 3), weight_shape=(4, 4, 4, 2))
    assert (p.padding, p.padding_extra) == ((1, 1), (1, 1))  # totals 3 and 3: one more on the high side
    p = ConvParams.make(3, padding="same", dilation=2, weight_shape=(4, 4, 4, 3, 2))
    assert (p.padding, p.padding_extra) == ((3, 2, 1), (0, 0, 0))
    assert same_padding((4, 1, 2), (1, 5, 3)) == ((1, 0, 1), (1, 0, 1))
    with pytest.raises(ConvError, match="^padding='same' is not supported for strided convolutions$"):
        ConvParams.make(2, padding="same", stride=(1, 2), weight_shape=(4, 4, 3, 3))
    with pytest.raises(ConvError, match="^Invalid padding string: 'SAME'$"):
        ConvParams.make(2, padding="SAME", weight_shape=(4, 4, 3, 3))
    with pytest.raises(TypeError):
        ConvParams.make(2, padding="same", transposed=True, weight_shape=(4, 4, 3, 3))


def _random_case(rng: random.Random, transposed: bool, padding_mode: str | None):
    rank = rng.choice((1, 2, 3))
    groups = rng.choice((1, 1, 2, 3))
    cin, cout = groups * rng.randint(1, 2), groups * rng.randint(1, 2)
    k = [rng.randint(1, 4) for _ in range(rank)]
    d = [rng.randint(1, 3) for _ in range(rank)]
    s = [1] * rank if padding_mode == "same" else [rng.randint(1, 3) for _ in range(rank)]
    p = [rng.randint(0, 2) for _ in range(rank)]
    sizes = [rng.randint(di * (ki - 1) + 1, di * (ki - 1) + 6) for di, ki in zip(d, k)]
    n = rng.choice((0, 1, 2))
    x = torch.randn(n, cin, *sizes, dtype=torch.float64)
    if transposed:
        op = [rng.randint(0, max(si, di) - 1) for si, di in zip(s, d)]
        w = torch.randn(cin, cout // groups, *k, dtype=torch.float64)
        kw = dict(stride=s, padding=p, output_padding=op, groups=groups, dilation=d)
        return rank, x, w, kw, CONV_T[rank](x, w, **kw)
    w = torch.randn(cout, cin // groups, *k, dtype=torch.float64)
    kw = dict(stride=s, padding=padding_mode or p, dilation=d, groups=groups)
    return rank, x, w, kw, CONV[rank](x, w, **kw)


@pytest.mark.parametrize("transposed,padding_mode", [(False, None), (True, None), (False, "same"), (False, "valid")])
def test_output_shape_matches_torch(transposed, padding_mode):
    rng = random.Random(hash((transposed, padding_mode)) & 0xFFFF)
    seen_extra = False
    checked = 0
    while checked < 80:
        try:
            rank, x, w, kw, out = _random_case(rng, transposed, padding_mode)
        except RuntimeError:  # e.g. a transposed output below one element: PyTorch rejects it, draw again
            continue
        checked += 1
        p = ConvParams.make(rank, transposed=transposed, weight_shape=w.shape, input_shape=x.shape, **kw)
        seen_extra |= any(p.padding_extra)
        assert p.output_shape(x.shape, w.shape) == tuple(out.shape), (x.shape, w.shape, kw)
    assert seen_extra == (padding_mode == "same")  # the asymmetric 'same' case was exercised


def test_output_shape_with_zero_channels_like_torch():
    x, w = torch.zeros(2, 0, 6, 6), torch.zeros(4, 0, 3, 3)
    p = ConvParams.make(2, weight_shape=w.shape)
    assert p.output_shape(x.shape, w.shape) == tuple(F.conv2d(x, w).shape) == (2, 0, 4, 4)


@pytest.mark.parametrize("input_shape,weight_shape,groups,transposed,expected", [
    ((2, 8, 9, 9), (8, 1, 3, 3), 8, False, True),  # MobileNet depthwise
    ((2, 8, 9, 9), (16, 1, 3, 3), 8, False, True),  # channel multiplier 2
    ((2, 8, 9), (8, 1, 3), 8, False, True),  # 1-d: ATen sees the (N, C, 1, L) view
    ((2, 8, 9, 9), (8, 2, 3, 3), 4, False, False),  # grouped, not depthwise
    ((2, 8, 9, 9), (12, 1, 3, 3), 8, False, False),  # 12 % 8 != 0
    ((2, 1, 9, 9), (4, 1, 3, 3), 1, False, False),  # groups == C == 1
    ((2, 8, 9, 9), (8, 1, 3, 3), 8, True, False),  # transposed
])
def test_is_depthwise(input_shape, weight_shape, groups, transposed, expected):
    p = ConvParams.make(len(weight_shape) - 2, groups=groups, transposed=transposed, weight_shape=weight_shape)
    assert p.is_depthwise(input_shape, weight_shape) is expected


def test_as_aten_and_describe():
    p = ConvParams.make(2, stride=2, padding=(1, 0), transposed=True, output_padding=1, groups=2,
                        weight_shape=(4, 2, 3, 3))
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3)
    assert tuple(torch.ops.aten.convolution(x, w, None, **p.as_aten()).shape) == p.output_shape(x.shape, w.shape)
    assert p.describe() == "stride=[2, 2], padding=[1, 0], dilation=[1, 1], transposed, output_padding=[1, 1], groups=2"
