/*
 * train_problem.h - a distillation problem behind a cartridge for the
 * trainer's tests (test_train.c, test_gemma4.c): segments of random tokens,
 * three teacher entries per position, and the finite-difference check of the
 * whole stack's gradient into the cartridge rows.
 */
#ifndef CART_TEST_TRAIN_PROBLEM_H
#define CART_TEST_TRAIN_PROBLEM_H

#include "check.h"
#include "model.h"
#include "rng.h"
#include "adam.h"
#include "train.h"

typedef struct problem {
    cart_model *m;
    cart_trainer *t;
    cart_cartridge *c;
    int32_t tokens[128];
    int64_t seg[4];
    int32_t n_seg;
    int64_t n;
    int64_t pos[384];
    int32_t tok[384];
    float lp[384];
    cart_distill_targets tg;
} problem;

/* Segments of lengths lens[], random tokens, and for every position that does
 * not start a segment three teacher entries with log-probs of a random
 * distribution. */
static void make_problem(problem *pb, const char *path, const int64_t *lens, int32_t n_seg,
                         int64_t p, int64_t frozen, int recompute, uint64_t seed) {
    memset(pb, 0, sizeof *pb);
    CHECK_OK(cart_model_load(&pb->m, path, NULL));
    cart_trainer_options o = {.recompute = recompute};
    CHECK_OK(cart_trainer_new(&pb->t, pb->m, &o));
    CHECK_OK(cart_cartridge_new_for(&pb->c, pb->m, p, frozen));
    cart_cartridge_init_random(pb->c, seed, 0.7f);
    cart_rng r;
    cart_rng_seed(&r, seed + 1);
    int32_t V = cart_model_get_config(pb->m)->n_vocab;
    int64_t at = 0, e = 0;
    for (int32_t s = 0; s < n_seg; s++) {
        pb->seg[s] = lens[s];
        for (int64_t i = 0; i < lens[s]; i++, at++) {
            pb->tokens[at] = (int32_t)cart_rng_below(&r, (uint64_t)V);
            if (i == 0) continue;
            float z[3];
            double sum = 0;
            for (int k = 0; k < 3; k++) z[k] = cart_rng_uniform(&r) + 0.2f, sum += z[k];
            for (int k = 0; k < 3; k++) {
                pb->pos[e] = at;
                pb->tok[e] = (int32_t)((pb->tokens[at] + 7 * k) % V);
                pb->lp[e] = (float)log(z[k] / sum * 0.9);
                e++;
            }
        }
    }
    pb->n = at;
    pb->n_seg = n_seg;
    pb->tg = (cart_distill_targets){pb->pos, pb->tok, pb->lp, e};
}

static void free_problem(problem *pb) {
    cart_cartridge_free(pb->c);
    cart_trainer_free(pb->t);
    cart_model_free(pb->m);
}

static double loss_of(problem *pb) {
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb->t, pb->c, pb->tokens, pb->n, pb->seg, pb->n_seg, &pb->tg, 1,
                                  1.0f, 0, &loss));
    return loss;
}

/* Central differences of the loss against the gradient at 12 random
 * coordinates of every layer's K and V rows 1..p-1 (one sink row), step h,
 * relative error within tol; the sink gets no gradient but moves the loss. */
static void check_stack_gradients(const char *path, const char *label, const int64_t *lens, int32_t n_seg,
                                  int64_t p, float h, double tol) {
    problem pb;
    make_problem(&pb, path, lens, n_seg, p, 1, 0, 11);
    if (!pb.m) return;
    cart_cartridge_zero_grad(pb.c);
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f,
                                  1, &loss));
    CHECK(loss > 0);
    double worst = 0, largest = 0;
    int checked = 0;
    cart_rng r;
    cart_rng_seed(&r, 99);
    for (int32_t l = 0; l < cart_cartridge_n_layer(pb.c); l++)
        for (int32_t which = 0; which < 2; which++) {
            const int64_t row = (int64_t)cart_cartridge_layer_heads(pb.c, l) * cart_cartridge_layer_head_dim(pb.c, l);
            float *x = cart_cartridge_rows(pb.c, l, which);
            float *g = cart_cartridge_grad(pb.c, l, which);
            /* the sink row: no gradient, but it does matter to the loss */
            double sink_grad = 0;
            for (int64_t i = 0; i < row; i++) sink_grad = fmax(sink_grad, fabs(g[i]));
            CHECK(sink_grad == 0.0);
            for (int k = 0; k < 12; k++) {
                int64_t i = row + (int64_t)cart_rng_below(&r, (uint64_t)((p - 1) * row)); /* rows 1..p-1 */
                float keep = x[i];
                x[i] = keep + h;
                double up = loss_of(&pb);
                x[i] = keep - h;
                double down = loss_of(&pb);
                x[i] = keep;
                double fd = (up - down) / (2 * h);
                worst = fmax(worst, fabs(g[i] - fd) / fmax(fabs(fd), 1e-2));
                largest = fmax(largest, fabs(fd));
                checked++;
            }
        }
    float *sink = cart_cartridge_rows(pb.c, 0, 1);
    sink[0] += 0.5f;
    CHECK_MSG(fabs(loss_of(&pb) - loss) > 1e-6, "the sink row does not influence the loss");
    sink[0] -= 0.5f;
    printf("  %s: loss %.4f, %d coordinates over every layer's K and V, |grad| up to %.3g\n", label, loss,
           checked, largest);
    CHECK_MAXDIFF("stack gradient into the cartridge rows vs finite differences (relative)", worst, tol);
    free_problem(&pb);
}

