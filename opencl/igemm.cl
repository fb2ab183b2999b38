/* portconv OpenCL implicit-GEMM kernels (igemm_*) for dense convolutions: forward, backward-data by phases,
 * split backward-weight and its finalize. Same canonical convolution and descriptor as conv.cl (Note
 * [canonical convolution] in common.h).
 *
 * Note [OpenCL implicit GEMM]: the design of the CUDA set's FMA tile (cuda/conv_igemm.cuh, Note [implicit GEMM])
 * in OpenCL C. Each direction is a GEMM whose operands are gathered on the fly (no im2col buffer); per group g:
 *   forward      Y[m, n]  = sum_r A[m, r] B[r, n]; m = (n, o) over N*Y, n = k over KG, r = (c, tap) over CG*taps
 *   bwd data     dX[m, n] = ...;                   m = (n, e) over N*E (one phase), n = c over CG, r = (k, j) over KG*T
 *   bwd weight   dW[m, n] = ...;                   m = k over KG, n = (c, tap) over CG*taps, r = (n, o) over N*Y
 * A work-group of IG_NT = (IG_BM/IG_TM) x (IG_BN/IG_TN) work-items computes an IG_BM x IG_BN tile, IG_TM x IG_TN
 * results per work-item, stepping the reduction IG_BK at a time through local memory with the next step's
 * gathers loaded before the current step's products. Every load work-item owns one reduction index per step,
 * decoded once and shared by its IG_AJ A and IG_BJ B gathers. Grid: (M tiles x IG_NT, N tiles, groups x z).
 * Backward-data runs per phase (Note [bwd-data phases] in cuda/conv_igemm.cuh: grid z = groups x S0*S1*S2,
 * no division and no zero product per gather; axes with stride > 1 need dilation 1, the host sends other
 * problems to conv.cl). Backward-weight splits its N*Y reduction over grid z = groups x splits (d.total splits of
 * d.red positions), each split writing its partial tile to a workspace that igemm_finalize adds in split order:
 * deterministic, no atomics. Channels-last problems (d.c_inner) order the forward/backward-data reduction
 * channel-innermost, so neighbouring load work-items read neighbouring addresses.
 *
 * Defines (host, one program per set): the dtype and IDX64 of common.h; IG_BM, IG_BN, IG_BK, IG_TM, IG_TN (tile);
 * IG_CPU on CPU devices (helpers forced inline, as depthwise.cl's DW_CPU); IG_TC=1, IG_WM, IG_WN and IG_MMA_PTX
 * for the tensor-core products of Note [OpenCL tensor cores] (igemm_tc.h; IG_TM, IG_TN unused); IG_MFAST: load
 * work-items numbered along rows / columns first (the grad-weight of channels-last tensors, whose rows and columns
 * are channels, contiguous there; its reduction runs over positions, C elements apart); IG_TAPMAJOR: Note [OpenCL
 * tap-major steps] (forward and backward-data kernels of a program built with it).
 */
#include "common.h"

/* a*b+c, contracted to an FMA (OpenCL's default FP_CONTRACT) without PoCL's out-of-line fma() */
#define IG_FMA(a, b, c) ((a) * (b) + (c))
/* IG_PREFETCH: the next step's gathers are issued between the two barriers, before the current step's products
 * (register double buffering, GPUs); 0: after the second barrier, so the products are a barrier region of their
 * own that PoCL can vectorise across work-items (CPUs). */
#ifdef IG_CPU
#define IG_INLINE inline __attribute__((always_inline))
#define IG_PREFETCH 0
#else
#define IG_PREFETCH 1
#define IG_INLINE inline
#endif

