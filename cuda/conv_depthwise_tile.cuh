/* portconv kernel bodies: depthwise "tile" kernels, a TH x VW output tile of VC channels per thread,
 * vectorised over channels in channels-last layouts.
 *
 * Note [depthwise tile]: for 3 x 3 in-plane filters (axes 1 and 2 of the view: 3 taps, dilation 1, the same
 * stride S = 1 or 2 on both, channel multiplier 1) one thread owns TH output rows (axis 1) by VW outputs (axis 2)
 * of VC channels. Its source rows ((VW - 1) * S + 3 values each) are loaded once per tile instead of three times
 * per output row (the 'rows' kernels of conv_depthwise_rows.cuh): all TH + 2 up front (2-D NCHW float32 /
 * float64, stride 1) or through a rolling 3-row register window (the rest; tile shapes below). Axis 0 (depth
 * of 3-D problems) is a runtime tap loop with any stride, padding and dilation.
 *
 * Channels-last (PC_FLAG_CL) orders the work channel innermost: consecutive threads take consecutive groups of
 * PC_DWT_VC channels (4 of the 16-bit types or 2 float32 in one 64-bit access, 1 float64) through pc_ld_vec /
 * pc_st_vec of the prelude, where the channel stride is 1, C and every other stride are multiples of VC and the
 * base addresses are aligned; otherwise (and for NCHW, where the work is ordered spatial innermost) the same body
 * runs with one channel per thread and scalar accesses. The decision is made in the kernel from its argument
 * block, so it is uniform over the launch and needs nothing from the host.
 *
 * Backward-data with stride 1 is the same correlation over dY with the flipped filter (padding 2 - P).
 * The weight gradient (channels-last only) gives each block a tile of 8 or 16 channel groups (threads over
 * channels) and 32 or 16 position groups that reduce one split of the (n, depth, row tile, strip) units into R0 x 9
 * per-channel partials in registers (a unit is 8 rows x 2 columns walked with a rolling window for VC = 4, else
 * 2 x 4 loaded up front); the position groups are summed in shared memory in a fixed order, spread over the
 * block, and splits go through portconv_split_finalize: deterministic, no atomics.
 */
#pragma once

/* Tile shapes: output rows (TH) x columns (VW) per thread of the fwd / bwd-data kernels, per family; [key] is
 * the DW_TILE entry of portconv/backends/simt/depthwise.py that mirrors them (evidence: docs/kernels/depthwise.md). */
#ifndef PC_DWT_THN
#define PC_DWT_THN 8 /* [nchw] 2-D NCHW ('tilen'), float32 / float64 */
#endif
#ifndef PC_DWT_VWN
#define PC_DWT_VWN 2
#endif
#ifndef PC_DWT_THN16
#define PC_DWT_THN16 8 /* [nchw16] 2-D NCHW in 16-bit types: 4 columns in 32-bit pairs (Note [packed rows]) */
#endif
#ifndef PC_DWT_VWN16
#define PC_DWT_VWN16 4
#endif
#ifndef PC_DWT_TH3
#define PC_DWT_TH3 8 /* [nchw3d] 3-D NCHW ('tilen3d') */
#endif
#ifndef PC_DWT_VW3
#define PC_DWT_VW3 2 /* 2 since Note [depth taps inner] (4 there: 40 bytes spilled, no room for its row lookahead) */
#endif
#ifndef PC_DWT_THC
#define PC_DWT_THC 14 /* [cl] 2-D channels-last ('tile'), rolling window; 14 divides 56 and 112 */
#endif
#ifndef PC_DWT_THC3
#define PC_DWT_THC3 4 /* [cl3d] 3-D channels-last ('tile3d') */
#endif
#ifndef PC_DWT_VWC
#define PC_DWT_VWC 2 /* columns of both channels-last families */
#endif
#ifndef PC_DWT_3MINB
/* blocks an SM the 3-D NCHW stride-1 kernels ask ptxas for: 2 (at most 128 registers) but for float64 and 64-bit
 * indices, which would spill 1-1.5 KB at that cap */
#define PC_DWT_3MINB (PC_DTYPE == 1 || PC_INDEX64 ? 1 : 2)
#endif
#ifndef PC_DWT_DZ
#define PC_DWT_DZ 2 /* output planes (axis 0) a thread of that path: 2 share 2 of their 4 source planes */
#endif
/* Weight gradient (channels-last): rows x columns per unit and whether its X rows roll, per channels per thread:
 * 4 channels (16-bit types): 8 x 2 rolling; fewer: 2 x 4 with every row loaded up front. */
#ifndef PC_DWT_THW4
#define PC_DWT_THW4 8
#endif
#ifndef PC_DWT_VWW4
#define PC_DWT_VWW4 2
#endif
#ifndef PC_DWT_RING
#define PC_DWT_RING PC_ASYNC_COPY /* Note [async row ring] in the 16-bit channels-last weight gradient (0: off) */
#endif
#ifndef PC_DWT_RD
#define PC_DWT_RD 4 /* its slots: RD - 1 steps in flight (2 .. 4; 4 fills 48 KB, stride 2 gets 3) */
#endif
/* Shared memory of a weight-gradient block: the reduction's RT x THREADS partials, or the ring if larger. */
#define PC_DWT_POOL_RED (18 * PC_DWT_THREADS * (int)sizeof(pc_acc_t))
#define PC_DWT_SLOT2 ((3 * PC_DWT_VWW4 + 1) * PC_DWT_THREADS * 8) /* a ring slot of all threads at stride 2 */
#define PC_DWT_POOL_RING (PC_DWT_RING ? (PC_DWT_RD * PC_DWT_SLOT2 < 49152 ? PC_DWT_RD * PC_DWT_SLOT2 : 49152) : 0)
#define PC_DWT_POOL (PC_DWT_POOL_RED > PC_DWT_POOL_RING ? PC_DWT_POOL_RED : PC_DWT_POOL_RING)
#ifndef PC_DWT_FRING
#define PC_DWT_FRING PC_ASYNC_COPY /* the ring in the 2-D channels-last forward / backward-data (0: off) */
#endif
#ifndef PC_DWT_FRD
#define PC_DWT_FRD 4 /* its slots (2 .. 4), also those of the NCHW rings */
#endif
#ifndef PC_DWT_NRING
#define PC_DWT_NRING PC_ASYNC_COPY /* the ring in the 2-D NCHW 16-bit stride-1 forward / backward-data (0: off) */
#endif
#define PC_DWT_THW(VC) ((VC) >= 4 ? PC_DWT_THW4 : 2)
#define PC_DWT_VWW(VC) ((VC) >= 4 ? PC_DWT_VWW4 : 4)
#define PC_DWT_THREADS 256 /* block size of the weight gradient (simt/view.py THREADS) */
/* Note [two weight blocks]: resident blocks per SM the 2-D weight-gradient kernels ask ptxas for (16-bit types:
 * 2, i.e. at most 128 registers; NVRTC gave them 130 uncapped, one block and 8 warps an SM). */
#ifndef PC_DWT_WMINB
#define PC_DWT_WMINB (PC_DTYPE >= 2 ? 2 : 1)
#endif

/* An aligned group of N elements: one vector access through the prelude's pc_ld_vec / pc_st_vec. */
template <typename T, int N>
struct alignas(sizeof(T) * N) pc_vec {
    T v[N];
};

/* Channels per thread on the vector path: 64-bit accesses of four 16-bit values or two float32; float64 scalar. */
#ifndef PC_DWT_VC
#define PC_DWT_VC (sizeof(pc_t) == 8 ? 1 : sizeof(pc_t) == 4 ? 2 : 4)
#endif

/* The vector path applies: unit channel stride, every other stride and C multiples of VC, aligned bases. */
template <int VC>
PC_DEVICE bool pc_dwt_vec_ok(const pc_conv_args &a) {
    if (VC <= 1 || a.K != a.C || a.C % VC != 0 || a.xs[1] != 1 || a.ys[1] != 1) return false;
    if (a.xs[0] % VC || a.xs[2] % VC || a.xs[3] % VC || a.xs[4] % VC) return false;
    if (a.ys[0] % VC || a.ys[2] % VC || a.ys[3] % VC || a.ys[4] % VC) return false;
    const long long align = (long long)(VC * sizeof(pc_t));
    return a.x % align == 0 && a.y % align == 0;
}

