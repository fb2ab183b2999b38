/* portconv OpenCL depthwise "clw" kernels: channels-last 2-D filters of 2 to 9 taps an axis, work-items over channels.
 *
 * The OpenCL form of Note [depthwise clw] (cuda/conv_depthwise_clw.cuh: the same algorithm, rule and geometry, which
 * the host takes from portconv/dwclw.py). In channels-last data the C values of one position are contiguous, so
 * work-items that take consecutive groups of CLW_VC channels (the dtype's Geometry.vc, one access of VC values)
 * read and write whole lines with no gather. A work-group is CT <= CLW_CTMAX channel groups by
 * SY = CLW_THREADS / CT lanes (clw_ct); its filters, R1 x R2 taps of its CT x VC channels (flipped for
 * backward-data), are staged once in local memory as [tap][channel] so a lane reads its VC weights of a tap in one
 * access. The filter size is the module's (CLW_R1, CLW_R2): every loop over taps has constant bounds, and a lane's
 * work holds in private memory.
 *   Forward (stride S = 1 or 2 on both axes) and backward-data (stride 1: the forward over dY with the flipped filter
 *   and padding R - 1 - P; stride 2: a phase a group of dimension 2, Note [clw phases] of the CUDA set): a lane
 *   forms TH x VW outputs of its channels. It walks the (TH - 1) S + R1 source rows
 *   of its tile once, each as a window of (VW - 1) S + R2 vectors, and adds every row into each of the TH output
 *   rows it reaches (tap row i - t S).
 *   Weight gradient: a lane owns one filter row r1 of its channels, R2 x VC sums in private memory, over one split
 *   of the (n, output row, strip of VWW columns) units: per unit it reads the strip of dY and the X window of row
 *   o S - P1 + r1. Several splits write partials[s][k][tap], which clw_finalize adds in split order: deterministic,
 *   no atomics.
 * Invariants:
 *   - The vector path (clw_vec_ok, uniform over a launch: the descriptor's strides and offsets) needs multiplier 1,
 *     unit channel stride on x and y, C and every other stride of x and y multiples of VC, and x / y offsets that
 *     are multiples of VC (buffers start aligned), so every vector access is naturally aligned. Otherwise the same
 *     bodies run with one channel a lane: odd C and offset views still run.
 *   - Channel tiles and spatial tiles (units) are loops over the grid, so any grid computes every output; the host
 *     (clw_grid, clw_splits of portconv/dwclw.py) picks the grid, work-groups of CLW_THREADS.
 *   - The local array is static (as in bands.cl: PoCL 3.1 ran concurrent work-groups on one buffer for a __local
 *     kernel argument); CLW_WSH values, at most 48 KB (the host takes these kernels only where that holds). Every
 *     work-item of a group reaches every barrier: the channel-tile loop's bounds depend on the group only, and no
 *     work-item leaves before a barrier.
 * Same canonical convolution and descriptor as conv.cl (common.h): C = d.G (K = C), offsets d.xo, d.wo, d.yo, d.bo;
 * the weight gradient's splits d.total and units a split d.red.
 *
 * Defines (host): the dtype, optional IDX64, CLW_R1, CLW_R2, and the dtype's geometry CLW_VC, CLW_TH, CLW_VW,
 * CLW_VWW, CLW_ROWLOOP (portconv/dwclw.py, DWC_GEOMETRY); the defaults below are its 16-bit values.
 */
#include "common.h"

#ifndef CLW_R1
#define CLW_R1 7 /* filter rows of the module's view */
#endif
#ifndef CLW_R2
#define CLW_R2 7 /* filter columns */
#endif
#ifndef CLW_TH
#define CLW_TH 1 /* output rows a lane (forward, backward-data) */
#endif
#ifndef CLW_VW
#define CLW_VW 8 /* output columns a lane */
#endif
#ifndef CLW_VWW
#define CLW_VWW 16 /* output columns a weight-gradient unit */
#endif
#ifndef CLW_ROWLOOP
#define CLW_ROWLOOP 0 /* 1: a tile's source rows in a loop, not unrolled (Note [clw row loop], dwclw.py) */
#endif
#define CLW_THREADS 256 /* work-items a group (the host's THREADS) */
#define CLW_CTMAX 32    /* channel groups a group at most (DWC_CTMAX) */

