/*
 * amx.c - the x86-64 AMX level: the avx512vnni level's table with the
 * integer block products of whole tiles of 16 tokens on AMX-INT8's tile
 * products (Intel Sapphire Rapids and later). Compiled with AMX enabled;
 * cpu.c runs it only on a CPU that has AMX-TILE and AMX-INT8 and whose
 * kernel granted this process the tile state (arch_prctl).
 *
 * A tile product C[16 tokens][16 rows] += A[16 tokens][kb bytes] . B[kb/4]
 * [64 bytes] reads B in the packed layout's own order: row k of B is the
 * quad vector QV(k) (qdot.h), 16 weight rows of 4 elements. So a unit's 8
 * quad vectors, unpacked to bytes once per block into L1, are one B tile
 * (kb = 32), or two of 4 (kb = 16: the sub-blocks of 16 of q6_K, q3_K,
 * q2_K), and the activations of 16 tokens are A at a stride of the row.
 * Unsigned fields go through tdpbsud (signed activations times unsigned
 * weights), signed ones (q8_0, iq4_nl, iq4_xs levels) through tdpbssd. The
 * int32 sums are exact, so they are the sums qgeneric.h's qk_dot and
 * qk_dots give; everything after them is qgeneric.h's own code
 * (qk_unit_scale_256, qk_block_end_256, qk_block_end_32), so this level
 * gives the same bits as every other. Tokens past the last whole tile of 16
 * go to the vpdpbusd kernel, and so do q3_K and q2_K below 64 tokens
 * (measured slower on tiles there). q4_K and q5_K from 32 tokens on, q6_K
 * from 64, fold their sub-block scales into the weights (amx_fold,
 * amx_fold6), which leaves no integer multiply per unit and token after
 * the products.
 */
#include "kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "dtype.h"

#define QK_VNNI 1
#include "qk_avx512.h"
#define QK_T 4
#define QK_FN qk_groups_vnni
#include "qgeneric.h"

enum {
    AMX_TOK = 16,   /* tokens per tile */
    AMX_SPAN = 256, /* tokens whose accumulators one pass over a group keeps (16 KiB) */
};

typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-3: C (16 tokens x 16 int32); 4 and 5: A (16 tokens x kb
 * bytes); 6 and 7: B (kb / 4 quad vectors). Four products in flight, each
 * with its own sum, and loads for the next while one multiplies. */
static void amx_config(int kb) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) {
        c.rows[i] = AMX_TOK;
        c.colsb[i] = 64;
    }
    for (int i = 4; i < 6; i++) {
        c.rows[i] = AMX_TOK;
        c.colsb[i] = (uint16_t)kb;
        c.rows[i + 2] = (uint8_t)(kb / 4);
        c.colsb[i + 2] = 64;
    }
    _tile_loadconfig(&c);
}

/* C tile c += A tile ta (loaded from x, rows `stride` bytes apart) times B
 * tile tb (loaded from quad vectors w); tile numbers are literals (GCC's
 * intrinsics paste them into the instruction). */
#define AMX_STEP(c, ta, tb, SIGNED, x, stride, w)                                                            \
    do {                                                                                                     \
        _tile_loadd(ta, (x), (stride));                                                                      \
        _tile_loadd(tb, (w), 64);                                                                            \
        if (SIGNED) _tile_dpbssd(c, ta, tb);                                                                 \
        else _tile_dpbsud(c, ta, tb);                                                                        \
    } while (0)

/* Up to four products, C tile k from x[k] and w[k] (k < n), stored to
 * out[k] (16 x 16 int32 each). */
QK_INLINE void amx_four(const int SIGNED, const int n, const int8_t *const *x, int64_t stride,
                        const uint8_t *const *w, int32_t (*const *out)[16]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    AMX_STEP(0, 4, 6, SIGNED, x[0], stride, w[0]);
    if (n > 1) AMX_STEP(1, 5, 7, SIGNED, x[1], stride, w[1]);
    if (n > 2) AMX_STEP(2, 4, 6, SIGNED, x[2], stride, w[2]);
    if (n > 3) AMX_STEP(3, 5, 7, SIGNED, x[3], stride, w[3]);
    _tile_stored(0, out[0], 64);
    if (n > 1) _tile_stored(1, out[1], 64);
    if (n > 2) _tile_stored(2, out[2], 64);
    if (n > 3) _tile_stored(3, out[3], 64);
}

