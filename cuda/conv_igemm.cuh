/* portconv kernel bodies: implicit GEMM in shared memory for dense convolutions, all three directions.
 *
 * Note [implicit GEMM]: each direction is a GEMM whose operands are gathered from the tensors on the fly
 * (no im2col buffer). Per group g (grid z):
 *   forward      Y[m, n]  = sum_r A[m, r] B[r, n]; m = (n, o) over N*Y, n = k over K/G, r = (c, tap) over C/G*taps
 *   bwd data     dX[m, n] = ...;                   m = (n, i) over N*X, n = c over C/G, r = (k, tap) over K/G*taps
 *   bwd weight   dW[m, n] = ...;                   m = k over K/G, n = (c, tap) over C/G*taps, r = (n, o) over N*Y
 * A block computes a PC_BM x PC_BN tile with 256 threads (16 x 16, PC_BM/16 x PC_BN/16 results each), stepping
 * the reduction PC_BK = 16 at a time through shared memory, with the next step's gathers issued before the
 * current step's products (register double buffering). Every load thread owns one reduction index per
 * step, so the gather index is decoded once per step and shared by its A and B loads. Backward-weight splits
 * its long reduction over grid z (partial sums in a workspace, summed by portconv_split_finalize).
 * Channels-last problems order the reduction channel-innermost so consecutive threads read consecutive
 * addresses. Tensor-core tiles (PC_TENSOR_CORES=1, CUDA only) replace this FMA tile with pc_igemm_tc_run of
 * conv_igemm_tc.cuh (Note [tensor-core implicit GEMM]) over the same Op structs; A and B take the element type
 * they return (pc_acc_t for this tile, raw bits or float for the tensor-core one).
 */
#pragma once

#ifndef PC_BM
#define PC_BM 64
#endif
#ifndef PC_BN
#define PC_BN 64
#endif
#define PC_BK 16
#define PC_NT 256
#define PC_LQ (PC_NT / PC_BK) /* rows (columns) one load pass covers */
#define PC_AJ (PC_BM / PC_LQ)
#define PC_BJ (PC_BN / PC_LQ)
#define PC_TM (PC_BM / 16)
#define PC_TN (PC_BN / 16)

/* One gathered element as V: pc_acc_t (converted by pc_ld), or the raw 16-bit bits of a half type. */
template <class V>
struct pc_gather {
    template <class P>
    static PC_DEVICE V ld(const P *p, pc_idx i) { return pc_ld(p, i); }
};
template <>
struct pc_gather<unsigned short> {
    template <class P>
    static PC_DEVICE unsigned short ld(const P *p, pc_idx i) { return p[i].bits; }
};

/* 0 <= i < n in one unsigned comparison. */
#if PC_INDEX64
PC_DEVICE bool pc_inside(pc_idx i, pc_idx n) { return (unsigned long long)i < (unsigned long long)n; }
#else
PC_DEVICE bool pc_inside(pc_idx i, pc_idx n) { return (unsigned)i < (unsigned)n; }
#endif

/* Shape fields shared by the three problem descriptions. */
struct pc_igemm_base {
    pc_idx Cg, Kg, g, X0, X1, X2, Y0, Y1, Y2, R1, R2, taps;
    pc_idx xs0, xs1, xs2, xs3, xs4, ws0, ws1, ws2, ws3, ws4, ys0, ys1, ys2, ys3, ys4;
    pc_idx S0, S1, S2, P0, P1, P2, D0, D1, D2;
    bool cl, va, vb;
    PC_DEVICE pc_igemm_base(const pc_conv_args &a, pc_idx grp) {
        Cg = (pc_idx)(a.C / a.G), Kg = (pc_idx)(a.K / a.G), g = grp;
        X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
        Y0 = (pc_idx)a.Y[0], Y1 = (pc_idx)a.Y[1], Y2 = (pc_idx)a.Y[2];
        R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2], taps = (pc_idx)a.R[0] * R1 * R2;
        xs0 = (pc_idx)a.xs[0], xs1 = (pc_idx)a.xs[1], xs2 = (pc_idx)a.xs[2], xs3 = (pc_idx)a.xs[3];
        xs4 = (pc_idx)a.xs[4];
        ws0 = (pc_idx)a.ws_[0], ws1 = (pc_idx)a.ws_[1], ws2 = (pc_idx)a.ws_[2], ws3 = (pc_idx)a.ws_[3];
        ws4 = (pc_idx)a.ws_[4];
        ys0 = (pc_idx)a.ys[0], ys1 = (pc_idx)a.ys[1], ys2 = (pc_idx)a.ys[2], ys3 = (pc_idx)a.ys[3];
        ys4 = (pc_idx)a.ys[4];
        S0 = (pc_idx)a.S[0], S1 = (pc_idx)a.S[1], S2 = (pc_idx)a.S[2];
        P0 = (pc_idx)a.P[0], P1 = (pc_idx)a.P[1], P2 = (pc_idx)a.P[2];
        D0 = (pc_idx)a.DL[0], D1 = (pc_idx)a.DL[1], D2 = (pc_idx)a.DL[2];
        cl = (a.flags & PC_FLAG_CL) != 0, va = (a.flags & PC_FLAG_VA) != 0, vb = (a.flags & PC_FLAG_VB) != 0;
    }
    /* (channel, tap) of a reduction/column index over CH*taps: channel-innermost when cl */
    PC_DEVICE void chan_tap(pc_idx r, pc_idx CH, bool chan_inner, pc_idx &ch, pc_idx &r0, pc_idx &r1,
                            pc_idx &r2) const {
        pc_idx tap;
        if (chan_inner) {
            tap = r / CH;
            ch = r - tap * CH;
        } else {
            ch = r / taps;
            tap = r - ch * taps;
        }
        r2 = tap % R2;
        tap /= R2;
        r1 = tap % R1;
        r0 = tap / R1;
    }
};

/* Note [tap-major steps]: when the channel count CH of a reduction over (channel, tap) is a multiple of PC_BK
 * (forward: C/G; phase backward-data: K/G), the kernels run that reduction channel-innermost, r = tap*CH + ch, in
 * any layout. The PC_BK indices of a step then share one tap, so a load thread steps its own (ch, tap digits) by
 * PC_BK with no division (pc_tapstep), and the bounds of its A rows, which depend only on the row and the tap, are
 * tested once per tap into a bit per row (Op::A_ok) instead of once per element. The ops that take it provide
 * fast_ch() / fast_r1() / fast_r2() (the channel count and the radices of the last two tap digits), red_at (a Red from
 * the digits), red_ch (a Red PC_BK channels on, same tap) and A_ok / A_ld (the bounds test and the load of A). Other
 * problems and ops keep the generic per-step decode (Op::red, divisions) and per-element bounds. */
