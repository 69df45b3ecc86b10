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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "tokenizer.h"
#include "unicode_data.h"

/* llama.cpp's llama_token_attr bits (the ones this engine uses). */
enum {
    ATTR_UNKNOWN = 1,
    ATTR_UNUSED = 2,
    ATTR_NORMAL = 4,
    ATTR_CONTROL = 8,
    ATTR_USER_DEFINED = 16,
    ATTR_BYTE = 32
};

/* Pre-tokenizers of the BPE models (llama.cpp's LLAMA_VOCAB_PRE_TYPE_*).
 * PRE_GEMMA4 is SentencePiece-style BPE: spaces become U+2581, the text is
 * split only into runs of newlines and runs of the rest, merges work on the
 * raw UTF-8 characters (no GPT-2 byte symbols) and unmatched bytes fall back
 * to <0xNN> tokens. */
enum { PRE_DEFAULT = 0, PRE_GPT2 = 1, PRE_LLAMA3 = 2, PRE_QWEN2 = 3, PRE_GEMMA4 = 4 };

/* One slot of the text -> id table: `tag` is the high half of the text's hash;
 * the text is pool[off .. off + len). id1 is the id + 1, 0 in an empty slot
 * (so that a calloc'ed table is empty). */
typedef struct tok_slot {
    uint32_t tag;
    int32_t id1;
    uint32_t off, len;
} tok_slot;

/* One slot of the merge table, keyed by the two token ids
 * ((left + 1) << 32 | (right + 1)); key 0 marks an empty slot. `result` is the
 * id of the merged text (-1 when the vocabulary lacks it). */
typedef struct merge_slot {
    uint64_t key;
    int32_t rank;
    int32_t result;
} merge_slot;

/* A merge one of whose sides is not a token text (kept by text; such merges
 * are rare: none in the Qwen3 vocabulary). Texts are in the string pool. */
typedef struct text_merge {
    uint64_t hash; /* of both texts; 0 marks an empty slot */
    uint64_t a_off, b_off;
    uint32_t a_len, b_len;
    int32_t rank, result;
} text_merge;

struct cart_tokenizer {
    int32_t kind; /* CART_TOKENIZER_BPE or CART_TOKENIZER_SPM */
    int32_t pre;  /* PRE_* (BPE only) */
    int32_t raw;  /* PRE_GEMMA4: symbols are raw UTF-8, spaces are U+2581, bytes <0xNN> */
    int64_t n_vocab;
    char *pool;    /* (pool_size) every token text, each followed by a NUL */
    uint32_t *off; /* (n_vocab + 1) token i is pool[off[i] .. off[i + 1] - 1) */
    float *scores; /* (n_vocab) SentencePiece scores (0 when absent), or NULL for BPE */
    uint8_t *attr; /* (n_vocab) ATTR_* bits */
    uint8_t *eog;  /* (n_vocab) 1 for end-of-generation ids */
    tok_slot *tok; /* (tok_mask + 1) text -> id, a table_alloc block */
    uint64_t tok_mask;
    merge_slot *merge; /* (merge_mask + 1) BPE merges by id pair, a table_alloc block */
    uint64_t merge_mask;
    text_merge *tmerge; /* (tmerge_mask + 1) BPE merges by text, or NULL */
    uint64_t tmerge_mask;
    char *tpool;      /* the texts of tmerge */
    int32_t *special; /* (n_special) CONTROL/USER_DEFINED/UNKNOWN ids, longest first */
    int64_t n_special;
    int32_t byte_id[256]; /* BPE: id of the GPT-2 symbol of each byte; SPM: <0xNN> */
    int32_t bos, eos, unk;
    int32_t add_bos, add_eos, add_space_prefix, clean_spaces, ignore_merges;
    int32_t spm_split; /* SPM: no token has U+2581 after anything but U+2581 */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* A 64-bit hash of n bytes. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xbf58476d1ce4e5b9ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0x94d049bb133111ebull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = 0;
        memcpy(&v, s, n);
        h = (h ^ v) * 0x94d049bb133111ebull;
    }
    return mix64(h);
}

/* The smallest power of two >= 1.5 n (at least 16): a table at most 2/3 full
 * (smaller tables load faster: fewer fresh pages to fault in). */
static uint64_t table_size(uint64_t n) {
    uint64_t size = 16;
    while (size < n + n / 2) size <<= 1;
    return size;
}

/* Zeroed memory for a hash table of `size` bytes. Big tables are mapped
 * directly and marked for transparent huge pages: filling the Qwen3 tables
 * then faults a few 2 MiB pages instead of two thousand 4 KiB ones, which is
 * most of the load time on a VM. Free with table_free(p, size). */
static void *table_alloc(size_t size, const char *what) {
    if (size < (1u << 20)) return cart_calloc(1, size, what);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        cart_fail(CART_E_NOMEM, "out of memory: %s (%zu bytes)", what, size);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

static void table_free(void *p, size_t size) {
    if (!p) return;
    if (size < (1u << 20))
        free(p);
    else
        munmap(p, size);
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t)((uint32_t)a + 1) << 32 | ((uint32_t)b + 1);
}

static inline int64_t text_len(const cart_tokenizer *t, int32_t id) {
    return (int64_t)(t->off[id + 1] - t->off[id]) - 1;
}

static inline const char *text_of(const cart_tokenizer *t, int32_t id) {
    return t->pool + t->off[id];
}

