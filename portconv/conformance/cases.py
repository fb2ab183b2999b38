"""The conformance case grid: deterministic cases with stable ids, curated model layers, CI and gradcheck subsets."""
from __future__ import annotations

import dataclasses
import itertools
import random
import zlib
from collections.abc import Iterable, Sequence

from ..params import ConvParams

# output_mask variants (grad_input, grad_weight, grad_bias); all-true is listed three times so it is the most common
MASKS = ((True, True, True), (True, True, True), (True, True, True), (True, False, False), (False, True, False),
         (False, False, True), (False, True, True), (True, True, False), (True, False, True))
LAYOUTS = ("contig", "chlast", "strided")  # chlast of a 1-D problem is an (N, L, C) buffer seen as (N, C, L)
EXTRA_LAYOUTS = ("expanded",)  # the fuzzer's (Note [fuzzer]): stride-0 leading axes
BATCHES = (2, 1, 3, 2)

# MIOpenDriver's flags per spatial dim (driver/conv_driver.hpp); 1-D problems use the W flags. `portconv conv`
# parses these and Case.cli_args() writes them, so every case has a reproducer command line.
DIMS = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}
FLAGS = {  # field -> dim -> (long flag, MIOpenDriver short flag)
    "spatial": {"d": ("--in_d", "-!"), "h": ("--in_h", "-H"), "w": ("--in_w", "-W")},
    "kernel": {"d": ("--fil_d", "-@"), "h": ("--fil_h", "-y"), "w": ("--fil_w", "-x")},
    "padding": {"d": ("--pad_d", "-$"), "h": ("--pad_h", "-p"), "w": ("--pad_w", "-q")},
    "stride": {"d": ("--conv_stride_d", "-#"), "h": ("--conv_stride_h", "-u"), "w": ("--conv_stride_w", "-v")},
    "dilation": {"d": ("--dilation_d", "-^"), "h": ("--dilation_h", "-l"), "w": ("--dilation_w", "-j")},
    "output_padding": {"d": ("--trans_output_pad_d", "-%"), "h": ("--trans_output_pad_h", "-Y"),
                       "w": ("--trans_output_pad_w", "-X")},
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One convolution problem with its data layout and output_mask; ``key`` names it canonically.

    ``k`` is the number of output channels, ``c`` of input channels, for normal and transposed convolution alike.
    """

    rank: int
    n: int
    c: int
    k: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    bias: bool = True
    mask: tuple[bool, bool, bool] = (True, True, True)
    layout: str = "contig"
    name: str = ""  # curated cases carry a model-layer name; grid cases are named by their key
    family: str = "grid"

    def __post_init__(self):
        if not self.output_padding:
            object.__setattr__(self, "output_padding", (0,) * self.rank)
        assert self.layout in LAYOUTS + EXTRA_LAYOUTS, self.layout
        assert len(self.spatial) == len(self.kernel) == len(self.stride) == len(self.dilation) == self.rank

    # --- naming -------------------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """Canonical description; equal keys mean equal problems, layouts, masks and input data."""
        def t(v):
            if isinstance(v, str):
                return v
            return str(v[0]) if len(set(v)) == 1 and self.rank > 1 else "x".join(map(str, v))

        parts = [f"{'t' if self.transposed else ''}conv{self.rank}d", f"n{self.n}c{self.c}k{self.k}",
                 "i" + "x".join(map(str, self.spatial)), "f" + "x".join(map(str, self.kernel)),
                 f"s{t(self.stride)}", f"p{t(self.padding)}", f"d{t(self.dilation)}", f"g{self.groups}"]
        if self.transposed:
            parts.append(f"op{t(self.output_padding)}")
        parts += ["b" if self.bias else "nb", "m" + "".join("1" if m else "0" for m in self.mask), self.layout]
        return "-".join(parts)

    @property
    def id(self) -> str:
        return self.name or self.key

    @property
    def seed(self) -> int:
        """Per-case seed for the input data (crc32 of the key: stable across runs and Python versions)."""
        return zlib.crc32(self.key.encode())

    # --- shapes -------------------------------------------------------------------------------------
    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.spatial)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.c, self.k // self.groups, *self.kernel)
        return (self.k, self.c // self.groups, *self.kernel)

    @property
    def params(self) -> ConvParams:
        return ConvParams.make(self.rank, self.stride, self.padding, self.dilation, self.transposed,
                               self.output_padding, self.groups, weight_shape=self.weight_shape)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.params.output_shape(self.input_shape, self.weight_shape)

    def conv_args(self) -> dict:
        """Keyword arguments of portconv.convolution / torch.ops.aten.convolution (padding may be 'same'/'valid')."""
        pad = self.padding if isinstance(self.padding, str) else list(self.padding)
        return dict(stride=list(self.stride), padding=pad, dilation=list(self.dilation), transposed=self.transposed,
                    output_padding=list(self.output_padding), groups=self.groups)

    def reduction_lengths(self) -> dict[str, int]:
        """Terms summed per output element of each tensor (an upper bound; the tolerance uses sqrt of it)."""
        taps = _prod(self.kernel)
        g = self.groups
        out_sp = _prod(self.output_shape[2:])
        in_sp = _prod(self.spatial)
        if self.transposed:  # forward is the backward-data of a convolution with (C_in=k, C_out=c) swapped
            return {"forward": self.c // g * taps, "grad_input": self.k // g * taps,
                    "grad_weight": self.n * in_sp, "grad_bias": self.n * out_sp}
        return {"forward": self.c // g * taps, "grad_input": self.k // g * taps,
                "grad_weight": self.n * out_sp, "grad_bias": self.n * out_sp}

    def problems(self) -> list[str]:
        """Why torch would reject the problem or produce an empty output extent (empty when valid)."""
        out = []
        if self.groups < 1 or self.c % self.groups or self.k % self.groups:
            out.append(f"groups={self.groups} must divide in_channels={self.c} and out_channels={self.k}")
            return out
        if isinstance(self.padding, str) and self.padding == "same" and (any(s != 1 for s in self.stride)
                                                                        or self.transposed):
            out.append("padding='same' needs stride 1 and a non-transposed convolution")
        if self.transposed and any(op >= max(s, d) for op, s, d in zip(self.output_padding, self.stride,
                                                                         self.dilation)):
            out.append("output_padding must be smaller than either stride or dilation")
        if any(v < 1 for v in (*self.kernel, *self.stride, *self.dilation)):
            out.append("kernel, stride and dilation must be positive")
        if not out and any(o <= 0 for o in self.output_shape[2:]):
            out.append(f"the output extent {list(self.output_shape[2:])} is not positive")
        return out

    def valid(self) -> bool:
        return not self.problems()

    def cli_args(self, mask: bool = True) -> list[str]:
        """Flags of `portconv conv` that rebuild exactly this case (same data: the seed comes from the key).

        ``mask=False`` leaves out --mask (the caller adds -F instead)."""
        a = ["--spatial_dim", str(self.rank), "-n", str(self.n), "-c", str(self.c), "-k", str(self.k)]
        fields = ["spatial", "kernel", "stride", "dilation"] + ([] if isinstance(self.padding, str) else ["padding"])
        if self.transposed:
            fields.append("output_padding")
        for field in fields:
            for dim, v in zip(DIMS[self.rank], getattr(self, field)):
                a += [FLAGS[field][dim][0 if dim == "d" else 1], str(v)]  # long flags where the shell bites
        if isinstance(self.padding, str):
            a += ["--pad_mode", self.padding]
        if self.groups != 1:
            a += ["-g", str(self.groups)]
        if self.transposed:
            a += ["-m", "trans"]
        a += ["-b", "1" if self.bias else "0"]
        if mask:
            a += ["--mask", "".join("1" if m else "0" for m in self.mask)]
        if self.layout != "contig":
            a += ["--layout", self.layout]
        return a

    def describe(self) -> str:
        kind = "transposed " if self.transposed else ""
        return (f"{kind}conv{self.rank}d input {list(self.input_shape)} weight {list(self.weight_shape)} "
                f"-> {list(self.output_shape)}, {self.params.describe()}, bias={'yes' if self.bias else 'no'}, "
                f"mask={''.join('1' if m else '0' for m in self.mask)}, layout={self.layout}")


def _prod(xs: Iterable[int]) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _v(rank: int, x) -> tuple[int, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,) * rank


def _rotated(key: str, **fixed) -> dict:
    """Bias, mask, layout and batch chosen from the geometry key's hash: stable however the grid grows."""
    rng = random.Random(zlib.crc32(key.encode()))
    out = dict(bias=rng.random() < 0.6, mask=rng.choice(MASKS), layout=rng.choice(LAYOUTS), n=rng.choice(BATCHES))
    out.update(fixed)
    return out


def _make(rank, c, k, spatial, kernel, stride=1, padding=0, dilation=1, groups=1, transposed=False,
          output_padding=0, family="grid", **fixed) -> Case | None:
    pad = padding if isinstance(padding, str) else _v(rank, padding)
    geo = (rank, c, k, spatial, kernel, stride, pad, dilation, groups, transposed, output_padding, family)
    rot = _rotated(repr(geo), **fixed)
    case = Case(rank=rank, c=c, k=k, spatial=_v(rank, spatial), kernel=_v(rank, kernel), stride=_v(rank, stride),
                padding=pad, dilation=_v(rank, dilation), groups=groups, transposed=transposed,
                output_padding=_v(rank, output_padding), family=family, **rot)
    return case if case.valid() else None


# --- the grid ----------------------------------------------------------------------------------------------
# Note [conformance grid]
# Families, each over rank 1, 2 and 3: 'dense' (kernel size x stride/padding incl. 'same', 'valid' and
# unequal per-dim values x dilation), 'groups' (grouped, K < C, depthwise with multiplier 1 and 2),
# 'transposed' (stride 1-3 x output_padding x dilation x padding x groups), 'options' (every
# output_mask x every layout on one geometry), 'batch' (N = 0, 1, 5) and 'odd' (1-pixel inputs, the
# kernel covering the input, stride > kernel, C = 0, prime channel counts, dilation 3, a larger
# input). A full product of every axis would be ~10^6 cases; instead each family takes the product
# of the axes it is about, and bias, output_mask, layout and batch are drawn from a generator seeded
# by the case's geometry (_rotated), so they vary across the grid and never change when cases are
# added elsewhere. Every case's id is its key: the same id always means the same problem and data.
# 'depthwise' is the families models train with (issue 30): kernel sizes 5 to 31, square or not, stride 1 and 2,
# dilation 1 and 2, 'half' padding (dilation * (kernel - 1) / 2, what the models use), none and 'same', multiplier 1
# and 2, each geometry in both NCHW and channels-last (bias, mask and batch still rotate).
# Sizes are small (<= a few thousand outputs) so PoCL on two cores runs the grid in float32 and
# float64 in about a minute; the curated model layers below are the larger ones.
_SPATIAL = {1: (13,), 2: (7, 9), 3: (5, 6, 7)}
_KERNELS = {1: (1, 2, 3, 5), 2: (1, 2, 3, (3, 2)), 3: (1, 2, 3, (3, 1, 2))}
_MIXED = {1: (3, 2), 2: ((2, 1), (0, 2)), 3: ((1, 2, 2), (1, 0, 1))}  # (stride, padding) with unequal entries
_STRIDE_PAD = ((1, 0), (1, 1), (1, "same"), (1, "valid"), (2, 0), (2, 1), "mixed")
_MIXED_DIL = {1: 3, 2: (2, 1), 3: (1, 2, 1)}
_GROUPS = ((4, 6, 2), (6, 3, 3), (4, 4, 4), (4, 8, 4))  # (C, K, groups): grouped, K<C, depthwise x1, depthwise x2
_T_GROUPS = ((4, 3, 1), (4, 6, 2), (4, 4, 4))


def _dense(rank: int) -> Iterable[Case | None]:
    c, k = (3, 4) if rank < 3 else (2, 3)
    for kern, sp, dil in itertools.product(_KERNELS[rank], _STRIDE_PAD, (1, 2)):
        stride, pad = _MIXED[rank] if sp == "mixed" else sp
        yield _make(rank, c, k, _SPATIAL[rank], kern, stride, pad, _MIXED_DIL[rank] if sp == "mixed" else dil,
                    family="dense")


def _grouped(rank: int) -> Iterable[Case | None]:
    dils = (1, 2) if rank < 3 else (1,)
    for (c, k, g), kern, sp, dil in itertools.product(_GROUPS, (3, 2), ((1, 1), (2, 1), (1, "same"), (2, 0)), dils):
        yield _make(rank, c, k, _SPATIAL[rank], kern, sp[0], sp[1], dil, g, family="groups")


def _transposed(rank: int) -> Iterable[Case | None]:
    groups = _T_GROUPS if rank < 3 else (_T_GROUPS[0], _T_GROUPS[2])
    spatial = {1: (9,), 2: (5, 6), 3: (3, 4, 5)}[rank]
    for stride, (op, dil), pad, (c, k, g) in itertools.product((1, 2, 3), ((0, 1), (1, 1), (0, 2), (1, 2)), (0, 1),
                                                                 groups):
        kern = 2 if (stride + pad + g) % 2 else 3
        yield _make(rank, c, k, spatial, kern, stride, pad, dil, g, True, op, family="transposed")


_DW_KERNELS = {1: (5, 7, 13, 31), 2: (5, 7, (5, 3), (1, 7), 13, 31), 3: (5, (3, 5, 5), (3, 7, 7))}
_DW_SPATIAL = {1: (40,), 2: (12, 11), 3: (5, 7, 6)}


def _depthwise(rank: int) -> Iterable[Case | None]:
    dils = (1, 2) if rank < 3 else (1,)
    for kern, sp, dil, mult, layout in itertools.product(_DW_KERNELS[rank], ("half-1", "half-2", "0-1", "same-1"),
                                                         dils, (1, 2), ("contig", "chlast")):
        pad, stride = sp.split("-")
        ks = _v(rank, kern)
        padding = "same" if pad == "same" else 0 if pad == "0" else tuple(dil * (k - 1) // 2 for k in ks)
        spatial = tuple(max(n, dil * (k - 1) + 1) for n, k in zip(_DW_SPATIAL[rank], ks))  # 31 taps fit unpadded
        c = 3 if rank < 3 else 2
        yield _make(rank, c, c * mult, spatial, kern, int(stride), padding, dil, c, family="depthwise",
                    layout=layout)


def _options(rank: int) -> Iterable[Case | None]:
    """Every output_mask x layout on one normal geometry per rank, and on one transposed 2-D geometry."""
    masks = sorted(set(MASKS), reverse=True)
    for mask, layout in itertools.product(masks, LAYOUTS):
        yield _make(rank, 4, 6, _SPATIAL[rank], 3, 2, 1, 1, 2, family="options", mask=mask, layout=layout,
                    bias=mask[2] or layout == "strided", n=2)
        if rank == 2:
            yield _make(2, 4, 6, (5, 6), 3, 2, 1, 1, 2, True, 1, family="options", mask=mask, layout=layout,
                        bias=True, n=2)


def _batches(rank: int) -> Iterable[Case | None]:
    sp = _SPATIAL[rank]
    for n in (0, 1, 5):
        yield _make(rank, 3, 4, sp, 3, 1, 1, family="batch", n=n, mask=(True, True, True))
        yield _make(rank, 4, 8, sp, 3, 2, 1, 1, 4, family="batch", n=n, mask=(True, True, True))
        yield _make(rank, 4, 2, sp, 3, 2, 1, 1, 1, True, 1, family="batch", n=n, mask=(True, True, True))


def _odd(rank: int) -> Iterable[Case | None]:
    one = (1,) * rank
    big = {1: (101,), 2: (31, 17), 3: (9, 7, 5)}[rank]
    yield _make(rank, 3, 4, one, 3, 1, 1, family="odd")  # 1-pixel input, padded 3-tap kernel
    yield _make(rank, 3, 4, _SPATIAL[rank], _SPATIAL[rank], 1, "valid", family="odd")  # kernel covers the input
    yield _make(rank, 3, 4, _SPATIAL[rank], 2, 3, 0, family="odd", mask=(True, True, True))  # stride > kernel: gaps
    yield _make(rank, 5, 7, big, 5 if rank < 3 else 3, 2, 2, family="odd")
    yield _make(rank, 7, 5, _SPATIAL[rank], 3, 1, "same", 2, family="odd")
    yield _make(rank, 9, 6, _SPATIAL[rank], 2, 1, 2, 3, 3, family="odd")  # dilation 3, 3 groups
    yield _make(rank, 3, 5, one, 3, 2, 1, 1, 1, True, 1, family="odd")  # transposed from a 1-pixel input
    yield _make(rank, 0, 4, _SPATIAL[rank], 3, 1, 1, family="odd", n=2, mask=(True, True, True))  # C == 0


def grid() -> list[Case]:
    """The deterministic grid (order and content depend only on this file)."""
    out: list[Case] = []
    seen: set[str] = set()
    for fam in (_dense, _grouped, _depthwise, _transposed, _options, _batches, _odd):
        for rank in (1, 2, 3):
            for case in fam(rank):
                if case is not None and case.key not in seen:
                    seen.add(case.key)
                    out.append(case)
    return out


# --- curated layers of real models, scaled down so PoCL on two cores runs them in seconds --------------------
def _model(name: str, rank: int, n, c, k, spatial, kernel, stride=1, padding=0, dilation=1, groups=1,
           transposed=False, output_padding=0, bias=True, layout="contig") -> Case:
    pad = padding if isinstance(padding, str) else _v(rank, padding)
    case = Case(rank=rank, n=n, c=c, k=k, spatial=_v(rank, spatial), kernel=_v(rank, kernel), stride=_v(rank, stride),
                padding=pad, dilation=_v(rank, dilation), groups=groups, transposed=transposed,
                output_padding=_v(rank, output_padding), bias=bias, layout=layout, name=f"model-{name}",
                family="curated")
    assert case.valid(), name
    return case


def curated() -> list[Case]:
    return [
        # MobileNetV2 inverted residual (144 channels at 56x56 in the original; 24 at 14x14 here)
        _model("mobilenetv2-dw3x3-s1", 2, 2, 24, 24, 14, 3, 1, 1, groups=24, bias=False),
        _model("mobilenetv2-dw3x3-s2", 2, 2, 24, 24, 14, 3, 2, 1, groups=24, bias=False),
        _model("mobilenetv2-dw3x3-s1-nhwc", 2, 2, 24, 24, 14, 3, 1, 1, groups=24, bias=False, layout="chlast"),
        _model("mobilenetv2-pw1x1", 2, 2, 24, 16, 14, 1, bias=False),
        _model("convnext-dw7x7", 2, 2, 16, 16, 14, 7, 1, 3, groups=16),
        _model("resnet-stem7x7-s2", 2, 2, 3, 16, 32, 7, 2, 3, bias=False),
        _model("deeplab-aspp3x3-d6", 2, 1, 16, 8, 17, 3, 1, "same", dilation=6),
        # DCGAN generator (ConvTranspose2d k4 s2 p1) and discriminator (Conv2d k4 s2 p1), ngf/ndf scaled to 8
        _model("dcgan-g-project4x4", 2, 2, 16, 32, 1, 4, 1, 0, transposed=True, bias=False),
        _model("dcgan-g-up4x4-s2", 2, 2, 32, 16, 4, 4, 2, 1, transposed=True, bias=False),
        _model("dcgan-g-out4x4-s2", 2, 2, 16, 3, 8, 4, 2, 1, transposed=True, bias=False),
        _model("dcgan-d-in4x4-s2", 2, 2, 3, 16, 16, 4, 2, 1, bias=False),
        # audio: wav2vec2 feature encoder and positional conv (512/768 channels there), WaveNet dilated conv
        _model("wav2vec2-fe0-k10s5", 1, 2, 1, 32, 400, 10, 5, bias=False),
        _model("wav2vec2-fe1-k3s2", 1, 2, 32, 32, 79, 3, 2, bias=False),
        _model("wav2vec2-posconv-k16g4", 1, 2, 32, 32, 49, 16, 1, 8, groups=4),
        _model("wavenet-k2d8", 1, 2, 16, 32, 64, 2, 1, 0, dilation=8),
        # video: R3D-18 / R(2+1)D stems and an X3D-style depthwise 3x3x3
        _model("r3d18-stem-3x7x7", 3, 1, 3, 8, (4, 16, 16), (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
        _model("r2plus1d-spatial-1x3x3", 3, 2, 8, 12, (4, 8, 8), (1, 3, 3), 1, (0, 1, 1), bias=False),
        _model("r2plus1d-temporal-3x1x1", 3, 2, 12, 8, (4, 8, 8), (3, 1, 1), 1, (1, 0, 0), bias=False),
        _model("x3d-dw3x3x3", 3, 2, 16, 16, (4, 8, 8), 3, 1, 1, groups=16, bias=False, layout="chlast"),
    ]


def all_cases() -> list[Case]:
    return grid() + curated()


def ci_subset() -> list[Case]:
    """Every third grid case plus every curated case (what the default pytest run covers)."""
    return grid()[::3] + curated()


def select(full: bool = True, filters: Sequence[str] = ()) -> list[Case]:
    """The grid (or the CI subset), keeping cases whose id contains any of ``filters`` (all when empty)."""
    cases = all_cases() if full else ci_subset()
    if filters:
        cases = [c for c in cases if any(f in c.id for f in filters)]
    return cases


def gradcheck_cases() -> list[Case]:
    """Tiny problems for torch.autograd.gradcheck in float64 (a few dozen elements each)."""
    tiny = [
        Case(1, 2, 2, 3, (7,), (3,), (2,), (1,), (1,)),
        Case(2, 1, 2, 3, (4, 5), (3, 3), (1, 1), (1, 1), (1, 1)),
        Case(2, 1, 4, 4, (5, 4), (2, 2), (2, 1), (0, 1), (1, 1), groups=2, bias=False),
        Case(2, 1, 2, 4, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), groups=2),  # depthwise, multiplier 2
        Case(2, 1, 2, 3, (3, 3), (3, 3), (2, 2), (1, 1), (1, 1), transposed=True, output_padding=(1, 1)),
        Case(1, 2, 2, 4, (4,), (2,), (2,), (0,), (2,), groups=2, transposed=True, output_padding=(1,)),
        Case(3, 1, 2, 2, (3, 3, 3), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
        Case(2, 1, 2, 2, (4, 5), (2, 2), (1, 1), "same", (2, 1)),  # even kernel: padding_extra
        Case(2, 2, 3, 2, (4, 4), (2, 3), (1, 1), (1, 0), (1, 1), layout="chlast"),
        Case(3, 1, 2, 2, (2, 2, 3), (2, 2, 2), (2, 1, 2), (0, 0, 1), (1, 1, 1), groups=2, transposed=True,
             output_padding=(1, 0, 1), layout="strided"),
    ]
    return [dataclasses.replace(c, family="gradcheck") for c in tiny]
