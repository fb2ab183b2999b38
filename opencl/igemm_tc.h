/* Note [OpenCL tensor cores]: the products of igemm_tile.h's steps as warp-level mma (IG_TC). The gathers, the
 * local-memory steps and the stores stay those of Note [OpenCL implicit GEMM]; only the layout of the staged tiles,
 * the products and the ownership of the results change.
 *
 * A work-group of IG_WM x IG_WN warps (IG_NT = 32 * IG_WM * IG_WN work-items; NVIDIA runs 32 consecutive local ids
 * as one warp) computes an IG_BM x IG_BN tile; warp w owns rows (w % IG_WM) * IG_WTM and columns (w / IG_WM) * IG_WTN
 * of it: IG_MI x IG_NI mma tiles of 16 x 8. The staged tiles are row-major with the reduction contiguous,
 * As[m * IG_LDK + r] and Bs[n * IG_LDK + r], rows padded so that the fragment loads of a warp hit 32 different
 * banks (TF32: one word at g * IG_LDK + t, IG_LDK = IG_BK + 4; 16-bit: two words at g * IG_LDK + 2t, IG_LDK =
 * IG_BK + 8, per half-warp; g = lane / 4, t = lane % 4). The mma shapes are those of the CUDA set's tile
 * (cuda/conv_igemm_tc.cuh):
 *   float32   m16n8k8  .tf32 x .tf32 -> .f32  operands rounded to TF32 when staged (round to nearest, ties away
 *             from zero, as cvt.rna; NaN stays NaN), so a plan runs it only where TF32 is allowed
 *   float16   m16n8k16 .f16  x .f16  -> .f32  staged as float (exact), packed in pairs with cvt.rn.f16x2.f32
 *   bfloat16  m16n8k16 .bf16 x .bf16 -> .f32  staged as float (exact), packed in pairs by their upper halves
 * IG_MMA_PTX: the mma is NVIDIA's inline PTX mma.sync (sm_80 and newer; NVIDIA's OpenCL compiler takes inline PTX).
 * Without it each work-item computes the same four results per 16 x 8 tile from the
 * staged tiles in plain OpenCL C: the tile's layout, staging, rounding and result ownership, portable to any device
 * (PoCL included, so CI runs this tile), at FMA speed.
 */
#ifndef PORTCONV_IGEMM_TC_H
#define PORTCONV_IGEMM_TC_H

#if defined(DTYPE_F64)
#error "portconv: the tensor-core tile takes float32, float16 and bfloat16"
#endif
#if defined(DTYPE_F32)
#define IG_MK 8       /* reduction depth of one mma */
#define IG_LDK (IG_BK + 4)
#else
#define IG_MK 16
#define IG_LDK (IG_BK + 8)
#endif
#define IG_NT (32 * IG_WM * IG_WN)
#define IG_WTM (IG_BM / IG_WM) /* a warp's rows */
#define IG_WTN (IG_BN / IG_WN) /* and columns */
#define IG_MI (IG_WTM / 16)
#define IG_NI (IG_WTN / 8)
#if IG_WTM % 16 || IG_WTN % 8 || IG_BK % IG_MK
#error "portconv: the tensor-core tile needs warp tiles of 16 x 8 multiples and IG_BK a multiple of the mma depth"
#endif
#define IG_AS (IG_BM * IG_LDK)
#define IG_BS (IG_BN * IG_LDK)
#define IG_AT(r, m) ((m) * IG_LDK + (r))
#define IG_BT(r, n) ((n) * IG_LDK + (r))

#if defined(DTYPE_F32) && defined(IG_MMA_PTX)
/* v rounded to TF32 (10 mantissa bits) to nearest, ties away from zero: one cvt.rna on the GPU instead of the
 * C form's test, select and add-and-mask per staged element */
inline float ig_tf32(float v) {
    uint u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v));
    return as_float(u);
}
#define IG_STAGE(v) ig_tf32(v)
#elif defined(DTYPE_F32)
/* the same in plain OpenCL C: to nearest, ties away from zero; infinities kept, NaN a quiet NaN */
inline float ig_tf32(float v) {
    const uint u = as_uint(v);
    if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x7fffffu) ? as_float(u | 0x7fc00000u) : v;
    return as_float((u + 0x1000u) & 0xffffe000u);
}
#define IG_STAGE(v) ig_tf32(v)
#else
#define IG_STAGE(v) (v)
#endif

