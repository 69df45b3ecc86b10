/*
 * test_dtype.c - the dtype table, 16-bit float conversion and GGML block
 * (de)quantization (engine/dtype.c, engine/quant.c).
 *
 * Dequantization is checked against values this file computes itself: each
 * block type is built byte by byte from fields chosen here (scales, mins,
 * quants), packed by this file's own reading of GGML's layout, and the
 * expected floats follow GGML's reference formulas with every intermediate
 * rounded through a volatile, so the engine must match bit for bit.
 */
#include <ctype.h>
#include <float.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "check.h"
#include "dtype.h"

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static int rnd_int(int lo, int hi) { /* inclusive */
    return lo + (int)(rnd() % (uint32_t)(hi - lo + 1));
}

static float rnd_unit(void) { /* [-1, 1) */
    return (float)(rnd() >> 8) / 8388608.0f - 1.0f;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A random normal f16 scale: random sign and mantissa, exponent field 3..24
 * (about 2^-12 .. 2^9), and a subnormal one when `sub` is set. */
static uint16_t rnd_f16_scale(int sub) {
    uint16_t sign = (uint16_t)((rnd() & 1) << 15);
    uint16_t man = (uint16_t)(rnd() & 0x3ff);
    if (sub) return (uint16_t)(sign | (man ? man : 1));
    return (uint16_t)(sign | (rnd_int(3, 24) << 10) | man);
}

/* Compares n floats bit for bit; prints the max difference (tolerance 0). */
static void check_exact(const char *what, const float *got, const float *want, int64_t n) {
    double maxdiff = 0.0;
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; i++) {
        if (bits_of(got[i]) != bits_of(want[i])) {
            if (mismatches < 3)
                fprintf(stderr, "  %s[%lld]: got %.9g (0x%08x), want %.9g (0x%08x)\n", what,
                        (long long)i, got[i], bits_of(got[i]), want[i], bits_of(want[i]));
            mismatches++;
        }
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > maxdiff || d != d) maxdiff = d;
    }
    CHECK_MAXDIFF(what, maxdiff, 0.0);
    CHECK_MSG(mismatches == 0, "%s: %lld of %lld values differ in their bits", what,
              (long long)mismatches, (long long)n);
}

/* Dequantizes `nblocks` blocks built at buf + 1 (deliberately misaligned) and
 * compares with `want`. */
static void check_dequantized(const char *what, int32_t dtype, const uint8_t *blocks, int64_t n,
                              const float *want) {
    float *got = malloc((size_t)n * sizeof *got);
    CHECK_OK(cart_to_f32(got, dtype, blocks, n));
    check_exact(what, got, want, n);
    free(got);
}

/* ---- 16-bit floats ------------------------------------------------------------ */

/* Round-to-nearest-even into a binary format with `mbits` mantissa bits,
 * minimum normal exponent emin and maximum exponent emax, done in double
 * (independently of the engine's bit manipulation). Returns the bits;
 * finite non-NaN f only. */
static uint16_t ref_round(float f, int mbits, int emin, int emax, int ebias) {
    uint16_t sign = (uint16_t)(signbit(f) ? 1u << (mbits + (ebias == 15 ? 5 : 8)) : 0);
    double a = fabs((double)f);
    if (a == 0.0) return sign;
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    e -= 1;       /* a = m' * 2^e, m' in [1, 2) */
    if (e < emin) e = emin;
    double quantum = ldexp(1.0, e - mbits);
    double r = nearbyint(a / quantum); /* exact division; ties to even */
    double v = r * quantum;
    int expbits = ebias == 15 ? 5 : 8;
    uint16_t inf = (uint16_t)(((1u << expbits) - 1) << mbits);
    if (v >= ldexp(1.0, emax + 1)) return (uint16_t)(sign | inf);
    if (v == 0.0) return sign; /* underflow */
    frexp(v, &e);
    e -= 1;
    if (e < emin)
        return (uint16_t)(sign | (uint16_t)(v / ldexp(1.0, emin - mbits))); /* subnormal */
    uint16_t man = (uint16_t)(v / ldexp(1.0, e - mbits) - ldexp(1.0, mbits));
    return (uint16_t)(sign | ((e + ebias) << mbits) | man);
}

static uint16_t ref_f16(float f) {
    return ref_round(f, 10, -14, 15, 15);
}

static uint16_t ref_bf16(float f) {
    return ref_round(f, 7, -126, 127, 127);
}

