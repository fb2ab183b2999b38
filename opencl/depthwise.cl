/* portconv OpenCL depthwise kernels (dw_*): forward, backward-data and backward-weight of a depthwise
 * convolution (CG == 1, dilation 1, not transposed) whose x and y rows are contiguous along W; at the end,
 * dw_cl_*: the same for channels-last tensors (C contiguous) (Note [channels-last depthwise]).
 * Same canonical convolution and descriptor as conv.cl (Note [canonical convolution] in common.h).
 *
 * Note [depthwise kernels]: work-item dimension 0 runs along the contiguous W axis and every work-item
 * produces DW_VW neighbouring W outputs as one OpenCL vector (explicit SIMD: PoCL on the CPU turns a
 * float8 into one AVX register, a GPU runs it as DW_VW scalars per work-item). Kernel sizes and strides
 * are compile-time constants (-DDW_K0/1/2, -DDW_S0/1/2), so the tap loops unroll, the stride-2 loads are
 * one wide load plus .even, and the parity of the stride-2 backward-data is a constant per tap.
 * Borders: a vector load is one unaligned vload when its whole span lies inside the row and an
 * element-wise masked load otherwise (first/last vectors of a row only); rows (H, D) that fall into the
 * padding are skipped per work-item. No integer division per element, only per work-item.
 *
 * Defines (host, one program per set): DTYPE_F32 | DTYPE_F64, optional IDX64, DW_VW (4 or 8), DW_RB (rows
 * computed together by one work-item of dw_fwd/dw_bwd_data), DW_NB (such row blocks per work-item),
 * DW_K0, DW_K1, DW_K2, DW_S0, DW_S1, DW_S2 (each stride 1 or 2); DW_CPU on CPU devices; DW_CL, DW_CLW, DW_CLB, DW_CLR,
 * DW_CLA for the channels-last kernels (Note [channels-last depthwise]).
 */
#include "common.h"

/* TNAME: the arithmetic type (CT, and its vectors VT/HT); T (common.h) is the storage type. bfloat16 is stored
 * as ushort and computed in float: vector loads widen by << 16, stores round to nearest even (common.h's
 * bf16_round, lane-wise), so the kernels' arithmetic is the float32 kernels'. */
#if defined(DTYPE_F32)
#define TNAME float
#define INAME int
#elif defined(DTYPE_F64)
#define TNAME double
#define INAME long
#elif defined(DTYPE_BF16)
#define TNAME float
#define INAME int
#else
#error "portconv: the depthwise kernels take float32, float64 and bfloat16"
#endif
#define CT TNAME

#if DW_VW == 4
#define DW_HW 2
#define DW_VW2 8
#elif DW_VW == 8
#define DW_HW 4
#define DW_VW2 16
#else
#error "portconv: DW_VW must be 4 or 8"
#endif
#define VT CAT(TNAME, DW_VW)   /* DW_VW outputs */
#define HT CAT(TNAME, DW_HW)   /* half of them (stride-2 backward-data parity classes) */
#define VI CAT(INAME, DW_VW)   /* lane masks of select() */
#define HI CAT(INAME, DW_HW)
/* v with the lanes where the mask m (-1 / 0 per lane, from vector comparisons) is 0 set to +0: a bitwise and,
 * not select() (which may be an out-of-line library call, as vloadn is in PoCL) */
#define MASKV(v, m) (CAT(as_, VT)(CAT(as_, VI)(v) & (m)))
#define MASKH(v, m) (CAT(as_, HT)(CAT(as_, HI)(v) & (m)))
#if DW_VW == 8
#define V_LANES ((VI)(0, 1, 2, 3, 4, 5, 6, 7))
#define H_LANES ((HI)(0, 1, 2, 3))
#else
#define V_LANES ((VI)(0, 1, 2, 3))
#define H_LANES ((HI)(0, 1))
#endif

/* Vector loads and stores. DW_CPU (CPU devices, set by the host): a dereference of a vector type with
 * the element's alignment, which clang compiles to one unaligned vector access (PoCL's library
 * vloadn/vstoren are out-of-line calls, and element lists stay element-wise inserts). Elsewhere
 * (GPUs): vloadn/vstoren. The private-array forms (border paths only) are element lists. */
#define L2(p) (p)[0], (p)[1]
#define L4(p) L2(p), L2((p) + 2)
#define L8(p) L4(p), L4((p) + 4)
#define VLOADP(p) ((VT)(CAT(L, DW_VW)(p)))
#define HLOADP(p) ((HT)(CAT(L, DW_HW)(p)))
#ifdef DTYPE_BF16
#define SVT CAT(ushort, DW_VW)  /* stored vectors */
#define SHT CAT(ushort, DW_HW)
#define WIDEN_V(u) CAT(as_float, DW_VW)(CAT(convert_uint, DW_VW)(u) << 16)
#define WIDEN_H(u) CAT(as_float, DW_HW)(CAT(convert_uint, DW_HW)(u) << 16)
#define VU CAT(uint, DW_VW)
/* common.h's bf16_round per lane: nearest even, NaN -> 0x7fc0 */
#define NARROW_V(v) CAT(convert_ushort, DW_VW)((CAT(as_uint, DW_VW)(isnan(v)) & (VU)0x7fc0u) | \
    (~CAT(as_uint, DW_VW)(isnan(v)) & ((CAT(as_uint, DW_VW)(v) + (VU)0x7fffu + ((CAT(as_uint, DW_VW)(v) >> 16) & (VU)1u)) >> 16)))
