/*
 * reference_check.h - runs the prompts of a llama.cpp greedy.json fixture
 * (../shared/reference's format, see its README; tests/fixtures/gemma4 uses
 * the same) against a model file: identical greedy ids (a divergence is
 * accepted only where the reference margin is below our logit error at that
 * step), the top-10 logits within `tol`, and the full last-prompt logits row
 * where the file has one. Prints the worst differences.
 *
 * A prompt that records how far llama.cpp lands from itself
 * (tests/fixtures/gemma4: self_envelope, one token per call against one
 * batch; flash_envelope, its flash-attention kernel against the plain one)
 * widens the bound: every step within max(tol, 2 x self_envelope) counts as
 * tight; a step beyond it must still lie within that prompt's
 * flash_envelope (no further from llama.cpp than llama.cpp's own two
 * attention kernels are from each other), and at least half of all steps
 * must be tight.
 */
#ifndef CART_TEST_REFERENCE_CHECK_H
#define CART_TEST_REFERENCE_CHECK_H

#include <cjson/cJSON.h>

#include "check.h"
#include "dtype.h"
#include "model.h"
#include "sampler.h"

static inline char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, fp) != (size_t)n) n = 0;
    buf[n] = 0;
    fclose(fp);
    return buf;
}

/* The fixture was made from these bytes: the same size, or the generator
 * changed and the fixtures must be made again. */
static inline int same_model(const char *model_path, const char *json_path) {
    char *text = slurp(json_path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *size = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "size_bytes");
    FILE *fp = fopen(model_path, "rb");
    long n = -1;
    if (fp) {
        fseek(fp, 0, SEEK_END);
        n = ftell(fp);
        fclose(fp);
    }
    int ok = size && n == (long)size->valuedouble;
    CHECK_MSG(ok, "%s has %ld bytes, the fixture's model %.0f: make_model.lua changed, so run "
              "tools/greedy_fixtures.mjs again", model_path, n, size ? size->valuedouble : -1.0);
    cJSON_Delete(root);
    return ok;
}

/* What one run over a fixture found. */
typedef struct ref_stats {
    double worst, sum;      /* top-10 logit differences: the largest, the sum over steps */
    double worst_full;      /* the full last-prompt rows */
    double worst_excess;    /* the largest step difference over its prompt's loose bound */
    double tight_bound;     /* the largest tight bound of any prompt */
    int full_rows, loose_steps, steps, flips, prompts;
} ref_stats;

/* One prompt: the prompt in one pass, then llama.cpp's own tokens one per
 * call, each step's top-10 logits against the fixture's. The engine is fed
 * llama.cpp's token at every step, so a near-tie flip (the engine's argmax
 * differs where the reference margin is below its logit error) does not
 * part the sequences, and every step is compared. */
static void reference_prompt(const char *name, cart_model *m, cJSON *prompt, double tol, float *logits,
                             ref_stats *st) {
    const cart_model_config *c = cart_model_get_config(m);
    cJSON *ids = cJSON_GetObjectItem(prompt, "prompt_token_ids");
    const int n = cJSON_GetArraySize(ids);
    cJSON *self_env = cJSON_GetObjectItem(prompt, "self_envelope");
    cJSON *flash_env = cJSON_GetObjectItem(prompt, "flash_envelope");
    const double tight = self_env ? fmax(tol, 2 * self_env->valuedouble) : tol;
    const double loose = flash_env ? fmax(tight, flash_env->valuedouble) : tight;
    st->tight_bound = fmax(st->tight_bound, tight);
    st->prompts++;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) toks[i] = cJSON_GetArrayItem(ids, i)->valueint;
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 512, CART_F32));
    int64_t count = n, last = n - 1;
    CHECK_OK(cart_model_forward(m, &kv, 1, toks, &count, &last, 1, logits));
    cJSON *full = cJSON_GetObjectItem(prompt, "last_prompt_logits");
    if (full) {
        st->full_rows++;
        for (int i = 0; i < cJSON_GetArraySize(full); i++)
            st->worst_full = fmax(st->worst_full, fabs(logits[i] - cJSON_GetArrayItem(full, i)->valuedouble));
    }
    cJSON *step;
    int prompt_loose = 0;
    cJSON_ArrayForEach(step, cJSON_GetObjectItem(prompt, "steps")) {
        int want = cJSON_GetObjectItem(step, "token")->valueint;
        double margin = cJSON_GetObjectItem(step, "margin")->valuedouble, step_worst = 0;
        cJSON *top;
        cJSON_ArrayForEach(top, cJSON_GetObjectItem(step, "top"))
            step_worst = fmax(step_worst, fabs(logits[cJSON_GetArrayItem(top, 0)->valueint] -
                                               cJSON_GetArrayItem(top, 1)->valuedouble));
        st->worst = fmax(st->worst, step_worst);
        st->sum += step_worst;
        st->steps++;
        if (step_worst > tight) {
            if (!prompt_loose++)
                printf("    prompt %d parts from llama.cpp at step %d (%.3g, beyond the tight bound %.3g; "
                       "llama.cpp's flash-attention kernel lands up to %.3g from its plain one)\n", st->prompts,
                       cJSON_GetObjectItem(step, "step")->valueint, step_worst, tight, loose);
            st->loose_steps++;
            st->worst_excess = fmax(st->worst_excess, step_worst / loose);
        }
        int got = cart_argmax(logits, c->n_vocab);
        if (got != want) {
            CHECK_MSG(margin < 2 * step_worst + 1e-6, "%s prompt %d step %d: got %d, llama.cpp %d (margin %g, "
                      "our error %g)", name, st->prompts,
                      cJSON_GetObjectItem(step, "step")->valueint, got, want, margin, step_worst);
            st->flips++;
        }
        count = 1, last = 0;
        CHECK_OK(cart_model_forward(m, &kv, 1, &want, &count, &last, 1, logits));
    }
    cart_kv_free(kv);
    free(toks);
}