struct pc_tapstep {
    pc_idx ch, t0, t1, t2;
    template <class Op>
    PC_DEVICE pc_tapstep(const Op &op, pc_idx r) {
        pc_idx tap = r / op.fast_ch();
        ch = r - tap * op.fast_ch();
        t2 = tap % op.fast_r2();
        tap /= op.fast_r2();
        t1 = tap % op.fast_r1();
        t0 = tap / op.fast_r1();
    }
    /* r += PC_BK; true when the tap moved (the same step for every thread: ch - rr and CH are multiples of PC_BK) */
    template <class Op>
    PC_DEVICE bool next(const Op &op) {
        ch += PC_BK;
        if (ch < op.fast_ch()) return false;
        ch -= op.fast_ch();
        if (++t2 == op.fast_r2()) {
            t2 = 0;
            if (++t1 == op.fast_r1()) t1 = 0, ++t0;
        }
        return true;
    }
};

template <bool C, class A, class B>
struct pc_if {
    typedef A type;
};
template <class A, class B>
struct pc_if<false, A, B> {
    typedef B type;
};

/* A load thread's reduction position: its Red for the current step, and how it gathers its AJ A rows and BJ B
 * columns as element type V. Generic: a decode per step (Op::red), bounds per element (Op::A). */
template <class Op, bool Fast, int AJ>
struct pc_cursor {
    pc_idx r, rend;
    PC_DEVICE pc_cursor(const Op &, const typename Op::Row *, pc_idx r0, pc_idx rend_, int = 0, int = 0)
        : r(r0), rend(rend_) {}
    PC_DEVICE void next(const Op &, const typename Op::Row *) { r += PC_BK; }
    template <class V, int BJ>
    PC_DEVICE void fetch(const Op &op, const typename Op::Row *rows, const typename Op::Col *cols, V *ra,
                         V *rb) const {
        const typename Op::Red d = op.red(r, rend);
#pragma unroll
        for (int j = 0; j < AJ; ++j) ra[j] = op.template A<V>(rows[j], d);
#pragma unroll
        for (int j = 0; j < BJ; ++j) rb[j] = op.template B<V>(d, cols[j]);
    }
};

/* Note [tap-major steps]: the digits stepped by PC_BK, the Red rebuilt from them, the row bounds once per tap. */
template <class Op, int AJ>
struct pc_cursor<Op, true, AJ> {
    pc_tapstep s;
    typename Op::Red d;
    unsigned ok; /* bit j: A row j is inside the input at this tap */
    PC_DEVICE void rows_ok(const Op &op, const typename Op::Row *rows) {
        ok = 0;
#pragma unroll
        for (int j = 0; j < AJ; ++j) ok |= (unsigned)op.A_ok(rows[j], d) << j;
    }
    PC_DEVICE pc_cursor(const Op &op, const typename Op::Row *rows, pc_idx r0, pc_idx, int = 0, int = 0)
        : s(op, r0), d(op.red_at(s)) {
        rows_ok(op, rows);
    }
    /* the next step; true when the tap moved. Within a tap only the channel moves: the Red's offsets step by PC_BK
     * channels (Op::red_ch) instead of being rebuilt from the digits (~10 integer instructions a step less) */
    PC_DEVICE bool next(const Op &op, const typename Op::Row *rows) {
        const bool moved = s.next(op);
        if (moved) {
            d = op.red_at(s);
            rows_ok(op, rows);
        } else {
            op.red_ch(d);
        }
        return moved;
    }
    template <class V, int BJ>
    PC_DEVICE void fetch(const Op &op, const typename Op::Row *rows, const typename Op::Col *cols, V *ra,
                         V *rb) const {
#pragma unroll
        for (int j = 0; j < AJ; ++j) ra[j] = (ok >> j & 1u) ? op.template A_ld<V>(rows[j], d) : V(0);
#pragma unroll
        for (int j = 0; j < BJ; ++j) rb[j] = op.template B<V>(d, cols[j]);
    }
};