#else
#define SVT VT
#define SHT HT
#define WIDEN_V(u) (u)
#define WIDEN_H(u) (u)
#define NARROW_V(v) (v)
#endif
#ifdef DW_CPU
typedef SVT __attribute__((aligned(sizeof(T)))) vt_unaligned;
typedef SHT __attribute__((aligned(sizeof(T)))) ht_unaligned;
#define VLOAD(p) WIDEN_V(*(__global const vt_unaligned *)(p))
#define HLOAD(p) WIDEN_H(*(__global const ht_unaligned *)(p))
#define VSTORE(v, p) (*(__global vt_unaligned *)(p) = NARROW_V(v))
#elif defined(DW_CLA)
/* channels-last on a GPU with every vector at a multiple of DW_VW elements (offsets and strides; the host checks):
 * one naturally aligned vector access (vloadn may assume only the element's alignment: DW_VW element loads) */
#define VLOAD(p) WIDEN_V(*(__global const SVT *)(p))
#define HLOAD(p) WIDEN_H(CAT(vload, DW_HW)(0, (p)))
#define VSTORE(v, p) (*(__global SVT *)(p) = NARROW_V(v))
#else
#define VLOAD(p) WIDEN_V(CAT(vload, DW_VW)(0, (p)))
#define HLOAD(p) WIDEN_H(CAT(vload, DW_HW)(0, (p)))
#define VSTORE(v, p) CAT(vstore, DW_VW)(NARROW_V(v), 0, (p))
#endif
#if DW_VW == 8
#define VSTOREP(v, p) do { (p)[0] = (v).s0; (p)[1] = (v).s1; (p)[2] = (v).s2; (p)[3] = (v).s3; \
                           (p)[4] = (v).s4; (p)[5] = (v).s5; (p)[6] = (v).s6; (p)[7] = (v).s7; } while (0)
#else
#define VSTOREP(v, p) do { (p)[0] = (v).s0; (p)[1] = (v).s1; (p)[2] = (v).s2; (p)[3] = (v).s3; } while (0)
#endif
/* a*b+c: contracted to an FMA (OpenCL's default FP_CONTRACT), without PoCL's out-of-line fma() */
#define FMA(a, b, c) ((a) * (b) + (c))
#define TAPS (DW_K0 * DW_K1 * DW_K2)
/* PoCL's optimiser does not inline every helper by itself: an out-of-line row function with a run-time
 * `inner` costs more than the loads it does. Forced on CPU compilers (clang) only. */
#ifdef DW_CPU
#define DW_INLINE inline __attribute__((always_inline))
#else
#define DW_INLINE inline
#endif

/* Note [border loads]: a border vector (columns partly outside [0, X), or lanes past the last output) is
 * still one vector load when its span lies between the tensor's first and last element (in the buffer, so
 * safe to read), with the lanes outside zeroed by a mask (MASKV); only vectors at the tensor's two ends are loaded
 * element by element. `sp` is that element range [lo, hi) (tensor_span). The 7x7 rows (every vector a border
 * one) and the first and last vector of each wider row take this path. */
typedef struct { idx_t lo, hi; } span_t;
/* DW_VB: which kernels load border vectors whole: bit 0 forward, 1 backward-data, 2 backward-weight. Whole border
 * vectors help the 2-D forward and the grad-weight; the 3-D forward (27 taps unrolled, each load with both paths)
 * runs 2x slower with them on PoCL, the backward-data 1.3x (docs/kernels/opencl.md) */
#define DW_VB (DW_K0 == 1 ? 5 : 4)

/* [offset, one past the last element] of the tensor with strides s[5] and extents (n, c, e[0], e[1], e[2]). */
DW_INLINE span_t tensor_span(idx_t o, const idx_t *s, idx_t n, idx_t c, const idx_t *e) {
    span_t r;
    r.lo = o;
    r.hi = o + (n - 1) * s[0] + (c - 1) * s[1] + (e[0] - 1) * s[2] + (e[1] - 1) * s[3] + (e[2] - 1) * s[4] + 1;
    return r;
}

/* DW_VW elements of a row (element offset `row`) at columns c0, c0+1, ...; zero outside [0, X) and for
 * lanes >= nv. One vload when all are inside, or inside the tensor (Note [border loads]). */
DW_INLINE VT ld_v(__global const T *p, idx_t row, idx_t c0, idx_t X, idx_t nv, const span_t sp, const int vb) {
    if (c0 >= 0 && c0 + DW_VW <= X && nv >= DW_VW) return VLOAD(p + row + c0);
    if (vb && row + c0 >= sp.lo && row + c0 + DW_VW <= sp.hi) {
        const VI c = (VI)c0 + V_LANES;
        return MASKV(VLOAD(p + row + c0), (c >= (VI)0) & (c < (VI)X) & (V_LANES < (VI)nv));
    }
    CT t[DW_VW];
    for (int k = 0; k < DW_VW; ++k) {
        const idx_t c = c0 + k;
        t[k] = (c >= 0 && c < X && k < nv) ? LD(p, row + c) : (CT)0;
    }
    return VLOADP(t);
}

/* DW_HW elements at columns c0, c0+1, ... (zero outside [0, X)). */
DW_INLINE HT ld_h(__global const T *p, idx_t row, idx_t c0, idx_t X, const span_t sp, const int vb) {
    if (c0 >= 0 && c0 + DW_HW <= X) return HLOAD(p + row + c0);
    if (vb && row + c0 >= sp.lo && row + c0 + DW_HW <= sp.hi) {
        const HI c = (HI)c0 + H_LANES;
        return MASKH(HLOAD(p + row + c0), (c >= (HI)0) & (c < (HI)X));
    }
    CT t[DW_HW];
    for (int k = 0; k < DW_HW; ++k) {
        const idx_t c = c0 + k;
        t[k] = (c >= 0 && c < X) ? LD(p, row + c) : (CT)0;
    }
    return HLOADP(t);
}