/* The same pass with and without recompute: the same loss and gradients,
 * bit for bit, with fewer activations held. */
static void check_recompute_is_bitwise(const char *path, const int64_t *lens, int32_t n_seg, int64_t p,
                                       uint64_t seed) {
    problem a, b;
    make_problem(&a, path, lens, n_seg, p, 1, 0, seed);
    make_problem(&b, path, lens, n_seg, p, 1, 1, seed);
    if (!a.m || !b.m) return;
    double la = 0, lb = 0;
    cart_cartridge_zero_grad(a.c);
    cart_cartridge_zero_grad(b.c);
    CHECK_OK(cart_trainer_distill(a.t, a.c, a.tokens, a.n, a.seg, a.n_seg, &a.tg, 1, 1.0f, 1, &la));
    CHECK_OK(cart_trainer_distill(b.t, b.c, b.tokens, b.n, b.seg, b.n_seg, &b.tg, 1, 1.0f, 1, &lb));
    CHECK(memcmp(&la, &lb, sizeof la) == 0);
    int64_t n = cart_cartridge_trainable_count(a.c);
    float *ga = malloc(sizeof(float) * (size_t)n), *gb = malloc(sizeof(float) * (size_t)n);
    cart_cartridge_grad_export(a.c, ga);
    cart_cartridge_grad_export(b.c, gb);
    CHECK_MSG(memcmp(ga, gb, sizeof(float) * (size_t)n) == 0, "recompute changed the gradients");
    printf("  activations held: plain %llu bytes, recompute %llu bytes\n",
           (unsigned long long)cart_trainer_peak_bytes(a.t), (unsigned long long)cart_trainer_peak_bytes(b.t));
    CHECK(cart_trainer_peak_bytes(b.t) < cart_trainer_peak_bytes(a.t));
    free(ga);
    free(gb);
    free_problem(&a);
    free_problem(&b);
}

/* Ten Adam steps at lr on a problem lower the loss and leave the sink row
 * (layer 1's K) as it was. */
static void check_adam_lowers_the_loss(const char *path, const int64_t *lens, int32_t n_seg, int64_t p, uint64_t seed,
                                       float lr) {
    problem pb;
    make_problem(&pb, path, lens, n_seg, p, 1, 0, seed);
    if (!pb.m) return;
    cart_adam_params ap;
    cart_adam_default_params(&ap);
    ap.lr = lr;
    cart_adam *a = NULL;
    CHECK_OK(cart_adam_new(&a, &ap, cart_cartridge_trainable_count(pb.c)));
    int64_t row = (int64_t)cart_cartridge_layer_heads(pb.c, 1) * cart_cartridge_layer_head_dim(pb.c, 1);
    float *sink_before = malloc(sizeof(float) * (size_t)row);
    memcpy(sink_before, cart_cartridge_rows(pb.c, 1, 0), sizeof(float) * (size_t)row);
    double first = 0, last = 0;
    for (int step = 0; step < 10; step++) {
        cart_cartridge_zero_grad(pb.c);
        double loss = 0;
        CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f, 1, &loss));
        CHECK_OK(cart_cartridge_adam_step(pb.c, a));
        if (step == 0) first = loss;
        last = loss;
    }
    printf("  10 Adam steps: loss %.5f -> %.5f\n", first, last);
    CHECK(last < first);
    CHECK(memcmp(sink_before, cart_cartridge_rows(pb.c, 1, 0), sizeof(float) * (size_t)row) == 0);
    free(sink_before);
    cart_adam_free(a);
    free_problem(&pb);
}

#endif
