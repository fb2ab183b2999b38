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
 * one barrier per step. The vector modes instead copy into a cp.async ring of multi-step stages (Note [async
 * stages], Note [deep stages], Note [stage rows]). The epilogue stores through Op::store (bias, channels-last,
 * split-K workspace alike).
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
#define PC_TC_VE 8              /* elements per 16-byte vector (Note [vector gathers]) */
#elif PC_DTYPE == 0
typedef float pc_tc_e; /* gathered element: float32, rounded to TF32 when staged */
#define PC_TC_LDW 20   /* 16 floats + 4 pad */
#define PC_TC_VE 4
#else
#error "portconv: tensor-core tiles take float16, bfloat16 or float32 (TF32) only"
#endif

/* Note [A swizzle]: in the M-lane layout of the 16-bit types (PC_TC_SW), the 32-bit word w of A row m lives at word
 * w ^ ((m >> 3) & 3). Rows 8 apart share a bank at the padded row pitch; the swizzle spreads the M-lane stores (32
 * consecutive rows, one word) over 32 banks, and the fragment loads (8 consecutive rows, words t and t + 4) stay
 * conflict free, all 8 rows sharing one XOR (H100: float16/bfloat16 M-lane rows 1.05x-1.13x faster,
 * docs/kernels/implicit-gemm.md). The reduction-lane layout (no conflict to remove) and TF32 (two words a row, and
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

/* Note [ldmatrix]: in the plain 16-bit layout (rows of 16 elements, 12 words apart, 16-byte aligned: the eight row
 * addresses of one 8 x 8 matrix fall on distinct 4-bank groups) one ldmatrix.x4 loads the four 8 x 8 blocks of a
 * 16 x 16 A fragment, or two n8 B fragments, where 32-bit loads took four; each thread receives exactly the fragment
 * registers mma.m16n8k16 expects (row lane / 4, elements 2 (lane % 4), + 1). */
template <bool Trans = false> /* Trans: 8 x 8 blocks stored row-major are received transposed (Note [TN tiles]) */
PC_DEVICE void pc_ldsm4(unsigned (&r)[4], const unsigned *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

/* acc += a b over a warp's fragments: mma.m16n8k8 TF32 (one half-step), or mma.m16n8k16 of the 16-bit types. */
PC_DEVICE void pc_tc_mma_frags(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (&a)[PC_TC_MT][4],
                               const unsigned (&b)[PC_TC_NT][2]) {
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j)
#if PC_DTYPE == 0
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
#elif PC_DTYPE == 2
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
#else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
#endif
                         : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                         : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
}

/* Note [TF32 ldmatrix]: ldmatrix moves 8 x 8 blocks of 16-bit elements, and a TF32 row of 4 words is 8 of them: one
 * ldmatrix.x4 at rows l % 16, words 4 (l / 16) gives lane (g, t) words A[g][t], A[g + 8][t], A[g][t + 4],
 * A[g + 8][t + 4], the m16n8k8 TF32 A fragment (as CUTLASS loads it), and likewise two n8 B fragments; the 80-byte
 * TF32 rows keep the eight row addresses on distinct 4-bank groups. One load where four 32-bit loads were. */
#if PC_DTYPE == 0
#define PC_TC_KW 16 /* 32-bit words of a step's row: 16 floats (two m16n8k8), or 16 halves (one m16n8k16) */
#else
#define PC_TC_KW 8
#endif
PC_DEVICE void pc_tc_round(unsigned &w) { w = pc_tc_word(__uint_as_float(w)); }

/* Note [deep stages]: a stage of the cp.async ring (Note [async stages]) holds PC_TC_KS consecutive steps of PC_BK, one
 * barrier and one wait a stage instead of one a step (16 of the reduction: 8 mma a warp at 128 x 64 between
 * barriers), and the fragments of the stage's 2-4 k16 (k8) blocks are loaded and multiplied in one unrolled run. The
 * rows are unpadded, 16 * PC_TC_KS halves (floats), their 16-byte chunks XOR-swizzled (Note [ring swizzle]) instead of
 * padded, so 48 KB of static shared memory holds 4 stages of 32 at 128 x 64 (16-bit) and 2 stages of 32 (TF32). The
 * copies take a stage's row as one run (Note [stage rows]); element-wise B (Mode 3) still gathers a step at a time,
 * its sub-step s into elements 16 s ... of the rows. Vectors past the reduction's end are zero-filled. The host
 * passes PC_TC_KS = 2, or 1 where a stage of 32 channels would straddle a tap (simt/igemm.py ring_steps); a tile
 * whose 2 stages of PC_TC_KS steps would not fit 48 KB takes 1 (TF32 128 x 128). */
#ifndef PC_TC_KS
#define PC_TC_KS 2
#endif
#define PC_TC_RING_BYTES(ks) ((PC_TC_BM + PC_TC_BN) * (ks) * PC_TC_KW * 4) /* one stage */
#define PC_TC_RK (2 * PC_TC_RING_BYTES(PC_TC_KS) <= 49152 ? PC_TC_KS : 1) /* steps a stage */
#define PC_TC_RW (PC_TC_RK * PC_TC_KW)                                   /* 32-bit words of a ring row */
#define PC_TC_RS (4 * PC_TC_RING_BYTES(PC_TC_RK) <= 49152 ? 4 : 3 * PC_TC_RING_BYTES(PC_TC_RK) <= 49152 ? 3 : 2)
/* Note [ring swizzle]: chunk c (16 bytes) of ring row r lives at chunk c ^ pc_tc_rsw(r), the XOR taken from the row's
 * place among the 8 rows that span the 32 banks (rows of 2, 4 chunks: (r / 4) % 2, (r / 2) % 4; of 8+: r % 8), so the
 * 8 row addresses of every ldmatrix 8 x 8 block (8 consecutive rows, one logical chunk) fall on distinct 4-bank
 * groups, as the pad words did, without them. */
