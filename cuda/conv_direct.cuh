/* portconv kernel bodies: the general direct convolution, all three directions (vendor-neutral).
 *
 * Any groups, stride, padding, dilation and strides; one thread per output element for forward and
 * backward-data, one block per weight element (times the reduction splits) for backward-weight.
 */
#pragma once

/* Y[n, k, o] = sum over (c, r) of X[n, g*Cg + c, o*S - P + r*DL] * W[k, c, r] (+ bias[k]). */
PC_DEVICE void pc_direct_fwd(const pc_conv_args &a) {
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    pc_t *PC_RESTRICT y = (pc_t *)a.y;
    const pc_idx K = (pc_idx)a.K, Cg = (pc_idx)(a.C / a.G), Kg = (pc_idx)(a.K / a.G);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx total = (pc_idx)a.N * K * Y0 * Y1 * Y2;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, k, o0, o1, o2;
        pc_unflatten5(e, K, Y0, Y1, Y2, cl, n, k, o0, o1, o2);
        const pc_idx g = k / Kg;
        const pc_idx xb = n * (pc_idx)a.xs[0] + g * Cg * (pc_idx)a.xs[1];
        const pc_idx wb = k * (pc_idx)a.ws_[0];
        pc_acc_t acc = 0;
        for (pc_idx r0 = 0; r0 < R0; ++r0) {
            const pc_idx i0 = o0 * (pc_idx)a.S[0] - (pc_idx)a.P[0] + r0 * (pc_idx)a.DL[0];
            if (i0 < 0 || i0 >= X0) continue;
            for (pc_idx r1 = 0; r1 < R1; ++r1) {
                const pc_idx i1 = o1 * (pc_idx)a.S[1] - (pc_idx)a.P[1] + r1 * (pc_idx)a.DL[1];
                if (i1 < 0 || i1 >= X1) continue;
                for (pc_idx r2 = 0; r2 < R2; ++r2) {
                    const pc_idx i2 = o2 * (pc_idx)a.S[2] - (pc_idx)a.P[2] + r2 * (pc_idx)a.DL[2];
                    if (i2 < 0 || i2 >= X2) continue;
                    const pc_idx xp = xb + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3] + i2 * (pc_idx)a.xs[4];
                    const pc_idx wp = wb + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4];
                    for (pc_idx c = 0; c < Cg; ++c)
                        acc += pc_ld(x, xp + c * (pc_idx)a.xs[1]) * pc_ld(w, wp + c * (pc_idx)a.ws_[1]);
                }
            }
        }
        if (b) acc += pc_ld(b, k * (pc_idx)a.bs);
        pc_st(y, n * (pc_idx)a.ys[0] + k * (pc_idx)a.ys[1] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3] +
                     o2 * (pc_idx)a.ys[4],
              acc);
    }
}

/* dX[n, c, i] = sum over (k in c's group, r) with o*S - P + r*DL == i of dY[n, k, o] * W[k, c, r] (+ bias[c],
 * which only the transposed forward passes). a.x is dX, a.y is dY. */
