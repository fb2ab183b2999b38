/* portconv kernel bodies: depthwise 3x3 on small NCHW planes, a block's planes staged in shared memory.
 *
 * Note [depthwise planes]: MobileNetV2's last depthwise layers have 7x7 (or 14x14) planes. The 'rows' kernels give a
 * thread one output row there, so a warp's loads and stores step 28 bytes a lane (7 float32): every access touches
 * about 7 times the sectors it uses, and the forward ran at 35% of the bandwidth floor where a copy of the same
 * bytes reaches 50%. Here a chunk is P whole planes (n, c) that lie back to back in X and in Y (NCHW-contiguous
 * tensors: plane p = n*C + c starts at p*H*W), so its source is one contiguous run of memory. A block, for each of
 * its chunks (chunk blockIdx.x and every gridDim.x-th after it):
 *   1. has the chunk's source planes copied into shared memory, 16 bytes a thread (cp.async where the GPU has it),
 *      one chunk ahead: the next chunk's copy is in flight, in the other of two buffers, while 2 and 3 run;
 *   2. forms its results into shared memory, a thread a result column (Note [plane columns]);
 *   3. copies the chunk's result planes out, 16 bytes a thread.
 * Every global access is a coalesced 16-byte vector wherever the run's ends are aligned (else one element a thread).
 * 3x3 taps, dilation 1, stride 1, channel multiplier 1. Backward-data is the same body over dY with the filter
 * flipped and padding 2 - P (FLIP); it adds the bias of a transposed forward as the forward adds its own. The host
 * (simt/depthwise.py dw_planes) picks P, passes it in a.chunk, sizes the grid, and builds the module with the shared
 * memory (PC_DWP_BYTES) and resident blocks (PC_DWP_MINB) of the view.
 *
 * Note [plane columns]: a thread walks down a result column with the 3 x 3 source window in registers, so a result
 * costs 3 shared loads (one new source row) and 9 products; the column's bounds are tested once, a row's once a
 * step. Row strips of PC_DW_V (the 'rows' kernels' unit) measured slower: on an H200, 14x14 planes 1.95x the time
 * of columns forward (docs/kernels/depthwise.md).
 */
#pragma once

#ifndef PC_DWP_BYTES
#define PC_DWP_BYTES 49152 /* shared memory of a block: 2 x P source planes, P result planes (dwp_build) */
#endif

#ifndef PC_DWP_MINB
#define PC_DWP_MINB 4 /* resident blocks an SM asked of ptxas (dwp_build: those the grid is sized for) */
#endif

typedef pc_vec<unsigned, 4> pc_dwp_v16;

/* The block copies count elements from src to dst, 16 bytes a thread where both are 16-byte aligned (ASYNC: into
 * shared memory by cp.async where the GPU has it, closed as one group; the rest of the elements one a thread). */
template <bool ASYNC>
PC_DEVICE void pc_dwp_copy(pc_t *dst, const pc_t *src, pc_idx count) {
    constexpr int VE = 16 / sizeof(pc_t);
    pc_idx done = 0;
    if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
        const pc_idx nv = count / VE;
        for (pc_idx i = (pc_idx)threadIdx.x; i < nv; i += (pc_idx)blockDim.x) {
            if (ASYNC)
                pc_cp_async<16>(dst + i * VE, src + i * VE, true);
            else
                pc_st_vec((pc_dwp_v16 *)(dst + i * VE), pc_ld_vec((const pc_dwp_v16 *)(src + i * VE)));
        }
        done = nv * VE;
    }
    for (pc_idx i = done + (pc_idx)threadIdx.x; i < count; i += (pc_idx)blockDim.x) dst[i] = src[i];
    if (ASYNC) pc_cp_async_commit();
}

/* The np result planes (D1 x D2, from plane p0 on) of the np source planes (S1 x S2) in sin, into sout, a thread a
 * result column (Note [plane columns]). */