#ifndef IG_TC
#define IG_TC 0
#endif
#ifndef IG_TAPMAJOR
#define IG_TAPMAJOR 0
#endif
#if IG_TC
#include "igemm_tc.h"
#else
#define IG_NX (IG_BN / IG_TN) /* work-items along a tile's columns */
#define IG_NY (IG_BM / IG_TM) /* and along its rows */
#define IG_NT (IG_NX * IG_NY)
#define IG_LDA (IG_BM + 1)
#define IG_LDB (IG_BN + 1)
#define IG_AS (IG_BK * IG_LDA)
#define IG_BS (IG_BK * IG_LDB)
#define IG_AT(r, m) ((r) * IG_LDA + (m))
#define IG_BT(r, n) ((r) * IG_LDB + (n))
#define IG_STAGE(v) (v)
#endif
#define IG_LQ (IG_NT / IG_BK) /* rows (columns) one load pass covers */
#define IG_AJ (IG_BM / IG_LQ)
#define IG_BJ (IG_BN / IG_LQ)
#if IG_NT % IG_BK || IG_BM % IG_LQ || IG_BN % IG_LQ
#error "portconv: the igemm tile needs IG_BK | IG_NT and IG_NT / IG_BK | IG_BM, IG_BN"
#endif

#ifdef IDX64
typedef ulong uidx_t;
#else
typedef uint uidx_t;
#endif
/* 0 <= i < n in one unsigned comparison */
#define INSIDE(i, n) ((uidx_t)(i) < (uidx_t)(n))

/* Note [OpenCL tap-major steps]: the CUDA set's Note [tap-major steps] (cuda/conv_igemm.cuh). When the channel
 * count CH of a forward or phase backward-data reduction over (channel, tap) is a multiple of IG_BK, the host runs it
 * channel-innermost (d.c_inner) with IG_TAPMAJOR: the IG_BK indices of a step then share one tap, so a load
 * work-item steps its own (channel, tap digits) by IG_BK without a division (ig_tap_next), and the bounds of its A
 * rows, which depend only on the row and the tap, are tested once per tap into a bit per row instead of once per
 * element. The ops give ig_<op>_{ch,r1,r2} (CH and the radices of the last two tap digits), ig_<op>_red_at (a Red
 * from the digits), ig_<op>_A_ok and ig_<op>_A_ld (A's bounds test and its load). */
typedef struct { idx_t ch, t0, t1, t2; } ig_tap;

IG_INLINE ig_tap ig_tap_of(idx_t r, idx_t CH, idx_t R1, idx_t R2) {
    ig_tap p;
    idx_t tap = r / CH;
    p.ch = r - tap * CH;
    p.t2 = tap % R2;
    tap /= R2;
    p.t1 = tap % R1;
    p.t0 = tap / R1;
    return p;
}

/* r += IG_BK; 1 when the tap moved (for every work-item of the group alike: ch - rr and CH are multiples of IG_BK) */
IG_INLINE int ig_tap_next(ig_tap *p, idx_t CH, idx_t R1, idx_t R2) {
    p->ch += IG_BK;
    if (p->ch < CH) return 0;
    p->ch -= CH;
    if (++p->t2 == R2) {
        p->t2 = 0;
        if (++p->t1 == R1) p->t1 = 0, ++p->t0;
    }
    return 1;
}

/* (channel, tap) of an index over CH*taps: channel-innermost when chan_inner. */
IG_INLINE void chan_tap(const conv_desc *d, idx_t r, idx_t CH, int chan_inner, idx_t *ch, idx_t *r0, idx_t *r1,
                        idx_t *r2) {
    idx_t tap;
    if (chan_inner) {
        tap = r / CH;
        *ch = r - tap * CH;
    } else {
        const idx_t taps = d->R[0] * d->R[1] * d->R[2];
        *ch = r / taps;
        tap = r - *ch * taps;
    }
    *r2 = tap % d->R[2];
    tap /= d->R[2];
    *r1 = tap % d->R[1];
    *r0 = tap / d->R[1];
}