/* Note [rows by plan]: how a 2-D NCHW kernel in a 16-bit type reads its rows is the plan's choice, PC_DWT_N16 from
 * the launch's view and operand layouts (simt/depthwise.py n16_rows, which states each path's conditions): 4 quad
 * rows (Note [quad rows], stride 1), 1 or 2 packed pairs with an even or odd P2 (Note [packed rows]), 0 one element
 * an access (any layout). A module compiles that one path: with all of them behind run-time tests, NVRTC took 4-7x
 * as long over the bfloat16 tilen kernels (0.88 s against 0.12 s for the quad forward on a Xeon). */
#ifndef PC_DWT_N16
#define PC_DWT_N16 0
#endif
/* The launch bounds of the stride-1 2-D NCHW tile kernels: 3 resident blocks an SM asked of ptxas for the quad
 * rows, which compiled alone took 88 registers (2 blocks of 256 threads an SM) where the module of every path took
 * 80 (3 blocks); H100, mbv2-dw3x3-bf16 forward 0.0356 ms at 88 against 0.0297 at 80. Other paths keep the plain
 * bound (an explicit minimum of 1 block changes ptxas's register choice). */
#if PC_DWT_N16 == 4
#define PC_DWT_NBOUNDS PC_LAUNCH_BOUNDS_MIN(256, 3)
#else
#define PC_DWT_NBOUNDS PC_LAUNCH_BOUNDS(256)
#endif

/* Note [packed rows]: 2-D NCHW in a 16-bit type loads and stores its rows as aligned 32-bit pairs (two elements
 * per access) instead of one element per access: the last axis is unit-stride on both sides, every other stride
 * of X, Y and dY is even and the bases are 4-byte aligned, so the pair (2k, 2k + 1) of any row is one aligned
 * access. A window row starts at b2 = d2s * S - P2 (d2s a multiple of the even VW), so its parity is P2's: uniform
 * over the launch and a template argument (PK = 1 even, 2 odd). Pairs that cross the row's ends load element-wise.
 * (H100, mbv2-dw3x3-bf16 forward: 1.15x over one element an access; docs/kernels/depthwise.md.) */
/* Note [row lookahead]: the rolling window loads the source rows of tile row t just before its FMAs use them, so
 * each row's loads wait out a full memory latency (ncu on the bf16 NCHW forward: half the stall cycles were L1TEX
 * scoreboard waits at 40% occupancy). Here the S new rows of tile row t + 1 are loaded into S extra window rows
 * before row t's FMAs, so their latency overlaps row t's arithmetic; the roll then shifts by S over 3 rows.
 * S * WIN * VC more registers than the plain window, far fewer than loading all TH + 2 rows up front (PF).
 * (H100, bf16 channels-last forward: 1.07x; docs/kernels/depthwise.md.) */

/* One window row through pairs (Note [packed rows]): r[t] = src[base + b2 + t], zero outside [0, E2) or where !ok;
 * base is even and b2 & 1 == PK - 1. */
template <int WIN, int PK>
PC_DEVICE void pc_dwt_row_pk(pc_acc_t (&r)[WIN][1], const pc_t *PC_RESTRICT src, pc_idx base, bool ok, pc_idx b2,
                             pc_idx E2) {
    constexpr int OFF = PK - 1, NP = (WIN + OFF + 1) / 2;
    const pc_idx a0 = b2 - OFF;
    pc_acc_t tmp[2 * NP];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const pc_idx i = a0 + 2 * k;
        if (ok && i >= 0 && i + 1 < E2) {
            const pc_vec<pc_t, 2> v = pc_ld_vec((const pc_vec<pc_t, 2> *)(src + base + i));
            tmp[2 * k] = (pc_acc_t)pc_ld(v.v, 0);
            tmp[2 * k + 1] = (pc_acc_t)pc_ld(v.v, 1);
        } else {
            tmp[2 * k] = ok && i >= 0 && i < E2 ? (pc_acc_t)pc_ld(src, base + i) : (pc_acc_t)0;
            tmp[2 * k + 1] = ok && i + 1 >= 0 && i + 1 < E2 ? (pc_acc_t)pc_ld(src, base + i + 1) : (pc_acc_t)0;
        }
    }
#pragma unroll
    for (int t = 0; t < WIN; ++t) r[t][0] = tmp[t + OFF];
}

/* One window row: r[t][j] = src[base + (b2 + t) * s4 + j] (zero outside [0, E2) or where !ok); PK: Note
 * [packed rows]. */
template <int VC, int WIN, int PK = 0>
PC_DEVICE void pc_dwt_row(pc_acc_t (&r)[WIN][VC], const pc_t *PC_RESTRICT src, pc_idx base, bool ok, pc_idx b2,
                          pc_idx E2, pc_idx s4) {
    if constexpr (PK != 0) { /* Note [packed rows]: s4 == 1, VC == 1 */
        pc_dwt_row_pk<WIN, PK>(r, src, base, ok, b2, E2);
    } else {
#pragma unroll
        for (int t = 0; t < WIN; ++t) {
            const pc_idx i2 = b2 + t;
            if (ok && i2 >= 0 && i2 < E2) {
                if (VC > 1) {
                    const pc_vec<pc_t, VC> v = pc_ld_vec((const pc_vec<pc_t, VC> *)(src + base + i2 * s4));
#pragma unroll
                    for (int j = 0; j < VC; ++j) r[t][j] = (pc_acc_t)pc_ld(v.v, j);
                } else {
                    r[t][0] = (pc_acc_t)pc_ld(src, base + i2 * s4);
                }
            } else {
#pragma unroll
                for (int j = 0; j < VC; ++j) r[t][j] = 0;
            }
        }
    }
}

/* Rolling window, before tile row t: row[3 - S .. 2] <- source rows b1 + S * t + (3 - S .. 2) (the first 3 - S
 * rows are loaded before the walk, with t = 0 and q from 0). LA (Note [row lookahead]): into row[3 .. 2 + S]. */
template <int S, int PK = 0, bool LA = false, int VC, int NR, int WIN>
PC_DEVICE void pc_dwt_roll_in(pc_acc_t (&row)[NR][WIN][VC], int q0, const pc_t *PC_RESTRICT src, pc_idx rb,
                              pc_idx b1, int t, pc_idx E1, pc_idx ss3, pc_idx b2, pc_idx E2, pc_idx ss4) {
#pragma unroll
    for (int q = 0; q < 3; ++q) {
        if (q < q0) continue;
        const pc_idx i1 = b1 + S * t + q;
        pc_dwt_row<VC, WIN, PK>(row[LA ? q + S : q], src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2, ss4);
    }
}

/* Rolling window, after a tile row: row[0 .. 2 - S] <- row[S .. 2]; LA: row[0 .. 2] <- row[S .. 2 + S]. */
template <int S, bool LA = false, int VC, int NR, int WIN>
PC_DEVICE void pc_dwt_roll_on(pc_acc_t (&row)[NR][WIN][VC]) {
#pragma unroll
    for (int q = 0; q < (LA ? 3 : 3 - S); ++q)
#pragma unroll
        for (int u = 0; u < WIN; ++u)
#pragma unroll
            for (int j = 0; j < VC; ++j) row[q][u][j] = row[q + S][u][j];
}

/* The 3 x 3 in-plane taps of axis-0 tap offset w0 (r0 * ws2) for channels c .. c + VC - 1, flipped for backward-data;
 * OK false: zeros (a 3-D walk's taps past R0). */
template <bool BWD, int VC>
PC_DEVICE void pc_dwt_taps(pc_acc_t (&wv)[3][3][VC], const pc_t *PC_RESTRICT w, pc_idx c, pc_idx w0, pc_idx ws0,
                           pc_idx ws3, pc_idx ws4, bool ok = true) {
#pragma unroll
    for (int r1 = 0; r1 < 3; ++r1)
#pragma unroll
        for (int r2 = 0; r2 < 3; ++r2)
#pragma unroll
            for (int j = 0; j < VC; ++j)
                wv[r1][r2][j] = ok ? (pc_acc_t)pc_ld(w, (c + j) * ws0 + w0 + (BWD ? 2 - r1 : r1) * ws3 +
                                                            (BWD ? 2 - r2 : r2) * ws4)
                                   : (pc_acc_t)0;
}

