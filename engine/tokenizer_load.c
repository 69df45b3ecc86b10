/*
 * tokenizer_load.c - a tokenizer from a GGUF's tokenizer.* metadata, as
 * llama.cpp loads it (the rules: tokenizer.c's header): tokens, types,
 * scores and merges into the hash tables, special ids with their
 * defaults, the end-of-generation and FIM tokens found by text.
 */
#include "tokenizer_internal.h"

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */

static int str_eq(cart_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && memcmp(s.data, z, n) == 0;
}

static int is_integer_type(int32_t type) {
    return type == CART_GGUF_UINT8 || type == CART_GGUF_INT8 || type == CART_GGUF_UINT16 ||
           type == CART_GGUF_INT16 || type == CART_GGUF_UINT32 || type == CART_GGUF_INT32 ||
           type == CART_GGUF_UINT64 || type == CART_GGUF_INT64;
}

static int is_signed_type(int32_t type) {
    return type == CART_GGUF_INT8 || type == CART_GGUF_INT16 || type == CART_GGUF_INT32 ||
           type == CART_GGUF_INT64;
}

static const char *type_label(const cart_gguf_value *v) {
    const char *name = cart_gguf_type_name(v->type);
    if (v->type == CART_GGUF_ARRAY) {
        const char *elem = cart_gguf_type_name(v->elem_type);
        if (v->elem_type == CART_GGUF_STRING) return "array of strings";
        if (elem && strcmp(elem, "int32") == 0) return "array of int32";
        if (elem && strcmp(elem, "float32") == 0) return "array of float32";
        return "array of other elements";
    }
    return name ? name : "unknown type";
}

/* Reads token id `key` into *id when present: an integer inside the vocabulary
 * replaces *id, one outside it is ignored (llama.cpp warns and keeps the
 * default), anything else is a format error. */
static int read_id(const cart_gguf *g, const char *path, const char *key, int64_t n, int32_t *id) {
    const cart_gguf_value *v = cart_gguf_find(g, key);
    if (!v) return CART_OK;
    if (!is_integer_type(v->type))
        return cart_fail(CART_E_FORMAT, "%s: %s: expected an integer token id, found %s", path, key,
                         type_label(v));
    int64_t x =
        is_signed_type(v->type) ? v->as.i64 : (v->as.u64 > INT64_MAX ? -1 : (int64_t)v->as.u64);
    if (x >= 0 && x < n) *id = (int32_t)x;
    return CART_OK;
}

/* Reads bool `key` into *flag when present. */
static int read_bool(const cart_gguf *g, const char *path, const char *key, int32_t *flag) {
    const cart_gguf_value *v = cart_gguf_find(g, key);
    if (!v) return CART_OK;
    if (v->type != CART_GGUF_BOOL)
        return cart_fail(CART_E_FORMAT, "%s: %s: expected a bool, found %s", path, key,
                         type_label(v));
    *flag = v->as.u64 != 0;
    return CART_OK;
}