static void test_f16_conversion_handles_hand_picked_values(void) {
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {65504.0f, 0x7bff},                   /* largest finite */
        {65519.996f, 0x7bff},                 /* just below the overflow tie */
        {65520.0f, 0x7c00},                   /* tie with 65536: even is inf */
        {1e6f, 0x7c00},                       /* overflow */
        {-1e6f, 0xfc00},                      /* negative overflow */
        {INFINITY, 0x7c00},                   /* inf */
        {-INFINITY, 0xfc00},                  /* -inf */
        {1.0f + 0x1p-11f, 0x3c00},            /* tie: stays even */
        {1.0f + 3 * 0x1p-11f, 0x3c02},        /* tie: up to even */
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01}, /* just above a tie */
        {0x1p-24f, 0x0001},                   /* smallest subnormal */
        {-0x1p-24f, 0x8001},                  /* negative subnormal */
        {0x1p-25f, 0x0000},                   /* tie with 0: even is 0 */
        {0x1p-25f + 0x1p-40f, 0x0001},        /* just above that tie */
        {3 * 0x1p-25f, 0x0002},               /* tie between 1 and 2 */
        {0x1p-26f, 0x0000},                   /* underflow */
        {-0x1p-26f, 0x8000},                  /* underflow keeps the sign */
        {1023 * 0x1p-24f, 0x03ff},            /* largest subnormal */
        {0x1p-14f - 0x1p-25f, 0x0400},        /* tie: rounds up to the normal */
        {0x1p-14f, 0x0400},                   /* smallest normal */
        {0.333333333f, 0x3555},               /* ordinary rounding */
        {float_of(0x00000001), 0x0000},       /* f32 subnormal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = cart_f32_to_f16(cases[i].f);
        CHECK_MSG(h == cases[i].h, "f32 %a -> f16 0x%04x, want 0x%04x", (double)cases[i].f, h,
                  cases[i].h);
        if (cases[i].h != 0x7c00 && cases[i].h != 0xfc00 && fabsf(cases[i].f) < 65520.0f)
            CHECK(ref_f16(cases[i].f) == cases[i].h); /* the reference agrees with the table */
    }
    /* NaN stays NaN, quiet, with its sign; a signalling NaN does not become inf */
    uint16_t qn = cart_f32_to_f16(NAN);
    CHECK((qn & 0x7c00) == 0x7c00 && (qn & 0x03ff) != 0 && (qn & 0x0200));
    uint16_t sn = cart_f32_to_f16(float_of(0x7f800001));
    CHECK((sn & 0x7c00) == 0x7c00 && (sn & 0x03ff) != 0);
    uint16_t nn = cart_f32_to_f16(float_of(0xffc00000));
    CHECK((nn & 0x8000) && (nn & 0x03ff) != 0);
    /* f16 -> f32 */
    CHECK(cart_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(cart_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(cart_f16_to_f32(0x8001) == -0x1p-24f);
    CHECK(cart_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(cart_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(cart_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(bits_of(cart_f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(cart_f16_to_f32(0x7c00) == INFINITY);
    CHECK(cart_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(cart_f16_to_f32(0x7e00)) && isnan(cart_f16_to_f32(0x7c01)));
    CHECK(signbit(cart_f16_to_f32(0xfe00)));
}

static void test_every_f16_value_round_trips_through_f32(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cart_f16_to_f32((uint16_t)h);
        uint16_t back = cart_f32_to_f16(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x03ff);
        if (is_nan) {
            /* NaN stays NaN with its sign; a quiet NaN keeps its payload */
            if (!isnan(f) || (back & 0x7c00) != 0x7c00 || !(back & 0x03ff) ||
                (back & 0x8000) != (h & 0x8000) || ((h & 0x0200) && back != h))
                bad++;
        } else if (back != h) {
            if (bad < 3) fprintf(stderr, "  0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d of 65536 f16 values do not round-trip", bad);

    /* cart_to_f32 has its own f16 path: it must agree with the scalar
     * function on every value, bit for bit */
    uint8_t *all = malloc(2 * 65536 + 1);
    float *got = malloc(65536 * sizeof *got), *want = malloc(65536 * sizeof *want);
    for (uint32_t h = 0; h < 65536; h++) {
        put16(all + 1 + 2 * h, (uint16_t)h);
        want[h] = cart_f16_to_f32((uint16_t)h);
    }
    CHECK_OK(cart_to_f32(got, CART_F16, all + 1, 65536));
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) bad += bits_of(got[h]) != bits_of(want[h]);
    CHECK_MSG(bad == 0, "cart_to_f32 differs from cart_f16_to_f32 on %d f16 values", bad);
    free(all);
    free(got);
    free(want);
}

/* f32 patterns from a strided sweep over all 2^32, plus every mantissa
 * rounding case (the 13 dropped bits at and around the half-way point) for
 * each exponent from the f16 underflow range to overflow. */
static void test_f32_to_f16_matches_a_double_precision_reference(void) {
    int64_t bad = 0, count = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = float_of((uint32_t)u);
        if (isnan(f)) continue;
        uint16_t want = isinf(f) ? (uint16_t)(signbit(f) ? 0xfc00 : 0x7c00) : ref_f16(f);
        if (cart_f32_to_f16(f) != want) bad++;
        count++;
    }
    const uint32_t tails[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
    for (uint32_t e = 0x60; e <= 0x90; e++)
        for (uint32_t m = 0; m < 1024; m++)
            for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++)
                for (uint32_t s = 0; s < 2; s++) {
                    float f = float_of((s << 31) | (e << 23) | (m << 13) | tails[t]);
                    if (cart_f32_to_f16(f) != ref_f16(f)) bad++;
                    count++;
                }
    CHECK_MSG(bad == 0, "%lld of %lld f32 values round differently", (long long)bad,
              (long long)count);
    printf("  f32 -> f16 agrees with the reference on %lld values\n", (long long)count);
}

/* Run as its own ctest entry (dtype@f16c: test_dtype f16c), compiled for
 * F16C whatever the build's flags, which skips (77) on a CPU without it. */
#if defined(__x86_64__)
static int cpu_has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

__attribute__((target("f16c"))) static void test_f16_conversion_matches_the_cpu_f16c_instruction(void) {
    /* f32 -> f16 over a strided sweep of all 2^32 bit patterns (NaNs
     * included: both quieten and keep the top payload bits). */
    int64_t bad = 0, count = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 13) {
        float f = float_of((uint32_t)u);
        uint16_t want = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        uint16_t got = cart_f32_to_f16(f);
        if (got != want) {
            if (bad < 3)
                fprintf(stderr, "  0x%08x: got 0x%04x, F16C 0x%04x\n", (uint32_t)u, got, want);
            bad++;
        }
        count++;
    }
    CHECK_MSG(bad == 0, "%lld of %lld f32 -> f16 conversions differ from F16C", (long long)bad,
              (long long)count);
    printf("  f32 -> f16 agrees with F16C on %lld bit patterns\n", (long long)count);
    /* f16 -> f32 for all 65536 values; a signalling NaN comes back quiet
     * from F16C and signalling from the engine: both NaN, same sign. */
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float want = _cvtsh_ss((unsigned short)h);
        float got = cart_f16_to_f32((uint16_t)h);
        int same = bits_of(got) == bits_of(want) ||
                   (isnan(got) && isnan(want) && signbit(got) == signbit(want));
        if (!same) bad++;
    }
    CHECK_MSG(bad == 0, "%lld of 65536 f16 -> f32 conversions differ from F16C", (long long)bad);
}
#endif

static void test_bf16_conversion_rounds_to_nearest_even(void) {
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3f80},
        {-1.0f, 0xbf80},
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f + 0x1p-8f, 0x3f80},            /* tie: stays even */
        {1.0f + 3 * 0x1p-8f, 0x3f82},        /* tie: up to even */
        {1.0f + 0x1p-8f + 0x1p-23f, 0x3f81}, /* just above a tie */
        {float_of(0x7f7fffff), 0x7f80},      /* FLT_MAX rounds to inf */
        {float_of(0x7f7f7fff), 0x7f7f},      /* below the tie: largest finite bf16 */
        {float_of(0x7f7f8000), 0x7f80},      /* tie at the top: even is inf */
        {INFINITY, 0x7f80},
        {-INFINITY, 0xff80},
        {float_of(0x00000001), 0x0000}, /* tiny subnormal rounds to 0 */
        {float_of(0x00008000), 0x0000}, /* subnormal tie: stays even */
        {float_of(0x00018000), 0x0002}, /* subnormal tie: up to even */
        {float_of(0x80018001), 0x8002}, /* negative, above a tie */
        {3.14159265f, 0x4049},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = cart_f32_to_bf16(cases[i].f);
        CHECK_MSG(h == cases[i].h, "f32 %a -> bf16 0x%04x, want 0x%04x", (double)cases[i].f, h,
                  cases[i].h);
        CHECK(bits_of(cart_bf16_to_f32(cases[i].h)) == (uint32_t)cases[i].h << 16);
    }
    uint16_t qn = cart_f32_to_bf16(float_of(0x7f800001)); /* signalling NaN stays NaN */
    CHECK((qn & 0x7f80) == 0x7f80 && (qn & 0x007f) != 0);
    uint16_t nn = cart_f32_to_bf16(float_of(0xffc00000));
    CHECK(nn == 0xffc0);
    CHECK(isnan(cart_bf16_to_f32(0x7fc0)));

    int64_t bad = 0, count = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = float_of((uint32_t)u);
        if (isnan(f)) continue;
        uint16_t want = isinf(f) ? (uint16_t)(signbit(f) ? 0xff80 : 0x7f80) : ref_bf16(f);
        if (cart_f32_to_bf16(f) != want) bad++;
        count++;
    }
    CHECK_MSG(bad == 0, "%lld of %lld f32 -> bf16 conversions differ from the reference",
              (long long)bad, (long long)count);
}

static void test_array_conversions_accept_misaligned_buffers(void) {
    enum { N = 37 };
    float src[N];
    for (int i = 0; i < N; i++) src[i] = rnd_unit() * 1000.0f;
    uint8_t raw[N * 4 + 8];
    uint16_t *h = (uint16_t *)(void *)(raw + 1); /* the API takes any alignment */
    float back[N];

    cart_f32_to_f16_n(h, src, N);
    cart_f16_to_f32_n(back, h, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        uint16_t v;
        memcpy(&v, raw + 1 + 2 * i, 2);
        bad += v != cart_f32_to_f16(src[i]) || back[i] != cart_f16_to_f32(v);
    }
    cart_f32_to_bf16_n(h, src, N);
    cart_bf16_to_f32_n(back, h, N);
    for (int i = 0; i < N; i++) {
        uint16_t v;
        memcpy(&v, raw + 1 + 2 * i, 2);
        bad += v != cart_f32_to_bf16(src[i]) || back[i] != cart_bf16_to_f32(v);
    }
    /* the same through cart_to_f32 / cart_from_f32, source misaligned */
    CHECK_OK(cart_from_f32(raw + 1, CART_F16, src, N));
    CHECK_OK(cart_to_f32(back, CART_F16, raw + 1, N));
    for (int i = 0; i < N; i++) bad += back[i] != cart_f16_to_f32(cart_f32_to_f16(src[i]));
    memcpy(raw + 3, src, sizeof src);
    CHECK_OK(cart_to_f32(back, CART_F32, raw + 3, N));
    for (int i = 0; i < N; i++) bad += bits_of(back[i]) != bits_of(src[i]);
    CHECK(bad == 0);
}

