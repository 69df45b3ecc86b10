/*
 * quant.c - cart_to_f32 and cart_from_f32: plain element conversions and
 * GGML block (de)quantization.
 *
 * Block layouts are GGML's (ggml-common.h, QK_K = 256). Each block is read
 * and written byte by byte, multi-byte fields little-endian through memcpy,
 * because blocks sit at any alignment inside a mapped file. The byte offsets
 * of every field are listed above its dequantizer.
 *
 * Exactness of dequantization: each dequantizer forms the same f32 products
 * and sums as GGML's reference dequantize_row_* (ggml-quants.c), from the same
 * operands and in the same order, so the results are bit-identical. (Every
 * product that a sum is later formed from is exact in f32: an f16 scale has
 * 11 significant bits and the integer factors multiplied into it at most 11
 * more, so a fused multiply-add could not change those results either.)
 *
 * Quantization: q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q8_K follow GGML's reference
 * quantizers (quantize_row_*_ref), giving the same bytes for finite input.
 * The K-quants q2_K..q6_K use a direct scheme of this file (see "K-quants"
 * below): valid blocks with a proven error bound, not GGML's searched bytes.
 * GGML's reference quantizers round x * id to f32 before adding 0.5 or 8.5
 * (its ggml-base is built without FMA on x86), so contraction into fused
 * multiply-adds is switched off for this file, also in GNU C mode where GCC
 * would otherwise contract.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"
#include "kernels/kernels.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error                                                                                             \
    "quant.c reads GGML's little-endian block fields with memcpy: a little-endian host is required"
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

enum { QK = 32, QK_K = 256 };

/* The 16 levels of iq4_nl and iq4_xs (GGML's kvalues_iq4nl, int8 there; as
 * floats here, which are exact, so lookups can vectorize). */
static const float iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* ---- little helpers ----------------------------------------------------- */

/* binary16 bits to f32, branch-free so that loops over it vectorize; the same
 * results as cart_f16_to_f32 for all 65536 inputs (NaN payloads included,
 * signalling NaNs made quiet). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = h & 0x7c00;
    uint32_t o = (uint32_t)(h & 0x7fff) << 13; /* exponent and mantissa in place */
    o += (uint32_t)(127 - 15) << 23;           /* rebias the exponent */
    float f;
    if (exp == 0x7c00) { /* inf, nan: exponent to 255, NaN quiet */
        o += (uint32_t)(128 - 16) << 23;
        if (h & 0x3ff) o |= 0x00400000u;
        memcpy(&f, &o, 4);
    } else if (exp == 0) { /* zero, subnormal: (1 + m/1024) 2^-14 - 2^-14, exact */
        o += 1u << 23;
        memcpy(&f, &o, 4);
        f -= 0x1p-14f;
    } else {
        memcpy(&f, &o, 4);
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= sign;
    memcpy(&f, &u, 4);
    return f;
}

static inline float load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