/* ---- forward: A = x gathered at (n, o) x (c, tap), B = w ---------------------------------------------------- */
typedef struct { conv_desc d; idx_t g; } ig_fwd_op;
typedef struct { idx_t xo, i0, i1, i2; } ig_fwd_rowt;
typedef struct { idx_t wo; int ok; } ig_fwd_colt;
typedef struct { idx_t xo, wo, d0, d1, d2; int ok; } ig_fwd_redt;

IG_INLINE ig_fwd_rowt ig_fwd_row(const ig_fwd_op *op, idx_t m, idx_t M) {
    const conv_desc *d = &op->d;
    ig_fwd_rowt t;
    const int ok = m < M;
    const pos4 at = pos4_of(ok ? m : 0, d->Y[0], d->Y[1], d->Y[2]);
    const idx_t n = at.b, o0 = at.z, o1 = at.y, o2 = at.x;
    t.i0 = o0 * d->S[0] - d->P[0], t.i1 = o1 * d->S[1] - d->P[1], t.i2 = o2 * d->S[2] - d->P[2];
    t.xo = d->xo + n * d->xs[0] + op->g * d->CG * d->xs[1] + t.i0 * d->xs[2] + t.i1 * d->xs[3] + t.i2 * d->xs[4];
    if (!ok) t.i0 = d->X[0]; /* every tap out of range (r.d0 >= 0) */
    return t;
}

IG_INLINE ig_fwd_colt ig_fwd_col(const ig_fwd_op *op, idx_t k, idx_t NC) {
    ig_fwd_colt t;
    t.ok = k < NC;
    t.wo = op->d.wo + (op->g * op->d.KG + (t.ok ? k : 0)) * op->d.ws[0];
    return t;
}

IG_INLINE ig_fwd_redt ig_fwd_red(const ig_fwd_op *op, idx_t r, idx_t rend) {
    const conv_desc *d = &op->d;
    ig_fwd_redt t;
    idx_t c, r0, r1, r2;
    t.ok = r < rend;
    chan_tap(d, t.ok ? r : 0, d->CG, (int)d->c_inner, &c, &r0, &r1, &r2);
    t.wo = c * d->ws[1] + r0 * d->ws[2] + r1 * d->ws[3] + r2 * d->ws[4];
    t.d0 = r0 * d->DL[0], t.d1 = r1 * d->DL[1], t.d2 = r2 * d->DL[2];
    t.xo = c * d->xs[1] + t.d0 * d->xs[2] + t.d1 * d->xs[3] + t.d2 * d->xs[4];
    if (!t.ok) t.d0 = d->X[0] + d->P[0]; /* out of range for every row (m.i0 >= -P0) */
    return t;
}

/* Note [OpenCL tap-major steps]: channels CG, tap digits (r0, r1, r2) of radices (R1, R2); the Red of a position */
#define ig_fwd_ch(op) ((op)->d.CG)
#define ig_fwd_r1(op) ((op)->d.R[1])
#define ig_fwd_r2(op) ((op)->d.R[2])
IG_INLINE ig_fwd_redt ig_fwd_red_at(const ig_fwd_op *op, const ig_tap *p) {
    const conv_desc *d = &op->d;
    ig_fwd_redt t;
    t.ok = 1;
    t.wo = p->ch * d->ws[1] + p->t0 * d->ws[2] + p->t1 * d->ws[3] + p->t2 * d->ws[4];
    t.d0 = p->t0 * d->DL[0], t.d1 = p->t1 * d->DL[1], t.d2 = p->t2 * d->DL[2];
    t.xo = p->ch * d->xs[1] + t.d0 * d->xs[2] + t.d1 * d->xs[3] + t.d2 * d->xs[4];
    return t;
}

IG_INLINE int ig_fwd_A_ok(const ig_fwd_op *op, const ig_fwd_rowt *m, const ig_fwd_redt *r) {
    const conv_desc *d = &op->d;
    return INSIDE(m->i0 + r->d0, d->X[0]) && INSIDE(m->i1 + r->d1, d->X[1]) && INSIDE(m->i2 + r->d2, d->X[2]);
}