/* ---- plain element types ---------------------------------------------------- */

static void test_integer_and_float_elements_convert_to_f32(void) {
    uint8_t buf[80];
    float out[8];
    /* i8, u8, bool */
    const uint8_t bytes[5] = {0x00, 0x7f, 0x80, 0xff, 0x02};
    memcpy(buf + 1, bytes, 5);
    CHECK_OK(cart_to_f32(out, CART_I8, buf + 1, 5));
    CHECK(out[0] == 0 && out[1] == 127 && out[2] == -128 && out[3] == -1 && out[4] == 2);
    CHECK_OK(cart_to_f32(out, CART_U8, buf + 1, 5));
    CHECK(out[0] == 0 && out[1] == 127 && out[2] == 128 && out[3] == 255 && out[4] == 2);
    CHECK_OK(cart_to_f32(out, CART_BOOL, buf + 1, 5));
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 1 && out[3] == 1 && out[4] == 1);
    /* i16, i32, i64: little-endian, misaligned */
    put16(buf + 1, 0x8000);
    put16(buf + 3, 0x1234);
    CHECK_OK(cart_to_f32(out, CART_I16, buf + 1, 2));
    CHECK(out[0] == -32768 && out[1] == 0x1234);
    put32(buf + 1, 0x80000000u);
    put32(buf + 5, 16777217u); /* 2^24 + 1 rounds to even: 2^24 */
    CHECK_OK(cart_to_f32(out, CART_I32, buf + 1, 2));
    CHECK(out[0] == -2147483648.0f && out[1] == 16777216.0f);
    put32(buf + 1, 0xffffffffu); /* -1 */
    put32(buf + 5, 0xffffffffu);
    put32(buf + 9, 0x00000000u); /* 2^62 */
    put32(buf + 13, 0x40000000u);
    CHECK_OK(cart_to_f32(out, CART_I64, buf + 1, 2));
    CHECK(out[0] == -1.0f && out[1] == 0x1p62f);
    /* f64 */
    double dv[2] = {0.1, -1e300};
    memcpy(buf + 1, dv, sizeof dv);
    CHECK_OK(cart_to_f32(out, CART_F64, buf + 1, 2));
    CHECK(out[0] == 0.1f && out[1] == -INFINITY);
    /* bf16 */
    put16(buf + 1, 0x3f80);
    put16(buf + 3, 0xc049);
    CHECK_OK(cart_to_f32(out, CART_BF16, buf + 1, 2));
    CHECK(out[0] == 1.0f && out[1] == -3.140625f);
}

static void test_f32_converts_to_integers_rounding_and_saturating(void) {
    const float src[] = {2.5f, -2.5f, 127.6f, -200.0f, NAN, 0.49f, -0.0f, 1e10f};
    enum { N = sizeof src / sizeof src[0] };
    uint8_t buf[N * 8 + 1];

    CHECK_OK(cart_from_f32(buf + 1, CART_I8, src, N));
    const int8_t want_i8[N] = {3, -3, 127, -128, 0, 0, 0, 127};
    CHECK(memcmp(buf + 1, want_i8, N) == 0);

    CHECK_OK(cart_from_f32(buf + 1, CART_U8, src, N));
    const uint8_t want_u8[N] = {3, 0, 128, 0, 0, 0, 0, 255};
    CHECK(memcmp(buf + 1, want_u8, N) == 0);

    CHECK_OK(cart_from_f32(buf + 1, CART_I16, src, N));
    const int16_t want_i16[N] = {3, -3, 128, -200, 0, 0, 0, 32767};
    CHECK(memcmp(buf + 1, want_i16, sizeof want_i16) == 0);

    const float big[] = {2147483648.0f, -2147483648.0f, -3e9f, 2147483520.0f};
    CHECK_OK(cart_from_f32(buf + 1, CART_I32, big, 4));
    const int32_t want_i32[4] = {INT32_MAX, INT32_MIN, INT32_MIN, 2147483520};
    CHECK(memcmp(buf + 1, want_i32, sizeof want_i32) == 0);

    const float huge[] = {1e19f, -1e19f, 0x1p63f, 9223371487098961920.0f, -0x1p63f, -7.5f};
    CHECK_OK(cart_from_f32(buf + 1, CART_I64, huge, 6));
    const int64_t want_i64[6] = {INT64_MAX, INT64_MIN, INT64_MAX, 9223371487098961920LL,
                                 INT64_MIN, -8};
    CHECK(memcmp(buf + 1, want_i64, sizeof want_i64) == 0);

    CHECK_OK(cart_from_f32(buf + 1, CART_BOOL, src, N));
    const uint8_t want_bool[N] = {1, 1, 1, 1, 1, 1, 0, 1};
    CHECK(memcmp(buf + 1, want_bool, N) == 0);

    CHECK_OK(cart_from_f32(buf + 1, CART_F64, src, 4));
    double d[4];
    memcpy(d, buf + 1, sizeof d);
    CHECK(d[0] == 2.5 && d[1] == -2.5 && d[2] == (double)127.6f && d[3] == -200.0);

    float back[N];
    CHECK_OK(cart_from_f32(buf + 1, CART_BF16, src, N));
    CHECK_OK(cart_to_f32(back, CART_BF16, buf + 1, N));
    CHECK(back[0] == 2.5f && back[3] == -200.0f && isnan(back[4]));
}

/* ---- dequantization of hand-built blocks ------------------------------------ */

enum { NB = 3 }; /* blocks per test: enough to see the stride between blocks */

/* Each builder fills `nb` blocks at out from fields it draws itself and
 * writes the expected values to want. The formulas mirror GGML's reference
 * dequantizers, operation by operation, rounding through volatiles. */

static void build_q4_0(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 18, want += 32) {
        const uint16_t dh = rnd_f16_scale(b == 2);
        const float d = cart_f16_to_f32(dh);
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = rnd_int(0, 15);
        put16(out, dh);
        for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        for (int j = 0; j < 32; j++) want[j] = (float)(q[j] - 8) * d;
    }
}

static void build_q4_1(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 20, want += 32) {
        const uint16_t dh = rnd_f16_scale(0), mh = rnd_f16_scale(b == 1);
        const float d = cart_f16_to_f32(dh), m = cart_f16_to_f32(mh);
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = rnd_int(0, 15);
        put16(out, dh);
        put16(out + 2, mh);
        for (int j = 0; j < 16; j++) out[4 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        for (int j = 0; j < 32; j++) {
            volatile float p = (float)q[j] * d;
            want[j] = p + m;
        }
    }
}

static void build_q5_0(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 22, want += 32) {
        const uint16_t dh = rnd_f16_scale(b == 2);
        const float d = cart_f16_to_f32(dh);
        int q[32];
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            q[j] = rnd_int(0, 31);
            qh |= (uint32_t)(q[j] >> 4) << j; /* fifth bit of element j at bit j */
        }
        put16(out, dh);
        put32(out + 2, qh);
        for (int j = 0; j < 16; j++) out[6 + j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        for (int j = 0; j < 32; j++) want[j] = (float)(q[j] - 16) * d;
    }
}

static void build_q5_1(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 24, want += 32) {
        const uint16_t dh = rnd_f16_scale(0), mh = rnd_f16_scale(0);
        const float d = cart_f16_to_f32(dh), m = cart_f16_to_f32(mh);
        int q[32];
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            q[j] = rnd_int(0, 31);
            qh |= (uint32_t)(q[j] >> 4) << j;
        }
        put16(out, dh);
        put16(out + 2, mh);
        put32(out + 4, qh);
        for (int j = 0; j < 16; j++) out[8 + j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        for (int j = 0; j < 32; j++) {
            volatile float p = (float)q[j] * d;
            want[j] = p + m;
        }
    }
}

