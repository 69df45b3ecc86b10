/*
 * tokenizer.c - llama.cpp-compatible tokenizers over a GGUF's tokenizer.*
 * metadata (see tokenizer.h).
 *
 * What follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp), rule by rule:
 *
 *  - Loading: token attributes from tokenizer.ggml.token_type; special ids from
 *    the metadata with llama.cpp's defaults (llama: bos 1, eos 2, unk 0; gpt2:
 *    bos = eos = 11), an id outside the vocabulary being ignored; the
 *    text-based detection of EOT/EOM/FIM tokens and of end-of-generation tokens,
 *    which also marks a non-control token with such a text CONTROL ("</s>" in
 *    Qwen3); an empty token text is stored as "[EMPTY_<id>]".
 *  - Special-token partition (tokenizer_st_partition): CONTROL, USER_DEFINED
 *    and UNKNOWN tokens, longest text first (ties: lowest id first), split the
 *    text into raw fragments and single ids; CONTROL and UNKNOWN ones only when
 *    the caller asks (parse_special), USER_DEFINED ones always.
 *  - gpt2: each raw fragment is decoded to code points the way
 *    unicode_cpts_from_utf8 does (an invalid byte becomes U+FFFD, overlong
 *    forms and encoded surrogates are decoded as they stand), split by the
 *    pre-tokenizer, each word re-encoded to UTF-8, its bytes mapped to the
 *    GPT-2 byte symbols, and merged pair by pair, lowest merge rank first (ties:
 *    leftmost first). One departure: a 4-byte sequence above U+10FFFF, which
 *    makes llama.cpp abort, is treated as an invalid byte here.
 *  - llama (SentencePiece): a space is put before the fragment when
 *    add_space_prefix is on and the fragment starts the text or follows a
 *    special token; spaces become U+2581; UTF-8 characters (split by lead byte,
 *    no validation) are merged pair by pair, highest token score first (ties:
 *    leftmost first), as long as the merged text is a token; what is left
 *    unmatched falls back to <0xNN> byte tokens.
 *  - gemma4 (tokenizer.ggml.model "gemma4", or gpt2 with pre "gemma4"): each
 *    space becomes U+2581, the fragment splits into runs of newlines and runs
 *    of the rest, each run is decoded to code points and re-encoded as gpt2's
 *    are, a newline run that is a token is taken whole, the rest merges pair
 *    by pair over its UTF-8 characters (merges looked up by text, lowest rank
 *    first), and a symbol that is no token gives the <0xNN> token of each of
 *    its bytes. No default special ids; add_bos is forced on.
 *  - Pieces and detokenize (token_to_piece, detokenize) including the
 *    leading-space strip of add_space_prefix models and the clean_spaces passes
 *    of gpt2 models other than qwen2.
 *
 * The pre-tokenizers are scanners over code points, written after llama.cpp's
 * custom splitters; the code point classes come from unicode_data.c (Unicode
 * 15.1, as llama.cpp's tables).
 */
#include "tokenizer_internal.h"

/* ------------------------------------------------------------------------ */
/* Accessors                                                                 */

int32_t cart_tokenizer_kind_of(const cart_tokenizer *t) {
    return t ? t->kind : 0;
}

int64_t cart_tokenizer_vocab_size(const cart_tokenizer *t) {
    return t ? t->n_vocab : 0;
}

int32_t cart_tokenizer_bos(const cart_tokenizer *t) {
    return t ? t->bos : -1;
}

int32_t cart_tokenizer_eos(const cart_tokenizer *t) {
    return t ? t->eos : -1;
}

int32_t cart_tokenizer_adds_bos(const cart_tokenizer *t) {
    return t ? t->add_bos : 0;
}

int32_t cart_tokenizer_adds_eos(const cart_tokenizer *t) {
    return t ? t->add_eos : 0;
}

static int valid_id(const cart_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab;
}

cart_str cart_tokenizer_text(const cart_tokenizer *t, int32_t id) {
    cart_str s = {"", 0};
    if (!valid_id(t, id)) return s;
    s.data = text_of(t, id);
    s.len = (uint64_t)text_len(t, id);
    return s;
}

/* A bad id is CART_TOKEN_UNDEFINED. A token with several attributes (a
 * NORMAL token marked CONTROL by the fix-up) reports the first of UNKNOWN,
 * CONTROL, USER_DEFINED, BYTE, UNUSED, NORMAL. */
int32_t cart_tokenizer_token_type(const cart_tokenizer *t, int32_t id) {
    if (!valid_id(t, id)) return CART_TOKEN_UNDEFINED;
    uint8_t a = t->attr[id];
    if (a & ATTR_UNKNOWN) return CART_TOKEN_UNKNOWN;
    if (a & ATTR_CONTROL) return CART_TOKEN_CONTROL;
    if (a & ATTR_USER_DEFINED) return CART_TOKEN_USER_DEFINED;
    if (a & ATTR_BYTE) return CART_TOKEN_BYTE;
    if (a & ATTR_UNUSED) return CART_TOKEN_UNUSED;
    if (a & ATTR_NORMAL) return CART_TOKEN_NORMAL;
    return CART_TOKEN_UNDEFINED;
}

int32_t cart_tokenizer_is_eog(const cart_tokenizer *t, int32_t id) {
    return valid_id(t, id) ? t->eog[id] : 0;
}

