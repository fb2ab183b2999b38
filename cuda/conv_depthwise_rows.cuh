/* portconv kernel bodies: depthwise "rows" kernels, PC_DW_V outputs along the innermost axis per thread.
 *
 * Note [depthwise rows]: the per-element kernels of conv_depthwise.cuh spend their time in index arithmetic
 * (five divisions per output) and re-read every input element R0*R1*R2 times through L1. Here one thread owns
 * a strip of PC_DW_V consecutive positions along the last spatial axis (one flat-index decomposition per
 * strip), and where that axis has 3 taps with dilation 1 (the S2 template argument: stride 1 or 2) it loads
 * the strip's input window once per kernel row into registers and forms all 3 x PC_DW_V products from it.
 * Any other kernel, stride or dilation runs the same strip loop with one bounds-checked load per product
 * (template argument 0). Strip order follows PC_FLAG_CL: channel innermost for channels-last data, so a
 * warp's loads stay coalesced in both layouts. The weight gradient keeps every tap of a 3x3 or 3x3x3 filter
 * in registers for one channel (grid (K, splits)): each dY and X element is read once per strip, not once
 * per tap chunk; partial sums go through the same deterministic split finalize as the other kernels.
 */
#pragma once

#ifndef PC_DW_V
#define PC_DW_V 4
#endif

/* Forward: Y[n, k, o] over strips of PC_DW_V along o2. S2 = 1 or 2: 3 taps along the last axis, dilation 1,
 * that stride; S2 = 0: any kernel, stride and dilation. */
template <int S2>
PC_DEVICE void pc_dw_fwd_rows(const pc_conv_args &a) {
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    pc_t *PC_RESTRICT y = (pc_t *)a.y;
    const pc_idx K = (pc_idx)a.K, m = (pc_idx)(a.K / a.C);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx xs4 = (pc_idx)a.xs[4], ws4 = (pc_idx)a.ws_[4];
    const pc_idx NS = (Y2 + PC_DW_V - 1) / PC_DW_V;
    const pc_idx total = (pc_idx)a.N * K * Y0 * Y1 * NS;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, k, o0, o1, s;
        pc_unflatten5(e, K, Y0, Y1, NS, cl, n, k, o0, o1, s);
        const pc_idx o2s = s * PC_DW_V;
        const pc_idx xb = n * (pc_idx)a.xs[0] + (k / m) * (pc_idx)a.xs[1];
        const pc_idx wb = k * (pc_idx)a.ws_[0];
        const pc_idx b0 = o0 * (pc_idx)a.S[0] - (pc_idx)a.P[0], b1 = o1 * (pc_idx)a.S[1] - (pc_idx)a.P[1];
        const pc_idx b2 = o2s * (pc_idx)a.S[2] - (pc_idx)a.P[2];
        pc_acc_t acc[PC_DW_V];
#pragma unroll
        for (int v = 0; v < PC_DW_V; ++v) acc[v] = 0;
        for (pc_idx r0 = 0; r0 < R0; ++r0) {
            const pc_idx i0 = b0 + r0 * (pc_idx)a.DL[0];
            if (i0 < 0 || i0 >= X0) continue;
            for (pc_idx r1 = 0; r1 < R1; ++r1) {
                const pc_idx i1 = b1 + r1 * (pc_idx)a.DL[1];
                if (i1 < 0 || i1 >= X1) continue;
                const pc_idx xr = xb + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3];
                const pc_idx wr = wb + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3];
                if (S2 > 0) {
                    constexpr int WIN = (PC_DW_V - 1) * (S2 > 0 ? S2 : 1) + 3;
                    pc_acc_t win[WIN];
#pragma unroll
                    for (int t = 0; t < WIN; ++t) {
                        const pc_idx i2 = b2 + t;
                        win[t] = (i2 >= 0 && i2 < X2) ? (pc_acc_t)pc_ld(x, xr + i2 * xs4) : (pc_acc_t)0;
                    }
                    const pc_acc_t w0 = pc_ld(w, wr), w1 = pc_ld(w, wr + ws4), w2 = pc_ld(w, wr + 2 * ws4);
#pragma unroll
                    for (int v = 0; v < PC_DW_V; ++v) {
                        acc[v] += win[v * S2] * w0;
                        acc[v] += win[v * S2 + 1] * w1;
                        acc[v] += win[v * S2 + 2] * w2;
                    }
                } else {
                    for (pc_idx r2 = 0; r2 < R2; ++r2) {
                        const pc_acc_t wv = pc_ld(w, wr + r2 * ws4);
#pragma unroll
                        for (int v = 0; v < PC_DW_V; ++v) {
                            const pc_idx i2 = b2 + v * (pc_idx)a.S[2] + r2 * (pc_idx)a.DL[2];
                            if (i2 >= 0 && i2 < X2) acc[v] += pc_ld(x, xr + i2 * xs4) * wv;
                        }
                    }
                }
            }
        }
        const pc_acc_t bias = b ? (pc_acc_t)pc_ld(b, k * (pc_idx)a.bs) : (pc_acc_t)0;
        const pc_idx yb = n * (pc_idx)a.ys[0] + k * (pc_idx)a.ys[1] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3];