/* The first id (in list order) whose text is one of `names`, or -1. */
static int32_t find_any(const cart_tokenizer *t, const char *const *names) {
    for (int i = 0; names[i]; i++) {
        int32_t id = lookup(t, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

/* Texts llama.cpp recognizes (llama_vocab::impl::load). "\xef\xbd\x9c" is
 * U+FF5C and "\xe2\x96\x81" U+2581; literals are split after hex escapes. */
static const char *const NAMES_EOT[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const NAMES_EOM[] = {"<|eom_id|>", NULL};
static const char *const NAMES_FIM_PRE[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81"
                                            "begin\xef\xbd\x9c>",
                                            "<PRE>",
                                            "\xe2\x96\x81<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const NAMES_FIM_SUF[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81"
                                            "hole\xef\xbd\x9c>",
                                            "<SUF>",
                                            "\xe2\x96\x81<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const NAMES_FIM_MID[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81"
                                            "end\xef\xbd\x9c>",
                                            "<MID>",
                                            "\xe2\x96\x81<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const NAMES_FIM_PAD[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const NAMES_FIM_REP[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const NAMES_FIM_SEP[] = {"<|file_sep|>", NULL};
static const char *const NAMES_EOG[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>",
                                        "[e~[",
                                        NULL};
static const char *const NAMES_RENDERED[] = {"<|channel|>", "<|message|>", "<|start|>",
                                             "<|constrain|>", NULL};

/* The id of one of `names` for a special role the metadata left unset (*id
 * -1); a token found this way is marked CONTROL, as llama.cpp does. */
static void detect_role(cart_tokenizer *t, const char *const *names, int32_t *id) {
    if (*id >= 0) return;
    *id = find_any(t, names);
    if (*id >= 0) t->attr[*id] |= ATTR_CONTROL;
}

static int eog_has_text(const cart_tokenizer *t, const char *name, int32_t *id) {
    *id = lookup(t, name, strlen(name));
    return *id >= 0 && t->eog[*id];
}

/* llama.cpp's end-of-generation set, with its fix-ups. */
static void build_eog(cart_tokenizer *t, int32_t eot, int32_t eom, int32_t fim_pad, int32_t fim_rep,
                      int32_t fim_sep) {
    if (fim_pad >= 0) t->eog[fim_pad] = 1;
    if (fim_rep >= 0) t->eog[fim_rep] = 1;
    if (fim_sep >= 0) t->eog[fim_sep] = 1;
    for (int i = 0; NAMES_EOG[i]; i++) {
        int32_t id = lookup(t, NAMES_EOG[i], strlen(NAMES_EOG[i]));
        if (id < 0) continue;
        t->eog[id] = 1;
        t->attr[id] |= ATTR_CONTROL; /* "control-looking token ... will be overridden" */
    }
    /* gpt-oss: these always render as text. */
    for (int i = 0; NAMES_RENDERED[i]; i++) {
        int32_t id = lookup(t, NAMES_RENDERED[i], strlen(NAMES_RENDERED[i]));
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (eot >= 0) t->eog[eot] = 1;
    if (eom >= 0) t->eog[eom] = 1;

    /* o200k_harmony and solar-open: "<|end|>" does not end generation. */
    int32_t ret, call, calls, flush, end;
    int has_return = eog_has_text(t, "<|return|>", &ret);
    int has_call = eog_has_text(t, "<|call|>", &call) || eog_has_text(t, "<|calls|>", &calls);
    int has_flush = eog_has_text(t, "<|flush|>", &flush);
    int has_end = eog_has_text(t, "<|end|>", &end);
    if ((has_return && has_call && has_end) || (has_call && has_flush && has_end)) {
        t->eog[end] = 0;
        t->attr[end] = ATTR_USER_DEFINED;
    }
    /* gemma4 and paddleocr: "</s>" does not end generation there. */
    int32_t tool, s;
    if (eog_has_text(t, "<|tool_response>", &tool) && eog_has_text(t, "</s>", &s)) {
        t->eog[s] = 0;
        t->attr[s] = ATTR_NORMAL;
    }
}

/* A special id and its text length, for sorting. */
typedef struct special_key {
    int64_t len;
    int32_t id;
} special_key;

/* Longest text first; ties by id, which llama.cpp's unstable sort leaves open. */
static int special_cmp(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int build_special(cart_tokenizer *t) {
    int64_t n = 0;
    for (int64_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) n++;
    special_key *keys = cart_malloc((size_t)(n ? n : 1) * sizeof *keys, "tokenizer special ids");
    t->special = cart_malloc((size_t)(n ? n : 1) * sizeof(int32_t), "tokenizer special ids");
    if (!keys || !t->special) {
        free(keys);
        return CART_E_NOMEM;
    }
    n = 0;
    for (int64_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
            keys[n++] = (special_key){text_len(t, (int32_t)i), (int32_t)i};
    qsort(keys, (size_t)n, sizeof *keys, special_cmp);
    for (int64_t i = 0; i < n; i++) t->special[i] = keys[i].id;
    t->n_special = n;
    free(keys);
    return CART_OK;
}

/* How many entries ahead the loading loops hash and prefetch table slots:
 * the tables are far bigger than the caches, so each probe is a miss. */
enum { AHEAD = 8 };

/* Copies the token texts and builds the text -> id table. */
static int load_tokens(cart_tokenizer *t, const char *path, const cart_gguf_value *tokens) {
    const cart_str *strs = tokens->as.array;
    int64_t n = t->n_vocab;
    uint64_t size = 0;
    char empty[40];
    for (int64_t i = 0; i < n; i++) {
        uint64_t len = strs[i].len;
        if (len == 0) len = (uint64_t)snprintf(empty, sizeof empty, "[EMPTY_%lld]", (long long)i);
        size += len + 1;
    }
    if (size > UINT32_MAX)
        return cart_fail(CART_E_UNSUPPORTED, "%s: tokenizer.ggml.tokens: over 4 GiB of token text",
                         path);
    t->pool = cart_malloc(size, "tokenizer token texts");
    t->off = cart_malloc((size_t)(n + 1) * sizeof(uint32_t), "tokenizer token offsets");
    if (!t->pool || !t->off) return CART_E_NOMEM;
    uint32_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        t->off[i] = at;
        if (strs[i].len == 0) {
            int len = snprintf(empty, sizeof empty, "[EMPTY_%lld]", (long long)i);
            memcpy(t->pool + at, empty, (size_t)len + 1);
            at += (uint32_t)len + 1;
        } else {
            memcpy(t->pool + at, strs[i].data, strs[i].len);
            at += (uint32_t)strs[i].len;
            t->pool[at++] = '\0';
        }
    }
    t->off[n] = at;

    uint64_t slots = table_size((uint64_t)n);
    t->tok = table_alloc(slots * sizeof(tok_slot), "tokenizer text table");
    if (!t->tok) return CART_E_NOMEM;
    t->tok_mask = slots - 1;
    uint64_t hashes[AHEAD];
    for (int64_t i = 0; i < n + AHEAD; i++) {
        if (i >= AHEAD) {
            int64_t k = i - AHEAD;
            const char *s = text_of(t, (int32_t)k);
            size_t len = (size_t)text_len(t, (int32_t)k);
            uint64_t h = hashes[k % AHEAD];
            uint32_t tag = (uint32_t)(h >> 32);
            for (uint64_t j = h & t->tok_mask;; j = (j + 1) & t->tok_mask) {
                tok_slot *slot = &t->tok[j];
                if (slot->id1 == 0) {
                    *slot = (tok_slot){tag, (int32_t)k + 1, t->off[k], (uint32_t)len};
                    break;
                }
                if (slot->tag == tag && slot->len == len &&
                    memcmp(t->pool + slot->off, s, len) == 0)
                    return cart_fail(CART_E_FORMAT,
                                     "%s: tokenizer.ggml.tokens: duplicate token '%.*s' at ids %d "
                                     "and %lld",
                                     path, (int)(len > 64 ? 64 : len), s, slot->id1 - 1,
                                     (long long)k);
            }
        }
        if (i < n) {
            uint64_t h = hash_bytes(text_of(t, (int32_t)i), (size_t)text_len(t, (int32_t)i));
            hashes[i % AHEAD] = h;
            __builtin_prefetch(&t->tok[h & t->tok_mask], 1);
        }
    }
    return CART_OK;
}

/* One merge "a b" on its way through load_merges' pipeline. */
typedef struct merge_job {
    const char *a, *b;
    size_t an, bn;
    uint64_t ha, hb, hj;    /* hashes of a, b and a + b */
    bytebuf joined;         /* a + b */
    int32_t ia, ib, result; /* ids of a, b and a + b, or -1 */
    int ok;                 /* 0: no "a b" form, skipped */
} merge_job;

/* Adds a merge one of whose sides is no token to the pending list. */
static int add_text_merge(text_merge **pending, uint64_t *n_text, uint64_t *cap, bytebuf *tpool,
                          const merge_job *m, int32_t rank, int32_t result) {
    if (*n_text == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        text_merge *p = cart_realloc(*pending, *cap * sizeof(text_merge), "tokenizer merges");
        if (!p) return CART_E_NOMEM;
        *pending = p;
    }
    text_merge *x = &(*pending)[(*n_text)++];
    x->hash = text_pair_hash(m->a, m->an, m->b, m->bn);
    x->a_off = (uint64_t)tpool->n;
    x->a_len = (uint32_t)m->an;
    int rc = buf_put(tpool, m->a, (int64_t)m->an);
    x->b_off = (uint64_t)tpool->n;
    x->b_len = (uint32_t)m->bn;
    if (!rc) rc = buf_put(tpool, m->b, (int64_t)m->bn);
    x->rank = rank;
    x->result = result;
    return rc;
}

/* Hashes the texts of merge string s and prefetches their table slots. */
static int prepare_merge(const cart_tokenizer *t, cart_str s, merge_job *m) {
    uint64_t pos = 1;
    m->ok = 0;
    while (pos < s.len && s.data[pos] != ' ') pos++;
    if (s.len < 2 || pos >= s.len) return CART_OK; /* no "a b" form: can never match a pair */
    m->a = s.data;
    m->an = (size_t)pos;
    m->b = s.data + pos + 1;
    m->bn = (size_t)(s.len - pos - 1);
    m->joined.n = 0;
    int rc = buf_put(&m->joined, m->a, (int64_t)m->an);
    if (!rc) rc = buf_put(&m->joined, m->b, (int64_t)m->bn);
    if (rc) return rc;
    m->ha = hash_bytes(m->a, m->an);
    m->hb = hash_bytes(m->b, m->bn);
    m->hj = hash_bytes(m->joined.p, (size_t)m->joined.n);
    __builtin_prefetch(&t->tok[m->ha & t->tok_mask]);
    __builtin_prefetch(&t->tok[m->hb & t->tok_mask]);
    __builtin_prefetch(&t->tok[m->hj & t->tok_mask]);
    m->ok = 1;
    return CART_OK;
}

/* Reads tokenizer.ggml.merges ("left right" strings, rank = index; the first
 * of duplicate pairs wins, as with llama.cpp's map emplace). */
static int load_merges(cart_tokenizer *t, const cart_gguf_value *merges) {
    const cart_str *strs = merges->as.array;
    uint64_t n = merges->count;
    uint64_t slots = table_size(n);
    t->merge = table_alloc(slots * sizeof(merge_slot), "tokenizer merge table");
    if (!t->merge) return CART_E_NOMEM;
    t->merge_mask = slots - 1;

    /* Three stages AHEAD merges apart: hash the texts and prefetch their
     * slots; look the texts up and prefetch the merge slot; insert. */
    merge_job jobs[2 * AHEAD];
    memset(jobs, 0, sizeof jobs);
    bytebuf tpool = {0};
    uint64_t n_text = 0, text_cap = 0;
    text_merge *pending = NULL; /* (n_text) merges kept by text, before hashing */
    int rc = CART_OK;
    for (uint64_t i = 0; i < n + 2 * AHEAD && rc == CART_OK; i++) {
        if (i >= 2 * AHEAD && jobs[i % (2 * AHEAD)].ok) {
            merge_job *m = &jobs[i % (2 * AHEAD)];
            int32_t rank = (int32_t)(i - 2 * AHEAD);
            if (m->ia >= 0 && m->ib >= 0) {
                uint64_t key = pair_key(m->ia, m->ib);
                for (uint64_t j = mix64(key) & t->merge_mask;; j = (j + 1) & t->merge_mask) {
                    merge_slot *slot = &t->merge[j];
                    if (slot->key == key) break;
                    if (slot->key == 0) {
                        *slot = (merge_slot){key, rank, m->result};
                        break;
                    }
                }
            } else {
                rc = add_text_merge(&pending, &n_text, &text_cap, &tpool, m, rank, m->result);
            }
        }
        if (i >= AHEAD && i - AHEAD < n && jobs[(i - AHEAD) % (2 * AHEAD)].ok) {
            merge_job *m = &jobs[(i - AHEAD) % (2 * AHEAD)];
            m->ia = lookup_hashed(t, m->a, m->an, m->ha);
            m->ib = lookup_hashed(t, m->b, m->bn, m->hb);
            m->result = lookup_hashed(t, m->joined.p, (size_t)m->joined.n, m->hj);
            if (m->ia >= 0 && m->ib >= 0)
                __builtin_prefetch(&t->merge[mix64(pair_key(m->ia, m->ib)) & t->merge_mask], 1);
        }
        if (i < n && rc == CART_OK) rc = prepare_merge(t, strs[i], &jobs[i % (2 * AHEAD)]);
    }
    for (int k = 0; k < 2 * AHEAD; k++) free(jobs[k].joined.p);
    if (rc == CART_OK && n_text) {
        uint64_t tslots = table_size(n_text);
        t->tmerge = cart_calloc(tslots, sizeof(text_merge), "tokenizer text merges");
        if (!t->tmerge) rc = CART_E_NOMEM;
        t->tmerge_mask = tslots - 1;
        t->tpool = (char *)tpool.p;
        tpool.p = NULL;
        for (uint64_t k = 0; rc == CART_OK && k < n_text; k++) {
            const text_merge *m = &pending[k];
            for (uint64_t j = m->hash & t->tmerge_mask;; j = (j + 1) & t->tmerge_mask) {
                text_merge *slot = &t->tmerge[j];
                if (slot->hash == 0) {
                    *slot = *m;
                    break;
                }
                if (slot->hash == m->hash && slot->a_len == m->a_len && slot->b_len == m->b_len &&
                    memcmp(t->tpool + slot->a_off, t->tpool + m->a_off, m->a_len) == 0 &&
                    memcmp(t->tpool + slot->b_off, t->tpool + m->b_off, m->b_len) == 0)
                    break;
            }
        }
    }
    free(tpool.p);
    free(pending);
    return rc;
}

static int parse_pre(cart_tokenizer *t, const cart_gguf *g, const char *path) {
    const cart_gguf_value *v = cart_gguf_find(g, "tokenizer.ggml.pre");
    t->clean_spaces = 1;
    if (!v) {
        t->pre = PRE_DEFAULT;
        return CART_OK;
    }
    if (v->type != CART_GGUF_STRING)
        return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.pre: expected a string, found %s", path,
                         type_label(v));
    cart_str s = v->as.str;
    if (s.len == 0 || str_eq(s, "default")) {
        t->pre = PRE_DEFAULT;
    } else if (str_eq(s, "gpt-2")) {
        t->pre = PRE_GPT2;
    } else if (str_eq(s, "llama3") || str_eq(s, "llama-v3") || str_eq(s, "llama-bpe")) {
        t->pre = PRE_LLAMA3;
        t->ignore_merges = 1;
        t->add_bos = 1;
    } else if (str_eq(s, "qwen2") || str_eq(s, "deepseek-r1-qwen")) {
        t->pre = PRE_QWEN2;
        t->clean_spaces = 0;
    } else if (str_eq(s, "gemma4") || str_eq(s, "granite-embed-multi-311m")) {
        t->pre = PRE_GEMMA4;
        t->raw = 1;
    } else {
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: tokenizer.ggml.pre '%.*s' is not supported; supported: 'qwen2' "
                         "(also 'deepseek-r1-qwen'), 'llama-bpe' (also 'llama3', 'llama-v3'), "
                         "'gemma4' (also 'granite-embed-multi-311m'), 'gpt-2', 'default' or "
                         "absent",
                         path, (int)(s.len > 64 ? 64 : s.len), s.data);
    }
    return CART_OK;
}

/* The tokenizer kind from tokenizer.ggml.model, with its default special
 * ids, and the kind's pre-tokenizer settings. */
static int load_kind(cart_tokenizer *t, const cart_gguf *g, const char *path) {
    int rc;
    const cart_gguf_value *model = cart_gguf_find(g, "tokenizer.ggml.model");
    if (!model)
        return cart_fail(CART_E_NOT_FOUND, "%s: tokenizer.ggml.model is missing (no tokenizer)",
                         path);
    if (model->type != CART_GGUF_STRING)
        return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.model: expected a string, found %s",
                         path, type_label(model));
    if (str_eq(model->as.str, "gpt2")) {
        t->kind = CART_TOKENIZER_BPE;
        t->bos = t->eos = 11;
        t->unk = -1;
    } else if (str_eq(model->as.str, "llama")) {
        t->kind = CART_TOKENIZER_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
    } else if (str_eq(model->as.str, "gemma4")) {
        /* llama.cpp: BPE with no default special ids and the gemma4
         * pre-tokenizer whatever tokenizer.ggml.pre says. */
        t->kind = CART_TOKENIZER_BPE;
        t->bos = t->eos = t->unk = -1;
        const cart_gguf_value *pre = cart_gguf_find(g, "tokenizer.ggml.pre");
        if (pre && pre->type != CART_GGUF_STRING)
            return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.pre: expected a string, found %s",
                             path, type_label(pre));
        t->pre = PRE_GEMMA4;
        t->raw = 1;
        t->clean_spaces = 1;
        return CART_OK;
    } else {
        cart_str s = model->as.str;
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: tokenizer.ggml.model '%.*s' is not supported; supported: 'gpt2' "
                         "(byte-level BPE), 'gemma4' (gemma 4's BPE over U+2581-escaped text) and "
                         "'llama' (SentencePiece)",
                         path, (int)(s.len > 64 ? 64 : s.len), s.data);
    }

    if (t->kind == CART_TOKENIZER_BPE) {
        if ((rc = parse_pre(t, g, path))) return rc;
    } else {
        t->add_space_prefix = 1;
        t->add_bos = 1;
    }

    return CART_OK;
}

/* The vocabulary-sized arrays of the GGUF, checked: tokens, scores and token
 * types (both optional), and the BPE merges. */
typedef struct vocab_arrays {
    const cart_gguf_value *tokens, *scores, *types, *merges;
} vocab_arrays;

static int find_arrays(cart_tokenizer *t, const cart_gguf *g, const char *path, vocab_arrays *va) {
    const cart_gguf_value *tokens = va->tokens = cart_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tokens) return cart_fail(CART_E_NOT_FOUND, "%s: tokenizer.ggml.tokens is missing", path);
    if (tokens->type != CART_GGUF_ARRAY || tokens->elem_type != CART_GGUF_STRING)
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.tokens: expected an array of strings, found %s", path,
                         type_label(tokens));
    if (tokens->count == 0 || tokens->count > INT32_MAX)
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.tokens: expected 1 to 2^31-1 tokens, found %llu", path,
                         (unsigned long long)tokens->count);
    t->n_vocab = (int64_t)tokens->count;
    int64_t n = t->n_vocab;

    const cart_gguf_value *scores = va->scores = cart_gguf_find(g, "tokenizer.ggml.scores");
    if (scores && (scores->type != CART_GGUF_ARRAY || (scores->elem_type != CART_GGUF_FLOAT32 &&
                                                       scores->elem_type != CART_GGUF_INT32)))
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.scores: expected an array of float32 or int32, "
                         "found %s",
                         path, type_label(scores));
    if (scores && scores->count < (uint64_t)n)
        return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.scores: %llu scores for %lld tokens",
                         path, (unsigned long long)scores->count, (long long)n);
    const cart_gguf_value *types = va->types = cart_gguf_find(g, "tokenizer.ggml.token_type");
    if (types && (types->type != CART_GGUF_ARRAY || types->elem_type != CART_GGUF_INT32))
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.token_type: expected an array of int32, found %s",
                         path, type_label(types));
    if (types && types->count < (uint64_t)n)
        return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.token_type: %llu types for %lld tokens",
                         path, (unsigned long long)types->count, (long long)n);
    va->merges = NULL;
    if (t->kind == CART_TOKENIZER_BPE) {
        const cart_gguf_value *merges = va->merges = cart_gguf_find(g, "tokenizer.ggml.merges");
        if (!merges)
            return cart_fail(CART_E_NOT_FOUND,
                             "%s: tokenizer.ggml.merges is missing (a gpt2 tokenizer needs it)",
                             path);
        if (merges->type != CART_GGUF_ARRAY || merges->elem_type != CART_GGUF_STRING)
            return cart_fail(CART_E_FORMAT,
                             "%s: tokenizer.ggml.merges: expected an array of strings, found %s",
                             path, type_label(merges));
        if (merges->count > INT32_MAX)
            return cart_fail(CART_E_FORMAT, "%s: tokenizer.ggml.merges: too many merges (%llu)",
                             path, (unsigned long long)merges->count);
    }

    return CART_OK;
}