static void store_f16(uint8_t *p, float v) {
    uint16_t h = cart_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* v clamped to [lo, hi]; NaN gives lo. */
static float clampf(float v, float lo, float hi) {
    if (!(v >= lo)) return lo;
    return v > hi ? hi : v;
}

/* GGML's nearest_int: rounds to nearest, ties to even, by adding 1.5 * 2^23
 * so the FPU's rounding does the work. Needs |v| <= 2^22; callers clamp. */
static int nearest_int(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* roundf (ties away from zero) for |v| < 2^23, without a libm call so loops
 * vectorize. v - trunc(v) is exact in that range. */
static int round_away(float v) {
    int i = (int)v;
    float frac = v - (float)i;
    return i + (frac >= 0.5f) - (frac <= -0.5f);
}

/* Bits of the smallest f16 >= v, for finite v >= 0 (an f16 scale that is
 * never below the f32 scale it stands for). */
static uint16_t f16_at_least(float v) {
    uint16_t h = cart_f32_to_f16(v);
    if (cart_f16_to_f32(h) < v) h++; /* next f16 up; 0x7bff + 1 is inf */
    return h;
}

/* ---- dequantizers --------------------------------------------------------
 * Each writes nb blocks' worth of f32 to y (block_size floats per block)
 * from nb blocks at x. */

/* q4_0, 18 bytes: d f16 @0, qs[16] @2. Element j < 16 is the low nibble of
 * qs[j], element 16 + j the high nibble; value (q - 8) * d. */
static void dequantize_q4_0(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += QK) {
        const float d = load_f16(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

/* q4_1, 20 bytes: d f16 @0, m f16 @2, qs[16] @4; value q * d + m. */
static void dequantize_q4_1(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 20, y += QK) {
        const float d = load_f16(x);
        const float m = load_f16(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            const float lo = (float)(qs[j] & 0x0f) * d;
            const float hi = (float)(qs[j] >> 4) * d;
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
    }
}

/* q5_0, 22 bytes: d f16 @0, qh u32 @2, qs[16] @6. Bit j of qh is the fifth
 * bit of element j (j < 32); value (q - 16) * d. */
static void dequantize_q5_0(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 22, y += QK) {
        const float d = load_f16(x);
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

/* q5_1, 24 bytes: d f16 @0, m f16 @2, qh u32 @4, qs[16] @8; value q * d + m. */
static void dequantize_q5_1(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 24, y += QK) {
        const float d = load_f16(x);
        const float m = load_f16(x + 2);
        uint32_t qh;
        memcpy(&qh, x + 4, 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            const float plo = (float)lo * d;
            const float phi = (float)hi * d;
            y[j] = plo + m;
            y[j + 16] = phi + m;
        }
    }
}

/* q8_0, 34 bytes: d f16 @0, qs int8[32] @2; value q * d.
 * q8_1, 36 bytes: d f16 @0, s f16 @2 (d * sum of qs), qs int8[32] @4. GGML has
 * no q8_1 dequantizer; q * d is the value its dot products use. */
static void dequantize_q8(float *restrict y, const uint8_t *restrict x, int64_t nb, int block_bytes,
                          int qs_at) {
    for (int64_t i = 0; i < nb; i++, x += block_bytes, y += QK) {
        const float d = load_f16(x);
        const int8_t *qs = (const int8_t *)(x + qs_at);
        for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
    }
}

/* q2_K, 84 bytes: scales[16] @0 (low nibble scale, high nibble min of each
 * 16-element sub-block), qs[64] @16 (2-bit quants), d f16 @80, dmin f16 @82.
 * Element 128h + 32j + m (h < 2, j < 4, m < 32) is bits 2j..2j+1 of
 * qs[32h + m]; it lies in sub-block 8h + 2j + m/16. Value
 * (d * scale) * q - dmin * min. */
static void dequantize_q2_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 84, y += QK_K) {
        const uint8_t *scales = x;
        const float d = load_f16(x + 80);
        const float dmin = load_f16(x + 82);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x + 16 + 32 * h;
            for (int j = 0; j < 4; j++) {
                const int shift = 2 * j;
                for (int sub = 0; sub < 2; sub++) {
                    const uint8_t sc = scales[8 * h + 2 * j + sub];
                    const float dl = d * (float)(sc & 0x0f);
                    const float ml = dmin * (float)(sc >> 4);
                    const uint8_t *qq = q + 16 * sub;
                    float *yy = y + 128 * h + 32 * j + 16 * sub;
                    for (int l = 0; l < 16; l++) {
                        const float p = dl * (float)((qq[l] >> shift) & 3);
                        yy[l] = p - ml;
                    }
                }
            }
        }
    }
}

/* The 16 signed 6-bit scales of a q3_K block, from its 12 scale bytes: scale
 * k has low nibble bytes[k] & 15 (k < 8) or bytes[k - 8] >> 4 (k >= 8), and
 * high two bits (bytes[8 + k % 4] >> 2 * (k / 4)) & 3; stored offset by 32. */
static void unpack_q3_K_scales(int out[16], const uint8_t *b) {
    for (int k = 0; k < 16; k++) {
        const int low = k < 8 ? (b[k] & 0x0f) : (b[k - 8] >> 4);
        const int high = (b[8 + k % 4] >> (2 * (k / 4))) & 3;
        out[k] = (low | (high << 4)) - 32;
    }
}

/* q3_K, 110 bytes: hmask[32] @0, qs[64] @32 (low 2 bits), scales[12] @96,
 * d f16 @108. Element 128h + 32j + m: low bits 2j..2j+1 of qs[32h + m], high
 * bit (1 << (4h + j)) of hmask[m]; q = low - (high bit set ? 0 : 4), in
 * [-4, 3]. Value (d * scale) * q with the sub-block's signed scale. */
static void dequantize_q3_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    int sc[16];
    for (int64_t i = 0; i < nb; i++, x += 110, y += QK_K) {
        const uint8_t *hm = x;
        const float d = load_f16(x + 108);
        unpack_q3_K_scales(sc, x + 96);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x + 32 + 32 * h;
            for (int j = 0; j < 4; j++) {
                const int shift = 2 * j;
                const uint8_t mask = (uint8_t)(1u << (4 * h + j));
                for (int sub = 0; sub < 2; sub++) {
                    const float dl = d * (float)sc[8 * h + 2 * j + sub];
                    const uint8_t *qq = q + 16 * sub;
                    const uint8_t *hh = hm + 16 * sub;
                    float *yy = y + 128 * h + 32 * j + 16 * sub;
                    for (int l = 0; l < 16; l++) {
                        const int v = ((qq[l] >> shift) & 3) - ((hh[l] & mask) ? 0 : 4);
                        yy[l] = dl * (float)v;
                    }
                }
            }
        }
    }
}