#pragma unroll
        for (int v = 0; v < PC_DW_V; ++v)
            if (o2s + v < Y2) pc_st(y, yb + (o2s + v) * (pc_idx)a.ys[4], acc[v] + bias);
    }
}

/* Backward-data: dX[n, c, i] over strips of PC_DW_V along i2. MODE 1: 3 taps along the last axis, stride 1,
 * dilation 1 (the correlation with the flipped filter, from a register window of dY). MODE 2 + PB: the same
 * taps with stride 2, P2 of parity PB: a strip starts at an even i2, so which taps hit an output (i2 + P2 - r2
 * even) and where in a PC_DW_V/2 + 2 window of dY they land are compile-time (no parity test per product).
 * MODE 0: any geometry. */
template <int MODE>
PC_DEVICE void pc_dw_bwd_data_rows(const pc_conv_args &a) {
    static_assert(PC_DW_V % 2 == 0, "the stride-2 window needs even strips");
    pc_t *PC_RESTRICT dx = (pc_t *)a.x;
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx C = (pc_idx)a.C, m = (pc_idx)(a.K / a.C);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx ys4 = (pc_idx)a.ys[4], ws4 = (pc_idx)a.ws_[4];
    const pc_idx NS = (X2 + PC_DW_V - 1) / PC_DW_V;
    const pc_idx total = (pc_idx)a.N * C * X0 * X1 * NS;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, c, i0, i1, s;
        pc_unflatten5(e, C, X0, X1, NS, cl, n, c, i0, i1, s);
        const pc_idx i2s = s * PC_DW_V;
        const pc_idx yb = n * (pc_idx)a.ys[0] + c * m * (pc_idx)a.ys[1];
        const pc_idx wb = c * m * (pc_idx)a.ws_[0];
        pc_acc_t acc[PC_DW_V];
#pragma unroll
        for (int v = 0; v < PC_DW_V; ++v) acc[v] = 0;
        for (pc_idx r0 = 0; r0 < R0; ++r0) {
            pc_idx o0, o1;
            if (!pc_out_of(i0, r0, (pc_idx)a.S[0], (pc_idx)a.P[0], (pc_idx)a.DL[0], Y0, o0)) continue;
            for (pc_idx r1 = 0; r1 < R1; ++r1) {
                if (!pc_out_of(i1, r1, (pc_idx)a.S[1], (pc_idx)a.P[1], (pc_idx)a.DL[1], Y1, o1)) continue;
                for (pc_idx j = 0; j < m; ++j) {
                    const pc_idx yr = yb + j * (pc_idx)a.ys[1] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3];
                    const pc_idx wr = wb + j * (pc_idx)a.ws_[0] + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3];
                    if (MODE >= 2) {
                        /* i2 + P2 - r2 = 2*ob + q with q = PB + 2 + v - r2 (compile-time): a tap hits output
                         * o2 = ob + q/2 exactly when q is even */
                        constexpr int PB = MODE - 2, WIN2 = PC_DW_V / 2 + 2;
                        const pc_idx ob = (i2s + (pc_idx)a.P[2] - 2 - PB) / 2;
                        pc_acc_t win[WIN2];
#pragma unroll
                        for (int t = 0; t < WIN2; ++t) {
                            const pc_idx o2 = ob + t;
                            win[t] = (o2 >= 0 && o2 < Y2) ? (pc_acc_t)pc_ld(dy, yr + o2 * ys4) : (pc_acc_t)0;
                        }
                        const pc_acc_t wt[3] = {(pc_acc_t)pc_ld(w, wr), (pc_acc_t)pc_ld(w, wr + ws4),
                                                (pc_acc_t)pc_ld(w, wr + 2 * ws4)};
#pragma unroll
                        for (int v = 0; v < PC_DW_V; ++v)
#pragma unroll
                            for (int r2 = 0; r2 < 3; ++r2)
                                if ((PB + 2 + v - r2) % 2 == 0) acc[v] += win[(PB + 2 + v - r2) / 2] * wt[r2];
                    } else if (MODE == 1) {
                        /* o2 = i2 + P2 - r2: window t holds dY at o2 = i2s + P2 - 2 + t */
                        const pc_idx ob = i2s + (pc_idx)a.P[2] - 2;
                        pc_acc_t win[PC_DW_V + 2];
#pragma unroll
                        for (int t = 0; t < PC_DW_V + 2; ++t) {
                            const pc_idx o2 = ob + t;
                            win[t] = (o2 >= 0 && o2 < Y2) ? (pc_acc_t)pc_ld(dy, yr + o2 * ys4) : (pc_acc_t)0;
                        }
                        const pc_acc_t w0 = pc_ld(w, wr), w1 = pc_ld(w, wr + ws4), w2 = pc_ld(w, wr + 2 * ws4);
#pragma unroll
                        for (int v = 0; v < PC_DW_V; ++v) {
                            acc[v] += win[v + 2] * w0;
                            acc[v] += win[v + 1] * w1;
                            acc[v] += win[v] * w2;
                        }
                    } else {
                        for (pc_idx r2 = 0; r2 < R2; ++r2) {
                            const pc_acc_t wv = pc_ld(w, wr + r2 * ws4);
#pragma unroll
                            for (int v = 0; v < PC_DW_V; ++v) {
                                pc_idx o2;
                                if (pc_out_of(i2s + v, r2, (pc_idx)a.S[2], (pc_idx)a.P[2], (pc_idx)a.DL[2], Y2, o2))
                                    acc[v] += pc_ld(dy, yr + o2 * ys4) * wv;
                            }
                        }
                    }
                }
            }
        }
        const pc_acc_t bias = b ? (pc_acc_t)pc_ld(b, c * (pc_idx)a.bs) : (pc_acc_t)0;
        const pc_idx xb = n * (pc_idx)a.xs[0] + c * (pc_idx)a.xs[1] + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3];