/* DW_VW elements at columns c0, c0+DW_S2, ... (zero outside [0, X) and for lanes >= nv). */
DW_INLINE VT ld_x(__global const T *p, idx_t row, idx_t c0, idx_t X, idx_t nv, const span_t sp, const int vb) {
#if DW_S2 == 1
    return ld_v(p, row, c0, X, nv, sp, vb);
#else
    if (c0 >= 0 && c0 + DW_VW2 <= X && nv >= DW_VW) {
        /* two DW_VW loads and their even lanes (a 2*DW_VW vector would exceed an AVX2 register pair's ABI) */
        const VT lo = VLOAD(p + row + c0), hi = VLOAD(p + row + c0 + DW_VW);
        return (VT)(lo.even, hi.even);
    }
    if (vb && row + c0 >= sp.lo && row + c0 + DW_VW2 <= sp.hi) {  /* Note [border loads]: lane k is column c0 + 2k */
        const VT lo = VLOAD(p + row + c0), hi = VLOAD(p + row + c0 + DW_VW);
        const VI c = (VI)c0 + 2 * V_LANES;
        return MASKV((VT)(lo.even, hi.even), (c >= (VI)0) & (c < (VI)X) & (V_LANES < (VI)nv));
    }
    /* the tensor's ends: the same two loads, masked (element c0 + 2k is in lane 2k of the pair) */
    const VT lo = ld_v(p, row, c0, X, 2 * nv, sp, 0), hi = ld_v(p, row, c0 + DW_VW, X, 2 * nv - DW_VW, sp, 0);
    return (VT)(lo.even, hi.even);
#endif
}

/* ld_x where the whole span is known to be inside the row (interior work-items). */
DW_INLINE VT ldx_in(__global const T *p, idx_t at) {
#if DW_S2 == 1
    return VLOAD(p + at);
#else
    const VT lo = VLOAD(p + at), hi = VLOAD(p + at + DW_VW);
    return (VT)(lo.even, hi.even);
#endif
}

/* Columns an interior work-item's x loads span from its first column c0: all taps, all lanes. */
#if DW_S2 == 1
#define X_SPAN (DW_VW + DW_K2 - 1)
#else
#define X_SPAN (2 * DW_VW + DW_K2 - 1)
#endif

DW_INLINE void st_v(__global T *p, idx_t at, VT v, idx_t nv) {
    if (nv >= DW_VW) {
        VSTORE(v, p + at);
        return;
    }
    CT t[DW_VW];
    VSTOREP(v, t);
    for (int k = 0; k < DW_VW; ++k)
        if (k < nv) ST(p, at + k, t[k]);
}

DW_INLINE ACC hsum(VT v) {
#if DW_VW == 8
    const CAT(TNAME, 4) a = v.lo + v.hi;
#else
    const CAT(TNAME, 4) a = v;
#endif
    const CAT(TNAME, 2) b = a.lo + a.hi;
    return b.x + b.y;
}

/* The TAPS weights of one output channel (element offset wb) into registers, in tap order. */
DW_INLINE void ld_taps(const conv_desc *d, __global const T *w, idx_t wb, CT *wr) {
#pragma unroll
    for (int t = 0; t < TAPS; ++t)
        wr[t] = LD(w, wb + (t / (DW_K1 * DW_K2)) * d->ws[2] + ((t / DW_K2) % DW_K1) * d->ws[3] + (t % DW_K2) * d->ws[4]);
}

/* Row ii of the x rows a block of DW_RB output rows from oh0 reaches (plane iz, columns from c0): its DW_K2
 * shifted vectors in xv, or 0 when the row lies in the padding. Shared by the forward and backward-weight. */
DW_INLINE int x_row(const conv_desc *d, __global const T *x, idx_t xb, idx_t iz, idx_t oh0, int ii, idx_t c0,
                    idx_t nv, VT *xv, const int inner, const span_t sp, const int vb) {
    const idx_t iy = oh0 * DW_S1 - d->P[1] + ii;
    if (iy < 0 || iy >= d->X[1]) return 0;
    const idx_t row = xb + iz * d->xs[2] + iy * d->xs[3];
#pragma unroll
    for (int r2 = 0; r2 < DW_K2; ++r2)
        xv[r2] = inner ? ldx_in(x, row + c0 + r2) : ld_x(x, row, c0 + r2, d->X[2], nv, sp, vb);
    return 1;
}

#ifndef DW_CL /* the W-vector kernels; DW_CL programs (Note [channels-last depthwise]) build only theirs */
/* DW_RB output rows oh0 .. oh0+DW_RB of the forward pass, DW_VW outputs each, with the TAPS weights in
 * registers: every input row the block touches is loaded once (DW_K2 shifted vectors) and added into each
 * output row it reaches, so the block's DW_RB accumulators are independent chains. `inner` is a constant at
 * each call site: the interior variant has no column checks. Rows past Y1 are computed but not stored. */
