/* portconv kernel bodies: the tensor-core tile of the implicit GEMM (CUDA only, PC_TENSOR_CORES=1, sm_80+).
 *
 * Note [tensor-core implicit GEMM]: the same three GEMMs as Note [implicit GEMM], with the same Op structs doing
 * the gather (implicit im2col), but the products run on the tensor cores through inline PTX mma.sync (no
 * <mma.h>: NVRTC gets no include path here, cuda/prelude.cuh Note [preludes]):
 *   float16   mma.m16n8k16 .f16 x .f16 -> .f32      (fp32 accumulate)
 *   bfloat16  mma.m16n8k16 .bf16 x .bf16 -> .f32    (fp32 accumulate)
 *   float32   mma.m16n8k8  .tf32 x .tf32 -> .f32    (operands rounded to TF32, cvt.rna; only for plans whose
 *                                                    math is 'tf32', i.e. when torch's conv policy allows it)
 * A block of 256 threads (8 warps, PC_TC_WM along M x 8/PC_TC_WM along N) computes a PC_TC_BM x PC_TC_BN tile;
 * the reduction steps PC_BK = 16 at a time. Each load thread owns one reduction index per step (as the FMA tile:
 * one Op::red decode shared by its A and B gathers) and PC_TC_BM/16 rows, PC_TC_BN/16 columns. Gathered values
 * stay in the element type (raw 16-bit bits, or float rounded to TF32) and are staged in shared memory M-major
 * with the reduction contiguous, so every mma fragment register is one 32-bit shared load; rows are padded to
 * 12 (half) or 20 (tf32) words, which makes those loads bank-conflict free. Double buffering: the next step's
 * gathers are issued into registers before the current step's mma, then written to the other shared buffer;
 * one barrier per step. The epilogue stores through Op::store (bias, channels-last, split-K workspace alike).
 */
#pragma once

#ifndef PC_TC_BM
#define PC_TC_BM 128
#endif
#ifndef PC_TC_BN
#define PC_TC_BN 128
#endif
#ifndef PC_TC_WM
#define PC_TC_WM 2 /* warps along M; 8 / PC_TC_WM along N */
#endif
#ifndef PC_TC_MINB /* blocks per SM the registers must allow: 2 for tiles up to 128x64 (at most 128 registers; */
#define PC_TC_MINB (PC_TC_BM * PC_TC_BN <= 128 * 64 && !PC_INDEX64 ? 2 : 1) /* 64-bit indices would spill) */
#endif
#define PC_TC_WN (8 / PC_TC_WM)
#define PC_TC_WTM (PC_TC_BM / PC_TC_WM) /* warp tile */
#define PC_TC_WTN (PC_TC_BN / PC_TC_WN)
#define PC_TC_MT (PC_TC_WTM / 16) /* m16 tiles per warp */
#define PC_TC_NT (PC_TC_WTN / 8)  /* n8 tiles per warp */
#define PC_TC_AJ (PC_TC_BM / PC_LQ)
#define PC_TC_BJ (PC_TC_BN / PC_LQ)

#if PC_TC_WTM % 16 != 0 || PC_TC_WTN % 8 != 0 || PC_TC_BM % PC_LQ != 0 || PC_TC_BN % PC_LQ != 0
#error "portconv: tensor-core tile shape does not divide into m16n8 warp tiles"
#endif

#if PC_DTYPE == 2 || PC_DTYPE == 3
typedef unsigned short pc_tc_e; /* gathered element: raw float16/bfloat16 bits */
#define PC_TC_LDW 12            /* 32-bit words per shared row: 16 halves + 8 pad */
#elif PC_DTYPE == 0
typedef float pc_tc_e; /* gathered element: float32, rounded to TF32 when staged */
#define PC_TC_LDW 20   /* 16 floats + 4 pad */
#else
#error "portconv: tensor-core tiles take float16, bfloat16 or float32 (TF32) only"
#endif

PC_DEVICE void pc_tc_stage(unsigned *row, int k, unsigned short v) { ((unsigned short *)row)[k] = v; }
PC_DEVICE void pc_tc_stage(unsigned *row, int k, float v) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v));
    row[k] = u;
}