struct pc_igemm_fwd_op : pc_igemm_base {
    const pc_t *x, *w, *b;
    pc_t *y;
    pc_idx bs;
    struct Row { pc_idx xo, i0, i1, i2; bool ok; };
    struct Col { pc_idx wo; bool ok; };
    struct Red { pc_idx xo, wo, d0, d1, d2; bool ok; };
    static constexpr bool vector_b = true; /* Note [vector gathers]: B (W) is contiguous in C when channels-last */
    PC_DEVICE pc_igemm_fwd_op(const pc_conv_args &a, pc_idx grp) : pc_igemm_base(a, grp) {
        x = (const pc_t *)a.x, w = (const pc_t *)a.w, b = (const pc_t *)a.b, y = (pc_t *)a.y, bs = (pc_idx)a.bs;
    }
    /* Note [tap-major steps]: channels C/G, tap digits (r0, r1, r2) */
    PC_DEVICE pc_idx fast_ch() const { return Cg; }
    PC_DEVICE pc_idx fast_r1() const { return R1; }
    PC_DEVICE pc_idx fast_r2() const { return R2; }
    PC_DEVICE Row row(pc_idx m, pc_idx M) const {
        Row t;
        pc_idx n, o0, o1, o2;
        t.ok = m < M;
        pc_unflatten4(t.ok ? m : 0, Y0, Y1, Y2, n, o0, o1, o2);
        t.i0 = o0 * S0 - P0, t.i1 = o1 * S1 - P1, t.i2 = o2 * S2 - P2;
        t.xo = n * xs0 + g * Cg * xs1 + t.i0 * xs2 + t.i1 * xs3 + t.i2 * xs4; /* X offset of tap 0 (may be < 0) */
        if (!t.ok) t.i0 = X0; /* every tap out of range (r.d0 >= 0) */
        return t;
    }
    PC_DEVICE Col col(pc_idx k, pc_idx NC) const {
        Col t;
        t.ok = k < NC;
        t.wo = (g * Kg + (t.ok ? k : 0)) * ws0;
        return t;
    }
    PC_DEVICE Red red(pc_idx r, pc_idx rend) const {
        Red t;
        pc_idx c, r0, r1, r2;
        t.ok = r < rend;
        chan_tap(t.ok ? r : 0, Cg, cl, c, r0, r1, r2);
        t.wo = c * ws1 + r0 * ws2 + r1 * ws3 + r2 * ws4;
        t.d0 = r0 * D0, t.d1 = r1 * D1, t.d2 = r2 * D2;
        t.xo = c * xs1 + t.d0 * xs2 + t.d1 * xs3 + t.d2 * xs4;
        if (!t.ok) t.d0 = X0 + P0; /* out of range for every row (m.i0 >= -P0) */
        return t;
    }
    /* Note [tap-major steps] */
    PC_DEVICE void red_ch(Red &t) const { t.wo += PC_BK * ws1, t.xo += PC_BK * xs1; } /* PC_BK channels on */
    PC_DEVICE Red red_at(const pc_tapstep &s) const {
        Red t;
        t.ok = true;
        t.wo = s.ch * ws1 + s.t0 * ws2 + s.t1 * ws3 + s.t2 * ws4;
        t.d0 = s.t0 * D0, t.d1 = s.t1 * D1, t.d2 = s.t2 * D2;
        t.xo = s.ch * xs1 + t.d0 * xs2 + t.d1 * xs3 + t.d2 * xs4;
        return t;
    }
    PC_DEVICE bool A_ok(const Row &m, const Red &r) const {
        /* !m.ok and !r.ok were folded into i0 (row() and red()) */
        return pc_inside(m.i0 + r.d0, X0) && pc_inside(m.i1 + r.d1, X1) && pc_inside(m.i2 + r.d2, X2);
    }
    PC_DEVICE const pc_t *A_src() const { return x; } /* Note [vector gathers]: A's tensor and offsets, B's */
    PC_DEVICE pc_idx A_off(const Row &m, const Red &r) const { return m.xo + r.xo; }
    PC_DEVICE pc_idx B_off(const Red &r, const Col &n) const { return n.wo + r.wo; }
    template <class V = pc_acc_t>
    PC_DEVICE V A_ld(const Row &m, const Red &r) const { return pc_gather<V>::ld(x, A_off(m, r)); }
    template <class V = pc_acc_t>
    PC_DEVICE V A(const Row &m, const Red &r) const { return A_ok(m, r) ? A_ld<V>(m, r) : V(0); }
    template <class V = pc_acc_t>
    PC_DEVICE V B(const Red &r, const Col &n) const {
        return (r.ok && n.ok) ? pc_gather<V>::ld(w, B_off(r, n)) : V(0);
    }
    PC_DEVICE pc_idx out_row(pc_idx m) const { /* Note [split stores] */
        pc_idx n, o0, o1, o2;
        pc_unflatten4(m, Y0, Y1, Y2, n, o0, o1, o2);
        return n * ys0 + o0 * ys2 + o1 * ys3 + o2 * ys4;
    }
    PC_DEVICE pc_idx out_col(pc_idx k) const { return (g * Kg + k) * ys1; }
    PC_DEVICE void put(pc_idx orow, pc_idx ocol, pc_idx k, pc_acc_t v) const {
        if (b) v += pc_ld(b, (g * Kg + k) * bs);
        pc_st(y, orow + ocol, v);
    }
};

struct pc_igemm_bwd_data_op : pc_igemm_base {
    const pc_t *dy, *w, *b;
    pc_t *dx;
    pc_idx bs;
    struct Row { pc_idx yo, t0, t1, t2; bool ok; };
    struct Col { pc_idx wo; bool ok; };
    struct Red { pc_idx yo, wo, d0, d1, d2; bool ok; };
    PC_DEVICE pc_igemm_bwd_data_op(const pc_conv_args &a, pc_idx grp) : pc_igemm_base(a, grp) {
        dy = (const pc_t *)a.y, w = (const pc_t *)a.w, b = (const pc_t *)a.b, dx = (pc_t *)a.x, bs = (pc_idx)a.bs;
    }
    PC_DEVICE Row row(pc_idx m, pc_idx M) const {
        Row t;
        pc_idx n, i0, i1, i2;
        t.ok = m < M;
        pc_unflatten4(t.ok ? m : 0, X0, X1, X2, n, i0, i1, i2);
        t.yo = n * ys0 + g * Kg * ys1;
        t.t0 = i0 + P0, t.t1 = i1 + P1, t.t2 = i2 + P2;
        return t;
    }
    PC_DEVICE Col col(pc_idx c, pc_idx NC) const {
        Col t;
        t.ok = c < NC;
        t.wo = g * Kg * ws0 + (t.ok ? c : 0) * ws1;
        return t;
    }
    PC_DEVICE Red red(pc_idx r, pc_idx rend) const {
        Red t;
        pc_idx k, r0, r1, r2;
        t.ok = r < rend;
        chan_tap(t.ok ? r : 0, Kg, cl, k, r0, r1, r2);
        t.yo = k * ys1, t.wo = k * ws0 + r0 * ws2 + r1 * ws3 + r2 * ws4;
        t.d0 = r0 * D0, t.d1 = r1 * D1, t.d2 = r2 * D2;
        return t;
    }
    PC_DEVICE static bool out_of(pc_idx t, pc_idx S, pc_idx O, pc_idx &o) {
        if (t < 0) return false;
        if (S == 1) {
            o = t;
        } else {
            o = t / S;
            if (o * S != t) return false;
        }
        return o < O;
    }
    template <class V = pc_acc_t>
    PC_DEVICE V A(const Row &m, const Red &r) const {
        pc_idx o0, o1, o2;
        if (!(m.ok && r.ok) || !out_of(m.t0 - r.d0, S0, Y0, o0) || !out_of(m.t1 - r.d1, S1, Y1, o1) ||
            !out_of(m.t2 - r.d2, S2, Y2, o2))
            return V(0);
        return pc_gather<V>::ld(dy, m.yo + r.yo + o0 * ys2 + o1 * ys3 + o2 * ys4);
    }
    template <class V = pc_acc_t>
    PC_DEVICE V B(const Red &r, const Col &n) const {
        return (r.ok && n.ok) ? pc_gather<V>::ld(w, n.wo + r.wo) : V(0);
    }
    PC_DEVICE pc_idx out_row(pc_idx m) const { /* Note [split stores] */
        pc_idx n, i0, i1, i2;
        pc_unflatten4(m, X0, X1, X2, n, i0, i1, i2);
        return n * xs0 + i0 * xs2 + i1 * xs3 + i2 * xs4;
    }
    PC_DEVICE pc_idx out_col(pc_idx c) const { return (g * Cg + c) * xs1; }
    PC_DEVICE void put(pc_idx orow, pc_idx ocol, pc_idx c, pc_acc_t v) const {
        if (b) v += pc_ld(b, (g * Cg + c) * bs);
        pc_st(dx, orow + ocol, v);
    }
};