/* Channels a lane on the vector path (the host's Geometry.vc: 1, 2 or 4; float64 1) and their accumulators as one
 * vector. */
#ifndef CLW_VC
#define CLW_VC 4
#endif
#if CLW_VC == 1
typedef ACC clw_accv;
#define CLW_UNPACK(r, v) ((r)[0] = (v))
#elif CLW_VC == 2 && !defined(DTYPE_F64)
typedef float2 clw_accv;
#define CLW_UNPACK(r, v) ((r)[0] = (v).s0, (r)[1] = (v).s1)
#elif CLW_VC == 4 && !defined(DTYPE_F64)
typedef float4 clw_accv;
#define CLW_UNPACK(r, v) ((r)[0] = (v).s0, (r)[1] = (v).s1, (r)[2] = (v).s2, (r)[3] = (v).s3)
#else
#error "portconv: CLW_VC must be 1, 2 or 4 (float64: 1)"
#endif
#define CLW_WSH (CLW_R1 * CLW_R2 * CLW_CTMAX * CLW_VC) /* staged filter values of a group */
#define CLW_WIN ((CLW_VW - 1) * 2 + CLW_R2)            /* a forward window, the longest stride's */
#define CLW_WWIN ((CLW_VWW - 1) * 2 + CLW_R2)          /* a weight-gradient window */

/* Channel groups a work-group for CV >= 1 groups in all: at most CTMAX and at most `lanes` (the weight gradient's
 * group has R1 lanes a channel group), balanced over the fewest channel tiles (as pc_dwc_ct, clw_groups). */
inline idx_t clw_ct(idx_t CV, idx_t lanes) {
    const idx_t cap = lanes < CLW_CTMAX ? lanes : CLW_CTMAX, tiles = (CV + cap - 1) / cap;
    return (CV + tiles - 1) / tiles;
}

/* The vector path applies (see the header): uniform over the launch. */
inline bool clw_vec_ok(const conv_desc *d) {
    if (CLW_VC <= 1 || d->KG != 1 || d->G % CLW_VC != 0 || d->xs[1] != 1 || d->ys[1] != 1) return false;
    if (d->xs[0] % CLW_VC || d->xs[2] % CLW_VC || d->xs[3] % CLW_VC || d->xs[4] % CLW_VC) return false;
    if (d->ys[0] % CLW_VC || d->ys[2] % CLW_VC || d->ys[3] % CLW_VC || d->ys[4] % CLW_VC) return false;
    return d->xo % CLW_VC == 0 && d->yo % CLW_VC == 0;
}

/* r[0 .. VC) <- p[0 .. VC): one naturally aligned access (the vector path). */
inline void clw_ldv(ACC *r, __global const T *p) {
#if CLW_VC == 1
    r[0] = (ACC)LD(p, 0);
#else
#if defined(DTYPE_F16) && CLW_VC == 2
    const float2 v = vload_half2(0, p);
#elif defined(DTYPE_F16)
    const float4 v = vload_half4(0, p);
#elif defined(DTYPE_BF16) && CLW_VC == 2
    const ushort2 u = *(__global const ushort2 *)p;
    const float2 v = (float2)(bf16_load(u.s0), bf16_load(u.s1));
#elif defined(DTYPE_BF16)
    const ushort4 u = *(__global const ushort4 *)p;
    const float4 v = (float4)(bf16_load(u.s0), bf16_load(u.s1), bf16_load(u.s2), bf16_load(u.s3));
#else
    const clw_accv v = *(__global const clw_accv *)p;
#endif
    CLW_UNPACK(r, v);
#endif
}

/* p[0 .. VC) <- a[0 .. VC), rounded to T: one naturally aligned access (the vector path). */
inline void clw_stv(__global T *p, const ACC *a) {
#if CLW_VC == 1
    ST(p, 0, a[0]);
#elif defined(DTYPE_F16) && CLW_VC == 2
    vstore_half2_rte((float2)(a[0], a[1]), 0, p);
#elif defined(DTYPE_F16)
    vstore_half4_rte((float4)(a[0], a[1], a[2], a[3]), 0, p);
#elif defined(DTYPE_BF16) && CLW_VC == 2
    *(__global ushort2 *)p = (ushort2)(bf16_round(a[0]), bf16_round(a[1]));
#elif defined(DTYPE_BF16)
    *(__global ushort4 *)p = (ushort4)(bf16_round(a[0]), bf16_round(a[1]), bf16_round(a[2]), bf16_round(a[3]));
#elif CLW_VC == 2
    *(__global float2 *)p = (float2)(a[0], a[1]);
#else
    *(__global float4 *)p = (float4)(a[0], a[1], a[2], a[3]);
#endif
}