/* q8_0 (qs at 2, 34 bytes) and q8_1 (s at 2, qs at 4, 36 bytes). */
static void build_q8(uint8_t *out, float *want, int nb, int qs_at) {
    for (int b = 0; b < nb; b++, out += qs_at + 32, want += 32) {
        const uint16_t dh = rnd_f16_scale(b == 2);
        const float d = cart_f16_to_f32(dh);
        put16(out, dh);
        if (qs_at == 4) put16(out + 2, rnd_f16_scale(0)); /* s: not used to dequantize */
        for (int j = 0; j < 32; j++) {
            const int q = rnd_int(-128, 127);
            out[qs_at + j] = (uint8_t)(int8_t)q;
            want[j] = (float)q * d;
        }
    }
}

static void build_q8_0(uint8_t *out, float *want, int nb) {
    build_q8(out, want, nb, 2);
}

static void build_q8_1(uint8_t *out, float *want, int nb) {
    build_q8(out, want, nb, 4);
}

/* Position of element e (< 256) in the 2-bit fields of q2_K/q3_K: byte
 * 32 * (e / 128) + e % 32, bit pair (e % 128) / 32. */
static void put_2bit(uint8_t *qs, int e, int v) {
    qs[32 * (e / 128) + e % 32] |= (uint8_t)((v & 3) << (2 * ((e % 128) / 32)));
}

static void build_q2_K(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 84, want += 256) {
        memset(out, 0, 84);
        const uint16_t dh = rnd_f16_scale(0), mh = rnd_f16_scale(b == 1);
        const float d = cart_f16_to_f32(dh), dmin = cart_f16_to_f32(mh);
        int sc[16], mn[16];
        for (int k = 0; k < 16; k++) {
            sc[k] = rnd_int(0, 15);
            mn[k] = rnd_int(0, 15);
            out[k] = (uint8_t)(sc[k] | (mn[k] << 4));
        }
        put16(out + 80, dh);
        put16(out + 82, mh);
        for (int e = 0; e < 256; e++) {
            const int q = rnd_int(0, 3);
            put_2bit(out + 16, e, q);
            volatile float dl = d * (float)sc[e / 16];
            volatile float ml = dmin * (float)mn[e / 16];
            volatile float p = dl * (float)q;
            want[e] = p - ml;
        }
    }
}

static void build_q3_K(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 110, want += 256) {
        memset(out, 0, 110);
        const uint16_t dh = rnd_f16_scale(b == 2);
        const float d = cart_f16_to_f32(dh);
        int sc[16];
        for (int k = 0; k < 16; k++) {
            sc[k] = rnd_int(-32, 31);
            const int u = sc[k] + 32; /* stored 6-bit value */
            if (k < 8)
                out[96 + k] |= (uint8_t)(u & 15);
            else
                out[96 + k - 8] |= (uint8_t)((u & 15) << 4);
            out[96 + 8 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
        }
        put16(out + 108, dh);
        for (int e = 0; e < 256; e++) {
            const int q = rnd_int(-4, 3);
            const int u = q + 4; /* low two bits in qs, bit 2 in hmask */
            put_2bit(out + 32, e, u);
            if (u & 4) out[e % 32] |= (uint8_t)(1u << (4 * (e / 128) + (e % 128) / 32));
            volatile float dl = d * (float)sc[e / 16];
            want[e] = dl * (float)q;
        }
    }
}

/* The 12 scale bytes of q4_K/q5_K for 8 six-bit scales and mins. */
static void put_scales_k4(uint8_t *s, const int *sc, const int *mn) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
}

/* q4_K (bits 4) and q5_K (bits 5). */
static void build_qk_affine(uint8_t *out, float *want, int nb, int bits) {
    const int size = bits == 4 ? 144 : 176, qs_at = bits == 4 ? 16 : 48;
    for (int b = 0; b < nb; b++, out += size, want += 256) {
        memset(out, 0, (size_t)size);
        const uint16_t dh = rnd_f16_scale(b == 2), mh = rnd_f16_scale(0);
        const float d = cart_f16_to_f32(dh), dmin = cart_f16_to_f32(mh);
        int sc[8], mn[8];
        for (int k = 0; k < 8; k++) {
            sc[k] = rnd_int(0, 63);
            mn[k] = rnd_int(0, 63);
        }
        put16(out, dh);
        put16(out + 2, mh);
        put_scales_k4(out + 4, sc, mn);
        for (int e = 0; e < 256; e++) {
            const int q = rnd_int(0, (1 << bits) - 1);
            const int chunk = e / 64, r = e % 64;
            out[qs_at + 32 * chunk + r % 32] |= (uint8_t)((q & 15) << (r < 32 ? 0 : 4));
            if (bits == 5) out[16 + r % 32] |= (uint8_t)((q >> 4) << (2 * chunk + (r >= 32)));
            volatile float dl = d * (float)sc[e / 32];
            volatile float ml = dmin * (float)mn[e / 32];
            volatile float p = dl * (float)q;
            want[e] = p - ml;
        }
    }
}

static void build_q4_K(uint8_t *out, float *want, int nb) {
    build_qk_affine(out, want, nb, 4);
}

static void build_q5_K(uint8_t *out, float *want, int nb) {
    build_qk_affine(out, want, nb, 5);
}

static void build_q6_K(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 210, want += 256) {
        memset(out, 0, 210);
        const uint16_t dh = rnd_f16_scale(b == 1);
        const float d = cart_f16_to_f32(dh);
        int sc[16];
        for (int k = 0; k < 16; k++) {
            sc[k] = rnd_int(-128, 127);
            out[192 + k] = (uint8_t)(int8_t)sc[k];
        }
        put16(out + 208, dh);
        for (int e = 0; e < 256; e++) {
            const int q = rnd_int(-32, 31), u = q + 32;
            const int half = e / 128, g = (e % 128) / 32, l = e % 32;
            /* groups 0,1: low nibbles of ql[l], ql[l + 32]; groups 2,3: high */
            out[64 * half + l + 32 * (g & 1)] |= (uint8_t)((u & 15) << (g < 2 ? 0 : 4));
            out[128 + 32 * half + l] |= (uint8_t)((u >> 4) << (2 * g));
            volatile float s = d * (float)sc[e / 16];
            want[e] = s * (float)q;
        }
    }
}

static void build_q8_K(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 292, want += 256) {
        const float d = rnd_unit() * (b == 1 ? 1e-30f : 0.01f);
        put32(out, bits_of(d));
        for (int j = 0; j < 256; j++) {
            const int q = rnd_int(-128, 127);
            out[4 + j] = (uint8_t)(int8_t)q;
            want[j] = d * (float)q;
        }
        for (int k = 0; k < 32; k++) out[260 + k] = (uint8_t)rnd(); /* bsums: unused */
    }
}

/* GGML's kvalues_iq4nl. */
static const int iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

static void build_iq4_nl(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 18, want += 32) {
        const uint16_t dh = rnd_f16_scale(b == 2);
        const float d = cart_f16_to_f32(dh);
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = rnd_int(0, 15);
        put16(out, dh);
        for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        for (int j = 0; j < 32; j++) want[j] = d * (float)iq4nl_levels[q[j]];
    }
}

static void build_iq4_xs(uint8_t *out, float *want, int nb) {
    for (int b = 0; b < nb; b++, out += 136, want += 256) {
        memset(out, 0, 136);
        const uint16_t dh = rnd_f16_scale(b == 1);
        const float d = cart_f16_to_f32(dh);
        uint16_t scales_h = 0;
        int ls[8];
        for (int s = 0; s < 8; s++) {
            ls[s] = rnd_int(0, 63);
            out[4 + s / 2] |= (uint8_t)((ls[s] & 15) << (4 * (s % 2)));
            scales_h |= (uint16_t)((ls[s] >> 4) << (2 * s));
        }
        put16(out, dh);
        put16(out + 2, scales_h);
        for (int e = 0; e < 256; e++) {
            const int q = rnd_int(0, 15), s = e / 32, r = e % 32;
            out[8 + 16 * s + r % 16] |= (uint8_t)(q << (r < 16 ? 0 : 4));
            volatile float dl = d * (float)(ls[s] - 32);
            want[e] = dl * (float)iq4nl_levels[q];
        }
    }
}