#define PC_TC_RCH (PC_TC_RW / 4) /* chunks a ring row */
PC_DEVICE int pc_tc_rsw(int r) { return PC_TC_RCH >= 8 ? r & 7 : (r / (8 / PC_TC_RCH)) % PC_TC_RCH; }
PC_DEVICE int pc_tc_rc(int r, int c) { return c ^ pc_tc_rsw(r); } /* where chunk c of row r lives */

/* Note [ldmatrix], Note [TF32 ldmatrix]: the A fragments (16-row tiles i) and the B fragments (two n8 blocks a load)
 * of k block kw (words kw .. kw + 7) of rows of W words, from row r0; RSw: chunks swizzled as the ring's (Note
 * [ring swizzle]), else plain. Lane l names A row l % 16, chunk l / 16; B column l % 8 + 8 (l / 16),
 * chunk l / 8 % 2. */
template <int W, bool RSw>
PC_DEVICE void pc_tc_ldsm_a(unsigned (&a)[PC_TC_MT][4], const unsigned (*A)[W], int kw, int l, int r0 = 0) {
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i) {
        const int m = r0 + 16 * i + (l & 15), c = kw / 4 + (l >> 4);
        pc_ldsm4(a[i], &A[m][4 * (RSw ? pc_tc_rc(m, c) : c)]);
    }
}
template <int W, bool RSw>
PC_DEVICE void pc_tc_ldsm_b(unsigned (&b)[PC_TC_NT][2], const unsigned (*B)[W], int kw, int l, int r0 = 0) {
#pragma unroll
    for (int j = 0; j < PC_TC_NT; j += 2) {
        const int n = r0 + 8 * j + (l & 7) + 8 * (l >> 4), c = kw / 4 + ((l >> 3) & 1);
        unsigned q[4];
        pc_ldsm4(q, &B[n][4 * (RSw ? pc_tc_rc(n, c) : c)]);
        b[j][0] = q[0], b[j][1] = q[1], b[j + 1][0] = q[2], b[j + 1][1] = q[3];
    }
}

/* One k-step (16 of the reduction) of a warp's tile from shared rows A (M-major; Sw: Note [A swizzle], of the tile's
 * rows: A starts at the warp's row wm, which the 16-row warp tiles of Note [narrow tiles] leave odd in 16s) and B. */
template <bool Sw>
PC_DEVICE void pc_tc_mma(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (*A)[PC_TC_LDW],
                         const unsigned (*B)[PC_TC_LDW], int g, int t, int wm = 0) {
    const int l = 4 * g + t;
#pragma unroll
    for (int kw = 0; kw < PC_TC_KW; kw += 8) {
        unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
        if (Sw) {
#pragma unroll
            for (int i = 0; i < PC_TC_MT; ++i) { /* Note [A swizzle]: rows 16i + g and 16i + g + 8 */
                const int t0 = kw + (Sw ? t ^ pc_tc_sw(wm + 16 * i) : t);
                const int t1 = kw + (Sw ? t ^ pc_tc_sw(wm + 16 * i + 8) : t);
                a[i][0] = A[16 * i + g][t0], a[i][1] = A[16 * i + g + 8][t1];
                a[i][2] = A[16 * i + g][t0 + 4], a[i][3] = A[16 * i + g + 8][t1 + 4];
            }
        } else {
            pc_tc_ldsm_a<PC_TC_LDW, false>(a, A, kw, l);
        }
#if PC_TC_NT % 2 == 0
        pc_tc_ldsm_b<PC_TC_LDW, false>(b, B, kw, l);
#else
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) b[j][0] = B[8 * j + g][kw + t], b[j][1] = B[8 * j + g][kw + t + 4];
#endif
        pc_tc_mma_frags(acc, a, b);
    }
}

#define PC_TC_VP (PC_BK / PC_TC_VE)          /* vectors per row of a step */
#define PC_TC_VA (PC_TC_BM * PC_TC_VP / PC_NT + (PC_TC_BM * PC_TC_VP < PC_NT)) /* A vectors per thread */
#define PC_TC_VBN ((PC_TC_BN * PC_TC_VP + PC_NT - 1) / PC_NT) /* B vectors per thread (the last pass may be partial) */
#define PC_TC_VEC (PC_TC_BM * PC_TC_VP % PC_NT == 0) /* this tile takes them (not 64-row 16-bit) */

/* The tile's shared memory, one allocation per kernel whichever instantiations of the run function it holds. */
#define PC_TC_ASYNC PC_TC_VEC /* Note [async stages]: the vector modes */
struct pc_tc_smem { /* the register double buffer of Modes 0-2; 16-byte aligned rows: Note [vector gathers] */
    alignas(16) unsigned A[2][PC_TC_BM][PC_TC_LDW];
    alignas(16) unsigned B[2][PC_TC_BN][PC_TC_LDW];
};

#if PC_TC_ASYNC
struct pc_tc_ring {
    alignas(16) unsigned A[PC_TC_RS][PC_TC_BM][PC_TC_RW];
    alignas(16) unsigned B[PC_TC_RS][PC_TC_BN][PC_TC_RW];
};
#endif
/* Note [TN tiles]: reduction-major rows of BM (BN) elements, padded 4 words (16-bit) or 8 (TF32) */
#define PC_TC_TPA (PC_DTYPE == 0 ? PC_TC_BM + 8 : PC_TC_BM / 2 + 4) /* words per shared row */
#define PC_TC_TPB (PC_DTYPE == 0 ? PC_TC_BN + 8 : PC_TC_BN / 2 + 4)
#define PC_TC_TS (PC_DTYPE == 0 ? 2 : 4) /* stages: the register double buffer (TF32), or the cp.async ring */
struct pc_tc_tn_smem {
    alignas(16) unsigned A[PC_TC_TS][PC_BK][PC_TC_TPA];
    alignas(16) unsigned B[PC_TC_TS][PC_BK][PC_TC_TPB];
};
union pc_tc_smem_any { /* one allocation whichever tile a kernel runs */
    pc_tc_smem tile;
    pc_tc_tn_smem tn;
#if PC_TC_ASYNC
    pc_tc_ring ring;
#endif
};
PC_DEVICE pc_tc_smem_any &pc_tc_shared_any() {
    PC_SHARED pc_tc_smem_any s;
    return s;
}
PC_DEVICE pc_tc_smem &pc_tc_shared() { return pc_tc_shared_any().tile; }

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
        if (base::next(op, rows)) {
            set_a(op);
        } else {
            op.red_ch(a0);
            op.red_ch(a1);
        }
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