struct pc_igemm_bwd_weight_op : pc_igemm_base {
    const pc_t *x, *dy;
    pc_t *dw;
    pc_acc_t *ws;
    pc_idx split, splits, count;
    bool tn; /* Note [TN tiles] (conv_igemm_tc.cuh): columns channel-innermost, (tap, c) */
    struct Row { pc_idx yo; bool ok; };
    struct Col { pc_idx xo, d0, d1, d2; bool ok; };
    struct Red { pc_idx yo, xo, b0, b1, b2; bool ok; };
    PC_DEVICE pc_igemm_bwd_weight_op(const pc_conv_args &a, pc_idx grp, pc_idx s) : pc_igemm_base(a, grp) {
        x = (const pc_t *)a.x, dy = (const pc_t *)a.y, dw = (pc_t *)a.w, ws = (pc_acc_t *)a.ws;
        split = s, splits = (pc_idx)a.splits, count = (pc_idx)a.K * Cg * taps;
        tn = va && vb;
    }
    PC_DEVICE Row row(pc_idx k, pc_idx M) const {
        Row t;
        t.ok = k < M;
        t.yo = (g * Kg + (t.ok ? k : 0)) * ys1;
        return t;
    }
    PC_DEVICE Col col(pc_idx n, pc_idx NC) const {
        Col t;
        pc_idx c, r0, r1, r2;
        t.ok = n < NC;
        chan_tap(t.ok ? n : 0, Cg, tn, c, r0, r1, r2);
        t.d0 = r0 * D0 - P0, t.d1 = r1 * D1 - P1, t.d2 = r2 * D2 - P2;
        t.xo = (g * Cg + c) * xs1 + t.d0 * xs2 + t.d1 * xs3 + t.d2 * xs4;
        if (!t.ok) t.d0 = X0; /* out of range for every position (r.b0 >= 0) */
        return t;
    }
    PC_DEVICE Red red(pc_idx r, pc_idx rend) const {
        pc_idx n, o0, o1, o2;
        pc_unflatten4(r < rend ? r : 0, Y0, Y1, Y2, n, o0, o1, o2);
        return red_at(n, o0, o1, o2, r < rend);
    }
    /* the Red of position (n, o0, o1, o2) of the reduction; ok: inside the block's range */
    PC_DEVICE Red red_at(pc_idx n, pc_idx o0, pc_idx o1, pc_idx o2, bool ok) const {
        Red t;
        t.ok = ok;
        t.b0 = o0 * S0, t.b1 = o1 * S1, t.b2 = o2 * S2;
        t.yo = n * ys0 + o0 * ys2 + o1 * ys3 + o2 * ys4, t.xo = n * xs0 + t.b0 * xs2 + t.b1 * xs3 + t.b2 * xs4;
        if (!t.ok) t.b0 = X0 + P0; /* out of range for every column (n.d0 >= -P0) */
        return t;
    }
    PC_DEVICE bool A_in(const Row &m, const Red &r) const { return m.ok && r.ok; }
    PC_DEVICE pc_idx A_off(const Row &m, const Red &r) const { return m.yo + r.yo; }
    PC_DEVICE bool B_in(const Red &r, const Col &n) const {
        /* !r.ok and !n.ok were folded into b0 / d0 (red_at() and col()) */
        return pc_inside(r.b0 + n.d0, X0) && pc_inside(r.b1 + n.d1, X1) && pc_inside(r.b2 + n.d2, X2);
    }
    PC_DEVICE pc_idx B_off(const Red &r, const Col &n) const { return n.xo + r.xo; }
    template <class V = pc_acc_t>
    PC_DEVICE V A(const Row &m, const Red &r) const {
        return A_in(m, r) ? pc_gather<V>::ld(dy, A_off(m, r)) : V(0);
    }
    template <class V = pc_acc_t>
    PC_DEVICE V B(const Red &r, const Col &n) const {
        return B_in(r, n) ? pc_gather<V>::ld(x, B_off(r, n)) : V(0);
    }
    PC_DEVICE pc_idx out_row(pc_idx k) const { /* Note [split stores]; split: the workspace's partial sums */
        const pc_idx kk = g * Kg + k;
        return splits > 1 ? split * count + kk * Cg * taps : kk * ws0;
    }
    PC_DEVICE pc_idx out_col(pc_idx n) const { /* the workspace keeps W's (c, tap) order whatever the columns' */
        if (splits > 1 && !tn) return n;
        pc_idx c, r0, r1, r2;
        chan_tap(n, Cg, tn, c, r0, r1, r2);
        return splits > 1 ? c * taps + (r0 * R1 + r1) * R2 + r2 : c * ws1 + r0 * ws2 + r1 * ws3 + r2 * ws4;
    }
    PC_DEVICE void put(pc_idx orow, pc_idx ocol, pc_idx, pc_acc_t v) const {
        if (splits > 1)
            ws[orow + ocol] = v;
        else
            pc_st(dw, orow + ocol, v);
    }
};

/* Note [bwd-data phases]: with dilation 1, dX position i (per axis) receives tap r only when (i + P - r) % S == 0.
 * The generic bwd-data gather tests that per product (a division per axis, and S^d - 1 of every S^d products are
 * zeros). Here grid z = groups x S0*S1*S2 phases q: a block's rows are the positions i = q + S*e of one phase,
 * its reduction runs over (k, j) with tap r = rq + S*j, rq = (q + P) mod S, and the dY index is o = e + c - j with
 * c = (q + P - rq) / S: no division, no zero terms. An axis with stride 1 is the one-phase case and may have any
 * dilation: r = j, o = i + P - j*D (H = D below; H = 1 on strided axes, which need dilation 1). Positions of a
 * phase no tap reaches (no j) get 0 (+ bias). The host picks it for igemm-tc plans whose every axis has stride 1
 * or dilation 1 (the HIP set and the FMA-tile plans keep the generic bwd-data kernel). */
