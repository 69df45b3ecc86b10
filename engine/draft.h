/*
 * draft.h - drafting tokens from a reference sequence for speculative decoding.
 *
 * A cart_sam is a suffix automaton over a token sequence (the corpus ids, or
 * a prompt), built once and then read-only. A cursor follows a stream of
 * tokens through it, keeping the longest suffix of the stream that occurs in
 * the reference; a draft is what followed that suffix at its last occurrence
 * in the reference. Verification of the draft is the caller's (one forward
 * over carry + draft); the automaton never changes the output, only how many
 * tokens one forward pass commits.
 *
 * Memory: about 2 states and 3 transitions per reference token (tens of bytes
 * per token); building is linear in the reference length.
 */
#ifndef CART_DRAFT_H
#define CART_DRAFT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_sam cart_sam;

/* Where a stream stands in the automaton. */
typedef struct cart_sam_cursor {
    int32_t state;   /* automaton state of the current match */
    int32_t length;  /* tokens in the current match (the matched suffix) */
} cart_sam_cursor;

/* Builds the automaton of ids[0..n) (n >= 0; ids >= 0). */
int cart_sam_build(cart_sam **out, const int32_t *ids, int64_t n);
void cart_sam_free(cart_sam *s);

int64_t cart_sam_length(const cart_sam *s);
uint64_t cart_sam_bytes(const cart_sam *s);

/* A cursor at the start (nothing matched). */
void cart_sam_cursor_reset(cart_sam_cursor *c);

/* Feeds n tokens of the stream to the cursor. */
void cart_sam_feed(const cart_sam *s, cart_sam_cursor *c, const int32_t *ids, int64_t n);

/* Up to max tokens that followed the cursor's matched suffix at its last
 * occurrence in the reference, when the match is at least min_match tokens
 * long. Returns the number written to draft (0: nothing to propose). */
int32_t cart_sam_draft(const cart_sam *s, const cart_sam_cursor *c, int32_t min_match,
                       int32_t *draft, int32_t max);

#ifdef __cplusplus
}
#endif

#endif