/* Each token's attributes (from its token type) and, for SentencePiece, its
 * score. */
static int load_attributes(cart_tokenizer *t, const vocab_arrays *va) {
    const cart_gguf_value *scores = va->scores, *types = va->types;
    int64_t n = t->n_vocab;
    if (t->kind == CART_TOKENIZER_SPM) {
        t->scores = cart_calloc((size_t)n, sizeof(float), "tokenizer scores");
        if (!t->scores) return CART_E_NOMEM;
    }
    t->attr = cart_malloc((size_t)n, "tokenizer token attributes");
    t->eog = cart_calloc((size_t)n, 1, "tokenizer end-of-generation flags");
    if (!t->attr || !t->eog) return CART_E_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        if (scores && t->scores)
            t->scores[i] = scores->elem_type == CART_GGUF_FLOAT32
                               ? ((const float *)scores->as.array)[i]
                               : (float)((const int32_t *)scores->as.array)[i];
        uint8_t a = ATTR_NORMAL;
        if (types) {
            switch (((const int32_t *)types->as.array)[i]) {
            case CART_TOKEN_UNKNOWN:
                a = ATTR_UNKNOWN;
                break;
            case CART_TOKEN_UNUSED:
                a = ATTR_UNUSED;
                break;
            case CART_TOKEN_NORMAL:
                a = ATTR_NORMAL;
                break;
            case CART_TOKEN_CONTROL:
                a = ATTR_CONTROL;
                break;
            case CART_TOKEN_USER_DEFINED:
                a = ATTR_USER_DEFINED;
                break;
            case CART_TOKEN_BYTE:
                a = ATTR_BYTE;
                break;
            default:
                a = 0;
                break; /* UNDEFINED */
            }
        }
        t->attr[i] = a;
    }
    return CART_OK;
}

