/*
 * qk_neon.h - qgeneric.h's primitives on AArch64 Advanced SIMD: 16 lanes as
 * four q registers. Included by neon.c (QK_SDOT 0: products through SMULL,
 * pairs through ADDP, fours through SADALP) and neondot.c (QK_SDOT 1: SDOT,
 * ARMv8.2's dot-product instructions). Both give exact int32 sums, so the
 * bits are the other levels'.
 */
#ifndef CART_QK_NEON_H
#define CART_QK_NEON_H

#include <arm_neon.h>
#include <string.h>

/* Register k holds lanes 4k .. 4k + 3 (bytes 16k .. 16k + 15 of a quad
 * vector). Fields and signed weights alike are signed bytes here; qk_dot4
 * adds a lane's four products (SDOT; or SMULL, pairs through ADDP -- at
 * most 2 * 128 * 127, no 16-bit overflow -- and fours through SADALP). */
typedef struct { int8x16_t r[4]; } qb;
typedef qb qs;
typedef struct { int32x4_t r[4]; } qi;
typedef struct { float32x4_t r[4]; } qf;

#define QK_PRIM static inline __attribute__((always_inline))

QK_PRIM qb qb_load(const uint8_t *p) {
    qb v;
    for (int k = 0; k < 4; k++) v.r[k] = vreinterpretq_s8_u8(vld1q_u8(p + 16 * k));
    return v;
}
QK_PRIM qb qb_lo4(qb v) {
    for (int k = 0; k < 4; k++) v.r[k] = vandq_s8(v.r[k], vdupq_n_s8(15));
    return v;
}
QK_PRIM qb qb_hi4(qb v) {
    for (int k = 0; k < 4; k++)
        v.r[k] = vreinterpretq_s8_u8(vshrq_n_u8(vreinterpretq_u8_s8(v.r[k]), 4));
    return v;
}
QK_PRIM qb qb_or(qb a, qb b) {
    for (int k = 0; k < 4; k++) a.r[k] = vorrq_s8(a.r[k], b.r[k]);
    return a;
}
QK_PRIM qb qb_field(qb v, int shift, int n, int to) {
    const uint8x16_t m = vdupq_n_u8((uint8_t)((1 << n) - 1));
    for (int k = 0; k < 4; k++) {
        uint8x16_t u = vshlq_u8(vreinterpretq_u8_s8(v.r[k]), vdupq_n_s8((int8_t)-shift));
        u = vshlq_u8(vandq_u8(u, m), vdupq_n_s8((int8_t)to));
        v.r[k] = vreinterpretq_s8_u8(u);
    }
    return v;
}
QK_PRIM qs qs_bytes(qb v) { return v; }
QK_PRIM qs qs_levels(qb v) {
    const int8x16_t t = vld1q_s8(qk_iq4_levels);
    for (int k = 0; k < 4; k++) v.r[k] = vqtbl1q_s8(t, vreinterpretq_u8_s8(v.r[k]));
    return v;
}
#if QK_SDOT
/* lane i += the 4 products of bytes 4i .. 4i + 3 (SDOT) */
QK_PRIM int32x4_t qk_dot4(int32x4_t acc, int8x16_t w, int8x16_t bx) { return vdotq_s32(acc, w, bx); }
#else
QK_PRIM int32x4_t qk_dot4(int32x4_t acc, int8x16_t w, int8x16_t bx) {
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(bx));
    const int16x8_t hi = vmull_high_s8(w, bx);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}
#endif
QK_PRIM qi qi_dot(qi acc, qb u, const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    const int8x16_t bx = vreinterpretq_s8_s32(vdupq_n_s32(v));
    for (int k = 0; k < 4; k++) acc.r[k] = qk_dot4(acc.r[k], u.r[k], bx);
    return acc;
}
QK_PRIM qi qi_dots(qi acc, qs w, const int8_t *x) { return qi_dot(acc, w, x); }
QK_PRIM qi qi_dots_end(qi acc, int32_t xsum) {
    (void)xsum;
    return acc;
}
QK_PRIM qi qi_set1(int32_t x) {
    qi r;
    for (int k = 0; k < 4; k++) r.r[k] = vdupq_n_s32(x);
    return r;
}
QK_PRIM qi qi_zero(void) { return qi_set1(0); }
QK_PRIM qi qi_add(qi a, qi b) {
    for (int k = 0; k < 4; k++) a.r[k] = vaddq_s32(a.r[k], b.r[k]);
    return a;
}
QK_PRIM qi qi_mul(qi a, qi b) {
    for (int k = 0; k < 4; k++) a.r[k] = vmulq_s32(a.r[k], b.r[k]);
    return a;
}
QK_PRIM qi qi_sub1(qi a, int32_t s) {
    for (int k = 0; k < 4; k++) a.r[k] = vsubq_s32(a.r[k], vdupq_n_s32(s));
    return a;
}
QK_PRIM qi qi_load_u8(const uint8_t *p) {
    const uint8x16_t v = vld1q_u8(p);
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    qi r = {{vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo))), vreinterpretq_s32_u32(vmovl_high_u16(lo)),
             vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi))), vreinterpretq_s32_u32(vmovl_high_u16(hi))}};
    return r;
}
QK_PRIM qi qi_load_i8(const uint8_t *p) {
    const int8x16_t v = vreinterpretq_s8_u8(vld1q_u8(p));
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    qi r = {{vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)), vmovl_high_s16(hi)}};
    return r;
}
QK_PRIM qi qi_lo4(qi a) {
    for (int k = 0; k < 4; k++) a.r[k] = vandq_s32(a.r[k], vdupq_n_s32(15));
    return a;
}
QK_PRIM qi qi_hi4(qi a) {
    for (int k = 0; k < 4; k++) a.r[k] = vandq_s32(vshrq_n_s32(a.r[k], 4), vdupq_n_s32(15));
    return a;
}
QK_PRIM qf qf_cvt(qi a) {
    qf r;
    for (int k = 0; k < 4; k++) r.r[k] = vcvtq_f32_s32(a.r[k]);
    return r;
}
QK_PRIM qf qf_load_f16(const uint8_t *p) {
    qf r;
    for (int k = 0; k < 4; k++) r.r[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(p + 8 * k))));
    return r;
}
QK_PRIM qf qf_set1(float x) {
    qf r;
    for (int k = 0; k < 4; k++) r.r[k] = vdupq_n_f32(x);
    return r;
}
QK_PRIM qf qf_zero(void) { return qf_set1(0.0f); }
QK_PRIM qf qf_mul(qf a, qf b) {
    for (int k = 0; k < 4; k++) a.r[k] = vmulq_f32(a.r[k], b.r[k]);
    return a;
}
QK_PRIM qf qf_add(qf a, qf b) {
    for (int k = 0; k < 4; k++) a.r[k] = vaddq_f32(a.r[k], b.r[k]);
    return a;
}
QK_PRIM qf qf_sub(qf a, qf b) {
    for (int k = 0; k < 4; k++) a.r[k] = vsubq_f32(a.r[k], b.r[k]);
    return a;
}
QK_PRIM void qf_store(float *p, qf v, int n) {
    float t[16];
    for (int k = 0; k < 4; k++) vst1q_f32(t + 4 * k, v.r[k]);
    memcpy(p, t, (size_t)n * sizeof(float));
}


#endif
