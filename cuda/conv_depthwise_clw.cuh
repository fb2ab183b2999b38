/* portconv kernel bodies: depthwise "clw" kernels, channels-last 2-D filters of 2 to 9 taps an axis, threads over
 * channels.
 *
 * Note [depthwise clw]: in channels-last data the C values of one position are contiguous, so lanes that take
 * consecutive groups of VC channels (PC_DWT_VC: four 16-bit values or two float32 in one 64-bit access, one float64)
 * read and write whole cache lines with no gather. A block is CT <= 32 channel groups by SY = THREADS / CT lanes
 * (pc_dwc_ct); its filters, R1 x R2 taps of its CT x VC channels (flipped for backward-data), are staged once in
 * shared memory as [tap][channel] so a lane reads its VC weights of a tap in one access. The filter size is the
 * module's (PC_DWC_R1, PC_DWC_R2): every loop over taps is unrolled, and a lane's work holds in registers.
 *   Forward (stride S = 1 or 2 on both axes) and backward-data (stride 1: the forward over dY with the flipped filter
 *   and padding R - 1 - P; stride 2: Note [clw phases]): a lane forms TH x VW outputs of its channels. It walks the (TH - 1) S + R1 source rows
 *   of its tile once, each as a window of (VW - 1) S + R2 vectors, and adds every row into each of the TH outputs
 *   rows it reaches (tap row i - t S).
 *   Weight gradient: a lane owns one filter row r1 of its channels, R2 x VC sums in registers, over one split of the
 *   (n, output row, strip of VWW columns) units: per unit it reads the strip of dY and the X window of row
 *   o S - P1 + r1. Lanes of one channel group and different r1 read the same dY strip (L1 hits). Splits go through
 *   portconv_split_finalize in a fixed order: deterministic, no atomics.
 * The geometry (TH, VW, VWW, ROWLOOP and the blocks an SM asked of ptxas, MINB and MINBW) is the host's per dtype
 * (DWC_GEOMETRY of portconv/dwclw.py, with its evidence, shared with opencl/clw.cl); the defaults below are its 16-bit
 * values.
 * Where the vector path does not apply (pc_dwt_vec_ok: strides, alignment, C % VC), the same bodies run with one
 * channel a lane. Channel tiles and spatial tiles are grid-stride loops, so any grid computes every output; the host
 * (portconv/dwclw.py, clw_grid and clw_splits) picks the grid that fills the GPU.
 */
#pragma once

/* Note [clw phases]: the stride-2 backward-data splits dX into its four phases (p1, p2) (rows i = 2 m + p1, columns
 * 2 n + p2), grid z. Along an axis of filter R and padding P, phase p takes the taps r = q + 2 t, q = (p + P) mod 2,
 * t < T = (R - q + 1) / 2, and dX[2 m + p] = sum_t dY[m + d - t] w[q + 2 t], d = (p + P - q) / 2: a stride-1
 * forward over dY with the phase's filter g[t'] = w[q + 2 (T - 1 - t')]. Every phase runs TM = (R + 1) / 2 taps
 * (the module's), g zero-padded in front, so its padding is TM - 1 - d; it writes the m < M = (X - p + 1) / 2
 * positions through dX's strides doubled. Each dX element is written once, by its phase (no atomics). */

