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
 * one Op::red decode shared by its A and B gathers, or Note [tap-major steps]) and PC_TC_BM/16 rows, PC_TC_BN/16
 * columns; NCHW problems under tap-major steps gather A by Note [M-lane gathers] instead. Gathered values
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

/* Note [A swizzle]: in the M-lane layout of the 16-bit types (PC_TC_SW), the 32-bit word w of A row m lives at word
 * w ^ ((m >> 3) & 3). Rows 8 apart share a bank at the padded row pitch; the swizzle spreads the M-lane stores (32
 * consecutive rows, one word) over 32 banks, and the fragment loads (8 consecutive rows, words t and t + 4) stay
 * conflict free, all 8 rows sharing one XOR. Measured on the H100 (docs/performance/h100-igemm-tc/v4): float16/bfloat16
 * M-lane rows 1.05x-1.13x faster; the reduction-lane layout (no conflict to remove) and TF32 (two words a row, and
 * no gain seen) keep the plain layout. */
#define PC_TC_SW (PC_DTYPE == 2 || PC_DTYPE == 3)
PC_DEVICE int pc_tc_sw(int m) { return (m >> 3) & 3; }

PC_DEVICE unsigned pc_tc_word(unsigned short v) { return v; }
PC_DEVICE unsigned pc_tc_word(float v) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v));
    return u;
}
PC_DEVICE void pc_tc_stage(unsigned *row, int k, unsigned short v) { ((unsigned short *)row)[k] = v; }
PC_DEVICE void pc_tc_stage(unsigned *row, int k, float v) { row[k] = pc_tc_word(v); }