int32_t cart_tokenizer_find(const cart_tokenizer *t, const char *text, int64_t len) {
    if (!t || len < 0 || (!text && len > 0)) return -1;
    return lookup(t, text ? text : "", (size_t)len);
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */

/* Where ids go: the first `cap` land in ids, all are counted. */
typedef struct id_sink {
    int32_t *ids; /* (cap) */
    int64_t cap, n;
} id_sink;

static inline void push(id_sink *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* A BPE symbol: bytes [start, start + n) of the word; n 0 once merged away. */
typedef struct bpe_sym {
    int32_t prev, next, start, n, id;
} bpe_sym;

/* A candidate merge of symbols left and right (adjacent when pushed), in
 * the one merge queue both tokenizers use: the highest key first, ties to
 * the leftmost pair. BPE keys a pair by minus its merge rank (the lowest
 * rank first), SentencePiece by its piece's score. */
typedef struct merge_pair {
    double key;
    int32_t left, right, size;
    int32_t result; /* BPE: the merged token id */
} merge_pair;

/* A SentencePiece symbol and candidate merge. */
typedef struct spm_sym {
    int32_t prev, next, start, n;
} spm_sym;


/* Scratch space of one encode call. */
typedef struct work {
    const cart_tokenizer *t;
    id_sink *out;
    uint8_t *word; /* (word_cap) the current word, re-encoded UTF-8 */
    int64_t word_cap;
    uint8_t *enc; /* (enc_cap) the word's GPT-2 symbols, UTF-8 */
    int64_t enc_cap;
    int32_t *enc_off; /* (sym_cap + 1) offset in enc of each word byte */
    int64_t enc_off_cap;
    int enc_ready;
    void *sym; /* (sym_cap) bpe_sym or spm_sym */
    int64_t sym_cap;
    merge_pair *heap; /* (heap_cap) the merge queue, a binary heap */
    int64_t heap_n, heap_cap;
    uint8_t *esc; /* (esc_cap) gemma4: the fragment with its spaces as U+2581 */
    int64_t esc_cap;
} work;

static void work_free(work *w) {
    free(w->esc);
    free(w->word);
    free(w->enc);
    free(w->enc_off);
    free(w->sym);
    free(w->heap);
}

static inline int merge_before(const merge_pair *a, const merge_pair *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(work *w, merge_pair p) {
    int rc = grow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(merge_pair), "merge queue");
    if (rc) return rc;
    merge_pair *h = w->heap;
    int64_t i = w->heap_n++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!merge_before(&p, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = p;
    return CART_OK;
}

static merge_pair heap_pop(work *w) {
    merge_pair *h = w->heap;
    merge_pair top = h[0];
    merge_pair last = h[--w->heap_n];
    int64_t i = 0, n = w->heap_n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0) h[i] = last;
    return top;
}

/* Builds the word's GPT-2 symbol text (enc) and byte offsets (enc_off), which
 * only the rare paths need: merges by text, ignore_merges, the byte fallback. */
static int bpe_encode_word(work *w, int64_t n) {
    if (w->enc_ready) return CART_OK;
    int rc = grow((void **)&w->enc, &w->enc_cap, 2 * n, 1, "BPE word");
    if (!rc) rc = grow((void **)&w->enc_off, &w->enc_off_cap, n + 1, sizeof(int32_t), "BPE word");
    if (rc) return rc;
    int32_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        w->enc_off[i] = at;
        at += utf8_encode(byte_symbol(w->word[i]), w->enc + at);
    }
    w->enc_off[n] = at;
    w->enc_ready = 1;
    return CART_OK;
}

static int bpe_try_pair(work *w, int64_t n, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return CART_OK;
    const cart_tokenizer *t = w->t;
    bpe_sym *sym = w->sym;
    int32_t rank, result;
    if (sym[left].id >= 0 && sym[right].id >= 0) {
        if (!merge_find(t, sym[left].id, sym[right].id, &rank, &result)) return CART_OK;
    } else if (t->raw) {
        /* gemma4: the symbols' texts are the word's own bytes */
        const bpe_sym *l = &sym[left], *r = &sym[right];
        if (!tmerge_find(t, (const char *)w->word + l->start, (size_t)l->n,
                         (const char *)w->word + r->start, (size_t)r->n, &rank, &result))
            return CART_OK;
    } else {
        if (!t->tmerge) return CART_OK;
        int rc = bpe_encode_word(w, n);
        if (rc) return rc;
        const bpe_sym *l = &sym[left], *r = &sym[right];
        const char *a = (const char *)w->enc + w->enc_off[l->start];
        const char *b = (const char *)w->enc + w->enc_off[r->start];
        size_t an = (size_t)(w->enc_off[l->start + l->n] - w->enc_off[l->start]);
        size_t bn = (size_t)(w->enc_off[r->start + r->n] - w->enc_off[r->start]);
        if (!tmerge_find(t, a, an, b, bn, &rank, &result)) return CART_OK;
    }
    merge_pair p = {-(double)rank, left, right, sym[left].n + sym[right].n, result};
    return heap_push(w, p);
}

/* A symbol that is no token: llama.cpp emits the tokens of the single bytes
 * of its symbol text that are tokens (gemma4: the <0xNN> token of each byte
 * of the symbol), and drops the rest. */
static int bpe_fallback(work *w, int64_t n, const bpe_sym *s) {
    if (w->t->raw) {
        for (int32_t k = s->start; k < s->start + s->n; k++)
            if (w->t->byte_id[w->word[k]] >= 0) push(w->out, w->t->byte_id[w->word[k]]);
        return CART_OK;
    }
    int rc = bpe_encode_word(w, n);
    if (rc) return rc;
    for (int32_t k = w->enc_off[s->start]; k < w->enc_off[s->start + s->n]; k++) {
        int32_t id = lookup(w->t, &w->enc[k], 1);
        if (id >= 0) push(w->out, id);
    }
    return CART_OK;
}

/* Merges the n bytes of w->word and emits their ids. */
static int bpe_merge_word(work *w, int64_t n) {
    const cart_tokenizer *t = w->t;
    int rc;
    w->enc_ready = 0;
    if (n == 0) return CART_OK;
    if (n > INT32_MAX / 4)
        return cart_fail(CART_E_ARG, "tokenizer: a %lld-byte word is too long", (long long)n);
    if (t->ignore_merges) {
        if ((rc = bpe_encode_word(w, n))) return rc;
        int32_t id = lookup(t, w->enc, (size_t)w->enc_off[n]);
        if (id >= 0) {
            push(w->out, id);
            return CART_OK;
        }
    }
    if (t->raw) {
        /* gemma4: a word of newlines only that is a token stays whole */
        int64_t k = 0;
        while (k < n && w->word[k] == '\n') k++;
        int32_t id = k == n ? lookup(t, w->word, (size_t)n) : -1;
        if (id >= 0) {
            push(w->out, id);
            return CART_OK;
        }
    }
    if ((rc = grow(&w->sym, &w->sym_cap, n, sizeof(bpe_sym), "BPE symbols"))) return rc;
    bpe_sym *sym = w->sym;
    /* One symbol per byte (GPT-2 symbols), or per UTF-8 character (gemma4) */
    int32_t count = 0;
    for (int32_t i = 0; i < (int32_t)n; count++) {
        int32_t len = t->raw ? lead_len(w->word[i]) : 1;
        if (len > (int32_t)n - i) len = (int32_t)n - i;
        sym[count].prev = count - 1;
        sym[count].start = i;
        sym[count].n = len;
        sym[count].id = t->raw ? lookup(t, w->word + i, (size_t)len) : t->byte_id[w->word[i]];
        i += len;
        sym[count].next = i < n ? count + 1 : -1;
    }
    w->heap_n = 0;
    for (int32_t i = 1; i < count; i++)
        if ((rc = bpe_try_pair(w, n, i - 1, i))) return rc;
    while (w->heap_n > 0) {
        merge_pair p = heap_pop(w);
        sym = w->sym;
        bpe_sym *l = &sym[p.left], *r = &sym[p.right];
        /* Stale: one side was merged away or grew since the pair was queued. */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->id = p.result;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if ((rc = bpe_try_pair(w, n, l->prev, p.left))) return rc;
        if ((rc = bpe_try_pair(w, n, p.left, sym[p.left].next))) return rc;
    }
    sym = w->sym;
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        if (sym[i].id >= 0)
            push(w->out, sym[i].id);
        else if ((rc = bpe_fallback(w, n, &sym[i])))
            return rc;
    }
    return CART_OK;
}

