/*
 * dtype.h - element types, 16-bit float conversion, GGML block quantization.
 *
 * The numeric values of cart_dtype are GGML's type ids, so a GGUF tensor's
 * type field is a cart_dtype as it stands. Types GGUF has no id for (u8,
 * bool; safetensors has them) use ids from 200 up.
 *
 * A quantized type stores blocks of block_size elements in type_size bytes;
 * a row of n elements (n a multiple of block_size) takes
 * n / block_size * type_size bytes. Plain types have block_size 1.
 *
 * Dequantization is exact: it performs the same float operations as GGML's
 * reference dequantizers, element for element.
 */
#ifndef CART_DTYPE_H
#define CART_DTYPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_dtype {
    CART_F32 = 0,
    CART_F16 = 1,
    CART_Q4_0 = 2,
    CART_Q4_1 = 3,
    CART_Q5_0 = 6,
    CART_Q5_1 = 7,
    CART_Q8_0 = 8,
    CART_Q8_1 = 9,
    CART_Q2_K = 10,
    CART_Q3_K = 11,
    CART_Q4_K = 12,
    CART_Q5_K = 13,
    CART_Q6_K = 14,
    CART_Q8_K = 15,
    CART_IQ2_XXS = 16,
    CART_IQ2_XS = 17,
    CART_IQ3_XXS = 18,
    CART_IQ1_S = 19,
    CART_IQ4_NL = 20,
    CART_IQ3_S = 21,
    CART_IQ2_S = 22,
    CART_IQ4_XS = 23,
    CART_I8 = 24,
    CART_I16 = 25,
    CART_I32 = 26,
    CART_I64 = 27,
    CART_F64 = 28,
    CART_IQ1_M = 29,
    CART_BF16 = 30,
    CART_TQ1_0 = 34,
    CART_TQ2_0 = 35,
    CART_MXFP4 = 39,
    CART_U8 = 200,
    CART_BOOL = 201,
    CART_DTYPE_INVALID = -1
} cart_dtype;

typedef struct cart_dtype_info {
    const char *name;        /* GGML's spelling: "f32", "q4_K", "bf16"; static storage */
    int32_t block_size;      /* elements per block; 1 for plain types */
    int32_t type_size;       /* bytes per block */
    int32_t is_quantized;    /* 1 for block types */
    int32_t can_dequantize;  /* 1 when cart_to_f32 accepts it */
} cart_dtype_info;

/* Fills *out for a known dtype and returns CART_OK; CART_E_ARG for an id the
 * engine does not know. */
int cart_dtype_get_info(cart_dtype_info *out, int32_t dtype);

/* GGML's name of a dtype ("q6_K"), or NULL for an unknown id. */
const char *cart_dtype_name(int32_t dtype);

/* The dtype named `name` (case-insensitive: "Q4_K", "q4_k", "bf16"), or
 * CART_DTYPE_INVALID. */
int32_t cart_dtype_from_name(const char *name);

/* Bytes taken by n elements of dtype. Fails with CART_E_ARG when n is negative,
 * not a multiple of the block size, or the byte count exceeds 2^62. */
int cart_dtype_nbytes(uint64_t *out, int32_t dtype, int64_t n);

/* IEEE binary16 and bfloat16 <-> binary32. f32 -> 16-bit rounds to nearest,
 * ties to even; NaN stays NaN (quiet), infinities and signed zeros are kept,
 * overflow gives infinity, f16 subnormals are produced and read exactly.
 * f16 -> f32 makes a signalling NaN quiet, as the F16C and NEON instructions
 * do; bf16 -> f32 is the plain 16-bit shift. */
float cart_f16_to_f32(uint16_t h);
uint16_t cart_f32_to_f16(float f);
float cart_bf16_to_f32(uint16_t h);
uint16_t cart_f32_to_bf16(float f);

/* The same over n elements; the buffers may have any alignment. */
void cart_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
void cart_f32_to_f16_n(uint16_t *dst, const float *src, int64_t n);
void cart_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
void cart_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n);

/* The index of the first of n f32 values at x (any alignment) that is NaN or
 * infinite, by its exponent bits, or -1 when every one is finite. (Lua
 * cannot make this check on data it reads through the FFI: LuaJIT's
 * interpreter may take a NaN with a payload for a value of another type.) */
int64_t cart_f32_first_nonfinite(const void *x, int64_t n);

/* The same for the first value that is NaN, infinite or of magnitude above
 * `bound` (by its bits: |x| is the value with the sign bit cleared). */
int64_t cart_f32_first_outside(const void *x, int64_t n, float bound);

/* Converts n elements of `dtype` at src (any alignment) to f32: plain floats
 * and integers are converted, block types are dequantized exactly as GGML
 * does. n must be a multiple of the block size. CART_E_UNSUPPORTED for a type
 * without a dequantizer (the message names it), CART_E_ARG for a bad n. */
int cart_to_f32(float *dst, int32_t dtype, const void *src, int64_t n);

/* Converts n f32 values to `dtype` at dst: f32, f16, bf16, f64 and the
 * integer types (rounded to nearest, saturated), and the block types
 * q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q2_K q3_K q4_K q5_K q6_K q8_K. q8_0, q8_1 and
 * q8_K follow GGML's reference quantizers bit for bit (GGML quantizes matmul
 * activations with them); the other block types use a plain round-to-nearest
 * scale per (sub)block, valid blocks that dequantize close to src but not
 * necessarily the bytes GGML's searching quantizer would choose. n must be a
 * multiple of the block size. */
int cart_from_f32(void *dst, int32_t dtype, const float *src, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
