/* The work-group tile of Note [OpenCL implicit GEMM] (igemm.cl), instantiated once per direction: igemm.cl
 * defines IG_OP (fwd, bwd_data, bwd_weight) and the op's types and functions ig_<op>_{op,rowt,colt,redt} and
 * ig_<op>_{row,col,red,A,B,orow,ocol,put} (and, with IG_TM_OP, those of Note [OpenCL tap-major steps]), then
 * includes this file, which defines ig_<op>_fetch and ig_<op>_tile.
 * (OpenCL C has no templates; the CUDA set's pc_igemm_run in cuda/conv_igemm.cuh is the same loop.)
 * The products of a step are the FMA loop (IG_TM x IG_TN results per work-item) or, under IG_TC, warp-level
 * mma of igemm_tc.h (Note [OpenCL tensor cores]); the gathers, the local-memory steps and the stores are shared.
 */
#define IGN(s) CAT(CAT(ig_, IG_OP), s)

/* The next reduction step's gathers of one load work-item: its reduction index r, IG_AJ rows and IG_BJ columns. */
IG_INLINE void IGN(_fetch)(const IGN(_op) *op, __global const T *pa, __global const T *pb, const IGN(_rowt) *rows,
                           const IGN(_colt) *cols, idx_t r, idx_t rend, ACC *ra, ACC *rb) {
    const IGN(_redt) d = IGN(_red)(op, r, rend);
#pragma unroll
    for (int j = 0; j < IG_AJ; ++j) ra[j] = IGN(_A)(op, pa, &rows[j], &d);
#pragma unroll
    for (int j = 0; j < IG_BJ; ++j) rb[j] = IGN(_B)(op, pb, &d, &cols[j]);
}

#if IG_TM_OP /* Note [OpenCL tap-major steps] (igemm.cl) */
#if IG_AJ > 32
#error "portconv: tap-major steps keep a work-item's A rows as bits of a uint (IG_AJ <= 32)"
#endif
/* bit j: A row j is inside the input at the work-item's current tap */
IG_INLINE uint IGN(_rows_ok)(const IGN(_op) *op, const IGN(_rowt) *rows, const IGN(_redt) *d) {
    uint ok = 0;
#pragma unroll
    for (int j = 0; j < IG_AJ; ++j) ok |= (uint)IGN(_A_ok)(op, &rows[j], d) << j;
    return ok;
}

/* IGN(_fetch) with the rows' bounds from the mask */
IG_INLINE void IGN(_fetch_tm)(const IGN(_op) *op, __global const T *pa, __global const T *pb,
                              const IGN(_rowt) *rows, const IGN(_colt) *cols, const IGN(_redt) *d, uint ok,
                              ACC *ra, ACC *rb) {
#pragma unroll
    for (int j = 0; j < IG_AJ; ++j) ra[j] = (ok >> j & 1u) ? IGN(_A_ld)(op, pa, &rows[j], d) : 0;
#pragma unroll
    for (int j = 0; j < IG_BJ; ++j) rb[j] = IGN(_B)(op, pb, d, &cols[j]);
}
#endif

/* C[m0:m0+IG_BM, n0:n0+IG_BN] of one group = sum over r in [rbeg, rend) of A[m, r] B[r, n]; rows past M and
 * columns past NC are gathered as zeros and not stored. As/Bs: IG_AS and IG_BS elements of local memory, element
 * (r, m) of A at IG_AT(r, m), (r, n) of B at IG_BT(r, n). */