/* The callback the pre-tokenizers call with each piece [b, e) of s. */
typedef int (*emit_fn)(void *ctx, const uint8_t *s, int64_t b, int64_t e);

/* The final stage: a word, re-encoded from its code points and merged. */
static int bpe_word(void *ctx, const uint8_t *s, int64_t b, int64_t e) {
    work *w = ctx;
    int rc = grow((void **)&w->word, &w->word_cap, 3 * (e - b), 1, "BPE word");
    if (rc) return rc;
    int64_t n = 0;
    for (int64_t i = b; i < e;) {
        int len;
        uint32_t cp = decode_cp(s, e, i, &len);
        n += utf8_encode(cp, w->word + n);
        i += len;
    }
    return bpe_merge_word(w, n);
}

static inline uint8_t class_at(const uint8_t *s, int64_t e, int64_t i, int *len, uint32_t *cp) {
    *cp = decode_cp(s, e, i, len);
    return cart_ucd_class(*cp);
}

static inline int is_letter(uint8_t k) {
    return (k & CART_UCD_CATEGORY) == CART_UCD_LETTER;
}

static inline int is_number(uint8_t k) {
    return (k & CART_UCD_CATEGORY) == CART_UCD_NUMBER;
}

static inline int is_space(uint8_t k) {
    return (k & CART_UCD_SPACE) != 0;
}

/* [^\s\p{L}\p{N}] for a code point inside the segment. */
static inline int is_other(uint8_t k) {
    return !is_space(k) && !is_letter(k) && !is_number(k);
}

static inline uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Emits [pos, end) and moves pos there. */
#define EMIT_TO(end)                                                                               \
    do {                                                                                           \
        int64_t end_ = (end);                                                                      \
        int rc_ = emit(ctx, s, pos, end_);                                                         \
        if (rc_) return rc_;                                                                       \
        pos = end_;                                                                                \
    } while (0)

