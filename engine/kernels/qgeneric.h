/*
 * qgeneric.h - the integer block products of qdot.h, written once over a
 * level's 16-lane primitives (lane = weight row of a packed group). A level
 * file defines the primitives and QK_T, QK_FN, then includes this file,
 * which defines QK_FN (a qk_groups_fn).
 *
 * Types the including file defines (any representation):
 *   qb   64 bytes: 16 lanes of 4 bytes (a quad vector, qdot.h)
 *   qi   16 int32 lanes;  qf  16 float lanes
 *   qs   a quad vector of signed bytes, prepared for qi_dots
 * Primitives (static inline):
 *   qb qb_load(const uint8_t *p)            64 bytes, 64-byte aligned
 *   qb qb_lo4(qb v), qb_hi4(qb v)           v & 15, v >> 4 per byte
 *   qb qb_or(qb a, qb b)
 *   qb qb_field(qb v, int shift, int n, int to)   ((v >> shift) & (2^n - 1)) << to
 *                                           per byte; shift + n <= 8, n + to <= 8
 *   qs qs_bytes(qb v)                       v's bytes as signed values
 *   qs qs_levels(qb v)                      qk_iq4_levels[v] (v < 16 per byte)
 *   qi qi_dot(qi acc, qb u, const int8_t *x)   acc + sum_i u[4l + i] x[i] for
 *                                           each lane l (u < 64 per byte)
 *   qi qi_dots(qi acc, qs w, const int8_t *x)  the same for signed w; the
 *                                           lanes may hold a level's own
 *                                           partial form until
 *   qi qi_dots_end(qi acc, int32_t xsum)    the true sums of the qi_dots since
 *                                           qi_zero(), whose activations sum to xsum
 *   qi qi_zero(void), qi_set1(int32_t), qi_add(a, b), qi_mul(a, b) (low 32 bits),
 *      qi_sub1(qi a, int32_t s) (a - s), qi_load_u8(p), qi_load_i8(p) (16 bytes
 *      widened), qi_lo4(qi), qi_hi4(qi) (v & 15, v >> 4 of each lane's low byte)
 *   qf qf_cvt(qi), qf_load_f16(const uint8_t *p) (16 halves), qf_set1(float),
 *      qf_mul(a, b), qf_add(a, b), qf_sub(a, b), qf_zero(void)
 *   void qf_store(float *p, qf v, int n)    the first n lanes
 * Optional, QK_SCALE16 (q4_K's and q5_K's mins two units at a time,
 * qk_mins_s16):
 *   qw   16 lanes of two int16
 *   qw qw_pair_u8(const uint8_t *p, const uint8_t *q)   lane l = (p[l], q[l])
 *   qi qi_madd_x2(qi acc, qw w, int32_t x0, int32_t x1)  acc + w.lo x0 + w.hi x1
 *                                           (x0, x1 within int16)
 * and with QK_DOT16 too (their unit scales in the widening, qk_unit_s16):
 *   qw qw_dup_u8(const uint8_t *p)          lane l = (p[l], p[l])
 *   qi qi_madd_qh(qi acc, qh h, qw w)       acc + h.lo w.lo + h.hi w.hi per lane
 * Every step below is one of qdot.h's, in its order, so any level's
 * primitives give the same bits.
 */
#include <string.h>

/* A level may define QK_INLINE itself before including this file (scalar.c
 * does: forcing every step inline there unrolls 64-lane arrays into a
 * megabyte of code and minutes of compile time). */
#ifndef QK_INLINE
#define QK_INLINE static inline __attribute__((always_inline))
#endif

QK_INLINE int qk_bs(const int type) {
    switch (type) {
    case CART_Q2_K: case CART_Q3_K: case CART_Q4_K: case CART_Q5_K: case CART_Q6_K: case CART_IQ4_XS:
        return 256;
    default:
        return 32;
    }
}

/* The 8 quad vectors of unit s of a block whose quant vectors start at q
 * (units: the block's units), as unsigned fields. */