typedef void (*block_builder)(uint8_t *out, float *want, int nb);

static void check_hand_built(int32_t dtype, block_builder build) {
    cart_dtype_info info;
    CHECK_OK(cart_dtype_get_info(&info, dtype));
    const int64_t n = (int64_t)NB * info.block_size;
    uint8_t *buf = calloc(1, (size_t)info.type_size * NB + 1);
    float *want = malloc((size_t)n * sizeof *want);
    char what[64];
    for (int round = 0; round < 20; round++) {
        build(buf + 1, want, NB);
        snprintf(what, sizeof what, "%s hand-built blocks, round %d", info.name, round);
        if (round == 0 || round == 19) {
            check_dequantized(what, dtype, buf + 1, n, want);
        } else { /* quiet rounds: report only a failure */
            float *got = malloc((size_t)n * sizeof *got);
            CHECK_OK(cart_to_f32(got, dtype, buf + 1, n));
            int bad = 0;
            for (int64_t i = 0; i < n; i++) bad += bits_of(got[i]) != bits_of(want[i]);
            CHECK_MSG(bad == 0, "%s: %d values differ", what, bad);
            free(got);
        }
    }
    free(buf);
    free(want);
}

static void test_q4_0_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q4_0, build_q4_0);
}

static void test_q4_1_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q4_1, build_q4_1);
}

static void test_q5_0_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q5_0, build_q5_0);
}

static void test_q5_1_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q5_1, build_q5_1);
}

static void test_q8_0_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q8_0, build_q8_0);
}

static void test_q8_1_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q8_1, build_q8_1);
}

static void test_q2_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q2_K, build_q2_K);
}

static void test_q3_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q3_K, build_q3_K);
}

static void test_q4_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q4_K, build_q4_K);
}

static void test_q5_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q5_K, build_q5_K);
}

static void test_q6_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q6_K, build_q6_K);
}

static void test_q8_K_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_Q8_K, build_q8_K);
}

static void test_iq4_nl_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_IQ4_NL, build_iq4_nl);
}

static void test_iq4_xs_dequantizes_hand_built_blocks(void) {
    check_hand_built(CART_IQ4_XS, build_iq4_xs);
}

/* A fully specified q4_K block whose values can be read off by hand. */
static void test_q4_K_dequantizes_a_block_worked_out_by_hand(void) {
    uint8_t blk[144] = {0};
    put16(blk, 0x3c00);     /* d = 1 */
    put16(blk + 2, 0x3800); /* dmin = 0.5 */
    /* sub-block 0: scale 1, min 2; sub-block 5: scale 33 (0b100001), min 3;
     * every other scale and min 0 */
    int sc[8] = {1, 0, 0, 0, 0, 33, 0, 0}, mn[8] = {2, 0, 0, 0, 0, 3, 0, 0};
    put_scales_k4(blk + 4, sc, mn);
    /* scale 33 of sub-block 5: low nibble 1 in byte 9 (with min 3 above it),
     * top bits 0b10 in byte 1 */
    CHECK(blk[4] == 1 && blk[8] == 2 && blk[5] == 0x80 && blk[13] == 0x31 && blk[9] == 0);
    blk[16 + 0] = 0x07;      /* element 0: q 7 -> 1 * 7 - 0.5 * 2 = 6 */
    blk[16 + 1] = 0x0f;      /* element 1: q 15 -> 14 */
    blk[16 + 64 + 3] = 0x20; /* element 128 + 32 + 3 (sub-block 5): q 2 -> 33 * 2 - 1.5 = 64.5 */
    float y[256];
    CHECK_OK(cart_to_f32(y, CART_Q4_K, blk, 256));
    CHECK(y[0] == 6.0f && y[1] == 14.0f && y[2] == -1.0f && y[163] == 64.5f && y[160] == -1.5f);
    CHECK(y[32] == 0.0f && y[255] == 0.0f);
}

/* ---- quantization ------------------------------------------------------------- */

/* Bytes of q8_0 / q8_1 / q8_K for inputs chosen so every step is exact and
 * the rounding of each quant can be worked out by hand. */
static void test_q8_0_and_q8_1_quantize_a_known_input_to_known_bytes(void) {
    float x[96];
    /* block 0: absmax 127 so d = 1 and id = 1; roundf ties go away from 0 */
    const float head[7] = {-127.0f, 2.5f, -2.5f, 0.5f, -0.49f, 126.5f, 100.25f};
    for (int j = 0; j < 32; j++) x[j] = j < 7 ? head[j] : (float)j;
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;         /* block 1: zeros */
    for (int j = 0; j < 32; j++) x[64 + j] = x[j] * 0.25f; /* block 2: d = 0.25 */
    const uint8_t qs[32] = {0x81, 3,  0xfd, 1,  0,  127, 100, 7,  8,  9,  10, 11, 12, 13, 14, 15,
                            16,   17, 18,   19, 20, 21,  22,  23, 24, 25, 26, 27, 28, 29, 30, 31};
    uint8_t got[3 * 36];

    CHECK_OK(cart_from_f32(got, CART_Q8_0, x, 96));
    CHECK(got[0] == 0x00 && got[1] == 0x3c); /* d = f16(1.0) */
    CHECK(memcmp(got + 2, qs, 32) == 0);
    for (int j = 0; j < 34; j++) CHECK(got[34 + j] == 0);
    CHECK(got[68] == 0x00 && got[69] == 0x34); /* d = f16(0.25) */
    CHECK(memcmp(got + 70, qs, 32) == 0);

    /* q8_1 adds s = f16(d * sum(qs)): sum = -127 + 3 - 3 + 1 + 0 + 127 + 100
     * + (7 + ... + 31) = 101 + 475 = 576 = 0x6080 in f16; block 2: 144 */
    CHECK_OK(cart_from_f32(got, CART_Q8_1, x, 96));
    CHECK(got[0] == 0x00 && got[1] == 0x3c && got[2] == 0x80 && got[3] == 0x60);
    CHECK(memcmp(got + 4, qs, 32) == 0);
    for (int j = 0; j < 36; j++) CHECK(got[36 + j] == 0);
    CHECK(got[72] == 0x00 && got[73] == 0x34 && got[74] == 0x80 && got[75] == 0x58);
    CHECK(memcmp(got + 76, qs, 32) == 0);
}