IG_INLINE ACC ig_fwd_A_ld(const ig_fwd_op *op, __global const T *x, const ig_fwd_rowt *m, const ig_fwd_redt *r) {
    return LD(x, m->xo + r->xo);
}

IG_INLINE ACC ig_fwd_A(const ig_fwd_op *op, __global const T *x, const ig_fwd_rowt *m, const ig_fwd_redt *r) {
    const conv_desc *d = &op->d;
    if (!(INSIDE(m->i0 + r->d0, d->X[0]) && INSIDE(m->i1 + r->d1, d->X[1]) && INSIDE(m->i2 + r->d2, d->X[2])))
        return 0;
    return LD(x, m->xo + r->xo);
}

IG_INLINE ACC ig_fwd_B(const ig_fwd_op *op, __global const T *w, const ig_fwd_redt *r, const ig_fwd_colt *n) {
    return (r->ok && n->ok) ? LD(w, n->wo + r->wo) : 0;
}

/* Note [OpenCL split stores]: result (m, n) goes to out[orow(m) + ocol(n)]; the tile decodes each of its rows and
 * columns once (pos4_of's divisions per result cost as much as a short reduction: the CUDA set's Note [split
 * stores]). */
IG_INLINE idx_t ig_fwd_orow(const ig_fwd_op *op, idx_t m) {
    const conv_desc *d = &op->d;
    const pos4 at = pos4_of(m, d->Y[0], d->Y[1], d->Y[2]);
    return d->yo + at.b * d->ys[0] + at.z * d->ys[2] + at.y * d->ys[3] + at.x * d->ys[4];
}

IG_INLINE idx_t ig_fwd_ocol(const ig_fwd_op *op, idx_t k) { return (op->g * op->d.KG + k) * op->d.ys[1]; }

IG_INLINE void ig_fwd_put(const ig_fwd_op *op, __global T *y, __global const T *b, __global ACC *wsp, idx_t row,
                          idx_t col, idx_t k, ACC v) {
    const conv_desc *d = &op->d;
    if (d->has_bias) v += LD(b, d->bo + (op->g * d->KG + k) * d->bs);
    ST(y, row + col, v);
}

#define IG_OP fwd
#define IG_TM_OP IG_TAPMAJOR
#include "igemm_tile.h"

/* ---- backward-data, one phase q: A = dy gathered at (n, e) x (k, j), B = w at tap rq + S*j ------------------- */
typedef struct {
    conv_desc d;
    idx_t g, E[3], T[3], H[3], q[3], rq[3], c[3], tp, tpd;
} ig_bwd_data_op;
typedef struct { idx_t yo, a0, a1, a2; } ig_bwd_data_rowt;
typedef struct { idx_t wo; int ok; } ig_bwd_data_colt;
typedef struct { idx_t yo, wo, j0, j1, j2; int ok; } ig_bwd_data_redt;

IG_INLINE void ig_bwd_data_init(ig_bwd_data_op *op, const conv_desc d, idx_t g, idx_t phase) {
    op->d = d, op->g = g;
    op->q[2] = phase % d.S[2], op->q[1] = (phase / d.S[2]) % d.S[1], op->q[0] = phase / (d.S[2] * d.S[1]);
    for (int a = 0; a < 3; ++a) {
        const idx_t X = d.X[a], R = d.R[a], S = d.S[a], P = d.P[a], q = op->q[a];
        op->E[a] = q < X ? (X - q + S - 1) / S : 0;
        op->rq[a] = (q + P) % S;
        op->T[a] = op->rq[a] < R ? (R - op->rq[a] + S - 1) / S : 0;
        op->c[a] = (q + P - op->rq[a]) / S;
        op->H[a] = S == 1 ? d.DL[a] : 1;
    }
    op->tp = op->T[0] * op->T[1] * op->T[2];
    /* divisors of red(); tp == 0: no reduction runs */
    op->tpd = op->tp ? op->tp : 1, op->T[1] = op->T[1] ? op->T[1] : 1, op->T[2] = op->T[2] ? op->T[2] : 1;
}

