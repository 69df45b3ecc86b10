/*
 * avx512.c - the x86-64 AVX-512 level (F, BW, VL, DQ): 16 floats per zmm
 * register, written out by hand.
 *
 * GEMM (many tokens). The micro-kernel keeps a tile of MM_U tokens x MM_V
 * outputs in 24 zmm accumulators: per reduction step it loads MM_V packed
 * weights (two zmm) and broadcasts MM_U activations from the packed token
 * panel, 24 FMAs in all. Panels:
 *   activations  xp[p][k][u]: MM_U tokens per k, packed once per call for all
 *                threads (f16/bf16 rounding happens here);
 *   weights      MM_KC x MM_V floats (32 KiB, L1d), packed by each thread for
 *                its own rows: forward transposes W's rows into k-major order
 *                (16 x 16 register transposes), backward copies row segments;
 *                f16/bf16 are widened, block types dequantized, once per panel.
 * Forward loop per task (MM_FWD_ROWS weight rows): for each k block of MM_KC,
 * for each 32-row weight panel: pack it, then run it against every token
 * panel (the k block of all tokens, <= 540 KiB, stays in L2).
 *
 * GEMV (few tokens). Each pass reads R weight rows once and applies them to T
 * tokens, R x T zmm accumulators of 16 lane sums; f16/bf16 and q8_0 are
 * widened in registers, other block types dequantized 1024 elements of R rows
 * at a time into L1. From 8 tokens on (lockstep decode), float weights go in
 * groups of rows, every pass of 8 tokens over a group before the next, the
 * depth in blocks whose packed activations stay in L1 (gemv_blocked): a row
 * comes from DRAM once and the loads stop bounding the FMAs.
 *
 * Attention: 16 keys' scores at a time, their lane sums added by one
 * transposing tree; value sums one FMA chain per output. f16 cache rows are
 * read and widened in registers.
 *
 * Block types are dequantized by vector code for q8_0 q4_0 q4_K q6_K (same
 * values as cart_to_f32, see "dequantization") and by cart_to_f32 otherwise.
 * kernels.h states the arithmetic every level shares.
 */
#include "kernels.h"

#if defined(__x86_64__)

#include <math.h>
#include <string.h>

#include "dtype.h"

enum {
    MM_U = 12,     /* tokens per micro-tile: the broadcast operand, 12 x 2 zmm accumulators */
    MM_V = 32,     /* weight rows (forward) or columns (backward) per micro-tile: two zmm */
    MM_GEMV_T = 8, /* most tokens one GEMV pass applies a weight row to */
};

#include <immintrin.h>

#include "x86_quants.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

/* Mask of the low n lanes, n clamped to [0, 16]. */
static __mmask16 lanes(int64_t n) {
    if (n <= 0) return 0;
    if (n >= 16) return 0xffff;
    return (__mmask16)((1u << n) - 1);
}

/* ---- dequantization -------------------------------------------------------
 * Vector versions of quant.c's dequantizers for the block types GGUF models
 * use most. Each forms the same f32 products and differences from the same
 * operands as the scalar code (and so as GGML's reference dequantizers), so
 * the values are identical; the tests compare products with cart_to_f32's
 * values bit for bit. Other types go through cart_to_f32. */

/* The f16 at p as f32 (exact for every f16, subnormals included). */
static float f16_scale(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtss_f32(_mm512_cvtph_ps(_mm256_set1_epi16((short)h)));
}

/* 16 signed bytes to floats. */
static ALWAYS_INLINE __m512 i8x16_to_ps(__m128i v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}

/* q8_0: value q * d. */
static void dequant_q8_0(float *y, const uint8_t *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const __m512 d = _mm512_set1_ps(f16_scale(x));
        _mm512_storeu_ps(y,
                         _mm512_mul_ps(i8x16_to_ps(_mm_loadu_si128((const __m128i *)(x + 2))), d));
        _mm512_storeu_ps(y + 16,
                         _mm512_mul_ps(i8x16_to_ps(_mm_loadu_si128((const __m128i *)(x + 18))), d));
    }
}

/* q4_0: value (q - 8) * d, low nibbles first. */
static void dequant_q4_0(float *y, const uint8_t *x, int64_t nb) {
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const __m512 d = _mm512_set1_ps(f16_scale(x));
        const __m128i q = _mm_loadu_si128((const __m128i *)(x + 2));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, low4), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), low4), eight);
        _mm512_storeu_ps(y, _mm512_mul_ps(i8x16_to_ps(lo), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(i8x16_to_ps(hi), d));
    }
}

/* q4_K: value (d * scale) * q - dmin * min per 32-element sub-block. The
 * product is exact (17 + 4 significant bits), so whether a compiler fuses it
 * with the subtraction cannot change the result. */
static void dequant_q4_K(float *y, const uint8_t *x, int64_t nb) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i++, x += 144, y += 256) {
        const float d = f16_scale(x), dmin = f16_scale(x + 2);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x + 16 + 32 * c;
            for (int half = 0; half < 2; half++) { /* low nibbles: sub-block 2c; high: 2c + 1 */
                int sc, mn;
                cart_scale_min_k4(2 * c + half, x + 4, &sc, &mn);
                const __m512 d1 = _mm512_set1_ps(d * (float)sc),
                             m1 = _mm512_set1_ps(dmin * (float)mn);
                for (int l = 0; l < 32; l += 16) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(q + l));
                    v = _mm_and_si128(half ? _mm_srli_epi16(v, 4) : v, low4);
                    const __m512 p = _mm512_mul_ps(d1, i8x16_to_ps(v));
                    _mm512_storeu_ps(y + 64 * c + 32 * half + l, _mm512_sub_ps(p, m1));
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
                const __m512 s0 = _mm512_set1_ps(d * (float)sc[8 * h + 2 * g]);
                const __m512 s1 = _mm512_set1_ps(d * (float)sc[8 * h + 2 * g + 1]);
                _mm512_storeu_ps(yy, _mm512_mul_ps(s0, i8x16_to_ps(_mm256_castsi256_si128(q))));
                _mm512_storeu_ps(yy + 16,
                                 _mm512_mul_ps(s1, i8x16_to_ps(_mm256_extracti128_si256(q, 1))));
            }
        }
    }
}

/* Dequantizes rows [r0, r0 + nr), elements [k0, k0 + kc) of a block-type
 * weight into dst (pitch ld floats). k0 and kc are whole blocks. */
static void dequant_rows(const mm_src *w, float *dst, int64_t ld, int64_t r0, int64_t nr,
                         int64_t k0, int64_t kc) {
    const uint64_t off = (uint64_t)(k0 / w->block_size) * (uint64_t)w->type_size;
    const int64_t nb = kc / w->block_size;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *src = w->data + (uint64_t)(r0 + r) * w->row_bytes + off;
        float *out = dst + r * ld;
        switch (w->dtype) {
        case CART_Q8_0:
            dequant_q8_0(out, src, nb);
            break;
        case CART_Q4_0:
            dequant_q4_0(out, src, nb);
            break;
        case CART_Q4_K:
            dequant_q4_K(out, src, nb);
            break;
        case CART_Q6_K:
            dequant_q6_K(out, src, nb);
            break;
        default:
            cart_to_f32(out, w->dtype, src, kc);
            break;
        }
    }
}

/* Loads 16 consecutive weight elements of a float kind as f32; lanes outside
 * mask m are 0 and their memory is not touched. */