struct pc_igemm_bwd_data_phase_op : pc_igemm_base {
    const pc_t *dy, *w, *b;
    pc_t *dx;
    pc_idx bs, E0, E1, E2, T0, T1, T2, H0, H1, H2, tp, tpd, q0, q1, q2, rq0, rq1, rq2, c0, c1, c2;
    struct Row { pc_idx yo, a0, a1, a2; bool ok; };
    struct Col { pc_idx wo; bool ok; };
    struct Red { pc_idx yo, wo, j0, j1, j2; bool ok; };
    static constexpr bool vector_b = true; /* Note [vector gathers]: B (W) along K, contiguous once staged */
    PC_DEVICE static void axis(pc_idx X, pc_idx R, pc_idx S, pc_idx P, pc_idx q, pc_idx &E, pc_idx &T, pc_idx &rq,
                               pc_idx &c) {
        E = q < X ? (X - q + S - 1) / S : 0;
        rq = (q + P) % S;
        T = rq < R ? (R - rq + S - 1) / S : 0;
        c = (q + P - rq) / S;
    }
    PC_DEVICE pc_igemm_bwd_data_phase_op(const pc_conv_args &a, pc_idx grp, pc_idx phase) : pc_igemm_base(a, grp) {
        dy = (const pc_t *)a.y, w = (const pc_t *)a.w, b = (const pc_t *)a.b, dx = (pc_t *)a.x, bs = (pc_idx)a.bs;
        q2 = phase % S2, q1 = (phase / S2) % S1, q0 = phase / (S2 * S1);
        axis(X0, (pc_idx)a.R[0], S0, P0, q0, E0, T0, rq0, c0);
        axis(X1, R1, S1, P1, q1, E1, T1, rq1, c1);
        axis(X2, R2, S2, P2, q2, E2, T2, rq2, c2);
        tp = T0 * T1 * T2;
        H0 = S0 == 1 ? D0 : 1, H1 = S1 == 1 ? D1 : 1, H2 = S2 == 1 ? D2 : 1;
        tpd = tp ? tp : 1, T1 = T1 ? T1 : 1, T2 = T2 ? T2 : 1; /* divisors of red(); tp == 0: no reduction runs */
    }
    /* Note [tap-major steps]: channels K/G, the phase's tap digits (j0, j1, j2) */
    PC_DEVICE pc_idx fast_ch() const { return Kg; }
    PC_DEVICE pc_idx fast_r1() const { return T1; }
    PC_DEVICE pc_idx fast_r2() const { return T2; }
    PC_DEVICE Row row(pc_idx m, pc_idx M) const {
        Row t;
        pc_idx n, e0, e1, e2;
        t.ok = m < M;
        pc_unflatten4(t.ok ? m : 0, E0, E1, E2, n, e0, e1, e2);
        t.a0 = e0 + c0, t.a1 = e1 + c1, t.a2 = e2 + c2;
        t.yo = n * ys0 + g * Kg * ys1 + t.a0 * ys2 + t.a1 * ys3 + t.a2 * ys4;
        if (!t.ok) t.a0 = Y0 + T0 * H0; /* out of range for every tap (r.j0 < T0 * H0) */
        return t;
    }
    PC_DEVICE Col col(pc_idx c, pc_idx NC) const {
        Col t;
        t.ok = c < NC;
        t.wo = g * Kg * ws0 + (t.ok ? c : 0) * ws1;
        return t;
    }
    PC_DEVICE Red red(pc_idx r, pc_idx rend) const {
        Red t;
        pc_idx k, j;
        t.ok = r < rend;
        const pc_idx rr = t.ok ? r : 0;
        if (cl) {
            j = rr / Kg;
            k = rr - j * Kg;
        } else {
            k = rr / tpd;
            j = rr - k * tpd;
        }
        t.j2 = j % T2;
        j /= T2;
        t.j1 = j % T1;
        t.j0 = j / T1;
        t.wo = k * ws0 + (rq0 + S0 * t.j0) * ws2 + (rq1 + S1 * t.j1) * ws3 + (rq2 + S2 * t.j2) * ws4;
        t.j0 *= H0, t.j1 *= H1, t.j2 *= H2; /* from here on: dY steps */
        t.yo = k * ys1 - t.j0 * ys2 - t.j1 * ys3 - t.j2 * ys4;
        if (!t.ok) t.j0 = -Y0; /* out of range for every row (m.a0 >= 0) */
        return t;
    }
    /* Note [tap-major steps]: channel k innermost, then the phase's tap digits j */
    PC_DEVICE void red_ch(Red &t) const { t.wo += PC_BK * ws0, t.yo += PC_BK * ys1; } /* PC_BK channels on */
    PC_DEVICE Red red_at(const pc_tapstep &s) const {
        Red t;
        t.ok = true;
        t.wo = s.ch * ws0 + (rq0 + S0 * s.t0) * ws2 + (rq1 + S1 * s.t1) * ws3 + (rq2 + S2 * s.t2) * ws4;
        t.j0 = s.t0 * H0, t.j1 = s.t1 * H1, t.j2 = s.t2 * H2;
        t.yo = s.ch * ys1 - t.j0 * ys2 - t.j1 * ys3 - t.j2 * ys4;
        return t;
    }
    PC_DEVICE bool A_ok(const Row &m, const Red &r) const {
        /* !m.ok and !r.ok were folded into a0 / j0 (row() and red()) */
        return pc_inside(m.a0 - r.j0, Y0) && pc_inside(m.a1 - r.j1, Y1) && pc_inside(m.a2 - r.j2, Y2);
    }
    PC_DEVICE const pc_t *A_src() const { return dy; } /* Note [vector gathers] */
    PC_DEVICE pc_idx A_off(const Row &m, const Red &r) const { return m.yo + r.yo; }
    PC_DEVICE pc_idx B_off(const Red &r, const Col &n) const { return n.wo + r.wo; }
    template <class V = pc_acc_t>
    PC_DEVICE V A_ld(const Row &m, const Red &r) const { return pc_gather<V>::ld(dy, A_off(m, r)); }
    template <class V = pc_acc_t>
    PC_DEVICE V A(const Row &m, const Red &r) const { return A_ok(m, r) ? A_ld<V>(m, r) : V(0); }
    template <class V = pc_acc_t>
    PC_DEVICE V B(const Red &r, const Col &n) const {
        return (r.ok && n.ok) ? pc_gather<V>::ld(w, n.wo + r.wo) : V(0);
    }
    PC_DEVICE pc_idx out_row(pc_idx m) const { /* Note [split stores] */
        pc_idx n, e0, e1, e2;
        pc_unflatten4(m, E0, E1, E2, n, e0, e1, e2);
        return n * xs0 + (q0 + S0 * e0) * xs2 + (q1 + S1 * e1) * xs3 + (q2 + S2 * e2) * xs4;
    }
    PC_DEVICE pc_idx out_col(pc_idx c) const { return (g * Cg + c) * xs1; }
    PC_DEVICE void put(pc_idx orow, pc_idx ocol, pc_idx c, pc_acc_t v) const {
        if (b) v += pc_ld(b, (g * Cg + c) * bs);
        pc_st(dx, orow + ocol, v);
    }
};