/* Note [vector gathers]: when the reduction channels of a tap-major step (Note [tap-major steps]) are contiguous in
 * A's tensor (channels-last X for forward, channels-last dY for phase backward-data) and the host has checked that
 * its strides and address keep every 16-byte group aligned (PC_FLAG_VA; PC_FLAG_VB: the same for the forward's W,
 * channels-last too), a step's row of 16 channels is PC_TC_VP aligned 16-byte vectors. Thread tid then loads vector
 * tid % PC_TC_VP of rows tid / PC_TC_VP + (256 / PC_TC_VP) i, one 16-byte load and one 16-byte shared store where the
 * reduction-lane layout took PC_TC_AJ element loads and stores; its cursor runs at channel (tid % VP) * VE of each
 * step, so the row bounds are still once per tap. B without PC_FLAG_VB keeps the element gathers of its reduction
 * lane at a channel offset from the vector's. The rows land in the plain layout (no swizzle), read by ldmatrix. */
PC_DEVICE uint4 pc_ld16(const pc_t *p, pc_idx i) { return *(const uint4 *)(p + i); }

template <class Op, bool VB>
struct pc_vec_cursor : pc_cursor<Op, true, PC_TC_VA> {
    /* the base steps the digits at channel (step base + vector * VE), the vectors', and keeps the row bits; b: the
     * Red of the thread's B reduction lane when B is gathered element-wise */
    typedef pc_cursor<Op, true, PC_TC_VA> base;
    pc_idx db; /* B's channel - the vector's channel */
    typename Op::Red b;
    PC_DEVICE void set_b(const Op &op) {
        if (VB) return;
        pc_tapstep t = this->s;
        t.ch += db;
        b = op.red_at(t);
    }
    PC_DEVICE pc_vec_cursor(const Op &op, const typename Op::Row *rows, pc_idx r0, pc_idx rend, int rr, int)
        : base(op, rows, r0 - rr + pc_vec_part() * PC_TC_VE, rend), db(rr - pc_vec_part() * PC_TC_VE) {
        set_b(op);
    }
    static PC_DEVICE int pc_vec_part() { return (int)threadIdx.x % PC_TC_VP; }
    PC_DEVICE void next(const Op &op, const typename Op::Row *rows) {
        if (base::next(op, rows))
            set_b(op);
        else if (!VB)
            op.red_ch(b);
    }
    /* va: the thread's A vectors; vb: its B vectors (VB), or rb: its B elements */
    PC_DEVICE void fetch(const Op &op, const typename Op::Row *rows, const typename Op::Col *cols, uint4 *va,
                         uint4 *vb, pc_tc_e *rb) const {
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < PC_TC_VA; ++i)
            va[i] = (this->ok >> i & 1u) ? pc_ld16(op.A_src(), op.A_off(rows[i], this->d)) : z;
        if (VB) {
#pragma unroll
            for (int j = 0; j < PC_TC_VBN; ++j) vb[j] = cols[j].ok ? pc_ld16(op.w, op.B_off(this->d, cols[j])) : z;
        } else {
#pragma unroll
            for (int j = 0; j < PC_TC_BJ; ++j) rb[j] = op.template B<pc_tc_e>(b, cols[j]);
        }
    }
};

/* Note [async stages]: the vector modes copy global to shared with cp.async (16 bytes, zero-filled when the
 * source is out of bounds: src-size 0), no registers on the way, into a ring of PC_TC_RS stage buffers: stages k+1
 * .. k+RS-1 are in flight while step k multiplies, where a register double buffer has one step of loads in flight,
 * its latency exposed behind 8-16 mma a warp (Nsight Compute: ~1600 cycles a step on resnet50-l1-3x3-bf16-cl).
 * Element-wise B (Mode 3) keeps the register double buffer one step ahead, written into the ring's stage. TF32 too:
 * the floats land unrounded and the fragments are rounded after their loads (pc_tc_mma_ring; rounding a rounded B
 * element again changes nothing). A stage holds several steps in swizzled rows (Note [deep stages]). The copies are
 * the prelude's pc_cp_async (Note [async copies]). */

#if PC_TC_ASYNC
/* Note [stage rows]: a ring stage's row of PC_TC_RK steps is PC_TC_WP 16-byte vectors, one run of contiguous channels
 * in A's (B's) tensor; load thread tid takes vector tid % WP of rows tid / WP + (256 / WP) i, so a warp's copy covers
 * 32 / WP rows of 16 WP bytes each, not 32 / VP rows of 16 VP bytes (one step's vectors): fewer lines a copy
 * instruction, and one issue a stage instead of one a step. The thread's cursor sits at channel (tid % WP) VE of the
 * stage's window and steps PC_TC_RK times a stage; a window must not straddle a tap, so the host builds the ring with
 * PC_TC_KS steps only for channel counts in multiples of 16 PC_TC_KS (simt/igemm.py ring_steps), and the kernel
 * checks it (pc_igemm_tc_run). */
#define PC_TC_WP (PC_TC_RK * PC_TC_VP)              /* vectors a ring row */
#define PC_TC_WA (PC_TC_BM * PC_TC_WP / PC_NT)      /* A vectors a thread a stage */
#define PC_TC_WB ((PC_TC_BN * PC_TC_WP + PC_NT - 1) / PC_NT) /* B vectors (the last pass may be partial) */