QK_INLINE int amx_signed(const int type) {
    return type == CART_Q8_0 || type == CART_IQ4_NL || type == CART_IQ4_XS;
}

/* Two tile products per unit, over its quads 0-3 and 4-7 (kb = 16). */
QK_INLINE int amx_halves(const int type) {
    return type == CART_Q6_K || type == CART_Q3_K || type == CART_Q2_K;
}

/* The units of a block at q as the bytes a B tile reads: wb[unit][8][64],
 * the signed value for the signed types, the stored field otherwise.
 * q8_0's packed bytes are that already and are read in place. Returns
 * where unit 0's vectors lie. */
QK_INLINE const uint8_t *amx_unpack(const int type, const uint8_t *q, const int units, uint8_t *wb) {
    if (type == CART_Q8_0) return q;
    const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)qk_iq4_levels));
    for (int j = 0; j < units; j++) {
        qb u[8];
        qk_unit(type, q, units, j, u);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const qb v = type == CART_IQ4_NL || type == CART_IQ4_XS ? _mm512_shuffle_epi8(levels, u[g]) : u[g];
            _mm512_store_si512((void *)(wb + 512 * j + 64 * g), v);
        }
    }
    return wb;
}

/* The unit sums of 16 tokens (activations from x, rows `cols` bytes apart)
 * with a block's 8 unpacked units wb: cb[j][0] over unit j (q6_K q3_K
 * q2_K: its quads 0-3, and cb[j][1] over quads 4-7). */
QK_INLINE void amx_units(const int type, const int8_t *x, int64_t cols, const uint8_t *wb,
                         int32_t (*cb)[2][AMX_TOK][16]) {
    const int8_t *xs[4];
    const uint8_t *ws[4];
    int32_t(*out[4])[16];
    for (int j0 = 0; j0 < 8; j0 += amx_halves(type) ? 2 : 4) {
        for (int k = 0; k < 4; k++) {
            const int j = amx_halves(type) ? j0 + k / 2 : j0 + k, h = amx_halves(type) ? k % 2 : 0;
            xs[k] = x + 32 * j + 16 * h;
            ws[k] = wb + 512 * j + 256 * h;
            out[k] = cb[j][h];
        }
        amx_four(amx_signed(type), 4, xs, cols, ws, out);
    }
}

/* q4_K and q5_K's B for one token: the sum over units j of min_j times the
 * token's activation sum over the unit, as 16-bit pair products
 * (vpmaddwd: a min is below 64, a unit's sum within 32 * 127), exact, so
 * qk_unit_scale_256's sum. mp[p]: lane r holds min_2p and min_2p+1 of row r
 * as two int16; us: the token's 8 unit sums for the block (qk_act's u),
 * read as 4 such pairs. */
QK_INLINE qi amx_mins(const __m512i *mp, const int16_t *us) {
    qi B = qi_zero();
    for (int p = 0; p < 4; p++) {
        int32_t pair;
        memcpy(&pair, us + 2 * p, 4);
        B = _mm512_add_epi32(B, _mm512_madd_epi16(mp[p], _mm512_set1_epi32(pair)));
    }
    return B;
}

/* acc[t] for tokens [t0, t0 + nt) (nt a multiple of 16, at most AMX_SPAN)
 * of one group of a K type: qk_tile_256's steps, with the unit sums of 16
 * tokens at a time from the tiles. */
