/*
 * fuzz_model.c - libFuzzer target for the model loader (engine/model.h).
 *
 * Each input is a whole GGUF file, opened from memory and given to
 * cart_model_load_gguf: every architecture's hyperparameters and tensor
 * shapes, gemma4's per-layer arrays, window pattern, RoPE factors and
 * experts (merged or not). A file is refused with a message, or gives a
 * model whose config is sane and that decodes two tokens (the first and the
 * last id of its vocabulary) through a cache of four rows, which fills two.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cart_gguf *g = NULL;
    FUZZ_OPEN_OR_RETURN(g, cart_gguf_open_memory(&g, data, size, "fuzz.gguf"));
    cart_model *m = NULL;
    if (cart_model_load_gguf(&m, g, NULL) != CART_OK) { /* the loader took g and closed it */
        FUZZ_CHECK(m == NULL && cart_last_error()[0] != '\0', "model load failed without a message");
        return 0;
    }
    const cart_model_config *c = cart_model_get_config(m);
    FUZZ_CHECK(c->n_layer >= 1 && c->n_vocab >= 1 && c->n_embd >= 1, "a model of %d layers, %d tokens, %d wide",
               c->n_layer, c->n_vocab, c->n_embd);
    for (int32_t l = 0; l < c->n_layer; l++) {
        cart_layer_config lc;
        FUZZ_CHECK(cart_model_layer(m, l, &lc) == CART_OK, "layer %d: %s", l, cart_last_error());
        FUZZ_CHECK(lc.n_head_kv >= 1 && lc.n_head % lc.n_head_kv == 0 && lc.n_rot <= lc.head_dim,
                   "layer %d: %d heads over %d, n_rot %d of %d", l, lc.n_head, lc.n_head_kv, lc.n_rot,
                   lc.head_dim);
    }
    cart_kv *kv = NULL;
    if (cart_model_new_kv(&kv, m, 4, CART_F32) == CART_OK) {
        int32_t toks[2] = {0, c->n_vocab - 1};
        int64_t n = 2, rows[2] = {0, 1};
        float *logits = malloc(sizeof(float) * 2 * (size_t)c->n_vocab);
        int rc = logits ? cart_model_forward(m, &kv, 1, toks, &n, rows, 2, logits) : CART_E_NOMEM;
        FUZZ_CHECK(rc == CART_OK || rc == CART_E_NOMEM, "forward of a loaded model: %s", cart_last_error());
        if (rc == CART_OK) FUZZ_CHECK(cart_kv_len(kv) == 2, "the cache holds %lld rows", (long long)cart_kv_len(kv));
        free(logits);
        cart_kv_free(kv);
    }
    cart_model_free(m);
    return 0;
}