IG_INLINE ig_bwd_data_rowt ig_bwd_data_row(const ig_bwd_data_op *op, idx_t m, idx_t M) {
    const conv_desc *d = &op->d;
    ig_bwd_data_rowt t;
    const int ok = m < M;
    const pos4 at = pos4_of(ok ? m : 0, op->E[0], op->E[1], op->E[2]);
    const idx_t n = at.b, e0 = at.z, e1 = at.y, e2 = at.x;
    t.a0 = e0 + op->c[0], t.a1 = e1 + op->c[1], t.a2 = e2 + op->c[2];
    t.yo = d->yo + n * d->ys[0] + op->g * d->KG * d->ys[1] + t.a0 * d->ys[2] + t.a1 * d->ys[3] + t.a2 * d->ys[4];
    if (!ok) t.a0 = d->Y[0] + op->T[0] * op->H[0]; /* out of range for every tap (r.j0 < T0 * H0) */
    return t;
}

IG_INLINE ig_bwd_data_colt ig_bwd_data_col(const ig_bwd_data_op *op, idx_t c, idx_t NC) {
    ig_bwd_data_colt t;
    t.ok = c < NC;
    t.wo = op->d.wo + op->g * op->d.KG * op->d.ws[0] + (t.ok ? c : 0) * op->d.ws[1];
    return t;
}

IG_INLINE ig_bwd_data_redt ig_bwd_data_red(const ig_bwd_data_op *op, idx_t r, idx_t rend) {
    const conv_desc *d = &op->d;
    ig_bwd_data_redt t;
    idx_t k, j;
    t.ok = r < rend;
    const idx_t rr = t.ok ? r : 0;
    if (d->c_inner) {
        j = rr / d->KG;
        k = rr - j * d->KG;
    } else {
        k = rr / op->tpd;
        j = rr - k * op->tpd;
    }
    t.j2 = j % op->T[2];
    j /= op->T[2];
    t.j1 = j % op->T[1];
    t.j0 = j / op->T[1];
    t.wo = k * d->ws[0] + (op->rq[0] + d->S[0] * t.j0) * d->ws[2] + (op->rq[1] + d->S[1] * t.j1) * d->ws[3]
           + (op->rq[2] + d->S[2] * t.j2) * d->ws[4];
    t.j0 *= op->H[0], t.j1 *= op->H[1], t.j2 *= op->H[2]; /* from here on: dy steps */
    t.yo = k * d->ys[1] - t.j0 * d->ys[2] - t.j1 * d->ys[3] - t.j2 * d->ys[4];
    if (!t.ok) t.j0 = -d->Y[0]; /* out of range for every row (m.a0 >= 0) */
    return t;
}

/* Note [OpenCL tap-major steps]: channels KG, the phase's tap digits (j0, j1, j2) of radices (T1, T2) */
#define ig_bwd_data_ch(op) ((op)->d.KG)
#define ig_bwd_data_r1(op) ((op)->T[1])
#define ig_bwd_data_r2(op) ((op)->T[2])
IG_INLINE ig_bwd_data_redt ig_bwd_data_red_at(const ig_bwd_data_op *op, const ig_tap *p) {
    const conv_desc *d = &op->d;
    ig_bwd_data_redt t;
    t.ok = 1;
    t.wo = p->ch * d->ws[0] + (op->rq[0] + d->S[0] * p->t0) * d->ws[2] + (op->rq[1] + d->S[1] * p->t1) * d->ws[3]
           + (op->rq[2] + d->S[2] * p->t2) * d->ws[4];
    t.j0 = p->t0 * op->H[0], t.j1 = p->t1 * op->H[1], t.j2 = p->t2 * op->H[2];
    t.yo = p->ch * d->ys[1] - t.j0 * d->ys[2] - t.j1 * d->ys[3] - t.j2 * d->ys[4];
    return t;
}

