/*
 * avx2.c - the x86-64 AVX2 level: AVX2 + FMA + F16C, 8 floats per ymm
 * register. The primitives below feed generic.h; the vector dequantizers
 * (q8_0, q4_0, q4_K, q6_K) form the same products from the same operands
 * as quant.c, so they give its values; the unpackers (v_unpack) give the
 * GEMV the quants of q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K as bytes, 32 at a
 * time.
 */
#include "kernels.h"

#if defined(__x86_64__)

#include "dtype.h"

#include <immintrin.h>

#include "x86_quants.h"
#include <math.h>
#include <string.h>

#define GK_TABLE cart_kernels_avx2
#define GK_ISA 1 /* CART_ISA_AVX2 */
#define GK_NAME "avx2"
#define VW 8
#define GK_MU 6 /* 6 x 2 ymm accumulators, 2 for the weights, 1 broadcast */
#define GK_NV 2
#define GK_GEMV_T 4
#define GK_GEMV_R(t) ((t) == 1 ? 4 : (t) == 4 ? 1 : (t) == 2 ? 3 : 2)
#define GK_BLOCKED_T 4 /* tokens per pass of the blocked GEMV: 8 ymm sums, 2 weights, 1 token */

typedef __m256 vf;

#define V_INLINE static inline __attribute__((always_inline))

V_INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
V_INLINE vf v_set1(float x) { return _mm256_set1_ps(x); }
V_INLINE vf v_load(const float *p) { return _mm256_loadu_ps(p); }
V_INLINE void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
V_INLINE vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
V_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }

/* gk_tree_gemv's sum of 16 lanes, its additions in its order on vectors:
 * s[l] + s[l + 8] for l < 8, then + 4, + 2, + 1. */
#define GK_TREE16 1
V_INLINE float v_tree16(const vf *acc) {
    const __m256 v = _mm256_add_ps(acc[0], acc[1]);
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* gk_tree_score's sum, likewise: (s[i] + s[i + 2]) + (s[i + 1] + s[i + 3])
 * per group of four (lanes 0 and 4 of each vector), then (G0 + G1) + (G2 + G3). */
V_INLINE float v_tree_score(const vf *acc) {
    __m256 u = _mm256_add_ps(acc[0], _mm256_permute_ps(acc[0], _MM_SHUFFLE(1, 0, 3, 2)));
    __m256 w = _mm256_add_ps(acc[1], _mm256_permute_ps(acc[1], _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm256_add_ps(u, _mm256_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
    w = _mm256_add_ps(w, _mm256_permute_ps(w, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m128 g01 = _mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    const __m128 g23 = _mm_add_ss(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1));
    return _mm_cvtss_f32(_mm_add_ss(g01, g23));
}

V_INLINE vf v_load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

V_INLINE vf v_load_bf16(const uint16_t *p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

V_INLINE void v_store_f16(uint16_t *p, vf v) {
    _mm_storeu_si128((__m128i *)(void *)p,
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* The bf16 bits of v in the high halves (nearest even; NaN made quiet). */
V_INLINE __m256i bf16_bits(vf v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_and_si256(r, hi);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
    return _mm256_blendv_epi8(r, quiet, nan);
}

V_INLINE void v_store_bf16(uint16_t *p, vf v) {
    const __m256i h = _mm256_srli_epi32(bf16_bits(v), 16);
    _mm_storeu_si128((__m128i *)(void *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

V_INLINE vf v_round(vf v, int round) {
    if (round == MM_ROUND_F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (round == MM_ROUND_BF16) return _mm256_castsi256_ps(bf16_bits(v));
    return v;
}

/* 8 signed bytes at p as floats. */
V_INLINE vf i8x8(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

V_INLINE float v_half(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

V_INLINE vf v_load_i8(const int8_t *p) {
    return i8x8(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

V_INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
V_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }

/* ---- dequantization ------------------------------------------------------- */

static float f16_scale(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16((short)h)));
}

/* 16 signed bytes to 16 floats at y. */
V_INLINE void store_i8x16(float *y, __m128i q, vf d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(i8x8(q), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8x8(_mm_srli_si128(q, 8)), d));
}

/* q8_0: value q * d. */
static void dequant_q8_0(float *y, const uint8_t *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const vf d = _mm256_set1_ps(f16_scale(x));
        store_i8x16(y, _mm_loadu_si128((const __m128i *)(x + 2)), d);
        store_i8x16(y + 16, _mm_loadu_si128((const __m128i *)(x + 18)), d);
    }
}

/* q4_0: value (q - 8) * d, low nibbles first. */
static void dequant_q4_0(float *y, const uint8_t *x, int64_t nb) {
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const vf d = _mm256_set1_ps(f16_scale(x));
        const __m128i q = _mm_loadu_si128((const __m128i *)(x + 2));
        store_i8x16(y, _mm_sub_epi8(_mm_and_si128(q, low4), eight), d);
        store_i8x16(y + 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), low4), eight), d);
    }
}

/* q4_K: value (d * scale) * q - dmin * min per 32-element sub-block (the
 * product is exact, so fusing it with the subtraction could not change it). */
static void dequant_q4_K(float *y, const uint8_t *x, int64_t nb) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i++, x += 144, y += 256) {
        const float d = f16_scale(x), dmin = f16_scale(x + 2);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x + 16 + 32 * c;
            for (int half = 0; half < 2; half++) {
                int sc, mn;
                cart_scale_min_k4(2 * c + half, x + 4, &sc, &mn);
                const vf d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)mn);
                for (int l = 0; l < 32; l += 16) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(q + l));
                    v = _mm_and_si128(half ? _mm_srli_epi16(v, 4) : v, low4);
                    float *out = y + 64 * c + 32 * half + l;
                    _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_mul_ps(d1, i8x8(v)), m1));
                    _mm256_storeu_ps(out + 8, _mm256_sub_ps(
                                                  _mm256_mul_ps(d1, i8x8(_mm_srli_si128(v, 8))), m1));
                }
            }
        }
    }
}

