"""Shared by the opencl tests: problems, the float64 reference, checks, and ways to run a plan on this device."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from portconv.backends import get
from portconv.backends.opencl import runtime as rt
from portconv.knobs import Options
from portconv.params import ConvParams
from portconv.problem import Problem
from portconv.tensors import spec_of

# error relative to max|reference|: output rounding (half: 2^-11, bfloat16: 2^-8) plus accumulation
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_TF32 = 1e-2  # float32 plans whose math is 'tf32' (Note [OpenCL tensor cores]): operands rounded to 10 bits
DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}
CL_FMT = {2: torch.channels_last, 3: torch.channels_last_3d}
NO_TC = Options(opencl_tc="off")  # the FMA tiles unless a test asks for the tensor-core tile

# (id, rank, N, Cin, Cout, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding)
CASES = [
    ("1d", 1, 2, 3, 4, (17,), (3,), 1, 1, 1, 1, False, 0),
    ("1d-stride-dil", 1, 2, 4, 6, (23,), (3,), 2, 3, 2, 2, False, 0),
    ("1d-depthwise-m2", 1, 2, 3, 6, (16,), (5,), 1, 2, 1, 3, False, 0),
    ("1d-transposed", 1, 2, 4, 3, (9,), (4,), 2, 1, 1, 1, True, 1),
    ("1d-same-even", 1, 1, 2, 3, (12,), (4,), 1, "same", 1, 1, False, 0),
    ("2d", 2, 2, 3, 5, (9, 8), (3, 3), 1, 1, 1, 1, False, 0),
    ("2d-stride-pad-dil", 2, 2, 4, 6, (13, 11), (3, 2), (2, 3), (1, 0), (1, 2), 2, False, 0),
    ("2d-groups3", 2, 1, 6, 9, (7, 7), (3, 3), 1, 1, 1, 3, False, 0),
    ("2d-depthwise-m1", 2, 2, 4, 4, (10, 9), (3, 3), 1, 1, 1, 4, False, 0),
    ("2d-depthwise-m2", 2, 2, 3, 6, (11, 10), (3, 3), 2, 1, 1, 3, False, 0),
    ("2d-pointwise-s2", 2, 2, 5, 4, (8, 7), (1, 1), 2, 0, 1, 1, False, 0),
    ("2d-kernel-over-input", 2, 1, 2, 3, (3, 4), (5, 5), 1, 2, 1, 1, False, 0),
    ("2d-transposed", 2, 2, 4, 3, (5, 6), (3, 3), 2, 1, 1, 1, True, 1),
    ("2d-transposed-groups-dil", 2, 1, 4, 6, (5, 4), (3, 2), (2, 1), (1, 0), 2, 2, True, (1, 0)),
    ("2d-transposed-depthwise", 2, 2, 3, 3, (6, 5), (3, 3), 2, 1, 1, 3, True, 1),
    ("2d-same-even", 2, 2, 3, 4, (8, 7), (2, 4), 1, "same", 1, 1, False, 0),
    ("2d-same-dil", 2, 1, 2, 2, (9, 9), (2, 3), 1, "same", 2, 1, False, 0),
    ("2d-long-reduction", 2, 4, 2, 3, (26, 25), (3, 3), 1, 1, 1, 1, False, 0),
    ("3d", 3, 2, 2, 3, (5, 6, 4), (3, 3, 2), 1, 1, 1, 1, False, 0),
    ("3d-stride-dil", 3, 1, 4, 4, (7, 6, 7), (2, 3, 2), (2, 1, 3), (0, 1, 1), (2, 1, 1), 2, False, 0),
    ("3d-transposed", 3, 1, 2, 3, (3, 4, 3), (3, 2, 3), 2, 1, 1, 1, True, 1),
    ("3d-depthwise-m2", 3, 2, 2, 4, (4, 5, 4), (3, 3, 3), 1, 1, 1, 2, False, 0),
    ("3d-same-even", 3, 1, 2, 2, (5, 4, 6), (2, 2, 4), 1, "same", 1, 1, False, 0),
]


def tol(plan, dtype) -> float:
    return TOL_TF32 if plan.math == "tf32" else TOL[dtype]


def reference(x, w, b, p: ConvParams, go, mask=(True, True, True)):
    """aten.convolution / convolution_backward on float64 copies (padding='same''s extra padding applied first)."""
    x64, w64 = x.detach().double(), w.detach().double()
    pads = [v for e in reversed(p.padding_extra) for v in (0, e)]
    xp = F.pad(x64, pads) if any(p.padding_extra) else x64
    y = torch.ops.aten.convolution(xp, w64, None if b is None else b.detach().double(), **p.as_aten())
    if go is None:
        return y, None, None, None
    bias_sizes = [w.shape[1] * p.groups if p.transposed else w.shape[0]]
    gi, gw, gb = torch.ops.aten.convolution_backward(go.double(), xp, w64, bias_sizes, **p.as_aten(),
                                                     output_mask=list(mask))
    if gi is not None and any(p.padding_extra):
        gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in x.shape[2:])]
    return y, gi, gw, gb


def check(out, ref, dtype, what, tol=None):
    assert out is not None, what
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out64 = out.double()
    assert torch.isfinite(out64).all(), f"{what}: {int((~torch.isfinite(out64)).sum())} non-finite elements"
    assert torch.isfinite(ref).all(), f"{what}: reference not finite"
    err = (out64 - ref).abs().max().item() if ref.numel() else 0.0
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1e-6)
    assert err <= (tol or TOL[dtype]) * scale, f"{what}: max abs error {err:.3g} vs max |ref| {scale:.3g}"