QK_INLINE void qk_unit(const int type, const uint8_t *q, const int units, const int s, qb w[8]) {
    const int bits = qk_field_bits(type);
    if (bits >= 4) {
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const qb n = qb_load(q + 256 * s + 64 * p);
            w[p] = qb_lo4(n);
            w[p + 4] = qb_hi4(n);
        }
        if (bits == 5) {
            const qb h = qb_load(q + 256 * units + 64 * s);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) w[g] = qb_or(w[g], qb_field(h, g, 1, 4));
        } else if (bits == 6) {
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                const qb h = qb_load(q + 256 * units + 128 * s + 64 * half);
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++)
                    w[4 * half + g] = qb_or(w[4 * half + g], qb_field(h, 2 * g, 2, 4));
            }
        }
        return;
    }
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) { /* 2- and 3-bit: the low two bits */
        const qb l = qb_load(q + 128 * s + 64 * half);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) w[4 * half + g] = qb_field(l, 2 * g, 2, 0);
    }
    if (bits == 3) {
        const qb h = qb_load(q + 128 * units + 64 * s);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) w[g] = qb_or(w[g], qb_field(h, g, 1, 2));
    }
}

/* Each token's sum over quads [g0, g1) of the unit of u (or, signed, w)
 * times its activations x[t], for NT tokens. Several chains per token
 * (quad g goes to chain g % QK_CH(NT), the chains added at the end: integer
 * sums, so the same value) and the tokens interleaved, so that no product
 * waits on the one before it. */
#define QK_CH(NT) ((NT) == 1 ? 4 : 2)

/* The quads whose products a level with 16-bit partial sums (QK_DOT16) may
 * add before widening, for fields of `bits` bits: each 16-bit lane gets
 * two products per quad, |u x| <= (2^bits - 1) * 127 each (activations lie
 * in [-127, 127]), so a run of r quads stays within 2 r (2^bits - 1) 127:
 * 30480 for 4 bits (8 quads), 31496 for 5 (4), 32004 for 6 (2). */
#define QK_RUN(bits) ((bits) <= 4 ? 8 : (bits) == 5 ? 4 : 2)

#ifdef QK_DOT16
/* qk_dot with 16-bit partial sums (qh_dot) over runs of QK_RUN(bits) quads,
 * each widened into the 32-bit sum (qi_add_qh): exact, so the same sums. */
QK_INLINE void qk_dot_bits(const int NT, const int bits, qi *d, const qb *u, const int8_t *const *x,
                           const int g0, const int g1) {
    const int run = QK_RUN(bits);
    for (int t = 0; t < NT; t++) d[t] = qi_zero();
#pragma GCC unroll 8
    for (int g = g0; g < g1; g += run) {
        qh h[QK_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) h[t] = qh_zero();
        const int end = g + run < g1 ? g + run : g1;
#pragma GCC unroll 8
        for (int k = g; k < end; k++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) h[t] = qh_dot(h[t], u[k], x[t] + 4 * k);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) d[t] = qi_add_qh(d[t], h[t]);
    }
}
#define qk_dot(NT, d, u, x, g0, g1) qk_dot_bits(NT, bits, d, u, x, g0, g1)
#else
#define qk_dot(NT, d, u, x, g0, g1) qk_dot32(NT, d, u, x, g0, g1)
#endif

QK_INLINE void qk_dot32(const int NT, qi *d, const qb *u, const int8_t *const *x, const int g0, const int g1) {
    qi c[4][QK_T];
    for (int k = 0; k < QK_CH(NT); k++)
        for (int t = 0; t < NT; t++) c[k][t] = qi_zero();
#pragma GCC unroll 8
    for (int g = g0; g < g1; g++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) c[(g - g0) % QK_CH(NT)][t] = qi_dot(c[(g - g0) % QK_CH(NT)][t], u[g], x[t] + 4 * g);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        d[t] = c[0][t];
        for (int k = 1; k < QK_CH(NT) && k < g1 - g0; k++) d[t] = qi_add(d[t], c[k][t]);
    }
}

/* The same for signed weights over a whole unit; xsum[t]: the sum of
 * token t's 32 activations (qi_dots_end). */
QK_INLINE void qk_dots(const int NT, qi *d, const qs *w, const int8_t *const *x, const int32_t *xsum) {
    qi c[4][QK_T];
    for (int k = 0; k < QK_CH(NT); k++)
        for (int t = 0; t < NT; t++) c[k][t] = qi_zero();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) c[g % QK_CH(NT)][t] = qi_dots(c[g % QK_CH(NT)][t], w[g], x[t] + 4 * g);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        qi sum = c[0][t];
        for (int k = 1; k < QK_CH(NT); k++) sum = qi_add(sum, c[k][t]);
        d[t] = qi_dots_end(sum, xsum[t]);
    }
}