DW_INLINE void fwd_rows(const conv_desc *d, __global const T *x, const CT *wr, idx_t xb, idx_t od, idx_t oh0,
                        idx_t c0, CT bias, VT *acc, const int inner, const span_t sp) {
#pragma unroll
    for (int j = 0; j < DW_RB; ++j) acc[j] = (VT)bias;
#pragma unroll
    for (int r0 = 0; r0 < DW_K0; ++r0) {
        const idx_t iz = od * DW_S0 - d->P[0] + r0;
        if (iz >= 0 && iz < d->X[0]) {
#pragma unroll
            for (int ii = 0; ii < (DW_RB - 1) * DW_S1 + DW_K1; ++ii) {
                VT xv[DW_K2];
                if (x_row(d, x, xb, iz, oh0, ii, c0, DW_VW, xv, inner, sp, DW_VB & 1)) {
#pragma unroll
                    for (int j = 0; j < DW_RB; ++j) {
                        const int r1 = ii - j * DW_S1;
                        if (r1 >= 0 && r1 < DW_K1) {
#pragma unroll
                            for (int r2 = 0; r2 < DW_K2; ++r2)
                                acc[j] = FMA(xv[r2], (VT)wr[(r0 * DW_K1 + r1) * DW_K2 + r2], acc[j]);
                        }
                    }
                }
            }
        }
    }
}

/* Forward: work-item (W block, row block, (n, co, od)) writes y[n, co, od, oh, ow0 .. ow0+DW_VW) for the
 * DW_RB*DW_NB rows oh of its row block; the taps' weights are held in registers across the rows. */
__kernel void dw_fwd(const conv_desc d, __global const T *x, __global const T *w, __global const T *b,
                     __global T *y) {
    const idx_t ow0 = (idx_t)get_global_id(0) * DW_VW;
    const idx_t oh0 = (idx_t)get_global_id(1) * (DW_RB * DW_NB);
    const idx_t pz = (idx_t)get_global_id(2);
    if (ow0 >= d.Y[2] || oh0 >= d.Y[1] || pz >= d.total) return;
    const idx_t CO = d.G * d.KG;
    const idx_t od = pz % d.Y[0], nc = pz / d.Y[0];
    const idx_t co = nc % CO, n = nc / CO, g = co / d.KG;
    const idx_t xb = d.xo + n * d.xs[0] + g * d.xs[1];
    const idx_t wb = d.wo + co * d.ws[0];
    const idx_t c0 = ow0 * DW_S2 - d.P[2];
    const idx_t nv = d.Y[2] - ow0;
    const idx_t oh1 = oh0 + DW_RB * DW_NB < d.Y[1] ? oh0 + DW_RB * DW_NB : d.Y[1];
    const idx_t yb = d.yo + n * d.ys[0] + co * d.ys[1] + od * d.ys[2] + ow0;
    const CT bias = d.has_bias ? LD(b, d.bo + co * d.bs) : (CT)0;
    CT wr[TAPS];
    ld_taps(&d, w, wb, wr);
    const int inner = c0 >= 0 && c0 + X_SPAN <= d.X[2] && nv >= DW_VW;
    const span_t sp = tensor_span(d.xo, d.xs, d.N, d.G, d.X);
    for (idx_t oh = oh0; oh < oh1; oh += DW_RB) {
        VT acc[DW_RB];
        if (inner) {
            fwd_rows(&d, x, wr, xb, od, oh, c0, bias, acc, 1, sp);
        } else {
            fwd_rows(&d, x, wr, xb, od, oh, c0, bias, acc, 0, sp);
        }
        if (inner && oh + DW_RB <= oh1) {
#pragma unroll
            for (int j = 0; j < DW_RB; ++j) VSTORE(acc[j], y + yb + (oh + j) * d.ys[3]);
        } else {
#pragma unroll
            for (int j = 0; j < DW_RB; ++j)
                if (oh + j < oh1) st_v(y, yb + (oh + j) * d.ys[3], acc[j], nv);
        }
    }
}

/* DW_RB rows ih0 .. ih0+DW_RB of the backward-data pass for output channel co (weights wr in registers):
 * every gy row the block touches is loaded once and added into each x row it reaches, tap r1 =
 * base + j - ii*DW_S1 for x row j and gy row oy_lo + ii. `base` (DW_K1-1 or DW_K1-2: the parity of the first row
 * under stride 2) and `inner` are constants at each call site, so the tap matching unrolls away. */
