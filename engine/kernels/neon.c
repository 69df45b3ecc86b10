/*
 * neon.c - the AArch64 Advanced SIMD level: 4 floats per q register, 32
 * registers. The primitives below feed generic.h. f16 rows are widened with
 * FCVTL and activations rounded with FCVTN (round to nearest even under the
 * default FPCR, NaN quiet with its payload's top bits, as cart_f32_to_f16).
 * Block types are dequantized by cart_to_f32 (the scalar code) into L1, and
 * unpacked to bytes for the GEMV by generic.h's plain C.
 */
#include "kernels.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "dtype.h"

#define GK_TABLE cart_kernels_neon
#define GK_ISA 3 /* CART_ISA_NEON */
#define GK_NAME "neon"
#define VW 4
#define GK_MU 6 /* 6 x 4 q accumulators, 4 for the weights, 1 broadcast */
#define GK_NV 4
#define GK_GEMV_T 4
#define GK_GEMV_R(t) ((t) == 1 ? 4 : (t) == 4 ? 1 : (t) == 2 ? 3 : 2)

typedef float32x4_t vf;

#define V_INLINE static inline __attribute__((always_inline))

V_INLINE vf v_zero(void) { return vdupq_n_f32(0.0f); }
V_INLINE vf v_set1(float x) { return vdupq_n_f32(x); }
V_INLINE vf v_load(const float *p) { return vld1q_f32(p); }
V_INLINE void v_store(float *p, vf v) { vst1q_f32(p, v); }
V_INLINE vf v_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
V_INLINE vf v_mul(vf a, vf b) { return vmulq_f32(a, b); }

V_INLINE vf v_load_f16(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

V_INLINE vf v_load_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

V_INLINE void v_store_f16(uint16_t *p, vf v) {
    vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v)));
}

/* The bf16 bits of v in the high halves (nearest even; NaN made quiet). */
V_INLINE uint32x4_t bf16_bits(vf v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t hi = vdupq_n_u32(0xffff0000u);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vandq_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), hi);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    const uint32x4_t quiet = vandq_u32(vorrq_u32(u, vdupq_n_u32(0x00400000u)), hi);
    return vbslq_u32(nan, quiet, r);
}

V_INLINE void v_store_bf16(uint16_t *p, vf v) {
    vst1_u16(p, vshrn_n_u32(bf16_bits(v), 16));
}

V_INLINE vf v_round(vf v, int round) {
    if (round == MM_ROUND_F16) return vcvt_f32_f16(vcvt_f16_f32(v));
    if (round == MM_ROUND_BF16) return vreinterpretq_f32_u32(bf16_bits(v));
    return v;
}

V_INLINE float v_half(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

V_INLINE vf v_load_i8(const int8_t *p) {
    uint32_t four;
    memcpy(&four, p, 4);
    const int16x8_t h = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}

V_INLINE vf v_sub(vf a, vf b) { return vsubq_f32(a, b); }
V_INLINE vf v_add(vf a, vf b) { return vaddq_f32(a, b); }

static inline int v_unpack(int32_t dtype, const uint8_t *blk, int8_t *q) {
    (void)dtype, (void)blk, (void)q;
    return 0; /* generic.h's plain C */
}

static inline int gk_dequant(const mm_src *w, float *dst, const uint8_t *src, int64_t nb) {
    (void)w, (void)dst, (void)src, (void)nb;
    return 0; /* cart_to_f32 */
}

/* ---- integer block products (qgeneric.h): 16 lanes as four q registers ---- */

/* Register k holds lanes 4k .. 4k + 3 (bytes 16k .. 16k + 15 of a quad
 * vector). Fields and signed weights alike are signed bytes here: products
 * through SMULL, pairs through ADDP (at most 2 * 128 * 127, no 16-bit
 * overflow), fours through SADALP. The sums are exact, so the bits are the
 * other levels'. */
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
QK_PRIM int32x4_t qk_dot4(int32x4_t acc, int8x16_t w, int8x16_t bx) {
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(bx));
    const int16x8_t hi = vmull_high_s8(w, bx);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}
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

#define QK_T 4
#define QK_FN qk_groups_neon
#include "qgeneric.h"

#include "generic.h"

#else

const cart_kernels *cart_kernels_neon(void) {
    return 0; /* not an AArch64 build */
}

#endif