#ifndef PC_DWC_R1
#define PC_DWC_R1 7 /* filter rows of the module's view */
#endif
#ifndef PC_DWC_R2
#define PC_DWC_R2 7 /* filter columns */
#endif
#ifndef PC_DWC_TH
#define PC_DWC_TH 1 /* output rows a lane (forward, backward-data) */
#endif
#ifndef PC_DWC_VW
#define PC_DWC_VW 8 /* output columns a lane */
#endif
#ifndef PC_DWC_VWW
#define PC_DWC_VWW 16 /* output columns a weight-gradient unit */
#endif
#ifndef PC_DWC_MINB
#define PC_DWC_MINB 2 /* blocks an SM the forward and backward-data ask ptxas for: 2, at most 128 registers */
#endif
#ifndef PC_DWC_MINBW
#define PC_DWC_MINBW 2 /* the same for the weight gradient */
#endif
#ifndef PC_DWC_VC
#define PC_DWC_VC PC_DWT_VC /* channels a lane on the vector path */
#endif
#ifndef PC_DWC_ROWLOOP
#define PC_DWC_ROWLOOP 0 /* 1: a tile's source rows in a loop, not unrolled (Note [clw row loop], dwclw.py) */
#endif
#define PC_DWC_THREADS 256
#define PC_DWC_CTMAX 32
/* The staged filters of a block: R1 x R2 taps of at most CTMAX x PC_DWT_VC channels (at most 48 KB: the host takes
 * these kernels only where that holds). */
#define PC_DWC_WSH (PC_DWC_R1 * PC_DWC_R2 * PC_DWC_CTMAX * PC_DWC_VC)

/* Channel groups a block for CV >= 1 groups in all: at most CTMAX and at most `lanes` (the weight gradient's block has
 * R1 lanes a group), balanced over the fewest channel tiles (144 channels of VC 4: two tiles of 18, not 32 and 4). */
PC_DEVICE pc_idx pc_dwc_ct(pc_idx CV, pc_idx lanes) {
    const pc_idx cap = lanes < PC_DWC_CTMAX ? lanes : PC_DWC_CTMAX, tiles = (CV + cap - 1) / cap;
    return (CV + tiles - 1) / tiles;
}

/* Stage the filters of channel groups cg0 .. cg0 + CT - 1 (VC channels each) as wsh[tap][lane VC + j]; FLIP: tap
 * (r1, r2) holds w[R1 - 1 - r1][R2 - 1 - r2]; channels past C hold zeros. */
template <bool FLIP, int VC>
PC_DEVICE void pc_dwc_stage(pc_acc_t *wsh, const pc_conv_args &a, pc_idx cg0, pc_idx CT) {
    constexpr int R1 = PC_DWC_R1, R2 = PC_DWC_R2;
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_idx lanes = CT * VC, C = (pc_idx)a.C;
    for (pc_idx i = (pc_idx)threadIdx.x; i < R1 * R2 * lanes; i += (pc_idx)blockDim.x) {
        const pc_idx tap = i / lanes, c = cg0 * VC + (i - tap * lanes);
        const pc_idx r1 = tap / R2, r2 = tap - r1 * R2;
        const pc_idx q1 = FLIP ? R1 - 1 - r1 : r1, q2 = FLIP ? R2 - 1 - r2 : r2;
        wsh[i] = c < C ? (pc_acc_t)pc_ld(w, c * (pc_idx)a.ws_[0] + q1 * (pc_idx)a.ws_[3] + q2 * (pc_idx)a.ws_[4])
                       : (pc_acc_t)0;
    }
}

/* Stage phase (q1, T1) x (q2, T2)'s filter of channel groups cg0 .. cg0 + CT - 1 (Note [clw phases]): tap
 * (t1, t2) of TM1 x TM2 holds w[q1 + 2 (T1 - 1 - u1)][q2 + 2 (T2 - 1 - u2)], u = t - (TM - T), zero where u < 0. */
template <int VC, int TM1, int TM2>
PC_DEVICE void pc_dwc_stage_phase(pc_acc_t *wsh, const pc_conv_args &a, pc_idx cg0, pc_idx CT, int q1, int T1, int q2,
                                  int T2) {
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_idx lanes = CT * VC, C = (pc_idx)a.C;
    for (pc_idx i = (pc_idx)threadIdx.x; i < TM1 * TM2 * lanes; i += (pc_idx)blockDim.x) {
        const pc_idx tap = i / lanes, c = cg0 * VC + (i - tap * lanes);
        const int u1 = (int)(tap / TM2) - (TM1 - T1), u2 = (int)(tap % TM2) - (TM2 - T2);
        wsh[i] = c < C && u1 >= 0 && u2 >= 0
                     ? (pc_acc_t)pc_ld(w, c * (pc_idx)a.ws_[0] + (pc_idx)(q1 + 2 * (T1 - 1 - u1)) * (pc_idx)a.ws_[3] +
                                              (pc_idx)(q2 + 2 * (T2 - 1 - u2)) * (pc_idx)a.ws_[4])
                     : (pc_acc_t)0;
    }
}