/* One k-step (16 of the reduction) of a warp's tile from shared rows A (M-major) and B (N-major). */
PC_DEVICE void pc_tc_mma(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (*A)[PC_TC_LDW],
                         const unsigned (*B)[PC_TC_LDW], int g, int t) {
#if PC_DTYPE == 0
#pragma unroll
    for (int kk = 0; kk < PC_BK; kk += 8) {
        unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
#pragma unroll
        for (int i = 0; i < PC_TC_MT; ++i) {
            a[i][0] = A[16 * i + g][kk + t], a[i][1] = A[16 * i + g + 8][kk + t];
            a[i][2] = A[16 * i + g][kk + t + 4], a[i][3] = A[16 * i + g + 8][kk + t + 4];
        }
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) b[j][0] = B[8 * j + g][kk + t], b[j][1] = B[8 * j + g][kk + t + 4];
#pragma unroll
        for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
            for (int j = 0; j < PC_TC_NT; ++j)
                asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                             : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
#else
    unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i) {
        a[i][0] = A[16 * i + g][t], a[i][1] = A[16 * i + g + 8][t];
        a[i][2] = A[16 * i + g][t + 4], a[i][3] = A[16 * i + g + 8][t + 4];
    }
#pragma unroll
    for (int j = 0; j < PC_TC_NT; ++j) b[j][0] = B[8 * j + g][t], b[j][1] = B[8 * j + g][t + 4];
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j)
#if PC_DTYPE == 2
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
#else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
#endif
                         : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                         : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
#endif
}

template <class Op>
PC_DEVICE void pc_igemm_tc_fetch(const Op &op, const typename Op::Row *rows, const typename Op::Col *cols, pc_idx r,
                                 pc_idx rend, pc_tc_e *ra, pc_tc_e *rb) {
    const typename Op::Red d = op.red(r, rend);
#pragma unroll
    for (int j = 0; j < PC_TC_AJ; ++j) ra[j] = op.template A<pc_tc_e>(rows[j], d);
#pragma unroll
    for (int j = 0; j < PC_TC_BJ; ++j) rb[j] = op.template B<pc_tc_e>(d, cols[j]);
}

template <class Op>
PC_DEVICE void pc_igemm_tc_run(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
    PC_SHARED unsigned As[2][PC_TC_BM][PC_TC_LDW];
    PC_SHARED unsigned Bs[2][PC_TC_BN][PC_TC_LDW];
    const int tid = (int)threadIdx.x, rr = tid % PC_BK, lq = tid / PC_BK;
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
    const int wm = (warp % PC_TC_WM) * PC_TC_WTM, wn = (warp / PC_TC_WM) * PC_TC_WTN;
    const pc_idx m0 = (pc_idx)blockIdx.x * PC_TC_BM, n0 = (pc_idx)blockIdx.y * PC_TC_BN;
    typename Op::Row rows[PC_TC_AJ];
    typename Op::Col cols[PC_TC_BJ];
#pragma unroll
    for (int j = 0; j < PC_TC_AJ; ++j) rows[j] = op.row(m0 + lq + PC_LQ * j, M);
#pragma unroll
    for (int j = 0; j < PC_TC_BJ; ++j) cols[j] = op.col(n0 + lq + PC_LQ * j, NC);
    pc_tc_e ra[PC_TC_AJ], rb[PC_TC_BJ];
    float acc[PC_TC_MT][PC_TC_NT][4];
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    int buf = 0;
    if (rbeg < rend) {
        pc_igemm_tc_fetch(op, rows, cols, rbeg + rr, rend, ra, rb);
#pragma unroll
        for (int j = 0; j < PC_TC_AJ; ++j) pc_tc_stage(As[0][lq + PC_LQ * j], rr, ra[j]);
#pragma unroll
        for (int j = 0; j < PC_TC_BJ; ++j) pc_tc_stage(Bs[0][lq + PC_LQ * j], rr, rb[j]);
    }
    PC_BARRIER();
    for (pc_idx r0 = rbeg; r0 < rend; r0 += PC_BK) {
        const bool more = r0 + PC_BK < rend;
        if (more) pc_igemm_tc_fetch(op, rows, cols, r0 + PC_BK + rr, rend, ra, rb);
        pc_tc_mma(acc, As[buf] + wm, Bs[buf] + wn, g, t);
        if (more) {
#pragma unroll
            for (int j = 0; j < PC_TC_AJ; ++j) pc_tc_stage(As[buf ^ 1][lq + PC_LQ * j], rr, ra[j]);
#pragma unroll
            for (int j = 0; j < PC_TC_BJ; ++j) pc_tc_stage(Bs[buf ^ 1][lq + PC_LQ * j], rr, rb[j]);
        }
        PC_BARRIER();
        buf ^= 1;
    }
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const pc_idx m = m0 + wm + 16 * i + g + 8 * h;
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < PC_TC_NT; ++j) {
                const pc_idx n = n0 + wn + 8 * j + 2 * t;
                if (n < NC) op.store(m, n, acc[i][j][2 * h]);
                if (n + 1 < NC) op.store(m, n + 1, acc[i][j][2 * h + 1]);
            }
        }
    }
}