IG_INLINE void IGN(_tile)(const IGN(_op) *op, __global const T *pa, __global const T *pb, __global T *out,
                          __global const T *bias, __global ACC *wsp, idx_t M, idx_t NC, idx_t rbeg, idx_t rend,
                          __local ACC *As, __local ACC *Bs) {
#ifdef IG_MFAST /* neighbouring load work-items on neighbouring rows / columns (channels-last grad-weight) */
    const int tid = (int)get_local_id(0), lq = tid % IG_LQ, rr = tid / IG_LQ;
#else /* ... on neighbouring reduction indices */
    const int tid = (int)get_local_id(0), rr = tid % IG_BK, lq = tid / IG_BK;
#endif
#if !IG_TC
    const int tx = tid % IG_NX, ty = tid / IG_NX;
#endif
    const idx_t m0 = (idx_t)get_group_id(0) * IG_BM, n0 = (idx_t)get_group_id(1) * IG_BN;
    IGN(_rowt) rows[IG_AJ];
    IGN(_colt) cols[IG_BJ];
#pragma unroll
    for (int j = 0; j < IG_AJ; ++j) rows[j] = IGN(_row)(op, m0 + lq + IG_LQ * j, M);
#pragma unroll
    for (int j = 0; j < IG_BJ; ++j) cols[j] = IGN(_col)(op, n0 + lq + IG_LQ * j, NC);
    ACC ra[IG_AJ], rb[IG_BJ];
#if IG_TC
    float acc[IG_MI][IG_NI][4];
#pragma unroll
    for (int i = 0; i < IG_MI; ++i)
#pragma unroll
        for (int j = 0; j < IG_NI; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
#else
    ACC acc[IG_TM][IG_TN];
#pragma unroll
    for (int i = 0; i < IG_TM; ++i)
#pragma unroll
        for (int j = 0; j < IG_TN; ++j) acc[i][j] = 0;
#endif
#if IG_BLOCKED /* Note [blocked sums] (common.h): every RED_BLOCK positions the block's products join tot */
#if IG_TC
    float tot[IG_MI][IG_NI][4];
#pragma unroll
    for (int i = 0; i < IG_MI; ++i)
#pragma unroll
        for (int j = 0; j < IG_NI; ++j) tot[i][j][0] = tot[i][j][1] = tot[i][j][2] = tot[i][j][3] = 0;
#define IG_FLUSH(z)                                                                                                 \
    for (int i = 0; i < IG_MI; ++i)                                                                                 \
        for (int j = 0; j < IG_NI; ++j)                                                                             \
            for (int e = 0; e < 4; ++e) tot[i][j][e] += acc[i][j][e], acc[i][j][e] = z ? 0 : tot[i][j][e]
#else
    ACC tot[IG_TM][IG_TN];
#pragma unroll
    for (int i = 0; i < IG_TM; ++i)
#pragma unroll
        for (int j = 0; j < IG_TN; ++j) tot[i][j] = 0;
#define IG_FLUSH(z)                                                                                                 \
    for (int i = 0; i < IG_TM; ++i)                                                                                 \
        for (int j = 0; j < IG_TN; ++j) tot[i][j] += acc[i][j], acc[i][j] = z ? 0 : tot[i][j]
#endif
    int blk = 0;
#endif
#if IG_TM_OP /* the work-item's reduction position as (channel, tap digits), stepped without divisions */
    const idx_t tch = IGN(_ch)(op), tr1 = IGN(_r1)(op), tr2 = IGN(_r2)(op);
    ig_tap tp = ig_tap_of(rbeg + rr, tch, tr1, tr2);
    IGN(_redt) d = IGN(_red_at)(op, &tp);
    uint ok = IGN(_rows_ok)(op, rows, &d);
    if (rbeg < rend) IGN(_fetch_tm)(op, pa, pb, rows, cols, &d, ok, ra, rb);
#define IG_FETCH_NEXT()                                                                                             \
    do {                                                                                                            \
        const int moved = ig_tap_next(&tp, tch, tr1, tr2);                                                          \
        d = IGN(_red_at)(op, &tp);                                                                                  \
        if (moved) ok = IGN(_rows_ok)(op, rows, &d);                                                                \
        IGN(_fetch_tm)(op, pa, pb, rows, cols, &d, ok, ra, rb);                                                     \
    } while (0)
#else
    IGN(_fetch)(op, pa, pb, rows, cols, rbeg + rr, rend, ra, rb);
#define IG_FETCH_NEXT() IGN(_fetch)(op, pa, pb, rows, cols, r0 + IG_BK + rr, rend, ra, rb)
#endif
    for (idx_t r0 = rbeg; r0 < rend; r0 += IG_BK) {
#pragma unroll
        for (int j = 0; j < IG_AJ; ++j) As[IG_AT(rr, lq + IG_LQ * j)] = IG_STAGE(ra[j]);
#pragma unroll
        for (int j = 0; j < IG_BJ; ++j) Bs[IG_BT(rr, lq + IG_LQ * j)] = IG_STAGE(rb[j]);
        barrier(CLK_LOCAL_MEM_FENCE);
#if IG_PREFETCH
        if (r0 + IG_BK < rend) IG_FETCH_NEXT();
#endif
#if IG_TC
        ig_tc_step(As, Bs, acc, tid);
#else
#pragma unroll
        for (int kk = 0; kk < IG_BK; ++kk) {
            ACC av[IG_TM], bv[IG_TN];
#pragma unroll
            for (int i = 0; i < IG_TM; ++i) av[i] = As[kk * IG_LDA + ty + IG_NY * i];
#pragma unroll
            for (int j = 0; j < IG_TN; ++j) bv[j] = Bs[kk * IG_LDB + tx + IG_NX * j];
#pragma unroll
            for (int i = 0; i < IG_TM; ++i)
#pragma unroll
                for (int j = 0; j < IG_TN; ++j) acc[i][j] = IG_FMA(av[i], bv[j], acc[i][j]);
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if !IG_PREFETCH
        if (r0 + IG_BK < rend) IG_FETCH_NEXT();
#endif
#if IG_BLOCKED
        if (++blk == RED_BLOCK / IG_BK) {
            blk = 0;
            IG_FLUSH(1); /* the block joins tot; acc starts the next block */
        }
#endif
    }
#undef IG_FETCH_NEXT
#if IG_BLOCKED
    IG_FLUSH(0); /* acc = tot + the last block's products */
#undef IG_FLUSH
#endif
#if IG_TC /* lane (g, t) of warp w owns rows g, g + 8 and columns 2t, 2t + 1 of each of its 16 x 8 tiles */
    const int lane = tid & 31, warp = tid >> 5;
    const idx_t mw = m0 + (warp % IG_WM) * IG_WTM + (lane >> 2), nw = n0 + (warp / IG_WM) * IG_WTN + 2 * (lane & 3);
#define IG_OR (2 * IG_MI) /* rows and columns a work-item stores: row 16 i + 8 h, column 8 j + e */
#define IG_OC (2 * IG_NI)
#define IG_ROW(i) (mw + 16 * ((i) >> 1) + 8 * ((i) & 1))
#define IG_COL(j) (nw + 8 * ((j) >> 1) + ((j) & 1))
#define IG_RES(i, j) acc[(i) >> 1][(j) >> 1][2 * ((i) & 1) + ((j) & 1)]
#else
#define IG_OR IG_TM
#define IG_OC IG_TN
#define IG_ROW(i) (m0 + ty + IG_NY * (i))
#define IG_COL(j) (n0 + tx + IG_NX * (j))
#define IG_RES(i, j) acc[i][j]
#endif
    /* Note [OpenCL split stores] (igemm.cl): each row and column decoded once */
    idx_t orow[IG_OR], ocol[IG_OC];
#pragma unroll
    for (int i = 0; i < IG_OR; ++i) orow[i] = IG_ROW(i) < M ? IGN(_orow)(op, IG_ROW(i)) : 0;
#pragma unroll
    for (int j = 0; j < IG_OC; ++j) ocol[j] = IG_COL(j) < NC ? IGN(_ocol)(op, IG_COL(j)) : 0;
#pragma unroll
    for (int i = 0; i < IG_OR; ++i)
#pragma unroll
        for (int j = 0; j < IG_OC; ++j)
            if (IG_ROW(i) < M && IG_COL(j) < NC)
                IGN(_put)(op, out, bias, wsp, orow[i], ocol[j], IG_COL(j), IG_RES(i, j));
#undef IG_OR
#undef IG_OC
#undef IG_ROW
#undef IG_COL
#undef IG_RES
}

#undef IGN
#undef IG_OP
#undef IG_TM_OP
#undef IG_BLOCKED