/* Forward (FLIP false), stride-1 backward-data (FLIP true) or a phase of the stride-2 backward-data (FLIP and PH:
 * Note [clw phases], phase blockIdx.z), VC channels a lane. */
template <int S, bool FLIP, int VC, bool PH = false>
PC_DEVICE void pc_dwc_conv(const pc_conv_args &a, pc_acc_t *wsh) {
    constexpr int R1 = PH ? (PC_DWC_R1 + 1) / 2 : PC_DWC_R1, R2 = PH ? (PC_DWC_R2 + 1) / 2 : PC_DWC_R2;
    constexpr int TH = PC_DWC_TH, VW = PC_DWC_VW;
    constexpr int WIN = (VW - 1) * S + R2, ROWS = (TH - 1) * S + R1;
    PC_DWT_WALK_LOCALS(FLIP);
    (void)w, (void)E0, (void)D0, (void)ss2, (void)ds2, (void)ws0, (void)ws2, (void)ws3, (void)ws4;
    pc_idx P1 = FLIP ? R1 - 1 - (pc_idx)a.P[1] : (pc_idx)a.P[1];
    pc_idx P2 = FLIP ? R2 - 1 - (pc_idx)a.P[2] : (pc_idx)a.P[2];
    pc_idx D1p = D1, D2p = D2, ds3p = ds3, ds4p = ds4, dp = 0; /* the phase's outputs (Note [clw phases]) */
    int q1 = 0, q2 = 0, T1p = 0, T2p = 0;
    if (PH) {
        const int p1 = (int)(blockIdx.z >> 1), p2 = (int)(blockIdx.z & 1);
        q1 = (int)((p1 + a.P[1]) & 1), q2 = (int)((p2 + a.P[2]) & 1);
        T1p = (PC_DWC_R1 - q1 + 1) / 2, T2p = (PC_DWC_R2 - q2 + 1) / 2;
        P1 = R1 - 1 - ((pc_idx)p1 + (pc_idx)a.P[1] - q1) / 2, P2 = R2 - 1 - ((pc_idx)p2 + (pc_idx)a.P[2] - q2) / 2;
        D1p = (D1 - p1 + 1) / 2, D2p = (D2 - p2 + 1) / 2, ds3p = 2 * ds3, ds4p = 2 * ds4, dp = p1 * ds3 + p2 * ds4;
    }
    const pc_idx CV = (pc_idx)a.C / VC, CT = pc_dwc_ct(CV, PC_DWC_THREADS), SY = PC_DWC_THREADS / CT;
    const pc_idx tx = (pc_idx)threadIdx.x % CT, ty = (pc_idx)threadIdx.x / CT;
    const pc_idx T1 = (D1p + TH - 1) / TH, NS = (D2p + VW - 1) / VW, tiles = (pc_idx)a.N * T1 * NS;
    for (pc_idx cg0 = (pc_idx)blockIdx.y * CT; cg0 < CV; cg0 += (pc_idx)gridDim.y * CT) {
        PC_BARRIER(); /* the previous channel tile's reads of wsh are done */
        if (PH)
            pc_dwc_stage_phase<VC, R1, R2>(wsh, a, cg0, CT, q1, T1p, q2, T2p);
        else
            pc_dwc_stage<FLIP, VC>(wsh, a, cg0, CT);
        PC_BARRIER();
        const pc_idx cv = cg0 + tx;
        if (ty >= SY || cv >= CV) continue;
        const pc_idx c = cv * VC;
        const pc_vec<pc_acc_t, VC> *wl = (const pc_vec<pc_acc_t, VC> *)wsh + tx;
        pc_acc_t bias[VC];
#pragma unroll
        for (int j = 0; j < VC; ++j) bias[j] = (!FLIP && b) ? (pc_acc_t)pc_ld(b, (c + j) * (pc_idx)a.bs) : (pc_acc_t)0;
        for (pc_idx sp = (pc_idx)blockIdx.x * SY + ty; sp < tiles; sp += (pc_idx)gridDim.x * SY) {
            const pc_idx s = sp % NS, t1 = (sp / NS) % T1, n = sp / (NS * T1);
            const pc_idx d1s = t1 * TH, d2s = s * VW, b1 = d1s * S - P1, b2 = d2s * S - P2;
            const pc_idx rb = n * ss0 + c * ss1;
            pc_acc_t acc[TH][VW][VC];
#pragma unroll
            for (int t = 0; t < TH; ++t)
#pragma unroll
                for (int v = 0; v < VW; ++v)
#pragma unroll
                    for (int j = 0; j < VC; ++j) acc[t][v][j] = 0;
#if PC_DWC_ROWLOOP
#pragma unroll 1
#else
#pragma unroll
#endif
            for (int i = 0; i < ROWS; ++i) {
                const pc_idx i1 = b1 + i;
                pc_acc_t row[WIN][VC];
                pc_dwt_row<VC, WIN>(row, src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2, ss4);
#pragma unroll
                for (int t = 0; t < TH; ++t) {
                    const int r1 = i - t * S;
                    if (r1 < 0 || r1 >= R1) continue;
#pragma unroll
                    for (int r2 = 0; r2 < R2; ++r2) {
                        const pc_vec<pc_acc_t, VC> wv = wl[(r1 * R2 + r2) * CT];
#pragma unroll
                        for (int v = 0; v < VW; ++v)
#pragma unroll
                            for (int j = 0; j < VC; ++j) acc[t][v][j] += row[v * S + r2][j] * wv.v[j];
                    }
                }
            }
            const pc_idx db = n * ds0 + c * ds1 + dp;
#pragma unroll
            for (int t = 0; t < TH; ++t)
                if (d1s + t < D1p)
                    pc_dwt_store<VC, VW>(dst, db + (d1s + t) * ds3p + d2s * ds4p, ds4p, D2p - d2s, acc[t], bias);
        }
    }
}

