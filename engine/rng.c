/*
 * rng.c - xoshiro256** with splitmix64 seeding; see rng.h for the contract.
 */
#include <math.h>

#include "rng.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void cart_rng_seed(cart_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

void cart_rng_seed_item(cart_rng *rng, uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed, h = splitmix64(&x);
    x = h ^ a;
    h = splitmix64(&x);
    x = h ^ b;
    cart_rng_seed(rng, splitmix64(&x));
}

uint64_t cart_rng_next(cart_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float cart_rng_uniform(cart_rng *rng) {
    return (float)(cart_rng_next(rng) >> 40) * (1.0f / 16777216.0f);
}

uint64_t cart_rng_below(cart_rng *rng, uint64_t n) {
    if (n <= 1) return 0;
    /* rejection: accept draws below the largest multiple of n */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;) {
        uint64_t r = cart_rng_next(rng);
        if (r < limit) return r % n;
    }
}

double cart_rng_normal(cart_rng *rng) {
    double u1 = (double)((cart_rng_next(rng) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(cart_rng_next(rng) >> 11) * 0x1.0p-53;       /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void cart_rng_fill_normal(cart_rng *rng, float *dst, int64_t n, float mean, float std) {
    for (int64_t i = 0; i < n; i++) dst[i] = (float)(mean + std * cart_rng_normal(rng));
}