/* The special ids (defaults, then the metadata's), the add_* flags, the
 * end-of-generation set and the special-token matcher. */
static int load_special(cart_tokenizer *t, const cart_gguf *g, const char *path) {
    int64_t n = t->n_vocab;
    int rc;
    /* Special ids: a default outside the vocabulary is dropped, then the
     * metadata's value replaces it when it is inside. */
    if (t->bos >= n) t->bos = -1;
    if (t->eos >= n) t->eos = -1;
    if (t->unk >= n) t->unk = -1;
    int32_t eot = -1, eom = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1,
            fim_rep = -1, fim_sep = -1;
    if ((rc = read_id(g, path, "tokenizer.ggml.bos_token_id", n, &t->bos)) ||
        (rc = read_id(g, path, "tokenizer.ggml.eos_token_id", n, &t->eos)) ||
        (rc = read_id(g, path, "tokenizer.ggml.eot_token_id", n, &eot)) ||
        (rc = read_id(g, path, "tokenizer.ggml.eom_token_id", n, &eom)) ||
        (rc = read_id(g, path, "tokenizer.ggml.unknown_token_id", n, &t->unk)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_pre_token_id", n, &fim_pre)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_suf_token_id", n, &fim_suf)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_mid_token_id", n, &fim_mid)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_pad_token_id", n, &fim_pad)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_rep_token_id", n, &fim_rep)) ||
        (rc = read_id(g, path, "tokenizer.ggml.fim_sep_token_id", n, &fim_sep)) ||
        (rc = read_id(g, path, "tokenizer.ggml.prefix_token_id", n, &fim_pre)) ||
        (rc = read_id(g, path, "tokenizer.ggml.suffix_token_id", n, &fim_suf)) ||
        (rc = read_id(g, path, "tokenizer.ggml.middle_token_id", n, &fim_mid)))
        return rc;
    if ((rc = read_bool(g, path, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)) ||
        (rc = read_bool(g, path, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (rc = read_bool(g, path, "tokenizer.ggml.add_eos_token", &t->add_eos)))
        return rc;
    /* llama.cpp turns add_bos on for the gemma4 pre-tokenizer, whatever the
     * metadata says. */
    if (t->pre == PRE_GEMMA4) {
        t->add_bos = 1;
        if (t->bos < 0)
            return cart_fail(CART_E_FORMAT,
                             "%s: a gemma4 tokenizer always adds a BOS token (as llama.cpp does), "
                             "but there is none: set tokenizer.ggml.bos_token_id",
                             path);
    }
    if (t->add_bos && t->bos < 0)
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.add_bos_token is true, but there is no bos token "
                         "(tokenizer.ggml.bos_token_id)",
                         path);
    if (t->add_eos && t->eos < 0)
        return cart_fail(CART_E_FORMAT,
                         "%s: tokenizer.ggml.add_eos_token is true, but there is no eos token "
                         "(tokenizer.ggml.eos_token_id)",
                         path);

    detect_role(t, NAMES_EOT, &eot);
    detect_role(t, NAMES_EOM, &eom);
    detect_role(t, NAMES_FIM_PRE, &fim_pre);
    detect_role(t, NAMES_FIM_SUF, &fim_suf);
    detect_role(t, NAMES_FIM_MID, &fim_mid);
    detect_role(t, NAMES_FIM_PAD, &fim_pad);
    detect_role(t, NAMES_FIM_REP, &fim_rep);
    detect_role(t, NAMES_FIM_SEP, &fim_sep);
    build_eog(t, eot, eom, fim_pad, fim_rep, fim_sep);
    if ((rc = build_special(t))) return rc;

    return CART_OK;
}

