/* portconv OpenCL depthwise "bands" kernels: any 2-D filter, either layout, a band of rows staged in local memory.
 *
 * The OpenCL form of Note [depthwise bands] (cuda/conv_depthwise_bands.cuh; same geometry, which the host takes from
 * portconv/dwbands.py): a work-group of BANDS_THREADS stages the source rows of a band of output rows
 * of P planes (d.red) with zero padding in local memory, and a work-item
 * forms a column of BANDS_VH outputs, BANDS_CH filter rows a step from a private window, with no bounds test.
 * Forward at stride 1 and 2 (bands_fwd_s1/_s2), backward-data at stride 1 (the flipped filter) and stride 2 (Note
 * [bands phases]: four stride-1 phases over dY, grid dimension 1). The weight gradient (bands_bwd_weight_s1/_s2, S
 * the columns' stride): a work-group per (channel, split), a filter row's BANDS_TW taps and a slice of a unit's
 * rows a work-item, slices added in local memory in a fixed order, splits in split order by bands_finalize.
 * Deterministic, no atomics. Same canonical convolution and descriptor as conv.cl (common.h): C = d.G, K = d.G *
 * d.KG, offsets d.xo, d.wo, d.yo, d.bo.
 *
 * Defines (host): the dtype, optional IDX64, DEPTHWISE, BANDS_VH, BANDS_CH (forward, stride-1 backward-data),
 * BANDS_CHP (the stride-2 phases), BANDS_TW (weight taps a work-item), BANDS_CLIP (Note [bands columns]: bit 1 the
 * forward, bit 2 backward-data walk each output's inside filter columns only), BANDS_BYTES (bytes of a group's local
 * array: the view's largest need in 8 KB steps). The local array is static, not a __local kernel argument: PoCL 3.1 ran
 * concurrent work-groups of 256 items on one buffer for such an argument (wrong bands whenever two threads ran).
 */
#include "common.h"

#define BANDS_THREADS 256 /* work-items a group (the host's THREADS) */
#define BANDS_U 8         /* weight gradient: output columns a step (DWB_U) */
#define BANDS_ROWS 2048   /* positions a unit about (DWB_ROWS) */
#define BANDS_MAX 49152   /* local bytes a unit's planes may take (DWB_MAX_BYTES) */
#define BANDS_SU 4        /* Note [staged loads]: loads a work-item issues before it stores them (PC_DWB_SU) */

/* e / d for 0 <= e < 2**22 from r = 1.0f / d (as pc_dwb_div): exact, no integer division (Note [staged loads]). */
inline idx_t bands_div(idx_t e, float r) { return (idx_t)(((float)e + 0.5f) * r); }

/* The source offset of plane p's image and channel (as pc_dwb_plane, Note [staged loads]). */
inline idx_t bands_plane(idx_t p, idx_t K, idx_t m, float rk, bool fk, idx_t s0, idx_t s1) {
    const idx_t n = fk ? bands_div(p, rk) : p / K, k = p - n * K;
    return n * s0 + (m == 1 ? k : k / m) * s1;
}

/* Note [staged loads] (cuda/conv_depthwise_bands.cuh): LW work-items share a staged row in the row form, the smallest
 * power of two from 4 to 32 that is at least the row's width, 32 for wider rows (as pc_dwb_lanes). */
inline idx_t bands_lanes(idx_t cols) {
    idx_t lw = 32;
    while (lw > 4 && lw / 2 >= cols) lw /= 2;
    return lw;
}

/* One axis of a result (as pc_dwb_axis): output o (of D) is result index o * os + oph; filter step c (of R) reads
 * source index o * S - p + c * DL and weight tap w0 + ws * c. */
typedef struct { idx_t D, R, p, w0, ws, os, oph; } bands_axis;

inline bands_axis bands_axis_of(int flip, idx_t Y, idx_t X, idx_t R, idx_t P, idx_t DL, idx_t ph) {
    bands_axis a;
    if (flip == 0) {
        a.D = Y; a.R = R; a.p = P; a.w0 = 0; a.ws = 1; a.os = 1; a.oph = 0;
    } else if (flip == 1) {
        a.D = X; a.R = R; a.p = (R - 1) * DL - P; a.w0 = R - 1; a.ws = -1; a.os = 1; a.oph = 0;
    } else {
        const idx_t rmax = (R - 1) - (((R - 1 - ph - P) % 2) + 2) % 2;
        a.D = (X - ph + 1) / 2; a.R = rmax >= 0 ? rmax / 2 + 1 : 0; a.p = (rmax - ph - P) / 2; a.w0 = rmax;
        a.ws = -2; a.os = 2; a.oph = ph;
    }
    return a;
}