/* Note [split stores]: an op stores result (m, n) at out_row(m) + out_col(n) (put adds the bias of column n). The
 * tensor-core epilogue decodes each of a thread's rows and columns once, where one decode per element (four divisions
 * for a position) cost as much as the whole main loop of a 576-long reduction (Nsight Compute, resnet50-l1-3x3-bf16-cl
 * forward); the FMA tile, whose results are a 4 x 4 grid of rows and columns, decodes per element. */
struct pc_igemm_smem {
    pc_acc_t A[PC_BK][PC_BM + 1], B[PC_BK][PC_BN + 1];
};
PC_DEVICE pc_igemm_smem &pc_igemm_shared() {
    PC_SHARED pc_igemm_smem s;
    return s;
}

template <class Op, int Mode> /* Mode 1: tap-major steps (Note [tap-major steps]); 0 and 2: generic steps */
PC_DEVICE void pc_igemm_run(const Op &op, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
    auto &As = pc_igemm_shared().A;
    auto &Bs = pc_igemm_shared().B;
    const int tid = (int)threadIdx.x, rr = tid % PC_BK, lq = tid / PC_BK;
    const int tx = tid % 16, ty = tid / 16;
    const pc_idx m0 = (pc_idx)blockIdx.x * PC_BM, n0 = (pc_idx)blockIdx.y * PC_BN;
    typename Op::Row rows[PC_AJ];
    typename Op::Col cols[PC_BJ];
#pragma unroll
    for (int j = 0; j < PC_AJ; ++j) rows[j] = op.row(m0 + lq + PC_LQ * j, M);
#pragma unroll
    for (int j = 0; j < PC_BJ; ++j) cols[j] = op.col(n0 + lq + PC_LQ * j, NC);
    pc_acc_t ra[PC_AJ], rb[PC_BJ], acc[PC_TM][PC_TN];
#pragma unroll
    for (int i = 0; i < PC_TM; ++i)
#pragma unroll
        for (int j = 0; j < PC_TN; ++j) acc[i][j] = 0;
    pc_cursor<Op, Mode == 1, PC_AJ> cur(op, rows, rbeg + rr, rend);
    if (rbeg < rend) cur.template fetch<pc_acc_t, PC_BJ>(op, rows, cols, ra, rb);
    for (pc_idx r0 = rbeg; r0 < rend; r0 += PC_BK) {
#pragma unroll
        for (int j = 0; j < PC_AJ; ++j) As[rr][lq + PC_LQ * j] = ra[j];
#pragma unroll
        for (int j = 0; j < PC_BJ; ++j) Bs[rr][lq + PC_LQ * j] = rb[j];
        PC_BARRIER();
        if (r0 + PC_BK < rend) {
            cur.next(op, rows);
            cur.template fetch<pc_acc_t, PC_BJ>(op, rows, cols, ra, rb);
        }
#pragma unroll
        for (int kk = 0; kk < PC_BK; ++kk) {
            pc_acc_t av[PC_TM], bv[PC_TN];
#pragma unroll
            for (int i = 0; i < PC_TM; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < PC_TN; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < PC_TM; ++i)
#pragma unroll
                for (int j = 0; j < PC_TN; ++j) acc[i][j] += av[i] * bv[j];
        }
        PC_BARRIER();
    }
#pragma unroll
    for (int i = 0; i < PC_TM; ++i) {
        const pc_idx m = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < PC_TN; ++j) {
            const pc_idx n = n0 + tx + 16 * j;
            if (m < M && n < NC) op.put(op.out_row(m), op.out_col(n), n, acc[i][j]);
        }
    }
}

#if PC_TENSOR_CORES
#include "conv_igemm_tc.cuh"
#define pc_igemm_main pc_igemm_tc_run
#define PC_IGEMM_BM PC_TC_BM
#define PC_IGEMM_LB PC_NT, PC_TC_MINB /* launch bounds: threads, blocks per SM */
#define PC_IGEMM_MLANE 1                   /* Note [M-lane gathers] */
#define PC_IGEMM_VEC PC_TC_VEC             /* Note [vector gathers] */
#else
#define pc_igemm_main pc_igemm_run
#define PC_IGEMM_BM PC_BM
#define PC_IGEMM_LB PC_NT
#define PC_IGEMM_MLANE 0
#define PC_IGEMM_VEC 0
#endif

/* The run mode of a problem whose reduction channel count is a multiple of PC_BK (fast) or not: tap-major steps
 * with reduction lanes for channels-last, with M-lane A gathers for other layouts on the tensor-core tile; generic
 * steps otherwise (Note [tap-major steps]; NCHW under tap-major steps without M lanes gathers sixteen channels a
 * warp, measured slower than the generic tap-innermost order). */
template <class Op>
PC_DEVICE void pc_igemm_go(const Op &op, bool fast, bool vfast, pc_idx M, pc_idx NC, pc_idx rbeg, pc_idx rend) {
#if PC_IGEMM_VEC /* Note [vector gathers]: A (and B where the op allows it) read 16 bytes at a time */
    if constexpr (Op::vector_b) {
        if (vfast && op.va && op.vb) return pc_igemm_main<Op, 4>(op, M, NC, rbeg, rend);
    }
    if (vfast && op.va) return pc_igemm_main<Op, 3>(op, M, NC, rbeg, rend);
#endif
    if (fast && op.cl)
        pc_igemm_main<Op, 1>(op, M, NC, rbeg, rend);
#if PC_IGEMM_MLANE
    else if (fast)
        pc_igemm_main<Op, 2>(op, M, NC, rbeg, rend);
#endif
    else
        pc_igemm_main<Op, 0>(op, M, NC, rbeg, rend);
}