PC_DEVICE void pc_direct_bwd_data(const pc_conv_args &a) {
    pc_t *PC_RESTRICT dx = (pc_t *)a.x;
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx C = (pc_idx)a.C, Cg = (pc_idx)(a.C / a.G), Kg = (pc_idx)(a.K / a.G);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx total = (pc_idx)a.N * C * X0 * X1 * X2;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, ci, i0, i1, i2;
        pc_unflatten5(e, C, X0, X1, X2, cl, n, ci, i0, i1, i2);
        const pc_idx g = ci / Cg, c = ci - g * Cg;
        const pc_idx yb = n * (pc_idx)a.ys[0] + g * Kg * (pc_idx)a.ys[1];
        const pc_idx wb = g * Kg * (pc_idx)a.ws_[0] + c * (pc_idx)a.ws_[1];
        pc_acc_t acc = 0;
        for (pc_idx r0 = 0; r0 < R0; ++r0) {
            pc_idx o0, o1, o2;
            if (!pc_out_of(i0, r0, (pc_idx)a.S[0], (pc_idx)a.P[0], (pc_idx)a.DL[0], Y0, o0)) continue;
            for (pc_idx r1 = 0; r1 < R1; ++r1) {
                if (!pc_out_of(i1, r1, (pc_idx)a.S[1], (pc_idx)a.P[1], (pc_idx)a.DL[1], Y1, o1)) continue;
                for (pc_idx r2 = 0; r2 < R2; ++r2) {
                    if (!pc_out_of(i2, r2, (pc_idx)a.S[2], (pc_idx)a.P[2], (pc_idx)a.DL[2], Y2, o2)) continue;
                    const pc_idx yp = yb + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3] + o2 * (pc_idx)a.ys[4];
                    const pc_idx wp = wb + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4];
                    for (pc_idx k = 0; k < Kg; ++k)
                        acc += pc_ld(dy, yp + k * (pc_idx)a.ys[1]) * pc_ld(w, wp + k * (pc_idx)a.ws_[0]);
                }
            }
        }
        if (b) acc += pc_ld(b, ci * (pc_idx)a.bs);
        pc_st(dx, n * (pc_idx)a.xs[0] + ci * (pc_idx)a.xs[1] + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3] +
                      i2 * (pc_idx)a.xs[4],
              acc);
    }
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_direct_fwd)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_direct_fwd(const pc_conv_args a) { pc_direct_fwd(a); }
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_direct_bwd_data)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_direct_bwd_data(const pc_conv_args a) { pc_direct_bwd_data(a); }
#endif

/* dW[k, c, r] = sum over (n, o) of dY[n, k, o] * X[n, g*Cg + c, o*S - P + r*DL]. Grid (blocks over weight
 * elements, splits); each block reduces split blockIdx.y of the N*Y0*Y1*Y2 products of its element. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_direct_bwd_weight)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_direct_bwd_weight(const pc_conv_args a) {
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx Cg = (pc_idx)(a.C / a.G), Kg = (pc_idx)(a.K / a.G);
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx count = (pc_idx)a.K * Cg * R0 * R1 * R2;
    const pc_idx total = (pc_idx)a.N * Y0 * Y1 * Y2;
    const pc_idx s = (pc_idx)blockIdx.y;
    pc_idx lo, hi;
    pc_split_range(total, (pc_idx)a.chunk, s, lo, hi);
    for (pc_idx e = (pc_idx)blockIdx.x; e < count; e += (pc_idx)gridDim.x) {
        pc_idx k, c, r0, r1, r2;
        pc_unflatten5(e, Cg, R0, R1, R2, false, k, c, r0, r1, r2);
        const pc_idx g = k / Kg;
        const pc_idx d0 = r0 * (pc_idx)a.DL[0] - (pc_idx)a.P[0];
        const pc_idx d1 = r1 * (pc_idx)a.DL[1] - (pc_idx)a.P[1];
        const pc_idx d2 = r2 * (pc_idx)a.DL[2] - (pc_idx)a.P[2];
        const pc_idx xb = (g * Cg + c) * (pc_idx)a.xs[1], yb = k * (pc_idx)a.ys[1];
        pc_acc_t acc = 0;
        for (pc_idx t = lo + (pc_idx)threadIdx.x; t < hi; t += (pc_idx)blockDim.x) {
            pc_idx n, o0, o1, o2;
            pc_unflatten4(t, Y0, Y1, Y2, n, o0, o1, o2);
            const pc_idx i0 = o0 * (pc_idx)a.S[0] + d0, i1 = o1 * (pc_idx)a.S[1] + d1;
            const pc_idx i2 = o2 * (pc_idx)a.S[2] + d2;
            if (i0 < 0 || i0 >= X0 || i1 < 0 || i1 >= X1 || i2 < 0 || i2 >= X2) continue;
            acc += pc_ld(dy, yb + n * (pc_idx)a.ys[0] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3] +
                                 o2 * (pc_idx)a.ys[4]) *
                   pc_ld(x, xb + n * (pc_idx)a.xs[0] + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3] +
                                i2 * (pc_idx)a.xs[4]);
        }
        acc = pc_block_sum(acc);
        if (threadIdx.x == 0) {
            if (a.splits == 1)
                pc_st(dw, k * (pc_idx)a.ws_[0] + c * (pc_idx)a.ws_[1] + r0 * (pc_idx)a.ws_[2] +
                              r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4],
                      acc);
            else
                ((pc_acc_t *)a.ws)[s * count + e] = acc;
        }
    }
}
#endif