/* The llama3 regex (max_digits 3) and the qwen2 one (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * as llama.cpp's unicode_regex_split_custom_llama3 scans it. */
static int split_llama3(const uint8_t *s, int64_t b, int64_t e, int max_digits, emit_fn emit,
                        void *ctx) {
    int64_t pos = b;
    while (pos < e) {
        int l0, l;
        uint32_t c, c1, c2;
        uint8_t k = class_at(s, e, pos, &l0, &c);
        int64_t p1 = pos + l0;

        if (c == '\'' && p1 < e) {
            int l1, l2;
            c1 = ascii_lower(decode_cp(s, e, p1, &l1));
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                EMIT_TO(p1 + l1);
                continue;
            }
            if (p1 + l1 < e) {
                c2 = ascii_lower(decode_cp(s, e, p1 + l1, &l2));
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    EMIT_TO(p1 + l1 + l2);
                    continue;
                }
            }
        }

        if (!(c == '\r' || c == '\n' || is_number(k))) {
            if (is_letter(k) || (p1 < e && is_letter(class_at(s, e, p1, &l, &c1)))) {
                int64_t q = p1;
                while (q < e && is_letter(class_at(s, e, q, &l, &c1))) q += l;
                EMIT_TO(q);
                continue;
            }
        }

        if (is_number(k)) {
            int64_t q = pos;
            int count = 0;
            while (q < e && is_number(class_at(s, e, q, &l, &c1))) {
                q += l;
                if (++count == max_digits) {
                    EMIT_TO(q);
                    count = 0;
                }
            }
            if (q > pos) EMIT_TO(q);
            continue;
        }

        int has_next = 1;
        uint8_t k2 = k;
        if (c == ' ') {
            if (p1 < e)
                k2 = class_at(s, e, p1, &l, &c1);
            else
                has_next = 0;
        }
        if (has_next && is_other(k2)) {
            int64_t q = c == ' ' ? p1 : pos;
            while (q < e && is_other(class_at(s, e, q, &l, &c1))) q += l;
            while (q < e && (s[q] == '\r' || s[q] == '\n')) q++;
            EMIT_TO(q);
            continue;
        }

        int64_t q = pos, last = pos, nl_end = -1, count = 0;
        while (q < e && is_space(class_at(s, e, q, &l, &c1))) {
            if (c1 == '\r' || c1 == '\n') nl_end = q + l;
            last = q;
            q += l;
            count++;
        }
        if (nl_end >= 0) {
            EMIT_TO(nl_end); /* \s*[\r\n]+ */
        } else if (count > 1 && q < e) {
            EMIT_TO(last); /* \s+(?!\S): all but the last one */
        } else if (count > 0) {
            EMIT_TO(q); /* \s+ */
        } else {
            EMIT_TO(p1);
        }
    }
    return CART_OK;
}

/* GPT-2's regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
 * as llama.cpp's unicode_regex_split_custom_gpt2 scans it. */
static int split_gpt2(const uint8_t *s, int64_t b, int64_t e, emit_fn emit, void *ctx) {
    int64_t pos = b;
    while (pos < e) {
        int l0, l;
        uint32_t c, c1, c2;
        uint8_t k = class_at(s, e, pos, &l0, &c);
        int64_t p1 = pos + l0;

        if (c == '\'' && p1 < e) {
            int l1, l2;
            c1 = decode_cp(s, e, p1, &l1);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                EMIT_TO(p1 + l1);
                continue;
            }
            if (p1 + l1 < e) {
                c2 = decode_cp(s, e, p1 + l1, &l2);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    EMIT_TO(p1 + l1 + l2);
                    continue;
                }
            }
        }

        int inside = 1;
        uint8_t k2 = k;
        int64_t q = pos;
        if (c == ' ') {
            q = p1;
            if (p1 < e)
                k2 = class_at(s, e, p1, &l, &c1);
            else
                inside = 0;
        }
        if (inside && is_letter(k2)) {
            while (q < e && is_letter(class_at(s, e, q, &l, &c1))) q += l;
            EMIT_TO(q);
            continue;
        }
        if (inside && is_number(k2)) {
            while (q < e && is_number(class_at(s, e, q, &l, &c1))) q += l;
            EMIT_TO(q);
            continue;
        }
        if (inside && is_other(k2)) {
            while (q < e && is_other(class_at(s, e, q, &l, &c1))) q += l;
            EMIT_TO(q);
            continue;
        }

        int64_t last = pos, count = 0;
        q = pos;
        while (q < e && is_space(class_at(s, e, q, &l, &c1))) {
            last = q;
            q += l;
            count++;
        }
        if (count > 1 && q < e) {
            EMIT_TO(last);
        } else if (count > 0) {
            EMIT_TO(q);
        } else {
            EMIT_TO(p1);
        }
    }
    return CART_OK;
}

/* [\p{P}\$\+<=>\^~\|] in llama.cpp's collapsed std::regex form: non-ASCII
 * punctuation that is not White_Space, ASCII punctuation, $ + < = > ^ ~ |. */
static int is_punct_run(uint32_t cp, uint8_t k) {
    if (cp && cp < 0x80 && strchr("$+<=>^~|", (int)cp)) return 1;
    return !is_space(k) && (k & CART_UCD_CATEGORY) == CART_UCD_PUNCT;
}

/* \p{N} in the collapsed form. */
static int is_number_run(uint32_t cp, uint8_t k) {
    (void)cp;
    return !is_space(k) && is_number(k);
}