/* The same block of the next group (its bytes lie one group_bytes on),
 * requested while this one computes: a decode step reads every group once,
 * from DRAM. A hint only; past the last group it touches nothing. */
#define QK_PREFETCH(p, n)                                                                                    \
    do {                                                                                                     \
        for (int64_t pf = 0; pf < (int64_t)(n); pf += 64) __builtin_prefetch((p) + pf, 0, 3);               \
    } while (0)

/* Part k of `parts` of the same (whole lines; the last part takes the
 * rest), to be requested at step k of a block's work: the misses then
 * overlap its sums, where a whole block's lines at once stall on a full
 * miss queue (measured: 16-token q4_K products on AMX). */
/* Only the tiles of a group's last QK_PF_TOKENS tokens request the next
 * group: in a long GEMM the earlier tiles' requests only repeat them
 * (measured at avx2, one thread, 512 tokens: q4_K GEMM 140-170 -> 148-181
 * GOP/s without them), and a decode step of up to 16 tokens keeps them all. */
#define QK_PF_TOKENS 16

#define QK_PREFETCH_PART(p, n, k, parts)                                                                     \
    do {                                                                                                     \
        const int64_t per_ = ((int64_t)(n) / (parts) + 63) / 64 * 64, lo_ = per_ * (k);                     \
        const int64_t hi_ = (k) == (parts) - 1 || lo_ + per_ > (int64_t)(n) ? (int64_t)(n) : lo_ + per_;    \
        for (int64_t pf = lo_; pf < hi_; pf += 64) __builtin_prefetch((p) + pf, 0, 3);                      \
    } while (0)

/* ---- blocks of 32 --------------------------------------------------------- */

/* The steps of one 32-block after its products, for NT tokens: d[t] = the
 * sum over the block of the stored field (q4_0, q5_0: before the offset) or,
 * q8_0 and iq4_nl, of the signed value times token t's activations; at[t]:
 * the index of the token's activation block, xs[t] its sum. */
QK_INLINE void qk_block_end_32(const int type, const int NT, const uint8_t *s, const qk_act *a,
                               const int64_t *at, const int32_t *xs, const qi *dots, qf *acc) {
    const int with_m = type == CART_Q4_1 || type == CART_Q5_1;
    const int32_t off = type == CART_Q4_0 ? 8 : type == CART_Q5_0 ? 16 : 0;
    const qf dw = qf_load_f16(s);
    const qf mw = with_m ? qf_load_f16(s + 32) : qf_zero();
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        qi d = dots[t];
        if (off) d = qi_sub1(d, off * xs[t]);
        const qf p = qf_mul(qf_cvt(d), qf_mul(dw, qf_set1(a->d[at[t]])));
        if (with_m) acc[t] = qf_add(acc[t], qf_add(p, qf_mul(mw, qf_set1(a->sf[at[t]]))));
        else acc[t] = qf_add(acc[t], p);
    }
}

QK_INLINE void qk_tile_32(const int type, const int NT, const qk_src *w, const uint8_t *grp, const qk_act *a,
                          int64_t t0, int pf, qf *acc) {
    const int64_t nb = w->nb, cols = w->cols;
    const uint8_t *sc = grp + nb * w->qbytes;
    const int signed_w = type == CART_Q8_0 || type == CART_IQ4_NL;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = grp + b * w->qbytes, *s = sc + b * w->sbytes;
        /* (not for q8_0 at one token, whose plain stream of loads the
         * hardware prefetcher already keeps ahead of: measured faster) */
        if (pf && (type != CART_Q8_0 || NT > 1)) QK_PREFETCH(q + w->group_bytes, w->qbytes);
        const int8_t *x[QK_T];
        int32_t xs[QK_T];
        int64_t at[QK_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            at[t] = (t0 + t) * (cols / 32) + b;
            x[t] = a->q + (t0 + t) * cols + 32 * b;
            xs[t] = a->s[at[t]];
        }
        qi d[QK_T];
        if (signed_w) {
            qs ws[8];
            if (type == CART_Q8_0) {
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) ws[g] = qs_bytes(qb_load(q + 64 * g));
            } else {
                qb u[8];
                qk_unit(type, q, 1, 0, u);
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) ws[g] = qs_levels(u[g]);
            }
            qk_dots(NT, d, ws, x, xs);
        } else {
            qb u[8];
            const int bits = qk_field_bits(type);
            qk_unit(type, q, 1, 0, u);
            qk_dot(NT, d, u, x, 0, 8);
            (void)bits;
        }
        qk_block_end_32(type, NT, s, a, at, xs, d, acc);
    }
}