/* One window row of `win` positions (as pc_dwt_row): r[t][j] = src[base + (b2 + t) s4 + j], zero outside [0, E2)
 * or where !ok; vc: channels a lane (CLW_VC on the vector path, else 1). */
inline void clw_row(ACC (*r)[CLW_VC], const int win, __global const T *src, idx_t base, bool ok, idx_t b2, idx_t E2,
                    idx_t s4, const int vc) {
    for (int t = 0; t < win; ++t) {
        const idx_t i2 = b2 + t;
        if (ok && i2 >= 0 && i2 < E2) {
            if (vc > 1)
                clw_ldv(r[t], src + base + i2 * s4);
            else
                r[t][0] = (ACC)LD(src, base + i2 * s4);
        } else {
            for (int j = 0; j < vc; ++j) r[t][j] = 0;
        }
    }
}

/* Store one output row of a tile (as pc_dwt_store): VW positions of vc channels, bias added, positions from `left`
 * on (past the row's end) skipped. */
inline void clw_store(__global T *dst, idx_t o, idx_t ds4, idx_t left, ACC (*acc)[CLW_VC], const ACC *bias,
                      const int vc) {
    for (int v = 0; v < CLW_VW; ++v) {
        if (v >= left) break;
        if (vc > 1) {
            ACC out[CLW_VC];
            for (int j = 0; j < CLW_VC; ++j) out[j] = acc[v][j] + bias[j];
            clw_stv(dst + o + v * ds4, out);
        } else {
            ST(dst, o + v * ds4, acc[v][0] + bias[0]);
        }
    }
}

/* Stage the filters of channel groups cg0 .. cg0 + CT - 1 (vc channels each) as wsh[tap][lane vc + j]; flip: tap
 * (r1, r2) holds w[R1 - 1 - r1][R2 - 1 - r2]; channels past C hold zeros. */
inline void clw_stage(__local ACC *wsh, const conv_desc *d, __global const T *w, idx_t cg0, idx_t CT, const int flip,
                      const int vc) {
    const idx_t lanes = CT * vc, C = d->G;
    for (idx_t i = (idx_t)get_local_id(0); i < CLW_R1 * CLW_R2 * lanes; i += (idx_t)get_local_size(0)) {
        const idx_t tap = i / lanes, c = cg0 * vc + (i - tap * lanes);
        const idx_t r1 = tap / CLW_R2, r2 = tap - r1 * CLW_R2;
        const idx_t q1 = flip ? CLW_R1 - 1 - r1 : r1, q2 = flip ? CLW_R2 - 1 - r2 : r2;
        wsh[i] = c < C ? (ACC)LD(w, c * d->ws[0] + q1 * d->ws[3] + q2 * d->ws[4]) : (ACC)0;
    }
}

/* Stage phase get_group_id(2)'s filter of channel groups cg0 .. cg0 + CT - 1 (Note [clw phases]): tap (t1, t2) of
 * TM1 x TM2 = ((R1 + 1) / 2, (R2 + 1) / 2) holds w[q1 + 2 (T1 - 1 - u1)][q2 + 2 (T2 - 1 - u2)], u = t - (TM - T),
 * zero where u < 0. */
inline void clw_stage_phase(__local ACC *wsh, const conv_desc *d, __global const T *w, idx_t cg0, idx_t CT,
                            const int vc) {
    const int TM1 = (CLW_R1 + 1) / 2, TM2 = (CLW_R2 + 1) / 2;
    const int p1 = (int)get_group_id(2) >> 1, p2 = (int)get_group_id(2) & 1;
    const int q1 = (int)((p1 + d->P[1]) & 1), q2 = (int)((p2 + d->P[2]) & 1);
    const int T1 = (CLW_R1 - q1 + 1) / 2, T2 = (CLW_R2 - q2 + 1) / 2;
    const idx_t lanes = CT * vc, C = d->G;
    for (idx_t i = (idx_t)get_local_id(0); i < TM1 * TM2 * lanes; i += (idx_t)get_local_size(0)) {
        const idx_t tap = i / lanes, c = cg0 * vc + (i - tap * lanes);
        const int u1 = (int)(tap / TM2) - (TM1 - T1), u2 = (int)(tap % TM2) - (TM2 - T2);
        wsh[i] = c < C && u1 >= 0 && u2 >= 0 ? (ACC)LD(w, c * d->ws[0] + (idx_t)(q1 + 2 * (T1 - 1 - u1)) * d->ws[3] +
                                                         (idx_t)(q2 + 2 * (T2 - 1 - u2)) * d->ws[4])
                                              : (ACC)0;
    }
}