/* Splits [b, e) into maximal runs of members and of non-members: what
 * llama.cpp's std::regex split does with `[class]+` (matches and the gaps
 * between them each become a piece). */
static int split_runs(const uint8_t *s, int64_t b, int64_t e, int (*member)(uint32_t, uint8_t),
                      emit_fn emit, void *ctx) {
    int64_t pos = b;
    while (pos < e) {
        int l;
        uint32_t c;
        uint8_t k = class_at(s, e, pos, &l, &c);
        int in = member(c, k);
        int64_t q = pos + l;
        while (q < e) {
            k = class_at(s, e, q, &l, &c);
            if (member(c, k) != in) break;
            q += l;
        }
        EMIT_TO(q);
    }
    return CART_OK;
}

/* [0-9][0-9][0-9]: each leftmost run of three ASCII digits is a piece, and so
 * is each gap between them. */
static int split_digit_triples(const uint8_t *s, int64_t b, int64_t e, emit_fn emit, void *ctx) {
    int64_t pos = b, q = b;
    while (q < e) {
        if (q + 3 <= e && s[q] >= '0' && s[q] <= '9' && s[q + 1] >= '0' && s[q + 1] <= '9' &&
            s[q + 2] >= '0' && s[q + 2] <= '9') {
            if (q > pos) EMIT_TO(q);
            EMIT_TO(q + 3);
            q = pos;
            continue;
        }
        int l;
        decode_cp(s, e, q, &l);
        q += l;
    }
    if (e > pos) EMIT_TO(e);
    return CART_OK;
}

#undef EMIT_TO

/* llama.cpp's default pre-tokenizer is four regexes in a row, each applied to
 * the pieces of the one before. */
static int default_stage4(void *ctx, const uint8_t *s, int64_t b, int64_t e) {
    return split_digit_triples(s, b, e, bpe_word, ctx);
}

static int default_stage3(void *ctx, const uint8_t *s, int64_t b, int64_t e) {
    return split_runs(s, b, e, is_number_run, default_stage4, ctx);
}

static int default_stage2(void *ctx, const uint8_t *s, int64_t b, int64_t e) {
    return split_gpt2(s, b, e, default_stage3, ctx);
}

/* gemma4: spaces become U+2581 (llama_escape_whitespace), then each run of
 * newlines and each run of other text is one word (the "[^\n]+|[\n]+"
 * split; an invalid byte never hides a newline, since '\n' continues no
 * sequence). */
static int gemma4_fragment(work *w, const uint8_t *s, int64_t n) {
    int64_t spaces = 0;
    for (int64_t i = 0; i < n; i++) spaces += s[i] == ' ';
    int rc = grow((void **)&w->esc, &w->esc_cap, n + 2 * spaces, 1, "gemma4 text");
    if (rc) return rc;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->esc + m, "\xe2\x96\x81", 3);
            m += 3;
        } else {
            w->esc[m++] = s[i];
        }
    }
    for (int64_t b = 0; b < m && rc == CART_OK;) {
        int newline = w->esc[b] == '\n';
        int64_t e = b;
        while (e < m && (w->esc[e] == '\n') == newline) e++;
        rc = bpe_word(w, w->esc, b, e);
        b = e;
    }
    return rc;
}

static int bpe_fragment(work *w, const uint8_t *s, int64_t n) {
    switch (w->t->pre) {
    case PRE_GEMMA4:
        return gemma4_fragment(w, s, n);
    case PRE_QWEN2:
        return split_llama3(s, 0, n, 1, bpe_word, w);
    case PRE_LLAMA3:
        return split_llama3(s, 0, n, 3, bpe_word, w);
    case PRE_GPT2:
        return split_gpt2(s, 0, n, bpe_word, w);
    default:
        return split_runs(s, 0, n, is_punct_run, default_stage2, w);
    }
}

static int spm_try_pair(work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return CART_OK;
    const spm_sym *sym = w->sym;
    int32_t size = sym[left].n + sym[right].n;
    int32_t id = lookup(w->t, w->word + sym[left].start, (size_t)size);
    if (id < 0) return CART_OK;
    merge_pair p = {w->t->scores[id], left, right, size, -1};
    return heap_push(w, p);
}

/* Merges the symbols first .. last (linked in order) of w->word and emits
 * their ids. */
static int spm_merge(work *w, int32_t first, int32_t last) {
    const cart_tokenizer *t = w->t;
    spm_sym *sym = w->sym;
    int rc;
    sym[first].prev = -1;
    sym[last].next = -1;
    w->heap_n = 0;
    for (int32_t i = first + 1; i <= last; i++)
        if ((rc = spm_try_pair(w, i - 1, i))) return rc;
    while (w->heap_n > 0) {
        merge_pair p = heap_pop(w);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        /* Stale: one side was merged away or grew since the pair was queued. */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if ((rc = spm_try_pair(w, l->prev, p.left))) return rc;
        if ((rc = spm_try_pair(w, p.left, sym[p.left].next))) return rc;
    }
    for (int32_t i = first; i != -1; i = sym[i].next) {
        int32_t id = lookup(t, w->word + sym[i].start, (size_t)sym[i].n);
        if (id >= 0) {
            push(w->out, id);
            continue;
        }
        /* No token: one <0xNN> token per byte (llama.cpp aborts when even
         * that is missing; this pushes unk, or nothing). */
        for (int32_t j = 0; j < sym[i].n; j++) {
            int32_t b = t->byte_id[w->word[sym[i].start + j]];
            if (b < 0) b = t->unk;
            if (b >= 0) push(w->out, b);
        }
    }
    return CART_OK;
}