IG_INLINE int ig_bwd_data_A_ok(const ig_bwd_data_op *op, const ig_bwd_data_rowt *m, const ig_bwd_data_redt *r) {
    const conv_desc *d = &op->d;
    return INSIDE(m->a0 - r->j0, d->Y[0]) && INSIDE(m->a1 - r->j1, d->Y[1]) && INSIDE(m->a2 - r->j2, d->Y[2]);
}

IG_INLINE ACC ig_bwd_data_A_ld(const ig_bwd_data_op *op, __global const T *dy, const ig_bwd_data_rowt *m,
                               const ig_bwd_data_redt *r) {
    return LD(dy, m->yo + r->yo);
}

IG_INLINE ACC ig_bwd_data_A(const ig_bwd_data_op *op, __global const T *dy, const ig_bwd_data_rowt *m,
                            const ig_bwd_data_redt *r) {
    const conv_desc *d = &op->d;
    if (!(INSIDE(m->a0 - r->j0, d->Y[0]) && INSIDE(m->a1 - r->j1, d->Y[1]) && INSIDE(m->a2 - r->j2, d->Y[2])))
        return 0;
    return LD(dy, m->yo + r->yo);
}

IG_INLINE ACC ig_bwd_data_B(const ig_bwd_data_op *op, __global const T *w, const ig_bwd_data_redt *r,
                            const ig_bwd_data_colt *n) {
    return (r->ok && n->ok) ? LD(w, n->wo + r->wo) : 0;
}

IG_INLINE idx_t ig_bwd_data_orow(const ig_bwd_data_op *op, idx_t m) {
    const conv_desc *d = &op->d;
    const pos4 at = pos4_of(m, op->E[0], op->E[1], op->E[2]);
    return d->xo + at.b * d->xs[0] + (op->q[0] + d->S[0] * at.z) * d->xs[2] + (op->q[1] + d->S[1] * at.y) * d->xs[3]
           + (op->q[2] + d->S[2] * at.x) * d->xs[4];
}

IG_INLINE idx_t ig_bwd_data_ocol(const ig_bwd_data_op *op, idx_t c) { return (op->g * op->d.CG + c) * op->d.xs[1]; }

IG_INLINE void ig_bwd_data_put(const ig_bwd_data_op *op, __global T *dx, __global const T *b, __global ACC *wsp,
                               idx_t row, idx_t col, idx_t c, ACC v) {
    const conv_desc *d = &op->d;
    if (d->has_bias) v += LD(b, d->bo + (op->g * d->CG + c) * d->bs);
    ST(dx, row + col, v);
}

#define IG_OP bwd_data
#define IG_TM_OP IG_TAPMAJOR
#include "igemm_tile.h"

/* ---- backward-weight, one split: A = dy at k x (n, o), B = x gathered at (n, o) x (c, tap) ------------------- */
typedef struct { conv_desc d; idx_t g, split; } ig_bwd_weight_op;
typedef struct { idx_t yo; int ok; } ig_bwd_weight_rowt;
typedef struct { idx_t xo, d0, d1, d2; } ig_bwd_weight_colt;
typedef struct { idx_t yo, xo, b0, b1, b2; int ok; } ig_bwd_weight_redt;

IG_INLINE ig_bwd_weight_rowt ig_bwd_weight_row(const ig_bwd_weight_op *op, idx_t k, idx_t M) {
    ig_bwd_weight_rowt t;
    t.ok = k < M;
    t.yo = op->d.yo + (op->g * op->d.KG + (t.ok ? k : 0)) * op->d.ys[1];
    return t;
}