#define BANDS_CH_MAX (BANDS_CH > BANDS_CHP ? BANDS_CH : BANDS_CHP)
#define BANDS_WIN_MAX ((BANDS_VH - 1) * 2 + BANDS_CH_MAX)
#ifndef BANDS_CLIP
#define BANDS_CLIP 0
#endif

/* Note [bands columns] (cuda/conv_depthwise_bands.cuh): the filter columns lo .. lo + n - 1 whose source column
 * r2 dl - base lies inside the source. */
inline void bands_cols(idx_t base, idx_t src, idx_t dl, idx_t R2, idx_t *lo, idx_t *n) {
    *lo = base > 0 ? (base + dl - 1) / dl : 0;
    const idx_t hi = base + src > 0 ? (base + src + dl - 1) / dl : 0;
    *n = (hi < R2 ? hi : R2) - *lo;
    if (*n < 0) *n = 0;
}

/* fwd (flip 0: x -> y), bwd-data (flip 1 or 2: dy -> dx); S: the rows' stride of the source walk; ch: filter rows a
 * step (constants after inlining). */
inline void bands(const conv_desc *d, __global const T *src, __global const T *w, __global const T *b,
                  __global T *dst, __local ACC *pool, const int S, const int flip, const int ch) {
    const idx_t ph = (idx_t)get_group_id(1);
    const bands_axis A1 = bands_axis_of(flip, d->Y[1], d->X[1], d->R[1], d->P[1], d->DL[1], ph >> 1);
    const bands_axis A2 = bands_axis_of(flip, d->Y[2], d->X[2], d->R[2], d->P[2], d->DL[2], ph & 1);
    const idx_t D1 = A1.D, D2 = A2.D, R1 = A1.R, R2 = A2.R;
    const idx_t DL2 = flip == 2 ? 1 : d->DL[2], S2 = flip ? 1 : d->S[2];
    const idx_t K = flip ? d->G : d->G * d->KG, m = flip ? 1 : d->KG;
    const idx_t Src1 = flip ? d->Y[1] : d->X[1], Src2 = flip ? d->Y[2] : d->X[2];
    const idx_t s0 = flip ? d->ys[0] : d->xs[0], s1 = flip ? d->ys[1] : d->xs[1];
    const idx_t s3 = flip ? d->ys[3] : d->xs[3], s4 = flip ? d->ys[4] : d->xs[4];
    const idx_t t0 = flip ? d->xs[0] : d->ys[0], t1 = flip ? d->xs[1] : d->ys[1];
    const idx_t t3 = flip ? d->xs[3] : d->ys[3], t4 = flip ? d->xs[4] : d->ys[4];
    const idx_t so = flip ? d->yo : d->xo, to = flip ? d->xo : d->yo;
    /* No work-item returns before the barrier (PoCL forms its work-item loops around barriers that every item of
     * the group reaches): a phase past a 1-wide dX and blocks past the last plane stage nothing and write nothing. */
    const bool some = D1 > 0 && D2 > 0;
    const idx_t L = (idx_t)get_local_size(0), tid = (idx_t)get_local_id(0);
    const idx_t G = some ? L / D2 : 1, gp = (D1 + BANDS_VH - 1) / BANDS_VH;
    const idx_t TH = !some ? 1 : gp <= G ? D1 : G * BANDS_VH, bands_n = (D1 + TH - 1) / TH, gb = (TH + BANDS_VH - 1) / BANDS_VH;
    const idx_t P = d->red, R1c = (R1 + ch - 1) / ch * ch;
    const idx_t rows = (gb * BANDS_VH - 1) * S + R1c, cols = (D2 - 1) * S2 + (R2 > 0 ? R2 - 1 : 0) * DL2 + 1;
    const idx_t plane = rows * cols, NK = d->N * K;
    const idx_t band = (idx_t)get_group_id(0) % bands_n, p0 = (idx_t)get_group_id(0) / bands_n * P;
    const bool live = some && p0 < NK; /* the grid covers the phase with the most bands */
    const idx_t o1b = band * TH, i1b = o1b * S - A1.p;
    __local ACC *wsm = pool + P * plane;
    const float rc = 1.0f / (float)(cols > 0 ? cols : 1), rr = 1.0f / (float)rows, rk = 1.0f / (float)K;
    const bool fk = NK + P <= (1 << 22); /* every p of the group divides by K as bands_div */
    const bool rows_form = S == 2 && flip == 0; /* Note [staged loads]: the row form, else the element form */
    const idx_t nrows = P * rows, LW = bands_lanes(cols), nq = L / LW;
    for (idx_t r0 = tid / LW; live && rows_form && r0 < nrows; r0 += BANDS_SU * nq) {
        idx_t at[BANDS_SU];
        bool ok[BANDS_SU];
        for (int su = 0; su < BANDS_SU; ++su) {
            const idx_t r = r0 + su * nq, pl = bands_div(r, rr), p = p0 + pl, i1 = i1b + r - pl * rows;
            ok[su] = r < nrows && p < NK && i1 >= 0 && i1 < Src1;
            at[su] = ok[su] ? so + bands_plane(p, K, m, rk, fk, s0, s1) + i1 * s3 : 0;
        }
        for (idx_t j = tid % LW; j < cols; j += LW) {
            const idx_t i2 = j - A2.p;
            const bool in2 = i2 >= 0 && i2 < Src2;
            ACC v[BANDS_SU];
            for (int su = 0; su < BANDS_SU; ++su) v[su] = ok[su] && in2 ? (ACC)LD(src, at[su] + i2 * s4) : (ACC)0;
            for (int su = 0; su < BANDS_SU; ++su)
                if (r0 + su * nq < nrows) pool[(r0 + su * nq) * cols + j] = v[su];
        }
    }
    for (idx_t e0 = tid; live && !rows_form && e0 < P * plane; e0 += BANDS_SU * L) {
        ACC v[BANDS_SU];
        for (int su = 0; su < BANDS_SU; ++su) {
            const idx_t e = e0 + su * L;
            const idx_t pr = bands_div(e, rc), j = e - pr * cols, pl = bands_div(pr, rr), p = p0 + pl;
            const idx_t i1 = i1b + pr - pl * rows, i2 = j - A2.p;
            v[su] = e < P * plane && p < NK && i1 >= 0 && i1 < Src1 && i2 >= 0 && i2 < Src2
                        ? (ACC)LD(src, so + bands_plane(p, K, m, rk, fk, s0, s1) + i1 * s3 + i2 * s4) : (ACC)0;
        }
        for (int su = 0; su < BANDS_SU; ++su)
            if (e0 + su * L < P * plane) pool[e0 + su * L] = v[su];
    }
    for (idx_t e = tid; live && e < P * R1c * R2; e += L) {
        const idx_t pl = e / (R1c * R2), c1 = (e - pl * R1c * R2) / R2, c2 = e - pl * R1c * R2 - c1 * R2;
        const idx_t k = (p0 + pl) % K;
        wsm[e] = c1 < R1 ? (ACC)LD(w, d->wo + k * d->ws[0] + (A1.w0 + A1.ws * c1) * d->ws[3] +
                                          (A2.w0 + A2.ws * c2) * d->ws[4]) : (ACC)0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!live || tid >= P * gb * D2) return;
    const idx_t pl = tid / (gb * D2), g = (tid - pl * gb * D2) / D2, o2 = tid - pl * gb * D2 - g * D2, p = p0 + pl;
    if (p >= NK) return;
    __local const ACC *col0 = pool + pl * plane + g * BANDS_VH * S * cols + o2 * S2;
    __local const ACC *wpl = wsm + pl * R1c * R2;
    ACC acc[BANDS_VH];
    for (int v = 0; v < BANDS_VH; ++v) acc[v] = 0;
    const int win_n = (BANDS_VH - 1) * S + ch;
    idx_t r2lo = 0, n2 = R2; /* Note [bands columns]: the host sets BANDS_CLIP where it pays */
    if ((BANDS_CLIP & (flip ? 2 : 1)) != 0) bands_cols(A2.p - o2 * S2, Src2, DL2, R2, &r2lo, &n2);
    for (idx_t r1c = 0; r1c < R1c; r1c += ch) {
        for (idx_t r2 = r2lo; r2 < r2lo + n2; ++r2) {
            __local const ACC *col = col0 + r1c * cols + r2 * DL2;
            ACC wv[BANDS_CH_MAX], win[BANDS_WIN_MAX];
            for (int c = 0; c < ch; ++c) wv[c] = wpl[(r1c + c) * R2 + r2];
            for (int t = 0; t < win_n; ++t) win[t] = col[t * cols];
            for (int v = 0; v < BANDS_VH; ++v)
                for (int c = 0; c < ch; ++c) acc[v] += win[v * S + c] * wv[c];
        }
    }
    const idx_t n = p / K, k = p - n * K;
    const ACC bias = d->has_bias ? (ACC)LD(b, d->bo + k * d->bs) : (ACC)0;
    const idx_t db = to + n * t0 + k * t1 + (o2 * A2.os + A2.oph) * t4;
    for (int v = 0; v < BANDS_VH; ++v) {
        const idx_t r = g * BANDS_VH + v, o1 = o1b + r;
        if (r < TH && o1 < D1) ST(dst, db + (o1 * A1.os + A1.oph) * t3, acc[v] + bias);
    }
}

