"""MIOpenDriver's problem flags (-n -c -H -W -k -y -x ...): shared by `portconv conv`, `explain` and `bench`."""
from __future__ import annotations

import argparse

DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp64": "float64", "double": "float64", "fp16": "float16",
                 "half": "float16", "bf16": "bfloat16", "bfp16": "bfloat16"}
LAYOUT_ALIASES = {"nchw": "contig", "ncw": "contig", "ncdhw": "contig", "contiguous": "contig", "contig": "contig",
                  "nhwc": "chlast", "nwc": "chlast", "ndhwc": "chlast", "channels_last": "chlast",
                  "channels_last_3d": "chlast", "chlast": "chlast", "strided": "strided"}
DIRECTIONS = {"fwd": 1, "bwd-data": 2, "bwd": 2, "bwd-weight": 4, "wrw": 4, "all": 7}  # -F: MIOpenDriver's bits


def _dtype(s: str) -> str:
    from .conformance.reference import DTYPES

    name = DTYPE_ALIASES.get(s.lower(), s.lower())
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {s!r} (float32, float64, float16, bfloat16)")
    return name


def _layout(s: str) -> str:
    try:
        return LAYOUT_ALIASES[s.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown layout {s!r} (NCHW, NHWC, strided)") from None


def _directions(s: str) -> int:
    """-F as MIOpenDriver has it (0 all, 1 fwd, 2 bwd-data, 4 bwd-weight, sums) or names joined by ','."""
    if s.isdigit():
        v = int(s)
        if not 0 <= v <= 7:
            raise argparse.ArgumentTypeError("-F takes 0..7 (1 fwd, 2 bwd-data, 4 bwd-weight, 0 all)")
        return v or 7
    try:
        return sum({DIRECTIONS[p.strip().lower()] for p in s.split(",")})
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown direction in {s!r} (fwd, bwd-data, bwd-weight, all)") from None


def _mask(s: str) -> tuple[bool, bool, bool]:
    if len(s) != 3 or set(s) - {"0", "1"} or s == "000":
        raise argparse.ArgumentTypeError("--mask takes three bits (grad_input, grad_weight, grad_bias), e.g. 110")
    return tuple(c == "1" for c in s)  # type: ignore[return-value]


def add_problem_flags(p: argparse.ArgumentParser) -> None:
    from .conformance.cases import FLAGS

    g = p.add_argument_group("problem (MIOpenDriver's flags; 1-D problems use the W flags)")
    g.add_argument("-_", "--spatial_dim", dest="spatial_dim", type=int, default=2, choices=(1, 2, 3))
    g.add_argument("-n", "--batchsize", dest="n", type=int, default=4, help="batch size (default 4)")
    g.add_argument("-c", "--in_channels", dest="c", type=int, default=3)
    g.add_argument("-k", "--out_channels", dest="k", type=int, default=32)
    defaults = {"spatial": 32, "kernel": 3, "padding": 0, "stride": 1, "dilation": 1, "output_padding": 0}
    for field, dims in FLAGS.items():
        for dim, (long, short) in dims.items():
            g.add_argument(short, long, dest=f"{field}_{dim}", type=int, default=defaults[field],
                           metavar="N", help=f"{field.replace('_', ' ')} {dim.upper()} (default {defaults[field]})")
    g.add_argument("-z", "--pad_mode", default="default", choices=("default", "same", "valid"))
    g.add_argument("-g", "--group_count", dest="groups", type=int, default=1)
    g.add_argument("-m", "--mode", default="conv", choices=("conv", "trans"), help="conv or trans (transposed)")
    g.add_argument("-b", "--bias", type=int, default=0, choices=(0, 1))
    g.add_argument("--dtype", type=_dtype, default="float32", help="float32 (default), float64, float16, bfloat16")
    g.add_argument("-I", "--layout", "--in_layout", dest="layout", type=_layout, default="contig",
                   help="NCHW (default), NHWC (channels-last, any rank) or strided (a non-contiguous view)")
    p.add_argument("--backend", default=None, help="force a backend (default: portconv's automatic plan)")
    p.add_argument("--device", default=None, help="torch device of the tensors (default: what the backend takes)")


def case_from_args(a, mask=(True, True, True)):
    from .conformance.cases import DIMS, Case

    dims = DIMS[a.spatial_dim]

    def vec(field):
        return tuple(getattr(a, f"{field}_{d}") for d in dims)

    pad = a.pad_mode if a.pad_mode != "default" else vec("padding")
    case = Case(rank=a.spatial_dim, n=a.n, c=a.c, k=a.k, spatial=vec("spatial"), kernel=vec("kernel"),
                stride=vec("stride"), padding=pad, dilation=vec("dilation"), groups=a.groups,
                transposed=a.mode == "trans", output_padding=vec("output_padding") if a.mode == "trans" else (),
                bias=bool(a.bias), mask=mask, layout=a.layout, family="cli")
    return case
