/*
 * x86_quants.h - AVX2 integer unpacking of GGML blocks shared by avx2.c and
 * avx512.c (both compiled with AVX2 enabled); include after <immintrin.h>.
 */
#ifndef CART_X86_QUANTS_H
#define CART_X86_QUANTS_H

/* The 32 signed quants q - 32 of elements 128h + 32g .. + 31 of the q6_K
 * block at x (layout as in quant.c). */
static inline __attribute__((always_inline)) __m256i q6k_quants(const uint8_t *x, int h, int g) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(3);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(x + 128 + 32 * h));
    __m256i ql = _mm256_loadu_si256((const __m256i *)(const void *)(x + 64 * h + 32 * (g & 1)));
    if (g >= 2) ql = _mm256_srli_epi16(ql, 4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), low2);
    return _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql, low4), _mm256_slli_epi16(hi, 4)),
                           _mm256_set1_epi8(32));
}

#endif
