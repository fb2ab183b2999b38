/* portconv kernel bodies: warp/block sums, bias gradient and the split-reduction finalizer (vendor-neutral).
 *
 * Note [warp-size-neutral reductions]: the shuffle loop starts at PC_WARP_SIZE/2, so it folds 64 lanes on
 * wave64 and 32 on NVIDIA and RDNA; the block sum sizes its partials for the smallest warp (32) and the
 * largest block (1024). Blocks must be a multiple of PC_WARP_SIZE threads (the host launches 256).
 */
#pragma once

template <typename T>
PC_DEVICE T pc_warp_sum(T v) {
#pragma unroll
    for (int off = PC_WARP_SIZE / 2; off > 0; off >>= 1) v += pc_shfl_down(v, off);
    return v;
}

/* Sum over the block; the result is valid in thread 0. Every thread must call it (it has barriers). */
template <typename T>
PC_DEVICE T pc_block_sum(T v) {
    PC_SHARED T part[1024 / 32];
    const int lane = (int)threadIdx.x % PC_WARP_SIZE;
    const int warp = (int)threadIdx.x / PC_WARP_SIZE;
    const int nwarps = ((int)blockDim.x + PC_WARP_SIZE - 1) / PC_WARP_SIZE;
    v = pc_warp_sum(v);
    if (lane == 0) part[warp] = v;
    PC_BARRIER();
    if (warp == 0) {
        v = lane < nwarps ? part[lane] : (T)0;
        v = pc_warp_sum(v);
    }
    PC_BARRIER(); /* part[] may be reused by the next call */
    return v;
}

/* The reduction range of split s: [lo, hi) within [0, total). */
PC_DEVICE void pc_split_range(pc_idx total, pc_idx chunk, pc_idx s, pc_idx &lo, pc_idx &hi) {
    lo = s * chunk;
    hi = lo + chunk < total ? lo + chunk : total;
}

/* grad_bias[k] = sum over (n, spatial) of dY[n, k, ...]. Grid (K, splits); with one split it writes the
 * result, with several it writes partial sums to ws[s*K + k] for portconv_split_finalize. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_bias_grad)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_bias_grad(const pc_conv_args a) {
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx K = (pc_idx)a.K, Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx total = (pc_idx)a.N * Y0 * Y1 * Y2;
    const pc_idx k = (pc_idx)blockIdx.x, s = (pc_idx)blockIdx.y;
    pc_idx lo, hi;
    pc_split_range(total, (pc_idx)a.chunk, s, lo, hi);
    const pc_idx base = k * (pc_idx)a.ys[1];
    pc_acc_t acc = 0;
    for (pc_idx e = lo + (pc_idx)threadIdx.x; e < hi; e += (pc_idx)blockDim.x) {
        pc_idx n, o0, o1, o2;
        pc_unflatten4(e, Y0, Y1, Y2, n, o0, o1, o2);
        acc += pc_ld(dy, base + n * (pc_idx)a.ys[0] + o0 * (pc_idx)a.ys[2] + o1 * (pc_idx)a.ys[3] +
                             o2 * (pc_idx)a.ys[4]);
    }
    acc = pc_block_sum(acc);
    if (threadIdx.x == 0) {
        if (a.splits == 1)
            pc_st((pc_t *)a.b, k * (pc_idx)a.bs, acc);
        else
            ((pc_acc_t *)a.ws)[s * K + k] = acc;
    }
}
#endif

/* dst[k, c, r0, r1, r2] = sum over s of ws[s*count + flat(k, c, r0, r1, r2)], count = K*C*R0*R1*R2, where
 * dst is a.w with strides a.ws_ (a weight gradient, or a bias gradient described as K x 1 x 1 x 1 x 1).
 * Note [warp finalize]: with PC_FLAG_WARP (the host's choice, simt/view.py Launches.finalize: many splits, few values)
 * one warp sums one value: lane l adds splits l, l + W, ... in order, then pc_warp_sum folds the lanes in its fixed
 * order, so the result is deterministic and the warp waits for about one load instead of `splits` dependent
 * additions. Without it one thread sums a value, the splits in order: consecutive threads read consecutive values,
 * so every load of a warp is one coalesced line, where a warp a value touches one line per split (measured on
 * H100: a warp a value made the weight gradient of a dense row with 73728 values 1.32x slower;
 * docs/kernels/depthwise.md).
 * Either way grid-stride: any grid is correct. It may be a dependent launch (Note [dependent launch]):
 * nothing is read before pc_grid_dependency_wait. The splits' partials meet in double (Note [long reductions] in
 * portconv/conformance/longred.py): float32 partials of whole counts add exactly (2.4e9 ones), at no cost that shows
 * (a few values, read once). */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_split_finalize)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_split_finalize(const pc_conv_args a) {
    pc_grid_dependency_wait();
    const pc_acc_t *PC_RESTRICT ws = (const pc_acc_t *)a.ws;
    pc_t *dst = (pc_t *)a.w;
    const pc_idx C = (pc_idx)a.C, R0 = (pc_idx)a.R[0], R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2];
    const pc_idx count = (pc_idx)a.K * C * R0 * R1 * R2;
    const pc_idx splits = (pc_idx)a.splits;
    const bool warp = (a.flags & PC_FLAG_WARP) != 0; /* uniform over the launch */
    const pc_idx W = warp ? PC_WARP_SIZE : 1, lane = (pc_idx)threadIdx.x % W;
    for (pc_idx e = pc_global_id() / W; e < count; e += pc_grid_stride() / W) { /* whole warps take one e */
        double acc = 0;
        for (pc_idx s = lane; s < splits; s += W) acc += (double)ws[s * count + e];
        if (warp) acc = pc_warp_sum(acc);
        if (lane != 0) continue;
        pc_idx k, c, r0, r1, r2;
        pc_unflatten5(e, C, R0, R1, R2, false, k, c, r0, r1, r2);
        pc_st(dst, k * (pc_idx)a.ws_[0] + c * (pc_idx)a.ws_[1] + r0 * (pc_idx)a.ws_[2] + r1 * (pc_idx)a.ws_[3] +
                       r2 * (pc_idx)a.ws_[4],
              (pc_acc_t)acc);
    }
}
#endif