/* Forward taps of the window rows rr .. rr + 2 into one output row: acc[v] += x[rr + r1][v S + r2] * w[r1][r2]. */
template <int S, int VC, int VW, int NR, int WIN>
PC_DEVICE void pc_dwt_fma(pc_acc_t (&acc)[VW][VC], const pc_acc_t (&row)[NR][WIN][VC], int rr,
                          const pc_acc_t (&wv)[3][3][VC]) {
#pragma unroll
    for (int r1 = 0; r1 < 3; ++r1)
#pragma unroll
        for (int r2 = 0; r2 < 3; ++r2)
#pragma unroll
            for (int v = 0; v < VW; ++v)
#pragma unroll
                for (int j = 0; j < VC; ++j) acc[v][j] += row[rr + r1][v * S + r2][j] * wv[r1][r2][j];
}

/* Weight-gradient taps of one dY row g against the window rows rr .. rr + 2: acc[(r0, r1, r2)] += g * x. */
template <int S, int VC, int VW, int NR, int WIN, int TAPS>
PC_DEVICE void pc_dwt_wacc(pc_acc_t (&acc)[TAPS][VC], int r0, const pc_acc_t (&g)[VW][VC],
                           const pc_acc_t (&row)[NR][WIN][VC], int rr) {
#pragma unroll
    for (int r1 = 0; r1 < 3; ++r1)
#pragma unroll
        for (int r2 = 0; r2 < 3; ++r2)
#pragma unroll
            for (int v = 0; v < VW; ++v)
#pragma unroll
                for (int j = 0; j < VC; ++j) acc[(r0 * 3 + r1) * 3 + r2][j] += g[v][j] * row[rr + r1][v * S + r2][j];
}

/* Store one output row of a tile (VW positions of VC channels, bias added; positions past D2 skipped). PK: in
 * aligned pairs along the row (Note [packed rows]: VC == 1, ds4 == 1, o even). */
template <int VC, int VW, int PK = 0>
PC_DEVICE void pc_dwt_store(pc_t *PC_RESTRICT dst, pc_idx o, pc_idx ds4, pc_idx left, const pc_acc_t (&acc)[VW][VC],
                            const pc_acc_t (&bias)[VC]) {
    if constexpr (PK != 0) {
#pragma unroll
        for (int v = 0; v < VW; v += 2) {
            if (v + 1 < left) {
                pc_vec<pc_t, 2> out;
                pc_st(out.v, 0, acc[v][0] + bias[0]);
                pc_st(out.v, 1, acc[v + 1][0] + bias[0]);
                pc_st_vec((pc_vec<pc_t, 2> *)(dst + o + v), out);
            } else if (v < left) {
                pc_st(dst, o + v, acc[v][0] + bias[0]);
            }
        }
    } else {
#pragma unroll
        for (int v = 0; v < VW; ++v) {
            if (v >= left) break;
            if (VC > 1) {
                pc_vec<pc_t, VC> out;
#pragma unroll
                for (int j = 0; j < VC; ++j) pc_st(out.v, j, acc[v][j] + bias[j]);
                pc_st_vec((pc_vec<pc_t, VC> *)(dst + o + v * ds4), out);
            } else {
                pc_st(dst, o + v * ds4, acc[v][0] + bias[0]);
            }
        }
    }
}

/* Note [async row ring], the two halves every ring walk shares. Copy: one source row's WIN vectors into slot sl,
 * sl[u * THREADS] <- src[base + (b2 + u) * s4], zeros where !rok or the column is outside [0, E2). */
template <int WIN, typename V>
PC_DEVICE void pc_dwt_ring_copy(V *sl, const pc_t *src, pc_idx base, bool rok, pc_idx b2, pc_idx E2, pc_idx s4) {
#pragma unroll
    for (int u = 0; u < WIN; ++u) {
        const pc_idx i2 = b2 + u;
        const bool ok = rok && i2 >= 0 && i2 < E2;
        pc_cp_async<sizeof(V)>(sl + u * PC_DWT_THREADS, ok ? src + base + i2 * s4 : src, ok);
    }
}

/* Roll: the 3-row window moves down one row, row 2 <- the WIN vectors of slot sl. */
template <int VC, int WIN>
PC_DEVICE void pc_dwt_ring_roll(pc_acc_t (&row)[3][WIN][VC], const pc_vec<pc_t, VC> *sl) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int w = 0; w < WIN; ++w)
#pragma unroll
            for (int j = 0; j < VC; ++j) row[r][w][j] = row[r + 1][w][j];
#pragma unroll
    for (int w = 0; w < WIN; ++w) {
        const pc_vec<pc_t, VC> v = sl[w * PC_DWT_THREADS];
#pragma unroll
        for (int j = 0; j < VC; ++j) row[2][w][j] = (pc_acc_t)pc_ld(v.v, j);
    }
}

/* The same two halves for packed rows (Note [packed rows]): NP aligned pairs from a0 = b2 - (PK - 1). A pair is
 * wholly inside or wholly outside the row except the last of a row of odd length, which is loaded here
 * synchronously (its second element zero; cp.async moves 4 bytes at least). At stride 1, the only stride with the
 * ring, an odd row length needs even strides on both sides, which portconv's dense outputs never have: the branch
 * keeps the copy correct for any caller, and no test reaches it. */
template <int WIN, int PK>
PC_DEVICE void pc_dwt_ring_copy_pk(pc_vec<pc_t, 2> *sl, const pc_t *src, pc_idx base, bool rok, pc_idx b2,
                                   pc_idx E2) {
    constexpr int OFF = PK - 1, NP = (WIN + PK) / 2;
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const pc_idx i = b2 - OFF + 2 * k;
        if (rok && i == E2 - 1) {
            pc_vec<pc_t, 2> v;
            pc_st(v.v, 0, (pc_acc_t)pc_ld(src, base + i));
            pc_st(v.v, 1, (pc_acc_t)0);
            sl[k * PC_DWT_THREADS] = v;
        } else {
            const bool ok = rok && i >= 0 && i + 1 < E2;
            pc_cp_async<4>(sl + k * PC_DWT_THREADS, ok ? src + base + i : src, ok);
        }
    }
}

template <int WIN, int PK>
PC_DEVICE void pc_dwt_ring_roll_pk(pc_acc_t (&row)[3][WIN][1], const pc_vec<pc_t, 2> *sl) {
    constexpr int OFF = PK - 1, NP = (WIN + PK) / 2;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int w = 0; w < WIN; ++w) row[r][w][0] = row[r + 1][w][0];
    pc_acc_t tmp[2 * NP];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const pc_vec<pc_t, 2> v = sl[k * PC_DWT_THREADS];
        tmp[2 * k] = (pc_acc_t)pc_ld(v.v, 0);
        tmp[2 * k + 1] = (pc_acc_t)pc_ld(v.v, 1);
    }
#pragma unroll
    for (int w = 0; w < WIN; ++w) row[2][w][0] = tmp[w + OFF];
}

/* Shared-memory bytes of the forward / backward-data ring of a block (0: no ring), the one pool of a kernel. */
template <int S, int VC, int VW, int PK>
PC_DEVICE constexpr int pc_dwt_ring_bytes(bool on) {
    constexpr int WIN = (VW - 1) * S + 3;
    return on ? PC_DWT_FRD * (PK ? (WIN + PK) / 2 * 2 : WIN * VC) * PC_DWT_THREADS * (int)sizeof(pc_t) : 0;
}

/* Note [async row ring] in the 2-D forward / stride-1 backward-data: the tile's NR source rows stream through RD
 * slots, RD - 1 rows ahead of the row being multiplied, in place of the register lookahead; each output row is
 * stored when its three source rows are in. Slots hold WIN vectors of VC channels (channels-last, PC_DWT_FRING) or
 * (WIN + PK) / 2 aligned pairs of a 16-bit NCHW row (Note [packed rows], PC_DWT_NRING). Float32 rows and 3-D
 * tiles were slower with it (docs/kernels/depthwise.md). */
