/*
 * cart_file.c - the cartridge's artifact: save, and open with every check
 * (see cart.h; docs/formats.md).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cart.h"
#include "dtype.h"
#include "fs.h"
#include "internal.h"
#include "model_internal.h"

enum { PART_K, PART_V, PART_K_SINK, PART_V_SINK, PARTS };

static const char *const part_suffix[PARTS] = {"k", "v", "k_sink", "v_sink"};

/* ---- text helpers ------------------------------------------------------------ */

/* A growable NUL-terminated text. */
typedef struct text {
    char *s;
    size_t len, cap;
    int failed;
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void text_add(text *t, const char *fmt, ...) {
    if (t->failed) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->failed = 1;
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (t->len + (size_t)n + 1 > cap) cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = 1;
            return;
        }
        t->s = s, t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static const char *text_str(const text *t) {
    return t->s && !t->failed ? t->s : "";
}

/* "a" when every value is the same, else "a,b,c" (the metadata's per-layer form). */
static void per_layer_text(text *t, const int32_t *v, int32_t n) {
    int same = 1;
    for (int32_t l = 1; l < n; l++) same = same && v[l] == v[0];
    text_add(t, "%d", (int)v[0]);
    for (int32_t l = 1; !same && l < n; l++) text_add(t, ",%d", (int)v[l]);
}

static int str_is(const cart_str *s, const char *want) {
    return s && s->len == strlen(want) && memcmp(s->data, want, s->len) == 0;
}

static char *model_name(const cart_model *m) {
    cart_str name;
    const cart_gguf *g = cart_model_gguf(m);
    if (cart_gguf_get_str(&name, g, "general.name") == CART_OK) {
        char *s = malloc(name.len + 1);
        if (s) memcpy(s, name.data, name.len), s[name.len] = 0;
        return s;
    }
    return cart_strdup(cart_gguf_path(g), "model name");
}

/* The engine's last error again, as "<path>: <it><suffix>", with status rc. */
static int error_of(int rc, const char *path, const char *suffix) {
    char *why = cart_strdup(cart_last_error(), "error text");
    rc = cart_fail(rc, "%s: %s%s", path, why ? why : cart_status_name(rc), suffix);
    free(why);
    return rc;
}

static void hex64(char *out, uint64_t v) {
    snprintf(out, 17, "%08x%08x", (unsigned)(v >> 32), (unsigned)(v & 0xffffffffu));
}

/* ---- save ---------------------------------------------------------------------- */

typedef struct meta_entry {
    const char *key;
    const char *value;
} meta_entry;

static int meta_cmp(const void *a, const void *b) {
    return strcmp(((const meta_entry *)a)->key, ((const meta_entry *)b)->key);
}

/* Adds key = value to the list, replacing an earlier entry of the key. */
static void meta_put(meta_entry *list, int32_t *n, const char *key, const char *value) {
    for (int32_t i = 0; i < *n; i++)
        if (strcmp(list[i].key, key) == 0) {
            list[i].value = value;
            return;
        }
    list[(*n)++] = (meta_entry){key, value};
}

typedef struct save_meta {
    text n_layer, heads, dims, p, frozen;
    char fingerprint[17], content[17];
    char *name;
} save_meta;

static int save_meta_init(save_meta *sm, const cart_cartridge *c, const cart_model *m) {
    memset(sm, 0, sizeof *sm);
    const int32_t n = cart_cartridge_n_layer(c);
    int32_t h[n > 0 ? n : 1], d[n > 0 ? n : 1];
    h[0] = d[0] = 0;
    for (int32_t l = 0; l < n; l++) h[l] = cart_cartridge_layer_heads(c, l), d[l] = cart_cartridge_layer_head_dim(c, l);
    text_add(&sm->n_layer, "%d", (int)n);
    per_layer_text(&sm->heads, h, n);
    per_layer_text(&sm->dims, d, n);
    text_add(&sm->p, "%lld", (long long)cart_cartridge_p(c));
    text_add(&sm->frozen, "%lld", (long long)cart_cartridge_frozen(c));
    uint64_t content = 0;
    int rc = cart_model_content_hash_once(m, &content);
    if (rc != CART_OK) return rc;
    hex64(sm->fingerprint, cart_model_fingerprint(m));
    hex64(sm->content, content);
    sm->name = model_name(m);
    if (!sm->name || sm->n_layer.failed || sm->heads.failed || sm->dims.failed || sm->p.failed || sm->frozen.failed)
        return cart_fail(CART_E_NOMEM, "cartridge save: out of memory for the metadata");
    return CART_OK;
}

static void save_meta_free(save_meta *sm) {
    free(sm->n_layer.s), free(sm->heads.s), free(sm->dims.s), free(sm->p.s), free(sm->frozen.s);
    free(sm->name);
}

/* The metadata, sorted by key (the order the Lua writer always used). */
static int set_metadata(cart_st_writer *w, const save_meta *sm, const cart_model *m,
                        const cart_cartridge_save_options *o) {
    const int32_t n_extra = o && o->n_meta > 0 ? o->n_meta : 0;
    meta_entry *list = malloc(sizeof *list * (size_t)(11 + n_extra));
    if (!list) return cart_fail(CART_E_NOMEM, "cartridge save: out of memory for the metadata");
    int32_t n = 0;
    meta_put(list, &n, "cartridge.format", CART_CARTRIDGE_FORMAT);
    meta_put(list, &n, "cartridge.architecture", cart_arch_name(cart_model_get_config(m)->arch));
    meta_put(list, &n, "cartridge.n_layer", sm->n_layer.s);
    meta_put(list, &n, "cartridge.kv_heads", sm->heads.s);
    meta_put(list, &n, "cartridge.head_dim", sm->dims.s);
    meta_put(list, &n, "cartridge.p", sm->p.s);
    meta_put(list, &n, "cartridge.frozen", sm->frozen.s);
    meta_put(list, &n, "cartridge.model_name", sm->name);
    meta_put(list, &n, "cartridge.model_fingerprint", sm->fingerprint);
    meta_put(list, &n, "cartridge.model_content_hash", sm->content);
    meta_put(list, &n, "cartridge.training", o && o->training_json ? o->training_json : "{}");
    for (int32_t i = 0; i < n_extra; i++) {
        if (!o->meta_keys[i] || !o->meta_values[i]) {
            free(list);
            return cart_fail(CART_E_ARG, "cartridge save: metadata entry %d has a NULL key or value", (int)i);
        }
        meta_put(list, &n, o->meta_keys[i], o->meta_values[i]);
    }
    qsort(list, (size_t)n, sizeof *list, meta_cmp);
    int rc = CART_OK;
    for (int32_t i = 0; i < n && rc == CART_OK; i++) rc = cart_st_writer_set_meta(w, list[i].key, list[i].value);
    free(list);
    return rc;
}

/* Per layer: k, k_sink, v, v_sink (the sinks when frozen > 0). */
static int add_rows(cart_st_writer *w, const cart_cartridge *c) {
    const int64_t p = cart_cartridge_p(c), frozen = cart_cartridge_frozen(c);
    for (int32_t l = 0; l < cart_cartridge_n_layer(c); l++) {
        const int32_t h = cart_cartridge_layer_heads(c, l), d = cart_cartridge_layer_head_dim(c, l);
        for (int32_t which = 0; which < 2; which++) {
            const float *rows = cart_cartridge_rows_of(c, l, which);
            char name[48];
            int64_t shape[3] = {p - frozen, h, d};
            snprintf(name, sizeof name, "layers.%d.%s", (int)l, part_suffix[which]);
            int rc = cart_st_writer_add(w, name, CART_F32, 3, shape, rows + frozen * h * d);
            if (rc == CART_OK && frozen > 0) {
                shape[0] = frozen;
                snprintf(name, sizeof name, "layers.%d.%s", (int)l, part_suffix[which + 2]);
                rc = cart_st_writer_add(w, name, CART_F32, 3, shape, rows);
            }
            if (rc != CART_OK) return rc;
        }
    }
    return CART_OK;
}

static int save_with(cart_st_writer *w, const cart_cartridge *c, const cart_model *m, const char *path,
                     const cart_cartridge_save_options *o, int64_t *draft) {
    save_meta sm;
    int rc = save_meta_init(&sm, c, m);
    if (rc == CART_OK) rc = set_metadata(w, &sm, m, o);
    if (rc == CART_OK) rc = add_rows(w, c);
    if (rc == CART_OK && draft) {
        const int64_t shape[1] = {o->n_draft};
        rc = cart_st_writer_add(w, "draft_reference", CART_I64, 1, shape, draft);
    }
    if (rc == CART_OK) {
        cart_st_writer_add_checksum(w);
        cart_fs_sweep_temps(path, NULL, 0);
        rc = cart_st_writer_write(w, path);
    }
    save_meta_free(&sm);
    return rc;
}

int cart_cartridge_save(const cart_cartridge *c, const cart_model *m, const char *path,
                        const cart_cartridge_save_options *o) {
    if (!c || !m || !path)
        return cart_fail(CART_E_ARG, "cart_cartridge_save: %s is NULL", !c ? "cartridge" : !m ? "model" : "path");
    int rc = cart_cartridge_check_model(c, m, "cart_cartridge_save");
    if (rc != CART_OK) return rc;
    if ((rc = cart_cartridge_check_finite(c, 0)) != CART_OK) return error_of(rc, path, "");
    int64_t *draft = NULL;
    if (o && o->draft_reference && o->n_draft > 0) {
        draft = cart_malloc(sizeof *draft * (size_t)o->n_draft, "draft reference");
        if (!draft) return CART_E_NOMEM;
        for (int64_t i = 0; i < o->n_draft; i++) draft[i] = o->draft_reference[i];
    }
    cart_st_writer *w = NULL;
    rc = cart_st_writer_new(&w);
    if (rc == CART_OK) rc = save_with(w, c, m, path, o, draft);
    cart_st_writer_free(w);
    free(draft);
    return rc;
}

/* ---- open -------------------------------------------------------------------- */

struct cart_cartridge_file {
    cart_st_file *st;
    char *path;
    int32_t n_layer;
    int64_t p, frozen;
    int32_t *heads, *dims;        /* [n_layer] */
    const cart_st_tensor **parts; /* [n_layer][PARTS]; sinks NULL when frozen is 0 */
    int32_t *draft;
    int64_t n_draft;
    text warnings;
};

void cart_cartridge_file_close(cart_cartridge_file *f) {
    if (!f) return;
    cart_st_close(f->st);
    free(f->path), free(f->heads), free(f->dims), free(f->parts), free(f->draft), free(f->warnings.s);
    free(f);
}

/* Fails the open: CART_E_FORMAT "<path>: what". */
static int bad(const cart_cartridge_file *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int bad(const cart_cartridge_file *f, const char *fmt, ...) {
    char what[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cart_fail(CART_E_FORMAT, "%s: %s", f->path, what);
}

/* The layer count and each layer's heads and dims from "layers.<l>.k". */
static int read_geometry(cart_cartridge_file *f) {
    const cart_st_tensor *k0 = cart_st_find(f->st, "layers.0.k");
    if (!k0) return bad(f, "no tensor 'layers.0.k': this is not a cartridge artifact");
    const cart_st_tensor *sink0 = cart_st_find(f->st, "layers.0.k_sink");
    char name[48];
    int32_t n = 0;
    for (;; n++) {
        snprintf(name, sizeof name, "layers.%d.k", (int)n);
        const cart_st_tensor *k = cart_st_find(f->st, name);
        if (!k) break;
        if (k->ndim != 3)
            return bad(f, "'%s' has rank %d, expected 3 [rows, kv_heads, head_dim]", name, (int)k->ndim);
    }
    if (k0->shape[0] < 1) return bad(f, "'layers.0.k' has no rows: a cartridge has at least one trainable row");
    f->n_layer = n;
    f->frozen = sink0 ? sink0->shape[0] : 0;
    f->p = k0->shape[0] + f->frozen;
    f->heads = cart_malloc(sizeof(int32_t) * (size_t)n, "cartridge geometry");
    f->dims = cart_malloc(sizeof(int32_t) * (size_t)n, "cartridge geometry");
    f->parts = cart_calloc((size_t)n * PARTS, sizeof *f->parts, "cartridge tensors");
    if (!f->heads || !f->dims || !f->parts) return CART_E_NOMEM;
    for (int32_t l = 0; l < n; l++) {
        snprintf(name, sizeof name, "layers.%d.k", (int)l);
        const cart_st_tensor *k = cart_st_find(f->st, name);
        if (k->shape[1] < 1 || k->shape[2] < 1 || k->shape[1] > (1 << 16) || k->shape[2] > (1 << 16))
            return bad(f, "'%s' has %lld KV heads x %lld dims: each must be between 1 and 65536", name,
                       (long long)k->shape[1], (long long)k->shape[2]);
        f->heads[l] = (int32_t)k->shape[1], f->dims[l] = (int32_t)k->shape[2];
    }
    return CART_OK;
}

/* "layers.<l>.<part>" exactly as the writer spells it: l and the part, or -1. */
static int parse_part(const cart_str *name, int32_t n_layer, int32_t *layer) {
    char buf[64];
    if (name->len >= sizeof buf || name->len < 9 || memcmp(name->data, "layers.", 7) != 0) return -1;
    memcpy(buf, name->data, name->len);
    buf[name->len] = 0;
    char *end = NULL;
    long l = strtol(buf + 7, &end, 10);
    if (end == buf + 7 || *end != '.' || l < 0 || l >= n_layer) return -1;
    for (int part = 0; part < PARTS; part++) {
        char want[64];
        snprintf(want, sizeof want, "layers.%ld.%s", l, part_suffix[part]);
        if (strcmp(want, buf) == 0) return *layer = (int32_t)l, part;
    }
    return -1;
}

static void shape_text(char *out, size_t cap, const cart_st_tensor *t) {
    size_t at = 0;
    out[0] = 0;
    for (int32_t i = 0; i < t->ndim && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
}

static int check_draft(cart_cartridge_file *f, const cart_st_tensor *t) {
    if (t->dtype != CART_I64 || t->ndim != 1 || t->shape[0] < 1)
        return bad(f, "'draft_reference' must be a non-empty 1-D I64 tensor");
    f->n_draft = t->shape[0];
    f->draft = cart_malloc(sizeof(int32_t) * (size_t)f->n_draft, "draft reference");
    if (!f->draft) return CART_E_NOMEM;
    for (int64_t i = 0; i < f->n_draft; i++) {
        int64_t id;
        memcpy(&id, (const uint8_t *)t->data + 8 * i, 8);
        if (id < 0 || id > INT32_MAX)
            return bad(f, "'draft_reference' entry %lld is %lld, not a token id", (long long)i, (long long)id);
        f->draft[i] = (int32_t)id;
    }
    return CART_OK;
}

/* Exactly the expected tensors: names, F32, shapes (and the draft reference). */
static int check_tensors(cart_cartridge_file *f) {
    const int64_t trainable = f->p - f->frozen;
    for (int64_t i = 0; i < cart_st_tensor_count(f->st); i++) {
        const cart_st_tensor *t = cart_st_tensor_at(f->st, i);
        const char *name = t->name.data;
        const int name_len = (int)t->name.len;
        if (str_is(&t->name, "draft_reference")) {
            int rc = check_draft(f, t);
            if (rc != CART_OK) return rc;
            continue;
        }
        int32_t l = 0;
        const int part = parse_part(&t->name, f->n_layer, &l);
        if (part < 0 || (part >= PART_K_SINK && f->frozen == 0))
            return bad(f, "unexpected tensor '%.*s'", name_len, name);
        if (t->dtype != CART_F32) {
            const char *dt = cart_st_dtype_name(t->dtype);
            return bad(f, "'%.*s' is %s, expected F32", name_len, name, dt ? dt : "?");
        }
        const int64_t rows = part >= PART_K_SINK ? f->frozen : trainable;
        if (t->ndim != 3 || t->shape[0] != rows || t->shape[1] != f->heads[l] || t->shape[2] != f->dims[l]) {
            char have[160];
            shape_text(have, sizeof have, t);
            return bad(f, "'%.*s' has shape [%s], expected [%lld, %d, %d]", name_len, name, have, (long long)rows,
                       (int)f->heads[l], (int)f->dims[l]);
        }
        f->parts[l * PARTS + part] = t;
    }
    for (int32_t l = 0; l < f->n_layer; l++)
        for (int part = 0; part < (f->frozen > 0 ? PARTS : 2); part++)
            if (!f->parts[l * PARTS + part]) return bad(f, "missing tensor 'layers.%d.%s'", (int)l, part_suffix[part]);
    return CART_OK;
}

/* Every row value finite and within +-CART_CARTRIDGE_MAX_ABS. */
static int check_values(const cart_cartridge_file *f) {
    for (int32_t l = 0; l < f->n_layer; l++)
        for (int part = 0; part < PARTS; part++) {
            const cart_st_tensor *t = f->parts[l * PARTS + part];
            const int64_t i = t ? cart_f32_first_outside(t->data, (int64_t)(t->nbytes / 4), CART_CARTRIDGE_MAX_ABS) : -1;
            if (i < 0) continue;
            float x;
            memcpy(&x, (const uint8_t *)t->data + 4 * i, 4);
            const int rc = cart_cartridge_value_error("the data", l, part % 2, part >= PART_K_SINK,
                                                      i / (f->heads[l] * f->dims[l]), x);
            return error_of(rc, f->path, "; the file is damaged or its training diverged");
        }
    return CART_OK;
}

/* The model's layers and KV geometry, and the draft ids within its vocabulary. */
static int check_model_fit(const cart_cartridge_file *f, const cart_model *m) {
    const cart_model_config *mc = cart_model_get_config(m);
    const char *mpath = cart_gguf_path(cart_model_gguf(m));
    if (f->n_layer != mc->n_layer)
        return bad(f, "the cartridge is %d layers x %d KV heads x %d dims, the model %s is %d x %d x %d; use the "
                   "model it was trained with", (int)f->n_layer, (int)f->heads[0], (int)f->dims[0], mpath,
                   (int)mc->n_layer, (int)m->layers[0].g.n_head_kv, (int)m->layers[0].g.head_dim);
    for (int32_t l = 0; l < f->n_layer; l++) {
        const cart_layer_config *g = &m->layers[l].g;
        if (g->n_head_kv != f->heads[l] || g->head_dim != f->dims[l])
            return bad(f, "the cartridge is %d layers x %d KV heads x %d dims (layer %d), the model %s is %d x %d x %d; "
                       "use the model it was trained with", (int)f->n_layer, (int)f->heads[l], (int)f->dims[l],
                       (int)l, mpath, (int)mc->n_layer, (int)g->n_head_kv, (int)g->head_dim);
    }
    for (int64_t i = 0; i < f->n_draft; i++)
        if (f->draft[i] >= mc->n_vocab)
            return bad(f, "'draft_reference' entry %lld is token %d, beyond the model's vocabulary of %d ids; the file "
                       "is damaged or was made for another model", (long long)i, (int)f->draft[i], (int)mc->n_vocab);
    return CART_OK;
}

/* "'value'" or "nothing" for a metadata value, into buf. */
static const char *said(char *buf, size_t cap, const cart_str *v, int quoted) {
    if (!v) snprintf(buf, cap, quoted ? "nothing" : "nil");
    else snprintf(buf, cap, quoted ? "'%.*s'" : "%.*s", (int)(v->len < 256 ? v->len : 256), v->data);
    return buf;
}

/* The format, and the geometry the metadata states against the tensors'. */
static void format_problems(const cart_cartridge_file *f, text *out) {
    const cart_str *format = cart_st_meta_get(f->st, "cartridge.format");
    char a[300];
    if (!str_is(format, "cartridge-v1") && !str_is(format, CART_CARTRIDGE_FORMAT)) {
        if (format) text_add(out, "%sits metadata has cartridge.format %s, which this version does not read (it "
                                  "reads cartridge-v1 and cartridge-v2)", out->len ? "; " : "", said(a, sizeof a, format, 1));
        else text_add(out, "%sits metadata has no cartridge.format", out->len ? "; " : "");
    }
    text have[5] = {{0}};
    const char *keys[5] = {"n_layer", "kv_heads", "head_dim", "p", "frozen"};
    text_add(&have[0], "%d", (int)f->n_layer);
    per_layer_text(&have[1], f->heads, f->n_layer);
    per_layer_text(&have[2], f->dims, f->n_layer);
    text_add(&have[3], "%lld", (long long)f->p);
    text_add(&have[4], "%lld", (long long)f->frozen);
    for (int i = 0; i < 5; i++) {
        char key[32];
        snprintf(key, sizeof key, "cartridge.%s", keys[i]);
        const cart_str *v = cart_st_meta_get(f->st, key);
        if (!str_is(v, text_str(&have[i])))
            text_add(out, "%sits metadata says cartridge.%s %s where its tensors have %s", out->len ? "; " : "",
                     keys[i], said(a, sizeof a, v, 1), text_str(&have[i]));
        free(have[i].s);
    }
}

/* The model the metadata names against m: architecture, fingerprint, and a
 * v2 file's content hash. */
static int model_problems(const cart_cartridge_file *f, const cart_model *m, text *out) {
    const char *mpath = cart_gguf_path(cart_model_gguf(m));
    const char *arch = cart_arch_name(cart_model_get_config(m)->arch);
    const cart_str *name = cart_st_meta_get(f->st, "cartridge.model_name");
    const cart_str *march = cart_st_meta_get(f->st, "cartridge.architecture");
    const cart_str *fp = cart_st_meta_get(f->st, "cartridge.model_fingerprint");
    char a[300], b[300], mfp[17];
    hex64(mfp, cart_model_fingerprint(m));
    if (!str_is(march, arch ? arch : "?"))
        text_add(out, "%sit was trained on a %s model, and %s is %s", out->len ? "; " : "", said(a, sizeof a, march, 0),
                 mpath, arch ? arch : "?");
    if (!fp)
        text_add(out, "%sits metadata names no model fingerprint (cartridge.model_fingerprint)", out->len ? "; " : "");
    else if (!str_is(fp, mfp))
        text_add(out, "%sit was trained on model '%s' (fingerprint %s), and %s has fingerprint %s", out->len ? "; " : "",
                 said(a, sizeof a, name, 0), said(b, sizeof b, fp, 0), mpath, mfp);
    if (!str_is(cart_st_meta_get(f->st, "cartridge.format"), CART_CARTRIDGE_FORMAT)) return CART_OK;
    const cart_str *want = cart_st_meta_get(f->st, "cartridge.model_content_hash");
    if (!want) {
        text_add(out, "%sits metadata has no cartridge.model_content_hash, which a cartridge-v2 file records",
                 out->len ? "; " : "");
    } else if (str_is(fp, mfp)) {
        uint64_t h = 0;
        char mh[17];
        int rc = cart_model_content_hash_once(m, &h);
        if (rc != CART_OK) return rc;
        hex64(mh, h);
        if (!str_is(want, mh))
            text_add(out, "%sit was trained on model '%s' (content hash %s), and the weights of %s hash to %s: the "
                     "same tensors with other values (a damaged or edited copy)", out->len ? "; " : "",
                     said(a, sizeof a, name, 0), said(b, sizeof b, want, 0), mpath, mh);
    }
    return CART_OK;
}

/* The identity checks: refused, or with CART_CARTRIDGE_FOREIGN a warning. */
static int check_identity(cart_cartridge_file *f, const cart_model *m, int32_t flags) {
    text problems = {0};
    format_problems(f, &problems);
    int rc = m ? model_problems(f, m, &problems) : CART_OK;
    if (rc == CART_OK && problems.failed) rc = cart_fail(CART_E_NOMEM, "%s: out of memory for the checks", f->path);
    if (rc == CART_OK && problems.len > 0) {
        if (!(flags & CART_CARTRIDGE_FOREIGN))
            rc = bad(f, "%s; the file was made for another model, or damaged or edited: use the model it was trained "
                     "with (--foreign-cartridge loads it anyway, when its tensors fit the model)", problems.s);
        else
            text_add(&f->warnings, "%s: warning: %s; loading it anyway (--foreign-cartridge)\n", f->path, problems.s);
    } else if (rc == CART_OK && m && str_is(cart_st_meta_get(f->st, "cartridge.format"), "cartridge-v1")) {
        text_add(&f->warnings, "%s: warning: a cartridge-v1 file records only a sampled fingerprint of its model, so "
                 "a model whose weights differ away from each tensor's ends passes the check\n", f->path);
    }
    free(problems.s);
    return rc;
}

/* The sweep of dead writers' temporary files, and the file opened and its
 * checksum verified. */
static int open_file(cart_cartridge_file *f) {
    char names[4096];
    const int32_t swept = cart_fs_sweep_temps(f->path, names, sizeof names);
    if (swept > 0) {
        for (char *c = names; *c; c++)
            if (*c == '\n') *c = ',';
        text_add(&f->warnings, "removed %d stale temporary file%s beside %s (left by a process that died): %s\n",
                 (int)swept, swept == 1 ? "" : "s", f->path, names);
    }
    int rc = cart_st_open(&f->st, f->path);
    if (rc != CART_OK) return rc;
    rc = cart_st_verify_checksum(f->st);
    if (rc == CART_E_NOT_FOUND) {
        text_add(&f->warnings, "%s carries no checksum (written by an older version): its bytes are not verified; "
                 "saving it again adds one\n", f->path);
        rc = CART_OK;
    }
    return rc;
}

int cart_cartridge_open(cart_cartridge_file **out, const char *path, const cart_model *m, int32_t flags) {
    if (!out || !path) return cart_fail(CART_E_ARG, "cart_cartridge_open: %s is NULL", !out ? "out" : "path");
    *out = NULL;
    cart_cartridge_file *f = cart_calloc(1, sizeof *f, "cartridge file");
    if (!f) return CART_E_NOMEM;
    f->path = cart_strdup(path, "cartridge path");
    int rc = f->path ? open_file(f) : CART_E_NOMEM;
    if (rc == CART_OK) rc = read_geometry(f);
    if (rc == CART_OK) rc = check_tensors(f);
    if (rc == CART_OK && m) rc = check_model_fit(f, m);
    if (rc == CART_OK) rc = check_identity(f, m, flags);
    if (rc == CART_OK) rc = check_values(f);
    if (rc == CART_OK && f->warnings.failed) rc = cart_fail(CART_E_NOMEM, "%s: out of memory for warnings", path);
    if (rc != CART_OK) {
        cart_cartridge_file_close(f);
        return rc;
    }
    *out = f;
    return CART_OK;
}

const char *cart_cartridge_file_warnings(const cart_cartridge_file *f) { return f ? text_str(&f->warnings) : ""; }
const cart_st_file *cart_cartridge_file_st(const cart_cartridge_file *f) { return f ? f->st : NULL; }
int32_t cart_cartridge_file_n_layer(const cart_cartridge_file *f) { return f ? f->n_layer : 0; }
int64_t cart_cartridge_file_p(const cart_cartridge_file *f) { return f ? f->p : 0; }
int64_t cart_cartridge_file_frozen(const cart_cartridge_file *f) { return f ? f->frozen : 0; }

int32_t cart_cartridge_file_layer_heads(const cart_cartridge_file *f, int32_t layer) {
    return f && layer >= 0 && layer < f->n_layer ? f->heads[layer] : 0;
}

int32_t cart_cartridge_file_layer_head_dim(const cart_cartridge_file *f, int32_t layer) {
    return f && layer >= 0 && layer < f->n_layer ? f->dims[layer] : 0;
}

const float *cart_cartridge_file_rows(const cart_cartridge_file *f, int32_t layer, int32_t which, int32_t sink) {
    if (!f || layer < 0 || layer >= f->n_layer || (which != 0 && which != 1)) return NULL;
    const cart_st_tensor *t = f->parts[layer * PARTS + which + (sink ? 2 : 0)];
    return t ? (const float *)t->data : NULL;
}

int64_t cart_cartridge_file_draft(const cart_cartridge_file *f, const int32_t **ids) {
    if (ids) *ids = f ? f->draft : NULL;
    return f ? f->n_draft : 0;
}

int cart_cartridge_file_load(cart_cartridge **out, const cart_cartridge_file *f) {
    if (!f || !out) return cart_fail(CART_E_ARG, "cart_cartridge_file_load: %s is NULL", !f ? "file" : "out");
    cart_cartridge *c = NULL;
    int rc = cart_cartridge_new_layers(&c, f->n_layer, f->heads, f->dims, f->p, f->frozen);
    if (rc != CART_OK) return rc;
    for (int32_t l = 0; l < f->n_layer; l++)
        for (int32_t which = 0; which < 2; which++) {
            float *rows = cart_cartridge_rows(c, l, which);
            const cart_st_tensor *t = f->parts[l * PARTS + which], *s = f->parts[l * PARTS + which + 2];
            memcpy(rows + f->frozen * f->heads[l] * f->dims[l], t->data, t->nbytes);
            if (s) memcpy(rows, s->data, s->nbytes);
        }
    *out = c;
    return CART_OK;
}

int cart_cartridge_load(cart_cartridge **out, const char *path, const cart_model *m, int32_t flags) {
    cart_cartridge_file *f = NULL;
    int rc = cart_cartridge_open(&f, path, m, flags);
    if (rc == CART_OK) rc = cart_cartridge_file_load(out, f);
    cart_cartridge_file_close(f);
    return rc;
}
