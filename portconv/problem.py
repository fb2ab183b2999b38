"""Problem (what the planner sees) and ConvView (the one model of a convolution that every own kernel computes)."""
from __future__ import annotations

import dataclasses
import math

from .params import ConvParams
from .tensors import TensorSpec


@dataclasses.dataclass(frozen=True)
class Problem:
    """One convolution problem as the planner sees it: parameters plus tensor descriptions."""

    params: ConvParams
    input: TensorSpec  # batched (N, C, *spatial)
    weight: TensorSpec
    has_bias: bool

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.params.output_shape(self.input.shape, self.weight.shape)

    @property
    def dtype(self) -> str:
        return self.input.dtype

    @property
    def is_depthwise(self) -> bool:
        return self.params.is_depthwise(self.input.shape, self.weight.shape)

    @property
    def bias_size(self) -> int:
        """Channels of the output: the bias's length."""
        w, p = self.weight.shape, self.params
        return w[1] * p.groups if p.transposed else w[0]

    def describe(self) -> str:
        return (f"input {list(self.input.shape)} {self.input.dtype} {self.input.memory_format} on {self.input.device}, "
                f"weight {list(self.weight.shape)}, bias={'yes' if self.has_bias else 'no'}, {self.params.describe()}")


def _pad3(t, fill: int) -> tuple[int, int, int]:
    t = tuple(t)
    return (fill,) * (3 - len(t)) + t


# Note [conv view]
# Every own kernel (cuda/, hip/, opencl/) computes one non-transposed convolution y = conv(x, w):
#   x: (N, C, X0, X1, X2), w: (K, C/G, R0, R1, R2), y: (N, K, Y0, Y1, Y2),
# with stride S, low-side padding P and dilation DL per spatial axis. Ranks 1 and 2 are rank 3 with leading
# spatial extents 1. A transposed convolution is the same object with the roles swapped: its input plays y and its
# output plays x (its weight (C_in, C_out/G, ...) is already (K, C/G, ...)), so its forward is the backward-data
# computation and its backward-data the forward one. C and K are whole channel counts; cg and kg are per group.
@dataclasses.dataclass(frozen=True)
class ConvView:
    N: int
    C: int  # channels of x
    K: int  # channels of y
    G: int
    X: tuple[int, int, int]
    Y: tuple[int, int, int]
    R: tuple[int, int, int]  # kernel extents
    S: tuple[int, int, int]
    P: tuple[int, int, int]
    DL: tuple[int, int, int]

    @classmethod
    def of(cls, problem: Problem) -> ConvView:
        p = problem.params
        xs, ws, ys = problem.input.shape, problem.weight.shape, problem.output_shape
        if p.transposed:
            xs, ys = ys, xs
        return cls(xs[0], xs[1], ws[0], p.groups, _pad3(xs[2:], 1), _pad3(ys[2:], 1), _pad3(ws[2:], 1),
                   _pad3(p.stride, 1), _pad3(p.padding, 0), _pad3(p.dilation, 1))

    @property
    def cg(self) -> int:
        return self.C // self.G

    @property
    def kg(self) -> int:
        return self.K // self.G

    @property
    def depthwise(self) -> bool:
        """One x channel a group, more than one group (channel multiplier kg)."""
        return self.cg == 1 and self.G > 1

    @property
    def taps(self) -> int:
        return self.R[0] * self.R[1] * self.R[2]

    @property
    def x_positions(self) -> int:
        return self.N * math.prod(self.X)

    @property
    def y_positions(self) -> int:
        return self.N * math.prod(self.Y)

    @property
    def phased(self) -> bool:
        """Note [bwd-data phases]: every axis has stride 1 or dilation 1, so the taps that reach an x position
        follow from its phase (position modulo the stride)."""
        return all(s == 1 or d == 1 for s, d in zip(self.S, self.DL))


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a kernel plan may depend on of one operand: its shape, element strides and placement.

    ``misalign``: the address modulo 16 bytes (CUDA, HIP) or the element offset modulo 8 (OpenCL); 0 is aligned.
    ``wide``: the operand's last element lies beyond 32-bit offsets (OpenCL, whose kernels add the offset)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    misalign: int = 0
    wide: bool = False

    @classmethod
    def dense(cls, shape, strides) -> Layout:
        return cls(tuple(shape), tuple(strides))

    @property
    def span(self) -> int:
        """Elements from the first to one past the last (0 for an empty tensor)."""
        if any(s == 0 for s in self.shape):
            return 0
        return 1 + sum((s - 1) * abs(st) for s, st in zip(self.shape, self.strides))