/* The id of each byte: its GPT-2 symbol (BPE), its <0xNN> piece (gemma4's
 * BPE), or its <0xNN> piece, else the byte itself as a piece (SentencePiece). */
static void load_byte_ids(cart_tokenizer *t) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        if (t->raw) {
            t->byte_id[b] = lookup(t, name, 6);
        } else if (t->kind == CART_TOKENIZER_BPE) {
            uint8_t sym[4];
            int len = utf8_encode(byte_symbol((uint8_t)b), sym);
            t->byte_id[b] = lookup(t, sym, (size_t)len);
        } else {
            char one = (char)b;
            t->byte_id[b] = lookup(t, name, 6);
            if (t->byte_id[b] < 0) t->byte_id[b] = lookup(t, &one, 1);
        }
    }
}

static int load(cart_tokenizer *t, const cart_gguf *g) {
    const char *path = cart_gguf_path(g);
    vocab_arrays va = {0};
    int rc;
    if ((rc = load_kind(t, g, path)) || (rc = find_arrays(t, g, path, &va)) || (rc = load_attributes(t, &va)) ||
        (rc = load_tokens(t, path, va.tokens)) || (va.merges && (rc = load_merges(t, va.merges))) ||
        (rc = load_special(t, g, path)))
        return rc;
    load_byte_ids(t);
    return CART_OK;
}