/* One raw fragment of a SentencePiece encode; `prefix` puts a space first.
 *
 * llama.cpp merges the whole fragment at once. When no token of the
 * vocabulary has a U+2581 after anything but another U+2581 (t->spm_split),
 * no token can span the start of a U+2581 run, so the runs' words are merged
 * one at a time with the same result: a big text then costs time linear in
 * its size instead of one priority queue over all of it. */
static int spm_fragment(work *w, const uint8_t *s, int64_t len, int prefix) {
    const cart_tokenizer *t = w->t;
    int64_t spaces = prefix;
    for (int64_t i = 0; i < len; i++) spaces += s[i] == ' ';
    int64_t n = len + prefix + 2 * spaces;
    if (n > INT32_MAX / 4)
        return cart_fail(CART_E_ARG,
                         "tokenizer: a %lld-byte fragment is too long for SentencePiece",
                         (long long)len);
    int rc = grow((void **)&w->word, &w->word_cap, n, 1, "SPM text");
    if (rc) return rc;
    int64_t m = 0;
    for (int64_t i = -prefix; i < len; i++) {
        uint8_t c = i < 0 ? ' ' : s[i];
        if (c == ' ') {
            memcpy(w->word + m, "\xe2\x96\x81", 3); /* U+2581 */
            m += 3;
        } else {
            w->word[m++] = c;
        }
    }
    if ((rc = grow(&w->sym, &w->sym_cap, m, sizeof(spm_sym), "SPM symbols"))) return rc;
    spm_sym *sym = w->sym;
    int32_t count = 0;
    for (int64_t i = 0; i < m;) {
        int64_t l = lead_len(w->word[i]);
        if (l > m - i) l = m - i;
        sym[count].start = (int32_t)i;
        sym[count].n = (int32_t)l;
        sym[count].prev = count - 1;
        i += l;
        sym[count].next = i < m ? count + 1 : -1;
        count++;
    }
    int32_t first = 0;
    for (int32_t k = 1; k < count && t->spm_split; k++) {
        int32_t at = sym[k].start; /* the bytes before it, not the symbol: see spm_can_split */
        if (sym[k].n == 3 && is_u2581(w->word + at) && !(at >= 3 && is_u2581(w->word + at - 3))) {
            if ((rc = spm_merge(w, first, k - 1))) return rc;
            first = k;
        }
    }
    return count > 0 ? spm_merge(w, first, count - 1) : CART_OK;
}

/* A piece of the text: raw bytes [off, off + len), or one special id. */
typedef struct fragment {
    int64_t off, len;
    int32_t id; /* -1 for raw text */
} fragment;

/* Splits the text at special-token texts (tokenizer_st_partition); the
 * fragments land in *out (count *n_out), owned by the caller. */
/* Whether [at, at + n) overlaps one of the sorted, disjoint byte ranges
 * plain[2i] .. plain[2i + 1]. */
static int in_plain(const int64_t *plain, int64_t n_plain, int64_t at, int64_t n) {
    int64_t lo = 0, hi = n_plain; /* the first range that ends after at */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (plain[2 * mid + 1] <= at) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_plain && plain[2 * lo] < at + n;
}

static int partition(const cart_tokenizer *t, const char *text, int64_t len, int parse_special,
                     const int64_t *plain, int64_t n_plain, fragment **out, int64_t *n_out) {
    fragment *cur = NULL, *next = NULL;
    int64_t n = 0, cur_cap = 0, next_cap = 0;
    int rc = CART_OK;
    *out = NULL;
    *n_out = 0;
    if (len == 0) return CART_OK;
    if ((rc = grow((void **)&cur, &cur_cap, 1, sizeof(fragment), "tokenizer fragments"))) return rc;
    cur[0] = (fragment){0, len, -1};
    n = 1;
    for (int64_t si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        int control = (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)) != 0;
        if (!parse_special && control) continue;
        int check_plain = control && n_plain > 0;
        const char *st = text_of(t, id);
        size_t sl = (size_t)text_len(t, id);
        int64_t m = 0;
        int found = 0;
        for (int64_t f = 0; f < n; f++) {
            if (cur[f].id >= 0 || cur[f].len < (int64_t)sl) {
                if ((rc = grow((void **)&next, &next_cap, m + 1, sizeof(fragment), "fragments")))
                    goto done;
                next[m++] = cur[f];
                continue;
            }
            int64_t at = cur[f].off, end = cur[f].off + cur[f].len, from = at;
            for (;;) {
                const char *hit = memmem(text + from, (size_t)(end - from), st, sl);
                if (!hit) break;
                int64_t h = hit - text;
                if (check_plain && in_plain(plain, n_plain, h, (int64_t)sl)) {
                    from = h + 1; /* plain text here: the bytes stay text */
                    continue;
                }
                found = 1;
                if ((rc = grow((void **)&next, &next_cap, m + 2, sizeof(fragment), "fragments")))
                    goto done;
                if (h > at) next[m++] = (fragment){at, h - at, -1};
                next[m++] = (fragment){h, (int64_t)sl, id};
                at = from = h + (int64_t)sl;
            }
            if (at < end) {
                if ((rc = grow((void **)&next, &next_cap, m + 1, sizeof(fragment), "fragments")))
                    goto done;
                next[m++] = (fragment){at, end - at, -1};
            }
        }
        if (!found) continue;
        fragment *tmp = cur;
        int64_t tmp_cap = cur_cap;
        cur = next;
        cur_cap = next_cap;
        next = tmp;
        next_cap = tmp_cap;
        n = m;
    }
