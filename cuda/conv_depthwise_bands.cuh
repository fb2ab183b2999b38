/* portconv kernel bodies: depthwise "bands" kernels, any 2-D filter in either layout, a band of rows staged in shared
 * memory.
 *
 * Note [depthwise bands]: the 'rows' kernels' generic strip loop (any filter that is not 3 taps along the last
 * axis) reads every source element once per product through L1, with a bounds test each. Here a block stages the
 * source rows of a band of output rows, full width, padding included (zeros), in shared memory, for P planes
 * (a.chunk) at once where a plane is small, and a thread forms a column of PC_DWB_VH outputs: for each filter column
 * r2 and each step of PC_DWB_CH filter rows it reads CH weights (a broadcast) and VH*S + CH - S source values down the
 * column and forms VH x CH products, with no bounds test. Lanes take consecutive output columns, so their shared
 * reads fall in consecutive banks (stride 1 along the row). The filter's rows are padded to a multiple of CH with
 * zero weights (R1c rows), and the staged rows cover every row those reach, so no product reads outside its plane.
 * Staging and stores follow the tensors' strides: coalesced along NCHW rows, a gather for channels-last data.
 *
 * Geometry (portconv/dwbands.py computes the same, for grids and PC_DWB_BYTES, and decides where these kernels run):
 *   G = THREADS / D2 row groups a plane (D2 <= THREADS), gp = ceil(D1 / VH) groups a whole plane;
 *   gp <= G: a band is the whole plane (TH = D1), P planes a block (a.chunk, at most G / gp);
 *   else a band is TH = G * VH rows of one plane (a.chunk = 1);
 *   rows staged = (ceil(TH / VH) * VH - 1) * S + R1c, columns = (D2 - 1) * S2 + (R2 - 1) * DL2 + 1.
 * Forward: any stride (S = S1 in {1, 2} at compile time, S2 at run time), dilation 1 along the rows, any along the
 * columns, any padding, channel multiplier m (output channel k reads input channel k / m). Backward-data (m = 1) at
 * stride 1 is the same correlation over dY with the filter flipped and padding (R - 1) * DL - P (FLIP 1); at stride 2
 * in four phases (FLIP 2, Note [bands phases]). 2-D views (axis 0 of extent 1) with filters of 2+ taps on both axes.
 * A block returns before its barrier only where every thread of it does (a phase past a 1-wide dX, blocks past the
 * last plane); the OpenCL form (opencl/bands.cl) returns after its barrier only.
 */
#pragma once

#ifndef PC_DWB_BYTES
#define PC_DWB_BYTES 16384 /* shared memory of a block: P planes' staged rows and their padded filters */
#endif
#ifndef PC_DWB_CH
#define PC_DWB_CH 7 /* filter rows a step: the filter's rows where at most 8, else the step that pads them least */
#endif
#ifndef PC_DWB_CHP
#define PC_DWB_CHP 4 /* the same for the stride-2 backward-data phases (their sub-filters' rows) */
#endif
#ifndef PC_DWB_VH
#define PC_DWB_VH 8 /* output rows a thread */
#endif
#ifndef PC_DWB_SU
#define PC_DWB_SU 4 /* Note [staged loads]: staging loads a thread issues before it stores them */
#endif
#ifndef PC_DWB_CLIP
#define PC_DWB_CLIP 0 /* Note [bands columns]: bit 1 the forward, bit 2 backward-data walk the inside columns only */
#endif

/* e / d for 0 <= e < 2**22 from r = 1.0f / d: (e + 0.5) / d is at least 0.5 / d from an integer and the float
 * product errs by under (e + 0.5) * 2**-23 / d, so the floor is exact (no integer division). */
PC_DEVICE pc_idx pc_dwb_div(pc_idx e, float r) { return (pc_idx)(((float)e + 0.5f) * r); }

/* Note [staged loads]: staging is most of a 'bands' forward (backward-data) block's instructions where a plane's
 * staged rows are many for its outputs (stride 2: about 5 staged elements an output). No staged position comes from
 * an integer division: pc_dwb_div finds rows and planes, and a plane p's image p / K too where every p of the block
 * is below 2**22; its channel k / m is formed only where m > 1. A thread issues PC_DWB_SU loads before it stores
 * them. Two forms:
 * - the row form (the stride-2 forward): LW = pc_dwb_lanes(cols) threads share a staged row, each with the row's
 *   plane, image, channel and source row found once for its columns of the row (ceil(cols / LW) of them), so an
 *   element costs about its load, its store and an address product;
 * - the element form (elsewhere): each thread finds every element's position, and a round of loads fills every
 *   thread with elements whatever the rows' width; rows narrower than a warp (14x14 planes) take more rounds in the
 *   row form and measured slower there, as did the stride-1 planes of ConvNeXt (docs/kernels/depthwise.md).
 * The weight gradient stages in the element form, one load at a time. */