/* One k-step (16 of the reduction) of a warp's tile from shared rows A (M-major; Sw: Note [A swizzle]) and B. */
template <bool Sw>
PC_DEVICE void pc_tc_mma(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (*A)[PC_TC_LDW],
                         const unsigned (*B)[PC_TC_LDW], int g, int t) {
#if PC_DTYPE == 0
#pragma unroll
    for (int kk = 0; kk < PC_BK; kk += 8) {
        unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
#pragma unroll
        for (int i = 0; i < PC_TC_MT; ++i) { /* Note [A swizzle]: rows 16i + g and 16i + g + 8 */
            const int t0 = kk + (Sw ? t ^ pc_tc_sw(16 * i) : t), t1 = kk + (Sw ? t ^ pc_tc_sw(16 * i + 8) : t);
            a[i][0] = A[16 * i + g][t0], a[i][1] = A[16 * i + g + 8][t1];
            a[i][2] = A[16 * i + g][t0 + 4], a[i][3] = A[16 * i + g + 8][t1 + 4];
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
    for (int i = 0; i < PC_TC_MT; ++i) { /* Note [A swizzle]: rows 16i + g and 16i + g + 8 */
        const int t0 = Sw ? t ^ pc_tc_sw(16 * i) : t, t1 = Sw ? t ^ pc_tc_sw(16 * i + 8) : t;
        a[i][0] = A[16 * i + g][t0], a[i][1] = A[16 * i + g + 8][t1];
        a[i][2] = A[16 * i + g][t0 + 4], a[i][3] = A[16 * i + g + 8][t1 + 4];
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

/* The tile's shared memory, one allocation per kernel whichever instantiations of the run function it holds. */
struct pc_tc_smem {
    unsigned A[2][PC_TC_BM][PC_TC_LDW], B[2][PC_TC_BN][PC_TC_LDW];
};
PC_DEVICE pc_tc_smem &pc_tc_shared() {
    PC_SHARED pc_tc_smem s;
    return s;
}

/* Note [M-lane gathers]: under tap-major steps (Note [tap-major steps], conv_igemm.cuh) NCHW problems gather A with
 * the lanes of a warp along M: lane l takes rows l, l + 32, ... of the tile and warp w the reduction channels 2w and
 * 2w + 1 of the step. Consecutive rows are consecutive output (or phase) positions, adjacent in memory at stride 1,
 * so a warp's A load is one or two contiguous segments instead of sixteen channels' scattered elements (the
 * reduction-lane layout, which stays for B and for channels-last, where channels are the contiguous axis). */
#define PC_TC_AI (PC_TC_BM / 32) /* A rows per thread in the M-lane layout */
template <class Op>
struct pc_mlane_cursor : pc_cursor<Op, true, PC_TC_AI> {
    /* the base steps the digits at channel (step base + rr), B's, and keeps the row bits (a tap's bounds do not
     * depend on the channel); a0 / a1: the Reds of the thread's two A channels */
    typedef pc_cursor<Op, true, PC_TC_AI> base;
    pc_idx da; /* A's first channel - B's channel */
    typename Op::Red a0, a1;
    PC_DEVICE void set_a(const Op &op) {
        pc_tapstep t = this->s;
        t.ch += da;
        a0 = op.red_at(t);
        ++t.ch;
        a1 = op.red_at(t);
    }
    PC_DEVICE pc_mlane_cursor(const Op &op, const typename Op::Row *rows, pc_idx r0, pc_idx rend, int rr, int kw)
        : base(op, rows, r0, rend), da(2 * kw - rr) {
        set_a(op);
    }
    PC_DEVICE void next(const Op &op, const typename Op::Row *rows) {
        base::next(op, rows);
        set_a(op);
    }
    template <class V, int BJ> /* ra[2i + h]: row i, channel h */
    PC_DEVICE void fetch(const Op &op, const typename Op::Row *rows, const typename Op::Col *cols, V *ra,
                         V *rb) const {
#pragma unroll
        for (int i = 0; i < PC_TC_AI; ++i) {
            const bool in = this->ok >> i & 1u;
            ra[2 * i] = in ? op.template A_ld<V>(rows[i], a0) : V(0);
            ra[2 * i + 1] = in ? op.template A_ld<V>(rows[i], a1) : V(0);
        }
#pragma unroll
        for (int j = 0; j < BJ; ++j) rb[j] = op.template B<V>(this->d, cols[j]);
    }
};

/* The gathered values of one step into shared buffers A and B, in the layout the cursor gathered them. */
template <bool MLane>
PC_DEVICE void pc_tc_stage_step(unsigned (*A)[PC_TC_LDW], unsigned (*B)[PC_TC_LDW], const pc_tc_e *ra,
                                const pc_tc_e *rb, int tid) {
    const int rr = tid % PC_BK, lq = tid / PC_BK, lane = tid % 32, warp = tid / 32;
    if (MLane) {
#pragma unroll
        for (int i = 0; i < PC_TC_AI; ++i) {
            const int m = lane + 32 * i;
#if PC_TC_SW
            A[m][warp ^ pc_tc_sw(m)] = pc_tc_word(ra[2 * i]) | pc_tc_word(ra[2 * i + 1]) << 16; /* channels 2w, 2w+1 */
#else
            A[m][2 * warp] = pc_tc_word(ra[2 * i]);
            A[m][2 * warp + 1] = pc_tc_word(ra[2 * i + 1]);
#endif
        }
    } else {
#pragma unroll
        for (int j = 0; j < PC_TC_AJ; ++j) pc_tc_stage(A[lq + PC_LQ * j], rr, ra[j]);
    }
#pragma unroll
    for (int j = 0; j < PC_TC_BJ; ++j) pc_tc_stage(B[lq + PC_LQ * j], rr, rb[j]);
}

/* Mode 0: generic steps; 1: tap-major steps, reduction lanes; 2: tap-major steps, M-lane A (NCHW). */
template <class Op, int Mode>
PC_DEVICE void pc_igemm_tc_run(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
    auto &As = pc_tc_shared().A;
    auto &Bs = pc_tc_shared().B;
    const int tid = (int)threadIdx.x, rr = tid % PC_BK, lq = tid / PC_BK;
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
    const int wm = (warp % PC_TC_WM) * PC_TC_WTM, wn = (warp / PC_TC_WM) * PC_TC_WTN;
    const pc_idx m0 = (pc_idx)blockIdx.x * PC_TC_BM, n0 = (pc_idx)blockIdx.y * PC_TC_BN;
    constexpr bool mlane = Mode == 2;
    constexpr int AR = mlane ? PC_TC_AI : PC_TC_AJ; /* A rows per thread */
    typename Op::Row rows[AR];
    typename Op::Col cols[PC_TC_BJ];
#pragma unroll
    for (int j = 0; j < AR; ++j) rows[j] = op.row(mlane ? m0 + lane + 32 * j : m0 + lq + PC_LQ * j, M);
#pragma unroll
    for (int j = 0; j < PC_TC_BJ; ++j) cols[j] = op.col(n0 + lq + PC_LQ * j, NC);
    pc_tc_e ra[PC_TC_AJ], rb[PC_TC_BJ];
    float acc[PC_TC_MT][PC_TC_NT][4];
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    typename pc_if<mlane, pc_mlane_cursor<Op>, pc_cursor<Op, Mode == 1, AR>>::type cur(op, rows, rbeg + rr, rend,
                                                                                          rr, warp);
    int buf = 0;
    if (rbeg < rend) {
        cur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, ra, rb);
        pc_tc_stage_step<mlane>(As[0], Bs[0], ra, rb, tid);
    }
    PC_BARRIER();
    for (pc_idx r0 = rbeg; r0 < rend; r0 += PC_BK) {
        const bool more = r0 + PC_BK < rend;
        if (more) {
            cur.next(op, rows);
            cur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, ra, rb);
        }
        pc_tc_mma<mlane && PC_TC_SW>(acc, As[buf] + wm, Bs[buf] + wn, g, t);
        if (more) pc_tc_stage_step<mlane>(As[buf ^ 1], Bs[buf ^ 1], ra, rb, tid);
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