template <bool FLIP>
PC_DEVICE void pc_dwp_columns(const pc_conv_args &a, const pc_t *sin, pc_t *sout, pc_idx p0, pc_idx np, pc_idx S1,
                              pc_idx S2, pc_idx D1, pc_idx D2) {
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    const pc_idx C = (pc_idx)a.C, sHW = S1 * S2, dHW = D1 * D2;
    const pc_idx p1 = FLIP ? 2 - (pc_idx)a.P[1] : (pc_idx)a.P[1];
    const pc_idx p2 = FLIP ? 2 - (pc_idx)a.P[2] : (pc_idx)a.P[2];
    const pc_idx ws3 = (pc_idx)a.ws_[3], ws4 = (pc_idx)a.ws_[4];
    for (pc_idx u = (pc_idx)threadIdx.x; u < np * D2; u += (pc_idx)blockDim.x) {
        const pc_idx pl = u / D2, o2 = u - pl * D2, c = (p0 + pl) % C, i2 = o2 - p2;
        pc_acc_t wt[3][3];
#pragma unroll
        for (int r1 = 0; r1 < 3; ++r1)
#pragma unroll
            for (int r2 = 0; r2 < 3; ++r2)
                wt[r1][r2] = pc_ld(w, c * (pc_idx)a.ws_[0] + (FLIP ? 2 - r1 : r1) * ws3 + (FLIP ? 2 - r2 : r2) * ws4);
        bool col[3];
#pragma unroll
        for (int t = 0; t < 3; ++t) col[t] = i2 + t >= 0 && i2 + t < S2;
        const pc_t *src = sin + pl * sHW + i2;
        pc_acc_t win[3][3];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const pc_idx i1 = r - p1;
#pragma unroll
            for (int t = 0; t < 3; ++t)
                win[r + 1][t] = i1 >= 0 && i1 < S1 && col[t] ? (pc_acc_t)pc_ld(src, i1 * S2 + t) : (pc_acc_t)0;
        }
        const pc_acc_t bias = b ? (pc_acc_t)pc_ld(b, c * (pc_idx)a.bs) : (pc_acc_t)0;
        for (pc_idx o1 = 0; o1 < D1; ++o1) {
            const pc_idx i1 = o1 - p1 + 2;
#pragma unroll
            for (int t = 0; t < 3; ++t) {
                win[0][t] = win[1][t];
                win[1][t] = win[2][t];
                win[2][t] = i1 >= 0 && i1 < S1 && col[t] ? (pc_acc_t)pc_ld(src, i1 * S2 + t) : (pc_acc_t)0;
            }
            pc_acc_t acc = bias;
#pragma unroll
            for (int r1 = 0; r1 < 3; ++r1)
#pragma unroll
                for (int r2 = 0; r2 < 3; ++r2) acc += win[r1][r2] * wt[r1][r2];
            pc_st(sout, pl * dHW + o1 * D2 + o2, acc);
        }
    }
}

/* A block's chunks of P planes (a.chunk), chunk blockIdx.x and every gridDim.x-th after it: the next chunk's source
 * is in flight (its own cp.async group, the other of two buffers) while the block forms this one's results. */
template <bool FLIP>
PC_DEVICE void pc_dw_planes(const pc_conv_args &a, const pc_t *PC_RESTRICT src, pc_t *PC_RESTRICT dst, pc_idx S1,
                            pc_idx S2, pc_idx D1, pc_idx D2) {
    PC_SHARED pc_dwp_v16 pool[PC_DWP_BYTES / 16];
    constexpr int VE = 16 / sizeof(pc_t);
    const pc_idx P = (pc_idx)a.chunk, planes = (pc_idx)a.N * (pc_idx)a.C, chunks = (planes + P - 1) / P;
    const pc_idx sHW = S1 * S2, dHW = D1 * D2, inw = (P * sHW + VE - 1) / VE * VE;
    pc_t *buf = (pc_t *)pool, *sout = buf + 2 * inw;
    pc_idx ch = (pc_idx)blockIdx.x;
    if (ch < chunks) pc_dwp_copy<true>(buf, src + ch * P * sHW, (planes - ch * P < P ? planes - ch * P : P) * sHW);
    for (int i = 0; ch < chunks; ch += (pc_idx)gridDim.x, i ^= 1) {
        const pc_idx p0 = ch * P, np = planes - p0 < P ? planes - p0 : P, nx = ch + (pc_idx)gridDim.x;
        if (nx < chunks) {
            pc_dwp_copy<true>(buf + (i ^ 1) * inw, src + nx * P * sHW,
                              (planes - nx * P < P ? planes - nx * P : P) * sHW);
            pc_cp_async_wait<1>();
        } else {
            pc_cp_async_wait<0>();
        }
        PC_BARRIER();
        pc_dwp_columns<FLIP>(a, buf + i * inw, sout, p0, np, S1, S2, D1, D2);
        PC_BARRIER();
        pc_dwp_copy<false>(dst + p0 * dHW, sout, np * dHW);
    }
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_planes)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWP_MINB) portconv_depthwise_fwd_planes(const pc_conv_args a) {
    pc_dw_planes<false>(a, (const pc_t *)a.x, (pc_t *)a.y, (pc_idx)a.X[1], (pc_idx)a.X[2], (pc_idx)a.Y[1],
                        (pc_idx)a.Y[2]);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_planes)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWP_MINB) portconv_depthwise_bwd_data_planes(const pc_conv_args a) {
    pc_dw_planes<true>(a, (const pc_t *)a.y, (pc_t *)a.x, (pc_idx)a.Y[1], (pc_idx)a.Y[2], (pc_idx)a.X[1],
                       (pc_idx)a.X[2]);
}
#endif