QK_INLINE void amx_group_256(const int type, const qk_src *w, const qk_act *a, const uint8_t *grp, int64_t t0,
                             int64_t nt, float (*acc)[16]) {
    const int64_t nb = w->nb, cols = a->cols;
    const int kmin = type == CART_Q4_K || type == CART_Q5_K;
    const uint8_t *sc = grp + nb * w->qbytes;
    _Alignas(64) uint8_t wbuf[8 * 512];
    _Alignas(64) int32_t cb[8][2][AMX_TOK][16];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = grp + b * w->qbytes, *s = sc + b * w->sbytes;
        QK_PREFETCH(s + w->group_bytes, w->sbytes);
        const uint8_t *wb = amx_unpack(type, q, 8, wbuf);
        __m512i mp[4], scale[8];
        if (kmin)
            for (int p = 0; p < 4; p++) {
                mp[p] = _mm512_or_si512(qi_load_u8(s + 192 + 32 * p),
                                        _mm512_slli_epi32(qi_load_u8(s + 192 + 32 * p + 16), 16));
                scale[2 * p] = qi_load_u8(s + 64 + 32 * p);
                scale[2 * p + 1] = qi_load_u8(s + 64 + 32 * p + 16);
            }
        for (int64_t tt = 0; tt < nt; tt += AMX_TOK) {
            amx_units(type, a->q + (t0 + tt) * cols + 256 * b, cols, wb, cb);
            for (int tc = 0; tc < AMX_TOK; tc += 4) {
                const int64_t t = t0 + tt + tc;
                if (tt == 0) QK_PREFETCH_PART(q + w->group_bytes, w->qbytes, tc / 4, 4);
                qi A[4], B[4];
                for (int i = 0; i < 4; i++) A[i] = B[i] = qi_zero();
                if (kmin) {
                    for (int i = 0; i < 4; i++) {
                        for (int j = 0; j < 8; j++)
                            A[i] = qi_add(A[i], qi_mul(scale[j], _mm512_load_si512((const void *)cb[j][0][tc + i])));
                        B[i] = amx_mins(mp, a->u + (t + i) * (cols / 32) + 8 * b);
                    }
                } else {
                    for (int j = 0; j < 8; j++) {
                        const int32_t *bs[4];
                        qi d[4], d1[4];
                        for (int i = 0; i < 4; i++) {
                            bs[i] = a->s + (t + i) * (cols / 16) + 16 * b + 2 * j;
                            d[i] = _mm512_load_si512((const void *)cb[j][0][tc + i]);
                            d1[i] = amx_halves(type) ? _mm512_load_si512((const void *)cb[j][1][tc + i]) : d[i];
                        }
                        qk_unit_scale_256(type, 4, s, j, bs, d, d1, A, B);
                    }
                }
                qf f[4];
                for (int i = 0; i < 4; i++) f[i] = _mm512_load_ps(acc[tt + tc + i]);
                qk_block_end_256(type, 4, s, a, t, b, A, B, f);
                for (int i = 0; i < 4; i++) _mm512_store_ps(acc[tt + tc + i], f[i]);
            }
        }
    }
}

/* q4_K and q5_K from 32 tokens on: the sub-block scales go into the
 * weights, so that the tile unit adds the whole block. A scale (6 bits) is
 * 8 hi + lo, and field times lo or hi stays a byte (31 x 7 = 217), so two
 * products over the block's 256 elements, C_lo = sum x (u lo) and C_hi =
 * sum x (u hi), give A = C_lo + 8 C_hi: the same integer as qgeneric.h's
 * sum over units of scale times unit sum (exact in int32: at most 256 x
 * 127 x 217 each). wk[half][64 quad vectors]: half 0 the fields times lo,
 * 1 times hi, in the order of the block's 4 steps of depth 64. */
QK_INLINE void amx_fold(const int type, const uint8_t *q, const uint8_t *s, uint8_t (*wk)[64][64]) {
    const __m512i even = _mm512_set1_epi16(0x00ff);
    for (int j = 0; j < 8; j++) {
        qb u[8];
        qk_unit(type, q, 8, j, u);
        const __m512i sc = qi_load_u8(s + 64 + 16 * j);
        const __m512i part[2] = {_mm512_and_si512(sc, _mm512_set1_epi32(7)), _mm512_srli_epi32(sc, 3)};
        for (int h = 0; h < 2; h++) {
            const __m512i m = _mm512_or_si512(part[h], _mm512_slli_epi32(part[h], 16));
            for (int g = 0; g < 8; g++) {
                const __m512i lo = _mm512_mullo_epi16(_mm512_and_si512(u[g], even), m);
                const __m512i hi = _mm512_mullo_epi16(_mm512_srli_epi16(u[g], 8), m);
                _mm512_store_si512((void *)wk[h][8 * j + g], _mm512_or_si512(lo, _mm512_slli_epi16(hi, 8)));
            }
        }
    }
}

