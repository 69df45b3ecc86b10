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
#define GK_BLOCKED_T 4 /* tokens per pass of the blocked GEMV: 16 q-register sums */

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

/* ---- integer block products (qgeneric.h), SMULL/SADALP: qk_neon.h ------ */

#define QK_SDOT 0
#include "qk_neon.h"
#define QK_T 4
#define QK_FN qk_groups_neon
#include "qgeneric.h"

#include "generic.h"

#else

const cart_kernels *cart_kernels_neon(void) {
    return 0; /* not an AArch64 build */
}

#endif