/* q4_K, 144 bytes: d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16.
 * Element 64c + m (c < 4, m < 32) is the low nibble of qs[32c + m] in
 * sub-block 2c; element 64c + 32 + m the high nibble, sub-block 2c + 1.
 * Value (d * scale) * q - dmin * min. */
static void dequantize_q4_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 144, y += QK_K) {
        const float d = load_f16(x);
        const float dmin = load_f16(x + 2);
        const uint8_t *scales = x + 4;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x + 16 + 32 * c;
            int sc, mn;
            cart_scale_min_k4(2 * c, scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            cart_scale_min_k4(2 * c + 1, scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            float *yy = y + 64 * c;
            for (int l = 0; l < 32; l++) {
                const float p = d1 * (float)(q[l] & 0x0f);
                yy[l] = p - m1;
            }
            for (int l = 0; l < 32; l++) {
                const float p = d2 * (float)(q[l] >> 4);
                yy[32 + l] = p - m2;
            }
        }
    }
}

/* q5_K, 176 bytes: d f16 @0, dmin f16 @2, scales[12] @4, qh[32] @16,
 * qs[128] @48. As q4_K, plus a fifth bit: bit 2c of qh[m] for element
 * 64c + m, bit 2c + 1 for element 64c + 32 + m. */
static void dequantize_q5_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 176, y += QK_K) {
        const float d = load_f16(x);
        const float dmin = load_f16(x + 2);
        const uint8_t *scales = x + 4;
        const uint8_t *qh = x + 16;
        for (int c = 0; c < 4; c++) {
            const uint8_t *ql = x + 48 + 32 * c;
            const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
            int sc, mn;
            cart_scale_min_k4(2 * c, scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            cart_scale_min_k4(2 * c + 1, scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            float *yy = y + 64 * c;
            for (int l = 0; l < 32; l++) {
                const float p = d1 * (float)((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0));
                yy[l] = p - m1;
            }
            for (int l = 0; l < 32; l++) {
                const float p = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0));
                yy[32 + l] = p - m2;
            }
        }
    }
}

/* q6_K, 210 bytes: ql[128] @0 (low 4 bits), qh[64] @128 (high 2 bits),
 * scales int8[16] @192, d f16 @208. In half h (128 elements) with l < 32:
 * element 128h + l is the low nibble of ql[64h + l] and bits 0-1 of
 * qh[32h + l]; + 32: low nibble of ql[64h + 32 + l], bits 2-3; + 64: high
 * nibble of ql[64h + l], bits 4-5; + 96: high nibble of ql[64h + 32 + l],
 * bits 6-7. q = that 6-bit value - 32; value (d * scale) * q. */
static void dequantize_q6_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210, y += QK_K) {
        const float d = load_f16(x + 208);
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) { /* elements 128h + 32g .. + 31 */
                const uint8_t *ql = x + 64 * h + 32 * (g & 1);
                const uint8_t *qh = x + 128 + 32 * h;
                const int nshift = g < 2 ? 0 : 4, hshift = 2 * g;
                for (int half = 0; half < 2; half++) {
                    const float s = d * (float)sc[8 * h + 2 * g + half];
                    float *yy = y + 128 * h + 32 * g + 16 * half;
                    for (int l = 0; l < 16; l++) {
                        const int k = 16 * half + l;
                        const int q =
                            (((ql[k] >> nshift) & 0x0f) | (((qh[k] >> hshift) & 3) << 4)) - 32;
                        yy[l] = s * (float)q;
                    }
                }
            }
        }
    }
}

/* q8_K, 292 bytes: d f32 @0, qs int8[256] @4, bsums int16[16] @260 (sums of
 * 16 quants, unused here); value d * q. */
static void dequantize_q8_K(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 292, y += QK_K) {
        float d;
        memcpy(&d, x, 4);
        const int8_t *qs = (const int8_t *)(x + 4);
        for (int j = 0; j < QK_K; j++) y[j] = d * (float)qs[j];
    }
}

/* iq4_nl, 18 bytes: d f16 @0, qs[16] @2, nibbles laid out as q4_0; value
 * d * level[q]. */
static void dequantize_iq4_nl(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += QK) {
        const float d = load_f16(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * iq4nl_levels[qs[j] & 0x0f];
            y[j + 16] = d * iq4nl_levels[qs[j] >> 4];
        }
    }
}