static ALWAYS_INLINE __m512 load_w16(const int kind, const uint8_t *p, __mmask16 m) {
    if (kind == MM_W_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    if (kind == MM_W_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
    return _mm512_maskz_loadu_ps(m, p);
}

/* The same with all 16 lanes. */
static ALWAYS_INLINE __m512 load_w16_full(const int kind, const uint8_t *p) {
    if (kind == MM_W_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    if (kind == MM_W_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    return _mm512_loadu_ps(p);
}

/* v rounded to f16 or bf16 (nearest, ties to even) and widened back: the same
 * values as cart_f32_to_f16 / cart_f32_to_bf16 and back, NaN included. */
static ALWAYS_INLINE __m512 round_act(__m512 v, const int round) {
    if (round == MM_ROUND_F16)
        return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (round == MM_ROUND_BF16) {
        const __m512i u = _mm512_castps_si512(v);
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
        r = _mm512_and_si512(r, hi);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i quiet =
            _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
        return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, quiet));
    }
    return v;
}

/* Transposes the 16 x 16 matrix held in r[0..15] (row i in r[i]). */
static ALWAYS_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* r[4g + c] holds column c, 4 + c, 8 + c, 12 + c of rows 4g..4g+3 */
    for (int g = 0; g < 4; g++) {
        r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);     /* cols c, 8+c of rows 0..7 */
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd); /* cols 4+c, 12+c */
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

/* ---- activations ---------------------------------------------------------- */

static ALWAYS_INLINE void pack_act_panels(const int round, float *xp, const float *x, int64_t ldx,
                                          int64_t ntok, int64_t depth, int64_t p0, int64_t p1) {
    const __mmask16 umask = (__mmask16)((1u << MM_U) - 1);
    for (int64_t p = p0; p < p1; p++) {
        float *dst = xp + p * depth * MM_U;
        const int64_t i0 = p * MM_U, nt = min64(MM_U, ntok - i0);
        for (int64_t k = 0; k < depth; k += 16) {
            const int64_t kn = min64(16, depth - k);
            const __mmask16 km = lanes(kn);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < nt ? round_act(_mm512_maskz_loadu_ps(km, x + (i0 + i) * ldx + k), round)
                              : _mm512_setzero_ps();
            transpose16(r);
            for (int t = 0; t < kn; t++) _mm512_mask_storeu_ps(dst + (k + t) * MM_U, umask, r[t]);
        }
    }
}

static void mm512_pack_act(float *xp, const float *x, int64_t ldx, int64_t ntok, int64_t depth,
                    int32_t round, int64_t p0, int64_t p1) {
    if (round == MM_ROUND_F16)
        pack_act_panels(MM_ROUND_F16, xp, x, ldx, ntok, depth, p0, p1);
    else if (round == MM_ROUND_BF16)
        pack_act_panels(MM_ROUND_BF16, xp, x, ldx, ntok, depth, p0, p1);
    else
        pack_act_panels(MM_ROUND_NONE, xp, x, ldx, ntok, depth, p0, p1);
}

static ALWAYS_INLINE void round_rows(const int round, float *xr, const float *x, int64_t ldx,
                                     int64_t cols, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
        for (int64_t k = 0; k < cols; k += 16) {
            const __mmask16 km = lanes(cols - k);
            const __m512 v = round_act(_mm512_maskz_loadu_ps(km, x + i * ldx + k), round);
            _mm512_mask_storeu_ps(xr + i * cols + k, km, v);
        }
}

static void mm512_round_rows(float *xr, const float *x, int64_t ldx, int64_t cols, int32_t round,
                      int64_t i0, int64_t i1) {
    if (round == MM_ROUND_F16)
        round_rows(MM_ROUND_F16, xr, x, ldx, cols, i0, i1);
    else if (round == MM_ROUND_BF16)
        round_rows(MM_ROUND_BF16, xr, x, ldx, cols, i0, i1);
    else
        round_rows(MM_ROUND_NONE, xr, x, ldx, cols, i0, i1);
}

/* ---- the micro-kernel ----------------------------------------------------- */

/* c[i, 0..31] (pitch ldc, lanes masked by m0 | m1 << 16) for tokens i < u:
 *   c[i, v] = fma chain over k < kc of a[k][i] * b[k][v], starting from c (load)
 *   or from 0. a: packed token panel (pitch MM_U per k); b: packed weight panel
 *   (MM_V per k, 64-byte aligned). */
static ALWAYS_INLINE void micro_tile(const int u, int64_t kc, const float *restrict a,
                                     const float *restrict b, float *restrict c, int64_t ldc,
                                     __mmask16 m0, __mmask16 m1, int load) {
    __m512 c0[MM_U], c1[MM_U];
    for (int i = 0; i < u; i++) {
        if (load) {
            c0[i] = _mm512_maskz_loadu_ps(m0, c + i * ldc);
            c1[i] = _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
        } else {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        for (int i = 0; i < u; i++) {
            const __m512 ai = _mm512_set1_ps(a[i]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
        a += MM_U;
        b += MM_V;
    }
    for (int i = 0; i < u; i++) {
        _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
    }
}

static void micro(int u, int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                  __mmask16 m0, __mmask16 m1, int load) {
    switch (u) {
    case 12:
        micro_tile(12, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 11:
        micro_tile(11, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 10:
        micro_tile(10, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 9:
        micro_tile(9, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 8:
        micro_tile(8, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 7:
        micro_tile(7, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 6:
        micro_tile(6, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 5:
        micro_tile(5, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 4:
        micro_tile(4, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 3:
        micro_tile(3, kc, a, b, c, ldc, m0, m1, load);
        break;
    case 2:
        micro_tile(2, kc, a, b, c, ldc, m0, m1, load);
        break;
    default:
        micro_tile(1, kc, a, b, c, ldc, m0, m1, load);
        break;
    }
}

/* ---- forward GEMM --------------------------------------------------------- */

/* panel[k][r] = W[j0 + r, k0 + k] for r < nr and 0 for nr <= r < MM_V, k < kc,
 * read from rows at `base` with pitch ld bytes, elements of `kind`. */
static ALWAYS_INLINE void pack_fwd_kind(const int kind, float *panel, const uint8_t *base,
                                        uint64_t ld, int64_t nr, int64_t kc) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    for (int h = 0; h < MM_V / 16; h++) {
        const int64_t rn = nr - 16 * h;
        const uint8_t *rows = base + (uint64_t)(16 * h) * ld;
        int64_t k = 0;
        if (rn >= 16) /* whole 16 x 16 blocks: unmasked loads and stores */
            for (; k + 16 <= kc; k += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = load_w16_full(kind, rows + (uint64_t)i * ld + k * esize);
                transpose16(r);
                for (int t = 0; t < 16; t++) _mm512_store_ps(panel + (k + t) * MM_V + 16 * h, r[t]);
            }
        for (; k < kc; k += 16) { /* ragged edges: missing rows are zeros */
            const int64_t kn = min64(16, kc - k);
            const __mmask16 km = lanes(kn);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rn ? load_w16(kind, rows + (uint64_t)i * ld + k * esize, km)
                              : _mm512_setzero_ps();
            transpose16(r);
            for (int t = 0; t < kn; t++) _mm512_store_ps(panel + (k + t) * MM_V + 16 * h, r[t]);
        }
    }
}

static void pack_fwd(const mm_src *w, float *panel, float *tmp, int64_t j0, int64_t nr, int64_t k0,
                     int64_t kc) {
    switch (w->kind) {
    case MM_W_F32:
        pack_fwd_kind(MM_W_F32, panel, w->data + (uint64_t)j0 * w->row_bytes + (uint64_t)k0 * 4,
                      w->row_bytes, nr, kc);
        break;
    case MM_W_F16:
        pack_fwd_kind(MM_W_F16, panel, w->data + (uint64_t)j0 * w->row_bytes + (uint64_t)k0 * 2,
                      w->row_bytes, nr, kc);
        break;
    case MM_W_BF16:
        pack_fwd_kind(MM_W_BF16, panel, w->data + (uint64_t)j0 * w->row_bytes + (uint64_t)k0 * 2,
                      w->row_bytes, nr, kc);
        break;
    default:
        dequant_rows(w, tmp, kc, j0, nr, k0, kc);
        pack_fwd_kind(MM_W_F32, panel, (const uint8_t *)tmp, (uint64_t)kc * 4, nr, kc);
        break;
    }
}

/* Asks for the weight bytes of rows [j0, j0 + nr), elements [k0, k0 + kc) to
 * be brought into cache: the panel after the current one, so that its DRAM
 * latency overlaps the current panel's arithmetic. */
static void prefetch_panel(const mm_src *w, int64_t j0, int64_t nr, int64_t k0, int64_t kc) {
    const uint64_t from = (uint64_t)(k0 / w->block_size) * (uint64_t)w->type_size;
    const uint64_t bytes = (uint64_t)(kc / w->block_size) * (uint64_t)w->type_size;
    for (int64_t r = 0; r < nr; r++) {
        const char *row = (const char *)w->data + (uint64_t)(j0 + r) * w->row_bytes + from;
        for (uint64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    }
}

/* One packed panel (weight rows j0.., reduction steps k0..) against every
 * token panel. */
static void forward_panel(const mm_src *w, float *y, int64_t ldy, const float *xp, int64_t ntok,
                          int64_t d0, int64_t depth, int64_t j0, int64_t nr, int64_t k0,
                          float *scratch) {
    const int64_t npan = (ntok + MM_U - 1) / MM_U, kc = min64(MM_KC, depth - k0);
    float *panel = scratch;                       /* (MM_KC, MM_V) */
    float *tmp = scratch + (int64_t)MM_KC * MM_V; /* (MM_V, MM_KC) dequantized rows */
    pack_fwd(w, panel, tmp, j0, nr, d0 + k0, kc);
    const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
    for (int64_t p = 0; p < npan; p++)
        micro((int)min64(MM_U, ntok - p * MM_U), kc, xp + p * depth * MM_U + k0 * MM_U, panel,
              y + p * MM_U * ldy + j0, ldy, m0, m1, d0 + k0 > 0);
}

static void mm512_forward_rows(const mm_src *w, float *y, int64_t ldy, const float *xp, int64_t ntok,
                        int64_t d0, int64_t depth, int64_t r0, int64_t r1, float *scratch) {
    /* Panels go k block by k block, all the task's rows in each, so that one
     * k block of the activations stays in L2 for all of them. */
    for (int64_t k0 = 0; k0 < depth; k0 += MM_KC)
        for (int64_t j0 = r0; j0 < r1; j0 += MM_V) {
            int64_t nj = j0 + MM_V, nk = k0; /* the next panel */
            if (nj >= r1) nj = r0, nk += MM_KC;
            if (nk < depth)
                prefetch_panel(w, nj, min64(MM_V, r1 - nj), d0 + nk, min64(MM_KC, depth - nk));
            forward_panel(w, y, ldy, xp, ntok, d0, depth, j0, min64(MM_V, r1 - j0), k0, scratch);
        }
}

/* ---- backward GEMM -------------------------------------------------------- */

/* panels[jr][k][v] = W[k0 + k, c0 + jr * MM_V + v] for columns below c0 + nc,
 * else 0; k < kc. Row segments start at `base` + k * ld bytes. */
static ALWAYS_INLINE void pack_bwd_row(const int kind, float *panels, const uint8_t *row,
                                       int64_t nc, int64_t k, int64_t kc) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    for (int64_t c = 0; c < nc; c += MM_V) {
        float *dst = panels + (c / MM_V) * kc * MM_V + k * MM_V;
        _mm512_store_ps(dst, load_w16(kind, row + c * esize, lanes(nc - c)));
        _mm512_store_ps(dst + 16, load_w16(kind, row + (c + 16) * esize, lanes(nc - c - 16)));
    }
}

static void pack_bwd(const mm_src *w, float *panels, float *tmp, int64_t c0, int64_t nc, int64_t k0,
                     int64_t kc) {
    for (int64_t k = 0; k < kc; k++) {
        const uint8_t *row = w->data + (uint64_t)(k0 + k) * w->row_bytes;
        switch (w->kind) {
        case MM_W_F32:
            pack_bwd_row(MM_W_F32, panels, row + c0 * 4, nc, k, kc);
            break;
        case MM_W_F16:
            pack_bwd_row(MM_W_F16, panels, row + c0 * 2, nc, k, kc);
            break;
        case MM_W_BF16:
            pack_bwd_row(MM_W_BF16, panels, row + c0 * 2, nc, k, kc);
            break;
        default:
            dequant_rows(w, tmp, nc, k0 + k, 1, c0, nc);
            pack_bwd_row(MM_W_F32, panels, (const uint8_t *)tmp, nc, k, kc);
            break;
        }
    }
}

static void mm512_backward_cols(const mm_src *w, float *dx, int64_t ldx, const float *dyp, int64_t ntok,
                         int64_t d0, int64_t depth, int64_t c0, int64_t c1, float *scratch) {
    const int64_t npan = (ntok + MM_U - 1) / MM_U;
    const int64_t nc = c1 - c0;
    const int64_t kcb = mm_bwd_kc(w);
    float *panels = scratch;             /* (nc / MM_V, kcb, MM_V) */
    float *tmp = scratch + MM_BWD_BLOCK; /* one dequantized row segment */
    for (int64_t k0 = 0; k0 < depth; k0 += kcb) {
        const int64_t kc = min64(kcb, depth - k0);
        pack_bwd(w, panels, tmp, c0, nc, d0 + k0, kc);
        for (int64_t c = 0; c < nc; c += MM_V) {
            const __mmask16 m0 = lanes(nc - c), m1 = lanes(nc - c - 16);
            const float *b = panels + (c / MM_V) * kc * MM_V;
            for (int64_t p = 0; p < npan; p++)
                micro((int)min64(MM_U, ntok - p * MM_U), kc, dyp + p * depth * MM_U + k0 * MM_U, b,
                      dx + p * MM_U * ldx + c0 + c, ldx, m0, m1, 1);
        }
    }
}

/* ---- GEMV ----------------------------------------------------------------- */

/* acc[r][t] += lane-wise products of weight rows w[r] (elements of `kind`)
 * and token rows x + t * ldx over kn elements. */
static ALWAYS_INLINE void gemv_span(const int R, const int T, const int kind,
                                    const uint8_t *const *wr, const float *x, int64_t ldx,
                                    int64_t kn, __m512 acc[MM_GEMV_MAXR][MM_GEMV_T]) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    int64_t k = 0;
    for (; k + 16 <= kn; k += 16) {
        __m512 wv[MM_GEMV_MAXR];
        for (int r = 0; r < R; r++) wv[r] = load_w16_full(kind, wr[r] + k * esize);
        for (int t = 0; t < T; t++) {
            const __m512 xv = _mm512_loadu_ps(x + t * ldx + k);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    if (k < kn) {
        const __mmask16 km = lanes(kn - k);
        __m512 wv[MM_GEMV_MAXR];
        for (int r = 0; r < R; r++) wv[r] = load_w16(kind, wr[r] + k * esize, km);
        for (int t = 0; t < T; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(km, x + t * ldx + k);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
}

/* A GEMV-only kind: q8_0 blocks are dequantized in registers (the same
 * operations as dequant_q8_0, so the same values) and applied straight away,
 * with no trip through scratch. (The same for q4_K measured slower than its
 * dequantize-to-L1 path: its per-sub-block scales cost too much per row.) */
enum { GEMV_Q8_0 = 16 };

/* gemv_span for whole q8_0 rows of `depth` elements. */
static ALWAYS_INLINE void gemv_span_q8_0(const int R, const int T, const uint8_t *const *wr,
                                         const float *x, int64_t ldx, int64_t depth,
                                         __m512 acc[MM_GEMV_MAXR][MM_GEMV_T]) {
    for (int64_t b = 0; b < depth / 32; b++) {
        __m512 w0[MM_GEMV_MAXR], w1[MM_GEMV_MAXR];
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = wr[r] + b * 34;
            const __m512 d = _mm512_set1_ps(f16_scale(blk));
            w0[r] = _mm512_mul_ps(i8x16_to_ps(_mm_loadu_si128((const __m128i *)(blk + 2))), d);
            w1[r] = _mm512_mul_ps(i8x16_to_ps(_mm_loadu_si128((const __m128i *)(blk + 18))), d);
        }
        for (int t = 0; t < T; t++) {
            const __m512 xv = _mm512_loadu_ps(x + t * ldx + 32 * b);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(w0[r], xv, acc[r][t]);
        }
        for (int t = 0; t < T; t++) {
            const __m512 xv = _mm512_loadu_ps(x + t * ldx + 32 * b + 16);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(w1[r], xv, acc[r][t]);
        }
    }
}

/* y[t, j + r] = W[j + r, :] . x[t, :] for r < nr (<= R), t < T. */
static ALWAYS_INLINE void gemv_tile(const int R, const int T, const int kind, const mm_src *w,
                                    int64_t j, int64_t nr, const float *x, int64_t ldx, float *y,
                                    int64_t ldy, float *tmp) {
    __m512 acc[MM_GEMV_MAXR][MM_GEMV_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const uint8_t *wr[MM_GEMV_MAXR];
    const int64_t depth = w->cols;
    if (kind == MM_W_DEQUANT) {
        for (int r = 0; r < R; r++) wr[r] = (const uint8_t *)(tmp + min64(r, nr - 1) * MM_GEMV_KB);
        for (int64_t k0 = 0; k0 < depth; k0 += MM_GEMV_KB) {
            const int64_t kn = min64(MM_GEMV_KB, depth - k0);
            dequant_rows(w, tmp, MM_GEMV_KB, j, nr, k0, kn);
            gemv_span(R, T, MM_W_F32, wr, x + k0, ldx, kn, acc);
        }
    } else {
        for (int r = 0; r < R; r++)
            wr[r] = w->data + (uint64_t)(j + min64(r, nr - 1)) * w->row_bytes;
        if (kind == GEMV_Q8_0)
            gemv_span_q8_0(R, T, wr, x, ldx, depth, acc);
        else
            gemv_span(R, T, kind, wr, x, ldx, depth, acc);
    }
    for (int r = 0; r < R; r++)
        if (r < nr)
            for (int t = 0; t < T; t++) y[t * ldy + j + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* Rows [r0, r1) for T tokens, R rows at a time. */
static ALWAYS_INLINE void gemv_pass(const int R, const int T, const int kind, const mm_src *w,
                                    int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y,
                                    int64_t ldy, float *tmp) {
    for (int64_t j = r0; j < r1; j += R) {
        /* ask for the next tile's rows while this one computes (they are read
         * once, from DRAM: more requests in flight is more bandwidth) */
        const int64_t next = j + R < r1 ? j + R : r1;
        const char *p = (const char *)w->data + (uint64_t)next * w->row_bytes;
        const uint64_t bytes = (uint64_t)min64(R, r1 - next) * w->row_bytes;
        for (uint64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
        gemv_tile(R, T, kind, w, j, min64(R, r1 - j), x, ldx, y, ldy, tmp);
    }
}

/* R for T tokens: as many rows as keep R x T accumulators within 24 zmm. */
static ALWAYS_INLINE void gemv_kind(const int kind, const mm_src *w, int64_t r0, int64_t r1,
                                    const float *x, int64_t ldx, int64_t nt, float *y, int64_t ldy,
                                    float *tmp) {
    switch (nt) {
    case 1:
        gemv_pass(8, 1, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 2:
        gemv_pass(8, 2, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 3:
        gemv_pass(6, 3, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 4:
        gemv_pass(6, 4, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 5:
        gemv_pass(4, 5, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 6:
        gemv_pass(4, 6, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    case 7:
        gemv_pass(3, 7, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    default:
        gemv_pass(2, 8, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
    }
}

enum {
    GEMV_G = 32,    /* weight rows per group of the blocked GEMV: in L2 for its later passes */
    GEMV_KBL = 256 /* depth per block of the blocked GEMV: 8 tokens' activations, 8 KiB in L1 */
};

/* acc[r][t] += lane-wise products of weight rows wr[0], wr[1] and 8 tokens'
 * activations packed as xs[step][token][16] (zero past the depth), over kn
 * elements from k = 0: per lane the same FMAs as gemv_span. */
static ALWAYS_INLINE void gemv_span_packed(const int kind, const uint8_t *const *wr,
                                           const float *xs, int64_t kn, __m512 acc[2][8]) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    int64_t k = 0;
    for (; k < kn; k += 16, xs += 128) {
        __m512 wv[2];
        if (k + 16 <= kn) {
            for (int r = 0; r < 2; r++) wv[r] = load_w16_full(kind, wr[r] + k * esize);
        } else {
            const __mmask16 km = lanes(kn - k);
            for (int r = 0; r < 2; r++) wv[r] = load_w16(kind, wr[r] + k * esize, km);
        }
        for (int t = 0; t < 8; t++) {
            __m512 xv = _mm512_load_ps(xs + 16 * t);
            __asm__("" : "+v"(xv)); /* one load per token, not one per row: the loads bound */
            for (int r = 0; r < 2; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
}

/* Requests kn elements (esize bytes each) of one row into L2 (L2) or L1; a
 * whole GEMV_KBL block as a loop of constant length, no bound to test per
 * line. */
static ALWAYS_INLINE void fetch_lines(const int L2, const char *q, int64_t bytes) {
    if (L2) /* the hint must be a constant to every compiler, clang too */
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(q + b, _MM_HINT_T1);
    else
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
}

static ALWAYS_INLINE void fetch_piece(const int64_t esize, const int L2, const char *q, int64_t kn) {
    if (kn == GEMV_KBL)
        fetch_lines(L2, q, GEMV_KBL * esize);
    else
        fetch_lines(L2, q, kn * esize);
}

/* xp[pass][step][token][16] = the activations of tokens [0, 8 * passes),
 * zero past the depth. */
static void gemv_pack8(float *xp, const float *x, int64_t ldx, int64_t depth, int64_t passes) {
    const int64_t steps = (depth + 15) / 16;
    for (int64_t t = 0; t < 8 * passes; t++) {
        float *dst = xp + (t / 8) * steps * 128 + (t % 8) * 16;
        for (int64_t s = 0; s < steps; s++) {
            const __mmask16 km = lanes(min64(16, depth - 16 * s));
            _mm512_store_ps(dst + s * 128, _mm512_maskz_loadu_ps(km, x + t * ldx + 16 * s));
        }
    }
}

/* Passes of 8 tokens over f32/f16/bf16 rows [r0, r1) for n >= 8 tokens
 * (batched decode: the tokens of many streams). Rows go GEMV_G at a time,
 * every pass of a group before the next group, so a row comes from DRAM once
 * however many passes (fetched into L2 during the previous group's first two
 * passes, a row of each pair per pass: measured +15% at 16 streams against
 * all of it into L1 in the first pass; each pair's piece is fetched into L1
 * while the pair before it multiplies: +5% at 64 streams);
 * the depth goes in blocks of GEMV_KBL, the activations packed once into xp
 * (n x depth rounded up to 16 floats: mm_scratch_floats). A (row, token)'s
 * 16 lane sums wait in `part` between blocks, so each lane is the same chain
 * of FMAs as in gemv_tile and a stream's bits do not depend on the batch.
 * Returns the tokens done (a multiple of 8); the rest go to gemv_kind. */
static ALWAYS_INLINE int64_t gemv_blocked(const int kind, const mm_src *w, int64_t r0, int64_t r1,
                                          const float *x, int64_t ldx, int64_t n, float *y,
                                          int64_t ldy, float *xp) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2, depth = w->cols, passes = n / 8;
    const int64_t steps = (depth + 15) / 16;
    gemv_pack8(xp, x, ldx, depth, passes);
    __m512 part[GEMV_G][8];
    for (int64_t g0 = r0; g0 < r1; g0 += GEMV_G) {
        const int64_t gn = min64(GEMV_G, r1 - g0);
        for (int64_t p = 0; p < passes; p++) {
            for (int r = 0; r < GEMV_G; r++)
                for (int t = 0; t < 8; t++) part[r][t] = _mm512_setzero_ps();
            for (int64_t k0 = 0; k0 < depth; k0 += GEMV_KBL) {
                const int64_t kn = min64(GEMV_KBL, depth - k0);
                const float *xs = xp + p * steps * 128 + (k0 / 16) * 128;
                for (int64_t j = 0; j < gn; j += 2) { /* an odd last row is done twice */
                    __m512 acc[2][8];
                    const uint8_t *wr[2];
                    for (int r = 0; r < 2; r++) {
                        wr[r] = w->data + (uint64_t)(g0 + min64(j + r, gn - 1)) * w->row_bytes +
                                k0 * esize;
                        for (int t = 0; t < 8; t++) acc[r][t] = part[j + r][t];
                    }
                    /* the next group's piece, from DRAM into L2: row j + r during pass r
                     * (both in pass 0 when there is one), so the requests spread out */
                    for (int r = 0; r < 2 && g0 + GEMV_G < r1; r++) {
                        if (passes > 1 && p != r) continue;
                        const int64_t row = min64(g0 + GEMV_G + j + r, r1 - 1);
                        const char *q = (const char *)w->data + (uint64_t)row * w->row_bytes + k0 * esize;
                        fetch_piece(esize, 1, q, kn);
                    }
                    for (int r = 0; r < 2 && j + 2 + r < gn; r++) { /* the next pair's, L2 to L1 */
                        const char *q = (const char *)wr[r] + 2 * w->row_bytes;
                        fetch_piece(esize, 0, q, kn);
                    }
                    gemv_span_packed(kind, wr, xs, kn, acc);
                    for (int r = 0; r < 2; r++)
                        for (int t = 0; t < 8; t++) part[j + r][t] = acc[r][t];
                }
            }
            for (int64_t r = 0; r < gn; r++)
                for (int t = 0; t < 8; t++)
                    y[(8 * p + t) * ldy + g0 + r] = _mm512_reduce_add_ps(part[r][t]);
        }
    }
    return 8 * passes;
}

static void mm512_gemv_rows(const mm_src *w, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t n,
                     int64_t r0, int64_t r1, float *scratch) {
    int64_t first = 0;
    if (n >= 8) {
        if (w->kind == MM_W_F16) first = gemv_blocked(MM_W_F16, w, r0, r1, x, ldx, n, y, ldy, scratch);
        else if (w->kind == MM_W_BF16) first = gemv_blocked(MM_W_BF16, w, r0, r1, x, ldx, n, y, ldy, scratch);
        else if (w->kind == MM_W_F32) first = gemv_blocked(MM_W_F32, w, r0, r1, x, ldx, n, y, ldy, scratch);
    }
    for (int64_t t0 = first; t0 < n; t0 += MM_GEMV_T) {
        const int64_t nt = min64(MM_GEMV_T, n - t0);
        const float *xt = x + t0 * ldx;
        float *yt = y + t0 * ldy;
        switch (w->kind) {
        case MM_W_F32:
            gemv_kind(MM_W_F32, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        case MM_W_F16:
            gemv_kind(MM_W_F16, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        case MM_W_BF16:
            gemv_kind(MM_W_BF16, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        default:
            if (w->dtype == CART_Q8_0)
                gemv_kind(GEMV_Q8_0, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            else
                gemv_kind(MM_W_DEQUANT, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        }
    }
}

/* ---- attention ------------------------------------------------------------ */

/* The 16 lane sums of 16 accumulators as one vector (element i = the sum of
 * acc[i]'s lanes): pairs inside 128-bit lanes, then across lanes, in a fixed
 * tree, so a score never depends on which other keys share its block. */
static inline __m512 lane_sums(const __m512 *acc) {
    __m512 s1[8], s2[4];
    for (int32_t k = 0; k < 8; k++)
        s1[k] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * k], acc[2 * k + 1]),
                              _mm512_unpackhi_ps(acc[2 * k], acc[2 * k + 1]));
    for (int32_t k = 0; k < 4; k++) {
        __m512d c = _mm512_castps_pd(s1[2 * k]), d = _mm512_castps_pd(s1[2 * k + 1]);
        s2[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x88),
                              _mm512_shuffle_f32x4(s2[0], s2[1], 0xdd));
    __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x88),
                              _mm512_shuffle_f32x4(s2[2], s2[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x88), _mm512_shuffle_f32x4(v0, v1, 0xdd));
}

/* 16 keys' scores (M < 16: the first M; the rest of acc stays zero) from
 * rows of f32 (F16 0) or f16 (F16 1): per key one chain of fused
 * multiply-adds over d in 16 lanes, then the fixed tree of lane_sums. M and
 * NV are constants where it matters, so that the 16 accumulators stay in
 * registers. */
static ALWAYS_INLINE __m512 scores_block(const int M, const int NV, const int F16, const float *q, const void *k,
                                         int64_t stride) {
    __m512 acc[16];
    for (int32_t i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int32_t v = 0; v < NV; v++) {
        const __m512 qv = _mm512_loadu_ps(q + 16 * v);
        for (int32_t i = 0; i < M; i++) {
            const __m512 kv = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                        (const __m256i *)((const uint16_t *)k + i * stride + 16 * v)))
                                  : _mm512_loadu_ps((const float *)k + i * stride + 16 * v);
            acc[i] = _mm512_fmadd_ps(qv, kv, acc[i]);
        }
    }
    return lane_sums(acc);
}

static ALWAYS_INLINE void scores_rows(const int NV, const int F16, float *score, const float *q, const void *k,
                                      int64_t stride, int32_t head_dim, int64_t nt) {
    const int64_t esize = F16 ? 2 : 4;
    const int32_t nv = NV ? NV : head_dim / 16;
    int64_t i0 = 0;
    for (; i0 + 16 <= nt; i0 += 16)
        _mm512_storeu_ps(score + i0, NV ? scores_block(16, NV, F16, q, (const char *)k + i0 * stride * esize, stride)
                                        : scores_block(16, nv, F16, q, (const char *)k + i0 * stride * esize, stride));
    if (i0 < nt) { /* the last keys: past nt nothing is read */
        const int32_t m = (int32_t)(nt - i0);
        const __m512 out = scores_block(m, nv, F16, q, (const char *)k + i0 * stride * esize, stride);
        _mm512_mask_storeu_ps(score + i0, (__mmask16)((1u << m) - 1), out);
    }
}

/* acc[d] += sum over i < nt of p[i] * v[i][d], in i order: one chain of
 * fused multiply-adds per output, NV (a constant where it matters) vectors
 * of 16 outputs in registers. */
static ALWAYS_INLINE void values_span(const int NV, const int F16, float *acc, const float *p, const void *v,
                                      int64_t stride, int64_t nt) {
    __m512 a[16];
    for (int32_t j = 0; j < NV; j++) a[j] = _mm512_loadu_ps(acc + 16 * j);
    for (int64_t i = 0; i < nt; i++) {
        const __m512 b = _mm512_set1_ps(p[i]);
        for (int32_t j = 0; j < NV; j++) {
            const __m512 vv = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                        (const __m256i *)((const uint16_t *)v + i * stride + 16 * j)))
                                  : _mm512_loadu_ps((const float *)v + i * stride + 16 * j);
            a[j] = _mm512_fmadd_ps(b, vv, a[j]);
        }
    }
    for (int32_t j = 0; j < NV; j++) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

static ALWAYS_INLINE void values_rows(const int F16, float *acc, const float *p, const void *v, int64_t stride,
                                      int64_t nt, int32_t head_dim) {
    const int64_t esize = F16 ? 2 : 4;
    for (int32_t d0 = 0; d0 < head_dim; d0 += 256) { /* 256 outputs in registers at a time */
        const int32_t nv = (head_dim - d0 < 256 ? head_dim - d0 : 256) / 16;
        const void *vd = (const char *)v + d0 * esize;
        if (nv == 16) values_span(16, F16, acc + d0, p, vd, stride, nt);
        else if (nv == 8) values_span(8, F16, acc + d0, p, vd, stride, nt);
        else if (nv == 4) values_span(4, F16, acc + d0, p, vd, stride, nt);
        else if (nv == 2) values_span(2, F16, acc + d0, p, vd, stride, nt);
        else values_span(nv, F16, acc + d0, p, vd, stride, nt);
    }
}

/* score[i] = q . kt[i] for the keys i < nt (rows `stride` floats apart). */
static void rows_scores(float *score, const float *q, const float *kt, int64_t stride, int32_t head_dim,
                        int64_t nt) {
    if (head_dim == 128) scores_rows(8, 0, score, q, kt, stride, head_dim, nt);
    else if (head_dim == 64) scores_rows(4, 0, score, q, kt, stride, head_dim, nt);
    else if (head_dim == 32) scores_rows(2, 0, score, q, kt, stride, head_dim, nt);
    else if (head_dim == 256) scores_rows(16, 0, score, q, kt, stride, head_dim, nt);
    else scores_rows(0, 0, score, q, kt, stride, head_dim, nt);
}

/* acc[d] += sum over i < nt of p[i] * v[i][d], in i order. */
static void rows_values(float *acc, const float *p, const float *vt, int64_t stride, int64_t nt,
                        int32_t head_dim) {
    values_rows(0, acc, p, vt, stride, nt, head_dim);
}

/* rows_scores and rows_values straight from f16 rows (widened in registers):
 * the same products and sums, so the same bits. */
static void rows_scores_f16(float *score, const float *q, const uint16_t *k, int64_t stride,
                            int32_t head_dim, int64_t nt) {
    if (head_dim == 128) scores_rows(8, 1, score, q, k, stride, head_dim, nt);
    else if (head_dim == 64) scores_rows(4, 1, score, q, k, stride, head_dim, nt);
    else if (head_dim == 32) scores_rows(2, 1, score, q, k, stride, head_dim, nt);
    else if (head_dim == 256) scores_rows(16, 1, score, q, k, stride, head_dim, nt);
    else scores_rows(0, 1, score, q, k, stride, head_dim, nt);
}

static void rows_values_f16(float *acc, const float *p, const uint16_t *v, int64_t stride, int64_t nt,
                            int32_t head_dim) {
    values_rows(1, acc, p, v, stride, nt, head_dim);
}

/* NQ (2 or 4) queries against up to 16 / NQ keys of f16 rows: the 16
 * accumulators of scores_block, query a's key i in acc[a * 16 / NQ + i],
 * each the same chain and tree as scores_block gives it alone, every key
 * vector widened once for the NQ queries. */
static ALWAYS_INLINE void scores_f16_nq(const int NQ, const int NV, float *score, int64_t ld, const float *const *q,
                                        const uint16_t *k, int64_t stride, int32_t m) {
    const int KB = 16 / NQ;
    __m512 acc[16];
    for (int32_t i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int32_t v = 0; v < NV; v++) {
        __m512 qv[4];
        for (int32_t a = 0; a < NQ; a++) qv[a] = _mm512_loadu_ps(q[a] + 16 * v);
        for (int32_t i = 0; i < KB; i++) {
            if (i >= m) break;
            const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + i * stride + 16 * v)));
            for (int32_t a = 0; a < NQ; a++) acc[a * KB + i] = _mm512_fmadd_ps(qv[a], kv, acc[a * KB + i]);
        }
    }
    float sums[16];
    _mm512_storeu_ps(sums, lane_sums(acc));
    for (int32_t a = 0; a < NQ; a++) memcpy(score + a * ld, sums + a * KB, sizeof(float) * (size_t)m);
}

/* Keys [i0, i0 + n) of the nq queries: fours, then twos (NV vectors of
 * head_dim; 0: no block kernel for this head size), then one at a time. */
static ALWAYS_INLINE void scores_f16_keys(const int NV, float *score, int64_t ld, const float *const *q, int32_t nq,
                                          const uint16_t *k, int64_t stride, int32_t head_dim, int64_t i0, int64_t n) {
    int32_t a = 0;
    for (; NV && a + 4 <= nq; a += 4)
        for (int64_t i = i0; i < i0 + n; i += 4)
            scores_f16_nq(4, NV, score + a * ld + i, ld, q + a, k + i * stride, stride, (int32_t)min64(4, i0 + n - i));
    for (; NV && a + 2 <= nq; a += 2)
        for (int64_t i = i0; i < i0 + n; i += 8)
            scores_f16_nq(2, NV, score + a * ld + i, ld, q + a, k + i * stride, stride, (int32_t)min64(8, i0 + n - i));
    for (; a < nq; a++) rows_scores_f16(score + a * ld + i0, q[a], k + i0 * stride, stride, head_dim, n);
}

/* nq queries over the same nt f16 rows (a decode step's query heads of one
 * kv head), 8 keys at a time, each with its share of `next` requested
 * first; each score the bits of rows_scores_f16. */
static void rows_scores_f16_mq(float *score, int64_t ld, const float *const *q, int32_t nq, const uint16_t *k,
                               int64_t stride, int32_t head_dim, int64_t nt, const cart_fetch *next) {
    for (int64_t i = 0; i < nt; i += 8) {
        const int64_t n = min64(8, nt - i);
        fetch_share(next, i, n, nt);
        if (head_dim == 128) scores_f16_keys(8, score, ld, q, nq, k, stride, head_dim, i, n);
        else if (head_dim == 64) scores_f16_keys(4, score, ld, q, nq, k, stride, head_dim, i, n);
        else scores_f16_keys(0, score, ld, q, nq, k, stride, head_dim, i, n);
    }
}

/* NQ queries' outputs d0 .. d0 + 16 NV over nt f16 rows, in row order:
 * values_span's chains, each row vector widened once for the NQ queries. */
static ALWAYS_INLINE void values_f16_nq(const int NQ, const int NV, float *const *acc, int32_t d0, const float *p,
                                        int64_t ld, const uint16_t *v, int64_t stride, int64_t nt,
                                        const cart_fetch *next) {
    __m512 a[4][8];
    for (int32_t b = 0; b < NQ; b++)
        for (int32_t j = 0; j < NV; j++) a[b][j] = _mm512_loadu_ps(acc[b] + d0 + 16 * j);
    for (int64_t i = 0; i < nt; i++) {
        __m512 w[4];
        fetch_share(next, i, 1, nt);
        for (int32_t b = 0; b < NQ; b++) w[b] = _mm512_set1_ps(p[b * ld + i]);
        for (int32_t j = 0; j < NV; j++) {
            const __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + i * stride + d0 + 16 * j)));
            for (int32_t b = 0; b < NQ; b++) a[b][j] = _mm512_fmadd_ps(w[b], vv, a[b][j]);
        }
    }
    for (int32_t b = 0; b < NQ; b++)
        for (int32_t j = 0; j < NV; j++) _mm512_storeu_ps(acc[b] + d0 + 16 * j, a[b][j]);
}

/* nq queries' value sums over the same nt f16 rows: 16 outputs' chains in
 * registers per query (two queries by 128 outputs or four by 64 at a
 * time), each output the bits of rows_values_f16. `next` is requested over
 * the first pass's rows, or 16 rows at a time when no pass has more than
 * one query (the chains go on from the stored sums: the same bits). */
static void rows_values_f16_mq(float *const *acc, const float *p, int64_t ld, int32_t nq, const uint16_t *v,
                               int64_t stride, int64_t nt, int32_t head_dim, const cart_fetch *next) {
    int32_t a = 0;
    if (head_dim % 64 == 0) {
        for (; a + 4 <= nq; a += 4)
            for (int32_t d0 = 0; d0 < head_dim; d0 += 64, next = NULL)
                values_f16_nq(4, 4, acc + a, d0, p + a * ld, ld, v, stride, nt, next);
        for (; a + 2 <= nq; a += 2)
            for (int32_t d0 = 0; d0 < head_dim; d0 += 128, next = NULL) {
                if (head_dim - d0 >= 128) values_f16_nq(2, 8, acc + a, d0, p + a * ld, ld, v, stride, nt, next);
                else values_f16_nq(2, 4, acc + a, d0, p + a * ld, ld, v, stride, nt, next);
            }
    }
    if (a == nq) return;
    for (int64_t i = 0; i < nt; i += 16) {
        const int64_t n = min64(16, nt - i);
        fetch_share(next, i, n, nt);
        for (int32_t b = a; b < nq; b++) rows_values_f16(acc[b], p + b * ld + i, v + i * stride, stride, n, head_dim);
    }
}

/* Four queries against four keys: the 16 accumulators of scores_block, one
 * per (query, key), so each score is the same chain and tree; query a's four
 * scores are the 128-bit lane a of the sums. */
static ALWAYS_INLINE void scores_4x4(const int NV, float *score, int64_t ld, const float *const *q,
                                     const float *k, int64_t stride) {
    __m512 acc[16];
    for (int32_t i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int32_t v = 0; v < NV; v++) {
        __m512 kv[4];
        for (int32_t i = 0; i < 4; i++) kv[i] = _mm512_loadu_ps(k + i * stride + 16 * v);
        for (int32_t a = 0; a < 4; a++) {
            const __m512 qv = _mm512_loadu_ps(q[a] + 16 * v);
            for (int32_t i = 0; i < 4; i++) acc[4 * a + i] = _mm512_fmadd_ps(qv, kv[i], acc[4 * a + i]);
        }
    }
    const __m512 sums = lane_sums(acc);
    _mm_storeu_ps(score, _mm512_extractf32x4_ps(sums, 0));
    _mm_storeu_ps(score + ld, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(score + 2 * ld, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(score + 3 * ld, _mm512_extractf32x4_ps(sums, 3));
}

static ALWAYS_INLINE void scores_mq_nv(const int NV, float *score, int64_t ld, const float *const *q, int32_t nq,
                                       const float *k, int64_t stride, int32_t head_dim, const int64_t *nt) {
    int32_t a = 0;
    for (; a + 4 <= nq; a += 4) { /* blocks of 4 keys up to the four's most */
        const int64_t n = max64(max64(nt[a], nt[a + 1]), max64(nt[a + 2], nt[a + 3]));
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) scores_4x4(NV, score + a * ld + i, ld, q + a, k + i * stride, stride);
        for (int32_t b = a; b < a + 4; b++) /* the last keys, one query at a time */
            if (nt[b] > i) rows_scores(score + b * ld + i, q[b], k + i * stride, stride, head_dim, nt[b] - i);
    }
    for (; a < nq; a++) rows_scores(score + a * ld, q[a], k, stride, head_dim, nt[a]);
}

static void rows_scores_mq(float *score, int64_t ld, const float *const *q, int32_t nq, const float *k,
                           int64_t stride, int32_t head_dim, const int64_t *nt) {
    if (head_dim == 128) scores_mq_nv(8, score, ld, q, nq, k, stride, head_dim, nt);
    else if (head_dim == 64) scores_mq_nv(4, score, ld, q, nq, k, stride, head_dim, nt);
    else if (head_dim == 32) scores_mq_nv(2, score, ld, q, nq, k, stride, head_dim, nt);
    else if (head_dim == 256) scores_mq_nv(16, score, ld, q, nq, k, stride, head_dim, nt);
    else for (int32_t a = 0; a < nq; a++) rows_scores(score + a * ld, q[a], k, stride, head_dim, nt[a]);
}

/* Four queries' outputs d0 .. d0 + 16 NV (NV <= 4) over the rows, in row
 * order: values_span's chains, the row's vectors loaded once for the four,
 * query b over its first nt[b] rows (past the fewest, a masked FMA leaves
 * the others' sums as they are). */
static ALWAYS_INLINE void values_4q_row(const int NV, const int MASKED, __m512 a[4][4], const float *p, int64_t ld,
                                        const float *vrow, int64_t i, const int64_t *nt) {
    __m512 vv[4];
    for (int32_t j = 0; j < NV; j++) vv[j] = _mm512_loadu_ps(vrow + 16 * j);
    for (int32_t b = 0; b < 4; b++) {
        const __mmask16 on = !MASKED || i < nt[b] ? (__mmask16)0xffff : 0;
        const __m512 w = _mm512_set1_ps(p[b * ld + i]);
        for (int32_t j = 0; j < NV; j++) a[b][j] = _mm512_mask3_fmadd_ps(w, vv[j], a[b][j], on);
    }
}

static ALWAYS_INLINE void values_4q(const int NV, float *const *acc, int32_t d0, const float *p, int64_t ld,
                                    const float *v, int64_t stride, const int64_t *nt) {
    __m512 a[4][4];
    for (int32_t b = 0; b < 4; b++)
        for (int32_t j = 0; j < NV; j++) a[b][j] = _mm512_loadu_ps(acc[b] + d0 + 16 * j);
    const int64_t lo = min64(min64(nt[0], nt[1]), min64(nt[2], nt[3]));
    const int64_t hi = max64(max64(nt[0], nt[1]), max64(nt[2], nt[3]));
    for (int64_t i = 0; i < lo; i++) values_4q_row(NV, 0, a, p, ld, v + i * stride + d0, i, nt);
    for (int64_t i = lo; i < hi; i++) values_4q_row(NV, 1, a, p, ld, v + i * stride + d0, i, nt);
    for (int32_t b = 0; b < 4; b++)
        for (int32_t j = 0; j < NV; j++) _mm512_storeu_ps(acc[b] + d0 + 16 * j, a[b][j]);
}

static void rows_values_mq(float *const *acc, const float *p, int64_t ld, int32_t nq, const float *v,
                           int64_t stride, const int64_t *nt, int32_t head_dim) {
    int32_t a = 0;
    for (; a + 4 <= nq; a += 4)
        for (int32_t d0 = 0; d0 < head_dim; d0 += 64) {
            const int32_t nv = (head_dim - d0 < 64 ? head_dim - d0 : 64) / 16;
            if (nv == 4) values_4q(4, acc + a, d0, p + a * ld, ld, v, stride, nt + a);
            else if (nv == 3) values_4q(3, acc + a, d0, p + a * ld, ld, v, stride, nt + a);
            else if (nv == 2) values_4q(2, acc + a, d0, p + a * ld, ld, v, stride, nt + a);
            else values_4q(1, acc + a, d0, p + a * ld, ld, v, stride, nt + a);
        }
    for (; a < nq; a++) rows_values(acc[a], p + a * ld, v, stride, nt[a], head_dim);
}

/* dk[j] += ds[a][j] q[a], dv[j] += p[a][j] dout[a] for the queries in
 * order, 16 NV outputs of two rows in registers across the queries (NV a
 * constant); products and sums rounded apart, as kernels.h says. */
static ALWAYS_INLINE void outer_rows(const int NV, const int R, float *dst, const float *coef, int64_t ld,
                                     const float *const *x, int32_t nq, const int64_t *nt, int64_t j, int32_t d0,
                                     int32_t head_dim) {
    __m512 acc[2][8];
    for (int32_t r = 0; r < R; r++)
        for (int32_t e = 0; e < NV; e++) acc[r][e] = _mm512_loadu_ps(dst + (j + r) * head_dim + d0 + 16 * e);
    for (int32_t a = 0; a < nq; a++) {
        if (nt[a] <= j) continue; /* query a sees neither row */
        /* a query that sees row j but not j + 1 leaves the second's sums as they are */
        const __mmask16 on1 = R == 2 && nt[a] > j + 1 ? (__mmask16)0xffff : 0;
        __m512 c[2];
        for (int32_t r = 0; r < R; r++) c[r] = _mm512_set1_ps(coef[a * ld + j + r]);
        for (int32_t e = 0; e < NV; e++) {
            const __m512 xv = _mm512_loadu_ps(x[a] + d0 + 16 * e);
            acc[0][e] = _mm512_add_ps(acc[0][e], _mm512_mul_ps(c[0], xv));
            if (R == 2) acc[1][e] = _mm512_mask_add_ps(acc[1][e], on1, acc[1][e], _mm512_mul_ps(c[1], xv));
        }
    }
    for (int32_t r = 0; r < R; r++)
        for (int32_t e = 0; e < NV; e++) _mm512_storeu_ps(dst + (j + r) * head_dim + d0 + 16 * e, acc[r][e]);
}

static ALWAYS_INLINE void outer_span(const int NV, float *dst, const float *coef, int64_t ld, const float *const *x,
                                     int32_t nq, int64_t skip, const int64_t *nt, int32_t d0, int32_t head_dim) {
    int64_t most = 0;
    for (int32_t a = 0; a < nq; a++) most = max64(most, nt[a]);
    int64_t j = skip;
    for (; j + 2 <= most; j += 2) outer_rows(NV, 2, dst, coef, ld, x, nq, nt, j, d0, head_dim);
    if (j < most) outer_rows(NV, 1, dst, coef, ld, x, nq, nt, j, d0, head_dim);
}

static void outer_one(float *dst, const float *coef, int64_t ld, const float *const *x, int32_t nq, int64_t skip,
                      const int64_t *nt, int32_t head_dim) {
    for (int32_t d0 = 0; d0 < head_dim; d0 += 128) {
        const int32_t nv = (head_dim - d0 < 128 ? head_dim - d0 : 128) / 16;
        switch (nv) {
        case 8: outer_span(8, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 4: outer_span(4, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 7: outer_span(7, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 6: outer_span(6, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 5: outer_span(5, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 3: outer_span(3, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        case 2: outer_span(2, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        default: outer_span(1, dst, coef, ld, x, nq, skip, nt, d0, head_dim); break;
        }
    }
}

static void outer_add_512(float *dk, float *dv, const float *ds, const float *p, int64_t ld,
                          const float *const *q, const float *const *dout, int32_t nq, int64_t skip,
                          const int64_t *nt, int32_t head_dim) {
    outer_one(dk, ds, ld, q, nq, skip, nt, head_dim);
    outer_one(dv, p, ld, dout, nq, skip, nt, head_dim);
}

/* ---- conversions ---------------------------------------------------------- */

static void f16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * i))));
    /* 8 more (a head of 8 dims in an f16 cache): the same conversion, 8 wide */
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        const float f = cart_f16_to_f32(h);
        memcpy(dst + i, &f, 4); /* any alignment */
    }
}

static void f32_to_f16_n(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)((uint8_t *)dst + 2 * i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        float f;
        memcpy(&f, (const uint8_t *)src + 4 * i, 4);
        uint16_t h = cart_f32_to_f16(f);
        memcpy((uint8_t *)dst + 2 * i, &h, 2);
    }
}

static void bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, load_w16_full(MM_W_BF16, s + 2 * i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        const float f = cart_bf16_to_f32(h);
        memcpy(dst + i, &f, 4);
    }
}

static void f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i r = _mm512_castps_si512(round_act(_mm512_loadu_ps(src + i), MM_ROUND_BF16));
        _mm256_storeu_si256((__m256i *)((uint8_t *)dst + 2 * i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) {
        float f;
        memcpy(&f, (const uint8_t *)src + 4 * i, 4);
        uint16_t h = cart_f32_to_bf16(f);
        memcpy((uint8_t *)dst + 2 * i, &h, 2);
    }
}

/* ---- activations quantized for the integer products (qdot.h) ------------- */

/* 1 when the n floats (a multiple of 16) are all finite. */
static int all_finite(const float *x, int64_t n) {
    __mmask16 bad = 0;
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int64_t k = 0; k < n; k += 16) {
        const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + k));
        bad |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ); /* inf, or NaN (unordered) */
    }
    return bad == 0;
}

/* 16 floats times s, rounded to nearest even (the default MXCSR; values of
 * magnitude at most 128, where this is GGML's nearest_int). */
static inline __m512i scaled_rne(const float *x, __m512 s) {
    return _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), s));
}

static void quantize_row_32(qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 32;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16))));
        const float d = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        const __m512i q0 = scaled_rne(xb, id), q1 = scaled_rne(xb + 16, id);
        int8_t *q = a->q + i * a->cols + 32 * b;
        _mm_storeu_si128((__m128i *)(void *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm512_cvtepi32_epi8(q1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        qk_act_put32(a, i, b, d, sum);
    }
}

static void quantize_row_256(qk_act *a, const float *x, int64_t i) {
    const int64_t nb = a->cols / 256;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 256 * b;
        int8_t *q = a->q + i * a->cols + 256 * b;
        int32_t *s = a->s + i * (a->cols / 16) + 16 * b;
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * j)));
        const float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            qk_act_zero256(a, i, b);
            continue;
        }
        int at = 0; /* the first element of magnitude amax */
        for (int j = 0; j < 16; j++) {
            const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * j)),
                                                     _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (hit) {
                at = 16 * j + __builtin_ctz(hit);
                break;
            }
        }
        const float iscale = -127.0f / xb[at];
        const __m512 sc = _mm512_set1_ps(iscale);
        for (int j = 0; j < 16; j++) {
            const __m512i v = _mm512_min_epi32(scaled_rne(xb + 16 * j, sc), _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(void *)(q + 16 * j), _mm512_cvtepi32_epi8(v));
            s[j] = _mm512_reduce_add_epi32(v);
        }
        a->d[i * nb + b] = 1.0f / iscale;
    }
}

/* qdot.h's rules, 16 lanes at a time. */
static void qk_quantize_rows_512(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1) {
    qk_quantize_rows_by(a, x, ldx, i0, i1, all_finite, quantize_row_32, quantize_row_256);
}

/* ---- integer block products (qgeneric.h) ---------------------------------- */

#define QK_VNNI 0
#include "qk_avx512.h"
#define QK_T 4
#define QK_FN qk_groups_avx512
#include "qgeneric.h"

/* ---- e^x in double: exp.h's main path on 8 lanes -------------------------- */

#include "exp.h"

static void exp_n_512(double *y, const double *x, int64_t n) {
    const __m512d inv = _mm512_set1_pd(CART_EXP_INVLN2N), shift = _mm512_set1_pd(CART_EXP_SHIFT);
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 m = n - i >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (n - i)) - 1);
        const __m512d xv = _mm512_maskz_loadu_pd(m, x + i);
        const __m512i top = _mm512_sub_epi64(
            _mm512_and_si512(_mm512_srli_epi64(_mm512_castpd_si512(xv), 52), _mm512_set1_epi64(0x7ff)),
            _mm512_set1_epi64(CART_EXP_LOW));
        const __mmask8 special = _mm512_mask_cmpgt_epu64_mask(m, top, _mm512_set1_epi64(CART_EXP_SPAN));
        __m512d kd = _mm512_fmadd_pd(xv, inv, shift);
        const __m512i ki = _mm512_castpd_si512(kd);
        kd = _mm512_sub_pd(kd, shift);
        __m512d r = _mm512_fmadd_pd(kd, _mm512_set1_pd(CART_EXP_NEGLN2HIN), xv);
        r = _mm512_fmadd_pd(kd, _mm512_set1_pd(CART_EXP_NEGLN2LON), r);
        const __m512i idx = _mm512_slli_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(127)), 1);
        const __m512d tail = _mm512_i64gather_pd(idx, (const double *)cart_exp_tab, 8);
        const __m512i sb = _mm512_add_epi64(_mm512_i64gather_epi64(idx, (const long long *)cart_exp_tab + 1, 8),
                                            _mm512_slli_epi64(ki, 45));
        const __m512d a = _mm512_fmadd_pd(r, _mm512_set1_pd(CART_EXP_C3), _mm512_set1_pd(CART_EXP_C2));
        const __m512d b = _mm512_add_pd(r, tail);
        const __m512d r2 = _mm512_mul_pd(r, r);
        const __m512d c = _mm512_fmadd_pd(r, _mm512_set1_pd(CART_EXP_C5), _mm512_set1_pd(CART_EXP_C4));
        const __m512d tmp = _mm512_fmadd_pd(_mm512_mul_pd(r2, r2), c, _mm512_fmadd_pd(a, r2, b));
        const __m512d scale = _mm512_castsi512_pd(sb);
        double xs[8];
        if (special) _mm512_storeu_pd(xs, xv); /* y may be x */
        _mm512_mask_storeu_pd(y + i, m, _mm512_fmadd_pd(scale, tmp, scale));
        if (special)
            for (int l = 0; l < 8; l++)
                if (special >> l & 1) y[i + l] = exp(xs[l]);
    }
}