template <int S, int VC, int VW, int TH, int RD, int PK>
PC_DEVICE void pc_dwt_conv_ring(const pc_t *PC_RESTRICT src, pc_idx rb, pc_idx b1, pc_idx b2, pc_idx E1, pc_idx E2,
                                pc_idx ss3, pc_idx ss4, const pc_acc_t (&wv)[3][3][VC], const pc_acc_t (&bias)[VC],
                                pc_t *PC_RESTRICT dst, pc_idx o, pc_idx rows, pc_idx left, pc_idx ds3, pc_idx ds4,
                                void *pool) {
    typedef pc_vec<pc_t, PK ? 2 : VC> V;
    constexpr int WIN = (VW - 1) * S + 3, NR = (TH - 1) * S + 3, L = PC_DWT_THREADS, NV = PK ? (WIN + PK) / 2 : WIN;
    static_assert(RD >= 2, "the ring needs two slots");
    V *mine = (V *)pool + threadIdx.x;
    auto issue = [&](int q) {
        if (q < NR) {
            V *sl = mine + (q % RD) * NV * L;
            const pc_idx i1 = b1 + q;
            if constexpr (PK != 0)
                pc_dwt_ring_copy_pk<WIN, PK>(sl, src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2);
            else
                pc_dwt_ring_copy<WIN>(sl, src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2, ss4);
        }
        pc_cp_async_commit();
    };
#pragma unroll
    for (int q = 0; q < RD - 1; ++q) issue(q);
    pc_acc_t row[3][WIN][VC];
#pragma unroll
    for (int q = 0; q < NR; ++q) {
        pc_cp_async_wait<RD - 2>(); /* source row q has landed */
        const V *sl = mine + (q % RD) * NV * L;
        if constexpr (PK != 0)
            pc_dwt_ring_roll_pk<WIN, PK>(row, sl);
        else
            pc_dwt_ring_roll<VC, WIN>(row, sl);
        issue(q + RD - 1); /* into the slot read one row ago */
        if (q >= 2 && (q - 2) % S == 0) {
            const int t = (q - 2) / S;
            pc_acc_t a[VW][VC];
#pragma unroll
            for (int v = 0; v < VW; ++v)
#pragma unroll
                for (int j = 0; j < VC; ++j) a[v][j] = 0;
            pc_dwt_fma<S>(a, row, 0, wv);
            if (t < rows) pc_dwt_store<VC, VW, PK>(dst, o + t * ds3, ds4, left, a, bias);
        }
    }
    pc_cp_async_wait<0>();
}

/* The locals every forward / backward-data walk (pc_dwt_conv, pc_dwt_conv3i) binds: the source (X, or dY for
 * backward-data: src, E*, ss*) and the destination (Y or dX: dst, D*, ds*), the weights and the bias. A macro, not a
 * helper returning a struct: the struct changed the machine code of the 16-bit NCHW kernels (nvcc sm_90), and these
 * are the kernels the H100 measured. */
#define PC_DWT_WALK_LOCALS(BWD)                                                                                       \
    const pc_t *PC_RESTRICT src = (const pc_t *)(BWD ? a.y : a.x);                                                    \
    pc_t *PC_RESTRICT dst = (pc_t *)(BWD ? a.x : a.y);                                                                \
    const pc_t *PC_RESTRICT w = (const pc_t *)a.w;                                                                    \
    const pc_t *PC_RESTRICT b = (const pc_t *)a.b;                                                                    \
    const pc_idx E0 = (pc_idx)(BWD ? a.Y[0] : a.X[0]), E1 = (pc_idx)(BWD ? a.Y[1] : a.X[1]);                          \
    const pc_idx E2 = (pc_idx)(BWD ? a.Y[2] : a.X[2]);                                                                \
    const pc_idx D0 = (pc_idx)(BWD ? a.X[0] : a.Y[0]), D1 = (pc_idx)(BWD ? a.X[1] : a.Y[1]);                          \
    const pc_idx D2 = (pc_idx)(BWD ? a.X[2] : a.Y[2]);                                                                \
    const pc_idx ss0 = (pc_idx)(BWD ? a.ys[0] : a.xs[0]), ss1 = (pc_idx)(BWD ? a.ys[1] : a.xs[1]);                    \
    const pc_idx ss2 = (pc_idx)(BWD ? a.ys[2] : a.xs[2]), ss3 = (pc_idx)(BWD ? a.ys[3] : a.xs[3]);                    \
    const pc_idx ss4 = (pc_idx)(BWD ? a.ys[4] : a.xs[4]);                                                             \
    const pc_idx ds0 = (pc_idx)(BWD ? a.xs[0] : a.ys[0]), ds1 = (pc_idx)(BWD ? a.xs[1] : a.ys[1]);                    \
    const pc_idx ds2 = (pc_idx)(BWD ? a.xs[2] : a.ys[2]), ds3 = (pc_idx)(BWD ? a.xs[3] : a.ys[3]);                    \
    const pc_idx ds4 = (pc_idx)(BWD ? a.xs[4] : a.ys[4]);                                                             \
    const pc_idx ws0 = (pc_idx)a.ws_[0], ws2 = (pc_idx)a.ws_[2], ws3 = (pc_idx)a.ws_[3], ws4 = (pc_idx)a.ws_[4]

/* Forward (BWD false: X -> Y, stride S) or stride-1 backward-data (BWD true: dY -> dX, flipped filter).
 * ONE0: the view has one tap on axis 0 (2-D and 1-D problems): each tile row is stored as soon as it is done,
 * so only one row of accumulators is live; else every tile row accumulates over the axis-0 taps first. */