/* q6_K: value (d * scale) * (q - 32), layout as in quant.c. */
static void dequant_q6_K(float *y, const uint8_t *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210, y += 256) {
        const float d = f16_scale(x + 208);
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) { /* elements 128h + 32g .. + 31 */
                const __m256i q = q6k_quants(x, h, g);
                float *yy = y + 128 * h + 32 * g;
                store_i8x16(yy, _mm256_castsi256_si128(q),
                            _mm256_set1_ps(d * (float)sc[8 * h + 2 * g]));
                store_i8x16(yy + 16, _mm256_extracti128_si256(q, 1),
                            _mm256_set1_ps(d * (float)sc[8 * h + 2 * g + 1]));
            }
        }
    }
}

/* ---- quants as bytes (v_unpack) --------------------------------------------- */

/* The 32 nibbles of 16 bytes at p in element order: low nibbles, then high. */
V_INLINE __m256i nibbles32(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* Byte l = 0xff where bit l of the 32 bits at p is set, else 0. */
V_INLINE __m256i bit_bytes32(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread =
        _mm256_shuffle_epi8(/* byte l: byte l / 8 of bits */
                            _mm256_set1_epi32((int)bits),
                            _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                               0x0303030303030303LL));
    const __m256i one = _mm256_set1_epi64x(0x8040201008040201LL); /* bit l % 8 of byte l */
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, one), one);
}

/* q5_0 / q5_1: the nibbles with their fifth bits, less 16 for q5_0: where
 * the bit is clear, nibble - 16 is the nibble with 0xf0 above it. */
V_INLINE __m256i five_bits32(const uint8_t *qs, const uint8_t *qh, int less16) {
    const __m256i bit = bit_bytes32(qh);
    if (less16)
        return _mm256_or_si256(nibbles32(qs),
                               _mm256_andnot_si256(bit, _mm256_set1_epi8((char)0xf0)));
    return _mm256_or_si256(nibbles32(qs), _mm256_and_si256(bit, _mm256_set1_epi8(0x10)));
}