/* Every evaluated prompt of one greedy.json against a model file loaded
 * with `opts` (may be NULL); no verdict, only the figures. */
static inline void reference_run(const char *model_path, const char *json_path, double tol,
                          const cart_model_options *opts, ref_stats *st) {
    memset(st, 0, sizeof *st);
    st->tight_bound = tol;
    char *text = slurp(json_path);
    CHECK_MSG(text != NULL, "cannot read %s", json_path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    cart_model *m = NULL;
    if (root) CHECK_OK(cart_model_load(&m, model_path, opts));
    if (m) {
        float *logits = malloc(sizeof(float) * (size_t)cart_model_get_config(m)->n_vocab);
        cJSON *prompt;
        cJSON_ArrayForEach(prompt, cJSON_GetObjectItem(root, "prompts")) {
            cJSON *evaluated = cJSON_GetObjectItem(prompt, "evaluated");
            if ((evaluated && cJSON_IsFalse(evaluated)) ||
                cJSON_GetArraySize(cJSON_GetObjectItem(prompt, "prompt_token_ids")) == 0)
                continue;
            reference_prompt(model_path, m, prompt, tol, logits, st);
        }
        free(logits);
    }
    cart_model_free(m);
    cJSON_Delete(root);
}

/* The verdict on a run: every step within its tight bound; or, where
 * llama.cpp disagrees with itself (the fixture's envelopes), every step
 * within its prompt's flash envelope and at least `tight_share` of the steps
 * tight. */
static inline void reference_verdict(const char *model_path, const ref_stats *st, double tol, int min_steps,
                              double tight_share) {
    printf("  %s: %d prompts, %d steps, %d near-tie flips, top-10 logits from llama.cpp: max %.4g, mean %.4g\n",
           strrchr(model_path, '/') + 1, st->prompts, st->steps, st->flips, st->worst,
           st->steps ? st->sum / st->steps : 0.0);
    if (st->loose_steps == 0) CHECK_MAXDIFF("top-10 logits vs llama.cpp", st->worst, st->tight_bound);
    else {
        printf("  %d of %d steps beyond the tight bound; the worst at %.3g of its prompt's flash envelope\n",
               st->loose_steps, st->steps, st->worst_excess);
        CHECK_MSG(st->worst_excess <= 1.0, "a step lies further from llama.cpp than llama.cpp's two attention "
                  "kernels");
        CHECK_MSG(st->steps - st->loose_steps >= tight_share * st->steps, "%d of %d steps beyond the tight bound",
                  st->loose_steps, st->steps);
    }
    if (st->full_rows) CHECK_MAXDIFF("last prompt logits (full row) vs llama.cpp", st->worst_full, tol);
    CHECK(st->steps >= min_steps);
}

/* Runs every prompt of one greedy.json against a model file: the verdict
 * with at least half the steps tight. */
static inline void check_reference(const char *model_path, const char *json_path, double tol, int min_steps) {
    ref_stats st;
    reference_run(model_path, json_path, tol, NULL, &st);
    reference_verdict(model_path, &st, tol, min_steps, 0.5);
}

/* check_reference on models_dir/name.gguf and fixtures_dir/name.greedy.json,
 * 3 prompts of 32 steps at least, once the fixture is of these bytes. */
static inline void check_fixture(const char *models_dir, const char *fixtures_dir, const char *name, double tol) {
    char model[512], json[512];
    snprintf(model, sizeof model, "%s%s.gguf", models_dir, name);
    snprintf(json, sizeof json, "%s%s.greedy.json", fixtures_dir, name);
    if (same_model(model, json)) check_reference(model, json, tol, 32 * 3);
}

static inline double max_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* Logits of every position of n tokens (n <= 256) through one cache of
 * kv_dtype, fed in chunks of `chunk`. */
static inline void logits_in_chunks(cart_model *m, const int32_t *toks, int64_t n, int64_t chunk, int32_t kv_dtype,
                                    float *out) {
    const int64_t V = cart_model_get_config(m)->n_vocab;
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 256, kv_dtype));
    int64_t rows[256];
    for (int64_t at = 0; kv && at < n; at += chunk) {
        int64_t count = n - at < chunk ? n - at : chunk;
        for (int64_t j = 0; j < count; j++) rows[j] = j;
        CHECK_OK(cart_model_forward(m, &kv, 1, toks + at, &count, rows, count, out + at * V));
    }
    CHECK(!kv || cart_kv_len(kv) == n);
    cart_kv_free(kv);
}

#endif
