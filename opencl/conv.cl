/* portconv OpenCL kernels: forward, backward-data, backward-weight and bias-grad of the canonical
 * convolution (see Note [canonical convolution] in common.h). Built once per dtype/index-width/depthwise
 * define set; shapes, strides and offsets arrive in the conv_desc argument.
 */
#include "common.h"

/* Forward: one work-item per y element, gathering over the kernel taps and the CG channels of its group.
 * The taps that fall into padding are cut off by tap_range, so no work-item reads out of bounds. */
__kernel void KNAME(fwd)(const conv_desc d, __global const T *x, __global const T *w,
                         __global const T *b, __global T *y) {
    const idx_t gid = (idx_t)get_global_id(0);
    if (gid >= d.total) return;
    const idx_t cx_n = CG_OF(d);
    idx_t n, co, o0, o1, o2;
    unflatten5(gid, d.G * d.KG, d.Y[0], d.Y[1], d.Y[2], d.c_inner, &n, &co, &o0, &o1, &o2);
    const idx_t g = co / d.KG;
    idx_t lo0, hi0, lo1, hi1, lo2, hi2;
    tap_range(o0, d.S[0], d.P[0], d.DL[0], d.X[0], d.R[0], &lo0, &hi0);
    tap_range(o1, d.S[1], d.P[1], d.DL[1], d.X[1], d.R[1], &lo1, &hi1);
    tap_range(o2, d.S[2], d.P[2], d.DL[2], d.X[2], d.R[2], &lo2, &hi2);
    const idx_t xb = d.xo + n * d.xs[0] + g * cx_n * d.xs[1];
    const idx_t wb = d.wo + co * d.ws[0];
    ACC acc = 0;
    for (idx_t r0 = lo0; r0 < hi0; ++r0) {
        const idx_t i0 = o0 * d.S[0] - d.P[0] + r0 * d.DL[0];
        for (idx_t r1 = lo1; r1 < hi1; ++r1) {
            const idx_t i1 = o1 * d.S[1] - d.P[1] + r1 * d.DL[1];
            for (idx_t r2 = lo2; r2 < hi2; ++r2) {
                const idx_t i2 = o2 * d.S[2] - d.P[2] + r2 * d.DL[2];
                const idx_t xp = xb + i0 * d.xs[2] + i1 * d.xs[3] + i2 * d.xs[4];
                const idx_t wp = wb + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4];
                for (idx_t c = 0; c < cx_n; ++c)
                    acc += LD(x, xp + c * d.xs[1]) * LD(w, wp + c * d.ws[1]);
            }
        }
    }
    if (d.has_bias) acc += LD(b, d.bo + co * d.bs);
    ST(y, d.yo + n * d.ys[0] + co * d.ys[1] + o0 * d.ys[2] + o1 * d.ys[3] + o2 * d.ys[4], acc);
}

/* Backward-data: one work-item per x element, summing over the taps whose output position o satisfies
 * o*S - P + r*DL == i, and over the KG output channels of its group. Also the transposed forward
 * (then b is the transposed convolution's bias, indexed by the x channel). */
__kernel void KNAME(bwd_data)(const conv_desc d, __global const T *y, __global const T *w,
                              __global const T *b, __global T *x) {
    const idx_t gid = (idx_t)get_global_id(0);
    if (gid >= d.total) return;
    const idx_t cx_n = CG_OF(d);
    idx_t n, ci, i0, i1, i2;
    unflatten5(gid, d.G * cx_n, d.X[0], d.X[1], d.X[2], d.c_inner, &n, &ci, &i0, &i1, &i2);
    const idx_t g = ci / cx_n;
    const idx_t c = ci - g * cx_n;
    const idx_t yb = d.yo + n * d.ys[0] + g * d.KG * d.ys[1];
    const idx_t wb = d.wo + g * d.KG * d.ws[0] + c * d.ws[1];
    ACC acc = 0;
    for (idx_t r0 = 0; r0 < d.R[0]; ++r0) {
        const idx_t t0 = i0 + d.P[0] - r0 * d.DL[0];
        if (t0 < 0) break;
        if (t0 % d.S[0]) continue;
        const idx_t o0 = t0 / d.S[0];
        if (o0 >= d.Y[0]) continue;
        for (idx_t r1 = 0; r1 < d.R[1]; ++r1) {
            const idx_t t1 = i1 + d.P[1] - r1 * d.DL[1];
            if (t1 < 0) break;
            if (t1 % d.S[1]) continue;
            const idx_t o1 = t1 / d.S[1];
            if (o1 >= d.Y[1]) continue;
            for (idx_t r2 = 0; r2 < d.R[2]; ++r2) {
                const idx_t t2 = i2 + d.P[2] - r2 * d.DL[2];
                if (t2 < 0) break;
                if (t2 % d.S[2]) continue;
                const idx_t o2 = t2 / d.S[2];
                if (o2 >= d.Y[2]) continue;
                const idx_t yp = yb + o0 * d.ys[2] + o1 * d.ys[3] + o2 * d.ys[4];
                const idx_t wp = wb + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4];
                for (idx_t k = 0; k < d.KG; ++k)
                    acc += LD(y, yp + k * d.ys[1]) * LD(w, wp + k * d.ws[0]);
            }
        }
    }
    if (d.has_bias) acc += LD(b, d.bo + ci * d.bs);
    ST(x, d.xo + n * d.xs[0] + ci * d.xs[1] + i0 * d.xs[2] + i1 * d.xs[3] + i2 * d.xs[4], acc);
}