/* iq4_xs, 136 bytes: d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8.
 * Sub-block b (< 8, 32 elements) has the 6-bit scale
 * ((scales_l[b/2] >> 4(b%2)) & 15) | (((scales_h >> 2b) & 3) << 4), offset by
 * 32, and the nibbles qs[16b ..] laid out as q4_0. Value (d * scale) *
 * level[q]. */
static void dequantize_iq4_xs(float *restrict y, const uint8_t *restrict x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 136, y += QK_K) {
        const float d = load_f16(x);
        uint16_t scales_h;
        memcpy(&scales_h, x + 2, 2);
        const uint8_t *scales_l = x + 4;
        for (int b = 0; b < 8; b++) {
            const int ls =
                ((scales_l[b / 2] >> (4 * (b % 2))) & 0x0f) | (((scales_h >> (2 * b)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const uint8_t *qs = x + 8 + 16 * b;
            float *yy = y + 32 * b;
            for (int j = 0; j < 16; j++) {
                yy[j] = dl * iq4nl_levels[qs[j] & 0x0f];
                yy[j + 16] = dl * iq4nl_levels[qs[j] >> 4];
            }
        }
    }
}

/* ---- plain types -------------------------------------------------------- */

static void widen_plain(float *dst, int32_t dtype, const uint8_t *s, int64_t n) {
    switch (dtype) {
    case CART_F32:
        memcpy(dst, s, (size_t)n * 4);
        break;
    case CART_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = load_f16(s + 2 * i);
        break;
    case CART_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = cart_bf16_to_f32(h);
        }
        break;
    case CART_F64:
        for (int64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, s + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    case CART_I8:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(int8_t)s[i];
        break;
    case CART_I16:
        for (int64_t i = 0; i < n; i++) {
            int16_t v;
            memcpy(&v, s + 2 * i, 2);
            dst[i] = (float)v;
        }
        break;
    case CART_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + 4 * i, 4);
            dst[i] = (float)v;
        }
        break;
    case CART_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, s + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    case CART_U8:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    case CART_BOOL:
        for (int64_t i = 0; i < n; i++) dst[i] = s[i] ? 1.0f : 0.0f;
        break;
    default:
        break; /* callers pass plain types only */
    }
}

/* v rounded to nearest (ties away from zero) and saturated to [lo, hi]; NaN
 * gives 0. lo and hi are exact in double. */
static double round_saturate(float v, double lo, double hi) {
    if (v != v) return 0.0;
    double r = (double)roundf(v);
    if (r <= lo) return lo;
    if (r >= hi) return hi;
    return r;
}

static void narrow_plain(uint8_t *d, int32_t dtype, const float *src, int64_t n) {
    switch (dtype) {
    case CART_F32:
        memcpy(d, src, (size_t)n * 4);
        break;
    case CART_F16:
        for (int64_t i = 0; i < n; i++) store_f16(d + 2 * i, src[i]);
        break;
    case CART_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = cart_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case CART_F64:
        for (int64_t i = 0; i < n; i++) {
            double v = src[i];
            memcpy(d + 8 * i, &v, 8);
        }
        break;
    case CART_I8:
        for (int64_t i = 0; i < n; i++) {
            int8_t v = (int8_t)round_saturate(src[i], INT8_MIN, INT8_MAX);
            memcpy(d + i, &v, 1);
        }
        break;
    case CART_I16:
        for (int64_t i = 0; i < n; i++) {
            int16_t v = (int16_t)round_saturate(src[i], INT16_MIN, INT16_MAX);
            memcpy(d + 2 * i, &v, 2);
        }
        break;
    case CART_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v = (int32_t)round_saturate(src[i], INT32_MIN, INT32_MAX);
            memcpy(d + 4 * i, &v, 4);
        }
        break;
    case CART_I64:
        for (int64_t i = 0; i < n; i++) {
            /* 2^63 is not an int64; every float below it converts exactly. */
            int64_t v;
            double r = round_saturate(src[i], -9223372036854775808.0, 9223372036854775808.0);
            if (r >= 9223372036854775808.0)
                v = INT64_MAX;
            else
                v = (int64_t)r;
            memcpy(d + 8 * i, &v, 8);
        }
        break;
    case CART_U8:
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)round_saturate(src[i], 0, UINT8_MAX);
        break;
    case CART_BOOL:
        for (int64_t i = 0; i < n; i++) d[i] = src[i] != 0.0f; /* NaN is true */
        break;
    default:
        break; /* callers pass plain types only */
    }
}

/* ---- GGML's reference quantizers (32-element blocks) ----------------------
 * Each writes nb blocks at y from nb * 32 floats at x. The float operations
 * are GGML's; where GGML casts a float to an integer type (undefined for NaN
 * or out-of-range values) the value is clamped first, which changes nothing
 * for finite input. */