done:
    free(next);
    if (rc) {
        free(cur);
        return rc;
    }
    *out = cur;
    *n_out = n;
    return CART_OK;
}

int cart_tokenizer_encode(const cart_tokenizer *t, const char *text, int64_t len, int32_t flags,
                          int32_t *ids, int64_t cap, int64_t *n_out) {
    return cart_tokenizer_encode_plain(t, text, len, flags, NULL, 0, ids, cap, n_out);
}

/* CART_E_ARG unless the ranges are within [0, len], sorted and disjoint. */
static int check_plain_ranges(const int64_t *plain, int64_t n_plain, int64_t len) {
    if (n_plain < 0 || (n_plain > 0 && !plain))
        return cart_fail(CART_E_ARG, "cart_tokenizer_encode_plain: %lld ranges at %p", (long long)n_plain,
                         (const void *)plain);
    for (int64_t i = 0; i < n_plain; i++) {
        int64_t a = plain[2 * i], b = plain[2 * i + 1];
        if (a < 0 || b < a || b > len || (i > 0 && a < plain[2 * i - 1]))
            return cart_fail(CART_E_ARG, "cart_tokenizer_encode_plain: range %lld [%lld, %lld) must lie within "
                             "the text's %lld bytes and start at or after the end of the one before it", (long long)i, (long long)a,
                             (long long)b, (long long)len);
    }
    return CART_OK;
}

int cart_tokenizer_encode_plain(const cart_tokenizer *t, const char *text, int64_t len, int32_t flags,
                                const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                int64_t *n_out) {
    if (!t || !n_out || len < 0 || cap < 0 || (!text && len > 0) || (!ids && cap > 0))
        return cart_fail(CART_E_ARG,
                         "cart_tokenizer_encode: bad arguments (tokenizer %p, text "
                         "%p, len %lld, ids %p, cap %lld, n_out %p)",
                         (const void *)t, (const void *)text, (long long)len, (void *)ids,
                         (long long)cap, (void *)n_out);
    int bad = check_plain_ranges(plain, n_plain, len);
    if (bad) return bad;
    *n_out = 0;
    id_sink out = {ids, cap, 0};
    work w = {0};
    w.t = t;
    w.out = &out;
    fragment *frags = NULL;
    int64_t n_frags = 0;
    int add_special = (flags & CART_TOKENIZE_ADD_SPECIAL) != 0;
    int rc = partition(t, text, len, (flags & CART_TOKENIZE_PARSE_SPECIAL) != 0, plain, n_plain, &frags,
                       &n_frags);
    if (rc) return rc;

    if (add_special && t->add_bos) push(&out, t->bos);
    int prev_special = 1; /* SentencePiece: a space before the first fragment */
    for (int64_t f = 0; f < n_frags && rc == CART_OK; f++) {
        const fragment *fr = &frags[f];
        if (fr->id >= 0) {
            push(&out, fr->id);
            prev_special = 1;
            continue;
        }
        const uint8_t *s = (const uint8_t *)text + fr->off;
        if (t->kind == CART_TOKENIZER_SPM)
            rc = spm_fragment(&w, s, fr->len, t->add_space_prefix && prev_special);
        else
            rc = bpe_fragment(&w, s, fr->len);
        prev_special = 0;
    }
    if (rc == CART_OK && add_special && t->add_eos) push(&out, t->eos);
    free(frags);
    work_free(&w);
    if (rc) return rc;
    *n_out = out.n;
    return CART_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */

/* llama_decode_text: each code point of a BPE token text back to its byte;
 * one that is no GPT-2 symbol gives "[UNK_BYTE_0x<its UTF-8 in hex><text>]". */
static int bpe_decode_text(const cart_tokenizer *t, int32_t id, bytebuf *b) {
    const uint8_t *s = (const uint8_t *)text_of(t, id);
    int64_t n = text_len(t, id);
    int rc = buf_reserve(b, n);
    if (rc) return rc;
    for (int64_t i = 0; i < n;) {
        int len;
        uint32_t cp = decode_cp(s, n, i, &len);
        i += len;
        int byte = symbol_byte(cp);
        if (byte >= 0) {
            uint8_t c = (uint8_t)byte;
            if ((rc = buf_put(b, &c, 1))) return rc;
            continue;
        }
        uint8_t u[4];
        char hex[16];
        int ul = utf8_encode(cp, u), hl = 0;
        for (int k = 0; k < ul; k++)
            hl += snprintf(hex + hl, sizeof hex - (size_t)hl, "%02x", u[k]);
        if ((rc = buf_put(b, "[UNK_BYTE_0x", 12)) || (rc = buf_put(b, hex, hl)) ||
            (rc = buf_put(b, s, n)) || (rc = buf_put(b, "]", 1)))
            return rc;
    }
    return CART_OK;
}

/* llama.cpp's token_to_byte: the two hex digits after "<0x" (strtol: as many
 * as parse). */
static uint8_t byte_token_value(const cart_tokenizer *t, int32_t id) {
    const char *s = text_of(t, id);
    int64_t n = text_len(t, id);
    unsigned v = 0;
    for (int64_t i = 3; i < 5 && i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) break;
        v = v * 16 + (unsigned)d;
    }
    return (uint8_t)v;
}

