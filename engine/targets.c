/*
 * targets.c - distillation targets: the teacher's top-k of a row of logits
 * and the growable lists the trainer reads (see targets.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sampler.h"
#include "targets.h"

/* ---- teacher targets ------------------------------------------------------- */

int cart_topk_targets(int32_t *ids, float *logprobs, int32_t *n_out, const float *logits,
                      int64_t n_vocab, int32_t k, float mass) {
    *n_out = 0;
    if (k < 1 || n_vocab < 1)
        return cart_fail(CART_E_ARG, "cart_topk_targets: k = %d over %lld logits", k,
                         (long long)n_vocab);
    if (k > n_vocab) k = (int32_t)n_vocab;
    const double log_z = cart_log_sum_exp(logits, n_vocab);
    const int32_t count = cart_top_k(logits, n_vocab, k, ids);
    double cumulative = 0.0;
    int32_t kept = 0;
    while (kept < count) {
        double lp = (double)logits[ids[kept]] - log_z;
        logprobs[kept] = (float)lp;
        cumulative += exp(lp);
        kept++;
        if (cumulative >= (double)mass) break;
    }
    *n_out = kept;
    return CART_OK;
}

/* ---- target lists ------------------------------------------------------------ */

struct cart_target_list {
    int64_t *position;
    int32_t *token;
    float *logprob;
    int64_t n, cap;
};

int cart_target_list_new(cart_target_list **out) {
    *out = calloc(1, sizeof(cart_target_list));
    return *out ? CART_OK : CART_E_NOMEM;
}

void cart_target_list_free(cart_target_list *l) {
    if (!l) return;
    free(l->position);
    free(l->token);
    free(l->logprob);
    free(l);
}

int64_t cart_target_list_count(const cart_target_list *l) { return l ? l->n : 0; }

/* Room for `more` entries past n. */
static int target_list_reserve(cart_target_list *l, int64_t more) {
    if (more < 0 || more > ((int64_t)1 << 40) - l->n)
        return cart_fail(CART_E_ARG, "target list: %lld more entries is too many", (long long)more);
    if (l->n + more <= l->cap) return CART_OK;
    int64_t cap = l->cap ? l->cap : 256;
    while (cap < l->n + more) cap *= 2;
    int64_t *pos = realloc(l->position, (size_t)cap * sizeof *pos);
    if (!pos) return CART_E_NOMEM;
    l->position = pos;
    int32_t *tok = realloc(l->token, (size_t)cap * sizeof *tok);
    if (!tok) return CART_E_NOMEM;
    l->token = tok;
    float *lp = realloc(l->logprob, (size_t)cap * sizeof *lp);
    if (!lp) return CART_E_NOMEM;
    l->logprob = lp;
    l->cap = cap;
    return CART_OK;
}

int cart_target_list_truncate(cart_target_list *l, int64_t n) {
    if (!l || n < 0 || n > l->n)
        return cart_fail(CART_E_ARG, "target list truncate: %lld entries of %lld", (long long)n,
                         (long long)(l ? l->n : 0));
    l->n = n;
    return CART_OK;
}

int cart_target_list_append_topk(cart_target_list *l, int64_t position, const float *logits,
                                 int64_t n_vocab, int32_t k, float mass, int32_t *n_out) {
    if (n_out) *n_out = 0;
    if (!l || !logits) return cart_fail(CART_E_ARG, "target list append_topk: NULL argument");
    if (k < 1) return cart_fail(CART_E_ARG, "target list append_topk: k = %d; it must be at least 1", k);
    int rc = target_list_reserve(l, k);
    if (rc != CART_OK) return rc;
    int32_t got = 0;
    rc = cart_topk_targets(l->token + l->n, l->logprob + l->n, &got, logits, n_vocab, k, mass);
    if (rc != CART_OK) return rc;
    for (int32_t i = 0; i < got; i++) l->position[l->n + i] = position;
    l->n += got;
    if (n_out) *n_out = got;
    return CART_OK;
}

int cart_target_list_append_labels(cart_target_list *l, const int32_t *tokens, int64_t n, int64_t from,
                                   int64_t to, int64_t offset) {
    if (!l || !tokens || from < 1 || to > n || from > to)
        return cart_fail(CART_E_ARG, "target list append_labels: positions [%lld, %lld) of %lld tokens; "
                         "the first must be at least 1", (long long)from, (long long)to, (long long)n);
    int rc = target_list_reserve(l, to - from);
    if (rc != CART_OK) return rc;
    for (int64_t i = from; i < to; i++) {
        l->position[l->n] = offset + i;
        l->token[l->n] = tokens[i];
        l->logprob[l->n] = 0.0f;
        l->n++;
    }
    return CART_OK;
}

int cart_target_list_push(cart_target_list *l, int64_t position, int32_t token, float logprob) {
    if (!l) return cart_fail(CART_E_ARG, "target list push: NULL list");
    int rc = target_list_reserve(l, 1);
    if (rc != CART_OK) return rc;
    l->position[l->n] = position;
    l->token[l->n] = token;
    l->logprob[l->n] = logprob;
    l->n++;
    return CART_OK;
}

int cart_target_list_append(cart_target_list *l, const cart_target_list *src, int64_t offset) {
    if (!l || !src) return cart_fail(CART_E_ARG, "target list append: NULL list");
    int64_t n = src->n; /* read before reserving: src may be l */
    int rc = target_list_reserve(l, n);
    if (rc != CART_OK) return rc;
    for (int64_t i = 0; i < n; i++) l->position[l->n + i] = src->position[i] + offset;
    memcpy(l->token + l->n, src->token, (size_t)n * sizeof *l->token);
    memcpy(l->logprob + l->n, src->logprob, (size_t)n * sizeof *l->logprob);
    l->n += n;
    return CART_OK;
}

int cart_target_list_get(const cart_target_list *l, int64_t i, int64_t *position, int32_t *token,
                         float *logprob) {
    if (!l || i < 0 || i >= l->n)
        return cart_fail(CART_E_ARG, "target list get: entry %lld of %lld", (long long)i,
                         (long long)(l ? l->n : 0));
    if (position) *position = l->position[i];
    if (token) *token = l->token[i];
    if (logprob) *logprob = l->logprob[i];
    return CART_OK;
}

void cart_target_list_view(const cart_target_list *l, cart_distill_targets *out) {
    out->position = l->position;
    out->token = l->token;
    out->logprob = l->logprob;
    out->n = l->n;
}
