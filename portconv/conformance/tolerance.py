"""Pass/fail of one computed tensor against the float64 reference, with a bound scaled by dtype and reduction length."""
from __future__ import annotations

import dataclasses
import math

import torch

# Note [conformance tolerance]
# Every element of a convolution (forward, grad_input, grad_weight, grad_bias) is a dot product
# sum_i a_i*b_i of L terms. The classic error bound of a floating-point dot product is proportional
# to sum_i |a_i*b_i|, which we compute exactly: the same float64 convolution (or
# convolution_backward) run on |input|, |weight|, |grad_output| (and |bias|). Call it absref. An
# element passes iff
#
#     |out - ref| <= eps_out * (|ref| + |partial|)  +  (C_ACC * eps_acc * sqrt(L)  +  2 * eps_in) * absref  +  tiny
#
# * eps_out: unit roundoff of the output dtype (the one final rounding of the result, to nearest as
#   PyTorch rounds): 2^-53 float64, 2^-24 float32, 2^-11 float16, 2^-8 bfloat16.
# * eps_acc: unit roundoff of the accumulation. float64 accumulates in float64; float32, float16
#   and bfloat16 in float32 (the half types must accumulate in float32 in every portconv kernel
#   set). A plan's Choice.math can say otherwise ('fp16-accumulate', ...; see ACCUMULATION), for
#   every tensor or per tensor: 'tf32,grad_weight=fp16-accumulate' (mode_for).
# * sqrt(L): rounding errors of a sum of L terms grow like sqrt(L) in practice (the deterministic
#   worst case is L); C_ACC = 4 leaves room for different summation orders and blockings
#   (tree and split-K reductions, atomics, GEMM tiles; transform algorithms such as Winograd or FFT
#   would have to declare their own Choice.math). L per tensor: C/g*prod(kernel) for forward,
#   K/g*prod(kernel) for grad_input, N*prod(output) for grad_weight and grad_bias (the transposed
#   convolution swaps the roles; Case.reduction_lengths).
# * partial: the forward result without the bias (0 for every other tensor and without bias). The
#   bias may be added after the convolution was rounded to the output dtype, which rounds twice:
#   PyTorch's own CUDA path does (cuDNN's result, then add_ of the bias in the output dtype). This
#   matters only for the half types, and most where the bias cancels the convolution.
# * eps_in: rounding of the inputs inside the computation: 0 for 'ieee'; 2^-10 for 'tf32' (float32
#   operands cut to 10 explicit mantissa bits, by rounding or by truncation as tensor cores may do;
#   a product of two such operands is off by <= 2*eps_in).
# * tiny: the smallest normal number of the output dtype, so that exact zeros (grad_input positions no
#   kernel tap reaches) pass only when they are (nearly) zero, and flush-to-zero is allowed.
# NaN and inf never pass. The inputs were rounded to the case dtype before the reference saw them,
# so input rounding of the half types is not an error. A bug (a missing or extra term, a wrong
# index) moves an element by about absref/L, which this bound rejects by orders of magnitude in
# float32/float64; in bfloat16 it still rejects any error above ~2^-8 relative.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ACCUMULATION = {  # Choice.math -> (accumulation roundoff, None: the dtype's default; input rounding)
    "ieee": (None, 0.0),
    "fp32-accumulate": (2.0**-24, 0.0),
    "tf32": (2.0**-24, 2.0**-10),
    "fp16-accumulate": (2.0**-11, 0.0),
    "bf16-accumulate": (2.0**-8, 0.0),
}
C_ACC = 4.0


def mode_for(math_mode: str, tensor: str) -> str:
    """The math mode of one tensor: Choice.math is a mode, or a default plus per-tensor overrides
    ('tf32,grad_weight=fp16-accumulate'; a bare 'grad_weight=...' defaults the rest to 'ieee')."""
    default, overrides = "ieee", {}
    for part in (p.strip() for p in (math_mode or "ieee").split(",")):
        if "=" in part:
            name, mode = (x.strip() for x in part.split("=", 1))
            overrides[name] = mode
        elif part:
            default = part
    return overrides.get(tensor, default)