/* The TH x VW tiles of lane ty (of SY; the group's x: tiles from get_group_id(0) * SY on) of channel group cv, the
 * CT groups' filters staged in wsh from group cv - tx: forward (flip 0: x -> y, stride S), stride-1 backward-data
 * (flip 1: dY -> dX, the flipped filter) or a phase of the stride-2 one (flip 1, ph 1: Note [clw phases]), vc
 * channels a lane (S, flip, ph, vc: constants after inlining). */
inline void clw_tiles(const conv_desc *d, __global const T *src, __global const T *b, __global T *dst,
                      __local const ACC *wsh, idx_t cv, idx_t tx, idx_t ty, idx_t CT, idx_t SY, const int S,
                      const int flip, const int ph, const int vc) {
    const int R1 = ph ? (CLW_R1 + 1) / 2 : CLW_R1, R2 = ph ? (CLW_R2 + 1) / 2 : CLW_R2, TH = CLW_TH, VW = CLW_VW;
    const int WIN = (VW - 1) * S + R2, ROWS = (TH - 1) * S + R1;
    const idx_t E1 = flip ? d->Y[1] : d->X[1], E2 = flip ? d->Y[2] : d->X[2];
    const idx_t D1 = flip ? d->X[1] : d->Y[1], D2 = flip ? d->X[2] : d->Y[2];
    const idx_t ss0 = flip ? d->ys[0] : d->xs[0], ss1 = flip ? d->ys[1] : d->xs[1];
    const idx_t ss3 = flip ? d->ys[3] : d->xs[3], ss4 = flip ? d->ys[4] : d->xs[4];
    const idx_t ds0 = flip ? d->xs[0] : d->ys[0], ds1 = flip ? d->xs[1] : d->ys[1];
    const idx_t ds3 = flip ? d->xs[3] : d->ys[3], ds4 = flip ? d->xs[4] : d->ys[4];
    idx_t P1 = flip ? R1 - 1 - d->P[1] : d->P[1], P2 = flip ? R2 - 1 - d->P[2] : d->P[2];
    idx_t D1p = D1, D2p = D2, ds3p = ds3, ds4p = ds4, dp = 0; /* the phase's outputs (Note [clw phases]) */
    if (ph) {
        const int p1 = (int)get_group_id(2) >> 1, p2 = (int)get_group_id(2) & 1;
        const int q1 = (int)((p1 + d->P[1]) & 1), q2 = (int)((p2 + d->P[2]) & 1);
        P1 = R1 - 1 - (p1 + d->P[1] - q1) / 2, P2 = R2 - 1 - (p2 + d->P[2] - q2) / 2;
        D1p = (D1 - p1 + 1) / 2, D2p = (D2 - p2 + 1) / 2, ds3p = 2 * ds3, ds4p = 2 * ds4, dp = p1 * ds3 + p2 * ds4;
    }
    const idx_t T1 = (D1p + TH - 1) / TH, NS = (D2p + VW - 1) / VW, tiles = d->N * T1 * NS;
    const idx_t c = cv * vc;
    __local const clw_accv *wl = (__local const clw_accv *)wsh + tx;
    ACC bias[CLW_VC];
    for (int j = 0; j < vc; ++j) bias[j] = !flip && d->has_bias ? (ACC)LD(b, (c + j) * d->bs) : (ACC)0;
    for (idx_t sp = (idx_t)get_group_id(0) * SY + ty; sp < tiles; sp += (idx_t)get_num_groups(0) * SY) {
        const idx_t s = sp % NS, t1 = (sp / NS) % T1, n = sp / (NS * T1);
        const idx_t d1s = t1 * TH, d2s = s * VW, b1 = d1s * S - P1, b2 = d2s * S - P2;
        const idx_t rb = n * ss0 + c * ss1;
        ACC acc[CLW_TH][CLW_VW][CLW_VC];
        for (int t = 0; t < TH; ++t)
            for (int v = 0; v < VW; ++v)
                for (int j = 0; j < vc; ++j) acc[t][v][j] = 0;
#if CLW_ROWLOOP
#pragma unroll 1
#endif
        for (int i = 0; i < ROWS; ++i) {
            const idx_t i1 = b1 + i;
            ACC row[CLW_WIN][CLW_VC];
            clw_row(row, WIN, src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2, ss4, vc);
            for (int t = 0; t < TH; ++t) {
                const int r1 = i - t * S;
                if (r1 < 0 || r1 >= R1) continue;
                for (int r2 = 0; r2 < R2; ++r2) {
                    ACC wv[CLW_VC];
                    if (vc > 1) {
                        const clw_accv q = wl[(r1 * R2 + r2) * CT];
                        CLW_UNPACK(wv, q);
                    } else {
                        wv[0] = wsh[(r1 * R2 + r2) * CT + tx];
                    }
                    for (int v = 0; v < VW; ++v)
                        for (int j = 0; j < vc; ++j) acc[t][v][j] += row[v * S + r2][j] * wv[j];
                }
            }
        }
        const idx_t db = n * ds0 + c * ds1 + dp;
        for (int t = 0; t < TH; ++t)
            if (d1s + t < D1p) clw_store(dst, db + (d1s + t) * ds3p + d2s * ds4p, ds4p, D2p - d2s, acc[t], bias, vc);
    }
}

