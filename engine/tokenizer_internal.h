/*
 * tokenizer_internal.h - what the tokenizer's files share (tokenizer.h is
 * the API): the tokenizer object, its hash tables and the small helpers
 * over them and over UTF-8.
 *
 *   tokenizer_load.c  a GGUF's tokenizer.* metadata -> the object
 *   tokenizer.c       accessors, encoding (the special-token partition and
 *                     the pre-tokenizers and merges), decoding
 *
 * Not part of the API: hidden, never exported from libcartridge.
 */
#ifndef CART_TOKENIZER_INTERNAL_H
#define CART_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "tokenizer.h"
#include "unicode_data.h"

#pragma GCC visibility push(hidden)


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
static inline uint64_t hash_bytes(const void *p, size_t n) {
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
static inline uint64_t table_size(uint64_t n) {
    uint64_t size = 16;
    while (size < n + n / 2) size <<= 1;
    return size;
}

/* Zeroed memory for a hash table of `size` bytes. Big tables are mapped
 * directly and marked for transparent huge pages: filling the Qwen3 tables
 * then faults a few 2 MiB pages instead of two thousand 4 KiB ones, which is
 * most of the load time on a VM. Free with table_free(p, size). */
static inline void *table_alloc(size_t size, const char *what) {
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

static inline void table_free(void *p, size_t size) {
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
static inline int32_t lookup_hashed(const cart_tokenizer *t, const void *s, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_mask;; i = (i + 1) & t->tok_mask) {
        const tok_slot *slot = &t->tok[i];
        if (slot->id1 == 0) return -1;
        if (slot->tag == tag && slot->len == n && memcmp(t->pool + slot->off, s, n) == 0)
            return slot->id1 - 1;
    }
}

/* The id whose text is the n bytes at s, or -1. */
static inline int32_t lookup(const cart_tokenizer *t, const void *s, size_t n) {
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

static inline uint64_t text_pair_hash(const char *a, size_t an, const char *b, size_t bn) {
    uint64_t h = mix64(hash_bytes(a, an) ^ (hash_bytes(b, bn) * 0x9E3779B97F4A7C15ull));
    return h ? h : 1;
}

static inline int tmerge_find(const cart_tokenizer *t, const char *a, size_t an, const char *b, size_t bn,
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
static inline uint32_t byte_symbol(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 0x21 + (b - 0x7F);
    return 0x143; /* 0xAD */
}

/* The byte a GPT-2 symbol stands for, or -1. */
static inline int symbol_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(0x7F + cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* Writes the UTF-8 form of cp (surrogates included, as llama.cpp's
 * unicode_cpt_to_utf8 does; cp <= 0x10FFFF) to out; returns its length. */
static inline int utf8_encode(uint32_t cp, uint8_t *out) {
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

static inline int buf_reserve(bytebuf *b, int64_t extra) {
    if (b->n + extra <= b->cap) return CART_OK;
    int64_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    uint8_t *p = cart_realloc(b->p, (size_t)cap, "tokenizer buffer");
    if (!p) return CART_E_NOMEM;
    b->p = p;
    b->cap = cap;
    return CART_OK;
}

static inline int buf_put(bytebuf *b, const void *s, int64_t n) {
    int rc = buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return CART_OK;
}

/* Ensures *p (elements of `size` bytes, capacity *cap) holds at least n. */
static inline int grow(void **p, int64_t *cap, int64_t n, size_t size, const char *what) {
    if (n <= *cap) return CART_OK;
    int64_t c = *cap ? *cap : 64;
    while (c < n) c *= 2;
    void *q = cart_realloc(*p, (size_t)c * size, what);
    if (!q) return CART_E_NOMEM;
    *p = q;
    *cap = c;
    return CART_OK;
}

#pragma GCC visibility pop

#endif
