/*
 * random_weights.h - deterministic random weights of every dtype for the
 * matmul and kernel tests (include after check.h).
 */
#ifndef CART_TEST_RANDOM_WEIGHTS_H
#define CART_TEST_RANDOM_WEIGHTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

static inline float lcg_uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static inline uint32_t lcg_bits(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 32);
}

static inline int32_t block_size_of(int32_t dtype) {
    cart_dtype_info info;
    return cart_dtype_get_info(&info, dtype) == CART_OK ? info.block_size : 1;
}

static inline uint64_t row_bytes_of(int32_t dtype, int64_t cols) {
    uint64_t n = 0;
    cart_dtype_nbytes(&n, dtype, cols);
    return n;
}

/* Where a block type keeps its f16 scales: byte offsets in a block, -1 for
 * none (quant.c lists the layouts). */
typedef struct scale_fields {
    int32_t dtype;
    int block_bytes;
    int at[2];
} scale_fields;

static const scale_fields scale_table[] = {
    {CART_Q4_0, 18, {0, -1}},    {CART_Q4_1, 20, {0, 2}},    {CART_Q5_0, 22, {0, -1}},
    {CART_Q5_1, 24, {0, 2}},     {CART_Q8_0, 34, {0, -1}},   {CART_Q2_K, 84, {80, 82}},
    {CART_Q3_K, 110, {108, -1}}, {CART_Q4_K, 144, {0, 2}},   {CART_Q5_K, 176, {0, 2}},
    {CART_Q6_K, 210, {208, -1}}, {CART_IQ4_NL, 18, {0, -1}}, {CART_IQ4_XS, 136, {0, -1}},
};

static inline const scale_fields *scales_of(int32_t dtype) {
    for (size_t i = 0; i < sizeof scale_table / sizeof scale_table[0]; i++)
        if (scale_table[i].dtype == dtype) return &scale_table[i];
    return NULL;
}

/* A rows x cols weight of `dtype` with random content: quantized from
 * uniform(-1, 1) values by cart_from_f32, or, with `raw` (and always for
 * iq4_nl / iq4_xs, which have no quantizer), random bytes whose f16 scales
 * are set to sane values (0.005 .. 0.02), so every bit pattern of quants and
 * sub-block scales occurs. *wf receives the dequantized values. */
static inline void *random_weight_raw(int32_t dtype, int64_t rows, int64_t cols, uint64_t *seed,
                               float **wf, int raw) {
    uint64_t rb = row_bytes_of(dtype, cols);
    uint8_t *data = malloc(rb * (uint64_t)rows + 1);
    *wf = malloc(sizeof(float) * (size_t)(rows * cols) + 1);
    const scale_fields *sf = scales_of(dtype);
    if (dtype == CART_IQ4_NL || dtype == CART_IQ4_XS) raw = 1;
    if (raw && sf) {
        for (uint64_t i = 0; i < rb * (uint64_t)rows; i++) data[i] = (uint8_t)lcg_bits(seed);
        for (uint64_t b = 0; b < rb * (uint64_t)rows / (uint64_t)sf->block_bytes; b++)
            for (int f = 0; f < 2; f++) {
                if (sf->at[f] < 0) continue;
                uint16_t d = cart_f32_to_f16(0.005f + 0.015f * (lcg_uniform(seed) * 0.5f + 0.5f));
                memcpy(data + b * (uint64_t)sf->block_bytes + sf->at[f], &d, 2);
            }
    } else {
        float *src = malloc(sizeof(float) * (size_t)cols + 1);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) src[c] = lcg_uniform(seed);
            CHECK_OK(cart_from_f32(data + (uint64_t)r * rb, dtype, src, cols));
        }
        free(src);
    }
    CHECK_OK(cart_to_f32(*wf, dtype, data, rows * cols));
    return data;
}

static inline void *random_weight(int32_t dtype, int64_t rows, int64_t cols, uint64_t *seed, float **wf) {
    return random_weight_raw(dtype, rows, cols, seed, wf, 0);
}

/* x rounded as matmul.h says for weights of `dtype`. */
static inline float contract_round(float v, int32_t dtype) {
    if (dtype == CART_F16) return cart_f16_to_f32(cart_f32_to_f16(v));
    if (dtype == CART_BF16) return cart_bf16_to_f32(cart_f32_to_bf16(v));
    return v;
}

#endif
