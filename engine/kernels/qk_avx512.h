/*
 * qk_avx512.h - qgeneric.h's primitives on AVX-512: one zmm per 16 lanes.
 * Included by avx512.c (QK_VNNI 0: AVX-512BW, the byte products through
 * vpmaddubsw + vpmaddwd) and avx512vnni.c (QK_VNNI 1: vpdpbusd). Both give
 * exact int32 sums: unsigned fields are below 64, so vpmaddubsw's 16-bit
 * pair sums cannot saturate, and on BW they are added in 16 bits over runs
 * of quads short enough not to overflow (QK_RUN) before one vpmaddwd
 * widens them; signed weights go through the sign trick
 * (|w| times x with w's sign) on BW, and on VNNI as w + 128 times x, less
 * 128 times the sum of x once per block (qi_dots_end).
 */
#ifndef CART_QK_AVX512_H
#define CART_QK_AVX512_H

#include <immintrin.h>
#include <string.h>

#define QK_PRIM static inline __attribute__((always_inline))
/* Keeps a running sum of added products in its register (see avx2.c's
 * QK_KEEP: GCC would reassociate the chain into a tree through the stack). */
#define QK_KEEP(v) __asm__("" : "+v"(v))

typedef __m512i qb;
typedef __m512i qi;
typedef __m512 qf;
#if QK_VNNI
typedef __m512i qs; /* w + 128 as unsigned bytes */
#else
typedef struct {
    __m512i mag;   /* |w| as unsigned bytes */
    __mmask64 neg; /* w < 0 */
} qs;
#endif

QK_PRIM qb qb_load(const uint8_t *p) { return _mm512_load_si512((const void *)p); }
QK_PRIM qb qb_lo4(qb v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
QK_PRIM qb qb_hi4(qb v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
QK_PRIM qb qb_or(qb a, qb b) { return _mm512_or_si512(a, b); }
/* 16-bit shifts: the mask keeps only bits that stayed in their byte */
QK_PRIM qb qb_field(qb v, int shift, int n, int to) {
    const __m512i mask = _mm512_set1_epi8((char)(((1 << n) - 1) << to));
    if (shift >= to) return _mm512_and_si512(_mm512_srli_epi16(v, (unsigned)(shift - to)), mask);
    return _mm512_and_si512(_mm512_slli_epi16(v, (unsigned)(to - shift)), mask);
}

QK_PRIM __m512i qk_bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

/* Two int16 per lane (qgeneric.h's QK_SCALE16). */
typedef __m512i qw;
QK_PRIM qw qw_pair_u8(const uint8_t *p, const uint8_t *q) {
    const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)p), b = _mm_loadu_si128((const __m128i *)(const void *)q);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}
QK_PRIM qi qi_madd_x2(qi acc, qw w, int32_t x0, int32_t x1) {
    const __m512i x = _mm512_set1_epi32((int32_t)(((uint32_t)x0 & 0xffffu) | ((uint32_t)x1 << 16)));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
}
#define QK_SCALE16 1

#if QK_VNNI
QK_PRIM qs qs_bytes(qb v) { return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)); }
QK_PRIM qi qi_dot(qi acc, qb u, const int8_t *x) { return _mm512_dpbusd_epi32(acc, u, qk_bcast4(x)); }
QK_PRIM qi qi_dots(qi acc, qs w, const int8_t *x) { return _mm512_dpbusd_epi32(acc, w, qk_bcast4(x)); }
QK_PRIM qi qi_dots_end(qi acc, int32_t xsum) { return _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * xsum)); }
#else
QK_PRIM qs qs_bytes(qb v) {
    qs r = {_mm512_abs_epi8(v), _mm512_movepi8_mask(v)};
    return r;
}
QK_PRIM qi qk_madd(qi acc, __m512i u, __m512i sx) {
    const __m512i pairs = _mm512_maddubs_epi16(u, sx);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
QK_PRIM qi qi_dot(qi acc, qb u, const int8_t *x) {
    qi r = qk_madd(acc, u, qk_bcast4(x));
    QK_KEEP(r);
    return r;
}
QK_PRIM qi qi_dots(qi acc, qs w, const int8_t *x) {
    const __m512i bx = qk_bcast4(x);
    qi r = qk_madd(acc, w.mag, _mm512_mask_sub_epi8(bx, w.neg, _mm512_setzero_si512(), bx));
    QK_KEEP(r);
    return r;
}
QK_PRIM qi qi_dots_end(qi acc, int32_t xsum) {
    (void)xsum;
    return acc;
}
/* 16-bit partial sums (qgeneric.h's QK_DOT16 path): vpmaddubsw's products
 * added without widening, widened once per run of quads. */
typedef __m512i qh;
QK_PRIM qh qh_zero(void) { return _mm512_setzero_si512(); }
QK_PRIM qh qh_dot(qh acc, qb u, const int8_t *x) {
    qh r = _mm512_add_epi16(acc, _mm512_maddubs_epi16(u, qk_bcast4(x)));
    QK_KEEP(r);
    return r;
}
QK_PRIM qi qi_add_qh(qi acc, qh h) { return _mm512_add_epi32(acc, _mm512_madd_epi16(h, _mm512_set1_epi16(1))); }
#define QK_DOT16 1

QK_PRIM qw qw_dup_u8(const uint8_t *p) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm512_or_si512(v, _mm512_slli_epi32(v, 16));
}
QK_PRIM qi qi_madd_qh(qi acc, qh h, qw w) { return _mm512_add_epi32(acc, _mm512_madd_epi16(h, w)); }
#endif
QK_PRIM qs qs_levels(qb v) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)qk_iq4_levels));
    return qs_bytes(_mm512_shuffle_epi8(table, v));
}

QK_PRIM qi qi_zero(void) { return _mm512_setzero_si512(); }
QK_PRIM qi qi_set1(int32_t x) { return _mm512_set1_epi32(x); }
QK_PRIM qi qi_add(qi a, qi b) { return _mm512_add_epi32(a, b); }
QK_PRIM qi qi_mul(qi a, qi b) { return _mm512_mullo_epi32(a, b); }
QK_PRIM qi qi_sub1(qi a, int32_t s) { return _mm512_sub_epi32(a, _mm512_set1_epi32(s)); }
QK_PRIM qi qi_load_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
QK_PRIM qi qi_load_i8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
QK_PRIM qi qi_lo4(qi a) { return _mm512_and_si512(a, _mm512_set1_epi32(15)); }
QK_PRIM qi qi_hi4(qi a) { return _mm512_and_si512(_mm512_srli_epi32(a, 4), _mm512_set1_epi32(15)); }

QK_PRIM qf qf_cvt(qi a) { return _mm512_cvtepi32_ps(a); }
QK_PRIM qf qf_load_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
QK_PRIM qf qf_set1(float x) { return _mm512_set1_ps(x); }
QK_PRIM qf qf_zero(void) { return _mm512_setzero_ps(); }
QK_PRIM qf qf_mul(qf a, qf b) { return _mm512_mul_ps(a, b); }
QK_PRIM qf qf_add(qf a, qf b) { return _mm512_add_ps(a, b); }
QK_PRIM qf qf_sub(qf a, qf b) { return _mm512_sub_ps(a, b); }
QK_PRIM void qf_store(float *p, qf v, int n) {
    if (n == 16) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}

#endif
