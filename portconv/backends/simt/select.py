"""The CUDA/HIP kernel set's decisions, pure: choose() the family, build() a KernelPlan per result of a call."""
from __future__ import annotations

import math

from ... import rules
from ...device import DeviceInfo
from ...errors import Unsupported
from ...knobs import Options
from ...problem import ConvView, Layout, Problem
from ...tensors import FLOATING, dense_strides
from .. import Choice
from ..program import KernelPlan
from . import igemm
from . import view as V
from .depthwise import Depthwise, ViewKernels
from .view import THREADS, Launches, Operand, Target

ENTRY = {"direct": "direct.cu", "depthwise": "depthwise.cu", "implicit_gemm": "igemm.cu", "igemm-tc": "igemm.cu"}
FAMILIES = tuple(ENTRY)  # = knobs.ALGORITHMS: what options(algorithm=...) may force
# Note [tensor-core implicit GEMM] (cuda/conv_igemm_tc.cuh): mma.sync per dtype; TF32 for float32 only when the
# plan's math is 'tf32' (rules.conv_tf32: torch's cuDNN conv precision policy allows it, as for cuDNN itself).
TC_MMA = {"float16": "mma.sync fp16 m16n8k16, fp32 accumulate", "bfloat16": "mma.sync bf16 m16n8k16, fp32 accumulate",
          "float32": "mma.sync tf32 m16n8k8 (operands rounded to TF32), fp32 accumulate"}
GROUPED_GEMM_MIN = 8  # Note [grouped implicit GEMM]: channels a group (in and out) from which grouped problems run it


def sm_version(arch: str) -> int:
    """80 for 'sm_80', 90 for 'sm_90a'; 0 when the arch is not an sm_NN name."""
    digits = "".join(ch for ch in arch[3:] if ch.isdigit()) if arch.startswith("sm_") else ""
    return int(digits) if digits else 0


def tensor_core_mma(dtype: str, device: DeviceInfo, kernel_set: str, tf32: bool) -> str | None:
    """The tensor-core instruction the implicit GEMM uses for ``dtype``, or None for the FMA tile: CUDA set only,
    sm_80 and newer, float16/bfloat16 always, float32 only when TF32 is allowed (``tf32``)."""
    if kernel_set != "CUDA" or device.vendor != "nvidia" or sm_version(device.arch) < 80:
        return None
    if dtype in ("float16", "bfloat16") or (dtype == "float32" and tf32):
        return TC_MMA[dtype]
    return None