template <int S, bool BWD, int VC, bool ONE0, int VW, int TH, bool PF, int PK = 0, bool RING = false>
PC_DEVICE void pc_dwt_conv(const pc_conv_args &a, void *pool) {
    constexpr int WIN = (VW - 1) * S + 3, TA = ONE0 ? 1 : TH;
    PC_DWT_WALK_LOCALS(BWD);
    const pc_idx R0 = ONE0 ? 1 : (pc_idx)a.R[0];
    const pc_idx PE1 = BWD ? 2 - (pc_idx)a.P[1] : (pc_idx)a.P[1], PE2 = BWD ? 2 - (pc_idx)a.P[2] : (pc_idx)a.P[2];
    const pc_idx CV = (pc_idx)a.C / VC, T1 = (D1 + TH - 1) / TH, NS = (D2 + VW - 1) / VW;
    const pc_idx total = (pc_idx)a.N * D0 * T1 * NS * CV;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, cv, d0, t1, s;
        pc_unflatten5(e, CV, D0, T1, NS, cl, n, cv, d0, t1, s);
        const pc_idx c = cv * VC, d1s = t1 * TH, d2s = s * VW;
        const pc_idx b1 = d1s * S - PE1, b2 = d2s * S - PE2;
        pc_acc_t bias[VC];
#pragma unroll
        for (int j = 0; j < VC; ++j) bias[j] = b ? (pc_acc_t)pc_ld(b, (c + j) * (pc_idx)a.bs) : (pc_acc_t)0;
        const pc_idx db = n * ds0 + c * ds1 + d0 * ds2;
        pc_acc_t acc[TA][VW][VC];
#pragma unroll
        for (int t = 0; t < TA; ++t)
#pragma unroll
            for (int v = 0; v < VW; ++v)
#pragma unroll
                for (int j = 0; j < VC; ++j) acc[t][v][j] = 0;
        bool any = false;
        for (pc_idx r0 = 0; r0 < R0; ++r0) {
            pc_idx i0;
            if (BWD) {
                if (!pc_out_of(d0, r0, (pc_idx)a.S[0], (pc_idx)a.P[0], (pc_idx)a.DL[0], E0, i0)) continue;
            } else {
                i0 = d0 * (pc_idx)a.S[0] - (pc_idx)a.P[0] + r0 * (pc_idx)a.DL[0];
                if (i0 < 0 || i0 >= E0) continue;
            }
            any = true;
            pc_acc_t wv[3][3][VC];
            pc_dwt_taps<BWD>(wv, w, c, r0 * ws2, ws0, ws3, ws4);
            const pc_idx rb = n * ss0 + c * ss1 + i0 * ss2;
            if constexpr (RING) { /* Note [async row ring] (ONE0) */
                pc_dwt_conv_ring<S, VC, VW, TH, PC_DWT_FRD, PK>(src, rb, b1, b2, E1, E2, ss3, ss4, wv, bias, dst,
                                                                db + d1s * ds3 + d2s * ds4, D1 - d1s, D2 - d2s, ds3,
                                                                ds4, pool);
                continue;
            }
            /* PF: all TH + 2 source rows are loaded up front (every load of the tile in flight at once); else a
             * rolling window: before tile row t, row[0 .. 2-S] hold source rows b1 + S*t + 0 .. 2-S; LA: Note
             * [row lookahead] */
            constexpr bool LA = !PF;
            constexpr int NR = PF ? TH + 2 : LA ? 3 + S : 3;
            pc_acc_t row[NR][WIN][VC];
#pragma unroll
            for (int q = 0; q < (PF ? NR : 0); ++q) {
                const pc_idx i1 = b1 + q;
                pc_dwt_row<VC, WIN, PK>(row[q], src, rb + i1 * ss3, i1 >= 0 && i1 < E1, b2, E2, ss4);
            }
            if (!PF) pc_dwt_roll_in<S, PK>(row, 0, src, rb, b1, 0, E1, ss3, b2, E2, ss4);
#pragma unroll
            for (int t = 0; t < TH; ++t) {
                if (!PF && !LA && t > 0) pc_dwt_roll_in<S, PK>(row, 3 - S, src, rb, b1, t, E1, ss3, b2, E2, ss4);
                if (LA && t + 1 < TH) pc_dwt_roll_in<S, PK, true>(row, 3 - S, src, rb, b1, t + 1, E1, ss3, b2, E2, ss4);
                const int ta = ONE0 ? 0 : t, rr = PF ? t : 0;
                pc_dwt_fma<S>(acc[ta], row, rr, wv);
                if (ONE0) {
                    if (d1s + t < D1)
                        pc_dwt_store<VC, VW, PK>(dst, db + (d1s + t) * ds3 + d2s * ds4, ds4, D2 - d2s, acc[0], bias);
#pragma unroll
                    for (int v = 0; v < VW; ++v)
#pragma unroll
                        for (int j = 0; j < VC; ++j) acc[0][v][j] = 0;
                }
                if (!PF) pc_dwt_roll_on<S, LA>(row);
            }
        }
        if (!ONE0 || !any) { /* ONE0 with its one tap outside the input: the tile is bias only */
#pragma unroll
            for (int t = 0; t < TH; ++t)
                if (d1s + t < D1)
                    pc_dwt_store<VC, VW, PK>(dst, db + (d1s + t) * ds3 + d2s * ds4, ds4, D2 - d2s, acc[ONE0 ? 0 : t],
                                             bias);
        }
    }
}

/* Note [quad rows]: the 2-D NCHW forward and stride-1 backward-data in a 16-bit type where the window starts one column
 * left of the strip (P2 == 1, so both directions' effective padding is 1), rows are a multiple of 4 long, and every
 * stride but the unit last one is a multiple of 4 with 8-byte-aligned bases: a thread's strip of 4 columns is one
 * aligned 8-byte load per source row, its two halo columns two 2-byte loads (zero at the row's ends, the only place a
 * halo can fall outside), and its output row one 8-byte store. The Note [packed rows] walk does the same work through
 * 4 pair copies of a ring and per-pair bounds and odd-length branches: nvcc sm_90 gave it ~2200 instructions a thread
 * for an 8 x 4 tile (ncu: 31.2M on mbv2-dw3x3-bf16, issue 77% of cycles). Here the PC_DWT_QD source rows ahead of
 * the one being multiplied stay raw (2 + 2 registers a row) and are widened once, into a 3-row window. Tile
 * PC_DWT_THN16 x 4, as the host sizes the grid (H100, mbv2-dw3x3-bf16 forward: 1.31x over the packed-rows walk;
 * docs/kernels/depthwise.md). */
#ifndef PC_DWT_QD
#define PC_DWT_QD 4 /* raw source rows in flight ahead of the one multiplied (all TH + 2: 102 registers, slower) */
#endif

template <bool BWD>
PC_DEVICE void pc_dwt_conv_q4(const pc_conv_args &a) {
    constexpr int TH = PC_DWT_THN16, NR = TH + 2, QD = PC_DWT_QD < NR ? PC_DWT_QD : NR;
    typedef pc_vec<pc_t, 4> V4;
    PC_DWT_WALK_LOCALS(BWD);
    (void)E0, (void)E2, (void)D2, (void)ws2, (void)ss4, (void)ds4;
    const pc_idx PE1 = BWD ? 2 - (pc_idx)a.P[1] : (pc_idx)a.P[1], C = (pc_idx)a.C;
    const pc_idx T1 = (D1 + TH - 1) / TH, NS = D2 / 4, total = (pc_idx)a.N * D0 * T1 * NS * C;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, c, d0, t1, s;
        pc_unflatten5(e, C, D0, T1, NS, false, n, c, d0, t1, s);
        const pc_idx b1 = t1 * TH - PE1;
        const bool lok = s > 0, rok = s + 1 < NS;
        const pc_t *PC_RESTRICT sp = src + n * ss0 + c * ss1 + d0 * ss2 + s * 4;
        pc_t *PC_RESTRICT dp = dst + n * ds0 + c * ds1 + d0 * ds2 + t1 * TH * ds3 + s * 4;
        pc_acc_t wv[3][3][1];
        pc_dwt_taps<BWD>(wv, w, c, 0, ws0, ws3, ws4);
        const pc_acc_t bias = b ? (pc_acc_t)pc_ld(b, c * (pc_idx)a.bs) : (pc_acc_t)0;
        V4 core[NR];
        pc_t hl[NR], hr[NR];
        auto load = [&](int q) {
            const pc_idx i1 = b1 + q;
            const bool ok = i1 >= 0 && i1 < E1;
            const pc_t *p = sp + i1 * ss3;
            core[q] = ok ? pc_ld_vec((const V4 *)p) : V4{}; /* raw bits: zero is +0 in every 16-bit type */
            hl[q] = ok && lok ? p[-1] : pc_t{};
            hr[q] = ok && rok ? p[4] : pc_t{};
        };
#pragma unroll
        for (int q = 0; q < QD; ++q) load(q);
        pc_acc_t f[NR][6][1];
#pragma unroll
        for (int q = 0; q < NR; ++q) {
            if (q + QD < NR) load(q + QD);
            f[q][0][0] = (pc_acc_t)pc_ld(hl, q);
#pragma unroll
            for (int j = 0; j < 4; ++j) f[q][j + 1][0] = (pc_acc_t)pc_ld(core[q].v, j);
            f[q][5][0] = (pc_acc_t)pc_ld(hr, q);
            if (q < 2) continue;
            const int t = q - 2;
            pc_acc_t acc[4][1] = {};
            pc_dwt_fma<1>(acc, f, t, wv);
            if (t1 * TH + t < D1) {
                V4 out;
#pragma unroll
                for (int v = 0; v < 4; ++v) pc_st(out.v, v, acc[v][0] + bias);
                pc_st_vec((V4 *)(dp + t * ds3), out);
            }
        }
    }
}

/* Note [depth taps inner]: the 3-D NCHW forward and stride-1 backward-data with at most 3 axis-0 taps, axis-0 stride
 * and dilation 1 (dw3d-3x3x3) give a thread DZ = 2 output planes (axis 0) of its TH x VW tile and walk the tile rows
 * once, the taps inside: one rolling window per source plane, DZ + 2 = 4 of them, so the two output planes share
 * two of their source planes and a thread reads 4 planes for 2 outputs where pc_dwt_conv reads 3 for 1 (a third
 * fewer loads through L1; ncu had its load path 72% busy at 39% of DRAM bandwidth). Each output row is finished
 * and stored before the next, so 2 x VW accumulators live instead of TH x VW. A source plane outside the input
 * gets an empty row range and reads as zeros; taps past R0 have zero weights. Tiles are 8 x 2 with Note [row
 * lookahead] (8 x 4 spilled at 128 registers and left no room for it; H100 dw3d-3x3x3 forward 1.24x over one plane
 * a thread; docs/kernels/depthwise.md). */