static void test_q8_K_quantizes_a_known_input_to_known_bytes(void) {
    float x[512];
    /* block 0: the largest magnitude is -127, so iscale = -127 / -127 = 1 and
     * d = 1; nearest_int rounds ties to even */
    const float head[6] = {-127.0f, 2.5f, 3.5f, -2.5f, 126.5f, -126.5f};
    const int8_t head_q[6] = {-127, 2, 4, -2, 126, -126};
    for (int j = 0; j < 256; j++) x[j] = j < 6 ? head[j] : (float)(j % 7 - 3);
    /* block 1: the largest magnitude is +127, so iscale = -1, d = -1 and
     * every quant is negated */
    for (int j = 0; j < 256; j++) x[256 + j] = j == 0 ? 127.0f : (j == 1 ? 2.5f : 1.0f);
    uint8_t got[2 * 292];
    CHECK_OK(cart_from_f32(got, CART_Q8_K, x, 512));

    const uint8_t d_one[4] = {0x00, 0x00, 0x80, 0x3f}, d_minus_one[4] = {0x00, 0x00, 0x80, 0xbf};
    CHECK(memcmp(got, d_one, 4) == 0);
    int8_t want_q[256];
    for (int j = 0; j < 256; j++) want_q[j] = j < 6 ? head_q[j] : (int8_t)(j % 7 - 3);
    CHECK(memcmp(got + 4, want_q, 256) == 0);
    /* bsums: block 0's first 16 sum to -127 + 2 + 4 - 2 + 126 - 126 = -123
     * plus j % 7 - 3 for j = 6..15 (3 -3 -2 -1 0 1 2 3 -3 -2, sum -2): -125 */
    int16_t bsum0;
    memcpy(&bsum0, got + 260, 2);
    CHECK(bsum0 == -125);
    for (int k = 1; k < 16; k++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += want_q[16 * k + l];
        int16_t b;
        memcpy(&b, got + 260 + 2 * k, 2);
        CHECK(b == sum);
    }

    const uint8_t *b1 = got + 292;
    CHECK(memcmp(b1, d_minus_one, 4) == 0);
    CHECK((int8_t)b1[4] == -127 && (int8_t)b1[5] == -2 && (int8_t)b1[6] == -1);
    int16_t bsum1;
    memcpy(&bsum1, b1 + 260, 2);
    CHECK(bsum1 == -127 - 2 - 14);
    float y[512];
    CHECK_OK(cart_to_f32(y, CART_Q8_K, got, 512));
    CHECK(y[256] == 127.0f && y[257] == 2.0f && y[258] == 1.0f);
}

/* Inputs for the round trips: n values in one of several shapes. */
static void fill_input(float *x, int64_t n, int shape) {
    for (int64_t i = 0; i < n; i++) {
        float u = rnd_unit();
        switch (shape) {
        case 0:
            x[i] = u;
            break; /* uniform [-1, 1) */
        case 1:
            x[i] = (u + rnd_unit() + rnd_unit()) * 0.02f;
            break; /* bell-shaped, small */
        case 2:
            x[i] = rnd() % 97 == 0 ? u * 20.0f : u;
            break; /* outliers */
        case 3:
            x[i] = 0.5f + 0.5f * (u + 1.0f);
            break; /* all positive */
        case 4:
            x[i] = -3.0f + u;
            break; /* all negative */
        case 5:
            x[i] = (i / 32) % 2 ? 0.0f : 1.5f;
            break; /* constant blocks */
        case 6:
            x[i] = u * 1000.0f;
            break; /* large */
        default:
            x[i] = 0.0f;
            break; /* zeros */
        }
    }
}

enum { N_SHAPES = 8 };

/* Quantizes shapes of input to `dtype`, dequantizes, and reports the largest
 * |error| / (absolute maximum of the block it lies in), against `bound`. */
static void check_round_trip(int32_t dtype, double bound) {
    cart_dtype_info info;
    CHECK_OK(cart_dtype_get_info(&info, dtype));
    const int64_t n = 16 * 256;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint64_t nbytes;
    CHECK_OK(cart_dtype_nbytes(&nbytes, dtype, n));
    uint8_t *q = malloc((size_t)nbytes + 1);
    double worst = 0.0;
    int not_finite = 0, zeros_not_exact = 0;
    for (int shape = 0; shape < N_SHAPES; shape++) {
        fill_input(x, n, shape);
        CHECK_OK(cart_from_f32(q + 1, dtype, x, n)); /* misaligned output */
        CHECK_OK(cart_to_f32(y, dtype, q + 1, n));
        for (int64_t b = 0; b < n; b += info.block_size) {
            double amax = 0.0;
            for (int j = 0; j < info.block_size; j++) amax = fmax(amax, fabs(x[b + j]));
            for (int j = 0; j < info.block_size; j++) {
                const double err = fabs((double)y[b + j] - (double)x[b + j]);
                not_finite += !isfinite(y[b + j]);
                if (amax == 0.0)
                    zeros_not_exact += err != 0.0;
                else if (err / amax > worst)
                    worst = err / amax;
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s round trip, max |error| / block absmax", info.name);
    CHECK_MAXDIFF(what, worst, bound);
    CHECK(not_finite == 0);
    CHECK(zeros_not_exact == 0);
    free(x);
    free(y);
    free(q);
}

/* Bounds, relative to the block's absolute maximum A (f16 scales carry a
 * relative error up to 2^-11 when rounded, 2^-10 when rounded up):
 *   q4_0: d = A/8; the value opposite the extreme clamps to q = 7: A/8, plus
 *         8 * 2^-11 * A/8 for d's f16 rounding                     -> 0.1255
 *   q5_0: the same with 16                                          -> 0.0630
 *   q4_1: d = range/15 <= 2A/15: d/2, plus 15 d 2^-11 and |min| 2^-11
 *                                                                   -> 0.0682
 *   q5_1: the same with 31                                          -> 0.0337
 *   q8_0, q8_1: d/2 = A/254, plus 127 d 2^-11                       -> 0.00443
 *   q8_K: d is f32: A/254                                           -> 0.00394
 * and for this engine's K-quant scheme (see quant.c), where the grid step sd
 * of a sub-block is at most its scale s plus the super-block scale d, and
 * d <= (largest s) / lmax (1 + 2^-10):
 *   q4_K: dmin <= A/63 (1 + 2^-10), the min offset sm <= A + dmin,
 *         s = (max + sm) / 15 <= (2A + dmin) / 15,
 *         sd <= s (1 + (1 + 2^-10)/63); error <= sd/2               -> 0.0683
 *   q5_K: the same with nmax 31                                     -> 0.0331
 *   q2_K: nmax 3, lmax 15: dmin <= A/15, s <= (2A + dmin)/3          -> 0.3675
 *   q3_K: s = A/3, sd <= s (1 + (1 + 2^-10)/31)                      -> 0.1721
 *   q6_K: s = A/31, sd <= s (1 + (1 + 2^-10)/127)                    -> 0.01626
 * Each gets a little room for f32 rounding. */
static void test_q4_0_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q4_0, 0.1256);
}

static void test_q4_1_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q4_1, 0.0683);
}

static void test_q5_0_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q5_0, 0.0631);
}

static void test_q5_1_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q5_1, 0.0338);
}

static void test_q8_0_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q8_0, 0.00444);
}

static void test_q8_1_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q8_1, 0.00444);
}

static void test_q8_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q8_K, 0.003940);
}

static void test_q2_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q2_K, 0.368);
}

static void test_q3_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q3_K, 0.1722);
}

static void test_q4_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q4_K, 0.0684);
}

static void test_q5_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q5_K, 0.0332);
}

static void test_q6_K_round_trips_within_its_bound(void) {
    check_round_trip(CART_Q6_K, 0.01627);
}

/* The K-quant quantizers are not GGML's, but on smooth data they should not
 * be much worse: the RMS error relative to the RMS of the data. */