#pragma unroll
        for (int v = 0; v < PC_DW_V; ++v)
            if (i2s + v < X2) pc_st(dx, xb + (i2s + v) * (pc_idx)a.xs[4], acc[v] + bias);
    }
}

/* Backward-weight for R0 x 3 x 3 filters (R0 = 1 or 3 at compile time), dilation 1 and stride S2 (1 or 2)
 * along the last axis. Grid (K, splits): a block owns every tap of channel k and one split of the
 * N*Y0*Y1*NS strips (a.chunk strips each). */
template <int R0, int S2>
PC_DEVICE void pc_dw_bwd_weight_rows(const pc_conv_args &a) {
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    constexpr int TAPS = R0 * 9, WIN = (PC_DW_V - 1) * S2 + 3;
    const pc_idx m = (pc_idx)(a.K / a.C);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx xs4 = (pc_idx)a.xs[4], ys4 = (pc_idx)a.ys[4];
    const pc_idx NS = (Y2 + PC_DW_V - 1) / PC_DW_V;
    const pc_idx k = (pc_idx)blockIdx.x, s = (pc_idx)blockIdx.y;
    pc_idx lo, hi;
    pc_split_range((pc_idx)a.N * Y0 * Y1 * NS, (pc_idx)a.chunk, s, lo, hi);
    pc_acc_t acc[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = 0;
    const pc_idx xc = (k / m) * (pc_idx)a.xs[1], yc = k * (pc_idx)a.ys[1];
    for (pc_idx e = lo + (pc_idx)threadIdx.x; e < hi; e += (pc_idx)blockDim.x) {
        pc_idx n, o0, o1, st;
        pc_unflatten4(e, Y0, Y1, NS, n, o0, o1, st);
        const pc_idx o2s = st * PC_DW_V;
        const pc_idx yr = yc + n * (pc_idx)a.ys[0] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3];
        pc_acc_t g[PC_DW_V];
#pragma unroll
        for (int v = 0; v < PC_DW_V; ++v)
            g[v] = o2s + v < Y2 ? (pc_acc_t)pc_ld(dy, yr + (o2s + v) * ys4) : (pc_acc_t)0;
        const pc_idx xb = xc + n * (pc_idx)a.xs[0];
        const pc_idx b2 = o2s * S2 - (pc_idx)a.P[2];
#pragma unroll
        for (int r0 = 0; r0 < R0; ++r0) {
            const pc_idx i0 = o0 * (pc_idx)a.S[0] - (pc_idx)a.P[0] + r0 * (pc_idx)a.DL[0];
#pragma unroll
            for (int r1 = 0; r1 < 3; ++r1) {
                const pc_idx i1 = o1 * (pc_idx)a.S[1] - (pc_idx)a.P[1] + r1 * (pc_idx)a.DL[1];
                if (i0 < 0 || i0 >= X0 || i1 < 0 || i1 >= X1) continue;
                const pc_idx xr = xb + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3];
                pc_acc_t win[WIN];
#pragma unroll
                for (int t = 0; t < WIN; ++t) {
                    const pc_idx i2 = b2 + t;
                    win[t] = (i2 >= 0 && i2 < X2) ? (pc_acc_t)pc_ld(x, xr + i2 * xs4) : (pc_acc_t)0;
                }
#pragma unroll
                for (int r2 = 0; r2 < 3; ++r2)
#pragma unroll
                    for (int v = 0; v < PC_DW_V; ++v) acc[(r0 * 3 + r1) * 3 + r2] += g[v] * win[v * S2 + r2];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        const pc_acc_t v = pc_block_sum(acc[t]);
        if (threadIdx.x == 0) {
            if (a.splits == 1) {
                const pc_idx r2 = t % 3, r1 = (t / 3) % 3, r0 = t / 9;
                pc_st(dw, k * (pc_idx)a.ws_[0] + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4],
                      v);
            } else {
                ((pc_acc_t *)a.ws)[s * (pc_idx)a.K * TAPS + k * TAPS + t] = v;
            }
        }
    }
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_rows)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_rows(const pc_conv_args a) { pc_dw_fwd_rows<0>(a); }
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_rows3s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_rows3s1(const pc_conv_args a) { pc_dw_fwd_rows<1>(a); }
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_rows3s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_rows3s2(const pc_conv_args a) { pc_dw_fwd_rows<2>(a); }
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_rows)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_rows(const pc_conv_args a) {
    pc_dw_bwd_data_rows<0>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_rows3s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_rows3s1(const pc_conv_args a) {
    pc_dw_bwd_data_rows<1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_rows3s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_rows3s2(const pc_conv_args a) {
    if (a.P[2] & 1)
        pc_dw_bwd_data_rows<3>(a);
    else
        pc_dw_bwd_data_rows<2>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_rows2d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_rows2d_s1(const pc_conv_args a) {
    pc_dw_bwd_weight_rows<1, 1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_rows2d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_rows2d_s2(const pc_conv_args a) {
    pc_dw_bwd_weight_rows<1, 2>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_rows3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_rows3d_s1(const pc_conv_args a) {
    pc_dw_bwd_weight_rows<3, 1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_rows3d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_rows3d_s2(const pc_conv_args a) {
    pc_dw_bwd_weight_rows<3, 2>(a);
}
#endif