IG_INLINE ig_bwd_weight_colt ig_bwd_weight_col(const ig_bwd_weight_op *op, idx_t n, idx_t NC) {
    const conv_desc *d = &op->d;
    ig_bwd_weight_colt t;
    idx_t c, r0, r1, r2;
    const int ok = n < NC;
    chan_tap(d, ok ? n : 0, d->CG, (int)d->c_inner, &c, &r0, &r1, &r2);
    t.d0 = r0 * d->DL[0] - d->P[0], t.d1 = r1 * d->DL[1] - d->P[1], t.d2 = r2 * d->DL[2] - d->P[2];
    t.xo = d->xo + (op->g * d->CG + c) * d->xs[1] + t.d0 * d->xs[2] + t.d1 * d->xs[3] + t.d2 * d->xs[4];
    if (!ok) t.d0 = d->X[0]; /* out of range for every position (r.b0 >= 0) */
    return t;
}

IG_INLINE ig_bwd_weight_redt ig_bwd_weight_red(const ig_bwd_weight_op *op, idx_t r, idx_t rend) {
    const conv_desc *d = &op->d;
    ig_bwd_weight_redt t;
    t.ok = r < rend;
    const pos4 at = pos4_of(t.ok ? r : 0, d->Y[0], d->Y[1], d->Y[2]);
    const idx_t n = at.b, o0 = at.z, o1 = at.y, o2 = at.x;
    t.b0 = o0 * d->S[0], t.b1 = o1 * d->S[1], t.b2 = o2 * d->S[2];
    t.yo = n * d->ys[0] + o0 * d->ys[2] + o1 * d->ys[3] + o2 * d->ys[4];
    t.xo = n * d->xs[0] + t.b0 * d->xs[2] + t.b1 * d->xs[3] + t.b2 * d->xs[4];
    if (!t.ok) t.b0 = d->X[0] + d->P[0]; /* out of range for every column (n.d0 >= -P0) */
    return t;
}

IG_INLINE ACC ig_bwd_weight_A(const ig_bwd_weight_op *op, __global const T *dy, const ig_bwd_weight_rowt *m,
                              const ig_bwd_weight_redt *r) {
    return (m->ok && r->ok) ? LD(dy, m->yo + r->yo) : 0;
}

IG_INLINE ACC ig_bwd_weight_B(const ig_bwd_weight_op *op, __global const T *x, const ig_bwd_weight_redt *r,
                              const ig_bwd_weight_colt *n) {
    const conv_desc *d = &op->d;
    /* !r.ok and !n.ok were folded into b0 / d0 (red() and col()) */
    if (!(INSIDE(r->b0 + n->d0, d->X[0]) && INSIDE(r->b1 + n->d1, d->X[1]) && INSIDE(r->b2 + n->d2, d->X[2])))
        return 0;
    return LD(x, n->xo + r->xo);
}

/* The weight element (kk, n) with n = (c, tap) over CG*taps (channel-innermost when d.c_inner): its offset in dw. */
IG_INLINE idx_t ig_weight_at(const conv_desc *d, idx_t kk, idx_t n) {
    idx_t c, r0, r1, r2;
    chan_tap(d, n, d->CG, (int)d->c_inner, &c, &r0, &r1, &r2);
    return d->wo + kk * d->ws[0] + c * d->ws[1] + r0 * d->ws[2] + r1 * d->ws[3] + r2 * d->ws[4];
}

/* With splits (d.total > 1) the workspace part (split, kk, n), else dw. */
IG_INLINE idx_t ig_bwd_weight_orow(const ig_bwd_weight_op *op, idx_t k) {
    const conv_desc *d = &op->d;
    const idx_t kk = op->g * d->KG + k;
    return d->total > 1 ? (op->split * d->G * d->KG + kk) * (d->CG * d->R[0] * d->R[1] * d->R[2])
                        : d->wo + kk * d->ws[0];
}

IG_INLINE idx_t ig_bwd_weight_ocol(const ig_bwd_weight_op *op, idx_t n) {
    return op->d.total > 1 ? n : ig_weight_at(&op->d, 0, n) - op->d.wo;
}