V_INLINE void store32(int8_t *q, __m256i v) {
    _mm256_storeu_si256((__m256i *)(void *)q, v);
}

/* q4_K / q5_K elements 64c .. 64c + 63: nibbles of qs[32c ..], for q5_K
 * with bits 2c and 2c + 1 of qh[0 .. 32) as the fifths. */
V_INLINE void unpack_k_pair(int8_t *q, const uint8_t *qs, const uint8_t *qh, int c) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)qs);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if (qh) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)qh);
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c + 1), one), 4));
    }
    store32(q, lo);
    store32(q + 32, hi);
}

static inline int v_unpack(int32_t dtype, const uint8_t *blk, int8_t *q) {
    switch (dtype) {
    case CART_Q4_0:
        store32(q, _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8)));
        return 1;
    case CART_Q4_1:
        store32(q, nibbles32(blk + 4));
        return 1;
    case CART_Q5_0:
        store32(q, five_bits32(blk + 6, blk + 2, 1));
        return 1;
    case CART_Q5_1:
        store32(q, five_bits32(blk + 8, blk + 4, 0));
        return 1;
    case CART_Q4_K:
    case CART_Q5_K:
        for (int c = 0; c < 4; c++)
            unpack_k_pair(q + 64 * c, blk + (dtype == CART_Q4_K ? 16 : 48) + 32 * c,
                          dtype == CART_Q5_K ? blk + 16 : NULL, c);
        return 1;
    case CART_Q6_K:
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) store32(q + 128 * h + 32 * g, q6k_quants(blk, h, g));
        return 1;
    default:
        return 0;
    }
}

static inline int gk_dequant(const mm_src *w, float *dst, const uint8_t *src, int64_t nb) {
    switch (w->dtype) {
    case CART_Q8_0:
        dequant_q8_0(dst, src, nb);
        return 1;
    case CART_Q4_0:
        dequant_q4_0(dst, src, nb);
        return 1;
    case CART_Q4_K:
        dequant_q4_K(dst, src, nb);
        return 1;
    case CART_Q6_K:
        dequant_q6_K(dst, src, nb);
        return 1;
    default:
        return 0;
    }
}

/* ---- integer block products (qgeneric.h): 16 lanes as two ymm ------------ */

/* Lanes 0-7 in .a (bytes 0-31 of a quad vector), 8-15 in .b. Unsigned
 * fields (< 64) go through vpmaddubsw + vpmaddwd, whose 16-bit pair sums
 * cannot saturate below 64; signed weights through the sign trick (|w|
 * times x with w's sign). The sums are exact, so the bits are the other
 * levels'. */
typedef struct { __m256i a, b; } qb;
typedef qb qs; /* signed bytes, their magnitude and sign taken per product */
typedef struct { __m256i a, b; } qi;
typedef struct { __m256 a, b; } qf;

#define QK_PRIM static inline __attribute__((always_inline))
/* Keeps a running sum in its register: without it GCC reassociates a
 * chain of integer adds into a tree over all of a run's products, which
 * then live on the stack (measured on the Xeon: q4_K GEMM 97 -> 110-117
 * GOP/s on one thread). Integer sums are exact, so the bits are the same. */
#define QK_KEEP(v) __asm__("" : "+x"(v))