/* ---- blocks of 256 ---------------------------------------------------------- */

/* The integer steps of unit j (32 elements) of a K block after its
 * products, for NT tokens: d[t] = the sum over the unit of the stored field
 * (iq4_xs: the signed level) times token t's activations (q6_K q3_K q2_K:
 * over quads 0-3, and d1[t] over quads 4-7); bs[t]: the token's two sums of
 * 16 for the unit. Adds to A (and B). */
QK_INLINE void qk_unit_scale_256(const int type, const int NT, const uint8_t *s, const int j,
                                 const int32_t *const *bs, const qi *d, const qi *d1, qi *A, qi *B) {
    if (type == CART_IQ4_XS) {
        const qi sc = qi_load_i8(s + 32 + 16 * j);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) A[t] = qi_add(A[t], qi_mul(sc, d[t]));
    } else if (type == CART_Q4_K || type == CART_Q5_K) {
        const qi sc = qi_load_u8(s + 64 + 16 * j), mn = qi_load_u8(s + 192 + 16 * j);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            A[t] = qi_add(A[t], qi_mul(sc, d[t]));
            B[t] = qi_add(B[t], qi_mul(mn, qi_set1(bs[t][0] + bs[t][1])));
        }
    } else {
        const int base = type == CART_Q2_K ? 64 : 32;
        const qi r0 = type == CART_Q2_K ? qi_load_u8(s + base + 32 * j) : qi_load_i8(s + base + 32 * j);
        const qi r1 = type == CART_Q2_K ? qi_load_u8(s + base + 32 * j + 16) : qi_load_i8(s + base + 32 * j + 16);
        const qi sc0 = type == CART_Q2_K ? qi_lo4(r0) : r0, sc1 = type == CART_Q2_K ? qi_lo4(r1) : r1;
        const int32_t off = type == CART_Q6_K ? 32 : type == CART_Q3_K ? 4 : 0;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            qi d0 = d[t], e1 = d1[t];
            if (off) {
                d0 = qi_sub1(d0, off * bs[t][0]);
                e1 = qi_sub1(e1, off * bs[t][1]);
            }
            A[t] = qi_add(qi_add(A[t], qi_mul(sc0, d0)), qi_mul(sc1, e1));
            if (type == CART_Q2_K)
                B[t] = qi_add(qi_add(B[t], qi_mul(qi_hi4(r0), qi_set1(bs[t][0]))), qi_mul(qi_hi4(r1), qi_set1(bs[t][1])));
        }
    }
}

/* The float steps at the end of block b, for NT tokens from t0. */
QK_INLINE void qk_block_end_256(const int type, const int NT, const uint8_t *s, const qk_act *a, int64_t t0,
                                int64_t b, const qi *A, const qi *B, qf *acc) {
    const int mins = type == CART_Q4_K || type == CART_Q5_K || type == CART_Q2_K;
    const qf dw = qf_load_f16(s);
    const qf dm = mins ? qf_load_f16(s + 32) : qf_zero();
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        const qf xd = qf_set1(a->d[(t0 + t) * (a->cols / 256) + b]);
        acc[t] = qf_add(acc[t], qf_mul(qf_cvt(A[t]), qf_mul(dw, xd)));
        if (mins) acc[t] = qf_sub(acc[t], qf_mul(qf_cvt(B[t]), qf_mul(dm, xd)));
    }
}

