/*
 * test_draft.c - the suffix automaton drafts what a brute-force search finds:
 * the continuation of the latest occurrence of the longest matching suffix.
 */
#include "check.h"
#include "rng.h"
#include "draft.h"

/* Brute force: longest suffix of ctx[0..n) occurring in ref, its latest end. */
static void brute(const int32_t *ref, int64_t nr, const int32_t *ctx, int64_t n, int32_t *len_out,
                  int64_t *end_out) {
    *len_out = 0;
    *end_out = -1;
    for (int32_t len = (int32_t)n; len >= 1; len--) {
        int64_t found = -1;
        for (int64_t e = len - 1; e < nr; e++) {
            int ok = 1;
            for (int32_t k = 0; k < len && ok; k++) ok = ref[e - k] == ctx[n - 1 - k];
            if (ok) found = e;
        }
        if (found >= 0) {
            *len_out = len;
            *end_out = found;
            return;
        }
    }
}

static void test_drafts_match_a_brute_force_search(void) {
    cart_rng r;
    cart_rng_seed(&r, 7);
    int mismatches = 0, cases = 0, drafted = 0;
    for (int trial = 0; trial < 200; trial++) {
        int32_t ref[300], ctx[40];
        int64_t nr = 50 + (int64_t)cart_rng_below(&r, 250);
        int alphabet = 2 + (int)cart_rng_below(&r, 6);
        for (int64_t i = 0; i < nr; i++) ref[i] = (int32_t)cart_rng_below(&r, (uint64_t)alphabet);
        cart_sam *s = NULL;
        CHECK_OK(cart_sam_build(&s, ref, nr));
        if (!s) return;
        int64_t n = 1 + (int64_t)cart_rng_below(&r, 40);
        for (int64_t i = 0; i < n; i++) ctx[i] = (int32_t)cart_rng_below(&r, (uint64_t)alphabet + 1);
        cart_sam_cursor c;
        cart_sam_cursor_reset(&c);
        cart_sam_feed(s, &c, ctx, n);
        int32_t want_len;
        int64_t want_end;
        brute(ref, nr, ctx, n, &want_len, &want_end);
        int32_t draft[8];
        int32_t k = cart_sam_draft(s, &c, 1, draft, 8);
        int ok = c.length == want_len;
        int32_t want_k = 0;
        for (int64_t i = want_end + 1; want_len > 0 && i < nr && want_k < 8; i++, want_k++)
            ok &= draft[want_k] == ref[i];
        ok &= k == want_k;
        mismatches += !ok;
        drafted += k;
        cases++;
        cart_sam_free(s);
    }
    printf("  %d random references and contexts, %d drafted tokens, %d mismatches\n", cases, drafted,
           mismatches);
    CHECK(mismatches == 0);
    CHECK(drafted > 0);
}

static void test_a_repeated_phrase_drafts_its_continuation(void) {
    int32_t ref[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7};
    cart_sam *s = NULL;
    CHECK_OK(cart_sam_build(&s, ref, 12));
    cart_sam_cursor c;
    cart_sam_cursor_reset(&c);
    int32_t ctx[] = {8, 2, 3, 4};
    cart_sam_feed(s, &c, ctx, 4);
    int32_t draft[8];
    CHECK(c.length == 3);
    int32_t k = cart_sam_draft(s, &c, 1, draft, 8);
    CHECK(k == 2 && draft[0] == 6 && draft[1] == 7); /* the latest occurrence's continuation */
    CHECK(cart_sam_draft(s, &c, 4, draft, 8) == 0);   /* a match shorter than min_match */
    int32_t none[] = {42};
    cart_sam_feed(s, &c, none, 1);
    CHECK(c.length == 0 && cart_sam_draft(s, &c, 1, draft, 8) == 0);
    CHECK(cart_sam_length(s) == 12 && cart_sam_bytes(s) > 0);
    cart_sam_free(s);
    cart_sam *empty = NULL;
    CHECK_OK(cart_sam_build(&empty, NULL, 0));
    cart_sam_cursor_reset(&c);
    cart_sam_feed(empty, &c, ctx, 4);
    CHECK(cart_sam_draft(empty, &c, 1, draft, 8) == 0);
    cart_sam_free(empty);
    int32_t bad[] = {1, -2};
    CHECK_ERR(cart_sam_build(&s, bad, 2), CART_E_ARG);
}

int main(void) {
    RUN(test_drafts_match_a_brute_force_search);
    RUN(test_a_repeated_phrase_drafts_its_continuation);
    return check_finish("draft");
}
