/*
 * scalar.c - the scalar level: plain C for any CPU, and the definition the
 * vector levels reproduce bit for bit. One lane per "vector"; the fused
 * multiply-add is fmaf (one rounding, as the hardware instructions).
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

#define GK_TABLE cart_kernels_scalar
#define GK_ISA 0 /* CART_ISA_SCALAR */
#define GK_NAME "scalar"
#define VW 1
#define GK_MU 4
#define GK_NV 8
#define GK_GEMV_T 2
#define GK_GEMV_R(t) ((t) == 1 ? 2 : 1)

typedef float vf;

#include "dtype.h"

static inline vf v_zero(void) { return 0.0f; }
static inline vf v_set1(float x) { return x; }
static inline vf v_load(const float *p) {
    float v;
    memcpy(&v, p, 4); /* any alignment, as the vector levels' unaligned loads */
    return v;
}
static inline void v_store(float *p, vf v) { memcpy(p, &v, 4); }
static inline vf v_fma(vf a, vf b, vf c) { return fmaf(a, b, c); }
static inline vf v_mul(vf a, vf b) { return a * b; }
/* 16-bit loads and stores through memcpy: callers may pass any alignment. */
static inline uint16_t load_u16(const uint16_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}
static inline void store_u16(uint16_t *p, uint16_t h) { memcpy(p, &h, 2); }
static inline vf v_load_f16(const uint16_t *p) { return cart_f16_to_f32(load_u16(p)); }
static inline vf v_load_bf16(const uint16_t *p) { return cart_bf16_to_f32(load_u16(p)); }
static inline void v_store_f16(uint16_t *p, vf v) { store_u16(p, cart_f32_to_f16(v)); }
static inline void v_store_bf16(uint16_t *p, vf v) { store_u16(p, cart_f32_to_bf16(v)); }
static inline vf v_load_i8(const int8_t *p) { return (float)*p; }
static inline float v_half(uint16_t h) { return cart_f16_to_f32(h); }

static inline vf v_round(vf v, int round) {
    if (round == MM_ROUND_F16) return cart_f16_to_f32(cart_f32_to_f16(v));
    if (round == MM_ROUND_BF16) return cart_bf16_to_f32(cart_f32_to_bf16(v));
    return v;
}

static inline vf v_sub(vf a, vf b) { return a - b; }
static inline vf v_add(vf a, vf b) { return a + b; }
static inline int v_unpack(int32_t dtype, const uint8_t *blk, int8_t *q) {
    (void)dtype, (void)blk, (void)q;
    return 0; /* generic.h's plain C */
}

static inline int gk_dequant(const mm_src *w, float *dst, const uint8_t *src, int64_t nb) {
    (void)w, (void)dst, (void)src, (void)nb;
    return 0; /* cart_to_f32 is the scalar dequantizer */
}

#include "generic.h"
