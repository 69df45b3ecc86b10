/*
 * expf.h - e^x for floats with the exact bits of glibc's expf (2.28 and
 * later, as its x86-64 FMA build and its AArch64 build compute it); not
 * part of the API.
 *
 * The softmaxes of attention and the SwiGLU gates took glibc's expf one
 * element at a time, and their results are part of every cartridge's bits.
 * Each level's expf_n (kernels.h) computes this same arithmetic on whole
 * vectors, so the kernels get faster and no bit moves:
 *   k = round(x * 32 / ln 2) through the 1.5 * 2^52 shift (fused), r = x *
 *   32 / ln 2 - k (fused), s = 2^(k / 32) from a 32-entry table with k's
 *   high bits added to the exponent, the polynomial (C0 r + C1) r^2 + (C2 r +
 *   1) in three fused steps, y = that * s in double, rounded once to float.
 * Inputs with |x| >= 88 or NaN take glibc's special cases: -inf gives 0, NaN
 * and +inf give x + x, overflow +inf, x < log(2^-150) gives 0, x below
 * log(2^-149) gives 2^-149; the rest of them the formula.
 * test_kernels compares cart_expf_ref with the C library's expf (where that
 * is the FMA build) and every level's expf_n with cart_expf_ref.
 */
#ifndef CART_KERNELS_EXPF_H
#define CART_KERNELS_EXPF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^(i / 32) for i < 32, as doubles with i's bits taken out of the
 * exponent (the table glibc's exp2f and expf share). */
static const uint64_t cart_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

#define CART_EXPF_INVLN2N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define CART_EXPF_SHIFT 0x1.8p+52
#define CART_EXPF_C0 0x1.c6af84b912394p-20
#define CART_EXPF_C1 0x1.ebfce50fac4f3p-13
#define CART_EXPF_C2 0x1.62e42ff0c52d6p-6
/* (bits & 0x7fffffff) above this: |x| >= 88, infinite or NaN */
#define CART_EXPF_BIG 0x42afffffu

/* The special cases for an x whose magnitude bits are above CART_EXPF_BIG;
 * sets *done when x is one of them. */
static inline float cart_expf_special(float x, uint32_t ix, int *done) {
    *done = 1;
    if (ix == 0xff800000u) return 0.0f;
    if ((ix & 0x7fffffffu) >= 0x7f800000u) return x + x;
    if (x > 0x1.62e42ep6f) return INFINITY;
    if (x < -0x1.9fe368p6f) return 0.0f;
    if (x < -0x1.9d1d9ep6f) return 0x1p-149f;
    *done = 0;
    return 0.0f;
}

/* The definition, one element (fma() is one rounding on every CPU). */
static inline float cart_expf_ref(float x) {
    uint32_t ix;
    memcpy(&ix, &x, 4);
    if ((ix & 0x7fffffffu) > CART_EXPF_BIG) {
        int done;
        float y = cart_expf_special(x, ix, &done);
        if (done) return y;
    }
    const double xd = (double)x;
    double kd = fma(CART_EXPF_INVLN2N, xd, CART_EXPF_SHIFT);
    uint64_t ki;
    memcpy(&ki, &kd, 8);
    kd -= CART_EXPF_SHIFT;
    const double r = fma(CART_EXPF_INVLN2N, xd, -kd);
    const uint64_t t = cart_expf_tab[ki & 31] + (ki << 47);
    double s;
    memcpy(&s, &t, 8);
    const double z = fma(CART_EXPF_C0, r, CART_EXPF_C1);
    const double r2 = r * r;
    double y = fma(CART_EXPF_C2, r, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/* y[i] = cart_expf_ref(x[i]) for i < n (y may be x): the scalar levels'
 * expf_n, and the vector levels' tail and special lanes. */
static inline void cart_expf_ref_n(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cart_expf_ref(x[i]);
}

#endif
