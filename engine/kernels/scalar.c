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

/* ---- the integer block products (qgeneric.h): 16 lanes as arrays ---------- */

typedef struct { uint8_t b[64]; } qb;
typedef struct { int8_t b[64]; } qs;
typedef struct { int32_t v[16]; } qi;
typedef struct { float v[16]; } qf;

static inline qb qb_load(const uint8_t *p) {
    qb r;
    memcpy(r.b, p, 64);
    return r;
}
static inline qb qb_lo4(qb v) {
    for (int k = 0; k < 64; k++) v.b[k] &= 15;
    return v;
}
static inline qb qb_hi4(qb v) {
    for (int k = 0; k < 64; k++) v.b[k] >>= 4;
    return v;
}
static inline qb qb_or(qb a, qb b) {
    for (int k = 0; k < 64; k++) a.b[k] |= b.b[k];
    return a;
}
static inline qb qb_field(qb v, int shift, int n, int to) {
    for (int k = 0; k < 64; k++) v.b[k] = (uint8_t)(((v.b[k] >> shift) & ((1 << n) - 1)) << to);
    return v;
}
static inline qs qs_bytes(qb v) {
    qs r;
    memcpy(r.b, v.b, 64);
    return r;
}
static inline qs qs_levels(qb v) {
    qs r;
    for (int k = 0; k < 64; k++) r.b[k] = qk_iq4_levels[v.b[k] & 15];
    return r;
}
static inline qi qi_dot(qi acc, qb u, const int8_t *x) {
    for (int l = 0; l < 16; l++)
        for (int i = 0; i < 4; i++) acc.v[l] += (int32_t)u.b[4 * l + i] * x[i];
    return acc;
}
static inline qi qi_dots(qi acc, qs w, const int8_t *x) {
    for (int l = 0; l < 16; l++)
        for (int i = 0; i < 4; i++) acc.v[l] += (int32_t)w.b[4 * l + i] * x[i];
    return acc;
}
static inline qi qi_dots_end(qi acc, int32_t xsum) {
    (void)xsum; /* the sums are exact as they stand */
    return acc;
}
static inline qi qi_zero(void) {
    qi r;
    memset(&r, 0, sizeof r);
    return r;
}
static inline qi qi_set1(int32_t x) {
    qi r;
    for (int l = 0; l < 16; l++) r.v[l] = x;
    return r;
}
static inline qi qi_add(qi a, qi b) {
    for (int l = 0; l < 16; l++) a.v[l] += b.v[l];
    return a;
}
static inline qi qi_mul(qi a, qi b) {
    for (int l = 0; l < 16; l++) a.v[l] = (int32_t)((uint32_t)a.v[l] * (uint32_t)b.v[l]);
    return a;
}
static inline qi qi_sub1(qi a, int32_t s) {
    for (int l = 0; l < 16; l++) a.v[l] -= s;
    return a;
}
static inline qi qi_load_u8(const uint8_t *p) {
    qi r;
    for (int l = 0; l < 16; l++) r.v[l] = p[l];
    return r;
}
static inline qi qi_load_i8(const uint8_t *p) {
    qi r;
    for (int l = 0; l < 16; l++) r.v[l] = (int8_t)p[l];
    return r;
}
static inline qi qi_lo4(qi a) {
    for (int l = 0; l < 16; l++) a.v[l] &= 15;
    return a;
}
static inline qi qi_hi4(qi a) {
    for (int l = 0; l < 16; l++) a.v[l] = (a.v[l] >> 4) & 15;
    return a;
}
static inline qf qf_cvt(qi a) {
    qf r;
    for (int l = 0; l < 16; l++) r.v[l] = (float)a.v[l];
    return r;
}
static inline qf qf_load_f16(const uint8_t *p) {
    qf r;
    for (int l = 0; l < 16; l++) {
        uint16_t h;
        memcpy(&h, p + 2 * l, 2);
        r.v[l] = cart_f16_to_f32(h);
    }
    return r;
}
static inline qf qf_set1(float x) {
    qf r;
    for (int l = 0; l < 16; l++) r.v[l] = x;
    return r;
}
static inline qf qf_zero(void) { return qf_set1(0.0f); }
static inline qf qf_mul(qf a, qf b) {
    for (int l = 0; l < 16; l++) a.v[l] *= b.v[l];
    return a;
}
static inline qf qf_add(qf a, qf b) {
    for (int l = 0; l < 16; l++) a.v[l] += b.v[l];
    return a;
}
static inline qf qf_sub(qf a, qf b) {
    for (int l = 0; l < 16; l++) a.v[l] -= b.v[l];
    return a;
}
static inline void qf_store(float *p, qf v, int n) { memcpy(p, v.v, (size_t)n * sizeof(float)); }

#define QK_T 4
#define QK_FN qk_groups_scalar
/* inlined where the compiler sees fit, not forced: forced, the 64-lane
 * arrays unroll into a megabyte of code and 2.5 minutes of compile time */
#define QK_INLINE static inline
#include "qgeneric.h"

#include "generic.h"