/* q6_K from 64 tokens on: its sub-block scales go into the weights too, in
 * four pieces. A scale s (int8) is s0 + 4 s1 + 16 s2 + 64 s3, with s0..s2
 * its 2-bit fields and s3 = s >> 6 (in [-2, 1]), and the centred field
 * u - 32 (in [-32, 31]) times a piece stays a signed byte (at most 96 in
 * magnitude). Four products over the block's 256 elements, P_k = sum x
 * ((u - 32) s_k), give A = P0 + 4 P1 + 16 P2 + 64 P3, the same integer as
 * qgeneric.h's sum over sub-blocks of s times (d - 32 x-sum), exact in
 * int32 (|64 P3| <= 64 x 256 x 127 x 64). wk[k][64 quad vectors]: piece
 * k, in the order of the block's 4 steps of depth 64. */
QK_INLINE void amx_fold6(const uint8_t *q, const uint8_t *s, uint8_t (*wk)[64][64]) {
    const __m512i c32 = _mm512_set1_epi8(32), low = _mm512_set1_epi16(0x00ff);
    for (int j = 0; j < 8; j++) {
        qb u[8];
        qk_unit(CART_Q6_K, q, 8, j, u);
        for (int h = 0; h < 2; h++) { /* sub-block 2j + h: quads 4h .. 4h + 3 */
            const __m512i sc = qi_load_i8(s + 32 + 32 * j + 16 * h);
            for (int k = 0; k < 4; k++) {
                const __m512i part = k < 3 ? _mm512_and_si512(_mm512_srai_epi32(sc, 2 * k), _mm512_set1_epi32(3))
                                           : _mm512_srai_epi32(sc, 6);
                const __m512i m =
                    _mm512_or_si512(_mm512_and_si512(part, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(part, 16));
                for (int g = 4 * h; g < 4 * h + 4; g++) {
                    const __m512i v = _mm512_sub_epi8(u[g], c32);
                    const __m512i lo = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8), m);
                    const __m512i hi = _mm512_mullo_epi16(_mm512_srai_epi16(v, 8), m);
                    _mm512_store_si512((void *)wk[k][8 * j + g],
                                       _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_slli_epi16(hi, 8)));
                }
            }
        }
    }
}

/* The tile products of step c (depth 64) of a folded block, the
 * activations x loaded once into A tile ta: q4_K q5_K (six = 0) into C
 * tiles c_lo and c_hi (the fields times lo, times hi); q6_K into C tiles
 * 0-3 (its four pieces). Tile numbers are literals. */
#define AMX_FOLD_STEP(six, ta, c_lo, c_hi, x, cols, wk, c)                                                   \
    do {                                                                                                     \
        _tile_loadd(ta, (x) + 64 * (c), (cols));                                                             \
        _tile_loadd(6, wk[0][16 * (c)], 64);                                                                 \
        if (six) _tile_dpbssd(0, ta, 6);                                                                     \
        else _tile_dpbsud(c_lo, ta, 6);                                                                      \
        _tile_loadd(7, wk[1][16 * (c)], 64);                                                                 \
        if (six) _tile_dpbssd(1, ta, 7);                                                                     \
        else _tile_dpbsud(c_hi, ta, 7);                                                                      \
        if (six) {                                                                                           \
            _tile_loadd(6, wk[2][16 * (c)], 64);                                                             \
            _tile_dpbssd(2, ta, 6);                                                                          \
            _tile_loadd(7, wk[3][16 * (c)], 64);                                                             \
            _tile_dpbssd(3, ta, 7);                                                                          \
        }                                                                                                    \
    } while (0)

/* Token i's A (row i of the four C tiles in cb) of a folded block: q4_K
 * q5_K: (C0 + C2) + 8 (C1 + C3), lo and hi over steps 0 and 2, 1 and 3;
 * q6_K: C0 + 4 C1 + 16 C2 + 64 C3. */
QK_INLINE qi amx_folded_sum(const int six, int32_t (*cb)[AMX_TOK][16], int i) {
    const qi c0 = _mm512_load_si512((const void *)cb[0][i]), c1 = _mm512_load_si512((const void *)cb[1][i]);
    const qi c2 = _mm512_load_si512((const void *)cb[2][i]), c3 = _mm512_load_si512((const void *)cb[3][i]);
    if (six)
        return qi_add(qi_add(c0, _mm512_slli_epi32(c1, 2)), qi_add(_mm512_slli_epi32(c2, 4), _mm512_slli_epi32(c3, 6)));
    return qi_add(qi_add(c0, c2), _mm512_slli_epi32(qi_add(c1, c3), 3));
}