/* Weight gradient, VC channels a lane; grid x: the splits (a.splits, a.chunk units each). */
template <int S, int VC>
PC_DEVICE void pc_dwc_bwd_weight(const pc_conv_args &a) {
    constexpr int R1 = PC_DWC_R1, R2 = PC_DWC_R2, VW = PC_DWC_VWW, WIN = (VW - 1) * S + R2;
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_idx X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx CV = (pc_idx)a.C / VC, CT = pc_dwc_ct(CV, PC_DWC_THREADS / R1);
    const pc_idx tx = (pc_idx)threadIdx.x % CT, r1 = (pc_idx)threadIdx.x / CT;
    const pc_idx NS = (Y2 + VW - 1) / VW, units = (pc_idx)a.N * Y1 * NS, sp = (pc_idx)blockIdx.x;
    pc_idx lo, hi;
    pc_split_range(units, (pc_idx)a.chunk, sp, lo, hi);
    const pc_idx taps = R1 * R2;
    for (pc_idx cg0 = (pc_idx)blockIdx.y * CT; cg0 < CV; cg0 += (pc_idx)gridDim.y * CT) {
        const pc_idx cv = cg0 + tx;
        if (r1 >= R1 || cv >= CV) continue; /* no barrier in this body */
        const pc_idx c = cv * VC;
        pc_acc_t acc[R2][VC];
#pragma unroll
        for (int r2 = 0; r2 < R2; ++r2)
#pragma unroll
            for (int j = 0; j < VC; ++j) acc[r2][j] = 0;
        for (pc_idx u = lo; u < hi; ++u) {
            const pc_idx s = u % NS, o1 = (u / NS) % Y1, n = u / (NS * Y1);
            const pc_idx i1 = o1 * (pc_idx)a.S[1] - (pc_idx)a.P[1] + r1;
            if (i1 < 0 || i1 >= X1) continue;
            const pc_idx o2 = s * VW;
            pc_acc_t g[VW][VC], row[WIN][VC];
            pc_dwt_row<VC, VW>(g, dy, n * (pc_idx)a.ys[0] + c * (pc_idx)a.ys[1] + o1 * (pc_idx)a.ys[3], true, o2, Y2,
                               (pc_idx)a.ys[4]);
            pc_dwt_row<VC, WIN>(row, x, n * (pc_idx)a.xs[0] + c * (pc_idx)a.xs[1] + i1 * (pc_idx)a.xs[3], true,
                                o2 * S - (pc_idx)a.P[2], X2, (pc_idx)a.xs[4]);
#pragma unroll
            for (int r2 = 0; r2 < R2; ++r2)
#pragma unroll
                for (int v = 0; v < VW; ++v)
#pragma unroll
                    for (int j = 0; j < VC; ++j) acc[r2][j] += g[v][j] * row[v * S + r2][j];
        }
#pragma unroll
        for (int r2 = 0; r2 < R2; ++r2)
#pragma unroll
            for (int j = 0; j < VC; ++j) {
                const pc_idx k = c + j, tap = r1 * R2 + r2;
                if (a.splits == 1)
                    pc_st(dw, k * (pc_idx)a.ws_[0] + r1 * (pc_idx)a.ws_[3] + r2 * (pc_idx)a.ws_[4], acc[r2][j]);
                else
                    ((pc_acc_t *)a.ws)[sp * (pc_idx)a.C * taps + k * taps + tap] = acc[r2][j];
            }
    }
}

