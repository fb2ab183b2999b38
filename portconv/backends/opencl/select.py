"""The OpenCL set's decisions, pure: choose() (family, result layout, math) and build() (the KernelPlans of a call)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ...device import DeviceInfo
from ...dwbands import DIRECTIONS
from ...errors import Unsupported
from ...knobs import Options
from ...problem import ConvView, Layout, Problem
from ...rules import TorchContext, result_format
from ...tensors import FLOATING, TensorSpec, dense_strides
from .. import Choice
from ..program import KernelPlan, Module
from . import bands, clw, depthwise, igemm
from .kernels import INT32_MAX, Ctx, Operand, Part, bias_grad, direct, result
from .runtime import upload_strides


@dataclasses.dataclass(frozen=True)
class Facts:
    """What choose() reads besides the problem, device and options: the torch context of the result-layout rule (torch
    CPU tensors; None for pyopencl arrays, which take cuDNN's rule) and the TF32 rule's answer (rules.conv_tf32)."""

    torch: TorchContext | None = None
    tf32: tuple[bool, str] = (False, "not consulted")


# Note [OpenCL dense algorithm]: dense problems (every problem the depthwise rule does not take) run either the direct
# kernels of conv.cl (one work-item per result, no data reuse) or the implicit-GEMM tiles of igemm.cl (Note [OpenCL
# implicit GEMM]); the tiles are the default on every device kind (PoCL, batch 1, resnet50-l1-3x3: forward 3.1x and
# grad-weight 24x the direct kernels' speed; docs/kernels/opencl.md), and Options.opencl_dense (PORTCONV_OPENCL_DENSE)
# forces either. Backward-data (and the transposed forward) runs by
# phases, which need stride 1 or dilation 1 on every axis; other problems run that direction on the direct kernel.
FORCED = {"direct": "direct", "implicit_gemm": "igemm", "igemm-tc": "igemm-tc", "depthwise": "depthwise"}


def tc_mode(dtype: str, device: DeviceInfo, options: Options, tf32: tuple[bool, str]) -> tuple[str, str]:
    """Note [OpenCL tensor cores] (opencl/igemm_tc.h): the products of the implicit-GEMM tiles, ('' | 'ptx' |
    'portable', why). By default inline PTX mma.sync on NVIDIA GPUs of sm_80 and newer, for float16 and bfloat16
    always and for float32 where torch allows TF32 for cuDNN convolutions (rules.conv_tf32: the plan's math is then
    'tf32'); Options.opencl_tc (PORTCONV_OPENCL_TC) forces it; 'portable' runs the same tile with its products in
    plain OpenCL C on any device (how CI runs the tile on PoCL)."""
    if dtype == "float64":
        return "", "float64 has no tensor-core mma"
    if options.opencl_tc is not None:
        return ("" if options.opencl_tc == "off" else options.opencl_tc), f"opencl_tc={options.opencl_tc}"
    arch = device.arch or ""
    if device.vendor != "nvidia" or device.kind != "gpu" or not arch.startswith("sm_") or int(arch[3:] or 0) < 80:
        return "", f"no tensor-core mma on a {device.vendor} {device.kind} {arch} (PTX mma needs sm_80+)"
    if dtype == "float32" and not tf32[0]:
        return "", f"TF32 not allowed for float32 ({tf32[1]})"
    return "ptx", arch + (f", TF32 allowed for float32 ({tf32[1]})" if dtype == "float32" else "")


def wants_tf32(problem: Problem, device: DeviceInfo, options: Options) -> bool:
    """Whether choose() reads the TF32 rule for this problem (so the backend asks torch only then)."""
    return (problem.dtype == "float32" and options.opencl_tc is None and device.vendor == "nvidia"
            and device.kind == "gpu")


_DTYPE_NOTE = {"float16": "float16 stored as half, accumulated in float32",
               "bfloat16": "bfloat16 stored as ushort, accumulated in float32, rounded to nearest even"}


def choose(problem: Problem, device: DeviceInfo, options: Options, facts: Facts) -> Choice:
    """The kernel family, result layout and math of a problem on an OpenCL device; raises Unsupported."""
    dt = problem.dtype
    if dt not in FLOATING:
        raise Unsupported(f"the OpenCL kernels take float32, float64, float16 and bfloat16 tensors, not {dt}")
    if problem.weight.dtype != dt:
        raise Unsupported(f"input ({dt}) and weight ({problem.weight.dtype}) dtypes differ")
    if dt == "float64" and not device.fp64:
        raise Unsupported(f"{device.name} has no double precision (no cl_khr_fp64, CL_DEVICE_DOUBLE_FP_CONFIG 0), "
                          "so the OpenCL kernels cannot run float64 on it")
    if any(s < 0 for spec in (problem.input, problem.weight) for s in spec.strides):
        raise Unsupported("tensors with negative strides are not supported by the OpenCL backend")
    rule = "cpu" if facts.torch is not None else "cudnn"
    fmt, fmt_why = result_format(problem, rule, facts.torch or TorchContext())
    view = ConvView.of(problem)
    family, why = _family(problem, view, device, options, fmt)
    tc, tc_why = "", ""
    if family == "igemm":
        tc, tc_why = tc_mode(dt, device, options, facts.tf32)
        family = "igemm-tc" if tc else family
    elif family == "igemm-tc":
        tc, tc_why = _forced_tc(dt, device, options)
    parts = [why, f"results {fmt_why}"]
    if family.startswith("igemm"):
        parts.append(f"tensor cores: {tc_why}" if tc else f"FMA products ({tc_why or 'options.algorithm'})")
    parts += [_DTYPE_NOTE[dt]] if dt in _DTYPE_NOTE else []
    math_ = "fp32-accumulate" if dt in ("float16", "bfloat16") else "tf32" if tc and dt == "float32" else "ieee"
    return Choice(family + ("-transposed" if problem.params.transposed else ""), fmt, "; ".join(parts), math_)


# The evidence that puts the clw kernels ahead of bands where both take a problem (docs/performance/h100/depthwise.md,
# OpenCL section). On PoCL clw is the slower, but Debian PoCL 5.0 returned wrong bands results where clw passes
# (docs/kernels/opencl.md).
CLW_AHEAD_OF_BANDS = ("bands not used: clw measured faster (H100 OpenCL, 7x7 float32: 1.72x-2.52x PyTorch, "
                      "bands 0.57x-1.16x)")


# The evidence that puts the clw kernels ahead of depthwise.cl's channels-last kernels on GPUs, in the directions clw
# takes (docs/performance/h100/depthwise.md, OpenCL section).
CLW_AHEAD_OF_DW_CL = "depthwise.cl second: clw measured faster on a GPU (H100 OpenCL, 5x5 channels-last: 1.4x-2.9x)"


# The evidence that puts the bands kernels ahead of depthwise.cl's vectorised NCHW kernels on GPUs, where both take a
# problem (contiguous 2-D 5x5; docs/performance/h200/README.md).
BANDS_AHEAD_OF_DW = ("depthwise.cl second on GPUs: bands measured faster (H200 OpenCL, EfficientNet's 5x5 NCHW); "
                     "bands over depthwise.cl: forward 1.9x-2.6x, backward-data 0.99x-1.7x, weight gradient 2.7x-3.0x")


def _family(problem: Problem, view: ConvView, device: DeviceInfo, options: Options, fmt: str) -> tuple[str, str]:
    forced = options.algorithm
    if forced is not None:
        if forced == "depthwise" and not view.depthwise:
            raise Unsupported("algorithm=depthwise: not a depthwise problem (one input channel a group, > 1 group)")
        return FORCED[forced], f"algorithm={forced} (portconv.options)"
    if view.depthwise:
        cpu, head = device.kind == "cpu", f"depthwise, channel multiplier {view.kg}"
        if depthwise.dw_spec(problem, view, fmt, cpu)[0] is not None:
            first = bands.ahead_of_depthwise(view, problem.dtype, fmt, cpu)
            if first:
                some = "" if len(first) == len(DIRECTIONS) else f" for {', '.join(first)}"
                return "depthwise", (f"{head}: the bands kernels (opencl/bands.cl){some}; else vectorised kernels "
                                     f"(opencl/depthwise.cl); {BANDS_AHEAD_OF_DW}")
            return "depthwise", f"{head}: vectorised kernels (opencl/depthwise.cl) where the layouts allow"
        cl, why = depthwise.dw_cl_spec(problem, view, fmt, cpu)
        ahead = clw.ahead_of_depthwise_cl(view, problem.dtype, fmt, cpu)
        if cl is not None and ahead:
            some = "" if len(ahead) == len(DIRECTIONS) else f" for {', '.join(ahead)}"
            return "depthwise", (f"{head}: the clw kernels (opencl/clw.cl, Note [depthwise clw]){some}, else "
                                 f"channels-last kernels (opencl/depthwise.cl); {CLW_AHEAD_OF_DW_CL}")
        if cl is not None:
            return "depthwise", f"{head}: channels-last kernels (opencl/depthwise.cl) where the layouts allow"
        why = f"results {fmt}, {why}" if fmt != "contiguous" else depthwise.dw_spec(problem, view, fmt, cpu)[1]
        banded = bands.takes(view, problem.dtype)
        if clw.takes(view, problem.dtype, fmt):  # Note [depthwise clw]: ahead of bands
            rest = "" if clw.covers(view, problem.dtype, fmt) else ", else bands" if banded else ", else conv.cl"
            ahead = f"; {CLW_AHEAD_OF_BANDS}" if banded else ""
            return "depthwise", (f"{head}: the clw kernels (opencl/clw.cl, Note [depthwise clw]){rest}{ahead}; "
                                 f"vectorised kernels not used: {why}")
        if banded:
            return "depthwise", (f"{head}: the bands kernels (opencl/bands.cl, Note [depthwise bands]); vectorised "
                                 f"kernels not used: {why}")
        return "depthwise", f"{head}: the generic kernels (opencl/conv.cl); vectorised kernels not used: {why}"
    if options.opencl_dense is not None:
        mode, why = options.opencl_dense, f"opencl_dense={options.opencl_dense}"
    else:
        mode, why = "igemm", f"the default for dense problems on a {device.kind}"
    what = "implicit-GEMM tiles (opencl/igemm.cl)" if mode == "igemm" else "direct kernels (opencl/conv.cl)"
    return mode, f"{what}: {why}"


def _forced_tc(dtype: str, device: DeviceInfo, options: Options) -> tuple[str, str]:
    """The products of algorithm=igemm-tc."""
    if dtype == "float64":
        raise Unsupported("algorithm=igemm-tc: float64 has no tensor-core mma")
    if options.opencl_tc == "off":
        raise Unsupported("algorithm=igemm-tc contradicts opencl_tc=off")
    if options.opencl_tc is not None:
        return options.opencl_tc, f"opencl_tc={options.opencl_tc}"
    arch = device.arch or ""
    if device.vendor != "nvidia" or not arch.startswith("sm_") or int(arch[3:] or 0) < 80:
        raise Unsupported(f"algorithm=igemm-tc: PTX mma needs an NVIDIA sm_80+ GPU, not a {device.vendor} "
                          f"{device.kind} {arch}; opencl_tc=portable runs the tile's products anywhere")
    return "ptx", f"{arch} (algorithm=igemm-tc)"


def context(problem: Problem, device: DeviceInfo, options: Options, choice: Choice, limits=None) -> Ctx:
    """The builders' view of a plan."""
    family = choice.algorithm.removesuffix("-transposed")
    tc = ("portable" if options.opencl_tc == "portable" else "ptx") if family == "igemm-tc" else ""
    return Ctx(problem, ConvView.of(problem), device, options, family, tc, choice.memory_format, limits or {})


# --- build: the KernelPlans of one call ---------------------------------------------------------------------------

def _sets(ctx: Ctx, direction: str) -> tuple:
    """The specialised kernel sets the family tries for a direction, in order, before the direct kernels."""
    if ctx.family == "depthwise":
        if direction in bands.ahead_of_depthwise(ctx.view, ctx.dtype, ctx.fmt, ctx.cpu):
            return bands, depthwise, clw
        ahead = direction in clw.ahead_of_depthwise_cl(ctx.view, ctx.dtype, ctx.fmt, ctx.cpu)
        return (clw, depthwise, bands) if ahead else (depthwise, clw, bands)
    return (igemm,) if ctx.family.startswith("igemm") else ()


def _data(ctx: Ctx, kind: str, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> tuple[Part, list[str]]:
    """The forward ('fwd': y from x) or backward-data ('bwd_data': x from y) computation of the view."""
    if (y if kind == "fwd" else x).numel == 0:
        return Part("nothing to launch: the result is empty"), []
    why: list[str] = []
    for kernels in _sets(ctx, kind):
        fn = getattr(kernels, kind)
        part, lines = fn(ctx, x, w, y, bias) if kind == "fwd" else fn(ctx, y, w, x, bias)
        if part is not None:
            return part, why
        why += lines
    return direct(ctx, kind, x, w, y, bias), why


def _weight(ctx: Ctx, x: Operand, y: Operand, w: Operand) -> tuple[Part, list[str]]:
    """The grad-weight computation of the view."""
    if w.numel == 0:
        return Part("nothing to launch: the result is empty"), []
    why: list[str] = []
    for kernels in _sets(ctx, "bwd_weight"):
        part, lines = kernels.bwd_weight(ctx, x, y, w)
        if part is not None:
            return part, why
        why += lines
    return direct(ctx, "bwd_weight", x, w, y), why


def build(problem: Problem, device: DeviceInfo, options: Options, choice: Choice, call: str, mask: tuple,
          layouts: tuple, limits: Mapping[tuple[Module, str], int] | None = None) -> tuple[KernelPlan, ...]:
    """The KernelPlans of one call ('forward', or 'backward' with its output mask) on operands of these Layouts
    (forward: input, weight, bias or None; backward: grad_output, input, weight). Pure. ``limits``: work-group sizes
    of compiled kernels below the device's maximum (Note [work-group limits])."""
    ctx = context(problem, device, options, choice, limits)
    fmt, dt, transposed = ctx.fmt, ctx.dtype, problem.params.transposed

    def out(role, shape, fmt=fmt):
        return result(role, tuple(shape), dense_strides(shape, fmt))

    if call == "forward":
        x, w, b = layouts
        inp, wt = Operand("input", x), Operand("weight", w)
        bias = None if b is None else Operand("bias", b)
        y = out("output", problem.output_shape)
        part, why = _data(ctx, "bwd_data", y, wt, inp, bias) if transposed else _data(ctx, "fwd", inp, wt, y, bias)
        return (part.plan("output", y, dt, why),)
    go, x, w = layouts
    if tuple(go.shape) != tuple(problem.output_shape):
        raise ValueError(f"grad_output has shape {list(go.shape)}, expected {list(problem.output_shape)}")
    g, inp, wt = Operand("grad_output", go), Operand("input", x), Operand("weight", w)
    plans = []
    if mask[0]:
        gi = out("grad_input", problem.input.shape)
        part, why = _data(ctx, "fwd", g, wt, gi, None) if transposed else _data(ctx, "bwd_data", gi, wt, g, None)
        plans.append(part.plan("grad_input", gi, dt, why))
    if mask[1]:
        gw = out("grad_weight", problem.weight.shape)
        part, why = _weight(ctx, g, inp, gw) if transposed else _weight(ctx, inp, g, gw)
        plans.append(part.plan("grad_weight", gw, dt, why))
    if mask[2]:
        gb = out("grad_bias", (problem.bias_size,), "contiguous")
        plans.append(bias_grad(ctx, g, gb).plan("grad_bias", gb, dt))
    return tuple(plans)


# --- the Layouts a problem implies (what Plan.kernels and explain() show) --------------------------------------------

def spec_layout(spec: TensorSpec) -> Layout:
    """The Layout of a described operand at an aligned address: a torch tensor's as uploaded (upload_strides)."""
    strides = upload_strides(spec.shape, spec.strides) if spec.kind == "torch" else spec.strides
    lay = Layout.dense(spec.shape, strides)
    return dataclasses.replace(lay, wide=lay.span > INT32_MAX)


def implied_layouts(problem: Problem, memory_format: str) -> tuple[tuple, tuple]:
    """(forward layouts, backward layouts) of the problem as described: grad_output dense in the result format, the
    bias dense."""
    x, w = spec_layout(problem.input), spec_layout(problem.weight)
    bias = Layout.dense((problem.bias_size,), (1,)) if problem.has_bias else None
    shape = problem.output_shape
    go = Layout.dense(shape, dense_strides(shape, memory_format))
    return (x, w, bias), (dataclasses.replace(go, wide=go.span > INT32_MAX), x, w)