/* acc[t] for tokens [t0, t0 + nt) (a multiple of 16, at most AMX_SPAN) of
 * one group of q4_K, q5_K or q6_K with the scales folded (amx_fold,
 * amx_fold6); tiles of depth 64 (amx_config(64)). */
QK_INLINE void amx_group_folded(const int type, const qk_src *w, const qk_act *a, const uint8_t *grp, int64_t t0,
                                int64_t nt, float (*acc)[16]) {
    const int64_t nb = w->nb, cols = a->cols;
    const int six = type == CART_Q6_K;
    const uint8_t *sc = grp + nb * w->qbytes;
    _Alignas(64) uint8_t wk[4][64][64];
    _Alignas(64) int32_t cb[4][AMX_TOK][16];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = grp + b * w->qbytes, *s = sc + b * w->sbytes;
        QK_PREFETCH(s + w->group_bytes, w->sbytes);
        __m512i mp[4];
        if (six) amx_fold6(q, s, wk);
        else {
            amx_fold(type, q, s, wk);
            for (int p = 0; p < 4; p++)
                mp[p] = _mm512_or_si512(qi_load_u8(s + 192 + 32 * p),
                                        _mm512_slli_epi32(qi_load_u8(s + 192 + 32 * p + 16), 16));
        }
        for (int64_t tt = 0; tt < nt; tt += AMX_TOK) {
            const int8_t *x = a->q + (t0 + tt) * cols + 256 * b;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            AMX_FOLD_STEP(six, 4, 0, 1, x, cols, wk, 0);
            AMX_FOLD_STEP(six, 5, 2, 3, x, cols, wk, 1);
            AMX_FOLD_STEP(six, 4, 0, 1, x, cols, wk, 2);
            AMX_FOLD_STEP(six, 5, 2, 3, x, cols, wk, 3);
            _tile_stored(0, cb[0], 64);
            _tile_stored(1, cb[1], 64);
            _tile_stored(2, cb[2], 64);
            _tile_stored(3, cb[3], 64);
            for (int tc = 0; tc < AMX_TOK; tc += 4) {
                const int64_t t = t0 + tt + tc;
                if (tt == 0) QK_PREFETCH_PART(q + w->group_bytes, w->qbytes, tc / 4, 4);
                qi A[4], B[4];
                qf f[4];
                for (int i = 0; i < 4; i++) {
                    A[i] = amx_folded_sum(six, cb, tc + i);
                    B[i] = six ? qi_zero() : amx_mins(mp, a->u + (t + i) * (cols / 32) + 8 * b);
                    f[i] = _mm512_load_ps(acc[tt + tc + i]);
                }
                qk_block_end_256(type, 4, s, a, t, b, A, B, f);
                for (int i = 0; i < 4; i++) _mm512_store_ps(acc[tt + tc + i], f[i]);
            }
        }
    }
}

/* The same for a type of 32-blocks (qk_tile_32's steps), four blocks at a
 * time, one tile product each. */
QK_INLINE void amx_group_32(const int type, const qk_src *w, const qk_act *a, const uint8_t *grp, int64_t t0,
                            int64_t nt, float (*acc)[16]) {
    const int64_t nb = w->nb, cols = a->cols;
    const uint8_t *sc = grp + nb * w->qbytes;
    _Alignas(64) uint8_t wbuf[4][512];
    _Alignas(64) int32_t cb[4][AMX_TOK][16];
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int n = nb - b0 < 4 ? (int)(nb - b0) : 4;
        const uint8_t *wb[4];
        int32_t(*out[4])[16];
        for (int k = 0; k < n; k++) {
            const uint8_t *q = grp + (b0 + k) * w->qbytes;
            wb[k] = amx_unpack(type, q, 1, wbuf[k]);
            out[k] = cb[k];
        }
        for (int64_t tt = 0; tt < nt; tt += AMX_TOK) {
            const int8_t *xs[4];
            for (int k = 0; k < n; k++) xs[k] = a->q + (t0 + tt) * cols + 32 * (b0 + k);
            amx_four(amx_signed(type), n, xs, cols, wb, out);
            for (int tc = 0; tc < AMX_TOK; tc += 4) {
                if (tt == 0 && tc / 4 < n) QK_PREFETCH(grp + (b0 + tc / 4) * w->qbytes + w->group_bytes, w->qbytes);
                qf f[4];
                for (int i = 0; i < 4; i++) f[i] = _mm512_load_ps(acc[tt + tc + i]);
                for (int k = 0; k < n; k++) {
                    int64_t at[4];
                    int32_t xsum[4];
                    qi d[4];
                    for (int i = 0; i < 4; i++) {
                        at[i] = (t0 + tt + tc + i) * (cols / 32) + b0 + k;
                        xsum[i] = a->s[at[i]];
                        d[i] = _mm512_load_si512((const void *)cb[k][tc + i]);
                    }
                    qk_block_end_32(type, 4, sc + (b0 + k) * w->sbytes, a, at, xsum, d, f);
                }
                for (int i = 0; i < 4; i++) _mm512_store_ps(acc[tt + tc + i], f[i]);
            }
        }
    }
}

