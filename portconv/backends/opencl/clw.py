"""The depthwise 'clw' kernels (opencl/clw.cl): when they apply, their launches.

Note [depthwise clw] in OpenCL: the rule and the geometry are the CUDA set's (portconv/dwclw.py, pure functions of the
view), so both sets take the same problems with the same lanes, tiles and splits: channels-last results of 2-D
depthwise filters of 2 to 9 taps an axis (not 3 along the last), multiplier 1, dilation 1, the same stride 1 or 2 on
both axes (the stride-2 backward-data by phases, Note [clw phases]). Here they run ahead of the bands
kernels, where opencl/depthwise.cl's vectorised kernels do not (its kernel sizes are compile-time: 3, 3x3, 3x3x3,
5x5) and, on GPUs, ahead of depthwise.cl's channels-last kernels too (ahead_of_depthwise_cl).
"""
from __future__ import annotations

from ... import dwclw as geometry
from ...dwbands import DIRECTIONS, THREADS
from ..program import Bind
from .kernels import Ctx, Operand, Part, bias_bind, bias_fields, desc, module_launch, part_of, split_part

SOURCE = "clw.cl"


def kernels(view, dtype: str, fmt: str) -> dict[str, str]:
    """The clw kernel per direction ('' where they do not run); ``fmt``: the results' memory format."""
    ks = geometry.clw_kernels(view, fmt != "contiguous", dtype) if view.depthwise else ("", "", "")
    return dict(zip(DIRECTIONS, ks))


def takes(view, dtype: str, fmt: str) -> bool:
    """Some direction of this depthwise view runs the clw kernels."""
    return any(kernels(view, dtype, fmt).values())


def covers(view, dtype: str, fmt: str) -> bool:
    """Every direction of this depthwise view runs the clw kernels."""
    return all(kernels(view, dtype, fmt).values())


def ahead_of_depthwise_cl(view, dtype: str, fmt: str, cpu: bool) -> tuple[str, ...]:
    """The directions in which the clw kernels run ahead of opencl/depthwise.cl's channels-last kernels (both take
    2-D 5x5 filters): on a GPU every direction clw takes (measured faster: select.CLW_AHEAD_OF_DW_CL), on a CPU
    none (depthwise.cl's CPU programs first, as before clw)."""
    if cpu:
        return ()
    return tuple(d for d, k in kernels(view, dtype, fmt).items() if k)


def _defines(ctx: Ctx) -> dict:
    """The module of a view: geometry.clw_defines under the CLW_ prefix (the filter and the dtype's geometry)."""
    return {"CLW_" + k: v for k, v in geometry.clw_defines(ctx.view, ctx.dtype).items()}


def _spatial(ctx: Ctx, direction: str, src: Operand, w: Operand, dst: Operand, bias: Operand | None):
    kernel = kernels(ctx.view, ctx.dtype, ctx.fmt)[direction]
    if not kernel or (direction == "bwd_data" and bias is not None):
        return None, []
    v = ctx.view
    ct, blocks, tiles_c = geometry.clw_grid(v, direction, ctx.dtype, ctx.device.compute_units)
    g = geometry.DWC_GEOMETRY[ctx.dtype]
    x, y = (src, dst) if direction == "fwd" else (dst, src)
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, **bias_fields(bias))
    so, do = ("xo", "yo") if direction == "fwd" else ("yo", "xo")
    binds = (src.bind(1, so), w.bind(2, "wo"), bias_bind(bias, 3), dst.bind(4, do))
    name = f"clw_{direction}_{kernel.removeprefix('clw_')}"
    phases = geometry.clw_phases(v, direction)  # Note [clw phases]: a phase a group of dimension 2
    grid, block = ((blocks * THREADS, tiles_c, phases), (THREADS, 1, 1)) if phases > 1 else \
        ((blocks * THREADS, tiles_c), (THREADS, 1))
    launch = module_launch(ctx, SOURCE, _defines(ctx), name, grid, block, args, binds, (x, w, y),
                           local=geometry.clw_shared(v, ctx.dtype))
    how = f"{g.th}x{geometry.clw_vw(v, ctx.dtype)} outputs an item" + (f", {phases} phases" if phases > 1 else "")
    summary = f"{name} (opencl/clw.cl): {ct} channel group(s) a group, {how}"
    return part_of("clw", summary, launch)


def fwd(ctx: Ctx, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    return _spatial(ctx, "fwd", x, w, y, bias)


def bwd_data(ctx: Ctx, y: Operand, w: Operand, x: Operand, bias: Operand | None) -> tuple[Part | None, list[str]]:
    return _spatial(ctx, "bwd_data", y, w, x, bias)


def bwd_weight(ctx: Ctx, x: Operand, y: Operand, w: Operand) -> tuple[Part | None, list[str]]:
    """A work-group per (split, channel tile), a filter row of a channel group a work-item; several splits add in
    split order (clw_finalize). Splits: about 4 work-groups a compute unit, as the CUDA set's."""
    kernel = kernels(ctx.view, ctx.dtype, ctx.fmt)["bwd_weight"]
    if not kernel:
        return None, []
    v = ctx.view
    splits, tiles, chunk = geometry.clw_splits(v, ctx.dtype, ctx.device.compute_units)
    count = v.K * v.R[1] * v.R[2]
    part_elems = splits * count if splits > 1 else 0
    name = f"clw_bwd_weight_{kernel.removeprefix('clw_')}"
    ws = Bind(4, "partials") if splits > 1 else Bind(4, "dummy")
    args = desc(v, xs=x.strides5, ws=w.strides5, ys=y.strides5, red=chunk, total=splits)
    launch = module_launch(ctx, SOURCE, _defines(ctx), name, (splits * THREADS, tiles), (THREADS, 1), args,
                           (x.bind(1, "xo"), y.bind(2, "yo"), w.bind(3, "wo"), ws), (x, w, y), part_elems)
    vww = geometry.DWC_GEOMETRY[ctx.dtype].vww
    summary = (f"{name} (opencl/clw.cl): a filter row an item, {splits} split(s) x {chunk} unit(s) of {vww} "
               "columns")
    return split_part(ctx, "clw", SOURCE, _defines(ctx), summary, launch, w, count, splits, "clw_finalize")
