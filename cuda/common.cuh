/* portconv kernel bodies: the argument block every kernel takes, and index helpers (vendor-neutral).
 *
 * Note [conv view]: every kernel sees one canonical convolution Y = conv(X, W): X is (N, C, X0, X1, X2),
 * W is (K, C/G, R0, R1, R2), Y is (N, K, Y0, Y1, Y2), with stride S, low padding P and dilation DL; 1-D and
 * 2-D problems have leading extents of 1. The host maps every direction onto it: forward is fwd(X, W) -> Y;
 * grad_input is bwd_data(dY, W) -> dX; grad_weight is bwd_weight(X, dY) -> dW; grad_bias reduces dY. A
 * transposed convolution is the same view with the roles swapped (its input plays dY, its output plays dX).
 * High-side padding ('same' with an even kernel) needs nothing here: the extents say where Y ends.
 *
 * Shapes and strides (in elements) arrive as kernel arguments, so one compiled module per dtype, index width
 * and tile configuration serves every shape and every memory layout (contiguous, channels-last, any view).
 */
#pragma once

/* The host packs this block as int64 values in exactly this order (portconv/backends/simt/view.py, ARG_FIELDS;
 * tests/test_cuda_compile.py checks that the two lists agree). Passed by value as one kernel argument. */
struct pc_conv_args {
    long long x, w, y, b, ws;   /* device addresses of X, W, Y, bias (or grad_bias), fp32/fp64 workspace */
    long long N, C, K, G;       /* batch, X channels, Y channels, groups */
    long long X[3], Y[3], R[3]; /* spatial extents of X, Y and the kernel */
    long long S[3], P[3], DL[3];
    long long xs[5], ws_[5], ys[5]; /* strides of X, W, Y */
    long long bs;               /* stride of the bias / grad_bias vector */
    long long splits, chunk;    /* reduction split: number of partial sums and the length each covers */
    long long flags;            /* PC_FLAG_* */
};

#define PC_FLAG_CL 1 /* X/Y are channels-last: order threads (and reductions) with the channel innermost */
#define PC_FLAG_VA 2 /* Note [vector gathers]: A may be read 16 bytes at a time (host-checked strides, alignment) */
#define PC_FLAG_VB 4 /* ... and B too */
#define PC_FLAG_WARP 8 /* Note [warp finalize] (reduce.cuh): portconv_split_finalize sums a value with a warp */
#define PC_FLAG_COLTAP 16 /* Note [narrow backward-data] (conv_igemm.cuh): portconv_col2im's columns are (tap, c) */

/* Decompose a flat index over (N, CH, E0, E1, E2), channel innermost when cl, spatial innermost otherwise. */
PC_DEVICE void pc_unflatten5(pc_idx e, pc_idx CH, pc_idx E0, pc_idx E1, pc_idx E2, bool cl, pc_idx &n, pc_idx &ch,
                             pc_idx &e0, pc_idx &e1, pc_idx &e2) {
    if (cl) {
        ch = e % CH;
        e /= CH;
        e2 = e % E2;
        e /= E2;
        e1 = e % E1;
        e /= E1;
        e0 = e % E0;
        n = e / E0;
    } else {
        e2 = e % E2;
        e /= E2;
        e1 = e % E1;
        e /= E1;
        e0 = e % E0;
        e /= E0;
        ch = e % CH;
        n = e / CH;
    }
}

/* Decompose a flat index over (N, E0, E1, E2): one output position of one sample. */
PC_DEVICE void pc_unflatten4(pc_idx e, pc_idx E0, pc_idx E1, pc_idx E2, pc_idx &n, pc_idx &e0, pc_idx &e1,
                             pc_idx &e2) {
    e2 = e % E2;
    e /= E2;
    e1 = e % E1;
    e /= E1;
    e0 = e % E0;
    n = e / E0;
}

/* The output index o with o*S - P + r*DL == i, if one exists in [0, O). */
PC_DEVICE bool pc_out_of(pc_idx i, pc_idx r, pc_idx S, pc_idx P, pc_idx DL, pc_idx O, pc_idx &o) {
    const pc_idx t = i + P - r * DL;
    if (t < 0) return false;
    if (S == 1) {
        o = t;
    } else {
        o = t / S;
        if (o * S != t) return false;
    }
    return o < O;
}

PC_DEVICE pc_idx pc_grid_stride() { return (pc_idx)gridDim.x * (pc_idx)blockDim.x; }
PC_DEVICE pc_idx pc_global_id() { return (pc_idx)blockIdx.x * (pc_idx)blockDim.x + (pc_idx)threadIdx.x; }
