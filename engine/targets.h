/*
 * targets.h - distillation targets: sparse (position, token, teacher
 * log-probability) entries, the teacher's top-k of one row of logits, and
 * growable lists of them held in C for the trainer (train.h).
 */
#ifndef CART_TARGETS_H
#define CART_TARGETS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif


/* Distillation targets: n sparse entries (position, token, teacher
 * log-probability). `position` is the index in the packed token sequence of
 * the token being predicted; the student's prediction is read from the row
 * before it, which must lie in the same segment. */
typedef struct cart_distill_targets {
    const int64_t *position;
    const int32_t *token;
    const float *logprob;
    int64_t n;
} cart_distill_targets;

/* From one row of teacher logits: the top-k entries of the untempered
 * log-softmax in descending order (ties to the lower id), kept up to and
 * including the entry at which the cumulative probability first reaches
 * `mass`; not renormalized. Writes ids[] and logprobs[] (room for k each)
 * and their count to *n_out. */
int cart_topk_targets(int32_t *ids, float *logprobs, int32_t *n_out, const float *logits,
                      int64_t n_vocab, int32_t k, float mass);

/* A growable list of distillation targets held in C: a decode appends each
 * scored row's entries as it goes, a packed step appends whole lists at an
 * offset, and the trainer reads it as cart_distill_targets without a copy. */
typedef struct cart_target_list cart_target_list;

int cart_target_list_new(cart_target_list **out);
void cart_target_list_free(cart_target_list *l);
int64_t cart_target_list_count(const cart_target_list *l);
/* Keeps the first n entries (n <= count). */
int cart_target_list_truncate(cart_target_list *l, int64_t n);
/* Appends the top-k entries of one row of logits (as cart_topk_targets), each
 * at `position`. Writes the number appended to *n_out when n_out is not NULL. */
int cart_target_list_append_topk(cart_target_list *l, int64_t position, const float *logits,
                                 int64_t n_vocab, int32_t k, float mass, int32_t *n_out);
/* Language-model targets: for i in [from, to) of tokens[0..n), the entry
 * (offset + i, tokens[i], logprob 0), the next token as a hard label. from
 * must be at least 1 (token 0 has no row before it). */
int cart_target_list_append_labels(cart_target_list *l, const int32_t *tokens, int64_t n, int64_t from,
                                   int64_t to, int64_t offset);
/* Appends one entry. */
int cart_target_list_push(cart_target_list *l, int64_t position, int32_t token, float logprob);
/* Appends every entry of src (which may be l itself) with its position
 * shifted by `offset`. */
int cart_target_list_append(cart_target_list *l, const cart_target_list *src, int64_t offset);
/* Entry i (0-based, below count): any output pointer may be NULL. */
int cart_target_list_get(const cart_target_list *l, int64_t i, int64_t *position, int32_t *token,
                         float *logprob);
/* The list as the trainer reads it; valid until the list next changes. */
void cart_target_list_view(const cart_target_list *l, cart_distill_targets *out);

#ifdef __cplusplus
}
#endif

#endif
