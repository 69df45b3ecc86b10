/*
 * dtype.c - the dtype table and 16-bit float conversions.
 * Block (de)quantization lives in quant.c.
 */
#include <ctype.h>
#include <string.h>
#include "dtype.h"
#include "internal.h"
#include "kernels/kernels.h"

typedef struct dtype_row {
    int32_t id;
    cart_dtype_info info;
} dtype_row;

/* block_size, type_size: GGML's ggml_type_traits (QK_K = 256). */
static const dtype_row dtype_table[] = {
    {CART_F32, {"f32", 1, 4, 0, 1}},
    {CART_F16, {"f16", 1, 2, 0, 1}},
    {CART_Q4_0, {"q4_0", 32, 18, 1, 1}},
    {CART_Q4_1, {"q4_1", 32, 20, 1, 1}},
    {CART_Q5_0, {"q5_0", 32, 22, 1, 1}},
    {CART_Q5_1, {"q5_1", 32, 24, 1, 1}},
    {CART_Q8_0, {"q8_0", 32, 34, 1, 1}},
    {CART_Q8_1, {"q8_1", 32, 36, 1, 1}},
    {CART_Q2_K, {"q2_K", 256, 84, 1, 1}},
    {CART_Q3_K, {"q3_K", 256, 110, 1, 1}},
    {CART_Q4_K, {"q4_K", 256, 144, 1, 1}},
    {CART_Q5_K, {"q5_K", 256, 176, 1, 1}},
    {CART_Q6_K, {"q6_K", 256, 210, 1, 1}},
    {CART_Q8_K, {"q8_K", 256, 292, 1, 1}},
    {CART_IQ2_XXS, {"iq2_xxs", 256, 66, 1, 0}},
    {CART_IQ2_XS, {"iq2_xs", 256, 74, 1, 0}},
    {CART_IQ3_XXS, {"iq3_xxs", 256, 98, 1, 0}},
    {CART_IQ1_S, {"iq1_s", 256, 50, 1, 0}},
    {CART_IQ4_NL, {"iq4_nl", 32, 18, 1, 1}},
    {CART_IQ3_S, {"iq3_s", 256, 110, 1, 0}},
    {CART_IQ2_S, {"iq2_s", 256, 82, 1, 0}},
    {CART_IQ4_XS, {"iq4_xs", 256, 136, 1, 1}},
    {CART_I8, {"i8", 1, 1, 0, 1}},
    {CART_I16, {"i16", 1, 2, 0, 1}},
    {CART_I32, {"i32", 1, 4, 0, 1}},
    {CART_I64, {"i64", 1, 8, 0, 1}},
    {CART_F64, {"f64", 1, 8, 0, 1}},
    {CART_IQ1_M, {"iq1_m", 256, 56, 1, 0}},
    {CART_BF16, {"bf16", 1, 2, 0, 1}},
    {CART_TQ1_0, {"tq1_0", 256, 54, 1, 0}},
    {CART_TQ2_0, {"tq2_0", 256, 66, 1, 0}},
    {CART_MXFP4, {"mxfp4", 32, 17, 1, 0}},
    {CART_U8, {"u8", 1, 1, 0, 1}},
    {CART_BOOL, {"bool", 1, 1, 0, 1}},
};

static const cart_dtype_info *lookup(int32_t dtype) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].id == dtype) return &dtype_table[i].info;
    return NULL;
}

int cart_dtype_get_info(cart_dtype_info *out, int32_t dtype) {
    const cart_dtype_info *info = lookup(dtype);
    if (!info) return cart_fail(CART_E_ARG, "unknown dtype id %d", (int)dtype);
    *out = *info;
    return CART_OK;
}

const char *cart_dtype_name(int32_t dtype) {
    const cart_dtype_info *info = lookup(dtype);
    return info ? info->name : NULL;
}

int32_t cart_dtype_from_name(const char *name) {
    if (!name) return CART_DTYPE_INVALID;
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcasecmp(dtype_table[i].info.name, name) == 0) return dtype_table[i].id;
    return CART_DTYPE_INVALID;
}

int cart_dtype_nbytes(uint64_t *out, int32_t dtype, int64_t n) {
    const cart_dtype_info *info = lookup(dtype);
    if (!info) return cart_fail(CART_E_ARG, "unknown dtype id %d", (int)dtype);
    if (n < 0) return cart_fail(CART_E_ARG, "negative element count %lld", (long long)n);
    if (n % info->block_size != 0)
        return cart_fail(CART_E_ARG, "%lld elements is not a whole number of %s blocks of %d",
                         (long long)n, info->name, (int)info->block_size);
    uint64_t blocks = (uint64_t)n / (uint64_t)info->block_size;
    if (blocks > (UINT64_C(1) << 62) / (uint64_t)info->type_size)
        return cart_fail(CART_E_ARG, "%lld elements of %s overflow the byte count", (long long)n,
                         info->name);
    *out = blocks * (uint64_t)info->type_size;
    return CART_OK;
}

/* ---- 16-bit floats ------------------------------------------------------ */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float cart_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf; NaN comes out quiet with its payload, as F16C and FCVTL give it */
        return bits_f32(sign | 0x7f800000u | (man ? 0x00400000u : 0) | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t cart_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t exp = (u >> 23) & 0xff;
    uint32_t man = u & 0x7fffff;
    if (exp == 0xff) { /* inf or nan; keep nan quiet and non-zero */
        if (man) return (uint16_t)(sign | 0x7e00 | (man >> 13));
        return (uint16_t)(sign | 0x7c00);
    }
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00); /* overflow */
    if (e <= 0) {
        /* subnormal or zero in f16: shift the full mantissa into place and
         * round to nearest even on the bits shifted out. */
        if (e < -10) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t m = man | 0x800000;      /* implicit bit */
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = 1u << (shift - 1);
        uint32_t rest = m & ((1u << shift) - 1);
        uint32_t r = m >> shift;
        if (rest > half || (rest == half && (r & 1))) r++;
        return (uint16_t)(sign | r); /* r may carry into the exponent: still correct */
    }
    uint32_t r = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++; /* may round up to inf: correct */
    return (uint16_t)(sign | r);
}

float cart_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t cart_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x0040); /* quiet nan */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

int64_t cart_f32_first_outside(const void *x, int64_t n, float bound) {
    uint32_t limit;
    memcpy(&limit, &bound, 4);
    limit &= UINT32_C(0x7fffffff); /* finite magnitudes order as their bits do */
    const unsigned char *p = x;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, p + (size_t)i * 4, 4);
        if ((bits & UINT32_C(0x7fffffff)) > limit) return i; /* NaN and infinity lie above every finite bound */
    }
    return -1;
}

int64_t cart_f32_first_nonfinite(const void *x, int64_t n) {
    const unsigned char *p = x;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, p + (size_t)i * 4, 4);
        if ((bits & UINT32_C(0x7f800000)) == UINT32_C(0x7f800000)) return i;
    }
    return -1;
}