def roundoffs(dtype: str, math_mode: str = "ieee") -> tuple[float, float, float]:
    """(eps_out, eps_acc, eps_in) for an output dtype and a plan's math mode."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"no tolerance for dtype {dtype!r}")
    if math_mode not in ACCUMULATION:
        raise ValueError(f"unknown Choice.math {math_mode!r}; the tolerance knows {', '.join(ACCUMULATION)}")
    acc, eps_in = ACCUMULATION[math_mode]
    if acc is None:
        acc = UNIT_ROUNDOFF["float64"] if dtype == "float64" else UNIT_ROUNDOFF["float32"]
    return UNIT_ROUNDOFF[dtype], acc, eps_in


def bound(ref: torch.Tensor, absref: torch.Tensor, length: int, dtype: str, math_mode: str = "ieee",
          partial: torch.Tensor | None = None) -> torch.Tensor:
    """The per-element tolerance (float64, same shape as ``ref``)."""
    eps_out, eps_acc, eps_in = roundoffs(dtype, math_mode)
    tiny = torch.finfo(getattr(torch, dtype)).tiny
    scale = C_ACC * eps_acc * math.sqrt(max(length, 1)) + 2.0 * eps_in
    rounded = ref.abs() if partial is None else ref.abs() + partial.abs()
    return eps_out * rounded + scale * absref + tiny


@dataclasses.dataclass
class TensorCheck:
    """The verdict on one tensor of one case. ``max_ratio`` = max |err|/tolerance (<= 1 passes);
    ``max_rel`` = max |err|/absref, the error relative to the summed magnitudes."""

    name: str
    status: str  # 'pass', 'fail', 'n/a' (not requested by output_mask)
    elements: int = 0
    bad: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ratio: float = 0.0
    worst: dict | None = None  # index, got, want, tol of the worst element
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("max_abs", "max_rel", "max_ratio"):
            d[k] = json_float(d[k])
        if self.worst:
            d["worst"] = {k: json_float(v) if isinstance(v, float) else v for k, v in self.worst.items()}
        return d


def json_float(v: float):
    """JSON has no NaN/inf: those become strings."""
    return v if math.isfinite(v) else str(v)


def not_requested(name: str, got) -> TensorCheck:
    """output_mask said False: the backend must return None (and spend nothing on it)."""
    if got is None:
        return TensorCheck(name, "n/a")
    return TensorCheck(name, "fail", message=f"{name} was not requested (output_mask False) but a "
                                             f"{type(got).__name__} was returned instead of None")


def check(name: str, got, ref: torch.Tensor, absref: torch.Tensor, length: int, dtype: str,
          math_mode: str = "ieee", device: torch.device | None = None,
          partial: torch.Tensor | None = None) -> TensorCheck:
    """Compare ``got`` (a torch tensor from the backend) with the float64 reference, element by element.

    ``partial``: the forward result before the bias is added (see Note [conformance tolerance])."""
    if got is None:
        return TensorCheck(name, "fail", message=f"{name} was requested but the backend returned None")
    if not isinstance(got, torch.Tensor):
        return TensorCheck(name, "fail", message=f"{name} is a {type(got).__name__}, expected a torch.Tensor")
    if tuple(got.shape) != tuple(ref.shape):
        return TensorCheck(name, "fail", message=f"{name} has shape {list(got.shape)}, expected {list(ref.shape)}")
    want_dtype = getattr(torch, dtype)
    if got.dtype != want_dtype:
        return TensorCheck(name, "fail", message=f"{name} has dtype {got.dtype}, expected {want_dtype}")
    if device is not None and got.device != device:
        return TensorCheck(name, "fail", message=f"{name} is on {got.device}, expected {device}")
    n = ref.numel()
    if n == 0:
        return TensorCheck(name, "pass")
    g = got.detach().to("cpu", torch.float64)
    err = (g - ref).abs()
    tol = bound(ref, absref, length, dtype, mode_for(math_mode, name), partial)
    finite = torch.isfinite(g)
    ok = finite & (err <= tol)
    ratio = torch.where(finite, err / tol, torch.full_like(err, math.inf))
    rel = torch.where(finite, err / absref.clamp_min(torch.finfo(want_dtype).tiny), torch.full_like(err, math.inf))
    bad = int((~ok).sum())
    nonfinite = int((~finite).sum())
    i = int(torch.argmax(torch.nan_to_num(ratio, nan=math.inf)))
    idx = list(torch.unravel_index(torch.tensor(i), ref.shape))
    worst = {"index": [int(v) for v in idx], "got": float(g.reshape(-1)[i]), "want": float(ref.reshape(-1)[i]),
             "tol": float(tol.reshape(-1)[i])}
    max_abs = math.inf if nonfinite else float(err.max())
    res = TensorCheck(name, "pass" if bad == 0 else "fail", n, bad, nonfinite, max_abs, float(rel.max()),
                      float(ratio.max()), worst)
    if bad:
        what = f"{nonfinite} not finite, " if nonfinite else ""
        res.message = (f"{name}: {bad} of {n} elements outside tolerance ({what}max |err| {max_abs:.3g}, "
                       f"{res.max_ratio:.3g}x the bound); worst at {worst['index']}: got {worst['got']:.9g}, "
                       f"want {worst['want']:.9g}, tol {worst['tol']:.3g}")
    return res