/* The thread's A vectors (and B vectors, VB) of the cursor's stage into ring stage A, B with cp.async (Note [stage
 * rows]); live false: zeros (a vector past the reduction's end). */
template <bool VB, class Op>
PC_DEVICE void pc_tc_issue(const Op &op, const pc_cursor<Op, true, PC_TC_WA> &cur, bool live,
                           const typename Op::Row *rows, const typename Op::Col *cols, unsigned (*A)[PC_TC_RW],
                           unsigned (*B)[PC_TC_RW], int tid) {
    const int c = tid % PC_TC_WP, lv = tid / PC_TC_WP; /* the vector's chunk of the row, its first row */
#pragma unroll
    for (int i = 0; i < PC_TC_WA; ++i) {
        const int m = lv + (PC_NT / PC_TC_WP) * i;
        const bool in = live && (cur.ok >> i & 1u);
        pc_cp_async<16>(&A[m][4 * pc_tc_rc(m, c)], op.A_src() + (in ? op.A_off(rows[i], cur.d) : 0), in);
    }
    if (VB) {
#pragma unroll
        for (int j = 0; j < PC_TC_WB; ++j) {
            const int n = lv + (PC_NT / PC_TC_WP) * j;
            const bool in = live && cols[j].ok;
            if (n < PC_TC_BN)
                pc_cp_async<16>(&B[n][4 * pc_tc_rc(n, c)], op.w + (in ? op.B_off(cur.d, cols[j]) : 0), in);
        }
    }
}

/* The ring cursor's vectors one stage on: PC_TC_RK steps; rv: their reduction index (Note [stage rows]). */
template <class Op>
PC_DEVICE void pc_tc_stage_on(const Op &op, pc_cursor<Op, true, PC_TC_WA> &cur, const typename Op::Row *rows,
                              pc_idx &rv) {
#pragma unroll
    for (int s = 0; s < PC_TC_RK; ++s) cur.next(op, rows);
    rv += PC_TC_RK * PC_BK;
}

/* Element-wise B (Mode 3) of the next step into registers rb, bcur moved to it; a step past the reduction's end
 * (qb: the steps fetched so far) is zeros. */
template <class Op>
PC_DEVICE void pc_tc_fetch_ring_b(const Op &op, pc_cursor<Op, true, 0> &bcur, const typename Op::Row *rows,
                                  const typename Op::Col *cols, pc_tc_e (&rb)[PC_TC_BJ], pc_idx &qb, pc_idx steps) {
    const bool live = qb < steps;
    if (live) {
        bcur.next(op, rows);
        bcur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, rb, rb);
    } else {
#pragma unroll
        for (int j = 0; j < PC_TC_BJ; ++j) rb[j] = pc_tc_e(0);
    }
    qb += live;
}

/* ... and from registers into ring stage B: step s of the stage into elements 16 s ... of the rows (Note [ring
 * swizzle]). */
PC_DEVICE void pc_tc_stage_ring_b(unsigned (*B)[PC_TC_RW], const pc_tc_e (&rb)[PC_TC_BJ], int rr, int lq, int s) {
#pragma unroll
    for (int j = 0; j < PC_TC_BJ; ++j) {
        const int n = lq + PC_LQ * j;
        pc_tc_stage(B[n], (s * PC_BK + rr) ^ (PC_TC_VE * pc_tc_rsw(n)), rb[j]);
    }
}

/* One ring stage of a warp's tile (Note [deep stages]): its PC_TC_RK steps' k16 (TF32: k8) blocks, fragments by
 * ldmatrix from the swizzled rows (Note [ring swizzle]) at the warp's rows wm, columns wn; TF32 operands, copied
 * unrounded, are rounded in the fragments (Note [async stages]). */
PC_DEVICE void pc_tc_mma_ring(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (*A)[PC_TC_RW],
                              const unsigned (*B)[PC_TC_RW], int wm, int wn, int g, int t) {
    const int l = 4 * g + t;
#pragma unroll
    for (int kw = 0; kw < PC_TC_RW; kw += 8) {
        unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
        pc_tc_ldsm_a<PC_TC_RW, true>(a, A, kw, l, wm);
        pc_tc_ldsm_b<PC_TC_RW, true>(b, B, kw, l, wn);
        if (PC_DTYPE == 0) {
#pragma unroll
            for (int i = 0; i < PC_TC_MT; ++i) pc_tc_round(a[i][0]), pc_tc_round(a[i][1]), pc_tc_round(a[i][2]),
                                               pc_tc_round(a[i][3]);
#pragma unroll
            for (int j = 0; j < PC_TC_NT; ++j) pc_tc_round(b[j][0]), pc_tc_round(b[j][1]);
        }
        pc_tc_mma_frags(acc, a, b);
    }
}
#endif

PC_DEVICE void pc_tc_stage_vec(unsigned *row, const uint4 &v) {
#if PC_DTYPE == 0
    *(uint4 *)row = make_uint4(pc_tc_word(__uint_as_float(v.x)), pc_tc_word(__uint_as_float(v.y)),
                               pc_tc_word(__uint_as_float(v.z)), pc_tc_word(__uint_as_float(v.w)));
#else
    *(uint4 *)row = v;
#endif
}

