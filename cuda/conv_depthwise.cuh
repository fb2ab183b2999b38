/* portconv kernel bodies: depthwise convolution (groups == C, K = m*C), all three directions (vendor-neutral).
 *
 * The channel multiplier m = K/C; output channel k reads input channel k/m. Forward and backward-data run the strip
 * kernels of conv_depthwise_rows.cuh (any filter) or the tile and planes kernels; the per-element weight gradient
 * here, for filters the 'rows' weight gradients do not take, keeps PC_DW_TAPS taps of one output channel in
 * registers so every dY element is read once per tap chunk instead of once per tap.
 */
#pragma once

#ifndef PC_DW_TAPS
#define PC_DW_TAPS 9
#endif

/* dW[k, 0, r] = sum over (n, o) of dY[n, k, o] * X[n, k/m, o*S - P + r*DL]. Grid (K * ceil(taps/PC_DW_TAPS),
 * splits): a block owns PC_DW_TAPS taps of one channel and one split of the N*Y0*Y1*Y2 positions. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight(const pc_conv_args a) {
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx m = (pc_idx)(a.K / a.C);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx taps = (pc_idx)a.R[0] * R1 * R2;
    const pc_idx chunks = (taps + PC_DW_TAPS - 1) / PC_DW_TAPS;
    const pc_idx k = (pc_idx)blockIdx.x / chunks, t0 = ((pc_idx)blockIdx.x - k * chunks) * PC_DW_TAPS;
    const pc_idx s = (pc_idx)blockIdx.y;
    pc_idx lo, hi;
    pc_split_range((pc_idx)a.N * Y0 * Y1 * Y2, (pc_idx)a.chunk, s, lo, hi);
    pc_idx d0[PC_DW_TAPS], d1[PC_DW_TAPS], d2[PC_DW_TAPS];
    pc_acc_t acc[PC_DW_TAPS];
#pragma unroll
    for (int t = 0; t < PC_DW_TAPS; ++t) {
        const pc_idx tap = t0 + t < taps ? t0 + t : taps - 1;
        const pc_idx r2 = tap % R2, r1 = (tap / R2) % R1, r0 = tap / (R2 * R1);
        d0[t] = r0 * (pc_idx)a.DL[0] - (pc_idx)a.P[0];
        d1[t] = r1 * (pc_idx)a.DL[1] - (pc_idx)a.P[1];
        d2[t] = r2 * (pc_idx)a.DL[2] - (pc_idx)a.P[2];
        acc[t] = 0;
    }
    const pc_idx xc = (k / m) * (pc_idx)a.xs[1], yc = k * (pc_idx)a.ys[1];
    for (pc_idx e = lo + (pc_idx)threadIdx.x; e < hi; e += (pc_idx)blockDim.x) {
        pc_idx n, o0, o1, o2;
        pc_unflatten4(e, Y0, Y1, Y2, n, o0, o1, o2);
        const pc_acc_t g = pc_ld(dy, yc + n * (pc_idx)a.ys[0] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3] +
                                         o2 * (pc_idx)a.ys[4]);
        const pc_idx xb = xc + n * (pc_idx)a.xs[0];
        const pc_idx b0 = o0 * (pc_idx)a.S[0], b1 = o1 * (pc_idx)a.S[1], b2 = o2 * (pc_idx)a.S[2];
#pragma unroll
        for (int t = 0; t < PC_DW_TAPS; ++t) {
            const pc_idx i0 = b0 + d0[t], i1 = b1 + d1[t], i2 = b2 + d2[t];
            if (i0 >= 0 && i0 < X0 && i1 >= 0 && i1 < X1 && i2 >= 0 && i2 < X2)
                acc[t] += g * pc_ld(x, xb + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3] + i2 * (pc_idx)a.xs[4]);
        }
    }
#pragma unroll
    for (int t = 0; t < PC_DW_TAPS; ++t) {
        const pc_acc_t v = pc_block_sum(acc[t]);
        const pc_idx tap = t0 + t;
        if (threadIdx.x == 0 && tap < taps) {
            if (a.splits == 1) {
                const pc_idx r2 = tap % R2, r1 = (tap / R2) % R1, r0 = tap / (R2 * R1);
                pc_st(dw, k * (pc_idx)a.ws_[0] + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4],
                      v);
            } else {
                ((pc_acc_t *)a.ws)[s * (pc_idx)a.K * taps + k * taps + tap] = v;
            }
        }
    }
}
#endif

/* The strip-per-thread kernels the host prefers where they apply (Note [depthwise rows]). */
#include "conv_depthwise_rows.cuh"
