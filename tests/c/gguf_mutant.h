/*
 * gguf_mutant.h - writes a copy of a GGUF with one change, for the tests of
 * the loader's refusals (test_model.c, test_gemma4.c).
 */
#ifndef CART_TEST_GGUF_MUTANT_H
#define CART_TEST_GGUF_MUTANT_H

#include "check.h"
#include "dtype.h"
#include "gguf.h"

typedef enum {
    DROP_TENSOR,    /* leave tensor `target` out */
    RESHAPE_TENSOR, /* one more row in tensor `target` */
    RETYPE_TENSOR,  /* tensor `target` as i32 */
    ADD_TENSOR,     /* a new f32 tensor `target` of 64 values */
    ADD_KEY,        /* string key `target` = "linear" */
    SET_U32,        /* key `target` = value (uint32), replacing any it had */
    CHANGE_ARCH     /* general.architecture = `target` */
} mutation;

/* Copies g's metadata into w in order, all but the key `skip` (may be NULL). */
static void copy_gguf_metadata(cart_gguf_writer *w, const cart_gguf *g, const char *skip) {
    for (int64_t i = 0; i < cart_gguf_kv_count(g); i++) {
        const cart_gguf_kv *kv = cart_gguf_kv_at(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.data);
        if (skip && strcmp(key, skip) == 0) continue;
        CHECK_OK(cart_gguf_writer_set(w, key, &kv->value));
    }
}

static void write_mutant_of(const char *src, const char *out, mutation what, const char *target, uint32_t value) {
    cart_gguf *g = NULL;
    CHECK_OK(cart_gguf_open(&g, src));
    if (!g) return;
    cart_gguf_writer *w = NULL;
    CHECK_OK(cart_gguf_writer_new(&w));
    copy_gguf_metadata(w, g, what == SET_U32 ? target : NULL);
    if (what == CHANGE_ARCH) CHECK_OK(cart_gguf_writer_set_str(w, "general.architecture", target)); /* in place */
    if (what == ADD_KEY) CHECK_OK(cart_gguf_writer_set_str(w, target, "linear"));
    if (what == SET_U32) CHECK_OK(cart_gguf_writer_set_u32(w, target, value));
    static uint8_t zeros[1 << 20];
    for (int64_t i = 0; i < cart_gguf_tensor_count(g); i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        int hit = strcmp(name, target) == 0;
        if (hit && what == DROP_TENSOR) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        int32_t dtype = t->dtype;
        const void *data = t->data;
        if (hit && what == RESHAPE_TENSOR) ne[1] += 1, data = zeros;
        if (hit && what == RETYPE_TENSOR) dtype = CART_I32, data = zeros;
        CHECK_OK(cart_gguf_writer_add_tensor(w, name, dtype, t->n_dims, ne, data));
    }
    int64_t ne[4] = {64, 1, 1, 1};
    if (what == ADD_TENSOR) CHECK_OK(cart_gguf_writer_add_tensor(w, target, CART_F32, 1, ne, zeros));
    CHECK_OK(cart_gguf_writer_write(w, out));
    cart_gguf_writer_free(w);
    cart_gguf_close(g);
}

#endif