QK_PRIM qb qb_load(const uint8_t *p) {
    qb r = {_mm256_load_si256((const __m256i *)(const void *)p), _mm256_load_si256((const __m256i *)(const void *)(p + 32))};
    return r;
}
QK_PRIM qb qb_lo4(qb v) {
    const __m256i m = _mm256_set1_epi8(15);
    qb r = {_mm256_and_si256(v.a, m), _mm256_and_si256(v.b, m)};
    return r;
}
QK_PRIM qb qb_hi4(qb v) {
    const __m256i m = _mm256_set1_epi8(15);
    qb r = {_mm256_and_si256(_mm256_srli_epi16(v.a, 4), m), _mm256_and_si256(_mm256_srli_epi16(v.b, 4), m)};
    return r;
}
QK_PRIM qb qb_or(qb x, qb y) {
    qb r = {_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)};
    return r;
}
QK_PRIM qb qb_field(qb v, int shift, int n, int to) {
    const __m256i m = _mm256_set1_epi8((char)(((1 << n) - 1) << to));
    qb r;
    if (shift >= to) {
        r.a = _mm256_and_si256(_mm256_srli_epi16(v.a, shift - to), m);
        r.b = _mm256_and_si256(_mm256_srli_epi16(v.b, shift - to), m);
    } else {
        r.a = _mm256_and_si256(_mm256_slli_epi16(v.a, to - shift), m);
        r.b = _mm256_and_si256(_mm256_slli_epi16(v.b, to - shift), m);
    }
    return r;
}
QK_PRIM qs qs_bytes(qb v) { return v; }
QK_PRIM qs qs_levels(qb v) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)qk_iq4_levels));
    qs r = {_mm256_shuffle_epi8(t, v.a), _mm256_shuffle_epi8(t, v.b)};
    return r;
}
QK_PRIM __m256i qk_bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}
QK_PRIM __m256i qk_madd(__m256i acc, __m256i u, __m256i sx) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, sx), _mm256_set1_epi16(1)));
}
QK_PRIM qi qi_dot(qi acc, qb u, const int8_t *x) {
    const __m256i bx = qk_bcast4(x);
    qi r = {qk_madd(acc.a, u.a, bx), qk_madd(acc.b, u.b, bx)};
    QK_KEEP(r.a);
    QK_KEEP(r.b);
    return r;
}
/* 16 lanes of two int16 partial sums (qgeneric.h's QK_DOT16 path): the
 * maddubs products added without widening, then widened once per run. */
typedef struct { __m256i a, b; } qh;
QK_PRIM qh qh_zero(void) {
    qh r = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    return r;
}
QK_PRIM qh qh_dot(qh acc, qb u, const int8_t *x) {
    const __m256i bx = qk_bcast4(x);
    qh r = {_mm256_add_epi16(acc.a, _mm256_maddubs_epi16(u.a, bx)),
            _mm256_add_epi16(acc.b, _mm256_maddubs_epi16(u.b, bx))};
    QK_KEEP(r.a);
    QK_KEEP(r.b);
    return r;
}
QK_PRIM qi qi_add_qh(qi acc, qh h) {
    const __m256i one = _mm256_set1_epi16(1);
    qi r = {_mm256_add_epi32(acc.a, _mm256_madd_epi16(h.a, one)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(h.b, one))};
    return r;
}
#define QK_DOT16 1

/* Two int16 per lane (qgeneric.h's QK_SCALE16): .a lanes 0-7, .b 8-15. */
typedef struct { __m256i a, b; } qw;
QK_PRIM qw qw_dup_u8(const uint8_t *p) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 8)));
    qw r = {_mm256_or_si256(v, _mm256_slli_epi32(v, 16)), _mm256_or_si256(w, _mm256_slli_epi32(w, 16))};
    return r;
}
QK_PRIM qw qw_pair_u8(const uint8_t *p, const uint8_t *q) {
    const __m128i v = _mm_unpacklo_epi8(_mm_loadu_si128((const __m128i *)(const void *)p),
                                        _mm_loadu_si128((const __m128i *)(const void *)q));
    const __m128i w = _mm_unpackhi_epi8(_mm_loadu_si128((const __m128i *)(const void *)p),
                                        _mm_loadu_si128((const __m128i *)(const void *)q));
    qw r = {_mm256_cvtepu8_epi16(v), _mm256_cvtepu8_epi16(w)};
    return r;
}
QK_PRIM qi qi_madd_qh(qi acc, qh h, qw w) {
    qi r = {_mm256_add_epi32(acc.a, _mm256_madd_epi16(h.a, w.a)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(h.b, w.b))};
    return r;
}
QK_PRIM qi qi_madd_x2(qi acc, qw w, int32_t x0, int32_t x1) {
    const __m256i x = _mm256_set1_epi32((int32_t)(((uint32_t)x0 & 0xffffu) | ((uint32_t)x1 << 16)));
    qi r = {_mm256_add_epi32(acc.a, _mm256_madd_epi16(w.a, x)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(w.b, x))};
    return r;
}
#define QK_SCALE16 1