#ifdef IG_MMA_PTX
#if defined(DTYPE_F32)
/* lane (g, t): A rows g, g + 8 at reduction t, t + 4; B column g at t, t + 4 */
inline void ig_frag_a(uint *a, __local const float *p, int t) {
    a[0] = as_uint(p[t]), a[1] = as_uint(p[8 * IG_LDK + t]);
    a[2] = as_uint(p[t + 4]), a[3] = as_uint(p[8 * IG_LDK + t + 4]);
}
inline void ig_frag_b(uint *b, __local const float *p, int t) { b[0] = as_uint(p[t]), b[1] = as_uint(p[t + 4]); }
#define IG_MMA "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
#else
#if defined(DTYPE_F16)
inline uint ig_pack(float2 v) {
    uint d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(v.y), "f"(v.x));
    return d;
}
#define IG_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
inline uint ig_pack(float2 v) { return (as_uint(v.x) >> 16) | (as_uint(v.y) & 0xffff0000u); }
#define IG_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
/* lane (g, t): A rows g, g + 8 at reduction pairs 2t, 2t + 8; B column g at the same pairs */
#define IG_PAIR(p, i) ig_pack(*(__local const float2 *)((p) + (i)))
inline void ig_frag_a(uint *a, __local const float *p, int t) {
    a[0] = IG_PAIR(p, 2 * t), a[1] = IG_PAIR(p, 8 * IG_LDK + 2 * t);
    a[2] = IG_PAIR(p, 2 * t + 8), a[3] = IG_PAIR(p, 8 * IG_LDK + 2 * t + 8);
}
inline void ig_frag_b(uint *b, __local const float *p, int t) { b[0] = IG_PAIR(p, 2 * t), b[1] = IG_PAIR(p, 2 * t + 8); }
#endif
inline void ig_mma(float *d, const uint *a, const uint *b) {
    asm volatile(IG_MMA "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* One staged step of the warp's IG_MI x IG_NI tiles: fragments from local memory, then the mma. */
IG_INLINE void ig_tc_step(__local const float *As, __local const float *Bs, float acc[IG_MI][IG_NI][4], int tid) {
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    __local const float *pa = As + ((warp % IG_WM) * IG_WTM + g) * IG_LDK;
    __local const float *pb = Bs + ((warp / IG_WM) * IG_WTN + g) * IG_LDK;
#pragma unroll
    for (int ks = 0; ks < IG_BK; ks += IG_MK) {
        uint a[IG_MI][4], b[IG_NI][2];
#pragma unroll
        for (int i = 0; i < IG_MI; ++i) ig_frag_a(a[i], pa + 16 * i * IG_LDK + ks, t);
#pragma unroll
        for (int j = 0; j < IG_NI; ++j) ig_frag_b(b[j], pb + 8 * j * IG_LDK + ks, t);
#pragma unroll
        for (int i = 0; i < IG_MI; ++i)
#pragma unroll
            for (int j = 0; j < IG_NI; ++j) ig_mma(acc[i][j], a[i], b[j]);
    }
}
#else
/* The portable step: the four results lane (g, t) owns in each 16 x 8 tile, (g | g + 8, 2t | 2t + 1), as sums
 * over the staged tiles in reduction order. */
IG_INLINE void ig_tc_step(__local const float *As, __local const float *Bs, float acc[IG_MI][IG_NI][4], int tid) {
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    __local const float *pa = As + ((warp % IG_WM) * IG_WTM + g) * IG_LDK;
    __local const float *pb = Bs + ((warp / IG_WM) * IG_WTN + 2 * t) * IG_LDK;
    for (int i = 0; i < IG_MI; ++i)
        for (int j = 0; j < IG_NI; ++j)
            for (int e = 0; e < 4; ++e) {
                __local const float *ra = pa + (16 * i + 8 * (e >> 1)) * IG_LDK;
                __local const float *rb = pb + (8 * j + (e & 1)) * IG_LDK;
                float s = acc[i][j][e];
                for (int k = 0; k < IG_BK; ++k) s = ra[k] * rb[k] + s;
                acc[i][j][e] = s;
            }
}
#endif

#endif /* PORTCONV_IGEMM_TC_H */
