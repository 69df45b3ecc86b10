/*
 * sampler.c - greedy and stochastic token choice (see sampler.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ops.h"
#include "sampler.h"

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

struct cart_sampler {
    cart_sampler_params p;
    cart_rng rng;
    int32_t *history; /* ring of the last repeat_last_n accepted ids */
    int32_t history_len;
    int32_t history_pos;
    /* scratch, grown to the vocabulary size */
    int64_t cap;
    float *logit;     /* penalized logits */
    int32_t *count;   /* per id, occurrences in the history (zero between calls) */
    candidate *cand;  /* survivors, best first */
};

void cart_sampler_default_params(cart_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

int cart_sampler_new(cart_sampler **out, const cart_sampler_params *p) {
    *out = NULL;
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return cart_fail(CART_E_ARG, "sampler: top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return cart_fail(CART_E_ARG, "sampler: min_p %g must be in [0, 1]", p->min_p);
    if (p->top_k < 0) return cart_fail(CART_E_ARG, "sampler: top_k %d is negative", p->top_k);
    if (!(p->repeat_penalty > 0.0f))
        return cart_fail(CART_E_ARG, "sampler: repeat_penalty %g must be positive",
                         p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > 1 << 20)
        return cart_fail(CART_E_ARG, "sampler: repeat_last_n %d is out of range",
                         p->repeat_last_n);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return cart_fail(CART_E_ARG, "sampler: frequency_penalty %g and presence_penalty %g must be finite",
                         p->frequency_penalty, p->presence_penalty);
    if (isnan(p->temperature))
        return cart_fail(CART_E_ARG, "sampler: temperature is NaN");
    cart_sampler *s = cart_calloc(1, sizeof *s, "sampler");
    if (!s) return CART_E_NOMEM;
    s->p = *p;
    if (p->repeat_last_n > 0) {
        s->history = cart_calloc((size_t)p->repeat_last_n, sizeof(int32_t), "sampler history");
        if (!s->history) {
            free(s);
            return CART_E_NOMEM;
        }
    }
    cart_rng_seed(&s->rng, p->seed);
    *out = s;
    return CART_OK;
}

void cart_sampler_free(cart_sampler *s) {
    if (!s) return;
    free(s->history);
    free(s->logit);
    free(s->count);
    free(s->cand);
    free(s);
}

void cart_sampler_reset(cart_sampler *s, uint64_t seed) {
    s->history_len = 0;
    s->history_pos = 0;
    cart_rng_seed(&s->rng, seed);
}

void cart_sampler_accept(cart_sampler *s, int32_t id) {
    if (s->p.repeat_last_n <= 0) return;
    s->history[s->history_pos] = id;
    s->history_pos = (s->history_pos + 1) % s->p.repeat_last_n;
    if (s->history_len < s->p.repeat_last_n) s->history_len++;
}

int32_t cart_argmax(const float *logits, int64_t n) {
    if (n <= 0) return -1;
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i; /* strict: ties keep the lowest id */
    return (int32_t)best;
}

enum { LSE_CHUNK = 512 };

double cart_log_sum_exp(const float *x, int64_t n) {
    float max = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    double t[LSE_CHUNK], sum = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += LSE_CHUNK) {
        const int64_t m = n - i0 < LSE_CHUNK ? n - i0 : LSE_CHUNK;
        for (int64_t i = 0; i < m; i++) t[i] = (double)x[i0 + i] - (double)max;
        cart_exp_n(t, t, m);
        for (int64_t i = 0; i < m; i++) sum += t[i];
    }
    return (double)max + log(sum);
}

int32_t cart_top_k(const float *x, int64_t n, int32_t k, int32_t *ids) {
    if (k > n) k = (int32_t)n;
    int32_t count = 0;
    for (int64_t i = 0; i < n && k > 0; i++) { /* insertion into a sorted list: k is small */
        float v = x[i];
        if (count == k && !(v > x[ids[count - 1]])) continue; /* ties keep the lower id */
        int32_t at = count < k ? count : k - 1;
        while (at > 0 && v > x[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = (int32_t)i;
        if (count < k) count++;
    }
    return count;
}

int cart_token_logprobs(const float *logits, int64_t n_vocab, int32_t id, int32_t k, float *lp,
                        int32_t *top_ids, float *top_lp) {
    if (n_vocab < 1 || id < 0 || id >= n_vocab || k < 0)
        return cart_fail(CART_E_ARG, "cart_token_logprobs: token %d, top %d of a vocabulary of %lld", id, k,
                         (long long)n_vocab);
    const double log_z = cart_log_sum_exp(logits, n_vocab);
    if (!isfinite(log_z))
        return cart_fail(CART_E_ARG, "cart_token_logprobs: the logits' largest value is not finite");
    *lp = (float)((double)logits[id] - log_z);
    const int32_t count = cart_top_k(logits, n_vocab, k, top_ids);
    for (int32_t i = 0; i < count; i++) top_lp[i] = (float)((double)logits[top_ids[i]] - log_z);
    return CART_OK;
}

/* Logit descending, id ascending on ties: a total order, so the result does
 * not depend on the sort algorithm. */
static int before(const candidate *a, const candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int compare_candidates(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap on `before` (the root is the worst kept candidate). */
static void sift_down(candidate *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && before(&h[worst], &h[l])) worst = l;
        if (r < n && before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        candidate t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Leaves the best k of c[0..n) sorted at c[0..k) and returns k (k <= 0 or
 * k >= n: all of them, sorted). */
static int64_t best_k(candidate *c, int64_t n, int64_t k) {
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof *c, compare_candidates);
        return n;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int64_t i = k; i < n; i++)
        if (before(&c[i], &c[0])) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, compare_candidates);
    return k;
}

static int allowed(const uint32_t *mask, int64_t i) {
    return !mask || ((mask[i / 32] >> (i % 32)) & 1u);
}

/* Argmax over the allowed tokens, lowest id on ties; -1 when none. */
static int32_t masked_argmax(const float *logits, int64_t n, const uint32_t *mask) {
    if (!mask) return cart_argmax(logits, n);
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (allowed(mask, i) && (best < 0 || logits[i] > logits[best])) best = i;
    return (int32_t)best;
}

int32_t cart_sampler_sample(cart_sampler *s, const float *logits, int64_t n_vocab) {
    return cart_sampler_sample_masked(s, logits, n_vocab, NULL);
}

int32_t cart_sampler_sample_masked(cart_sampler *s, const float *logits, int64_t n_vocab, const uint32_t *mask) {
    if (n_vocab <= 0) return -1;
    if (s->cap < n_vocab) {
        float *l = realloc(s->logit, sizeof(float) * (size_t)n_vocab);
        if (l) s->logit = l;
        candidate *c = realloc(s->cand, sizeof(candidate) * (size_t)n_vocab);
        if (c) s->cand = c;
        int32_t *k = calloc((size_t)n_vocab, sizeof(int32_t));
        if (k) free(s->count), s->count = k;
        if (!l || !c || !k) return masked_argmax(logits, n_vocab, mask); /* out of memory: degrade to greedy */
        s->cap = n_vocab;
    }
    float *logit = s->logit;
    memcpy(logit, logits, sizeof(float) * (size_t)n_vocab);
    /* 1. penalties, once per distinct id in the history */
    if (s->p.repeat_penalty != 1.0f || s->p.frequency_penalty != 0.0f || s->p.presence_penalty != 0.0f) {
        int32_t *count = s->count;
        for (int32_t i = 0; i < s->history_len; i++) {
            int32_t t = s->history[i];
            if (t >= 0 && t < n_vocab) count[t]++;
        }
        for (int32_t i = 0; i < s->history_len; i++) {
            int32_t t = s->history[i];
            if (t < 0 || t >= n_vocab || count[t] == 0) continue; /* 0: already applied */
            float v = logit[t];
            v = v <= 0.0f ? v * s->p.repeat_penalty : v / s->p.repeat_penalty;
            logit[t] = v - (float)count[t] * s->p.frequency_penalty - s->p.presence_penalty;
            count[t] = 0;
        }
    }
    if (s->p.temperature <= 0.0f) return masked_argmax(logit, n_vocab, mask);

    /* 2. top-k (everything, sorted, when off) among the allowed tokens */
    candidate *c = s->cand;
    int64_t n_allowed = 0;
    for (int64_t i = 0; i < n_vocab; i++)
        if (allowed(mask, i)) c[n_allowed++] = (candidate){logit[i], (int32_t)i};
    if (n_allowed == 0) return -1;
    int64_t n = best_k(c, n_allowed, s->p.top_k);
    /* 3. top-p on the untempered softmax of the survivors */
    double max = c[0].logit, sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)c[i].logit - max);
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - max) / sum;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    /* 4. min-p: p_i / p_0 = exp(l_i - l_0) */
    if (s->p.min_p > 0.0f) {
        int64_t keep = 1;
        while (keep < n && exp((double)c[keep].logit - max) >= s->p.min_p) keep++;
        n = keep;
    }
    /* 5./6. temperature, then one uniform through the CDF */
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) total += exp(((double)c[i].logit - max) / s->p.temperature);
    double u = (double)cart_rng_uniform(&s->rng) * total, cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += exp(((double)c[i].logit - max) / s->p.temperature);
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;
}