QK_PRIM qi qi_dots(qi acc, qs w, const int8_t *x) {
    const __m256i bx = qk_bcast4(x);
    qi r = {qk_madd(acc.a, _mm256_abs_epi8(w.a), _mm256_sign_epi8(bx, w.a)),
            qk_madd(acc.b, _mm256_abs_epi8(w.b), _mm256_sign_epi8(bx, w.b))};
    QK_KEEP(r.a);
    QK_KEEP(r.b);
    return r;
}
QK_PRIM qi qi_dots_end(qi acc, int32_t xsum) {
    (void)xsum;
    return acc;
}
QK_PRIM qi qi_zero(void) {
    qi r = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    return r;
}
QK_PRIM qi qi_set1(int32_t x) {
    qi r = {_mm256_set1_epi32(x), _mm256_set1_epi32(x)};
    return r;
}
QK_PRIM qi qi_add(qi x, qi y) {
    qi r = {_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)};
    return r;
}
QK_PRIM qi qi_mul(qi x, qi y) {
    qi r = {_mm256_mullo_epi32(x.a, y.a), _mm256_mullo_epi32(x.b, y.b)};
    return r;
}
QK_PRIM qi qi_sub1(qi x, int32_t s) {
    const __m256i v = _mm256_set1_epi32(s);
    qi r = {_mm256_sub_epi32(x.a, v), _mm256_sub_epi32(x.b, v)};
    return r;
}
QK_PRIM qi qi_load_u8(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    qi r = {_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))};
    return r;
}
QK_PRIM qi qi_load_i8(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    qi r = {_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))};
    return r;
}
QK_PRIM qi qi_lo4(qi x) {
    const __m256i m = _mm256_set1_epi32(15);
    qi r = {_mm256_and_si256(x.a, m), _mm256_and_si256(x.b, m)};
    return r;
}
QK_PRIM qi qi_hi4(qi x) {
    const __m256i m = _mm256_set1_epi32(15);
    qi r = {_mm256_and_si256(_mm256_srli_epi32(x.a, 4), m), _mm256_and_si256(_mm256_srli_epi32(x.b, 4), m)};
    return r;
}
QK_PRIM qf qf_cvt(qi x) {
    qf r = {_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)};
    return r;
}
QK_PRIM qf qf_load_f16(const uint8_t *p) {
    qf r = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)))};
    return r;
}
QK_PRIM qf qf_set1(float x) {
    qf r = {_mm256_set1_ps(x), _mm256_set1_ps(x)};
    return r;
}
QK_PRIM qf qf_zero(void) { return qf_set1(0.0f); }
QK_PRIM qf qf_mul(qf x, qf y) {
    qf r = {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)};
    return r;
}
QK_PRIM qf qf_add(qf x, qf y) {
    qf r = {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)};
    return r;
}
QK_PRIM qf qf_sub(qf x, qf y) {
    qf r = {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)};
    return r;
}
QK_PRIM void qf_store(float *p, qf v, int n) {
    if (n == 16) {
        _mm256_storeu_ps(p, v.a);
        _mm256_storeu_ps(p + 8, v.b);
        return;
    }
    float t[16];
    _mm256_storeu_ps(t, v.a);
    _mm256_storeu_ps(t + 8, v.b);
    memcpy(p, t, (size_t)n * sizeof(float));
}

/* 4 tokens a tile: each unit's fields are unpacked once for 4 tokens, not 2
 * (measured on an Intel Xeon, one thread: q4_K GEMM 80-86 -> 95-100
 * GOP/s, q8_0 73-81 -> 93-94; a 512-token prefill 5-8% faster). */