def igemm_dims(problem: Problem) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of the three implicit GEMMs of Note [implicit GEMM], per group, for the conv view."""
    v = ConvView.of(problem)
    return {"fwd": (v.y_positions, v.kg, v.cg * v.taps), "bwd_data": (v.x_positions, v.cg, v.kg * v.taps),
            "bwd_weight": (v.kg, v.cg * v.taps, v.y_positions)}


def result_rule(device: DeviceInfo) -> str:
    """Note [own kernels' result layout]: MIOpen's rule on AMD GPUs, cuDNN's on NVIDIA ones."""
    return "miopen" if device.vendor == "amd" else "cudnn"


def implied_layouts(problem: Problem, fmt: str) -> tuple[Layout, Layout, Layout]:
    """(input, weight, output) as the problem describes them, the output dense in the results' format ``fmt``."""
    out = problem.output_shape
    return (Layout(problem.input.shape, problem.input.strides), Layout(problem.weight.shape, problem.weight.strides),
            Layout(out, dense_strides(out, fmt)))


def choose(problem: Problem, device: DeviceInfo, options: Options, ctx: rules.TorchContext, kernel_set: str = "CUDA",
           tf32: tuple[bool, str] = (False, "")) -> Choice:
    """The kernel set's family rule: depthwise kernels for depthwise problems, implicit GEMM for dense and grouped
    problems of 8+ channels a group (on tensor cores where tensor_core_mma allows), the direct kernels for the rest;
    ``options.algorithm`` forces a family that can compute the problem. Pure: reads the problem, the device, the
    options, the torch context of the result-layout rule and the TF32 permission (``tf32``: allowed, the setting)."""
    dt, p = problem.dtype, problem.params
    if dt not in FLOATING:
        raise Unsupported(f"portconv's {kernel_set} kernels take float32, float64, float16 and bfloat16, not {dt}")
    if dt == "float64" and not device.fp64:
        raise Unsupported(f"{device.name} has no float64 arithmetic")
    fmt, fmt_why = rules.result_format(problem, result_rule(device), ctx)
    dims = igemm_dims(problem)
    cg, kg = dims["bwd_data"][1], dims["fwd"][1]
    too_wide = [d for d, (_, ncol, _) in dims.items() if -(-ncol // igemm.FMA_TILE[1]) > V.GRID_YZ_MAX]
    mma = tensor_core_mma(dt, device, kernel_set, tf32[0])
    kind = "dense (groups = 1)" if p.groups == 1 else f"grouped (groups = {p.groups}, {cg} / {kg} channels a group)"
    # Note [grouped implicit GEMM]: the GEMMs are per group (grid z), so a grouped problem with 8+ channels a group on
    # both sides runs them as well as a dense one (wav2vec2-posconv-g16, 48 a group: the direct kernels took 15x
    # cuDNN's time); fewer (ResNeXt's 4) stay on the direct kernels
    if problem.is_depthwise:
        natural, direct_why = "depthwise", ""
    elif p.groups == 1 or (cg >= GROUPED_GEMM_MIN and kg >= GROUPED_GEMM_MIN):
        natural = "direct" if too_wide else "igemm-tc" if mma else "implicit_gemm"
        direct_why = f"implicit GEMM's {too_wide[0]} grid would exceed {V.GRID_YZ_MAX} column tiles" if too_wide else ""
    else:
        natural = "direct"
        direct_why = f"grouped (groups = {p.groups}, not depthwise, under {GROUPED_GEMM_MIN} channels a group)"
    family = options.algorithm or natural
    if options.algorithm is not None:
        why = _cannot(family, problem, mma, too_wide, kernel_set)
        if why:
            raise Unsupported(f"options(algorithm={family!r}): {why}")
    if options.igemm_tile is not None and family != "igemm-tc":
        raise Unsupported(f"options(igemm_tile={options.igemm_tile!r}) sets the tensor-core implicit GEMM's tile; "
                          f"this plan runs {family}")
    math_ = "fp32-accumulate" if dt in ("float16", "bfloat16") else "ieee"
    if family == "depthwise":
        m = problem.weight.shape[0] // problem.input.shape[1]
        parts = [f"depthwise (groups = C_in = {p.groups}, channel multiplier {m}): per-channel kernels without a "
                 "channel loop"]
    elif family == "igemm-tc":
        m, n, k = dims["bwd_data" if p.transposed else "fwd"]
        parts = [kind, f"implicit GEMM M={m} N={n} K={k} on tensor cores", f"{mma} (Note [tensor-core implicit GEMM])"]
        if dt == "float32":
            parts.append(f"TF32 allowed for float32 ({tf32[1]})")
            math_ = "tf32"
    elif family == "implicit_gemm":
        m, n, k = dims["bwd_data" if p.transposed else "fwd"]
        bm, bn, bk = igemm.FMA_TILE
        parts = [kind, f"implicit GEMM M={m} N={n} K={k} in {bm}x{bn}x{bk} shared-memory tiles"]
    else:
        parts = [f"{direct_why or kind}: the general direct kernels"]
    if family in igemm.FAMILIES and igemm.narrow_col(ConvView.of(problem), problem.weight.shape,
                                                     problem.weight.strides):
        parts.append(f"{'the forward' if p.transposed else 'backward-data'} as a column GEMM and col2im "
                     f"({cg} channel{'s' * (cg > 1)}, Note [narrow backward-data])")
    if options.algorithm is not None:
        parts.append(f"forced by options(algorithm={family!r})")
    parts.append(f"results {fmt_why}")
    if options.index64 or V.needs_index64(*implied_layouts(problem, fmt)):
        parts.append("64-bit indexing" + (" (forced by options(index64))" if options.index64 else ""))
    return Choice(family, fmt, "; ".join(parts), math_)


def _cannot(family: str, problem: Problem, mma: str | None, too_wide: list[str], kernel_set: str) -> str:
    """Why the kernels of ``family`` cannot compute ``problem`` ('' when they can)."""
    if family == "depthwise" and not problem.is_depthwise:
        return "the depthwise kernels take groups == C_in > 1 with K a multiple of C_in, not transposed"
    if family in igemm.FAMILIES and too_wide:
        return f"implicit GEMM's {too_wide[0]} grid would exceed {V.GRID_YZ_MAX} column tiles"
    if family == "igemm-tc" and mma is None:
        return (f"no tensor-core tile for {problem.dtype} in the {kernel_set} set here (CUDA set, NVIDIA sm_80+, "
                "float16/bfloat16, float32 with TF32 allowed)")
    return ""


# --- the builders: (problem, device, options, choice, layouts) -> KernelPlan per result --------------------------

def target(problem: Problem, device: DeviceInfo, options: Options, choice, layouts, entries: dict,
           waits: bool = True) -> tuple[Target, ConvView, ViewKernels | None]:
    """What every launch of a call shares: the Target (entries, family, units, defines), the view, and the
    depthwise choices of the view (None for other families)."""
    view = ConvView.of(problem)
    cl = choice.memory_format != "contiguous"
    big = options.index64 or V.needs_index64(*implied_layouts(problem, choice.memory_format), *layouts)
    defines: dict[str, object] = {"PC_DTYPE": V.DTYPE_CODE[problem.dtype], "PC_INDEX64": int(big)}
    vk = None
    if choice.algorithm == "depthwise":
        vk = ViewKernels(view, problem.dtype, cl, device.arch)
    t = Target(entries, choice.algorithm, problem.dtype, device.compute_units or 132, device.arch, cl, big,
               tuple(defines.items()), waits)
    return t, view, vk


class Direct:
    """The general direct kernels (cuda/conv_direct.cuh): a thread an output element, split weight reductions."""

    def __init__(self, L: Launches):
        self.L, self.v = L, L.view

    def fwd(self, x: Operand, w: Operand, y: Operand, bias: Operand | None) -> None:
        self.L.launch("portconv_direct_fwd", self.L.elementwise_grid(self.v.y_positions * self.v.K), x=x, w=w, y=y,
                      b=bias, xs=V.strides5(x), wst=V.strides5(w), ys=V.strides5(y), bs=V.bias_stride(bias))

    def bwd_data(self, dx: Operand, w: Operand, dy: Operand, bias: Operand | None) -> None:
        self.L.launch("portconv_direct_bwd_data", self.L.elementwise_grid(self.v.x_positions * self.v.C), x=dx, w=w,
                      y=dy, b=bias, xs=V.strides5(dx), wst=V.strides5(w), ys=V.strides5(dy), bs=V.bias_stride(bias))

    def bwd_weight(self, x: Operand, dy: Operand, dw: Operand) -> None:
        v = self.v
        count = v.K * v.cg * v.taps
        splits, chunk = V.splits_for(count, v.y_positions, 4 * THREADS, self.L.target.units, count)
        ws = self.L.workspace("ws", splits * count) if splits > 1 else None
        self.L.launch("portconv_direct_bwd_weight", (min(count, 2**31 - 1), splits, 1), x=x, w=dw, y=dy, ws=ws,
                      xs=V.strides5(x), wst=V.strides5(dw), ys=V.strides5(dy), splits=splits, chunk=chunk)
        if splits > 1:
            self.L.finalize(count, splits, w=dw, ws=ws, wst=V.strides5(dw), C=v.cg)


def _kernels(L: Launches, vk: ViewKernels | None, options: Options):
    if L.target.algorithm in igemm.FAMILIES:
        return igemm.Igemm(L, options.igemm_tile)
    if L.target.algorithm == "depthwise":
        return Depthwise(L, vk)
    return Direct(L)


def _summary(L: Launches) -> str:
    names = list(dict.fromkeys(x.kernel for x in L.launches))
    return f"{L.target.algorithm}: {' + '.join(names)}"


def _result(L: Launches, shape, fmt: str) -> Operand:
    return L.buffer(L.result, shape, dense_strides(tuple(shape), fmt), result=True)


def _op(role: str, layout: Layout | None) -> Operand | None:
    return None if layout is None else Operand(role, layout)


def output_plan(problem: Problem, device: DeviceInfo, options: Options, choice, layouts, entries: dict = ENTRY,
                shared=None) -> KernelPlan:
    """The forward: layouts (input, weight, bias or None)."""
    t, view, vk = shared or target(problem, device, options, choice, layouts, entries)
    L = Launches(t, view, "output")
    x, w, b = _op("input", layouts[0]), _op("weight", layouts[1]), _op("bias", layouts[2])
    y = _result(L, problem.output_shape, choice.memory_format)
    k = _kernels(L, vk, options)
    if problem.params.transposed:  # the transposed input plays dY, its output dX
        k.bwd_data(y, w, x, b)
    else:
        k.fwd(x, w, y, b)
    return L.plan(_summary(L))


def grad_input_plan(problem: Problem, device: DeviceInfo, options: Options, choice, layouts, entries: dict = ENTRY,
                    shared=None) -> KernelPlan:
    """grad_input: layouts (grad_output, input, weight)."""
    t, view, vk = shared or target(problem, device, options, choice, layouts, entries)
    L = Launches(t, view, "grad_input")
    go, w = _op("grad_output", layouts[0]), _op("weight", layouts[2])
    gi = _result(L, layouts[1].shape, choice.memory_format)
    k = _kernels(L, vk, options)
    if problem.params.transposed:
        k.fwd(go, w, gi, None)
    else:
        k.bwd_data(gi, w, go, None)
    return L.plan(_summary(L))


def grad_weight_plan(problem: Problem, device: DeviceInfo, options: Options, choice, layouts, entries: dict = ENTRY,
                     shared=None) -> KernelPlan:
    """grad_weight: layouts (grad_output, input, weight)."""
    t, view, vk = shared or target(problem, device, options, choice, layouts, entries)
    L = Launches(t, view, "grad_weight")
    go, x = _op("grad_output", layouts[0]), _op("input", layouts[1])
    gw = _result(L, layouts[2].shape, choice.memory_format)
    k = _kernels(L, vk, options)
    if problem.params.transposed:  # X and dY roles swapped
        k.bwd_weight(go, x, gw)
    else:
        k.bwd_weight(x, go, gw)
    return L.plan(_summary(L))


def grad_bias_plan(problem: Problem, device: DeviceInfo, options: Options, choice, layouts, entries: dict = ENTRY,
                   shared=None) -> KernelPlan:
    """grad_bias: dY summed over batch and space per channel (dY is the grad_output, whatever its role)."""
    t, view, vk = shared or target(problem, device, options, choice, layouts, entries)
    L = Launches(t, view, "grad_bias")
    dy = _op("grad_output", layouts[0])
    k = dy.shape[1]
    db = L.buffer("grad_bias", (k,), (1,), result=True)
    ext = (1,) * (5 - len(dy.shape)) + tuple(dy.shape[2:])
    total = view.N * math.prod(ext)
    splits, chunk = V.splits_for(k, total, 8 * THREADS, t.units, k)
    ws = L.workspace("ws", splits * k) if splits > 1 else None
    L.launch("portconv_bias_grad", (k, splits, 1), y=dy, b=db, ws=ws, ys=V.strides5(dy), bs=1, splits=splits,
             chunk=chunk, K=k, Y=ext)
    if splits > 1:
        L.finalize(k, splits, w=db, ws=ws, wst=(1, 0, 0, 0, 0), C=1, K=k, R=(1, 1, 1))
    return L.plan(_summary(L))


BACKWARD = (grad_input_plan, grad_weight_plan, grad_bias_plan)


def build(problem: Problem, device: DeviceInfo, options: Options, choice, entries: dict, call: str, mask: tuple,
          layouts: tuple, waits: bool = True) -> tuple[KernelPlan, ...]:
    """The KernelPlans of one call: 'forward' (layouts: input, weight, bias or None) or 'backward' for ``mask``
    (layouts: grad_output, input, weight), results in call order; ``waits``: the kernel set's finalize may be a
    dependent launch (Note [dependent launch])."""
    shared = target(problem, device, options, choice, layouts, entries, waits)
    if call == "forward":
        return (output_plan(problem, device, options, choice, layouts, entries, shared),)
    return tuple(f(problem, device, options, choice, layouts, entries, shared) for f, m in zip(BACKWARD, mask) if m)