template <int S, bool FLIP, bool PH = false>
PC_DEVICE void pc_dwc_conv_any(const pc_conv_args &a) {
    PC_SHARED pc_vec<pc_acc_t, PC_DWC_VC> wsh[PC_DWC_WSH / PC_DWC_VC];
    if (PC_DWC_VC > 1 && pc_dwt_vec_ok<PC_DWC_VC>(a))
        pc_dwc_conv<S, FLIP, PC_DWC_VC, PH>(a, (pc_acc_t *)wsh);
    else
        pc_dwc_conv<S, FLIP, 1, PH>(a, (pc_acc_t *)wsh);
}

template <int S>
PC_DEVICE void pc_dwc_bwd_weight_any(const pc_conv_args &a) {
    if (PC_DWC_VC > 1 && pc_dwt_vec_ok<PC_DWC_VC>(a))
        pc_dwc_bwd_weight<S, PC_DWC_VC>(a);
    else
        pc_dwc_bwd_weight<S, 1>(a);
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_clw_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINB) portconv_depthwise_fwd_clw_s1(const pc_conv_args a) {
    pc_dwc_conv_any<1, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_clw_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINB) portconv_depthwise_fwd_clw_s2(const pc_conv_args a) {
    pc_dwc_conv_any<2, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_clw_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINB) portconv_depthwise_bwd_data_clw_s1(const pc_conv_args a) {
    pc_dwc_conv_any<1, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_clw_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINB) portconv_depthwise_bwd_data_clw_s2(const pc_conv_args a) {
    pc_dwc_conv_any<1, true, true>(a); /* Note [clw phases]: a phase a grid z */
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_clw_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINBW) portconv_depthwise_bwd_weight_clw_s1(const pc_conv_args a) {
    pc_dwc_bwd_weight_any<1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_clw_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWC_MINBW) portconv_depthwise_bwd_weight_clw_s2(const pc_conv_args a) {
    pc_dwc_bwd_weight_any<2>(a);
}
#endif