/* The signed value of largest magnitude among n (the first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void quantize_q4_0(uint8_t *y, const float *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK, y += 18) {
        const float d = signed_absmax(x, QK) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y, d);
        for (int j = 0; j < 16; j++) {
            const float x0 = x[j] * id, x1 = x[j + 16] * id;
            const int q0 = (int)clampf(x0 + 8.5f, 0.0f, 15.0f);
            const int q1 = (int)clampf(x1 + 8.5f, 0.0f, 15.0f);
            y[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quantize_q5_0(uint8_t *y, const float *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK, y += 22) {
        const float d = signed_absmax(x, QK) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const float x0 = x[j] * id, x1 = x[j + 16] * id;
            const uint32_t q0 = (uint32_t)clampf(x0 + 16.5f, 0.0f, 31.0f);
            const uint32_t q1 = (uint32_t)clampf(x1 + 16.5f, 0.0f, 31.0f);
            y[6 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((q0 >> 4) & 1) << j;
            qh |= ((q1 >> 4) & 1) << (j + 16);
        }
        memcpy(y + 2, &qh, 4);
    }
}

/* q4_1 and q5_1: d = (max - min) / nmax, m = min, q = trunc((x - min) / d
 * + 0.5) computed as GGML does, with id = 1 / d. */
static void min_max(const float *x, int n, float *min, float *max) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

static void quantize_q4_1(uint8_t *y, const float *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK, y += 20) {
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y, d);
        store_f16(y + 2, min);
        for (int j = 0; j < 16; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + 16] - min) * id;
            const int q0 = (int)clampf(x0 + 0.5f, 0.0f, 15.0f);
            const int q1 = (int)clampf(x1 + 0.5f, 0.0f, 15.0f);
            y[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quantize_q5_1(uint8_t *y, const float *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK, y += 24) {
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y, d);
        store_f16(y + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + 16] - min) * id;
            const uint32_t q0 = (uint32_t)clampf(x0 + 0.5f, 0.0f, 31.0f);
            const uint32_t q1 = (uint32_t)clampf(x1 + 0.5f, 0.0f, 31.0f);
            y[8 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((q0 >> 4) & 1) << j;
            qh |= ((q1 >> 4) & 1) << (j + 16);
        }
        memcpy(y + 4, &qh, 4);
    }
}

/* q8_0 (with_sum 0) and q8_1 (with_sum 1): d = absmax / 127, q = roundf(x *
 * (1 / d)); q8_1 also stores s = f16(sum(q) * d). */
static void quantize_q8(uint8_t *y, const float *x, int64_t nb, int with_sum) {
    const int qs_at = with_sum ? 4 : 2;
    for (int64_t i = 0; i < nb; i++, x += QK, y += qs_at + QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            const float a = fabsf(x[j]);
            amax = amax > a ? amax : a; /* GGML's MAX(amax, a), operand order kept */
        }
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y, d);
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = round_away(clampf(x[j] * id, -127.0f, 127.0f));
            y[qs_at + j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        if (with_sum) store_f16(y + 2, (float)sum * d);
    }
}

/* q8_K (GGML's quantize_row_q8_K_ref): iscale = -127 / max for the signed
 * value max of largest magnitude, q = min(127, nearest_int(iscale * x)),
 * d = 1 / iscale as f32 (negative when max is positive), bsums the sums of
 * each 16 quants. An all-zero block gets d = 0 and zero quants and sums
 * (GGML leaves its bsums unwritten there). */
static void quantize_q8_K(uint8_t *y, const float *x, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 292) {
        const float max = signed_absmax(x, QK_K);
        int8_t qs[QK_K];
        int16_t bsums[16];
        float d = 0.0f;
        if (max == 0.0f) {
            memset(qs, 0, sizeof qs);
            memset(bsums, 0, sizeof bsums);
        } else {
            const float iscale = -127.f / max;
            for (int j = 0; j < QK_K; j++)
                qs[j] = (int8_t)nearest_int(clampf(iscale * x[j], -128.0f, 127.0f));
            for (int k = 0; k < 16; k++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) sum += qs[16 * k + l];
                bsums[k] = (int16_t)sum;
            }
            d = 1 / iscale;
        }
        memcpy(y, &d, 4);
        memcpy(y + 4, qs, sizeof qs);
        memcpy(y + 260, bsums, sizeof bsums);
    }
}