/* The id whose text is the n bytes at s (hash h = hash_bytes(s, n)), or -1. */
static int32_t lookup_hashed(const cart_tokenizer *t, const void *s, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_mask;; i = (i + 1) & t->tok_mask) {
        const tok_slot *slot = &t->tok[i];
        if (slot->id1 == 0) return -1;
        if (slot->tag == tag && slot->len == n && memcmp(t->pool + slot->off, s, n) == 0)
            return slot->id1 - 1;
    }
}

/* The id whose text is the n bytes at s, or -1. */
static int32_t lookup(const cart_tokenizer *t, const void *s, size_t n) {
    return lookup_hashed(t, s, n, hash_bytes(s, n));
}

static inline int merge_find(const cart_tokenizer *t, int32_t a, int32_t b, int32_t *rank,
                             int32_t *result) {
    uint64_t key = pair_key(a, b);
    for (uint64_t i = mix64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *slot = &t->merge[i];
        if (slot->key == 0) return 0;
        if (slot->key == key) {
            *rank = slot->rank;
            *result = slot->result;
            return 1;
        }
    }
}

static uint64_t text_pair_hash(const char *a, size_t an, const char *b, size_t bn) {
    uint64_t h = mix64(hash_bytes(a, an) ^ (hash_bytes(b, bn) * 0x9E3779B97F4A7C15ull));
    return h ? h : 1;
}

static int tmerge_find(const cart_tokenizer *t, const char *a, size_t an, const char *b, size_t bn,
                       int32_t *rank, int32_t *result) {
    if (!t->tmerge) return 0;
    uint64_t h = text_pair_hash(a, an, b, bn);
    for (uint64_t i = h & t->tmerge_mask;; i = (i + 1) & t->tmerge_mask) {
        const text_merge *m = &t->tmerge[i];
        if (m->hash == 0) return 0;
        if (m->hash == h && m->a_len == an && m->b_len == bn &&
            memcmp(t->tpool + m->a_off, a, an) == 0 && memcmp(t->tpool + m->b_off, b, bn) == 0) {
            *rank = m->rank;
            *result = m->result;
            return 1;
        }
    }
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
 * (0..0x20, 0x7F..0xA0, 0xAD) become U+0100.. in byte order. */
static uint32_t byte_symbol(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 0x21 + (b - 0x7F);
    return 0x143; /* 0xAD */
}

/* The byte a GPT-2 symbol stands for, or -1. */
static int symbol_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(0x7F + cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* Writes the UTF-8 form of cp (surrogates included, as llama.cpp's
 * unicode_cpt_to_utf8 does; cp <= 0x10FFFF) to out; returns its length. */
static int utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the code point at s[i] (i < end) as llama.cpp's unicode_cpt_from_utf8
 * does: the lead byte says the length, continuation bytes must be 10xxxxxx and
 * inside [i, end), and nothing else is checked (overlong forms and surrogates
 * decode as they stand). A byte that cannot start a sequence, a broken or
 * truncated sequence, and (unlike llama.cpp, which aborts) a value above
 * U+10FFFF give U+FFFD for one byte. *len gets the bytes consumed. */
static inline uint32_t decode_cp(const uint8_t *s, int64_t end, int64_t i, int *len) {
    uint8_t b = s[i];
    *len = 1;
    if (b < 0x80) return b;
    if (!(b & 0x40)) return 0xFFFD;
    if (!(b & 0x20)) {
        if (i + 1 >= end || (s[i + 1] & 0xC0) != 0x80) return 0xFFFD;
        *len = 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (!(b & 0x10)) {
        if (i + 2 >= end || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0xFFFD;
        *len = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) |
               (s[i + 2] & 0x3F);
    }
    if (!(b & 0x08)) {
        if (i + 3 >= end || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
            (s[i + 3] & 0xC0) != 0x80)
            return 0xFFFD;
        uint32_t cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                      ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
        if (cp > 0x10FFFF) return 0xFFFD;
        *len = 4;
        return cp;
    }
    return 0xFFFD;
}

/* The length of the UTF-8 sequence a lead byte announces, as llama.cpp's
 * unicode_len_utf8 (1 for continuation and invalid bytes, 4 for F8..FF). */
static inline int lead_len(uint8_t b) {
    static const uint8_t lengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lengths[b >> 4];
}

/* Whether the 3 bytes at p are U+2581, SentencePiece's space. */
static inline int is_u2581(const uint8_t *p) {
    return p[0] == 0xE2 && p[1] == 0x96 && p[2] == 0x81;
}

/* A growable byte buffer. */
typedef struct bytebuf {
    uint8_t *p;
    int64_t n, cap;
} bytebuf;

static int buf_reserve(bytebuf *b, int64_t extra) {
    if (b->n + extra <= b->cap) return CART_OK;
    int64_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    uint8_t *p = cart_realloc(b->p, (size_t)cap, "tokenizer buffer");
    if (!p) return CART_E_NOMEM;
    b->p = p;
    b->cap = cap;
    return CART_OK;
}

static int buf_put(bytebuf *b, const void *s, int64_t n) {
    int rc = buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return CART_OK;
}

/* Ensures *p (elements of `size` bytes, capacity *cap) holds at least n. */
static int grow(void **p, int64_t *cap, int64_t n, size_t size, const char *what) {
    if (n <= *cap) return CART_OK;
    int64_t c = *cap ? *cap : 64;
    while (c < n) c *= 2;
    void *q = cart_realloc(*p, (size_t)c * size, what);
    if (!q) return CART_E_NOMEM;
    *p = q;
    *cap = c;
    return CART_OK;
}

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
