"""A depthwise conv2d forward in Triton (triton.jit), trained with portconv's gradients.

    import dwconv_triton                                      # from this folder (or with it on sys.path)
    y = dwconv_triton.dw_forward(x, w, b, 1, 1, 1, groups)    # F.conv2d's signature, on GPU torch tensors

portconv.custom_forward makes ``dw_forward`` the torch op ``example_triton::dw_forward``: autograd through
portconv.convolution_backward on the tensors' vendor, torch.compile, autocast, PyTorch's argument checks. Problems
``supports`` rejects run portconv's own forward instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import portconv

DTYPES = ("float32", "float16", "bfloat16")
TILE = 512  # outputs a program computes (BLOCK_P x BLOCK_Q)
GRID_Y = 65535  # the largest grid y extent: tiles of one output plane


_SIZES = ["C", "M", "H", "W", "P", "Q", "SH", "SW", "PH", "PW", "DH", "DW", "R", "S"]


@triton.jit(do_not_specialize=_SIZES)
def _dw_forward(x_ptr, w_ptr, b_ptr, y_ptr, C, M, H, W, P, Q, SH, SW, PH, PW, DH, DW, R, S,
                HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr):
    # Note [triton depthwise]: x (N, C, H, W), w (C*M, 1, R, S), y (N, C*M, P, Q), all contiguous. Program (plane,
    # tile): plane = n * K + k on grid axis 0, the tile's BLOCK_P x BLOCK_Q outputs of that plane on axis 1. The
    # R x S taps are runtime loops and no size is specialised (do_not_specialize), so one binary per dtype, bias
    # and tile shape serves every problem; the sum runs in float32 in (r, s) order over masked loads that read 0
    # outside the input plane, and is rounded to y's type once. Offsets inside a plane are 32-bit (supports() keeps
    # planes under 2^31 elements), plane offsets 64-bit.
    plane = tl.program_id(0)
    tile = tl.program_id(1)
    K = C * M
    k = plane % K
    n = plane // K
    tiles_q = tl.cdiv(Q, BLOCK_Q)
    p = (tile // tiles_q) * BLOCK_P + tl.arange(0, BLOCK_P)[:, None]
    q = (tile % tiles_q) * BLOCK_Q + tl.arange(0, BLOCK_Q)[None, :]
    x_plane = x_ptr + (n * C + k // M).to(tl.int64) * H * W
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    for r in range(R):
        h = p * SH - PH + r * DH
        for s in range(S):
            v = q * SW - PW + s * DW
            inside = (h >= 0) & (h < H) & (v >= 0) & (v < W)
            xv = tl.load(x_plane + h * W + v, mask=inside, other=0.0)
            wv = tl.load(w_ptr + k * (R * S) + (r * S + s))
            acc += xv.to(tl.float32) * wv.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + k).to(tl.float32)
    y = y_ptr + plane.to(tl.int64) * P * Q + p * Q + q
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(p < P) & (q < Q))


def _blocks(p: int, q: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_Q, tiles of a P x Q plane): TILE outputs, 16 or 64 wide (two tile shapes, two binaries)."""
    bq = 16 if q <= 16 else 64
    bp = TILE // bq
    return bp, bq, triton.cdiv(p, bp) * triton.cdiv(q, bq)


def supports(problem) -> bool:
    """What _dw_forward computes: 2-D depthwise (any channel multiplier, kernel size, stride, padding, dilation),
    contiguous NCHW input and weight as GPU torch tensors in float32, float16 or bfloat16 (summed in float32), planes
    under 2^31 elements whose tiles fit a grid's y extent."""
    x, w, params = problem.input, problem.weight, problem.params
    if params.rank != 2:
        return False
    p, q = problem.output_shape[2:]
    return (problem.is_depthwise and problem.dtype in DTYPES and x.device_type == "cuda"
            and x.kind == "torch" and x.is_contiguous() and w.is_contiguous()
            and max(x.shape[2] * x.shape[3], p * q) < 2**31 and _blocks(p, q)[2] <= GRID_Y)


@portconv.custom_forward("example_triton::dw_forward", supports=supports, rank=2)
def dw_forward(input, weight, bias, stride, padding, dilation, groups):
    n, c, h, w = input.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    out = torch.empty((n, k, p, q), dtype=input.dtype, device=input.device)
    if out.numel() == 0:
        return out
    bp, bq, tiles = _blocks(p, q)
    with torch.cuda.device(input.device):  # Triton launches on the current device's current stream
        _dw_forward[(n * k, tiles)](input, weight, weight if bias is None else bias.contiguous(), out, c, k // c, h, w,
                                    p, q, *stride, *padding, *dilation, r, s, HAS_BIAS=bias is not None,
                                    BLOCK_P=bp, BLOCK_Q=bq)
    return out