IG_INLINE void ig_bwd_weight_put(const ig_bwd_weight_op *op, __global T *dw, __global const T *b, __global ACC *wsp,
                                 idx_t row, idx_t col, idx_t n, ACC v) {
    if (op->d.total > 1)
        wsp[row + col] = v;
    else
        ST(dw, row + col, v);
}

#define IG_OP bwd_weight
#define IG_TM_OP 0
#define IG_BLOCKED 1 /* Note [blocked sums] (common.h): the reduction runs over positions, as long as N x Y */
#include "igemm_tile.h"

/* ---- kernels ------------------------------------------------------------------------------------------------ */
__kernel void igemm_fwd(const conv_desc d, __global const T *x, __global const T *w, __global const T *b,
                        __global T *y) {
    __local ACC As[IG_AS] __attribute__((aligned(16))), Bs[IG_BS] __attribute__((aligned(16)));
    ig_fwd_op op;
    op.d = d, op.g = (idx_t)get_group_id(2);
    ig_fwd_tile(&op, x, w, y, b, 0, d.N * d.Y[0] * d.Y[1] * d.Y[2], d.KG, 0, d.CG * d.R[0] * d.R[1] * d.R[2],
                As, Bs);
}

/* Grid z = groups x S0*S1*S2 phases; grid x covers the largest phase (phase 0), smaller ones exit early.
 * Also the transposed forward (b: the transposed convolution's bias, per x channel). */
__kernel void igemm_bwd_data(const conv_desc d, __global const T *dy, __global const T *w, __global const T *b,
                             __global T *dx) {
    __local ACC As[IG_AS] __attribute__((aligned(16))), Bs[IG_BS] __attribute__((aligned(16)));
    const idx_t phases = d.S[0] * d.S[1] * d.S[2], z = (idx_t)get_group_id(2);
    ig_bwd_data_op op;
    ig_bwd_data_init(&op, d, z / phases, z % phases);
    const idx_t M = d.N * op.E[0] * op.E[1] * op.E[2];
    if ((idx_t)get_group_id(0) * IG_BM >= M) return;
    ig_bwd_data_tile(&op, dy, w, dx, b, 0, M, d.CG, 0, d.KG * op.tp, As, Bs);
}

/* Grid z = groups x d.total splits; split s reduces positions [s*d.red, (s+1)*d.red) of N*Y0*Y1*Y2. With one
 * split the tile is written to dw, else to the workspace part (split, co, c, tap). */
__kernel void igemm_bwd_weight(const conv_desc d, __global const T *x, __global const T *dy, __global T *dw,
                               __global ACC *part) {
    __local ACC As[IG_AS] __attribute__((aligned(16))), Bs[IG_BS] __attribute__((aligned(16)));
    const idx_t z = (idx_t)get_group_id(2), reduction = d.N * d.Y[0] * d.Y[1] * d.Y[2];
    ig_bwd_weight_op op;
    op.d = d, op.g = z / d.total, op.split = z % d.total;
    const idx_t lo = op.split * d.red, hi = min(reduction, lo + d.red);
    ig_bwd_weight_tile(&op, dy, x, dw, 0, part, d.KG, d.CG * d.R[0] * d.R[1] * d.R[2], lo, hi, As, Bs);
}

/* dw = the sum of the d.red splits' partial tiles, in split order; one work-item per weight element of d.total. */
__kernel void igemm_finalize(const conv_desc d, __global const ACC *part, __global T *dw) {
    const idx_t e = (idx_t)get_global_id(0);
    if (e >= d.total) return;
    ACC acc = 0;
    for (idx_t s = 0; s < d.red; ++s) acc += part[s * d.total + e];
    const conv_desc dd = d;
    const idx_t row = d.CG * d.R[0] * d.R[1] * d.R[2];
    ST(dw, ig_weight_at(&dd, e / row, e % row), acc);
}
