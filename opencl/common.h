/* portconv OpenCL kernel set: storage types, index type, the problem descriptor and index helpers.
 *
 * Defines chosen by the host (one program per combination, never per shape):
 *   DTYPE_F32 | DTYPE_F64 | DTYPE_F16 | DTYPE_BF16   storage type of every tensor
 *   IDX64                                             64-bit element indices (only for tensors >= 2^31 elements)
 *   DEPTHWISE                                         x-side channels per group fixed at 1 (depthwise kernels)
 *
 * Note [canonical convolution]: every kernel sees one non-transposed convolution y = conv(x, w), the host's
 * ConvView (Note [conv view] in portconv/problem.py), with its names:
 *   x: (N, G*CG, X0, X1, X2), w: (G*KG, CG, R0, R1, R2), y: (N, G*KG, Y0, Y1, Y2).
 * Ranks 1 and 2 are rank 3 with leading size-1 spatial dims. A transposed convolution is the same
 * object with the roles swapped (its input is y, its output is x), so its forward pass is the
 * backward-data kernel and its backward-data pass is the forward kernel.
 */
#ifndef PORTCONV_COMMON_H
#define PORTCONV_COMMON_H

#if defined(DTYPE_F64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double T;
typedef double ACC;
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))

#elif defined(DTYPE_F32)
typedef float T;
typedef float ACC;
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))

#elif defined(DTYPE_F16)
/* half is a storage type here: vload_half/vstore_half are core OpenCL, no cl_khr_fp16 needed. */
typedef half T;
typedef float ACC;
#define LD(p, i) vload_half((size_t)(i), (p))
#define ST(p, i, v) vstore_half_rte((v), (size_t)(i), (p))

#elif defined(DTYPE_BF16)
/* bfloat16 is the upper half of a float32: load by shifting, store rounding to nearest even
 * (PyTorch's c10::BFloat16 conversion, NaN -> 0x7fc0). */
typedef ushort T;
typedef float ACC;
inline float bf16_load(ushort u) { return as_float(((uint)u) << 16); }
inline ushort bf16_round(float f) {
    if (isnan(f)) return (ushort)0x7fc0;
    uint u = as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#define LD(p, i) bf16_load((p)[i])
#define ST(p, i, v) ((p)[i] = bf16_round(v))

#else
#error "portconv: define one of DTYPE_F32, DTYPE_F64, DTYPE_F16, DTYPE_BF16"
#endif

#ifdef IDX64
typedef long idx_t;
#else
typedef int idx_t;
#endif

/* The descriptor is one by-value struct of idx_t (the host packs it field by field, same order). */
typedef struct {
    idx_t N, G, CG, KG;         /* batch, groups, channels per group of x and of y */
    idx_t X[3], Y[3], R[3];     /* spatial extents (D, H, W) of x, y and the kernel */
    idx_t S[3], P[3], DL[3];    /* stride, low-side padding, dilation */
    idx_t xs[5], ws[5], ys[5];  /* element strides (N, C, D, H, W) of x and y; (Cout, Cin, D, H, W) of w */
    idx_t xo, wo, yo, bo, bs;   /* element offsets of x, w, y, bias; bias stride */
    idx_t has_bias;             /* add bias (forward and transposed forward) */
    idx_t c_inner;              /* the written tensor is channels-last: channel is the fastest work index */
    idx_t total;                /* work-items (fwd, bwd-data) or work-groups (reductions) that write */
    idx_t red;                  /* reduction length of the bias gradient: N * spatial */
} conv_desc;

#ifdef DEPTHWISE
#define CG_OF(d) 1
#define KNAME(name) depthwise_##name
#else
#define CG_OF(d) ((d).CG)
#define KNAME(name) conv_##name
#endif

/* Token pasting after macro expansion (kernel and vector type names built from defines). */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* Split a flat index of a (B, C, D, H, W) tensor in memory order: C innermost when c_inner. */
inline void unflatten5(idx_t i, idx_t C, idx_t D, idx_t H, idx_t W, idx_t c_inner,
                       idx_t *b, idx_t *c, idx_t *z, idx_t *y, idx_t *x) {
    if (c_inner) { *c = i % C; i /= C; }
    *x = i % W; i /= W;
    *y = i % H; i /= H;
    *z = i % D; i /= D;
    if (!c_inner) { *c = i % C; i /= C; }
    *b = i;
}

/* Taps r in [lo, hi) with 0 <= o*S - P + r*DL < X (forward gather). */
inline void tap_range(idx_t o, idx_t S, idx_t P, idx_t DL, idx_t X, idx_t K, idx_t *lo, idx_t *hi) {
    const idx_t start = o * S - P;
    const idx_t lim = X - start;
    *lo = start < 0 ? (-start + DL - 1) / DL : 0;
    *hi = lim <= 0 ? 0 : min(K, (lim + DL - 1) / DL);
}

/* Outputs o in [lo, hi) with 0 <= o < Y and 0 <= o*S + r*DL - P < X (grad-weight reduction). */
inline void out_range(idx_t r, idx_t S, idx_t P, idx_t DL, idx_t X, idx_t Y, idx_t *lo, idx_t *hi) {
    const idx_t base = r * DL - P;
    const idx_t top = X - 1 - base;
    *lo = base < 0 ? (-base + S - 1) / S : 0;
    *hi = top < 0 ? 0 : min(Y, top / S + 1);
    if (*hi < *lo) *hi = *lo;
}

/* A position (b, z, y, x) in a box of extents (any, D, H, W), stepped by a fixed amount without divisions:
 * the step is split into mixed-radix digits once, and adding digit-wise carries at most one per digit. */
typedef struct { idx_t b, z, y, x; } pos4;

inline pos4 pos4_of(idx_t j, idx_t D, idx_t H, idx_t W) {
    pos4 p;
    p.x = j % W; j /= W;
    p.y = j % H; j /= H;
    p.z = j % D;
    p.b = j / D;
    return p;
}

inline void pos4_add(pos4 *p, const pos4 step, idx_t D, idx_t H, idx_t W) {
    idx_t c;
    p->x += step.x;     c = p->x >= W; if (c) p->x -= W;
    p->y += step.y + c; c = p->y >= H; if (c) p->y -= H;
    p->z += step.z + c; c = p->z >= D; if (c) p->z -= D;
    p->b += step.b + c;
}

/* Note [blocked sums]: one float32 accumulator over a long reduction loses accuracy (2^24 ones saturate it; random
 * terms lose about eps * sqrt(n) relative). Every grad-weight and grad-bias walk therefore adds its terms into a block
 * accumulator and, every RED_BLOCK terms (a power of two), the block into a running total: both sums stay short, so
 * random terms lose about eps * (sqrt(RED_BLOCK) + sqrt(n / RED_BLOCK)), and a walk's sum of ones is exact up to
 * 2^24 * RED_BLOCK terms (whole blocks are multiples of RED_BLOCK). The implicit GEMM's splits are whole blocks
 * (portconv/backends/opencl/igemm.py keeps RED_BLOCK in step); partials meet in fixed trees or in split order. */
#define RED_BLOCK 4096

/* Tree reduction of one value per work-item over a power-of-two work-group; returns the sum to all. */
inline ACC group_sum(__local ACC *scratch, ACC v) {
    const int l = (int)get_local_id(0);
    scratch[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = (int)get_local_size(0) >> 1; s > 0; s >>= 1) {
        if (l < s) scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return scratch[0];
}

#endif /* PORTCONV_COMMON_H */
