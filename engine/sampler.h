/*
 * sampler.h - choosing the next token from a row of logits.
 *
 * Greedy (temperature <= 0) takes the argmax, ties to the lowest id, as
 * llama.cpp's greedy sampler does. Otherwise the steps run in llama.cpp's
 * default order:
 *   1. penalties over the last repeat_last_n accepted tokens (prompt and
 *      output; cart_sampler_accept), as llama.cpp's
 *      penalties sampler applies them: for each distinct id t seen there
 *      count(t) times, the repetition penalty (a positive logit divided by
 *      it, a non-positive one multiplied), then
 *      logit -= count(t) * frequency_penalty + presence_penalty
 *      (OpenAI's frequency and presence penalties; 0 = off). They apply in
 *      greedy decoding too;
 *   2. top-k (0 = off);
 *   3. top-p: the smallest set of most likely tokens whose probability
 *      reaches top_p (1 = off), probabilities from the untempered softmax of
 *      what survived step 2;
 *   4. min-p: drop tokens whose probability is below min_p times the top
 *      token's (0 = off);
 *   5. temperature: divide the surviving logits by it;
 *   6. draw from their softmax with the sampler's own cart_rng (rng.h),
 *      seeded by `seed`: one uniform per draw, inverse CDF over the
 *      survivors sorted by logit descending (ties by id).
 * The same seed, logits and accepted tokens give the same draws everywhere.
 */
#ifndef CART_SAMPLER_H
#define CART_SAMPLER_H

#include <stdint.h>
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_sampler_params {
    float temperature;     /* <= 0: greedy */
    int32_t top_k;         /* 0: off */
    float top_p;           /* 1: off */
    float min_p;           /* 0: off */
    float repeat_penalty;  /* 1: off */
    int32_t repeat_last_n; /* tokens of history the penalty looks at */
    uint64_t seed;
    float frequency_penalty; /* 0: off; subtracted once per occurrence */
    float presence_penalty;  /* 0: off; subtracted once per distinct id */
} cart_sampler_params;

typedef struct cart_sampler cart_sampler;

/* Defaults: greedy, top_k 0, top_p 1, min_p 0, repeat penalty 1 over 64,
 * frequency and presence penalties 0, seed 0. */
void cart_sampler_default_params(cart_sampler_params *p);

int cart_sampler_new(cart_sampler **out, const cart_sampler_params *p);
void cart_sampler_free(cart_sampler *s);

/* Picks a token id from logits[0..n_vocab) (not modified). */
int32_t cart_sampler_sample(cart_sampler *s, const float *logits, int64_t n_vocab);

/* Like cart_sampler_sample, but only a token whose bit is set in mask can
 * be chosen: bit (i % 32) of mask[i / 32], as cart_matcher_mask
 * (grammar.h) writes it. The others are left out before every step, greedy
 * included, so top-k, top-p and min-p count allowed tokens only. Returns
 * -1 when the mask allows none. mask NULL: every token. */
int32_t cart_sampler_sample_masked(cart_sampler *s, const float *logits, int64_t n_vocab, const uint32_t *mask);

/* Records an accepted token in the penalties' window (the last
 * repeat_last_n). As llama.cpp's server and CLI do, a caller accepts every
 * prompt token (those whose rows were reused from a cache too) before the
 * first draw, then each emitted token, so the penalties see the prompt. */
void cart_sampler_accept(cart_sampler *s, int32_t id);

/* Forgets the history and reseeds. */
void cart_sampler_reset(cart_sampler *s, uint64_t seed);

/* Argmax of logits[0..n), lowest index on ties; -1 for n <= 0. */
int32_t cart_argmax(const float *logits, int64_t n);

/* log(sum over i < n of e^x[i]) as max + log(sum of e^(x[i] - max)): the max
 * in float, the terms in double (the C library's exp, on whole vectors) and
 * added in i order. -inf entries count as zero; n >= 1. */
double cart_log_sum_exp(const float *x, int64_t n);

/* The min(k, n) largest of x[0..n) in ids, largest first, ties to the lower
 * index; returns their count (0 when k < 1). */
int32_t cart_top_k(const float *x, int64_t n, int32_t k, int32_t *ids);

/* What an API's logprobs report: the model's own log-probabilities from one
 * row of logits, the untempered log-softmax before penalties, biases and
 * grammar (log_sum_exp above). *lp = token id's (id in [0, n_vocab)); the k
 * most likely tokens (k >= 0) in top_ids / top_lp, most likely first, ties to
 * the lower id. Fails (CART_E_ARG, a message) on a bad id or k, or a row
 * whose largest logit is not finite. */
int cart_token_logprobs(const float *logits, int64_t n_vocab, int32_t id, int32_t k, float *lp,
                        int32_t *top_ids, float *top_lp);

#ifdef __cplusplus
}
#endif

#endif