/* The forward GEMM of op (pc_igemm_fwd_op, or pc_igemm_col_op of Note [narrow backward-data]) over N*Y positions. */
template <class Op>
PC_DEVICE void pc_igemm_fwd_go(const Op &op, const pc_conv_args &a) {
    const pc_idx M = (pc_idx)a.N * op.Y0 * op.Y1 * op.Y2;
    /* Note [tap-major steps]: not for taps along the depth axis or reductions over 8192 long, where channel-inner
     * steps reach an input line again only after more data than L1 holds (measured: r3d18-l1-3d float32 1.33x and
     * deeplabv3-aspp-d12 1.05x-1.07x slower under them; 2-D rows up to 512 x 9 and 1024 x 1 faster) */
    pc_igemm_go(op, op.Cg % PC_BK == 0 && op.taps == op.R1 * op.R2 && op.Cg * op.taps <= 8192, op.Cg % PC_BK == 0, M,
                op.Kg, 0, op.Cg * op.taps);
}

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_igemm_fwd)
PC_KERNEL void PC_LAUNCH_BOUNDS(PC_IGEMM_LB) portconv_igemm_fwd(const pc_conv_args a) {
    pc_igemm_fwd_go(pc_igemm_fwd_op(a, (pc_idx)blockIdx.z), a);
}
#endif

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_igemm_bwd_data)
PC_KERNEL void PC_LAUNCH_BOUNDS(PC_IGEMM_LB) portconv_igemm_bwd_data(const pc_conv_args a) {
    const pc_igemm_bwd_data_op op(a, (pc_idx)blockIdx.z);
    pc_igemm_main<pc_igemm_bwd_data_op, 0>(op, (pc_idx)a.N * op.X0 * op.X1 * op.X2, op.Cg, 0, op.Kg * op.taps);
}
#endif

/* Grid z = groups * splits; split s reduces positions [s*chunk, (s+1)*chunk) of N*Y0*Y1*Y2. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_igemm_bwd_weight)
PC_KERNEL void PC_LAUNCH_BOUNDS(PC_IGEMM_LB) portconv_igemm_bwd_weight(const pc_conv_args a) {
    const pc_idx splits = (pc_idx)a.splits, z = (pc_idx)blockIdx.z;
    const pc_igemm_bwd_weight_op op(a, z / splits, z % splits);
    pc_idx lo, hi;
    pc_split_range((pc_idx)a.N * op.Y0 * op.Y1 * op.Y2, (pc_idx)a.chunk, z % splits, lo, hi);
#if PC_TENSOR_CORES
    if (op.tn) return pc_igemm_tc_tn(op, op.Kg, op.Cg * op.taps, lo, hi); /* Note [TN tiles] */
#endif
    pc_igemm_main<pc_igemm_bwd_weight_op, 0>(op, op.Kg, op.Cg * op.taps, lo, hi);
}
#endif

/* Grid z = groups * S0*S1*S2 phases; grid x covers the largest phase (phase 0), smaller ones exit early. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_igemm_bwd_data_phase)
PC_KERNEL void PC_LAUNCH_BOUNDS(PC_IGEMM_LB) portconv_igemm_bwd_data_phase(const pc_conv_args a) {
    const pc_idx phases = (pc_idx)(a.S[0] * a.S[1] * a.S[2]), z = (pc_idx)blockIdx.z;
    const pc_igemm_bwd_data_phase_op op(a, z / phases, z % phases);
    const pc_idx M = (pc_idx)a.N * op.E0 * op.E1 * op.E2;
    if ((pc_idx)blockIdx.x * PC_IGEMM_BM >= M) return;
    /* Note [tap-major steps]: not for stride-1 phases of several taps in NCHW, where the weight gather along k
     * (C*taps apart) costs more than the steps save (measured: resnet50-l3-3x3, r3d18-l1-3d, deeplabv3-aspp-d12) */
    pc_igemm_go(op, op.Kg % PC_BK == 0 && (op.cl || phases > 1 || op.tp == 1), op.Kg % PC_BK == 0, M, op.Cg, 0,
                op.Kg * op.tp);
}
#endif

/* Note [channels-last staging]: the tensor-core tile's vector modes (conv_igemm_tc.cuh) need A's reduction channels
 * contiguous, and B's (W's C for the forward, W's K for phase backward-data); its TN tile needs the weight gradient's
 * X and dY channel-contiguous (Note [TN tiles]). For a dense NCHW operand the host first copies it, once per call,
 * into a workspace in that order with this batched transpose of raw elements, src [B][R][Q] (dense) -> dst [B][Q][R]
 * (x = src, y = dst, N = B, C = R, K = Q): X or dY [N][C][positions] -> [N][positions][C]; W [K][C][taps] ->
 * [K][taps][C] (forward) or [1][K][C taps] -> [C taps][K] (backward-data). cuDNN's NCHW convolutions do the same (its
 * nchwToNhwcKernel runs before the implicit GEMM). 32 x 32 tiles through shared memory: both sides coalesced. Here,
 * not in the tensor-core header, so that the CPU emulation of the bodies (tests/emu.py) runs the staged host path. */
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_stage_transpose)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_stage_transpose(const pc_conv_args a) {
    PC_SHARED pc_t tile[32][33];
    const pc_t *src = (const pc_t *)a.x;
    pc_t *dst = (pc_t *)a.y;
    const long long R = a.C, Q = a.K, b = blockIdx.z, q0 = 32LL * blockIdx.x, r0 = 32LL * blockIdx.y;
    const int tx = (int)threadIdx.x % 32, ty = (int)threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
        const long long r = r0 + ty + k, q = q0 + tx;
        if (r < R && q < Q) tile[ty + k][tx] = src[(b * R + r) * Q + q];
    }
    PC_BARRIER();
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
        const long long q = q0 + ty + k, r = r0 + tx;
        if (q < Q && r < R) dst[(b * Q + q) * R + r] = tile[tx][ty + k];
    }
}
#endif