/* Backward-weight: one work-group per weight element (co, c, r0, r1, r2). Its work-items stride over
 * the N x output positions that meet an in-bounds input (out_range), each in a fixed order, and the
 * group adds their partial sums in a fixed tree: the result does not depend on timing. */
__kernel void KNAME(bwd_weight)(const conv_desc d, __global const T *x, __global const T *y,
                                __global T *w, __local ACC *scratch) {
    const idx_t grp = (idx_t)get_group_id(0);
    const idx_t l = (idx_t)get_local_id(0);
    const idx_t L = (idx_t)get_local_size(0);
    const idx_t cx_n = CG_OF(d);
    idx_t co, c, r0, r1, r2;
    unflatten5(grp, cx_n, d.R[0], d.R[1], d.R[2], d.c_inner, &co, &c, &r0, &r1, &r2);
    const idx_t ci = (co / d.KG) * cx_n + c;
    idx_t lo0, hi0, lo1, hi1, lo2, hi2;
    out_range(r0, d.S[0], d.P[0], d.DL[0], d.X[0], d.Y[0], &lo0, &hi0);
    out_range(r1, d.S[1], d.P[1], d.DL[1], d.X[1], d.Y[1], &lo1, &hi1);
    out_range(r2, d.S[2], d.P[2], d.DL[2], d.X[2], d.Y[2], &lo2, &hi2);
    const idx_t n0 = hi0 - lo0, n1 = hi1 - lo1, n2 = hi2 - lo2;
    const idx_t cnt = d.N * n0 * n1 * n2;
    const idx_t xb = d.xo + ci * d.xs[1] + (r0 * d.DL[0] - d.P[0]) * d.xs[2]
                     + (r1 * d.DL[1] - d.P[1]) * d.xs[3] + (r2 * d.DL[2] - d.P[2]) * d.xs[4];
    const idx_t yb = d.yo + co * d.ys[1];
    ACC acc = 0, tot = 0;  /* Note [blocked sums] (common.h) */
    if (l < cnt) {
        const pos4 step = pos4_of(L, n0, n1, n2);
        pos4 q = pos4_of(l, n0, n1, n2);
        int nb = 0;
        for (idx_t j = l; j < cnt; j += L, pos4_add(&q, step, n0, n1, n2)) {
            const idx_t o0 = lo0 + q.z, o1 = lo1 + q.y, o2 = lo2 + q.x;
            const idx_t xp = xb + q.b * d.xs[0] + o0 * d.S[0] * d.xs[2] + o1 * d.S[1] * d.xs[3]
                             + o2 * d.S[2] * d.xs[4];
            const idx_t yp = yb + q.b * d.ys[0] + o0 * d.ys[2] + o1 * d.ys[3] + o2 * d.ys[4];
            acc += LD(y, yp) * LD(x, xp);
            if (++nb == RED_BLOCK) tot += acc, acc = 0, nb = 0;
        }
    }
    acc = group_sum(scratch, tot + acc);
    if (l == 0 && grp < d.total)
        ST(w, d.wo + co * d.ws[0] + c * d.ws[1] + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4], acc);
}

/* Bias gradient: one work-group per channel of y, reducing over N x spatial like bwd_weight. */
__kernel void KNAME(bias_grad)(const conv_desc d, __global const T *y, __global T *b, __local ACC *scratch) {
    const idx_t co = (idx_t)get_group_id(0);
    const idx_t l = (idx_t)get_local_id(0);
    const idx_t L = (idx_t)get_local_size(0);
    const idx_t yb = d.yo + co * d.ys[1];
    ACC acc = 0, tot = 0;  /* Note [blocked sums] (common.h) */
    if (l < d.red) {
        const pos4 step = pos4_of(L, d.Y[0], d.Y[1], d.Y[2]);
        pos4 q = pos4_of(l, d.Y[0], d.Y[1], d.Y[2]);
        int nb = 0;
        for (idx_t j = l; j < d.red; j += L, pos4_add(&q, step, d.Y[0], d.Y[1], d.Y[2])) {
            acc += LD(y, yb + q.b * d.ys[0] + q.z * d.ys[2] + q.y * d.ys[3] + q.x * d.ys[4]);
            if (++nb == RED_BLOCK) tot += acc, acc = 0, nb = 0;
        }
    }
    acc = group_sum(scratch, tot + acc);
    if (l == 0 && co < d.total) ST(b, d.bo + co * d.bs, acc);
}