/* Whether the SentencePiece text may be merged word by word (spm_fragment). */
static int spm_can_split(const cart_tokenizer *t) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const uint8_t *s = (const uint8_t *)text_of(t, id);
        int64_t n = text_len(t, id);
        for (int64_t i = 1; i + 3 <= n; i++)
            if (is_u2581(s + i) && !(i >= 3 && is_u2581(s + i - 3))) return 0;
    }
    return 1;
}

int cart_tokenizer_load(cart_tokenizer **out, const cart_gguf *g) {
    if (!out) return cart_fail(CART_E_ARG, "cart_tokenizer_load: out is NULL");
    *out = NULL;
    if (!g) return cart_fail(CART_E_ARG, "cart_tokenizer_load: the GGUF is NULL");
    cart_tokenizer *t = cart_calloc(1, sizeof *t, "tokenizer");
    if (!t) return CART_E_NOMEM;
    int rc = load(t, g);
    if (rc == CART_OK && t->kind == CART_TOKENIZER_SPM) t->spm_split = spm_can_split(t);
    if (rc) {
        cart_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return CART_OK;
}

void cart_tokenizer_free(cart_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->scores);
    free(t->attr);
    free(t->eog);
    table_free(t->tok, (t->tok_mask + 1) * sizeof(tok_slot));
    table_free(t->merge, (t->merge_mask + 1) * sizeof(merge_slot));
    free(t->tmerge);
    free(t->tpool);
    free(t->special);
    free(t);
}