/* One step of vector gathers into shared buffers A and B (Note [vector gathers]). */
template <bool VB>
PC_DEVICE void pc_tc_stage_vec_step(unsigned (*A)[PC_TC_LDW], unsigned (*B)[PC_TC_LDW], const uint4 *va,
                                    const uint4 *vb, const pc_tc_e *rb, int tid) {
    const int part = tid % PC_TC_VP, lv = tid / PC_TC_VP;
#pragma unroll
    for (int i = 0; i < PC_TC_VA; ++i) pc_tc_stage_vec(&A[lv + (PC_NT / PC_TC_VP) * i][4 * part], va[i]);
    if (VB) {
#pragma unroll
        for (int j = 0; j < PC_TC_VBN; ++j)
            if (lv + (PC_NT / PC_TC_VP) * j < PC_TC_BN) pc_tc_stage_vec(&B[lv + (PC_NT / PC_TC_VP) * j][4 * part], vb[j]);
    } else {
        const int rr = tid % PC_BK, lq = tid / PC_BK;
#pragma unroll
        for (int j = 0; j < PC_TC_BJ; ++j) pc_tc_stage(B[lq + PC_LQ * j], rr, rb[j]);
    }
}

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

/* A thread's place in the block's tile: load lanes (rr, lq), warp and mma lane (g, t), its warp's tile (wm, wn). */
struct pc_tc_thread {
    int tid, rr, lq, warp, lane, g, t, wm, wn;
    pc_idx m0, n0;
    PC_DEVICE pc_tc_thread()
        : tid((int)threadIdx.x), rr(tid % PC_BK), lq(tid / PC_BK), warp(tid / 32), lane(tid % 32), g(lane >> 2),
          t(lane & 3), wm((warp % PC_TC_WM) * PC_TC_WTM), wn((warp / PC_TC_WM) * PC_TC_WTN),
          m0((pc_idx)blockIdx.x * PC_TC_BM), n0((pc_idx)blockIdx.y * PC_TC_BN) {}
};

PC_DEVICE void pc_tc_zero(float (&acc)[PC_TC_MT][PC_TC_NT][4]) {
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i)
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
}

/* The accumulators of a warp's tile through the op's stores, each row and column decoded once (Note [split stores],
 * conv_igemm.cuh): the thread holds rows 16i + g (+ 8) and columns 8j + 2t (+ 1). */
template <class Op>
PC_DEVICE void pc_tc_epilogue(const Op &op, const float (&acc)[PC_TC_MT][PC_TC_NT][4], pc_idx m0, pc_idx n0, int g,
                              int t, pc_idx M, pc_idx NC) {
    pc_idx oc[PC_TC_NT][2];
#pragma unroll
    for (int j = 0; j < PC_TC_NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) oc[j][e] = op.out_col(n0 + 8 * j + 2 * t + e < NC ? n0 + 8 * j + 2 * t + e : 0);
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const pc_idx m = m0 + 16 * i + g + 8 * h;
            if (m >= M) continue;
            const pc_idx orow = op.out_row(m);
#pragma unroll
            for (int j = 0; j < PC_TC_NT; ++j) {
                const pc_idx n = n0 + 8 * j + 2 * t;
                if (n < NC) op.put(orow, oc[j][0], n, acc[i][j][2 * h]);
                if (n + 1 < NC) op.put(orow, oc[j][1], n + 1, acc[i][j][2 * h + 1]);
            }
        }
    }
}

#if PC_TC_ASYNC
/* Note [async stages], Note [deep stages]: Modes 3 (VB false) and 4. */
template <class Op, bool VB>
PC_DEVICE void pc_igemm_tc_async(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
    auto &R = pc_tc_shared_any().ring;
    constexpr int S = PC_TC_RS, KS = PC_TC_RK;
    const pc_tc_thread th;
    const int tid = th.tid, rr = th.rr, lq = th.lq, g = th.g, t = th.t;
    const int wm = th.wm, wn = th.wn;
    const pc_idx m0 = th.m0, n0 = th.n0;
    const int lv = tid / PC_TC_WP;
    constexpr int BC = VB ? PC_TC_WB : PC_TC_BJ;
    typename Op::Row rows[PC_TC_WA];
    typename Op::Col cols[BC];
#pragma unroll
    for (int j = 0; j < PC_TC_WA; ++j) rows[j] = op.row(m0 + lv + (PC_NT / PC_TC_WP) * j, M);
#pragma unroll
    for (int j = 0; j < BC; ++j) cols[j] = op.col(VB ? n0 + lv + (PC_NT / PC_TC_WP) * j : n0 + lq + PC_LQ * j, NC);
    float acc[PC_TC_MT][PC_TC_NT][4];
    pc_tc_zero(acc);
    pc_idx rv = rbeg + (tid % PC_TC_WP) * PC_TC_VE;           /* the thread's vectors' reduction index */
    pc_cursor<Op, true, PC_TC_WA> cur(op, rows, rv, rend);    /* ... S - 1 stages ahead (Note [stage rows]) */
    pc_cursor<Op, true, 0> bcur(op, rows, rbeg + rr, rend);   /* element-wise B, one stage ahead */
    pc_tc_e rb[KS][PC_TC_BJ];
    const pc_idx steps = (rend - rbeg) / PC_BK; /* whole steps: the vector modes need channel counts in 16s */
    const pc_idx stages = (steps + KS - 1) / KS;
#pragma unroll
    for (int k = 0; k < S - 1; ++k) {
        if (k < stages) {
            if (k) pc_tc_stage_on(op, cur, rows, rv);
            pc_tc_issue<VB>(op, cur, rv < rend, rows, cols, R.A[k], R.B[k], tid);
        }
        pc_cp_async_commit();
    }
    pc_idx qb = 0; /* steps bcur has been fetched for (the first stage: bcur starts at its first step) */
    if (!VB && stages > 0) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            const bool live = qb < steps;
            if (live && qb) bcur.next(op, rows);
            if (live)
                bcur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, rb[s], rb[s]);
            else