/* Forward or backward-data (clw_tiles) over the channel tiles of the group's y: stage, then every lane's tiles; vc
 * channels a lane. */
inline void clw_conv(const conv_desc *d, __global const T *src, __global const T *w, __global const T *b,
                     __global T *dst, __local ACC *wsh, const int S, const int flip, const int ph, const int vc) {
    src += flip ? d->yo : d->xo;
    dst += flip ? d->xo : d->yo;
    w += d->wo;
    b += d->bo;
    const idx_t CV = d->G / vc, CT = clw_ct(CV, CLW_THREADS), SY = CLW_THREADS / CT;
    const idx_t tx = (idx_t)get_local_id(0) % CT, ty = (idx_t)get_local_id(0) / CT;
    for (idx_t cg0 = (idx_t)get_group_id(1) * CT; cg0 < CV; cg0 += (idx_t)get_num_groups(1) * CT) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous channel tile's reads of wsh are done */
        if (ph)
            clw_stage_phase(wsh, d, w, cg0, CT, vc);
        else
            clw_stage(wsh, d, w, cg0, CT, flip, vc);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ty < SY && cg0 + tx < CV) clw_tiles(d, src, b, dst, wsh, cg0 + tx, tx, ty, CT, SY, S, flip, ph, vc);
    }
}

