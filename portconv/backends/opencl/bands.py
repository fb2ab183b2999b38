"""The depthwise 'bands' kernels (opencl/bands.cl): when they apply, their launches.

Note [depthwise bands] in OpenCL: the geometry and the rule are the CUDA set's (portconv/dwbands.py, pure functions of
the view), so both sets stage the same bands and take the same problems: 2-D depthwise filters of 2+ taps on both axes
that no 3-tap kernel takes, dilation 1 along the rows, either layout. Here they run ahead of conv.cl's generic
kernels, and of opencl/depthwise.cl's vectorised ones (compile-time kernel sizes 3, 3x3, 3x3x3, 5x5) on GPUs only,
where both take a problem (contiguous 5x5: ahead_of_depthwise); CPUs run those first.
"""
from __future__ import annotations

from ... import dwbands as geometry
from ...dwbands import DIRECTIONS, THREADS
from ..program import Bind
from . import clw
from .kernels import Ctx, Operand, Part, bias_bind, bias_fields, desc, module_launch, part_of, split_part

SOURCE = "bands.cl"


def _kernels(view, dtype: str) -> dict[str, str]:
    """The bands kernel per direction ('' where they do not run; either layout)."""
    ks = geometry.bands_kernels(view, dtype) if view.depthwise else ("", "", "")
    return dict(zip(DIRECTIONS, ks))


def takes(view, dtype: str) -> bool:
    """Some direction of this depthwise view runs the bands kernels."""
    return any(_kernels(view, dtype).values())


def ahead_of_depthwise(view, dtype: str, fmt: str, cpu: bool) -> tuple[str, ...]:
    """The directions in which the bands kernels run ahead of opencl/depthwise.cl's vectorised kernels (both take
    contiguous 2-D 5x5 filters): on a GPU every direction bands takes (measured faster: select.BANDS_AHEAD_OF_DW), on
    a CPU none (depthwise.cl's CPU programs first; Debian PoCL 5.0 computes some bands wrongly, docs/kernels/
    opencl.md)."""
    if cpu or fmt != "contiguous":
        return ()
    return tuple(d for d, k in _kernels(view, dtype).items() if k)


def _defines(ctx: Ctx, direction: str) -> dict:
    """The module of a view: geometry.dwb_defines under the BANDS_ prefix, BANDS_BYTES (the local array) sized for
    the directions that run bands: not those the clw kernels take (as the CUDA set's), unless ``direction``, the
    launch's, is one (a clw launch that cannot run)."""
    ks, taken = _kernels(ctx.view, ctx.dtype), clw.kernels(ctx.view, ctx.dtype, ctx.fmt)
    runs = tuple(ks[d] if d == direction or not taken[d] else "" for d in DIRECTIONS)
    return {"DEPTHWISE": "", **{"BANDS_" + k: v for k, v in geometry.dwb_defines(ctx.view, ctx.dtype, runs).items()}}


def _spatial(ctx: Ctx, direction: str, src: Operand, w: Operand, dst: Operand, bias: Operand | None):
    kernel = _kernels(ctx.view, ctx.dtype)[direction]
    if not kernel or (direction == "bwd_data" and bias is not None):
        return None, []
    v = ctx.view
    planes, bands, _ = geometry.dw_bands(v, direction, ctx.dtype)
    phases = len(geometry.dwb_phases(v, direction))
    results = v.N * (v.K if direction == "fwd" else v.C)
    x, y = (src, dst) if direction == "fwd" else (dst, src)
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, red=planes, total=results, **bias_fields(bias))
    so, do = ("xo", "yo") if direction == "fwd" else ("yo", "xo")
    binds = (src.bind(1, so), w.bind(2, "wo"), bias_bind(bias, 3), dst.bind(4, do))
    name = f"bands_{direction}_{kernel.removeprefix('bands_')}"
    launch = module_launch(ctx, SOURCE, _defines(ctx, direction), name,
                           (-(-results // planes) * bands * THREADS, phases), (THREADS, 1), args, binds, (x, w, y))
    return part_of("bands", f"{name} (opencl/bands.cl): {planes} plane(s) a group, {bands} band(s) a plane, "
                            f"{geometry.dwb_vh(v)} rows an item", launch)


def fwd(ctx: Ctx, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    return _spatial(ctx, "fwd", x, w, y, bias)


def bwd_data(ctx: Ctx, y: Operand, w: Operand, x: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    return _spatial(ctx, "bwd_data", y, w, x, bias)


def bwd_weight(ctx: Ctx, x: Operand, y: Operand, w: Operand) -> tuple[Part | None, list[str]]:
    """A work-group per (channel, split) over units of staged rows; several splits add in split order
    (bands_finalize). Splits: about 4 work-groups per compute unit, as the CUDA set's."""
    kernel = _kernels(ctx.view, ctx.dtype)["bwd_weight"]
    if not kernel:
        return None, []
    v = ctx.view
    planes = geometry.dwb_wgeometry(v, ctx.dtype)[0]
    splits, chunk = geometry.dwb_splits(v, ctx.dtype, ctx.device.compute_units)
    taps = v.R[1] * v.R[2]
    part_elems = v.K * splits * taps if splits > 1 else 0
    strides = dict(xs=x.strides5, ws=w.strides5, ys=y.strides5)
    name = f"bands_bwd_weight_{kernel.removeprefix('bands_')}"
    ws = Bind(4, "partials") if splits > 1 else Bind(4, "dummy")
    launch = module_launch(ctx, SOURCE, _defines(ctx, "bwd_weight"), name, (v.K * THREADS, splits), (THREADS, 1),
                           desc(v, red=chunk, total=splits, **strides),
                           (x.bind(1, "xo"), y.bind(2, "yo"), w.bind(3, "wo"), ws), (x, w, y), part_elems)
    summary = (f"{name} (opencl/bands.cl): a group a (channel, split), {splits} split(s) of {chunk} unit(s) "
               f"of {planes} plane(s)")
    return split_part(ctx, "bands", SOURCE, _defines(ctx, "bwd_weight"), summary, launch, w, v.K * taps, splits,
                      "bands_finalize")