#pragma unroll
                for (int j = 0; j < PC_TC_BJ; ++j) rb[s][j] = pc_tc_e(0);
            pc_tc_stage_ring_b(R.B[0], rb[s], rr, lq, s);
            qb += live;
        }
    }
    for (pc_idx k = 0; k < stages; ++k) {
        const int buf = (int)(k % S);
        pc_cp_async_wait<S - 2>(); /* this thread's copies of stage k are done */
        PC_BARRIER();        /* ... everyone's; and stage k - 1's buffers are free */
        if (k + S - 1 < stages) {
            pc_tc_stage_on(op, cur, rows, rv);
            pc_tc_issue<VB>(op, cur, rv < rend, rows, cols, R.A[(k + S - 1) % S], R.B[(k + S - 1) % S], tid);
        }
        pc_cp_async_commit();
        const bool bnext = !VB && k + 1 < stages;
        if (bnext) {
#pragma unroll
            for (int s = 0; s < KS; ++s) pc_tc_fetch_ring_b(op, bcur, rows, cols, rb[s], qb, steps);
        }
        pc_tc_mma_ring(acc, R.A[buf], R.B[buf], wm, wn, g, t);
        if (bnext) {
#pragma unroll
            for (int s = 0; s < KS; ++s) pc_tc_stage_ring_b(R.B[(k + 1) % S], rb[s], rr, lq, s);
        }
    }
    pc_tc_epilogue(op, acc, m0 + wm, n0 + wn, g, t, M, NC);
}
#endif

/* Mode 0: generic steps; 1: tap-major steps, reduction lanes; 2: tap-major steps, M-lane A (NCHW); 3: tap-major
 * steps, vector A (Note [vector gathers]); 4: vector A and B. */
template <class Op, int Mode>
PC_DEVICE void pc_igemm_tc_run(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
#if PC_TC_ASYNC /* Note [stage rows]: a stage's window of channels inside one tap, else the register double buffer */
    if constexpr (Mode >= 3)
        if (op.fast_ch() % (PC_BK * PC_TC_RK) == 0) return pc_igemm_tc_async<Op, Mode == 4>(op, M, NC, rbeg, rend);
#endif
    auto &As = pc_tc_shared().A;
    auto &Bs = pc_tc_shared().B;
    const pc_tc_thread th;
    const int tid = th.tid, rr = th.rr, lq = th.lq, warp = th.warp, lane = th.lane, g = th.g, t = th.t;
    const int wm = th.wm, wn = th.wn;
    const pc_idx m0 = th.m0, n0 = th.n0;
    constexpr bool mlane = Mode == 2, vec = Mode >= 3, vb = Mode == 4;
    constexpr int AR = vec ? PC_TC_VA : mlane ? PC_TC_AI : PC_TC_AJ; /* A rows per thread */
    constexpr int BC = vb ? PC_TC_VBN : PC_TC_BJ;                      /* B columns per thread */
    const int lv = tid / PC_TC_VP;                                     /* vector row (column) of the thread */
    typename Op::Row rows[AR];
    typename Op::Col cols[BC];
#pragma unroll
    for (int j = 0; j < AR; ++j)
        rows[j] = op.row(vec ? m0 + lv + (PC_NT / PC_TC_VP) * j : mlane ? m0 + lane + 32 * j : m0 + lq + PC_LQ * j, M);
#pragma unroll
    for (int j = 0; j < BC; ++j) cols[j] = op.col(vb ? n0 + lv + (PC_NT / PC_TC_VP) * j : n0 + lq + PC_LQ * j, NC);
    pc_tc_e ra[vec ? 1 : PC_TC_AJ], rb[vb ? 1 : PC_TC_BJ];
    uint4 va[vec ? PC_TC_VA : 1], vv[vb ? PC_TC_VBN : 1];
    float acc[PC_TC_MT][PC_TC_NT][4];
    pc_tc_zero(acc);
    typedef typename pc_if<mlane, pc_mlane_cursor<Op>, pc_cursor<Op, Mode == 1, AR>>::type scalar_cursor;
    typename pc_if<vec, pc_vec_cursor<Op, vb>, scalar_cursor>::type cur(op, rows, rbeg + rr, rend, rr, warp);
    /* (no lambdas for the fetch / stage pairs below: NVRTC 13.0 rejects them here) */
    int buf = 0;
    if (rbeg < rend) {
        if constexpr (vec) {
            cur.fetch(op, rows, cols, va, vv, rb);
            pc_tc_stage_vec_step<vb>(As[0], Bs[0], va, vv, rb, tid);
        } else {
            cur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, ra, rb);
            pc_tc_stage_step<mlane>(As[0], Bs[0], ra, rb, tid);
        }
    }
    PC_BARRIER();
    for (pc_idx r0 = rbeg; r0 < rend; r0 += PC_BK) {
        const bool more = r0 + PC_BK < rend;
        if (more) {
            cur.next(op, rows);
            if constexpr (vec)
                cur.fetch(op, rows, cols, va, vv, rb);
            else
                cur.template fetch<pc_tc_e, PC_TC_BJ>(op, rows, cols, ra, rb);
        }
        pc_tc_mma<mlane && PC_TC_SW>(acc, As[buf] + wm, Bs[buf] + wn, g, t, wm);
        if (more) {
            if constexpr (vec)
                pc_tc_stage_vec_step<vb>(As[buf ^ 1], Bs[buf ^ 1], va, vv, rb, tid);
            else
                pc_tc_stage_step<mlane>(As[buf ^ 1], Bs[buf ^ 1], ra, rb, tid);
        }
        PC_BARRIER();
        buf ^= 1;
    }
    pc_tc_epilogue(op, acc, m0 + wm, n0 + wn, g, t, M, NC);
}