/* Weight gradient, vc channels a lane; group x: the split (d.total splits of d.red units). No barrier in this body. */
inline void clw_weight(const conv_desc *d, __global const T *x, __global const T *dy, __global T *dw,
                       __global ACC *part, const int S, const int vc) {
    const int R1 = CLW_R1, R2 = CLW_R2, VW = CLW_VWW, WIN = (VW - 1) * S + R2;
    x += d->xo;
    dy += d->yo;
    dw += d->wo;
    const idx_t X1 = d->X[1], X2 = d->X[2], Y1 = d->Y[1], Y2 = d->Y[2], C = d->G;
    const idx_t CV = C / vc, CT = clw_ct(CV, CLW_THREADS / R1);
    const idx_t tx = (idx_t)get_local_id(0) % CT, r1 = (idx_t)get_local_id(0) / CT;
    const idx_t NS = (Y2 + VW - 1) / VW, units = d->N * Y1 * NS, sp = (idx_t)get_group_id(0);
    const idx_t lo = sp * d->red, hi = lo + d->red < units ? lo + d->red : units;
    const idx_t taps = R1 * R2;
    for (idx_t cg0 = (idx_t)get_group_id(1) * CT; cg0 < CV; cg0 += (idx_t)get_num_groups(1) * CT) {
        const idx_t cv = cg0 + tx;
        if (r1 >= R1 || cv >= CV) continue;
        const idx_t c = cv * vc;
        ACC acc[CLW_R2][CLW_VC];
        for (int r2 = 0; r2 < R2; ++r2)
            for (int j = 0; j < vc; ++j) acc[r2][j] = 0;
        for (idx_t u = lo; u < hi; ++u) {
            const idx_t s = u % NS, o1 = (u / NS) % Y1, n = u / (NS * Y1);
            const idx_t i1 = o1 * d->S[1] - d->P[1] + r1;
            if (i1 < 0 || i1 >= X1) continue;
            const idx_t o2 = s * VW;
            ACC g[CLW_VWW][CLW_VC], row[CLW_WWIN][CLW_VC];
            clw_row(g, VW, dy, n * d->ys[0] + c * d->ys[1] + o1 * d->ys[3], true, o2, Y2, d->ys[4], vc);
            clw_row(row, WIN, x, n * d->xs[0] + c * d->xs[1] + i1 * d->xs[3], true, o2 * S - d->P[2], X2, d->xs[4],
                    vc);
            for (int r2 = 0; r2 < R2; ++r2)
                for (int v = 0; v < VW; ++v)
                    for (int j = 0; j < vc; ++j) acc[r2][j] += g[v][j] * row[v * S + r2][j];
        }
        for (int r2 = 0; r2 < R2; ++r2)
            for (int j = 0; j < vc; ++j) {
                const idx_t k = c + j, tap = r1 * R2 + r2;
                if (d->total == 1)
                    ST(dw, k * d->ws[0] + r1 * d->ws[3] + r2 * d->ws[4], acc[r2][j]);
                else
                    part[sp * C * taps + k * taps + tap] = acc[r2][j];
            }
    }
}

/* The entries: src is x (forward) or dy (backward-data), dst y or dx; the vector path or one channel a lane. */
#define CLW_CONV_ENTRY(name, S, FLIP, PH)                                                                             \
    __kernel void name(const conv_desc d, __global const T *src, __global const T *w, __global const T *b,          \
                       __global T *dst) {                                                                           \
        __local clw_accv wsh[CLW_WSH / CLW_VC];                                                                      \
        if (CLW_VC > 1 && clw_vec_ok(&d))                                                                            \
            clw_conv(&d, src, w, b, dst, (__local ACC *)wsh, S, FLIP, PH, CLW_VC);                                   \
        else                                                                                                         \
            clw_conv(&d, src, w, b, dst, (__local ACC *)wsh, S, FLIP, PH, 1);                                        \
    }
CLW_CONV_ENTRY(clw_fwd_s1, 1, 0, 0)
CLW_CONV_ENTRY(clw_fwd_s2, 2, 0, 0)
CLW_CONV_ENTRY(clw_bwd_data_s1, 1, 1, 0)
CLW_CONV_ENTRY(clw_bwd_data_s2, 1, 1, 1) /* Note [clw phases]: a phase a group of dimension 2 */

#define CLW_WEIGHT_ENTRY(name, S)                                                                                     \
    __kernel void name(const conv_desc d, __global const T *x, __global const T *y, __global T *w,                  \
                       __global ACC *part) {                                                                        \
        if (CLW_VC > 1 && clw_vec_ok(&d))                                                                            \
            clw_weight(&d, x, y, w, part, S, CLW_VC);                                                                \
        else                                                                                                         \
            clw_weight(&d, x, y, w, part, S, 1);                                                                     \
    }
CLW_WEIGHT_ENTRY(clw_bwd_weight_s1, 1)
CLW_WEIGHT_ENTRY(clw_bwd_weight_s2, 2)

/* w[k, tap] = the sum over splits of part[s * K * taps + k * taps + tap] in split order (d.total = K * taps values,
 * d.red splits). */
__kernel void clw_finalize(const conv_desc d, __global const ACC *part, __global T *w) {
    const idx_t e = (idx_t)get_global_id(0);
    if (e >= d.total) return;
    const idx_t k = e / (CLW_R1 * CLW_R2), t = e - k * (CLW_R1 * CLW_R2);
    ACC v = 0;
    for (idx_t s = 0; s < d.red; ++s) v += part[s * d.total + e];
    ST(w, d.wo + k * d.ws[0] + (t / CLW_R2) * d.ws[3] + (t % CLW_R2) * d.ws[4], v);
}