/* ---- e^x: expf.h's arithmetic on 8 doubles at a time ---------------------- */

#include "expf.h"

/* e^x of 8 floats, before the special cases (expf.h). The table's 32
 * entries are four registers; two two-register permutes and a blend pick
 * an entry by the low five bits of k. */
static inline __m256 expf_8(__m256 x, const __m512d tab[4]) {
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d inv = _mm512_set1_pd(CART_EXPF_INVLN2N), shift = _mm512_set1_pd(CART_EXPF_SHIFT);
    __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    const __m512d lo = _mm512_permutex2var_pd(tab[0], ki, tab[1]);
    const __m512d hi = _mm512_permutex2var_pd(tab[2], ki, tab[3]);
    const __m512d t = _mm512_mask_blend_pd(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(CART_EXPF_C0), r, _mm512_set1_pd(CART_EXPF_C1));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(CART_EXPF_C2), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

/* e^(x[i] - shift) for i < n: expf_n_512 with the difference taken first. */
static ALWAYS_INLINE void expf_n_shift(const int SHIFT, float *y, const float *x, int64_t n, float shift) {
    __m512d tab[4];
    for (int j = 0; j < 4; j++) tab[j] = _mm512_loadu_pd((const double *)cart_expf_tab + 8 * j);
    const __m512i big = _mm512_set1_epi32((int)CART_EXPF_BIG), abs = _mm512_set1_epi32(0x7fffffff);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = SHIFT ? _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_set1_ps(shift))
                               : _mm512_maskz_loadu_ps(m, x + i);
        const __mmask16 special =
            _mm512_mask_cmpgt_epu32_mask(m, _mm512_and_si512(_mm512_castps_si512(v), abs), big);
        const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(expf_8(_mm512_castps512_ps256(v), tab)),
                                            expf_8(_mm512_extractf32x8_ps(v, 1), tab), 1);
        if (special) {
            float xs[16];
            _mm512_storeu_ps(xs, v);
            _mm512_mask_storeu_ps(y + i, m, e);
            for (int l = 0; l < 16; l++)
                if (special >> l & 1) y[i + l] = cart_expf_ref(xs[l]);
        } else {
            _mm512_mask_storeu_ps(y + i, m, e);
        }
    }
}