/* Appends token id's piece to b as llama_token_to_piece(id, lstrip, special)
 * gives it (lstrip: drop one leading space). */
static int piece_append(const cart_tokenizer *t, int32_t id, int special, int lstrip, bytebuf *b) {
    uint8_t a = t->attr[id];
    int64_t start = b->n;
    int rc = CART_OK;
    if (!special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return CART_OK;
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        rc = buf_put(b, text_of(t, id), text_len(t, id));
    } else if (a & ATTR_NORMAL) {
        if (t->kind == CART_TOKENIZER_BPE && !t->raw) {
            rc = bpe_decode_text(t, id, b);
        } else {
            const char *s = text_of(t, id);
            int64_t n = text_len(t, id);
            for (int64_t i = 0; i < n && rc == CART_OK;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    rc = buf_put(b, " ", 1);
                    i += 3;
                } else {
                    rc = buf_put(b, s + i, 1);
                    i++;
                }
            }
        }
    } else if (a & ATTR_BYTE) {
        uint8_t c = byte_token_value(t, id);
        rc = buf_put(b, &c, 1);
    }
    if (rc) return rc;
    if (lstrip && b->n > start && b->p[start] == ' ') {
        memmove(b->p + start, b->p + start + 1, (size_t)(b->n - start - 1));
        b->n--;
    }
    return CART_OK;
}

/* Copies the n bytes at s into buf (at most cap) and reports n. */
static void copy_out(const uint8_t *s, int64_t n, char *buf, int64_t cap, int64_t *n_out) {
    if (buf && cap > 0 && n > 0) memcpy(buf, s, (size_t)(n < cap ? n : cap));
    *n_out = n;
}

int cart_tokenizer_piece(const cart_tokenizer *t, int32_t id, int32_t flags, char *buf, int64_t cap,
                         int64_t *n_out) {
    if (!t || !n_out || cap < 0 || (!buf && cap > 0))
        return cart_fail(CART_E_ARG, "cart_tokenizer_piece: bad arguments");
    *n_out = 0;
    if (!valid_id(t, id))
        return cart_fail(CART_E_ARG, "cart_tokenizer_piece: token id %d is outside 0..%lld", id,
                         (long long)t->n_vocab - 1);
    bytebuf b = {0};
    int rc = piece_append(t, id, (flags & CART_TOKENIZE_UNPARSE_SPECIAL) != 0, 0, &b);
    if (rc == CART_OK) copy_out(b.p, b.n, buf, cap, n_out);
    free(b.p);
    return rc;
}

/* llama.cpp's clean_spaces passes over the detokenized bytes p[0..n); returns
 * the new length. */
static int64_t clean_spaces(uint8_t *p, int64_t n) {
    /* " ?", " !", " .", " ," lose the space */
    int64_t total = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        uint8_t x = p[i];
        if (p[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        p[total++] = x;
    }
    /* " ' " becomes "'" */
    n = total;
    total = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        uint8_t x = p[i];
        if (x == '\'' && i + 1 < n && p[i - 1] == ' ' && p[i + 1] == ' ') {
            total--;
            p[++i] = '\0';
        }
        p[total++] = x;
    }
    /* " 's", " 'm", " 're", " 've" lose the space */
    n = total;
    total = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        uint8_t x = p[i];
        if (p[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            uint8_t x1 = p[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
                uint8_t x2 = p[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        p[total++] = x;
    }
    return total;
}

int cart_tokenizer_decode(const cart_tokenizer *t, const int32_t *ids, int64_t n, int32_t flags,
                          char *buf, int64_t cap, int64_t *n_out) {
    if (!t || !n_out || n < 0 || cap < 0 || (!ids && n > 0) || (!buf && cap > 0))
        return cart_fail(CART_E_ARG, "cart_tokenizer_decode: bad arguments");
    *n_out = 0;
    for (int64_t i = 0; i < n; i++)
        if (!valid_id(t, ids[i]))
            return cart_fail(CART_E_ARG, "cart_tokenizer_decode: ids[%lld] = %d is outside 0..%lld",
                             (long long)i, ids[i], (long long)t->n_vocab - 1);
    int special = (flags & CART_TOKENIZE_UNPARSE_SPECIAL) != 0;
    int remove_space = t->add_space_prefix;
    if ((flags & CART_TOKENIZE_REMOVE_SPECIAL) && t->add_bos && n > 0 && ids[0] == t->bos) {
        remove_space = 0;
        ids++;
        n--;
    }
    if ((flags & CART_TOKENIZE_REMOVE_SPECIAL) && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;
    bytebuf b = {0};
    int rc = CART_OK;
    for (int64_t i = 0; i < n && rc == CART_OK; i++) {
        rc = piece_append(t, ids[i], special, remove_space, &b);
        remove_space = 0;
    }
    if (rc == CART_OK) {
        if (t->clean_spaces) b.n = clean_spaces(b.p, b.n);
        copy_out(b.p, b.n, buf, cap, n_out);
    }
    free(b.p);
    return rc;
}