/* One unit (32 elements) of a K block for NT tokens: adds to A (and B). */
QK_INLINE void qk_unit_256(const int type, const int NT, const uint8_t *q, const uint8_t *s, const int j,
                           const qk_act *a, int64_t t0, int64_t e0, qi *A, qi *B) {
    const int64_t cols = a->cols;
    const int8_t *x[QK_T];
    const int32_t *bs[QK_T];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        x[t] = a->q + (t0 + t) * cols + e0;
        bs[t] = a->s + (t0 + t) * (cols / 16) + e0 / 16;
    }
    qb u[8];
    const int bits = qk_field_bits(type);
    qk_unit(type, q, 8, j, u);
    qi d[QK_T], d1[QK_T];
    (void)bits;
    if (type == CART_IQ4_XS) {
        qs ws[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) ws[g] = qs_levels(u[g]);
        int32_t xs[QK_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) xs[t] = bs[t][0] + bs[t][1];
        qk_dots(NT, d, ws, x, xs);
    } else if (type == CART_Q4_K || type == CART_Q5_K) {
        qk_dot(NT, d, u, x, 0, 8);
    } else { /* q6_K q3_K q2_K: two sub-blocks of 16, quads 0-3 and 4-7 */
        qk_dot(NT, d, u, x, 0, 4);
        qk_dot(NT, d1, u, x, 4, 8);
    }
    qk_unit_scale_256(type, NT, s, j, bs, d, d1, A, B);
}

#ifdef QK_SCALE16
/* q4_K, q5_K: unit j of block b for NT tokens from t0, added to A. With
 * 16-bit partial sums (QK_DOT16) each run's sums widen by the unit's scale
 * in one multiply-add (|h| <= 32004, scales < 64); else the unit's 32-bit
 * sums are multiplied by it. The same integer sums as qk_unit_256's. */
QK_INLINE void qk_unit_s16(const int type, const int NT, const uint8_t *q, const uint8_t *s, const int j,
                           const qk_act *a, int64_t t0, int64_t e0, qi *A) {
    qb u[8];
    qk_unit(type, q, 8, j, u);
    const int8_t *x[QK_T];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) x[t] = a->q + (t0 + t) * a->cols + e0;
#ifndef QK_DOT16
    qi d[QK_T];
    qk_dot32(NT, d, u, x, 0, 8);
    const qi sc = qi_load_u8(s + 64 + 16 * j);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) A[t] = qi_add(A[t], qi_mul(sc, d[t]));
#else
    const int run = QK_RUN(qk_field_bits(type));
    const qw sc = qw_dup_u8(s + 64 + 16 * j);
#pragma GCC unroll 2
    for (int g = 0; g < 8; g += run) {
        qh h[QK_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) h[t] = qh_zero();
#pragma GCC unroll 8
        for (int i = g; i < g + run; i++) {
            const int k = (i >> 1) + 4 * (i & 1); /* quads 0 4 1 5 ...: each load's two halves together */
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) h[t] = qh_dot(h[t], u[k], x[t] + 4 * k);
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) A[t] = qi_madd_qh(A[t], h[t], sc);
    }
#endif
}

/* q4_K, q5_K: the mins term of the block of 256 from element e0, two
 * units at a time in one multiply-add (a unit's activations sum to at most
 * 32 * 127 in magnitude), added to B. */
QK_INLINE void qk_mins_s16(const int NT, const uint8_t *s, const qk_act *a, int64_t t0, int64_t e0, qi *B) {
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
        const qw mn = qw_pair_u8(s + 192 + 16 * j, s + 208 + 16 * j);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int32_t *bs = a->s + (t0 + t) * (a->cols / 16) + e0 / 16 + 2 * j;
            B[t] = qi_madd_x2(B[t], mn, bs[0] + bs[1], bs[2] + bs[3]);
        }
    }
}
#endif

QK_INLINE void qk_tile_256(const int type, const int NT, const qk_src *w, const uint8_t *grp, const qk_act *a,
                           int64_t t0, int pf, qf *acc) {
    const int64_t nb = w->nb;
    const uint8_t *sc = grp + nb * w->qbytes;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = grp + b * w->qbytes, *s = sc + b * w->sbytes;
        if (pf) QK_PREFETCH(s + w->group_bytes, w->sbytes);
        qi A[QK_T], B[QK_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) A[t] = B[t] = qi_zero();
        for (int j = 0; j < 8; j++) {
            if (pf) QK_PREFETCH_PART(q + w->group_bytes, w->qbytes, j, 8);
#ifdef QK_SCALE16
            if (type == CART_Q4_K || type == CART_Q5_K) {
                qk_unit_s16(type, NT, q, s, j, a, t0, 256 * b + 32 * j, A);
                continue;
            }
#endif
            qk_unit_256(type, NT, q, s, j, a, t0, 256 * b + 32 * j, A, B);
        }
#ifdef QK_SCALE16
        if (type == CART_Q4_K || type == CART_Q5_K) qk_mins_s16(NT, s, a, t0, 256 * b, B);
#endif
        qk_block_end_256(type, NT, s, a, t0, b, A, B, acc);
    }
}