/* The entries: src is x (forward) or dy (backward-data), dst y or dx. */
#define BANDS_ENTRY(name, S, FLIP, CH)                                                                               \
    __kernel void name(const conv_desc d, __global const T *src, __global const T *w, __global const T *b,          \
                       __global T *dst) {                                                                           \
        __local ACC pool[BANDS_BYTES / sizeof(ACC)];                                                                 \
        bands(&d, src, w, b, dst, pool, S, FLIP, CH);                                                                \
    }
BANDS_ENTRY(bands_fwd_s1, 1, 0, BANDS_CH)
BANDS_ENTRY(bands_fwd_s2, 2, 0, BANDS_CH)
BANDS_ENTRY(bands_bwd_data_s1, 1, 1, BANDS_CH)
BANDS_ENTRY(bands_bwd_data_s2, 1, 2, BANDS_CHP)

/* The weight gradient (as pc_dw_bands_weight): group (k, split); units of P planes x TH rows (d.red: units a split,
 * d.total: the splits). Partials of several splits go to part[(k * splits + s) * R1 * R2 + tap]. */
inline void bands_weight(const conv_desc *d, __global const T *x, __global const T *dy, __global T *dw,
                         __global ACC *part, __local ACC *pool, const int S) {
    const idx_t N = d->N, m = d->KG, k = (idx_t)get_group_id(0), s = (idx_t)get_group_id(1);
    const idx_t splits = (idx_t)get_num_groups(1);
    const idx_t D1 = d->Y[1], D2 = d->Y[2], X1 = d->X[1], X2 = d->X[2];
    const idx_t R1 = d->R[1], R2 = d->R[2], S1 = d->S[1], DL1 = d->DL[1];
    const idx_t D2c = (D2 + BANDS_U - 1) / BANDS_U * BANDS_U, segs = (R2 + BANDS_TW - 1) / BANDS_TW;
    const idx_t R2c = segs * BANDS_TW;
    const idx_t rb = BANDS_ROWS / D2c > 0 ? BANDS_ROWS / D2c : 1, TH = D1 < rb ? D1 : rb;
    const idx_t bands_n = (D1 + TH - 1) / TH;
    const idx_t rowsX = (TH - 1) * S1 + (R1 - 1) * DL1 + 1, colsX = (D2c - 1) * S + R2c;
    const idx_t xplane = rowsX * colsX, yplane = TH * D2c;
    const idx_t fit = BANDS_MAX / (idx_t)sizeof(ACC) / (xplane + yplane);
    idx_t P = TH == D1 ? (rb / D1 < N ? rb / D1 : N) : 1;
    P = P < fit ? P : fit;
    const idx_t L = (idx_t)get_local_size(0), t = (idx_t)get_local_id(0);
    const idx_t T_ = R1 * segs, Q = L / T_;
    const idx_t task = t % T_, q = t / T_, r1 = task / segs, r2a = (task - r1 * segs) * BANDS_TW;
    __local ACC *xs = pool, *ys = pool + P * xplane;
    const idx_t xc = d->xo + (k / m) * d->xs[1], yc = d->yo + k * d->ys[1];
    const float rcx = 1.0f / (float)colsX, rrx = 1.0f / (float)rowsX, rcy = 1.0f / (float)D2c, rry = 1.0f / (float)TH;
    const idx_t units = (N + P - 1) / P * bands_n, lo = s * d->red, hi = lo + d->red < units ? lo + d->red : units;
    ACC acc[BANDS_TW];
    for (int i = 0; i < BANDS_TW; ++i) acc[i] = 0;
    for (idx_t unit = lo; unit < hi; ++unit) {
        const idx_t band = unit % bands_n, n0 = unit / bands_n * P, o1b = band * TH;
        const idx_t i1b = o1b * S1 - d->P[1], i2b = -d->P[2];
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous unit's reads are done */
        for (idx_t e = t; e < P * xplane; e += L) {
            const idx_t pr = bands_div(e, rcx), j = e - pr * colsX, pl = bands_div(pr, rrx);
            const idx_t n = n0 + pl, i1 = i1b + pr - pl * rowsX, i2 = i2b + j;
            xs[e] = n < N && i1 >= 0 && i1 < X1 && i2 >= 0 && i2 < X2
                        ? (ACC)LD(x, xc + n * d->xs[0] + i1 * d->xs[3] + i2 * d->xs[4]) : (ACC)0;
        }
        for (idx_t e = t; e < P * yplane; e += L) {
            const idx_t pr = bands_div(e, rcy), j = e - pr * D2c, pl = bands_div(pr, rry);
            const idx_t n = n0 + pl, o1 = o1b + pr - pl * TH;
            ys[e] = n < N && o1 < D1 && j < D2 ? (ACC)LD(dy, yc + n * d->ys[0] + o1 * d->ys[3] + j * d->ys[4]) : (ACC)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (q >= Q) continue;
        for (idx_t row = q; row < P * TH; row += Q) {
            const idx_t pl = row / TH, o1 = row - pl * TH;
            __local const ACC *yr = ys + pl * yplane + o1 * D2c;
            __local const ACC *xr = xs + pl * xplane + (o1 * S1 + r1 * DL1) * colsX + r2a;
            for (idx_t o2 = 0; o2 < D2c; o2 += BANDS_U) {
                ACC g[BANDS_U], win[(BANDS_U - 1) * 2 + BANDS_TW];
                for (int u = 0; u < BANDS_U; ++u) g[u] = yr[o2 + u];
                for (int j = 0; j < (BANDS_U - 1) * S + BANDS_TW; ++j) win[j] = xr[o2 * S + j];
                for (int u = 0; u < BANDS_U; ++u)
                    for (int i = 0; i < BANDS_TW; ++i) acc[i] += g[u] * win[u * S + i];
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (q < Q)
        for (int i = 0; i < BANDS_TW; ++i) pool[t * BANDS_TW + i] = acc[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (idx_t e = t; e < T_ * BANDS_TW; e += L) {
        const idx_t tk = e / BANDS_TW, i = e - tk * BANDS_TW, rr1 = tk / segs, rr2 = (tk - rr1 * segs) * BANDS_TW + i;
        if (rr2 >= R2) continue;
        ACC v = 0;
        for (idx_t qq = 0; qq < Q; ++qq) v += pool[(qq * T_ + tk) * BANDS_TW + i];
        if (splits == 1)
            ST(dw, d->wo + k * d->ws[0] + rr1 * d->ws[3] + rr2 * d->ws[4], v);
        else
            part[(k * splits + s) * R1 * R2 + rr1 * R2 + rr2] = v;
    }
}

__kernel void bands_bwd_weight_s1(const conv_desc d, __global const T *x, __global const T *y, __global T *w,
                                  __global ACC *part) {
    __local ACC pool[BANDS_BYTES / sizeof(ACC)];
    bands_weight(&d, x, y, w, part, pool, 1);
}

__kernel void bands_bwd_weight_s2(const conv_desc d, __global const T *x, __global const T *y, __global T *w,
                                  __global ACC *part) {
    __local ACC pool[BANDS_BYTES / sizeof(ACC)];
    bands_weight(&d, x, y, w, part, pool, 2);
}

/* w[k, tap] = the sum over splits of part[(k * d.red + s) * taps + tap], in split order (d.total = K * taps). */
__kernel void bands_finalize(const conv_desc d, __global const ACC *part, __global T *w) {
    const idx_t i = (idx_t)get_global_id(0);
    if (i >= d.total) return;
    const idx_t taps = d.R[1] * d.R[2], k = i / taps, t = i - k * taps;
    ACC v = 0;
    for (idx_t s = 0; s < d.red; ++s) v += part[(k * d.red + s) * taps + t];
    ST(w, d.wo + k * d.ws[0] + (t / d.R[2]) * d.ws[3] + (t % d.R[2]) * d.ws[4], v);
}