/* Note [narrow backward-data]: backward-data's GEMM has dX's C/G channels as its columns, and with few of them (C_in
 * = 1 or 3: speech front ends, RGB stems) the tensor-core tiles spend 75%-94% of every mma on padding columns and
 * the element gathers of dY cost per row what a full tile would (deepbench-speech-c1 took 4.2x cuDNN's time). For one
 * group, C <= NARROW_C and every axis of stride 1 or dilation 1 (simt/igemm.py narrow_col), the host runs
 * it in two steps instead (Caffe's col2im backward):
 *   1. col[n, j, o] = sum over k of dY[n, k, o] W[k, j], j = (c, tap) in W's memory order: a 1 x 1 forward of dY
 *      by W read as a (C taps) x K matrix (portconv_igemm_col: the forward op on the usual tiles, its results stored
 *      to col, dense [N][C taps][Y0 Y1 Y2] in the accumulator type, a workspace);
 *   2. dX[n, c, i] = sum over taps r with i = o S - P + r D of col[n, (c, r), o] (+ bias): this kernel, a thread an
 *      element of dX (consecutive threads along its last axis), summed in the accumulator type. On an axis with
 *      dilation 1 the taps that reach i are r = (i + P) mod S + S k, o stepping down by 1; with stride 1, r = k, o
 *      stepping down by D (pc_col_axis): no division inside the loops. PC_FLAG_COLTAP: j = tap * C + c (W
 *      channels-last), else j = c * taps + tap.
 * Every dX element is written (0 + bias where no tap reaches it); col is read once, written once. */
struct pc_igemm_col_op : pc_igemm_fwd_op { /* the forward op whose put stores to col (a.ws) */
    pc_acc_t *cbuf;
    PC_DEVICE explicit pc_igemm_col_op(const pc_conv_args &a) : pc_igemm_fwd_op(a, 0), cbuf((pc_acc_t *)a.ws) {}
    PC_DEVICE void put(pc_idx orow, pc_idx ocol, pc_idx, pc_acc_t v) const { cbuf[orow + ocol] = v; }
};
#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_igemm_col)
PC_KERNEL void PC_LAUNCH_BOUNDS(PC_IGEMM_LB) portconv_igemm_col(const pc_conv_args a) {
    pc_igemm_fwd_go(pc_igemm_col_op(a), a);
}
#endif

struct pc_col_axis { /* the taps of one axis that reach position i: r = r0 + dr k, o = o0 - dO k, k < n */
    pc_idx r, o, dr, dO, n;
    PC_DEVICE pc_col_axis(pc_idx i, pc_idx R, pc_idx S, pc_idx P, pc_idx D, pc_idx Y) {
        const pc_idx t = i + P;
        dr = D == 1 ? S : 1, dO = D == 1 ? 1 : D;
        r = D == 1 ? t % S : 0;
        o = (t - r * D) / S;
        if (o >= Y) { /* the first taps land past the end of Y */
            const pc_idx k = (o - Y + dO) / dO;
            r += k * dr, o -= k * dO;
        }
        const pc_idx nr = (R - 1 - r) / dr, no = o / dO;
        n = r < R && o >= 0 ? (nr < no ? nr : no) + 1 : 0;
    }
};

#if !defined(PC_ONLY) || defined(PC_ONLY_portconv_col2im)
PC_KERNEL void PC_LAUNCH_BOUNDS(256) portconv_col2im(const pc_conv_args a) {
    const pc_acc_t *PC_RESTRICT col = (const pc_acc_t *)a.ws;
    const pc_t *b = (const pc_t *)a.b;
    pc_t *dx = (pc_t *)a.x;
    const pc_idx C = (pc_idx)a.C, X0 = (pc_idx)a.X[0], X1 = (pc_idx)a.X[1], X2 = (pc_idx)a.X[2];
    const pc_idx R1 = (pc_idx)a.R[1], R2 = (pc_idx)a.R[2], taps = (pc_idx)a.R[0] * R1 * R2;
    const pc_idx ys1 = (pc_idx)a.ys[1], ys2 = (pc_idx)a.ys[2], ys3 = (pc_idx)a.ys[3], ys4 = (pc_idx)a.ys[4];
    const bool tapmajor = (a.flags & PC_FLAG_COLTAP) != 0;
    const pc_idx js = (tapmajor ? C : 1) * ys1; /* col offset of one tap on */
    const pc_idx total = (pc_idx)a.N * C * X0 * X1 * X2;
    for (pc_idx e = pc_global_id(); e < total; e += pc_grid_stride()) {
        pc_idx n, c, i0, i1, i2;
        pc_unflatten5(e, C, X0, X1, X2, false, n, c, i0, i1, i2);
        const pc_col_axis a0(i0, (pc_idx)a.R[0], (pc_idx)a.S[0], (pc_idx)a.P[0], (pc_idx)a.DL[0], (pc_idx)a.Y[0]);
        const pc_col_axis a1(i1, R1, (pc_idx)a.S[1], (pc_idx)a.P[1], (pc_idx)a.DL[1], (pc_idx)a.Y[1]);
        const pc_col_axis a2(i2, R2, (pc_idx)a.S[2], (pc_idx)a.P[2], (pc_idx)a.DL[2], (pc_idx)a.Y[2]);
        const pc_idx base = n * (pc_idx)a.ys[0] + (tapmajor ? c : c * taps) * ys1, step2 = a2.dr * js - a2.dO * ys4;
        pc_acc_t acc = b ? pc_ld(b, c * (pc_idx)a.bs) : (pc_acc_t)0;
        for (pc_idx k0 = 0; k0 < a0.n; ++k0) {
            const pc_idx r0 = a0.r + a0.dr * k0, o0 = a0.o - a0.dO * k0;
            for (pc_idx k1 = 0; k1 < a1.n; ++k1) {
                const pc_idx r1 = a1.r + a1.dr * k1, o1 = a1.o - a1.dO * k1;
                pc_idx off = base + ((r0 * R1 + r1) * R2 + a2.r) * js + o0 * ys2 + o1 * ys3 + a2.o * ys4;
                for (pc_idx k2 = 0; k2 < a2.n; ++k2, off += step2) acc += col[off];
            }
        }
        pc_st(dx, n * (pc_idx)a.xs[0] + c * (pc_idx)a.xs[1] + i0 * (pc_idx)a.xs[2] + i1 * (pc_idx)a.xs[3] +
                      i2 * (pc_idx)a.xs[4],
              acc);
    }
}
#endif