template <int S, bool BWD, int VW, int TH, int DZ>
PC_DEVICE void pc_dwt_conv3i(const pc_conv_args &a) {
    constexpr int WIN = (VW - 1) * S + 3, NP = DZ + 2; /* DZ output planes of a thread read NP source planes */
    constexpr bool LA = true; /* Note [row lookahead] */
    constexpr int NR = LA ? 3 + S : 3;
    PC_DWT_WALK_LOCALS(BWD);
    const pc_idx R0 = (pc_idx)a.R[0], P0 = (pc_idx)a.P[0];
    const pc_idx PE1 = BWD ? 2 - (pc_idx)a.P[1] : (pc_idx)a.P[1], PE2 = BWD ? 2 - (pc_idx)a.P[2] : (pc_idx)a.P[2];
    const pc_idx C = (pc_idx)a.C, T1 = (D1 + TH - 1) / TH, NS = (D2 + VW - 1) / VW, DZN = (D0 + DZ - 1) / DZ;
    const pc_idx total = (pc_idx)a.N * DZN * T1 * NS * C;
    const bool cl = (a.flags & PC_FLAG_CL) != 0;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, c, dz, t1, s;
        pc_unflatten5(e, C, DZN, T1, NS, cl, n, c, dz, t1, s);
        const pc_idx d0 = dz * DZ, d1s = t1 * TH, d2s = s * VW, b1 = d1s * S - PE1, b2 = d2s * S - PE2;
        pc_acc_t bias[1] = {b ? (pc_acc_t)pc_ld(b, c * (pc_idx)a.bs) : (pc_acc_t)0};
        const pc_idx db = n * ds0 + c * ds1 + d0 * ds2;
        /* axis 0 has stride and dilation 1 (pc_dwt_conv_any checks): the thread's source plane k is i0 = d0 - P0 + k
         * (forward: output plane d0 + z takes tap r0 = k - z) or d0 + P0 - 2 + k (backward-data: r0 = z + 2 - k) */
        pc_acc_t wv[3][3][3][1];
#pragma unroll
        for (int r0 = 0; r0 < 3; ++r0) pc_dwt_taps<BWD>(wv[r0], w, c, r0 * ws2, ws0, ws3, ws4, r0 < R0);
        pc_idx rb[NP], e1[NP];
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            const pc_idx i0 = BWD ? d0 + P0 - 2 + k : d0 - P0 + k;
            const bool ok = i0 >= 0 && i0 < E0;
            rb[k] = n * ss0 + c * ss1 + (ok ? i0 : 0) * ss2;
            e1[k] = ok ? E1 : 0; /* an empty row range: the plane's window reads zeros */
        }
        pc_acc_t row[NP][NR][WIN][1];
#pragma unroll
        for (int k = 0; k < NP; ++k) pc_dwt_roll_in<S>(row[k], 0, src, rb[k], b1, 0, e1[k], ss3, b2, E2, ss4);
#pragma unroll
        for (int t = 0; t < TH; ++t) {
#pragma unroll
            for (int k = 0; k < NP; ++k) {
                if (!LA && t > 0) pc_dwt_roll_in<S>(row[k], 3 - S, src, rb[k], b1, t, e1[k], ss3, b2, E2, ss4);
                if (LA && t + 1 < TH)
                    pc_dwt_roll_in<S, 0, true>(row[k], 3 - S, src, rb[k], b1, t + 1, e1[k], ss3, b2, E2, ss4);
            }
#pragma unroll
            for (int z = 0; z < DZ; ++z) {
                pc_acc_t acc[VW][1];
#pragma unroll
                for (int v = 0; v < VW; ++v) acc[v][0] = 0;
#pragma unroll
                for (int r0 = 0; r0 < 3; ++r0) pc_dwt_fma<S>(acc, row[BWD ? z + 2 - r0 : z + r0], 0, wv[r0]);
                if (d1s + t < D1 && d0 + z < D0)
                    pc_dwt_store<1, VW>(dst, db + z * ds2 + (d1s + t) * ds3 + d2s * ds4, ds4, D2 - d2s, acc, bias);
            }
#pragma unroll
            for (int k = 0; k < NP; ++k) pc_dwt_roll_on<S, LA>(row[k]);
        }
    }
}

/* CLV: try the vector path (channels-last), else one channel per thread; ONE0: the view has one axis-0 tap. */
template <int S, bool BWD, bool ONE0, bool CLV>
PC_DEVICE void pc_dwt_conv_any(const pc_conv_args &a) {
    constexpr int VC = PC_DWT_VC;
    constexpr bool N16 = !CLV && ONE0 && sizeof(pc_t) == 2; /* Note [packed rows] */
    constexpr int VW = CLV ? PC_DWT_VWC : !ONE0 ? PC_DWT_VW3 : N16 ? PC_DWT_VWN16 : PC_DWT_VWN;
    constexpr int TH = CLV ? (ONE0 ? PC_DWT_THC : PC_DWT_THC3) : !ONE0 ? PC_DWT_TH3 : N16 ? PC_DWT_THN16 : PC_DWT_THN;
    /* PF: all TH + 2 rows up front for 2-D NCHW float32 / float64 at stride 1; 16-bit rows (fewer registers) and
     * channels-last roll their window */
    constexpr bool PF = !CLV && ONE0 && S == 1 && !N16;
    /* Note [async row ring]: 2-D channels-last vectors or 2-D NCHW packed 16-bit rows; one pool per kernel */
    constexpr bool RV = CLV && ONE0 && VC > 1 && PC_DWT_FRING;
    constexpr bool RP = N16 && S == 1 && !PF && VW % 2 == 0 && PC_DWT_NRING; /* stride 2: not measured */
    constexpr int B0 = pc_dwt_ring_bytes<S, VC, VW, 0>(RV), B1 = pc_dwt_ring_bytes<S, 1, VW, 2>(RP);
    constexpr int B = B0 > B1 ? B0 : B1;
    PC_SHARED pc_vec<unsigned, 4> pool[B > 0 ? B / 16 : 1];
    if constexpr (!CLV && !ONE0) {
        if (S == 1 && a.R[0] <= 3 && a.S[0] == 1 && a.DL[0] == 1) /* Note [depth taps inner] */
            pc_dwt_conv3i<S, BWD, VW, TH, PC_DWT_DZ>(a);
        else
            pc_dwt_conv<S, BWD, 1, ONE0, VW, TH, PF>(a, pool);
    } else if constexpr (CLV && VC > 1) {
        if (pc_dwt_vec_ok<VC>(a))
            pc_dwt_conv<S, BWD, VC, ONE0, VW, TH, PF, 0, RV>(a, pool);
        else
            pc_dwt_conv<S, BWD, 1, ONE0, VW, TH, PF>(a, pool);
    } else if constexpr (N16 && S == 1 && PC_DWT_N16 == 4) { /* Note [quad rows] */
        pc_dwt_conv_q4<BWD>(a);
    } else if constexpr (N16 && VW % 2 == 0 && (PC_DWT_N16 == 1 || PC_DWT_N16 == 2)) { /* Note [packed rows] */
        pc_dwt_conv<S, BWD, 1, ONE0, VW, TH, PF, PC_DWT_N16, RP>(a, pool);
    } else {
        pc_dwt_conv<S, BWD, 1, ONE0, VW, TH, PF>(a, pool);
    }
}

/* Weight gradient, channels-last, R0C x 3 x 3 filters (R0C = 1 or 3, dilation 1 on axis 0 when 3), in-plane
 * stride S. Grid (channel tiles, a.splits); the (n, o0, row tile, strip) units are shared out evenly over the
 * splits here (not from a.chunk), so the unit shape of each VC is the kernel's business alone. */
/* Channel groups per block of the weight gradient (simt/depthwise.py depthwise_weight_grid computes the same): 16 or 8,
 * so a block holds 16 or 32 position groups, and the splits (each a pass of portconv_split_finalize) stay few. */
PC_DEVICE pc_idx pc_dwt_channel_tile(pc_idx CV) { return CV % 16 == 0 ? 16 : CV < 8 ? CV : 8; }

