"""Note [long reductions]: the conformance cases of float32 weight and bias gradients over very many positions.

The grid's problems are small, so it cannot see how a kernel family adds millions of terms. Two cases per own kernel
family (direct, implicit GEMM, depthwise), float32, the family forced with portconv.options(algorithm=...):
  random: x and grad_output drawn from N(0, 1) over ``positions`` positions (default 2^26, 67M), 1x1 weights; the
    weight and bias gradients against float64 sums, relative error (L2) at most RANDOM_LIMIT;
  ones: stride-0 tensors of ones over ``ones`` positions (default 2.4e9, no memory): the weight and bias gradients must
    equal the count exactly (2.4e9 is a float32 number; a lone float32 accumulator stops at 2^24). The count passes
    2^31, so a reduction length, work count or packed argument held in 32 bits shows here.
Each returns LongResult rows; `portconv conform --long-reductions` prints them and tests/test_long_reductions.py runs
them on the backend under test.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import functional, knobs

FAMILIES = ("direct", "implicit_gemm", "depthwise")
RANDOM_LIMIT = 1e-5
RANDOM_POSITIONS = 1 << 26
ONES = 2_400_000_000  # > 2^31 - 1, a multiple of 256: exact in float32
_W = 1024  # random: positions a row, shapes (1, C, positions / _W, _W)
_PLANE = 1000  # ones: shapes (positions / _PLANE^2, C, _PLANE, _PLANE)


@dataclasses.dataclass(frozen=True)
class LongResult:
    family: str
    case: str  # 'random' or 'ones'
    positions: int
    weight: float  # relative error (random) or |got - count| (ones)
    bias: float
    limit: float

    @property
    def ok(self) -> bool:
        return self.weight <= self.limit and self.bias <= self.limit  # NaN compares False: never passes

    def line(self) -> str:
        what = "rel err" if self.case == "random" else "abs err"
        return (f"{self.family:<14} {self.case:<6} {self.positions:>13,d} positions  grad_weight {what} "
                f"{self.weight:.2e}  grad_bias {what} {self.bias:.2e}  limit {self.limit:.0e}  "
                f"{'ok' if self.ok else 'FAIL'}")


def _grads(family: str, backend: str, go, x, groups: int):
    c = x.shape[1]
    w = torch.ones(c, c // groups, 1, 1, device=x.device)
    from ..bench.settings import torch_variant

    # IEEE float32: under torch's default TF32 convolutions the OpenCL set's tensor-core tile would run TF32
    with torch_variant(ieee=True), knobs.use_options(algorithm=family), knobs.with_env(poison=True):
        _, gw, gb = functional.convolution_backward(go, x, w, [c], [1, 1], [0, 0], [1, 1], False, [0, 0], groups,
                                                    (False, True, True), backend=backend)
    return gw.reshape(c, -1), gb


def _groups(family: str) -> int:
    return 2 if family == "depthwise" else 1  # depthwise: 2 channels, one a group; else 2 -> 2 channels dense


def random_case(family: str, backend: str, device, positions: int = RANDOM_POSITIONS, seed: int = 0) -> LongResult:
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (1, 2, positions // _W, _W)
    x, go = (torch.randn(shape, generator=g).to(device) for _ in range(2))
    groups = _groups(family)
    gw, gb = _grads(family, backend, go, x, groups)
    ref_w = torch.zeros(2, 2 // groups, dtype=torch.float64)
    ref_b = torch.zeros(2, dtype=torch.float64)
    for rows in torch.split(torch.arange(shape[2]), 4096):  # float64 sums a slab at a time
        xs, gs = x[:, :, rows].double().cpu(), go[:, :, rows].double().cpu()
        prod = torch.einsum("nchw,nkhw->kc", xs, gs)
        ref_w += prod if groups == 1 else torch.diagonal(prod)[:, None]
        ref_b += gs.sum((0, 2, 3))

    def rel(got, ref):
        return float((got.double().cpu() - ref).norm() / ref.norm())
    return LongResult(family, "random", positions, rel(gw, ref_w), rel(gb, ref_b), RANDOM_LIMIT)


def ones_case(family: str, backend: str, device, positions: int = ONES) -> LongResult:
    n = positions // _PLANE**2
    if n * _PLANE**2 != positions:
        raise ValueError(f"ones: {positions} positions is not a multiple of {_PLANE**2}")
    c = 2 if family == "depthwise" else 1
    x = go = torch.ones(1, 1, 1, 1, device=device).expand(n, c, _PLANE, _PLANE)  # stride 0: a large count, no memory
    gw, gb = _grads(family, backend, go, x, c if family == "depthwise" else 1)
    count = float(positions)
    return LongResult(family, "ones", positions, float((gw.double().cpu() - count).abs().max()),
                      float((gb.double().cpu() - count).abs().max()), 0.0)


def run(backend: str, device, families=FAMILIES, positions: int = RANDOM_POSITIONS, ones: int = ONES):
    """Every family's two cases on ``backend`` (tensors on ``device``)."""
    return [case for f in families for case in (random_case(f, backend, device, positions),
                                                 ones_case(f, backend, device, ones))]