/* Note [TN tiles]: backward-weight's GEMM, dW[k][(c, tap)] = sum over positions p of dY[p][k] X[p + tap][c], has both
 * operands contiguous along M and N and strided along the reduction when dY and X are channels-last (dense NCHW ones
 * are staged so, Note [channels-last staging]): the "TN" GEMM of BLAS. The element-gathering tile reads them along
 * the reduction, two bytes from another line each (resnet50-l1-3x3-bf16-cl's weight gradient ran at 0.05x cuDNN).
 * This tile reads them as they lie: a step's 16 reduction rows of 16-byte vectors of VE channels (k of dY; c of X at
 * one tap: its columns run channel-innermost, op.tn), stored reduction-major in shared memory and read into the mma
 * fragments transposed, by ldmatrix.trans for the 16-bit types, by 32-bit loads for TF32 (rows padded so both are
 * conflict free). Load thread tid takes reduction row tid / 16 of every step, its position (n, o) stepped by 16
 * without division, and vectors tid % 16 + 16 i of the row (Note [TN copy order]). The 16-bit types copy with
 * cp.async into a ring of PC_TC_TS stages (Note [async stages]); TF32 goes through registers, rounded when stored.
 * The host sets PC_FLAG_VA (dY) and PC_FLAG_VB (X) only when K/G and C/G are multiples of VE and the tensors' strides
 * and addresses keep every vector aligned (simt/igemm.py, Igemm.bwd_weight and Igemm.vector_flags). */
/* Note [TN copy order]: a warp's load threads are 2 reduction rows x 16 vectors (row tid / 16, vector tid % 16), so a
 * warp's copy is 2 runs of up to 256 contiguous bytes (dY's k, X's c at one position) in 2-4 cache lines. The
 * transposed order (row tid % 16, vector tid / 16: 16 positions x 32 bytes, 16 lines a copy instruction) left the -cl
 * weight gradient of resnet50-l1-3x3-bf16 L1/TEX-bound (93%; docs/kernels/implicit-gemm.md). */
#define PC_TC_TVA (PC_TC_BM / PC_TC_VE)   /* vectors per reduction row */
#define PC_TC_TVB (PC_TC_BN / PC_TC_VE)
#define PC_TC_TAV ((PC_TC_TVA + 15) / 16) /* ... per load thread */
#define PC_TC_TBV ((PC_TC_TVB + 15) / 16)
#if PC_TC_NT % 2 != 0
#error "portconv: the TN tile loads B fragments two n8 blocks at a time"
#endif

struct pc_tn_pos { /* a load thread's reduction index r and position (n, o0, o1, o2) */
    pc_idx r, n, o0, o1, o2;
    template <class Op>
    PC_DEVICE pc_tn_pos(const Op &op, pc_idx r0) : r(r0) {
        pc_unflatten4(r0, op.Y0, op.Y1, op.Y2, n, o0, o1, o2);
    }
    template <class Op>
    PC_DEVICE void next(const Op &op) {
        r += PC_BK, o2 += PC_BK;
        while (o2 >= op.Y2) {
            o2 -= op.Y2;
            if (++o1 == op.Y1) {
                o1 = 0;
                if (++o0 == op.Y0) o0 = 0, ++n;
            }
        }
    }
};

/* One k-step of a warp's tile from reduction-major shared rows A and B. */
PC_DEVICE void pc_tc_mma_tn(float (&acc)[PC_TC_MT][PC_TC_NT][4], const unsigned (*A)[PC_TC_TPA],
                            const unsigned (*B)[PC_TC_TPB], int wm, int wn, int g, int t) {
#if PC_DTYPE == 0
#pragma unroll
    for (int kk = 0; kk < PC_BK; kk += 8) { /* fragment (row, k): A[k][m] */
        unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
#pragma unroll
        for (int i = 0; i < PC_TC_MT; ++i) {
            const int m = wm + 16 * i + g;
            a[i][0] = A[kk + t][m], a[i][1] = A[kk + t][m + 8], a[i][2] = A[kk + t + 4][m], a[i][3] = A[kk + t + 4][m + 8];
        }
#pragma unroll
        for (int j = 0; j < PC_TC_NT; ++j) b[j][0] = B[kk + t][wn + 8 * j + g], b[j][1] = B[kk + t + 4][wn + 8 * j + g];
        pc_tc_mma_frags(acc, a, b);
    }
#else
    /* lane l gives row l % 8 of 8 x 8 block l / 8: A's blocks (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), ...;
     * B's (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15); in words: element column / 2 */
    unsigned a[PC_TC_MT][4], b[PC_TC_NT][2];
    const int l = 4 * g + t, q = l >> 3, r = l & 7;
#pragma unroll
    for (int i = 0; i < PC_TC_MT; ++i) pc_ldsm4<true>(a[i], &A[8 * (q >> 1) + r][(wm + 16 * i + 8 * (q & 1)) / 2]);
#pragma unroll
    for (int j = 0; j < PC_TC_NT; j += 2) {
        unsigned v[4];
        pc_ldsm4<true>(v, &B[8 * (q & 1) + r][(wn + 8 * j + 8 * (q >> 1)) / 2]);
        b[j][0] = v[0], b[j][1] = v[1], b[j + 1][0] = v[2], b[j + 1][1] = v[3];
    }
    pc_tc_mma_frags(acc, a, b);
#endif
}

/* A thread's vector i of A (dY) and j of B (X) at a Red: its address, or null outside the tensor (zeros). */
template <class Op>
PC_DEVICE const pc_t *pc_tn_a(const Op &op, const typename Op::Row &m, const typename Op::Red &d) {
    return op.A_in(m, d) ? op.dy + op.A_off(m, d) : nullptr;
}
template <class Op>
PC_DEVICE const pc_t *pc_tn_b(const Op &op, const typename Op::Red &d, const typename Op::Col &n) {
    return op.B_in(d, n) ? op.x + op.B_off(d, n) : nullptr;
}
#define PC_TN_A_MINE(i) (lq + 16 * (i) < PC_TC_TVA) /* vector i of the thread exists */
#define PC_TN_B_MINE(j) (lq + 16 * (j) < PC_TC_TVB)