#define QK_T 4
#define QK_FN qk_groups_avx2
#include "qgeneric.h"

/* ---- activations quantized for the integer products (qdot.h) ------------- */

static float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static int32_t hsum8i(__m256i v) {
    __m128i m = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtsi128_si32(m);
}
static __m256 abs8(const float *x) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x));
}
/* 1 when the n floats (a multiple of 8) are all finite. */
static int all_finite8(const float *x, int64_t n) {
    __m256 bad = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; k += 8) bad = _mm256_or_ps(bad, _mm256_cmp_ps(abs8(x + k), _mm256_set1_ps(INFINITY), _CMP_NLT_UQ));
    return _mm256_movemask_ps(bad) == 0;
}
/* 8 floats times s, rounded to nearest even (the default MXCSR; magnitudes
 * at most 128, where this is GGML's nearest_int). */
static inline __m256i scaled_rne8(const float *x, __m256 s) {
    return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
}
/* 8 int32 (within int8) stored as 8 bytes. */
static inline void store8_i8(int8_t *q, __m256i v) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(void *)q, _mm_packs_epi16(w, w));
}

static void quantize_row_32_avx2(qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 32;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(abs8(xb), abs8(xb + 8)), _mm256_max_ps(abs8(xb + 16), abs8(xb + 24))));
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        int8_t *q = a->q + i * a->cols + 32 * b;
        __m256i sum = _mm256_setzero_si256();
        for (int k = 0; k < 32; k += 8) {
            const __m256i v = scaled_rne8(xb + k, id);
            store8_i8(q + k, v);
            sum = _mm256_add_epi32(sum, v);
        }
        const int32_t s = hsum8i(sum);
        qk_act_put32(a, i, b, d, s);
    }
}

static void quantize_row_256_avx2(qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 256;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 256 * b;
        int8_t *q = a->q + i * a->cols + 256 * b;
        int32_t *s = a->s + i * (a->cols / 16) + 16 * b;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++) m = _mm256_max_ps(m, abs8(xb + 8 * j));
        const float amax = hmax8(m);
        if (amax == 0.0f) {
            qk_act_zero256(a, i, b);
            continue;
        }
        int at = 0; /* the first element of magnitude amax */
        for (int j = 0; j < 32; j++) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs8(xb + 8 * j), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                at = 8 * j + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        const float iscale = -127.0f / xb[at];
        const __m256 sc = _mm256_set1_ps(iscale);
        for (int j = 0; j < 16; j++) {
            const __m256i v0 = _mm256_min_epi32(scaled_rne8(xb + 16 * j, sc), _mm256_set1_epi32(127));
            const __m256i v1 = _mm256_min_epi32(scaled_rne8(xb + 16 * j + 8, sc), _mm256_set1_epi32(127));
            store8_i8(q + 16 * j, v0);
            store8_i8(q + 16 * j + 8, v1);
            s[j] = hsum8i(_mm256_add_epi32(v0, v1));
        }
        a->d[i * nb + b] = 1.0f / iscale;
    }
}

/* qdot.h's rules, 8 lanes at a time. */
static void qk_quantize_rows_avx2(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1) {
    qk_quantize_rows_by(a, x, ldx, i0, i1, all_finite8, quantize_row_32_avx2, quantize_row_256_avx2);
}
#define GK_QK_QUANTIZE qk_quantize_rows_avx2

/* ---- e^x in double: exp.h's main path on 4 lanes -------------------------- */

#include <math.h>

#include "exp.h"