static void test_k_quants_keep_rms_error_small_on_bell_shaped_data(void) {
    const struct {
        int32_t dtype;
        double bound;
    } cases[] = {{CART_Q2_K, 0.40},
                 {CART_Q3_K, 0.20},
                 {CART_Q4_K, 0.09},
                 {CART_Q5_K, 0.045},
                 {CART_Q6_K, 0.02}};
    const int64_t n = 64 * 256;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc((size_t)n * 2);
    fill_input(x, n, 1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK_OK(cart_from_f32(q, cases[c].dtype, x, n));
        CHECK_OK(cart_to_f32(y, cases[c].dtype, q, n));
        double se = 0.0, sx = 0.0;
        for (int64_t i = 0; i < n; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        char what[80];
        snprintf(what, sizeof what, "%s rms error / rms of the data",
                 cart_dtype_name(cases[c].dtype));
        CHECK_MAXDIFF(what, sqrt(se / sx), cases[c].bound);
    }
    free(x);
    free(y);
    free(q);
}

/* q8_0/q8_1/q8_K: the bytes follow GGML's reference quantizer, written out
 * here plainly (libm roundf, GGML's nearest_int), over inputs with many exact
 * ties. */
static int ref_nearest_int(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static void test_q8_quantizers_match_ggml_reference_formulas(void) {
    const int64_t n = 64 * 256;
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *got = malloc((size_t)n * 2), *want = malloc((size_t)n * 2);
    int64_t bad0 = 0, bad1 = 0, badk = 0;
    for (int shape = 0; shape < 10; shape++) {
        if (shape < N_SHAPES)
            fill_input(x, n, shape);
        else /* multiples of 1/8 and 1/2: roundings land on exact ties */
            for (int64_t i = 0; i < n; i++)
                x[i] = (float)rnd_int(-1016, 1016) / (shape == 8 ? 8 : 2);
        /* q8_0 and q8_1 */
        for (int sum = 0; sum < 2; sum++) {
            const int bs = sum ? 36 : 34, qs_at = sum ? 4 : 2;
            memset(want, 0, (size_t)n * 2);
            for (int64_t b = 0; b < n / 32; b++) {
                const float *xb = x + 32 * b;
                uint8_t *yb = want + bs * b;
                float amax = 0.0f;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
                const float d = amax / 127;
                const float id = d != 0.0f ? 1.0f / d : 0.0f;
                put16(yb, cart_f32_to_f16(d));
                int s = 0;
                for (int j = 0; j < 32; j++) {
                    volatile float v = xb[j] * id;
                    const int8_t qv = (int8_t)roundf(v);
                    yb[qs_at + j] = (uint8_t)qv;
                    s += qv;
                }
                if (sum) put16(yb + 2, cart_f32_to_f16((float)s * d));
            }
            CHECK_OK(cart_from_f32(got, sum ? CART_Q8_1 : CART_Q8_0, x, n));
            for (int64_t i = 0; i < n / 32 * bs; i++) *(sum ? &bad1 : &bad0) += got[i] != want[i];
        }
        /* q8_K */
        memset(want, 0, (size_t)n * 2);
        for (int64_t b = 0; b < n / 256; b++) {
            const float *xb = x + 256 * b;
            uint8_t *yb = want + 292 * b;
            float max = 0.0f, amax = 0.0f;
            for (int j = 0; j < 256; j++)
                if (fabsf(xb[j]) > amax) {
                    amax = fabsf(xb[j]);
                    max = xb[j];
                }
            if (amax == 0.0f) continue; /* all zero bytes */
            const float iscale = -127.f / max;
            int8_t qv[256];
            for (int j = 0; j < 256; j++) {
                volatile float v = iscale * xb[j];
                const int r = ref_nearest_int(v);
                qv[j] = (int8_t)(r < 127 ? r : 127);
                yb[4 + j] = (uint8_t)qv[j];
            }
            for (int k = 0; k < 16; k++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += qv[16 * k + l];
                put16(yb + 260 + 2 * k, (uint16_t)(int16_t)s);
            }
            put32(yb, bits_of(1 / iscale));
        }
        CHECK_OK(cart_from_f32(got, CART_Q8_K, x, n));
        for (int64_t i = 0; i < n / 256 * 292; i++) badk += got[i] != want[i];
    }
    CHECK_MSG(bad0 == 0, "q8_0: %lld bytes differ from the reference", (long long)bad0);
    CHECK_MSG(bad1 == 0, "q8_1: %lld bytes differ from the reference", (long long)bad1);
    CHECK_MSG(badk == 0, "q8_K: %lld bytes differ from the reference", (long long)badk);
    free(x);
    free(got);
    free(want);
}

/* ---- bad input, the table -------------------------------------------------- */

static void test_a_partial_block_is_an_argument_error(void) {
    float y[512] = {0};
    uint8_t buf[1024] = {0};
    CHECK_ERR(cart_to_f32(y, CART_Q4_0, buf, 31), CART_E_ARG);
    CHECK_ERROR_MENTIONS("q4_0");
    CHECK_ERR(cart_to_f32(y, CART_Q4_K, buf, 100), CART_E_ARG);
    CHECK_ERR(cart_to_f32(y, CART_IQ4_XS, buf, 257), CART_E_ARG);
    CHECK_ERR(cart_from_f32(buf, CART_Q8_0, y, 33), CART_E_ARG);
    CHECK_ERR(cart_from_f32(buf, CART_Q6_K, y, 255), CART_E_ARG);
    CHECK_ERR(cart_to_f32(y, CART_F32, buf, -1), CART_E_ARG);
    CHECK_ERR(cart_from_f32(buf, CART_F16, y, -4), CART_E_ARG);
    CHECK_ERR(cart_to_f32(y, 999, buf, 4), CART_E_ARG);
    CHECK_ERR(cart_from_f32(buf, -1, y, 4), CART_E_ARG);
    CHECK_ERR(cart_to_f32(NULL, CART_F32, buf, 4), CART_E_ARG);
    CHECK_ERR(cart_from_f32(buf, CART_Q8_0, NULL, 32), CART_E_ARG);
    CHECK_OK(cart_to_f32(NULL, CART_Q4_K, NULL, 0)); /* nothing to do */
    CHECK_OK(cart_from_f32(NULL, CART_Q4_K, NULL, 0));
}

static void test_types_without_a_converter_are_unsupported_and_named(void) {
    const int32_t no_dequantizer[] = {CART_IQ2_XXS, CART_IQ2_XS, CART_IQ3_XXS, CART_IQ1_S,
                                      CART_IQ3_S,   CART_IQ2_S,  CART_IQ1_M,   CART_TQ1_0,
                                      CART_TQ2_0,   CART_MXFP4};
    static float y[512];
    static uint8_t buf[1024];
    for (size_t i = 0; i < sizeof no_dequantizer / sizeof no_dequantizer[0]; i++) {
        const int32_t t = no_dequantizer[i];
        cart_dtype_info info;
        CHECK_OK(cart_dtype_get_info(&info, t));
        CHECK_ERR(cart_to_f32(y, t, buf, info.block_size), CART_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS(info.name);
        CHECK_ERR(cart_from_f32(buf, t, y, info.block_size), CART_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS(info.name);
    }
    CHECK_ERR(cart_from_f32(buf, CART_IQ4_NL, y, 32), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("iq4_nl");
    CHECK_ERR(cart_from_f32(buf, CART_IQ4_XS, y, 256), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("iq4_xs");
}

/* Every id the table knows: names round-trip, sizes are GGML's, and
 * can_dequantize tells the truth about cart_to_f32. */
static void test_the_table_agrees_with_ggml_and_with_the_converters(void) {
    const struct {
        int32_t id;
        const char *name;
        int block, size;
    } ggml[] = {
        {0, "f32", 1, 4},         {1, "f16", 1, 2},         {2, "q4_0", 32, 18},
        {3, "q4_1", 32, 20},      {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},
        {8, "q8_0", 32, 34},      {9, "q8_1", 32, 36},      {10, "q2_K", 256, 84},
        {11, "q3_K", 256, 110},   {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
        {14, "q6_K", 256, 210},   {15, "q8_K", 256, 292},   {16, "iq2_xxs", 256, 66},
        {17, "iq2_xs", 256, 74},  {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},
        {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},  {22, "iq2_s", 256, 82},
        {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},         {25, "i16", 1, 2},
        {26, "i32", 1, 4},        {27, "i64", 1, 8},        {28, "f64", 1, 8},
        {29, "iq1_m", 256, 56},   {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},
        {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},    {200, "u8", 1, 1},
        {201, "bool", 1, 1},
    };
    const size_t n_known = sizeof ggml / sizeof ggml[0];
    size_t seen = 0;
    static uint8_t zeros[512];
    static float y[256];
    for (int32_t id = -2; id < 300; id++) {
        cart_dtype_info info;
        const char *name = cart_dtype_name(id);
        size_t k = 0;
        while (k < n_known && ggml[k].id != id) k++;
        if (k == n_known) {
            CHECK_MSG(name == NULL, "id %d is not GGML's but is named %s", (int)id, name);
            CHECK_ERR(cart_dtype_get_info(&info, id), CART_E_ARG);
            continue;
        }
        seen++;
        CHECK_OK(cart_dtype_get_info(&info, id));
        CHECK_MSG(name && strcmp(name, ggml[k].name) == 0, "id %d named %s", (int)id, name);
        CHECK(info.name == name);
        CHECK_MSG(info.block_size == ggml[k].block && info.type_size == ggml[k].size,
                  "%s: block %d size %d, GGML has %d and %d", ggml[k].name, info.block_size,
                  info.type_size, ggml[k].block, ggml[k].size);
        CHECK(info.is_quantized == (ggml[k].block > 1));
        CHECK(cart_dtype_from_name(ggml[k].name) == id);
        char upper[16];
        size_t len = strlen(ggml[k].name);
        for (size_t c = 0; c <= len; c++) upper[c] = (char)toupper((unsigned char)ggml[k].name[c]);
        CHECK(cart_dtype_from_name(upper) == id);
        uint64_t nbytes = 0;
        CHECK_OK(cart_dtype_nbytes(&nbytes, id, 3 * (int64_t)info.block_size));
        CHECK(nbytes == 3 * (uint64_t)info.type_size);
        int rc = cart_to_f32(y, id, zeros, info.block_size);
        CHECK_MSG(info.can_dequantize ? rc == CART_OK : rc == CART_E_UNSUPPORTED,
                  "%s: can_dequantize %d but cart_to_f32 returned %d", info.name,
                  info.can_dequantize, rc);
    }
    CHECK(seen == n_known);
    CHECK(cart_dtype_from_name("q4_k_m") == CART_DTYPE_INVALID);
    CHECK(cart_dtype_from_name("") == CART_DTYPE_INVALID);
    CHECK(cart_dtype_from_name(NULL) == CART_DTYPE_INVALID);
    CHECK(cart_dtype_name(CART_DTYPE_INVALID) == NULL);
}

static void test_byte_counts_reject_negative_partial_and_overflowing_sizes(void) {
    uint64_t out = 0;
    CHECK_OK(cart_dtype_nbytes(&out, CART_Q4_K, 4096));
    CHECK(out == 16 * 144);
    CHECK_OK(cart_dtype_nbytes(&out, CART_F32, INT64_C(1) << 40));
    CHECK(out == UINT64_C(1) << 42);
    CHECK_OK(cart_dtype_nbytes(&out, CART_BOOL, 0));
    CHECK(out == 0);
    CHECK_ERR(cart_dtype_nbytes(&out, CART_F32, -1), CART_E_ARG);
    CHECK_ERR(cart_dtype_nbytes(&out, CART_F32, INT64_MIN), CART_E_ARG);
    CHECK_ERR(cart_dtype_nbytes(&out, CART_Q8_0, 33), CART_E_ARG);
    CHECK_ERROR_MENTIONS("q8_0");
    CHECK_ERR(cart_dtype_nbytes(&out, CART_F64, INT64_MAX), CART_E_ARG);
    CHECK_ERR(cart_dtype_nbytes(&out, CART_F32, INT64_C(1) << 62), CART_E_ARG);
    CHECK_ERR(cart_dtype_nbytes(&out, CART_Q8_K, INT64_MAX - INT64_MAX % 256), CART_E_ARG);
    CHECK_ERR(cart_dtype_nbytes(&out, 12345, 1), CART_E_ARG);
}

/* Every NaN (quiet, signalling, either sign, any payload) and both
 * infinities are found at their index, at any alignment; the largest finite
 * values and subnormals are not. */
static void test_the_first_nonfinite_f32_is_found_by_its_bits(void) {
    const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu,
                            0x7fbfffffu};
    const uint32_t good[] = {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u, 0x3f800000u};
    unsigned char buf[4 * 16 + 3];
    for (int shift = 0; shift < 4; shift++) {
        unsigned char *at = buf + shift;
        for (int k = 0; k < 5; k++) memcpy(at + 4 * k, &good[k], 4);
        CHECK(cart_f32_first_nonfinite(at, 5) == -1);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            memcpy(at + 4 * 3, &bad[b], 4);
            CHECK_MSG(cart_f32_first_nonfinite(at, 5) == 3, "0x%08x at offset %d", bad[b], shift);
            CHECK(cart_f32_first_nonfinite(at, 3) == -1);
        }
    }
    CHECK(cart_f32_first_nonfinite(buf, 0) == -1);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "f16c") == 0) {
#if defined(__x86_64__)
        if (!cpu_has_f16c()) {
            printf("skipped: this CPU has no F16C\n");
            return CHECK_SKIP;
        }
        RUN(test_f16_conversion_matches_the_cpu_f16c_instruction);
        return check_finish("dtype@f16c");
#else
        printf("skipped: F16C is an x86-64 instruction\n");
        return CHECK_SKIP;
#endif
    }
    RUN(test_f16_conversion_handles_hand_picked_values);
    RUN(test_every_f16_value_round_trips_through_f32);
    RUN(test_f32_to_f16_matches_a_double_precision_reference);
    RUN(test_bf16_conversion_rounds_to_nearest_even);
    RUN(test_array_conversions_accept_misaligned_buffers);
    RUN(test_integer_and_float_elements_convert_to_f32);
    RUN(test_f32_converts_to_integers_rounding_and_saturating);
    RUN(test_q4_0_dequantizes_hand_built_blocks);
    RUN(test_q4_1_dequantizes_hand_built_blocks);
    RUN(test_q5_0_dequantizes_hand_built_blocks);
    RUN(test_q5_1_dequantizes_hand_built_blocks);
    RUN(test_q8_0_dequantizes_hand_built_blocks);
    RUN(test_q8_1_dequantizes_hand_built_blocks);
    RUN(test_q2_K_dequantizes_hand_built_blocks);
    RUN(test_q3_K_dequantizes_hand_built_blocks);
    RUN(test_q4_K_dequantizes_hand_built_blocks);
    RUN(test_q5_K_dequantizes_hand_built_blocks);
    RUN(test_q6_K_dequantizes_hand_built_blocks);
    RUN(test_q8_K_dequantizes_hand_built_blocks);
    RUN(test_iq4_nl_dequantizes_hand_built_blocks);
    RUN(test_iq4_xs_dequantizes_hand_built_blocks);
    RUN(test_q4_K_dequantizes_a_block_worked_out_by_hand);
    RUN(test_q8_0_and_q8_1_quantize_a_known_input_to_known_bytes);
    RUN(test_q8_K_quantizes_a_known_input_to_known_bytes);
    RUN(test_q8_quantizers_match_ggml_reference_formulas);
    RUN(test_q4_0_round_trips_within_its_bound);
    RUN(test_q4_1_round_trips_within_its_bound);
    RUN(test_q5_0_round_trips_within_its_bound);
    RUN(test_q5_1_round_trips_within_its_bound);
    RUN(test_q8_0_round_trips_within_its_bound);
    RUN(test_q8_1_round_trips_within_its_bound);
    RUN(test_q8_K_round_trips_within_its_bound);
    RUN(test_q2_K_round_trips_within_its_bound);
    RUN(test_q3_K_round_trips_within_its_bound);
    RUN(test_q4_K_round_trips_within_its_bound);
    RUN(test_q5_K_round_trips_within_its_bound);
    RUN(test_q6_K_round_trips_within_its_bound);
    RUN(test_k_quants_keep_rms_error_small_on_bell_shaped_data);
    RUN(test_a_partial_block_is_an_argument_error);
    RUN(test_types_without_a_converter_are_unsupported_and_named);
    RUN(test_the_table_agrees_with_ggml_and_with_the_converters);
    RUN(test_byte_counts_reject_negative_partial_and_overflowing_sizes);
    RUN(test_the_first_nonfinite_f32_is_found_by_its_bits);
    return check_finish("dtype");
}