static void expf_n_512(float *y, const float *x, int64_t n) {
    expf_n_shift(0, y, x, n, 0.0f);
}

static void expf_shift_n_512(float *y, const float *x, int64_t n, float shift) {
    expf_n_shift(1, y, x, n, shift);
}

/* s[i] *= scale; the maximum of the products (max(v, m) keeps m when v is
 * a NaN). */
static float scale_max_512(float *s, int64_t n, float scale) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), sc);
        _mm512_mask_storeu_ps(s + i, k, v);
        m = _mm512_mask_max_ps(m, k, v, m);
    }
    return _mm512_reduce_max_ps(m);
}

/* ---- the table ------------------------------------------------------------ */

static const cart_kernels table = {
    .isa = 2, /* CART_ISA_AVX512 */
    .name = "avx512",
    .mu = MM_U,
    .mv = MM_V,
    .pack_act = mm512_pack_act,
    .round_rows = mm512_round_rows,
    .forward_rows = mm512_forward_rows,
    .backward_cols = mm512_backward_cols,
    .gemv_rows = mm512_gemv_rows,
    .scores = rows_scores,
    .scores_f16 = rows_scores_f16,
    .values = rows_values,
    .values_f16 = rows_values_f16,
    .scores_mq = rows_scores_mq,
    .values_mq = rows_values_mq,
    .scores_f16_mq = rows_scores_f16_mq,
    .values_f16_mq = rows_values_f16_mq,
    .outer_add = outer_add_512,
    .expf_n = expf_n_512,
    .expf_shift_n = expf_shift_n_512,
    .scale_max = scale_max_512,
    .exp_n = exp_n_512,
    .qk_groups = qk_groups_avx512,
    .qk_quantize = qk_quantize_rows_512,
    .f16_to_f32 = f16_to_f32_n,
    .f32_to_f16 = f32_to_f16_n,
    .bf16_to_f32 = bf16_to_f32_n,
    .f32_to_bf16 = f32_to_bf16_n,
};

const cart_kernels *cart_kernels_avx512(void) {
    return &table;
}

#else

const cart_kernels *cart_kernels_avx512(void) {
    return 0; /* not an x86-64 build */
}

#endif