static void exp_n_avx2(double *y, const double *x, int64_t n) {
    const __m256d inv = _mm256_set1_pd(CART_EXP_INVLN2N), shift = _mm256_set1_pd(CART_EXP_SHIFT);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d xv = _mm256_loadu_pd(x + i);
        const __m256i bits = _mm256_castpd_si256(xv);
        const __m256i top = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
                                             _mm256_set1_epi64x(CART_EXP_LOW));
        const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi64(_mm256_setzero_si256(), top),
                                            _mm256_cmpgt_epi64(top, _mm256_set1_epi64x(CART_EXP_SPAN)));
        __m256d kd = _mm256_fmadd_pd(xv, inv, shift);
        const __m256i ki = _mm256_castpd_si256(kd);
        kd = _mm256_sub_pd(kd, shift);
        __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(CART_EXP_NEGLN2HIN), xv);
        r = _mm256_fmadd_pd(kd, _mm256_set1_pd(CART_EXP_NEGLN2LON), r);
        const __m256i idx = _mm256_slli_epi64(_mm256_and_si256(ki, _mm256_set1_epi64x(127)), 1);
        const __m256d tail = _mm256_i64gather_pd((const double *)cart_exp_tab, idx, 8);
        const __m256i sb = _mm256_add_epi64(_mm256_i64gather_epi64((const long long *)cart_exp_tab + 1, idx, 8),
                                            _mm256_slli_epi64(ki, 45));
        const __m256d a = _mm256_fmadd_pd(r, _mm256_set1_pd(CART_EXP_C3), _mm256_set1_pd(CART_EXP_C2));
        const __m256d b = _mm256_add_pd(r, tail);
        const __m256d r2 = _mm256_mul_pd(r, r);
        const __m256d c = _mm256_fmadd_pd(r, _mm256_set1_pd(CART_EXP_C5), _mm256_set1_pd(CART_EXP_C4));
        const __m256d tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), c, _mm256_fmadd_pd(a, r2, b));
        const __m256d scale = _mm256_castsi256_pd(sb);
        const int special = _mm256_movemask_pd(_mm256_castsi256_pd(out));
        double xs[4];
        if (special) _mm256_storeu_pd(xs, xv); /* y may be x */
        _mm256_storeu_pd(y + i, _mm256_fmadd_pd(scale, tmp, scale));
        if (special)
            for (int l = 0; l < 4; l++)
                if (special >> l & 1) y[i + l] = exp(xs[l]);
    }
    for (; i < n; i++) y[i] = exp(x[i]);
}
#define GK_EXP_N exp_n_avx2

/* ---- e^x: expf.h's arithmetic on 4 doubles at a time ---------------------- */

#include "expf.h"

/* e^x of 4 floats, before the special cases (expf.h). */
static inline __m128 expf_4(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d inv = _mm256_set1_pd(CART_EXPF_INVLN2N), shift = _mm256_set1_pd(CART_EXPF_SHIFT);
    __m256d kd = _mm256_fmadd_pd(inv, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    const __m256i tab = _mm256_i64gather_epi64((const long long *)cart_expf_tab, idx, 8);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(tab, _mm256_slli_epi64(ki, 47)));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(CART_EXPF_C0), r, _mm256_set1_pd(CART_EXPF_C1));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(CART_EXPF_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

static void expf_n_avx2(float *y, const float *x, int64_t n) {
    const __m256i big = _mm256_set1_epi32((int)CART_EXPF_BIG), abs = _mm256_set1_epi32(0x7fffffff);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i mag = _mm256_and_si256(_mm256_castps_si256(v), abs);
        const int special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(mag, big)));
        const __m256 e = _mm256_set_m128(expf_4(_mm256_extractf128_ps(v, 1)), expf_4(_mm256_castps256_ps128(v)));
        if (special) {
            float xs[8];
            _mm256_storeu_ps(xs, v);
            _mm256_storeu_ps(y + i, e);
            for (int l = 0; l < 8; l++)
                if (special >> l & 1) y[i + l] = cart_expf_ref(xs[l]);
        } else {
            _mm256_storeu_ps(y + i, e);
        }
    }
    cart_expf_ref_n(y + i, x + i, n - i);
}
#define GK_EXPF_N expf_n_avx2

#include "generic.h"

#else

const cart_kernels *cart_kernels_avx2(void) {
    return 0; /* not an x86-64 build */
}

#endif