def make(case, dtype, fmt, bias=True, seed=0):
    """(x, w, b, ConvParams) for a case; fmt picks the memory layout of x (or of w) or a strided view.
    case: (id, rank, N, Cin, Cout, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding)."""
    _, rank, n, cin, cout, sp, k, stride, padding, dilation, groups, transposed, out_pad = case
    g = torch.Generator().manual_seed(seed)
    wshape = (cin, cout // groups, *k) if transposed else (cout, cin // groups, *k)
    if fmt == "noncontig":  # every other channel and a shifted window of a bigger tensor
        big = torch.randn(n, 2 * cin, *(s + 2 for s in sp), generator=g).to(dtype)
        x = big[(slice(None), slice(None, None, 2)) + tuple(slice(1, 1 + s) for s in sp)]
    else:
        x = torch.randn(n, cin, *sp, generator=g).to(dtype)
    w = torch.randn(*wshape, generator=g).to(dtype)
    b = torch.randn(cout, generator=g).to(dtype) if bias else None
    if fmt == "channels_last":
        x = x.contiguous(memory_format=CL_FMT[rank])
    if fmt == "weight_cl":
        w = w.contiguous(memory_format=CL_FMT[rank])
    p = ConvParams.make(rank, stride, padding, dilation, transposed, out_pad, groups, weight_shape=w.shape)
    return x, w, b, p


def dw_case(shape, k, stride=1, padding=1, mult=1, n=2, dtype=torch.float32, fmt="contiguous", seed=0):
    """A depthwise problem (x of (n, *shape), weight (C*mult, 1, *k)) with bias, as (x, w, b, ConvParams)."""
    g = torch.Generator().manual_seed(seed)
    c, rank = shape[0], len(shape) - 1
    x = torch.randn(n, *shape, generator=g).to(dtype)
    w = torch.randn(c * mult, 1, *k, generator=g).to(dtype)
    b = torch.randn(c * mult, generator=g).to(dtype)
    if fmt == "channels_last":
        x = x.contiguous(memory_format=CL_FMT[rank])
    elif fmt == "w_strided":  # every other column of a wider tensor: rows not contiguous along W
        x = torch.randn(n, *shape[:-1], 2 * shape[-1], generator=g).to(dtype)[..., ::2]
    p = ConvParams.make(rank, stride, padding, 1, False, 0, c, weight_shape=w.shape)
    return x, w, b, p


def ig_case(n, cin, cout, sp, k, stride=1, padding=0, dilation=1, groups=1, transposed=False, out_pad=0,
            dtype=torch.float32, fmt="contiguous", seed=0):
    case = ("ig", len(sp), n, cin, cout, sp, k, stride, padding, dilation, groups, transposed, out_pad)
    return make(case, dtype, fmt, seed=seed)


def problem_of(x, w, b, p) -> Problem:
    return Problem(p, spec_of(x), spec_of(w), b is not None)


def opencl_plan(x, w, b, p):
    """The planner's (cached) opencl plan, under the options in force."""
    from portconv import functional

    return functional.select(problem_of(x, w, b, p), "opencl")


def this_device():
    return rt.info(*rt.default_index())


@dataclasses.dataclass
class Direct:
    """An opencl plan made by the backend itself (no plan cache), on a DeviceInfo of this device's runtime whose
    fields may differ (kind='gpu': the GPU settings, run here)."""

    problem: Problem
    choice: object
    kernels: dict
    runner: object

    @property
    def algorithm(self) -> str:
        return self.choice.algorithm

    @property
    def reason(self) -> str:
        return self.choice.reason

    @property
    def math(self) -> str:
        return self.choice.math

    @property
    def memory_format(self) -> str:
        return self.choice.memory_format

    def kernel(self, result: str):
        return self.kernels.get(result)

    def forward(self, x, w, b=None):
        return self.runner.forward(x, w, b)

    def backward(self, go, x, w, mask=(True, True, True)):
        return self.runner.backward(go, x, w, tuple(mask))


def direct_plan(x, w, b, p, options: Options = NO_TC, fmt: str | None = None, **device_fields) -> Direct:
    """``fmt``: compute the results in this memory format instead of the rule's (the kernels take any)."""
    impl = get("opencl")
    problem = problem_of(x, w, b, p)
    device = dataclasses.replace(impl.device_for(problem), **device_fields)
    choice = impl.choose(problem, device, options)
    if fmt is not None:
        choice = dataclasses.replace(choice, memory_format=fmt)
    kernels, runner = impl.prepare(problem, device, choice, options)
    return Direct(problem, choice, {k.result: k for k in kernels}, runner)


def lines(plan, result: str) -> str:
    """A result's KernelPlan lines, one string."""
    k = plan.kernel(result)
    return "\n".join(k.lines()) if k is not None else ""


def launched_since(before: dict, kernels=None) -> dict:
    names = kernels if kernels is not None else [n for n in rt.stats if not n.endswith(("_built", "_loaded"))]
    return {k: rt.stats[k] - before.get(k, 0) for k in names if rt.stats[k] - before.get(k, 0)}


def run_all(plan, x, w, b, p, dtype, kernels=None, go_like_y=False):
    """Forward and all three gradients against the float64 reference; which of ``kernels`` (default: every launch
    counter) were launched how often. ``go_like_y``: grad_output in the output's strides (else contiguous)."""
    before = dict(rt.stats)
    y = plan.forward(x, w, b)
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    if go_like_y:
        go = torch.empty_strided(y.shape, y.stride(), dtype=dtype).copy_(go)
    got = plan.backward(go, x, w, (True, True, True))
    ry, *refs = reference(x, w, b, p, go)
    check(y, ry, dtype, "output", tol(plan, dtype))
    for out, ref, name in zip(got, refs, ("grad_input", "grad_weight", "grad_bias")):
        check(out, ref, dtype, name, tol(plan, dtype))
    return launched_since(before, kernels)