/* Tokens [t0, t1) (whole tiles) of groups [g0, g1). */
QK_INLINE void amx_type(const int type, const qk_src *w, const qk_act *a, int64_t t0, int64_t t1, int64_t g0,
                        int64_t g1, float *y, int64_t ldy) {
    _Alignas(64) float acc[AMX_SPAN][16];
    /* from 32 tokens on, q4_K and q5_K fold their scales (amx_fold), q6_K
     * from 64 (amx_fold6: four products per step; at 32 its unfolded
     * tiles measured faster): once per block, worth it only over several
     * tiles */
    const int64_t fold_from = type == CART_Q4_K || type == CART_Q5_K ? 32 : type == CART_Q6_K ? 64 : 0;
    const int folded = fold_from && t1 - t0 >= fold_from;
    amx_config(folded ? 64 : amx_halves(type) ? 16 : 32);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *grp = w->data + (uint64_t)g * w->group_bytes;
        const int64_t r0 = g * QK_ROWS;
        const int nr = (int)(w->rows - r0 < QK_ROWS ? w->rows - r0 : QK_ROWS);
        for (int64_t s0 = t0; s0 < t1; s0 += AMX_SPAN) {
            const int64_t nt = t1 - s0 < AMX_SPAN ? t1 - s0 : AMX_SPAN;
            for (int64_t t = 0; t < nt; t++) _mm512_store_ps(acc[t], _mm512_setzero_ps());
            if (folded) amx_group_folded(type, w, a, grp, s0, nt, acc);
            else if (qk_bs(type) == 256) amx_group_256(type, w, a, grp, s0, nt, acc);
            else amx_group_32(type, w, a, grp, s0, nt, acc);
            for (int64_t t = 0; t < nt; t++) qf_store(y + (s0 + t) * ldy + r0, _mm512_load_ps(acc[t]), nr);
        }
    }
    _tile_release();
}

static void qk_groups_amx(const qk_src *w, const qk_act *a, int64_t t0, int64_t t1, int64_t g0, int64_t g1,
                          float *y, int64_t ldy) {
    int64_t full = t0 + (t1 - t0) / AMX_TOK * AMX_TOK;
    /* q3_K and q2_K take two tile products per unit and 16 integer
     * multiplies per token and block after them: below 64 tokens that
     * measured slower than vpdpbusd. (q6_K, the third type of halves, runs
     * on tiles from the first whole tile: 1.04-1.07x vpdpbusd at 16 tokens,
     * 1.18x at 32, bench_levels; it folds its scales from 64, amx_type.) */
    if ((w->dtype == CART_Q3_K || w->dtype == CART_Q2_K) && t1 - t0 < 64) full = t0;
    if (full > t0) QK_DISPATCH(w->dtype, amx_type, w, a, t0, full, g0, g1, y, ldy);
    if (full < t1) qk_groups_vnni(w, a, full, t1, g0, g1, y, ldy);
}

static cart_kernels table;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
    table = *cart_kernels_avx512vnni();
    table.isa = 6; /* CART_ISA_AMX */
    table.name = "amx";
    table.qk_groups = qk_groups_amx;
}

const cart_kernels *cart_kernels_amx(void) {
    pthread_once(&once, build);
    return &table;
}

#else

const cart_kernels *cart_kernels_amx(void) {
    return 0; /* not an x86-64 build */
}

#endif