/* Note [staged loads]: the source offset of plane p's image n = p / K and channel k / m (K planes an image, m output
 * channels an input channel); the image by pc_dwb_div where fk (every p of the block below 2**22). */
PC_DEVICE pc_idx pc_dwb_plane(pc_idx p, pc_idx K, pc_idx m, float rk, bool fk, pc_idx s0, pc_idx s1) {
    const pc_idx n = fk ? pc_dwb_div(p, rk) : p / K, k = p - n * K;
    return n * s0 + (m == 1 ? k : k / m) * s1;
}

/* Note [staged loads]: LW threads share a staged row in the row form: the smallest power of two from 4 to 32 that is
 * at least the row's width, 32 for wider rows. */
PC_DEVICE pc_idx pc_dwb_lanes(pc_idx cols) {
    pc_idx lw = 32;
    while (lw > 4 && lw / 2 >= cols) lw /= 2;
    return lw;
}

/* One axis of a 'bands' result: output o (of D) is result index o * os + oph; filter step c (of R, the sub-filter
 * of a phase) reads source index o * S - p + c * DL and weight tap w0 + ws * c. */
struct pc_dwb_axis {
    pc_idx D, R, p, w0, ws, os, oph;
};

/* The axis of a direction: forward (FLIP 0), backward-data at stride 1 (FLIP 1: the filter flipped), or phase ph of
 * backward-data at stride 2 (FLIP 2, Note [bands phases]). */
PC_DEVICE pc_dwb_axis pc_dwb_axis_of(int flip, pc_idx Y, pc_idx X, pc_idx R, pc_idx P, pc_idx DL, pc_idx ph) {
    if (flip == 0) return {Y, R, P, 0, 1, 1, 0};
    if (flip == 1) return {X, R, (R - 1) * DL - P, R - 1, -1, 1, 0};
    const pc_idx rmax = (R - 1) - (((R - 1 - ph - P) % 2) + 2) % 2; /* the last tap of the phase's parity */
    return {(X - ph + 1) / 2, rmax >= 0 ? rmax / 2 + 1 : 0, (rmax - ph - P) / 2, rmax, -2, 2, ph};
}

/* Note [bands columns]: a thread walks only the filter columns r2 whose source column o2 S2 - p + r2 DL2 lies inside
 * the source (the staged zeros outside add nothing to a finite sum), r2 = lo .. lo + n - 1. Where a plane is
 * narrower than the filter's reach (13x13 filters on 7x7 planes) every output column has n = the plane's width, so a
 * warp's threads walk in step and the products fall by that fraction. The host sets PC_DWB_CLIP for a direction
 * only where no output column reaches every filter column (dwbands.dwb_clips): elsewhere the walk over all R2
 * columns, uniform across the warp, measured faster. */
PC_DEVICE void pc_dwb_cols(pc_idx base, pc_idx src, pc_idx dl, pc_idx R2, pc_idx &lo, pc_idx &n) {
    /* tap r2 reads source column r2 dl - base: inside for base <= r2 dl < base + src */
    lo = base > 0 ? (base + dl - 1) / dl : 0;
    const pc_idx hi = base + src > 0 ? (base + src + dl - 1) / dl : 0;
    n = (hi < R2 ? hi : R2) - lo;
    if (n < 0) n = 0;
}

/* Note [bands phases]: backward-data at stride 2 (dilation 1) is four stride-1 correlations over dY, one per parity
 * (ph1, ph2) of the dX position: dX[2u + ph] takes the taps r of parity ph + P, the last (rmax) first, and tap
 * rmax - 2c reads dY[u + c - (rmax - ph - P) / 2]. Grid y is the phase. */