/* Note [async row ring]: the 16-bit channels-last weight gradient walks its units (TH x VW positions of VC channels)
 * as one stream of steps, one per source row q of a unit (NR = (TH - 1) S + 3 of them): step q brings X row q's WIN
 * vectors and, where q >= 2 and (q - 2) % S == 0, dY row (q - 2) / S's VW vectors. Each thread copies its own steps
 * into its own slots of a shared-memory ring with the prelude's pc_cp_async (Note [async copies]; zeros outside the
 * image), RD - 1 steps ahead of the step it multiplies: the loads are in flight without holding registers, where
 * a register lookahead cost 33 registers and half the blocks. The stream runs across units: the last
 * steps of a unit issue the first steps of the thread's next unit, so no unit starts with an empty ring; only the
 * issuing side keeps a unit's addresses. No thread reads another's slot, so no barrier is needed until the ring's
 * memory is reused for the reduction. Where the copies are synchronous (PC_ASYNC_COPY 0) the ring is off by default
 * and the rolling window loads directly. Slot k, vector v of thread i: ring[(k NV + v) THREADS + i], so a warp's
 * accesses are consecutive 8-byte words. */
template <int S, int VC, int TH, int VW, int RD>
PC_DEVICE void pc_dwt_wring(pc_acc_t (&acc)[9][VC], const pc_conv_args &a, pc_idx lo, pc_idx hi, pc_idx pg,
                            pc_idx PG, pc_idx c, pc_vec<pc_t, VC> *ring) {
    typedef pc_vec<pc_t, VC> V;
    constexpr int WIN = (VW - 1) * S + 3, NR = (TH - 1) * S + 3, NV = WIN + VW, L = PC_DWT_THREADS;
    static_assert(RD >= 2 && RD - 1 <= NR, "the ring needs two slots and at most a unit in flight");
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx xs3 = (pc_idx)a.xs[3], xs4 = (pc_idx)a.xs[4], ys3 = (pc_idx)a.ys[3], ys4 = (pc_idx)a.ys[4];
    const pc_idx T1 = (Y1 + TH - 1) / TH, NS = (Y2 + VW - 1) / VW;
    V *mine = ring + threadIdx.x;
    /* the issuing side: unit ie and its addresses */
    pc_idx ie = lo + pg, o1s = 0, o2s = 0, b1 = 0, b2 = 0, xr = 0, yr = 0;
    bool u0 = false;
    auto unit = [&]() {
        pc_idx n, o0, t1, st;
        pc_unflatten4(ie, Y0, T1, NS, n, o0, t1, st);
        o1s = t1 * TH;
        o2s = st * VW;
        b1 = o1s * S - (pc_idx)a.P[1];
        b2 = o2s * S - (pc_idx)a.P[2];
        const pc_idx i0 = o0 * (pc_idx)a.S[0] - (pc_idx)a.P[0];
        u0 = i0 >= 0 && i0 < X0;
        xr = n * (pc_idx)a.xs[0] + c * (pc_idx)a.xs[1] + i0 * (pc_idx)a.xs[2];
        yr = n * (pc_idx)a.ys[0] + c * (pc_idx)a.ys[1] + o0 * (pc_idx)a.ys[2];
    };
    int is = 0, cs = 0; /* the slots of the next issue and of the next step multiplied */
    /* step q of unit ie into slot is; past the thread's last unit it commits an empty group (the count stays even) */
    auto issue = [&](int q) {
        if (ie < hi) {
            V *sl = mine + is * NV * L;
            const pc_idx i1 = b1 + q;
            pc_dwt_ring_copy<WIN>(sl, x, xr + i1 * xs3, u0 && i1 >= 0 && i1 < X1, b2, X2, xs4);
            if (q >= 2 && (q - 2) % S == 0) {
                const pc_idx o1 = o1s + (q - 2) / S;
#pragma unroll
                for (int v = 0; v < VW; ++v) {
                    const bool ok = u0 && o1 < Y1 && o2s + v < Y2;
                    pc_cp_async<sizeof(V)>(sl + (WIN + v) * L, ok ? dy + yr + o1 * ys3 + (o2s + v) * ys4 : dy, ok);
                }
            }
        }
        pc_cp_async_commit();
        is = is + 1 == RD ? 0 : is + 1;
    };
    if (ie < hi) unit();
#pragma unroll
    for (int q = 0; q < RD - 1; ++q) issue(q);
    for (pc_idx e = lo + pg; e < hi; e += PG) {
        pc_acc_t row[3][WIN][VC];
#pragma unroll
        for (int q = 0; q < NR; ++q) {
            pc_cp_async_wait<RD - 2>(); /* step q has landed */
            const V *sl = mine + cs * NV * L;
            cs = cs + 1 == RD ? 0 : cs + 1;
            pc_dwt_ring_roll<VC, WIN>(row, sl);
            const bool has_g = q >= 2 && (q - 2) % S == 0;
            pc_acc_t g[VW][VC];
#pragma unroll
            for (int v = 0; v < VW; ++v) {
                const V gv = has_g ? sl[(WIN + v) * L] : V{};
#pragma unroll
                for (int j = 0; j < VC; ++j) g[v][j] = (pc_acc_t)pc_ld(gv.v, j);
            }
            const int QI = q + RD - 1; /* the step issued now, into the slot read one step ago */
            if (QI == NR) { /* into the thread's next unit */
                ie += PG;
                if (ie < hi) unit();
            }
            issue(QI < NR ? QI : QI - NR);
            if (has_g) pc_dwt_wacc<S>(acc, 0, g, row, 0);
        }
    }
    pc_cp_async_wait<0>();
}

