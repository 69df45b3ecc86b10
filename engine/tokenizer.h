/*
 * tokenizer.h - text <-> token ids, from a GGUF's own tokenizer.* metadata.
 *
 * Models:
 *   "gpt2"  byte-level BPE (tokenizer.ggml.tokens / merges / token_type), with
 *           the pre-tokenizer named by tokenizer.ggml.pre: "qwen2" (Qwen2 and
 *           Qwen3), "llama-bpe" (Llama 3) and "default"/absent (GPT-2's);
 *   "llama" SentencePiece (tokens / scores / token_type) with byte fallback
 *           (<0xNN> tokens) and the add_space_prefix rule;
 *   "gemma4" gemma 4's BPE (tokens / merges / token_type): spaces become
 *           U+2581, the text splits only at newline runs, merges work on
 *           UTF-8 characters, unmatched bytes fall back to <0xNN> tokens, and
 *           BOS is always added (also "gpt2" with tokenizer.ggml.pre
 *           "gemma4"). Its kind is CART_TOKENIZER_BPE, as in llama.cpp.
 * Anything else is CART_E_UNSUPPORTED naming the model and the supported ones.
 *
 * Behaviour matches llama.cpp's llama_tokenize / llama_detokenize /
 * llama_token_to_piece, including its quirks (see ../shared/reference/README):
 * CONTROL and USER_DEFINED tokens are matched as single ids before
 * pre-tokenization when the caller asks (longest text first); a NORMAL token
 * whose text looks like a control token ("</s>" in Qwen3) is treated as
 * CONTROL and end-of-generation; no Unicode normalization.
 *
 * Ids are int32_t. Output buffers follow one rule: the function writes at most
 * `cap` items, always stores the full count in *n_out, and returns CART_OK; a
 * caller whose buffer was too small calls again with cap >= *n_out.
 */
#ifndef CART_TOKENIZER_H
#define CART_TOKENIZER_H

#include <stdint.h>
#include "common.h"
#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_tokenizer_kind {
    CART_TOKENIZER_BPE = 1, /* gpt2 byte-level BPE, and gemma4's BPE */
    CART_TOKENIZER_SPM = 2  /* llama SentencePiece */
} cart_tokenizer_kind;

/* GGUF token types (tokenizer.ggml.token_type). */
typedef enum cart_token_type {
    CART_TOKEN_UNDEFINED = 0,
    CART_TOKEN_NORMAL = 1,
    CART_TOKEN_UNKNOWN = 2,
    CART_TOKEN_CONTROL = 3,
    CART_TOKEN_USER_DEFINED = 4,
    CART_TOKEN_UNUSED = 5,
    CART_TOKEN_BYTE = 6
} cart_token_type;

typedef enum cart_tokenize_flags {
    CART_TOKENIZE_PARSE_SPECIAL = 1, /* encode: match CONTROL/USER_DEFINED texts as single ids */
    CART_TOKENIZE_ADD_SPECIAL = 2,   /* encode: add BOS/EOS as the model's add_bos/add_eos say */
    CART_TOKENIZE_UNPARSE_SPECIAL = 4, /* decode/piece: render CONTROL tokens as their text */
    CART_TOKENIZE_REMOVE_SPECIAL = 8 /* decode: drop a leading BOS / trailing EOS the model adds */
} cart_tokenize_flags;

typedef struct cart_tokenizer cart_tokenizer;

/* Builds a tokenizer from g's tokenizer.* metadata. The tokenizer copies what
 * it needs; g may be closed afterwards. Errors name the missing or malformed
 * key. */
int cart_tokenizer_load(cart_tokenizer **out, const cart_gguf *g);
void cart_tokenizer_free(cart_tokenizer *t);

int32_t cart_tokenizer_kind_of(const cart_tokenizer *t);
int64_t cart_tokenizer_vocab_size(const cart_tokenizer *t);

/* Special ids (-1 when the model has none) and the add_bos/add_eos policy. */
int32_t cart_tokenizer_bos(const cart_tokenizer *t);
int32_t cart_tokenizer_eos(const cart_tokenizer *t);
int32_t cart_tokenizer_adds_bos(const cart_tokenizer *t);
int32_t cart_tokenizer_adds_eos(const cart_tokenizer *t);

/* The stored text of a token (borrowed, lives with t; empty for a bad id),
 * its cart_token_type (after llama.cpp's control-looking fix-up), and whether
 * it ends generation (eos, eot, eom and the control-looking ones like
 * <|im_end|>, <|endoftext|>, </s>). */
cart_str cart_tokenizer_text(const cart_tokenizer *t, int32_t id);
int32_t cart_tokenizer_token_type(const cart_tokenizer *t, int32_t id);
int32_t cart_tokenizer_is_eog(const cart_tokenizer *t, int32_t id);

/* The id whose stored text is exactly `text` (len bytes), or -1. */
int32_t cart_tokenizer_find(const cart_tokenizer *t, const char *text, int64_t len);

/* Encodes len bytes of text (any bytes; invalid UTF-8 handled as llama.cpp
 * does, never a crash) into ids. flags: CART_TOKENIZE_PARSE_SPECIAL,
 * CART_TOKENIZE_ADD_SPECIAL. */
int cart_tokenizer_encode(const cart_tokenizer *t, const char *text, int64_t len, int32_t flags,
                          int32_t *ids, int64_t cap, int64_t *n_out);

/* As cart_tokenizer_encode, except that a CONTROL (or unknown-type) token
 * whose text overlaps one of the n_plain byte ranges [plain[2i],
 * plain[2i + 1]) is not matched there: those bytes are encoded as text, as
 * without CART_TOKENIZE_PARSE_SPECIAL. The ranges must be sorted, disjoint
 * and within the text (else CART_E_ARG). For a rendered chat whose
 * template markers are special and whose messages' contents are plain: a
 * client cannot forge a turn by writing "<|im_start|>". Text outside the
 * ranges, and every text without such a token inside them, is encoded
 * exactly as cart_tokenizer_encode does. */
int cart_tokenizer_encode_plain(const cart_tokenizer *t, const char *text, int64_t len, int32_t flags,
                                const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                int64_t *n_out);

/* The bytes of one token as llama_token_to_piece(lstrip = 0) gives them;
 * CART_TOKENIZE_UNPARSE_SPECIAL renders CONTROL tokens (otherwise empty). */
int cart_tokenizer_piece(const cart_tokenizer *t, int32_t id, int32_t flags, char *buf,
                         int64_t cap, int64_t *n_out);

/* The bytes of a whole id sequence as llama_detokenize gives them (for
 * SentencePiece the leading space of the first token is removed).
 * flags: CART_TOKENIZE_UNPARSE_SPECIAL, CART_TOKENIZE_REMOVE_SPECIAL. */
int cart_tokenizer_decode(const cart_tokenizer *t, const int32_t *ids, int64_t n, int32_t flags,
                          char *buf, int64_t cap, int64_t *n_out);

#ifdef __cplusplus
}
#endif

#endif