/* ---- K-quants ---------------------------------------------------------------
 * A direct scheme, not GGML's search. For each sub-block the quantizer picks
 * the smallest grid that covers all its values, then rounds every value to
 * the nearest grid point:
 *
 *   affine (q2_K, q4_K, q5_K; q in [0, nmax], value sd * q - sm):
 *     sm = dmin * lm with lm = ceil(-min(0, min x) / dmin), so -sm <= min x;
 *     sd = d * ls with ls = ceil((max x + sm) / nmax / d), so the top grid
 *     point sd * nmax - sm >= max x;
 *   symmetric (q3_K: q in [-4, 3]; q6_K: q in [-32, 31]; value sd * q):
 *     sd = d * ls with ls = ceil(absmax / qmax / d), qmax = 3 or 31.
 *
 * The super-block scales d, dmin are the smallest f16 values no smaller than
 * (largest sub-block scale) / lmax, where lmax is the largest multiplier the
 * format stores (15 for q2_K, 31 for q3_K, 63 for q4_K and q5_K, 127 for
 * q6_K), so ls and lm never need more bits than they have.
 * Every value then lies within sd / 2 of its dequantized value (up to f32
 * rounding), with sd <= (sub-block scale) + d. For a super-block of absolute
 * maximum A that is at most about 0.068 A (q4_K), 0.033 A (q5_K), 0.37 A
 * (q2_K), 0.172 A (q3_K) and 0.0163 A (q6_K); tests/c/test_dtype.c checks
 * these bounds. Input so large that d or dmin overflow f16 (a sub-block
 * scale above about 65504 * lmax) gives infinite scales. */

/* Super-block scale for sub-block scales up to max_scale with integer
 * multipliers up to lmax: f16 bits and value. */
static float super_scale(uint8_t *at, float max_scale, int lmax) {
    uint16_t h = max_scale > 0.0f ? f16_at_least(max_scale / (float)lmax) : 0;
    memcpy(at, &h, 2);
    return cart_f16_to_f32(h);
}

/* The multiplier of `unit` that reaches at least v, within [0, lmax]. */
static int multiplier_at_least(float v, float unit, int lmax) {
    if (!(unit > 0.0f)) return 0;
    return (int)clampf(ceilf(v / unit), 0.0f, (float)lmax);
}

/* Affine sub-blocks: n_sub sub-blocks of len values at x. Writes the f16 d
 * at d_at and dmin at dmin_at, the multipliers ls[] and lm[] (<= lmax) and the
 * quants L[] (n_sub * len, each in [0, nmax]). */
static void quantize_affine(const float *x, int n_sub, int len, int nmax, int lmax, uint8_t *d_at,
                            uint8_t *dmin_at, int *ls, int *lm, uint8_t *L) {
    float neg_min[16], top[16];
    float max_neg_min = 0.0f;
    for (int j = 0; j < n_sub; j++) {
        float lo = 0.0f, hi = x[j * len];
        for (int l = 0; l < len; l++) {
            const float v = x[j * len + l];
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        neg_min[j] = -lo;
        top[j] = hi;
        if (neg_min[j] > max_neg_min) max_neg_min = neg_min[j];
    }
    const float dmin = super_scale(dmin_at, max_neg_min, lmax);
    float sm[16], scale[16];
    float max_scale = 0.0f;
    for (int j = 0; j < n_sub; j++) {
        lm[j] = multiplier_at_least(neg_min[j], dmin, lmax);
        sm[j] = dmin * (float)lm[j];
        const float s = (top[j] + sm[j]) / (float)nmax;
        scale[j] = s > 0.0f ? s : 0.0f;
        if (scale[j] > max_scale) max_scale = scale[j];
    }
    const float d = super_scale(d_at, max_scale, lmax);
    for (int j = 0; j < n_sub; j++) {
        ls[j] = multiplier_at_least(scale[j], d, lmax);
        const float sd = d * (float)ls[j];
        for (int l = 0; l < len; l++) {
            const int k = j * len + l;
            const float v = sd > 0.0f ? (x[k] + sm[j]) / sd : 0.0f;
            L[k] = (uint8_t)nearest_int(clampf(v, 0.0f, (float)nmax));
        }
    }
}

/* Symmetric sub-blocks: as quantize_affine with q in [qmin, qmax]; L[] holds
 * q - qmin. */
static void quantize_symmetric(const float *x, int n_sub, int len, int qmin, int qmax, int lmax,
                               uint8_t *d_at, int *ls, uint8_t *L) {
    float scale[16];
    float max_scale = 0.0f;
    for (int j = 0; j < n_sub; j++) {
        float amax = 0.0f;
        for (int l = 0; l < len; l++) {
            const float a = fabsf(x[j * len + l]);
            amax = amax > a ? amax : a;
        }
        scale[j] = amax / (float)qmax;
        if (scale[j] > max_scale) max_scale = scale[j];
    }
    const float d = super_scale(d_at, max_scale, lmax);
    for (int j = 0; j < n_sub; j++) {
        ls[j] = multiplier_at_least(scale[j], d, lmax);
        const float sd = d * (float)ls[j];
        for (int l = 0; l < len; l++) {
            const int k = j * len + l;
            const float v = sd > 0.0f ? x[k] / sd : 0.0f;
            L[k] = (uint8_t)(nearest_int(clampf(v, (float)qmin, (float)qmax)) - qmin);
        }
    }
}

/* 2-bit fields of 256 values into 64 bytes, as q2_K and q3_K lay them out:
 * value 128h + 32j + m goes to bits 2j of byte 32h + m. */
static void pack_2bit(uint8_t *qs, const uint8_t *L) {
    for (int h = 0; h < 2; h++)
        for (int m = 0; m < 32; m++) {
            const uint8_t *v = L + 128 * h + m;
            qs[32 * h + m] = (uint8_t)((v[0] & 3) | ((v[32] & 3) << 2) | ((v[64] & 3) << 4) |
                                       ((v[96] & 3) << 6));
        }
}

static void quantize_q2_K(uint8_t *y, const float *x, int64_t nb) {
    int ls[16], lm[16];
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 84) {
        quantize_affine(x, 16, 16, 3, 15, y + 80, y + 82, ls, lm, L);
        for (int j = 0; j < 16; j++) y[j] = (uint8_t)(ls[j] | (lm[j] << 4));
        pack_2bit(y + 16, L);
    }
}