/* The thread's vectors of one step into stage A, B with cp.async (Note [async stages]). */
template <class Op>
PC_DEVICE void pc_tn_issue(const Op &op, const typename Op::Red &d, const typename Op::Row *rows,
                           const typename Op::Col *cols, unsigned (*A)[PC_TC_TPA], unsigned (*B)[PC_TC_TPB], int rr,
                           int lq) {
#pragma unroll
    for (int i = 0; i < PC_TC_TAV; ++i)
        if (PC_TN_A_MINE(i)) {
            const pc_t *s = pc_tn_a(op, rows[i], d);
            pc_cp_async<16>(&A[rr][4 * (lq + 16 * i)], s ? s : op.dy, s != nullptr);
        }
#pragma unroll
    for (int j = 0; j < PC_TC_TBV; ++j)
        if (PC_TN_B_MINE(j)) {
            const pc_t *s = pc_tn_b(op, d, cols[j]);
            pc_cp_async<16>(&B[rr][4 * (lq + 16 * j)], s ? s : op.x, s != nullptr);
        }
}

/* The thread's vectors of one step into registers va, vb. */
template <class Op>
PC_DEVICE void pc_tn_fetch(const Op &op, const typename Op::Red &d, const typename Op::Row *rows,
                           const typename Op::Col *cols, uint4 *va, uint4 *vb, int lq) {
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < PC_TC_TAV; ++i) {
        const pc_t *s = PC_TN_A_MINE(i) ? pc_tn_a(op, rows[i], d) : nullptr;
        va[i] = s ? pc_ld16(s, 0) : z;
    }
#pragma unroll
    for (int j = 0; j < PC_TC_TBV; ++j) {
        const pc_t *s = PC_TN_B_MINE(j) ? pc_tn_b(op, d, cols[j]) : nullptr;
        vb[j] = s ? pc_ld16(s, 0) : z;
    }
}

/* ... and from registers into stage A, B (TF32: rounded). */
PC_DEVICE void pc_tn_stage(unsigned (*A)[PC_TC_TPA], unsigned (*B)[PC_TC_TPB], const uint4 *va, const uint4 *vb, int rr,
                           int lq) {
#pragma unroll
    for (int i = 0; i < PC_TC_TAV; ++i)
        if (PC_TN_A_MINE(i)) pc_tc_stage_vec(&A[rr][4 * (lq + 16 * i)], va[i]);
#pragma unroll
    for (int j = 0; j < PC_TC_TBV; ++j)
        if (PC_TN_B_MINE(j)) pc_tc_stage_vec(&B[rr][4 * (lq + 16 * j)], vb[j]);
}

/* Note [TN tiles]: the backward-weight op's GEMM over reduction [rbeg, rend). */
template <class Op>
PC_DEVICE void pc_igemm_tc_tn(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
    auto &sm = pc_tc_shared_any().tn;
    const pc_tc_thread th;
    const int rr = th.tid / 16, lq = th.tid % 16; /* Note [TN copy order] */
    const int g = th.g, t = th.t, wm = th.wm, wn = th.wn;
    typename Op::Row rows[PC_TC_TAV];
    typename Op::Col cols[PC_TC_TBV];
#pragma unroll
    for (int i = 0; i < PC_TC_TAV; ++i) rows[i] = op.row(th.m0 + PC_TC_VE * (lq + 16 * i), M);
#pragma unroll
    for (int j = 0; j < PC_TC_TBV; ++j) cols[j] = op.col(th.n0 + PC_TC_VE * (lq + 16 * j), NC);
    float acc[PC_TC_MT][PC_TC_NT][4];
    pc_tc_zero(acc);
    pc_tn_pos p(op, rbeg + rr);
    const pc_idx steps = (rend - rbeg + PC_BK - 1) / PC_BK;
#if PC_DTYPE != 0 /* Note [async stages]: steps k + 1 .. k + S - 1 in flight while step k multiplies */
    constexpr int S = PC_TC_TS;
    for (int k = 0; k < S - 1; ++k) {
        if (k < steps) {
            if (k) p.next(op);
            pc_tn_issue(op, op.red_at(p.n, p.o0, p.o1, p.o2, p.r < rend), rows, cols, sm.A[k], sm.B[k], rr, lq);
        }
        pc_cp_async_commit();
    }
    for (pc_idx k = 0; k < steps; ++k) {
        pc_cp_async_wait<S - 2>(); /* this thread's copies of step k are done */
        PC_BARRIER();        /* ... everyone's; and step k - 1's buffers are free */
        if (k + S - 1 < steps) {
            const int s = (int)((k + S - 1) % S);
            p.next(op);
            pc_tn_issue(op, op.red_at(p.n, p.o0, p.o1, p.o2, p.r < rend), rows, cols, sm.A[s], sm.B[s], rr, lq);
        }
        pc_cp_async_commit();
        pc_tc_mma_tn(acc, sm.A[k % S], sm.B[k % S], wm, wn, g, t);
    }
#else /* the register double buffer: step k + 1's loads in flight while step k multiplies */
    uint4 va[PC_TC_TAV], vb[PC_TC_TBV];
    if (steps > 0) {
        pc_tn_fetch(op, op.red_at(p.n, p.o0, p.o1, p.o2, p.r < rend), rows, cols, va, vb, lq);
        pc_tn_stage(sm.A[0], sm.B[0], va, vb, rr, lq);
    }
    PC_BARRIER();
    for (pc_idx k = 0; k < steps; ++k) {
        const bool more = k + 1 < steps;
        if (more) {
            p.next(op);
            pc_tn_fetch(op, op.red_at(p.n, p.o0, p.o1, p.o2, p.r < rend), rows, cols, va, vb, lq);
        }
        pc_tc_mma_tn(acc, sm.A[k % 2], sm.B[k % 2], wm, wn, g, t);
        if (more) pc_tn_stage(sm.A[(k + 1) % 2], sm.B[(k + 1) % 2], va, vb, rr, lq);
        PC_BARRIER();
    }
#endif
    pc_tc_epilogue(op, acc, th.m0 + wm, th.n0 + wn, g, t, M, NC);
}