template <int S, int FLIP, int CH>
PC_DEVICE void pc_dw_bands(const pc_conv_args &a) {
    const pc_t *PC_RESTRICT src = (const pc_t *)(FLIP ? a.y : a.x); /* forward: X -> Y; backward-data: dY -> dX */
    pc_t *PC_RESTRICT dst = (pc_t *)(FLIP ? a.x : a.y);
    const long long *srcS = FLIP ? a.ys : a.xs, *dstS = FLIP ? a.xs : a.ys;
    const pc_idx Src1 = (pc_idx)(FLIP ? a.Y[1] : a.X[1]), Src2 = (pc_idx)(FLIP ? a.Y[2] : a.X[2]);
    constexpr int VH = PC_DWB_VH, WIN = (VH - 1) * S + CH;
    PC_SHARED pc_acc_t pool[PC_DWB_BYTES / sizeof(pc_acc_t)];
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;
    const pc_idx ph = (pc_idx)blockIdx.y;
    const pc_dwb_axis A1 = pc_dwb_axis_of(FLIP, (pc_idx)a.Y[1], (pc_idx)a.X[1], (pc_idx)a.R[1], (pc_idx)a.P[1],
                                          (pc_idx)a.DL[1], ph >> 1);
    const pc_dwb_axis A2 = pc_dwb_axis_of(FLIP, (pc_idx)a.Y[2], (pc_idx)a.X[2], (pc_idx)a.R[2], (pc_idx)a.P[2],
                                          (pc_idx)a.DL[2], ph & 1);
    const pc_idx D1 = A1.D, D2 = A2.D, R1 = A1.R, R2 = A2.R;
    const pc_idx DL2 = FLIP == 2 ? 1 : (pc_idx)a.DL[2], S2 = FLIP ? 1 : (pc_idx)a.S[2];
    const pc_idx K = FLIP ? (pc_idx)a.C : (pc_idx)a.K, m = FLIP ? 1 : (pc_idx)(a.K / a.C);
    if (D1 <= 0 || D2 <= 0) return; /* a phase past a 1-wide dX */
    const pc_idx G = (pc_idx)blockDim.x / D2, gp = (D1 + VH - 1) / VH;
    const pc_idx TH = gp <= G ? D1 : G * VH, bands = (D1 + TH - 1) / TH, gb = (TH + VH - 1) / VH;
    const pc_idx P = (pc_idx)a.chunk, R1c = (R1 + CH - 1) / CH * CH;
    const pc_idx rows = (gb * VH - 1) * S + R1c, cols = (D2 - 1) * S2 + (R2 > 0 ? R2 - 1 : 0) * DL2 + 1;
    const pc_idx plane = rows * cols;
    const pc_idx NK = (pc_idx)a.N * K, band = (pc_idx)blockIdx.x % bands, p0 = (pc_idx)blockIdx.x / bands * P;
    if (p0 >= NK) return; /* the grid covers the phase with the most bands */
    const pc_idx o1b = band * TH, i1b = o1b * S - A1.p;
    pc_acc_t *wsm = pool + P * plane;
    const float rc = 1.0f / (float)cols, rr = 1.0f / (float)rows, rk = 1.0f / (float)K;
    const bool fk = NK + P <= (1 << 22); /* every p of the block divides by K as pc_dwb_div */
    const pc_idx sS0 = (pc_idx)srcS[0], sS1 = (pc_idx)srcS[1];
    constexpr bool ROWS = S == 2 && FLIP == 0; /* Note [staged loads]: the row form, else the element form */
    const pc_idx nrows = P * rows, LW = pc_dwb_lanes(cols), nq = (pc_idx)blockDim.x / LW;
    for (pc_idx r0 = (pc_idx)threadIdx.x / LW; ROWS && r0 < nrows; r0 += PC_DWB_SU * nq) {
        pc_idx at[PC_DWB_SU];
        bool ok[PC_DWB_SU];
#pragma unroll
        for (int su = 0; su < PC_DWB_SU; ++su) {
            const pc_idx r = r0 + su * nq, pl = pc_dwb_div(r, rr), p = p0 + pl, i1 = i1b + r - pl * rows;
            ok[su] = r < nrows && p < NK && i1 >= 0 && i1 < Src1;
            at[su] = ok[su] ? pc_dwb_plane(p, K, m, rk, fk, sS0, sS1) + i1 * (pc_idx)srcS[3] : 0;
        }
        for (pc_idx j = (pc_idx)threadIdx.x % LW; j < cols; j += LW) {
            const pc_idx i2 = j - A2.p;
            const bool in2 = i2 >= 0 && i2 < Src2;
            pc_acc_t v[PC_DWB_SU];
#pragma unroll
            for (int su = 0; su < PC_DWB_SU; ++su)
                v[su] = ok[su] && in2 ? (pc_acc_t)pc_ld(src, at[su] + i2 * (pc_idx)srcS[4]) : (pc_acc_t)0;
#pragma unroll
            for (int su = 0; su < PC_DWB_SU; ++su)
                if (r0 + su * nq < nrows) pool[(r0 + su * nq) * cols + j] = v[su];
        }
    }
    for (pc_idx e0 = (pc_idx)threadIdx.x; !ROWS && e0 < P * plane; e0 += PC_DWB_SU * (pc_idx)blockDim.x) {
        pc_acc_t v[PC_DWB_SU];
#pragma unroll
        for (int su = 0; su < PC_DWB_SU; ++su) {
            const pc_idx e = e0 + su * (pc_idx)blockDim.x;
            const pc_idx pr = pc_dwb_div(e, rc), j = e - pr * cols, pl = pc_dwb_div(pr, rr), p = p0 + pl;
            const pc_idx i1 = i1b + pr - pl * rows, i2 = j - A2.p;
            v[su] = e < P * plane && p < NK && i1 >= 0 && i1 < Src1 && i2 >= 0 && i2 < Src2
                        ? (pc_acc_t)pc_ld(src, pc_dwb_plane(p, K, m, rk, fk, sS0, sS1) + i1 * (pc_idx)srcS[3] +
                                          i2 * (pc_idx)srcS[4])
                        : (pc_acc_t)0;
        }
#pragma unroll
        for (int su = 0; su < PC_DWB_SU; ++su)
            if (e0 + su * (pc_idx)blockDim.x < P * plane) pool[e0 + su * (pc_idx)blockDim.x] = v[su];
    }
    for (pc_idx e = (pc_idx)threadIdx.x; e < P * R1c * R2; e += (pc_idx)blockDim.x) {
        const pc_idx pl = e / (R1c * R2), c1 = (e - pl * R1c * R2) / R2, c2 = e - pl * R1c * R2 - c1 * R2;
        const pc_idx k = (p0 + pl) % K;
        wsm[e] = c1 < R1 ? (pc_acc_t)pc_ld(w, k * (pc_idx)a.ws_[0] + (A1.w0 + A1.ws * c1) * (pc_idx)a.ws_[3] +
                                                  (A2.w0 + A2.ws * c2) * (pc_idx)a.ws_[4])
                         : (pc_acc_t)0;
    }
    PC_BARRIER();
    const pc_idx u = (pc_idx)threadIdx.x;
    if (u >= P * gb * D2) return;
    const pc_idx pl = u / (gb * D2), g = (u - pl * gb * D2) / D2, o2 = u - pl * gb * D2 - g * D2, p = p0 + pl;
    if (p >= NK) return;
    const pc_acc_t *col0 = pool + pl * plane + g * VH * S * cols + o2 * S2;
    const pc_acc_t *wpl = wsm + pl * R1c * R2;
    pc_acc_t acc[VH];
#pragma unroll
    for (int v = 0; v < VH; ++v) acc[v] = 0;
    pc_idx r2lo = 0, n2 = R2; /* Note [bands columns] */
    if ((PC_DWB_CLIP & (FLIP ? 2 : 1)) != 0) pc_dwb_cols(A2.p - o2 * S2, Src2, DL2, R2, r2lo, n2);
    for (pc_idx r1c = 0; r1c < R1c; r1c += CH) {
        for (pc_idx r2 = r2lo; r2 < r2lo + n2; ++r2) {
            const pc_acc_t *col = col0 + r1c * cols + r2 * DL2;
            pc_acc_t wv[CH], win[WIN];
#pragma unroll
            for (int c = 0; c < CH; ++c) wv[c] = wpl[(r1c + c) * R2 + r2];
#pragma unroll
            for (int t = 0; t < WIN; ++t) win[t] = col[t * cols];
#pragma unroll
            for (int v = 0; v < VH; ++v)
#pragma unroll
                for (int c = 0; c < CH; ++c) acc[v] += win[v * S + c] * wv[c];
        }
    }
    const pc_idx n = p / K, k = p - n * K;
    const pc_acc_t bias = b ? (pc_acc_t)pc_ld(b, k * (pc_idx)a.bs) : (pc_acc_t)0;
    const pc_idx db = n * (pc_idx)dstS[0] + k * (pc_idx)dstS[1] + (o2 * A2.os + A2.oph) * (pc_idx)dstS[4];
#pragma unroll
    for (int v = 0; v < VH; ++v) {
        const pc_idx r = g * VH + v, o1 = o1b + r;
        if (r < TH && o1 < D1) pc_st(dst, db + (o1 * A1.os + A1.oph) * (pc_idx)dstS[3], acc[v] + bias);
    }
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_bands_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_bands_s1(const pc_conv_args a) {
    pc_dw_bands<1, 0, PC_DWB_CH>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_bands_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_bands_s2(const pc_conv_args a) {
    pc_dw_bands<2, 0, PC_DWB_CH>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_bands_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_bands_s1(const pc_conv_args a) {
    pc_dw_bands<1, 1, PC_DWB_CH>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_bands_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_bands_s2(const pc_conv_args a) {
    pc_dw_bands<1, 2, PC_DWB_CHP>(a);
}
#endif

/* Note [depthwise bands] (weight gradient): grid (K, splits); a block owns channel k and one split of the units
 * (P planes of n, a band of TH output rows each; dwb_wgeometry mirrors the sizes). Per unit it stages dY's band
 * (TH x D2c, D2c = D2 rounded up to PC_DWB_U with zero columns) and X's source rows ((TH - 1) * S1 + (R1 - 1) *
 * DL1 + 1, columns (D2c - 1) * S + R2c, zeros outside X). A thread owns a task, one filter row r1 and PC_DWB_TW
 * consecutive taps of it (R2 rounded up to R2c with taps that are never stored), and a slice of the unit's rows
 * (every Q-th): for each run of U output columns it reads U dY values and (U - 1) * S + TW X values and forms
 * U x TW products. The slices' partials meet in shared memory in a fixed order at the end; the splits go through
 * portconv_split_finalize. Dilation 1 along the columns (the X window), any along the rows, S = S2 in {1, 2}. */
#ifndef PC_DWB_TW
#define PC_DWB_TW 7 /* taps of a filter row a thread: the row where at most 8 taps, else dwb_ch's step */
#endif
#define PC_DWB_U 8        /* output columns a step (DWB_U) */
#define PC_DWB_ROWS 2048  /* positions a unit about (DWB_ROWS) */
#define PC_DWB_MAX 49152  /* shared bytes a unit's planes may take (DWB_MAX_BYTES) */

template <int S>
PC_DEVICE void pc_dw_bands_weight(const pc_conv_args &a) {
    constexpr int TW = PC_DWB_TW, U = PC_DWB_U, WIN = (U - 1) * S + TW;
    PC_SHARED pc_acc_t pool[PC_DWB_BYTES / sizeof(pc_acc_t)];
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx N = (pc_idx)a.N, m = (pc_idx)(a.K / a.C), k = (pc_idx)blockIdx.x, s = (pc_idx)blockIdx.y;
    const pc_idx D1 = (pc_idx)a.Y[1], D2 = (pc_idx)a.Y[2], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2], S1 = (pc_idx)a.S[1], DL1 = (pc_idx)a.DL[1];
    const pc_idx D2c = (D2 + U - 1) / U * U, segs = (R2 + TW - 1) / TW, R2c = segs * TW;
    const pc_idx rb = PC_DWB_ROWS / D2c > 0 ? PC_DWB_ROWS / D2c : 1, TH = D1 < rb ? D1 : rb;
    const pc_idx bands = (D1 + TH - 1) / TH;
    const pc_idx rowsX = (TH - 1) * S1 + (R1 - 1) * DL1 + 1, colsX = (D2c - 1) * S + R2c;
    const pc_idx xplane = rowsX * colsX, yplane = TH * D2c, fit = PC_DWB_MAX / (pc_idx)sizeof(pc_acc_t) / (xplane + yplane);
    pc_idx P = TH == D1 ? (rb / D1 < N ? rb / D1 : N) : 1;
    P = P < fit ? P : fit;
    const pc_idx T = R1 * segs, Q = (pc_idx)blockDim.x / T, t = (pc_idx)threadIdx.x;
    const float rcx = 1.0f / (float)colsX, rrx = 1.0f / (float)rowsX, rcy = 1.0f / (float)D2c, rry = 1.0f / (float)TH;
    const pc_idx task = t % T, q = t / T, r1 = task / segs, r2a = (task - r1 * segs) * TW;
    pc_acc_t *xs = pool, *ys = pool + P * xplane;
    const pc_idx xc = (k / m) * (pc_idx)a.xs[1], yc = k * (pc_idx)a.ys[1];
    pc_idx lo, hi;
    pc_split_range((N + P - 1) / P * bands, (pc_idx)a.chunk, s, lo, hi);
    pc_acc_t acc[TW];
#pragma unroll
    for (int i = 0; i < TW; ++i) acc[i] = 0;
    for (pc_idx unit = lo; unit < hi; ++unit) {
        const pc_idx band = unit % bands, n0 = unit / bands * P, o1b = band * TH;
        const pc_idx i1b = o1b * S1 - (pc_idx)a.P[1], i2b = -(pc_idx)a.P[2];
        PC_BARRIER(); /* the previous unit's reads are done */
        for (pc_idx e = t; e < P * xplane; e += (pc_idx)blockDim.x) {
            const pc_idx pr = pc_dwb_div(e, rcx), j = e - pr * colsX, pl = pc_dwb_div(pr, rrx);
            const pc_idx n = n0 + pl, i1 = i1b + pr - pl * rowsX, i2 = i2b + j;
            xs[e] = n < N && i1 >= 0 && i1 < X1 && i2 >= 0 && i2 < X2
                        ? (pc_acc_t)pc_ld(x, xc + n * (pc_idx)a.xs[0] + i1 * (pc_idx)a.xs[3] + i2 * (pc_idx)a.xs[4])
                        : (pc_acc_t)0;
        }
        for (pc_idx e = t; e < P * yplane; e += (pc_idx)blockDim.x) {
            const pc_idx pr = pc_dwb_div(e, rcy), j = e - pr * D2c, pl = pc_dwb_div(pr, rry);
            const pc_idx n = n0 + pl, o1 = o1b + pr - pl * TH;
            ys[e] = n < N && o1 < D1 && j < D2
                        ? (pc_acc_t)pc_ld(dy, yc + n * (pc_idx)a.ys[0] + o1 * (pc_idx)a.ys[3] + j * (pc_idx)a.ys[4])
                        : (pc_acc_t)0;
        }
        PC_BARRIER();
        if (q >= Q) continue;
        for (pc_idx row = q; row < P * TH; row += Q) {
            const pc_idx pl = row / TH, o1 = row - pl * TH;
            const pc_acc_t *yr = ys + pl * yplane + o1 * D2c;
            const pc_acc_t *xr = xs + pl * xplane + (o1 * S1 + r1 * DL1) * colsX + r2a;
            for (pc_idx o2 = 0; o2 < D2c; o2 += U) {
                pc_acc_t g[U], win[WIN];
#pragma unroll
                for (int u = 0; u < U; ++u) g[u] = yr[o2 + u];
#pragma unroll
                for (int j = 0; j < WIN; ++j) win[j] = xr[o2 * S + j];
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int i = 0; i < TW; ++i) acc[i] += g[u] * win[u * S + i];
            }
        }
    }
    PC_BARRIER();
    if (q < Q)
#pragma unroll
        for (int i = 0; i < TW; ++i) pool[t * TW + i] = acc[i];
    PC_BARRIER();
    for (pc_idx e = t; e < T * TW; e += (pc_idx)blockDim.x) {
        const pc_idx tk = e / TW, i = e - tk * TW, rr1 = tk / segs, rr2 = (tk - rr1 * segs) * TW + i;
        if (rr2 >= R2) continue;
        pc_acc_t v = 0;
        for (pc_idx qq = 0; qq < Q; ++qq) v += pool[(qq * T + tk) * TW + i];
        if (a.splits == 1)
            pc_st(dw, k * (pc_idx)a.ws_[0] + rr1 * (pc_idx)a.ws_[3] + rr2 * (pc_idx)a.ws_[4], v);
        else
            ((pc_acc_t *)a.ws)[(s * (pc_idx)a.K + k) * R1 * R2 + rr1 * R2 + rr2] = v;
    }
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_bands_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_bands_s1(const pc_conv_args a) {
    pc_dw_bands_weight<1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_bands_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_bands_s2(const pc_conv_args a) {
    pc_dw_bands_weight<2>(a);
}
#endif