static void quantize_q3_K(uint8_t *y, const float *x, int64_t nb) {
    int ls[16];
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 110) {
        quantize_symmetric(x, 16, 16, -4, 3, 31, y + 108, ls, L);
        /* scales: 6 bits each, stored + 32 */
        uint8_t *sb = y + 96;
        memset(sb, 0, 12);
        for (int k = 0; k < 16; k++) {
            const int u = ls[k] + 32;
            if (k < 8)
                sb[k] |= (uint8_t)(u & 0x0f);
            else
                sb[k - 8] |= (uint8_t)((u & 0x0f) << 4);
            sb[8 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
        }
        /* L = q + 4: bit 2 goes to hmask, the low two bits to qs. */
        uint8_t *hm = y;
        memset(hm, 0, 32);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int m = 0; m < 32; m++)
                    if (L[128 * h + 32 * j + m] & 4) hm[m] |= (uint8_t)(1u << (4 * h + j));
        pack_2bit(y + 32, L);
    }
}

/* The 12 scale bytes of q4_K/q5_K from 8 six-bit scales and mins (the
 * inverse of cart_scale_min_k4). */
static void pack_scales_k4(uint8_t *s, const int *ls, const int *lm) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((ls[j + 4] & 0x0f) | ((lm[j + 4] & 0x0f) << 4));
    }
}

static void quantize_q4_K(uint8_t *y, const float *x, int64_t nb) {
    int ls[8], lm[8];
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 144) {
        quantize_affine(x, 8, 32, 15, 63, y, y + 2, ls, lm, L);
        pack_scales_k4(y + 4, ls, lm);
        for (int c = 0; c < 4; c++)
            for (int m = 0; m < 32; m++)
                y[16 + 32 * c + m] = (uint8_t)(L[64 * c + m] | (L[64 * c + 32 + m] << 4));
    }
}

static void quantize_q5_K(uint8_t *y, const float *x, int64_t nb) {
    int ls[8], lm[8];
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 176) {
        quantize_affine(x, 8, 32, 31, 63, y, y + 2, ls, lm, L);
        pack_scales_k4(y + 4, ls, lm);
        uint8_t *qh = y + 16;
        memset(qh, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int m = 0; m < 32; m++) {
                const uint8_t lo = L[64 * c + m], hi = L[64 * c + 32 + m];
                y[48 + 32 * c + m] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
                qh[m] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
    }
}