/* ---- the entry ------------------------------------------------------------ */

/* NT tokens from t of one group: their outputs stored. */
QK_INLINE void qk_tile(const int type, const int NT, const qk_src *w, const uint8_t *grp, const qk_act *a,
                       int64_t t, int pf, float *y, int64_t ldy, int64_t r0, int nr) {
    qf acc[QK_T];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) acc[i] = qf_zero();
    if (qk_bs(type) == 256) qk_tile_256(type, NT, w, grp, a, t, pf, acc);
    else qk_tile_32(type, NT, w, grp, a, t, pf, acc);
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) qf_store(y + (t + i) * ldy + r0, acc[i], nr);
}

#if QK_T != 2 && QK_T != 4
#error "qgeneric.h: QK_T must be 2 or 4"
#endif

QK_INLINE void qk_type(const int type, const qk_src *w, const qk_act *a, int64_t t0, int64_t t1,
                       int64_t g0, int64_t g1, float *y, int64_t ldy) {
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *grp = w->data + (uint64_t)g * w->group_bytes;
        const int64_t r0 = g * QK_ROWS;
        const int nr = (int)(w->rows - r0 < QK_ROWS ? w->rows - r0 : QK_ROWS);
        int64_t t = t0;
        for (; t + QK_T <= t1; t += QK_T) qk_tile(type, QK_T, w, grp, a, t, t1 - t <= QK_PF_TOKENS, y, ldy, r0, nr);
        if (QK_T > 3 && t1 - t == 3) qk_tile(type, QK_T > 3 ? 3 : 1, w, grp, a, t, 1, y, ldy, r0, nr);
        else if (QK_T > 2 && t1 - t == 2) qk_tile(type, QK_T > 2 ? 2 : 1, w, grp, a, t, 1, y, ldy, r0, nr);
        else if (t1 - t == 1) qk_tile(type, 1, w, grp, a, t, 1, y, ldy, r0, nr);
    }
}

/* Calls F(TYPE, ...) with TYPE the constant for `dtype`, for every
 * qk_supported type (nothing for another), so that F is specialized per
 * type. */
#define QK_DISPATCH(dtype, F, ...)                                                                           \
    do {                                                                                                     \
        switch (dtype) {                                                                                     \
        case CART_Q4_0: F(CART_Q4_0, __VA_ARGS__); break;                                                    \
        case CART_Q4_1: F(CART_Q4_1, __VA_ARGS__); break;                                                    \
        case CART_Q5_0: F(CART_Q5_0, __VA_ARGS__); break;                                                    \
        case CART_Q5_1: F(CART_Q5_1, __VA_ARGS__); break;                                                    \
        case CART_Q8_0: F(CART_Q8_0, __VA_ARGS__); break;                                                    \
        case CART_IQ4_NL: F(CART_IQ4_NL, __VA_ARGS__); break;                                                \
        case CART_Q2_K: F(CART_Q2_K, __VA_ARGS__); break;                                                    \
        case CART_Q3_K: F(CART_Q3_K, __VA_ARGS__); break;                                                    \
        case CART_Q4_K: F(CART_Q4_K, __VA_ARGS__); break;                                                    \
        case CART_Q5_K: F(CART_Q5_K, __VA_ARGS__); break;                                                    \
        case CART_Q6_K: F(CART_Q6_K, __VA_ARGS__); break;                                                    \
        case CART_IQ4_XS: F(CART_IQ4_XS, __VA_ARGS__); break;                                                \
        default: break;                                                                                      \
        }                                                                                                    \
    } while (0)

static void QK_FN(const qk_src *w, const qk_act *a, int64_t t0, int64_t t1, int64_t g0, int64_t g1,
                  float *y, int64_t ldy) {
    QK_DISPATCH(w->dtype, qk_type, w, a, t0, t1, g0, g1, y, ldy);
}
