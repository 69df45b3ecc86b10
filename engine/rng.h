/*
 * rng.h - the engine's seeded pseudo-random numbers.
 *
 * Generator: xoshiro256** (Blackman and Vigna, 2018), 256 bits of state,
 * seeded from a 64-bit seed by four steps of splitmix64. The same seed gives
 * the same stream on every platform, which is what makes generated models,
 * sampling and self-study runs reproducible.
 *
 * Derived values:
 *   uniform  float in [0, 1): the top 24 bits of next_u64, times 2^-24;
 *   normal   Box-Muller over two uniforms taken as doubles from the top 53
 *            bits (the first in (0, 1], so log() is finite); each call
 *            consumes two outputs and returns one value (the cosine branch),
 *            so a stream never depends on an earlier call's leftover.
 */
#ifndef CART_RNG_H
#define CART_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_rng {
    uint64_t s[4];
} cart_rng;

/* Seeds the generator (any seed, 0 included). */
void cart_rng_seed(cart_rng *rng, uint64_t seed);

/* Seeds the generator for item (a, b) of the family `seed` (self-study:
 * conversation b of step a): splitmix64 folds seed, a and b into one seed.
 * The same triple gives the same stream on every platform, whatever else
 * was drawn before; different triples give unrelated streams. */
void cart_rng_seed_item(cart_rng *rng, uint64_t seed, uint64_t a, uint64_t b);

/* The next 64 random bits. */
uint64_t cart_rng_next(cart_rng *rng);

/* A float in [0, 1). */
float cart_rng_uniform(cart_rng *rng);

/* An integer in [0, n) without modulo bias (n >= 1; n = 0 returns 0). */
uint64_t cart_rng_below(cart_rng *rng, uint64_t n);

/* A standard normal sample (mean 0, std 1) as a double. */
double cart_rng_normal(cart_rng *rng);

/* dst[i] = mean + std * normal() for i in [0, n), in order. */
void cart_rng_fill_normal(cart_rng *rng, float *dst, int64_t n, float mean, float std);

#ifdef __cplusplus
}
#endif

#endif