static void quantize_q6_K(uint8_t *y, const float *x, int64_t nb) {
    int ls[16];
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, y += 210) {
        quantize_symmetric(x, 16, 16, -32, 31, 127, y + 208, ls, L);
        for (int j = 0; j < 16; j++) y[192 + j] = (uint8_t)(int8_t)ls[j];
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y + 64 * h;
            uint8_t *qh = y + 128 + 32 * h;
            const uint8_t *v = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((v[l] & 0x0f) | ((v[l + 64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((v[l + 32] & 0x0f) | ((v[l + 96] & 0x0f) << 4));
                qh[l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                  ((v[l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---- entry points --------------------------------------------------------- */

/* Validates dtype and n for `fn`; fills *info. */
static int check_args(cart_dtype_info *info, const char *fn, int32_t dtype, int64_t n,
                      const void *a, const void *b) {
    if (cart_dtype_get_info(info, dtype) != CART_OK)
        return cart_fail(CART_E_ARG, "%s: unknown dtype id %d", fn, (int)dtype);
    if (n < 0) return cart_fail(CART_E_ARG, "%s: negative element count %lld", fn, (long long)n);
    if (n % info->block_size != 0)
        return cart_fail(CART_E_ARG, "%s: %lld elements is not a whole number of %s blocks of %d",
                         fn, (long long)n, info->name, (int)info->block_size);
    if (n > 0 && (!a || !b))
        return cart_fail(CART_E_ARG, "%s: NULL buffer for %lld elements", fn, (long long)n);
    return CART_OK;
}

int cart_to_f32(float *dst, int32_t dtype, const void *src, int64_t n) {
    cart_dtype_info info;
    int rc = check_args(&info, "cart_to_f32", dtype, n, dst, src);
    if (rc != CART_OK) return rc;
    if (!info.can_dequantize)
        return cart_fail(CART_E_UNSUPPORTED, "cart_to_f32: no dequantizer for %s", info.name);
    const uint8_t *s = src;
    const int64_t nb = n / info.block_size;
    if (n == 0) return CART_OK;
    switch (dtype) {
    case CART_Q4_0:
        dequantize_q4_0(dst, s, nb);
        break;
    case CART_Q4_1:
        dequantize_q4_1(dst, s, nb);
        break;
    case CART_Q5_0:
        dequantize_q5_0(dst, s, nb);
        break;
    case CART_Q5_1:
        dequantize_q5_1(dst, s, nb);
        break;
    case CART_Q8_0:
        dequantize_q8(dst, s, nb, 34, 2);
        break;
    case CART_Q8_1:
        dequantize_q8(dst, s, nb, 36, 4);
        break;
    case CART_Q2_K:
        dequantize_q2_K(dst, s, nb);
        break;
    case CART_Q3_K:
        dequantize_q3_K(dst, s, nb);
        break;
    case CART_Q4_K:
        dequantize_q4_K(dst, s, nb);
        break;
    case CART_Q5_K:
        dequantize_q5_K(dst, s, nb);
        break;
    case CART_Q6_K:
        dequantize_q6_K(dst, s, nb);
        break;
    case CART_Q8_K:
        dequantize_q8_K(dst, s, nb);
        break;
    case CART_IQ4_NL:
        dequantize_iq4_nl(dst, s, nb);
        break;
    case CART_IQ4_XS:
        dequantize_iq4_xs(dst, s, nb);
        break;
    case CART_F32:
    case CART_F16:
    case CART_BF16:
    case CART_F64:
    case CART_I8:
    case CART_I16:
    case CART_I32:
    case CART_I64:
    case CART_U8:
    case CART_BOOL:
        widen_plain(dst, dtype, s, n);
        break;
    default:
        return cart_fail(CART_E_UNSUPPORTED, "cart_to_f32: no dequantizer for %s", info.name);
    }
    return CART_OK;
}

int cart_from_f32(void *dst, int32_t dtype, const float *src, int64_t n) {
    cart_dtype_info info;
    int rc = check_args(&info, "cart_from_f32", dtype, n, dst, src);
    if (rc != CART_OK) return rc;
    uint8_t *d = dst;
    const int64_t nb = n / info.block_size;
    switch (dtype) {
    case CART_Q4_0:
        quantize_q4_0(d, src, nb);
        break;
    case CART_Q4_1:
        quantize_q4_1(d, src, nb);
        break;
    case CART_Q5_0:
        quantize_q5_0(d, src, nb);
        break;
    case CART_Q5_1:
        quantize_q5_1(d, src, nb);
        break;
    case CART_Q8_0:
        quantize_q8(d, src, nb, 0);
        break;
    case CART_Q8_1:
        quantize_q8(d, src, nb, 1);
        break;
    case CART_Q2_K:
        quantize_q2_K(d, src, nb);
        break;
    case CART_Q3_K:
        quantize_q3_K(d, src, nb);
        break;
    case CART_Q4_K:
        quantize_q4_K(d, src, nb);
        break;
    case CART_Q5_K:
        quantize_q5_K(d, src, nb);
        break;
    case CART_Q6_K:
        quantize_q6_K(d, src, nb);
        break;
    case CART_Q8_K:
        quantize_q8_K(d, src, nb);
        break;
    case CART_F32:
    case CART_F16:
    case CART_BF16:
    case CART_F64:
    case CART_I8:
    case CART_I16:
    case CART_I32:
    case CART_I64:
    case CART_U8:
    case CART_BOOL:
        if (n > 0) narrow_plain(d, dtype, src, n);
        break;
    default:
        return cart_fail(CART_E_UNSUPPORTED, "cart_from_f32: no quantizer for %s", info.name);
    }
    return CART_OK;
}