template <int R0C, int S, int VC>
PC_DEVICE void pc_dwt_bwd_weight(const pc_conv_args &a, pc_vec<pc_acc_t, 4> *pool) {
    constexpr int TH = PC_DWT_THW(VC), VW = PC_DWT_VWW(VC), WIN = (VW - 1) * S + 3, TAPS = R0C * 9;
    constexpr bool ROLL = VC >= 4;
    const pc_t *PC_RESTRICT x = (const pc_t *)a.x;
    pc_t *PC_RESTRICT dw = (pc_t *)a.w;
    const pc_t *PC_RESTRICT dy = (const pc_t *)a.y;
    const pc_idx Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
    const pc_idx X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx xs4 = (pc_idx)a.xs[4], ys4 = (pc_idx)a.ys[4];
    const pc_idx CV = (pc_idx)a.C / VC, B = (pc_idx)blockDim.x, CT = pc_dwt_channel_tile(CV), PG = B / CT;
    const pc_idx lane = (pc_idx)threadIdx.x % CT, pg = (pc_idx)threadIdx.x / CT;
    const pc_idx ntiles = (CV + CT - 1) / CT;
    const pc_idx T1 = (Y1 + TH - 1) / TH, NS = (Y2 + VW - 1) / VW;
    const pc_idx sp = (pc_idx)blockIdx.y;
    pc_idx lo, hi;
    const pc_idx units = (pc_idx)a.N * Y0 * T1 * NS;
    pc_split_range(units, (units + (pc_idx)a.splits - 1) / (pc_idx)a.splits, sp, lo, hi);
    constexpr int RT = 18; /* partials per thread and reduction round (18 KB of float, 36 KB of double) */
    constexpr int ROUNDS = (TAPS * VC + RT - 1) / RT;
    /* Note [async row ring] where it is on; its memory is the reduction's, after a barrier */
    constexpr int SLOT = (WIN + VW) * PC_DWT_THREADS * (int)sizeof(pc_vec<pc_t, VC>);
    constexpr int RD = PC_DWT_RD * SLOT <= PC_DWT_POOL ? PC_DWT_RD : PC_DWT_POOL / SLOT;
    constexpr int RING = ROLL && R0C == 1 && PC_DWT_RING ? RD : 0;
    constexpr int RED_B = RT * PC_DWT_THREADS * (int)sizeof(pc_acc_t);
    constexpr int RING_B = RING * SLOT;
    static_assert(RED_B <= PC_DWT_POOL && RING_B <= PC_DWT_POOL, "the weight gradient's shared memory");
    pc_acc_t *red = (pc_acc_t *)pool;
    for (pc_idx tile = (pc_idx)blockIdx.x; tile < ntiles; tile += (pc_idx)gridDim.x) {
        const pc_idx cv = tile * CT + lane, c = cv * VC;
        const bool active = pg < PG && cv < CV;
        pc_acc_t acc[TAPS][VC];
#pragma unroll
        for (int t = 0; t < TAPS; ++t)
#pragma unroll
            for (int j = 0; j < VC; ++j) acc[t][j] = 0;
        if constexpr (RING != 0) {
            if (active) pc_dwt_wring<S, VC, TH, VW, RING>(acc, a, lo, hi, pg, PG, c, (pc_vec<pc_t, VC> *)pool);
            PC_BARRIER(); /* every thread's ring reads are done before the reduction reuses the memory */
        }
        for (pc_idx e = lo + pg; !RING && active && e < hi; e += PG) {
            pc_idx n, o0, t1, st;
            pc_unflatten4(e, Y0, T1, NS, n, o0, t1, st);
            const pc_idx o1s = t1 * TH, o2s = st * VW;
            const pc_idx b1 = o1s * S - (pc_idx)a.P[1], b2 = o2s * S - (pc_idx)a.P[2];
            const pc_idx gb = n * (pc_idx)a.ys[0] + c * (pc_idx)a.ys[1] + o0 * (pc_idx)a.ys[2];
#pragma unroll
            for (int r0 = 0; r0 < R0C; ++r0) {
                const pc_idx i0 = o0 * (pc_idx)a.S[0] - (pc_idx)a.P[0] + r0 * (pc_idx)a.DL[0];
                if (i0 < 0 || i0 >= X0) continue;
                const pc_idx rb = n * (pc_idx)a.xs[0] + c * (pc_idx)a.xs[1] + i0 * (pc_idx)a.xs[2];
                if (ROLL) { /* a rolling 3-row window of X down the TH rows of the unit */
                    pc_acc_t row[3][WIN][VC];
                    pc_acc_t g[VW][VC];
                    const pc_idx xs3 = (pc_idx)a.xs[3];
                    pc_dwt_roll_in<S>(row, 0, x, rb, b1, 0, X1, xs3, b2, X2, xs4);
                    for (int t = 0; t < TH && o1s + t < Y1; ++t) {
                        if (t > 0) pc_dwt_roll_in<S>(row, 3 - S, x, rb, b1, t, X1, xs3, b2, X2, xs4);
                        pc_dwt_row<VC, VW>(g, dy, gb + (o1s + t) * (pc_idx)a.ys[3], true, o2s, Y2, ys4);
                        pc_dwt_wacc<S>(acc, r0, g, row, 0);
                        pc_dwt_roll_on<S>(row);
                    }
                    continue;
                }
                constexpr int NR = (TH - 1) * S + 3; /* every source row of the tile, loaded up front */
                pc_acc_t row[NR][WIN][VC];
                pc_acc_t g[TH][VW][VC];
#pragma unroll
                for (int q = 0; q < NR; ++q) {
                    const pc_idx i1 = b1 + q;
                    pc_dwt_row<VC, WIN>(row[q], x, rb + i1 * (pc_idx)a.xs[3], i1 >= 0 && i1 < X1, b2, X2, xs4);
                }
#pragma unroll
                for (int t = 0; t < TH; ++t)
                    pc_dwt_row<VC, VW>(g[t], dy, gb + (o1s + t) * (pc_idx)a.ys[3], o1s + t < Y1, o2s, Y2, ys4);
#pragma unroll
                for (int t = 0; t < TH; ++t) pc_dwt_wacc<S>(acc, r0, g[t], row, S * t);
            }
        }
        /* The position groups' partials, summed in a fixed order: per round every thread parks RT of its TAPS x VC
         * partials in shared memory (value-major, conflict-free), then the CT x RT sums of the round are spread
         * over the whole block, each a serial sum over the PG groups. */
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
#pragma unroll
            for (int t = 0; t < TAPS; ++t)
#pragma unroll
                for (int j = 0; j < VC; ++j) {
                    const int q = t * VC + j - r * RT;
                    if (q >= 0 && q < RT) red[q * PC_DWT_THREADS + threadIdx.x] = acc[t][j];
                }
            PC_BARRIER();
            const int here = (TAPS * VC - r * RT) < RT ? TAPS * VC - r * RT : RT;
            for (pc_idx o = (pc_idx)threadIdx.x; o < CT * here; o += B) {
                const pc_idx ln = o % CT, q = o / CT, cvo = tile * CT + ln;
                if (cvo >= CV) continue;
                pc_acc_t sum = 0;
                for (pc_idx p = 0; p < PG; ++p) sum += red[q * PC_DWT_THREADS + p * CT + ln];
                const pc_idx tj = r * RT + q, t = tj / VC, k = cvo * VC + tj % VC;
                if (a.splits == 1)
                    pc_st(dw, k * (pc_idx)a.ws_[0] + (t / 9) * (pc_idx)a.ws_[2] + ((t / 3) % 3) * (pc_idx)a.ws_[3] +
                                  (t % 3) * (pc_idx)a.ws_[4],
                          sum);
                else
                    ((pc_acc_t *)a.ws)[sp * (pc_idx)a.K * TAPS + k * TAPS + t] = sum;
            }
            PC_BARRIER();
        }
    }
}

template <int R0C, int S>
PC_DEVICE void pc_dwt_bwd_weight_any(const pc_conv_args &a) {
    constexpr int VC = R0C == 3 && PC_DWT_VC > 2 ? 2 : PC_DWT_VC; /* 27 taps x 4 channels: too many registers */
    PC_SHARED pc_vec<pc_acc_t, 4> pool[PC_DWT_POOL / sizeof(pc_vec<pc_acc_t, 4>)]; /* one for both instances */
    if (VC > 1 && pc_dwt_vec_ok<VC>(a))
        pc_dwt_bwd_weight<R0C, S, VC>(a, pool);
    else
        pc_dwt_bwd_weight<R0C, S, 1>(a, pool);
}

/* Forward and backward-data kernels: tile[n][3d]_s{S}. 'n': NCHW-style (one channel per thread, spatial
 * innermost work order); no 'n': channels-last, vectorised where pc_dwt_vec_ok; '3d': any number of axis-0 taps
 * (else exactly one). Separate entries keep each one's register count to what it needs. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tile_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tile_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, false, true, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tilen_s1)
PC_KERNEL void PC_DWT_NBOUNDS portconv_depthwise_fwd_tilen_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, false, true, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tile3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tile3d_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, false, false, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tilen3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWT_3MINB) portconv_depthwise_fwd_tilen3d_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, false, false, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tile_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tile_s2(const pc_conv_args a) {
    pc_dwt_conv_any<2, false, true, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tilen_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tilen_s2(const pc_conv_args a) {
    pc_dwt_conv_any<2, false, true, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tile3d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tile3d_s2(const pc_conv_args a) {
    pc_dwt_conv_any<2, false, false, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_fwd_tilen3d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_fwd_tilen3d_s2(const pc_conv_args a) {
    pc_dwt_conv_any<2, false, false, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_tile_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_tile_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, true, true, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_tilen_s1)
PC_KERNEL void PC_DWT_NBOUNDS portconv_depthwise_bwd_data_tilen_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, true, true, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_tile3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_data_tile3d_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, true, false, true>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_data_tilen3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWT_3MINB) portconv_depthwise_bwd_data_tilen3d_s1(const pc_conv_args a) {
    pc_dwt_conv_any<1, true, false, false>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_tile2d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWT_WMINB) portconv_depthwise_bwd_weight_tile2d_s1(const pc_conv_args a) {
    pc_dwt_bwd_weight_any<1, 1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_tile2d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS_MIN(256, PC_DWT_WMINB) portconv_depthwise_bwd_weight_tile2d_s2(const pc_conv_args a) {
    pc_dwt_bwd_weight_any<1, 2>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_tile3d_s1)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_tile3d_s1(const pc_conv_args a) {
    pc_dwt_bwd_weight_any<3, 1>(a);
}
#endif
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_depthwise_bwd_weight_tile3d_s2)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_depthwise_bwd_weight_tile3d_s2(const pc_conv_args a) {
    pc_dwt_bwd_weight_any<3, 2>(a);
}
#endif