DW_INLINE void bwd_rows(const conv_desc *d, __global const T *y, const CT *wr, idx_t yb, idx_t iz, idx_t ih0,
                        idx_t iw0, VT *acc, HT *ae, HT *ao, const int inner, const int base, const span_t sp) {
    const idx_t oy_lo = (ih0 + d->P[1] - base) / DW_S1;
#pragma unroll
    for (int r0 = 0; r0 < DW_K0; ++r0) {
        const idx_t t0 = iz + d->P[0] - r0;
        const idx_t oz = t0 / DW_S0;
        if (t0 >= 0 && t0 % DW_S0 == 0 && oz < d->Y[0]) {
#pragma unroll
            for (int ii = 0; ii <= (DW_K1 - 1 + DW_RB - 1) / DW_S1; ++ii) {
                const idx_t oy = oy_lo + ii;
                if (oy >= 0 && oy < d->Y[1]) {
                    const idx_t row = yb + oz * d->ys[2] + oy * d->ys[3];
#pragma unroll
                    for (int r2 = 0; r2 < DW_K2; ++r2) {
                        const idx_t te = iw0 + d->P[2] - r2;
#if DW_S2 == 1
                        const VT yv = inner ? VLOAD(y + row + te) : ld_v(y, row, te, d->Y[2], DW_VW, sp, DW_VB & 2);
#else
                        /* iw0 is even: lane 2m needs o = te/2 + m when te is even, lane 2m+1 o = (te+1)/2 + m
                         * when te is odd (>> 1 is the floor division, exact here) */
                        const idx_t o = (te + 1) >> 1;
                        const HT yv = inner ? HLOAD(y + row + o) : ld_h(y, row, o, d->Y[2], sp, DW_VB & 2);
#endif
#pragma unroll
                        for (int j = 0; j < DW_RB; ++j) {
                            const int r1 = base + j - ii * DW_S1;
                            if (r1 >= 0 && r1 < DW_K1) {
                                const CT wv = wr[(r0 * DW_K1 + r1) * DW_K2 + r2];
#if DW_S2 == 1
                                acc[j] = FMA(yv, (VT)wv, acc[j]);
#else
                                if ((te & 1) == 0)
                                    ae[j] = FMA(yv, (HT)wv, ae[j]);
                                else
                                    ao[j] = FMA(yv, (HT)wv, ao[j]);
#endif
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Backward-data: work-item (W block, row block, (n, g, iz)) writes x[n, g, iz, ih, iw0 .. iw0+DW_VW) for the
 * DW_RB*DW_NB rows ih of its block, summing gy[o] * w[r] over the taps with o*S - P + r == i and the KG output
 * channels of group g. Stride 2 along W: even lanes take the taps of one parity and odd lanes the other,
 * each a stride-1 load of DW_VW/2 gy elements. */
__kernel void dw_bwd_data(const conv_desc d, __global const T *y, __global const T *w, __global const T *b,
                          __global T *x) {
    const idx_t iw0 = (idx_t)get_global_id(0) * DW_VW;
    const idx_t ih0 = (idx_t)get_global_id(1) * (DW_RB * DW_NB);
    const idx_t pz = (idx_t)get_global_id(2);
    if (iw0 >= d.X[2] || ih0 >= d.X[1] || pz >= d.total) return;
    const idx_t iz = pz % d.X[0], ng = pz / d.X[0];
    const idx_t g = ng % d.G, n = ng / d.G;
    const idx_t nv = d.X[2] - iw0;
    const idx_t ih1 = ih0 + DW_RB * DW_NB < d.X[1] ? ih0 + DW_RB * DW_NB : d.X[1];
    const idx_t xrow = d.xo + n * d.xs[0] + g * d.xs[1] + iz * d.xs[2] + iw0;
    /* interior: every gy column any tap reads lies in [0, Y2) */
#if DW_S2 == 1
    const int inner = iw0 + d.P[2] - (DW_K2 - 1) >= 0 && iw0 + d.P[2] + DW_VW <= d.Y[2] && nv >= DW_VW;
#else
    const int inner = iw0 + d.P[2] - (DW_K2 - 1) >= 0 && ((iw0 + d.P[2] + 1) >> 1) + DW_HW <= d.Y[2] && nv >= DW_VW;
#endif
    const span_t sp = tensor_span(d.yo, d.ys, d.N, d.G * d.KG, d.Y);
    /* stride 2 along H: the first gy row of a block (ih0 even) has tap DW_K1-1 or DW_K1-2, by the parity of P1 */
#if DW_S1 == 2
    const int odd = (int)((d.P[1] - (DW_K1 - 1)) & 1);
#endif
    for (idx_t ih = ih0; ih < ih1; ih += DW_RB) {
        VT acc[DW_RB];
        HT ae[DW_RB], ao[DW_RB];
#pragma unroll
        for (int j = 0; j < DW_RB; ++j) {
            acc[j] = (VT)0;
            ae[j] = (HT)0;
            ao[j] = (HT)0;
        }
        for (idx_t k = 0; k < d.KG; ++k) {
            const idx_t co = g * d.KG + k;
            const idx_t yb = d.yo + n * d.ys[0] + co * d.ys[1];
            const idx_t wb = d.wo + co * d.ws[0];
            CT wr[TAPS];
            ld_taps(&d, w, wb, wr);
#if DW_S1 == 2
            if (odd) {
                if (inner)
                    bwd_rows(&d, y, wr, yb, iz, ih, iw0, acc, ae, ao, 1, DW_K1 - 2, sp);
                else
                    bwd_rows(&d, y, wr, yb, iz, ih, iw0, acc, ae, ao, 0, DW_K1 - 2, sp);
                continue;
            }
#endif
            if (inner)
                bwd_rows(&d, y, wr, yb, iz, ih, iw0, acc, ae, ao, 1, DW_K1 - 1, sp);
            else
                bwd_rows(&d, y, wr, yb, iz, ih, iw0, acc, ae, ao, 0, DW_K1 - 1, sp);
        }
#pragma unroll
        for (int j = 0; j < DW_RB; ++j) {
#if DW_S2 != 1
            acc[j].even = ae[j];
            acc[j].odd = ao[j];
#endif
            if (ih + j < ih1) {
                if (inner)
                    VSTORE(acc[j], x + xrow + (ih + j) * d.xs[3]);
                else
                    st_v(x, xrow + (ih + j) * d.xs[3], acc[j], nv);
            }
        }
    }
}

/* DW_RB gy rows oy0 .. oy0+DW_RB (those below Y1) of one W block (outputs ow0 .. ow0+DW_VW) of the backward-weight
 * reduction: each gy row is loaded once, every x row the block reaches once (DW_K2 shifted vectors), and
 * acc[tap] += x * gy for each (x row ii, gy row j) pair that tap r1 = ii - j*DW_S1 joins. `inner` is a constant
 * at each call site (no column checks). */
DW_INLINE void bww_rows(const conv_desc *d, __global const T *x, __global const T *y, idx_t xn, idx_t yrow,
                        idx_t oz, idx_t oy0, idx_t ow0, VT *acc, const int inner, const span_t xsp,
                        const span_t ysp) {
    const idx_t nv = d->Y[2] - ow0;
    const idx_t c0 = ow0 * DW_S2 - d->P[2];
    const idx_t rows = d->Y[1] - oy0;  /* gy rows left (>= 1) */
    VT gy[DW_RB];
#pragma unroll
    for (int j = 0; j < DW_RB; ++j) {
        const idx_t at = yrow + (oy0 + j) * d->ys[3];
        gy[j] = j >= rows ? (VT)0 : inner ? VLOAD(y + at + ow0) : ld_v(y, at, ow0, d->Y[2], nv, ysp, DW_VB & 4);
    }
#pragma unroll
    for (int r0 = 0; r0 < DW_K0; ++r0) {
        const idx_t iz = oz * DW_S0 - d->P[0] + r0;
        if (iz >= 0 && iz < d->X[0]) {
#pragma unroll
            for (int ii = 0; ii < (DW_RB - 1) * DW_S1 + DW_K1; ++ii) {
                VT xv[DW_K2];
                if (x_row(d, x, xn, iz, oy0, ii, c0, nv, xv, inner, xsp, DW_VB & 4)) {
#pragma unroll
                    for (int j = 0; j < DW_RB; ++j) {
                        const int r1 = ii - j * DW_S1;
                        if (r1 >= 0 && r1 < DW_K1 && j < rows) {
#pragma unroll
                            for (int r2 = 0; r2 < DW_K2; ++r2) {
                                const int t = (r0 * DW_K1 + r1) * DW_K2 + r2;
                                acc[t] = FMA(xv[r2], gy[j], acc[t]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Backward-weight: work-group (split s, output channel co) of L work-items. The group's share of the
 * N x Y0 x (blocks of DW_RB rows) x (W blocks) positions is [s*red, min(cnt, (s+1)*red)); work-item l walks it
 * from l in steps of L (a mixed-radix position, no divisions) keeping TAPS vector accumulators, then the lanes
 * are added in a fixed tree and the work-items' partials in a fixed tree in local memory. One split writes
 * the weight; several write partials[(co*splits + s)*TAPS + tap], which dw_finalize adds in split order.
 * Deterministic, no atomics. CPUs run L = 1: one work-item walks its channel's rows in order. */
__kernel void dw_bwd_weight(const conv_desc d, __global const T *x, __global const T *y, __global T *w,
                            __global ACC *part, __local ACC *scratch) {
    const idx_t s = (idx_t)get_group_id(0);
    const idx_t splits = (idx_t)get_num_groups(0);
    const idx_t co = (idx_t)get_group_id(1);
    const int l = (int)get_local_id(0);
    const int L = (int)get_local_size(0);
    const idx_t nb = (d.Y[2] + DW_VW - 1) / DW_VW;
    const idx_t nr = (d.Y[1] + DW_RB - 1) / DW_RB;
    const idx_t cnt = d.N * d.Y[0] * nr * nb;
    const idx_t jb = s * d.red;
    const idx_t je = jb + d.red < cnt ? jb + d.red : cnt;
    const idx_t g = co / d.KG;
    const idx_t xb = d.xo + g * d.xs[1];
    const idx_t yb = d.yo + co * d.ys[1];
    const span_t xsp = tensor_span(d.xo, d.xs, d.N, d.G, d.X);
    const span_t ysp = tensor_span(d.yo, d.ys, d.N, d.G * d.KG, d.Y);
    VT acc[TAPS], tot[TAPS];  /* Note [blocked sums] (common.h): a call of bww_rows adds <= DW_RB terms a tap */
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = tot[t] = (VT)0;
    if (jb + l < je) {
        const pos4 step = pos4_of((idx_t)L, d.Y[0], nr, nb);
        pos4 q = pos4_of(jb + l, d.Y[0], nr, nb);
        int blk = 0;
        for (idx_t j = jb + l; j < je; j += L, pos4_add(&q, step, d.Y[0], nr, nb)) {
            const idx_t ow0 = q.x * DW_VW;
            const idx_t c0 = ow0 * DW_S2 - d.P[2];
            const idx_t xn = xb + q.b * d.xs[0];
            const idx_t yrow = yb + q.b * d.ys[0] + q.z * d.ys[2];
            if (c0 >= 0 && c0 + X_SPAN <= d.X[2] && d.Y[2] - ow0 >= DW_VW)
                bww_rows(&d, x, y, xn, yrow, q.z, q.y * DW_RB, ow0, acc, 1, xsp, ysp);
            else
                bww_rows(&d, x, y, xn, yrow, q.z, q.y * DW_RB, ow0, acc, 0, xsp, ysp);
            if (++blk == RED_BLOCK / DW_RB) {
                blk = 0;
#pragma unroll
                for (int t = 0; t < TAPS; ++t) tot[t] += acc[t], acc[t] = (VT)0;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TAPS; ++t) scratch[t * L + l] = hsum(tot[t] + acc[t]);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = L >> 1; h > 0; h >>= 1) {
        if (l < h)
            for (int t = 0; t < TAPS; ++t) scratch[t * L + l] += scratch[t * L + l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int t = l; t < TAPS; t += L) {
        const ACC v = scratch[t * L];
        if (splits == 1) {
            const int r2 = t % DW_K2, r1 = (t / DW_K2) % DW_K1, r0 = t / (DW_K1 * DW_K2);
            ST(w, d.wo + co * d.ws[0] + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4], v);
        } else {
            part[(co * splits + s) * TAPS + t] = v;
        }
    }
}

#endif /* DW_CL */

/* Adds the splits' partials of one weight element in split order (d.red = splits, d.total = CO*TAPS). */
__kernel void dw_finalize(const conv_desc d, __global const ACC *part, __global T *w) {
    const idx_t i = (idx_t)get_global_id(0);
    if (i >= d.total) return;
    const idx_t co = i / TAPS;
    const int t = (int)(i - co * TAPS);
    ACC v = 0;
    for (idx_t s = 0; s < d.red; ++s) v += part[(co * d.red + s) * TAPS + t];
    const int r2 = t % DW_K2, r1 = (t / DW_K2) % DW_K1, r0 = t / (DW_K1 * DW_K2);
    ST(w, d.wo + co * d.ws[0] + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4], v);
}

#ifdef DW_CL
/* Note [channels-last depthwise]: channels-last tensors have C, not W, contiguous, so the kernels
 * above (vectors along W) do not apply; these vectorise along C instead. Channel multiplier 1, C a multiple of
 * DW_VW, x and y (grad_input and grad_output in backward) with channel stride 1 (the host checks). A work-item
 * takes DW_VW neighbouring channels, holds their TAPS weight vectors in registers (gathered once: weights are
 * channel-major) and runs DW_CLW neighbouring W positions of one (n, d, h) row; taps in the padding are skipped
 * per work-item (uniform over its lanes). Every load and store is one DW_VW vector. CPU devices run dw_cl_bwd_weight
 * one work-item per channel block and split; GPUs with DW_CLB x DW_CLR work-groups added in a local tree. Against the
 * generic per-element kernels, mbv2-dw3x3-bf16-cl: those ran 23x PyTorch's forward time on PoCL; on an H100 these run
 * 0.48x their forward and 0.25x their backward-data time (docs/kernels/opencl.md). */
#ifndef DW_CLW
#define DW_CLW 4 /* W positions per work-item (the host sets it per device type) */
#endif

/* The TAPS weight vectors of channels c0 .. c0+DW_VW (weight element (c, 0, r0, r1, r2)), in tap order. */
DW_INLINE void cl_taps(const conv_desc *d, __global const T *w, idx_t c0, VT *wv) {
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        CT e[DW_VW];
        const idx_t at = d->wo + (t / (DW_K1 * DW_K2)) * d->ws[2] + ((t / DW_K2) % DW_K1) * d->ws[3] +
                         (t % DW_K2) * d->ws[4];
#pragma unroll
        for (int l = 0; l < DW_VW; ++l) e[l] = LD(w, at + (c0 + l) * d->ws[0]);
        wv[t] = VLOADP(e);
    }
}

/* A work-item's channel block c0, W positions [w0, w1) and row (n, z, h) of the written tensor (extents E); 0 past
 * the grid's end. */
DW_INLINE int cl_item(const conv_desc *d, const idx_t *E, idx_t *c0, idx_t *w0, idx_t *w1, idx_t *n, idx_t *z,
                      idx_t *h) {
    *c0 = (idx_t)get_global_id(0) * DW_VW;
    *w0 = (idx_t)get_global_id(1) * DW_CLW;
    const idx_t pz = (idx_t)get_global_id(2);
    if (*c0 >= d->G || *w0 >= E[2] || pz >= d->total) return 0;
    *h = pz % E[1], *z = (pz / E[1]) % E[0], *n = pz / (E[1] * E[0]);
    *w1 = *w0 + DW_CLW < E[2] ? *w0 + DW_CLW : E[2];
    return 1;
}

/* Forward: work-item (channel block, W block, (n, od, oh)) writes y[n, c0.., od, oh, ow0 .. ow0+DW_CLW). */
__kernel void dw_cl_fwd(const conv_desc d, __global const T *x, __global const T *w, __global const T *b,
                        __global T *y) {
    idx_t c0, ow0, ow1, n, od, oh;
    if (!cl_item(&d, d.Y, &c0, &ow0, &ow1, &n, &od, &oh)) return;
    VT wv[TAPS];
    cl_taps(&d, w, c0, wv);
    VT bias = (VT)0;
    if (d.has_bias) {
        CT e[DW_VW];
#pragma unroll
        for (int l = 0; l < DW_VW; ++l) e[l] = LD(b, d.bo + (c0 + l) * d.bs);
        bias = VLOADP(e);
    }
    const idx_t xb = d.xo + n * d.xs[0] + c0, yb = d.yo + n * d.ys[0] + c0 + od * d.ys[2] + oh * d.ys[3];
    for (idx_t ow = ow0; ow < ow1; ++ow) {
        VT acc = bias;
#pragma unroll
        for (int t = 0; t < TAPS; ++t) {
            const idx_t i0 = od * DW_S0 - d.P[0] + t / (DW_K1 * DW_K2);
            const idx_t i1 = oh * DW_S1 - d.P[1] + (t / DW_K2) % DW_K1;
            const idx_t i2 = ow * DW_S2 - d.P[2] + t % DW_K2;
            if (i0 < 0 || i0 >= d.X[0] || i1 < 0 || i1 >= d.X[1] || i2 < 0 || i2 >= d.X[2]) continue;
            acc = FMA(VLOAD(x + xb + i0 * d.xs[2] + i1 * d.xs[3] + i2 * d.xs[4]), wv[t], acc);
        }
        VSTORE(acc, y + yb + ow * d.ys[4]);
    }
}

/* Backward-data: work-item (channel block, W block, (n, id, ih)) writes x[n, c0.., id, ih, iw0 .. iw0+DW_CLW):
 * the sum over taps r with (i + P - r) a multiple of the stride, at output position (i + P - r) / S. */
__kernel void dw_cl_bwd_data(const conv_desc d, __global const T *y, __global const T *w, __global const T *b,
                             __global T *x) {
    idx_t c0, iw0, iw1, n, id, ih;
    if (!cl_item(&d, d.X, &c0, &iw0, &iw1, &n, &id, &ih)) return;
    VT wv[TAPS];
    cl_taps(&d, w, c0, wv);
    const idx_t yb = d.yo + n * d.ys[0] + c0, xb = d.xo + n * d.xs[0] + c0 + id * d.xs[2] + ih * d.xs[3];
    for (idx_t iw = iw0; iw < iw1; ++iw) {
        VT acc = (VT)0;
#pragma unroll
        for (int t = 0; t < TAPS; ++t) {
            const idx_t t0 = id + d.P[0] - t / (DW_K1 * DW_K2);
            const idx_t t1 = ih + d.P[1] - (t / DW_K2) % DW_K1;
            const idx_t t2 = iw + d.P[2] - t % DW_K2;
            if (t0 < 0 || t1 < 0 || t2 < 0 || t0 % DW_S0 || t1 % DW_S1 || t2 % DW_S2) continue;
            const idx_t o0 = t0 / DW_S0, o1 = t1 / DW_S1, o2 = t2 / DW_S2;
            if (o0 >= d.Y[0] || o1 >= d.Y[1] || o2 >= d.Y[2]) continue;
            acc = FMA(VLOAD(y + yb + o0 * d.ys[2] + o1 * d.ys[3] + o2 * d.ys[4]), wv[t], acc);
        }
        VSTORE(acc, x + xb + iw * d.xs[4]);
    }
}

#ifndef DW_CLR
#define DW_CLR 1 /* position lanes per work-group of the grad-weight (GPUs); 1: one work-item walks its split */
#endif
#ifndef DW_CLB
#define DW_CLB 1 /* channel blocks per work-group of the grad-weight */
#endif

/* Backward-weight: work-group (DW_CLB channel blocks x DW_CLR position lanes, split s). Lane l of a channel block
 * sums x * dy over the positions jb + l, jb + l + DW_CLR, ... of the split's [s*red, (s+1)*red) of N x Y0 x Y1 x Y2
 * into TAPS vector accumulators, in position order; the lanes' sums are added in a fixed tree in local memory (GPUs:
 * 8 x 32 work-items, neighbouring channel blocks read one line per position; CPUs: one work-item per channel block
 * and split, no tree). One split writes the weight, several write partials[(c*splits + s)*TAPS + tap] for
 * dw_finalize (the layout of dw_bwd_weight's). Deterministic, no atomics. */
__kernel void dw_cl_bwd_weight(const conv_desc d, __global const T *x, __global const T *y, __global T *w,
                               __global ACC *part) {
    const idx_t c0 = (idx_t)get_global_id(0) * DW_VW;
    const idx_t s = (idx_t)get_group_id(1), splits = (idx_t)get_num_groups(1);
    const int lp = (int)get_local_id(1), live = c0 < d.G;
#if DW_CLR == 1
    if (!live) return;
#endif
    const idx_t cnt = d.N * d.Y[0] * d.Y[1] * d.Y[2];
    const idx_t jb = s * d.red, je = jb + d.red < cnt ? jb + d.red : cnt;
    VT acc[TAPS], tot[TAPS];  /* Note [blocked sums] (common.h) */
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = tot[t] = (VT)0;
    if (live && jb + lp < je) {
        pos4 q = pos4_of(jb + lp, d.Y[0], d.Y[1], d.Y[2]);
        const pos4 step = pos4_of(DW_CLR, d.Y[0], d.Y[1], d.Y[2]);
        int blk = 0;
        for (idx_t j = jb + lp; j < je; j += DW_CLR) {
            const idx_t xb = d.xo + q.b * d.xs[0] + c0;
            const VT dy = VLOAD(y + d.yo + q.b * d.ys[0] + c0 + q.z * d.ys[2] + q.y * d.ys[3] + q.x * d.ys[4]);
#pragma unroll
            for (int t = 0; t < TAPS; ++t) {
                const idx_t i0 = q.z * DW_S0 - d.P[0] + t / (DW_K1 * DW_K2);
                const idx_t i1 = q.y * DW_S1 - d.P[1] + (t / DW_K2) % DW_K1;
                const idx_t i2 = q.x * DW_S2 - d.P[2] + t % DW_K2;
                if (i0 < 0 || i0 >= d.X[0] || i1 < 0 || i1 >= d.X[1] || i2 < 0 || i2 >= d.X[2]) continue;
                acc[t] = FMA(VLOAD(x + xb + i0 * d.xs[2] + i1 * d.xs[3] + i2 * d.xs[4]), dy, acc[t]);
            }
            pos4_add(&q, step, d.Y[0], d.Y[1], d.Y[2]);
            if (++blk == RED_BLOCK) {
                blk = 0;
#pragma unroll
                for (int t = 0; t < TAPS; ++t) tot[t] += acc[t], acc[t] = (VT)0;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] += tot[t];
#if DW_CLR > 1
    __local CT red[DW_CLR][DW_CLB * DW_VW];
    __local CT *mine = red[lp] + (int)get_local_id(0) * DW_VW;
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        VSTOREP(acc[t], mine);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int h = DW_CLR / 2; h > 0; h >>= 1) {
            if (lp < h)
#pragma unroll
                for (int l = 0; l < DW_VW; ++l) mine[l] += mine[h * DW_CLB * DW_VW + l];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        acc[t] = VLOADP(mine);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lp != 0 || !live) return;
#endif
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        CT e[DW_VW];
        VSTOREP(acc[t], e);
        const int r2 = t % DW_K2, r1 = (t / DW_K2) % DW_K1, r0 = t / (DW_K1 * DW_K2);
#pragma unroll
        for (int l = 0; l < DW_VW; ++l) {
            if (splits == 1)
                ST(w, d.wo + (c0 + l) * d.ws[0] + r0 * d.ws[2] + r1 * d.ws[3] + r2 * d.ws[4], e[l]);
            else
                part[((c0 + l) * splits + s) * TAPS + t] = e[l];
        }
    }
}
#endif /* DW_CL */
