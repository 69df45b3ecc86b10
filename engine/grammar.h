/*
 * grammar.h - structured output: JSON documents that a JSON Schema accepts,
 * enforced token by token while decoding.
 *
 * Three objects, each immutable or owned by one decoding:
 *   cart_grammar  a compiled JSON Schema (or "any JSON object"); immutable,
 *                 shareable by any number of matchers and threads;
 *   cart_vocab    the byte strings of a vocabulary's tokens, arranged in two
 *                 byte tries (every token, and the tokens a JSON string's
 *                 body cannot take whole) and per-length masks of the rest;
 *                 built once per tokenizer, immutable, shareable;
 *   cart_matcher  where one document stands: the grammar's state after the
 *                 bytes accepted so far. It borrows its grammar and vocab,
 *                 which must outlive it.
 *
 * Each decoding step: cart_matcher_mask writes the set of tokens that can
 * continue the document (a token is allowed iff all its bytes can be
 * consumed; an end-of-generation token iff the document is complete), the
 * sampler picks among them (cart_sampler_sample_masked in sampler.h), and
 * cart_matcher_accept advances by the chosen token.
 *
 * The documents. The grammar writes compact JSON with bounded insignificant
 * whitespace: between two JSON tokens inside an object or array (after "{",
 * "[", ",", ":", a key or a value) there is at most one whitespace chunk:
 * nothing, one space, or one newline followed by at most 20 spaces or tabs
 * (llama.cpp's JSON grammars bound it the same way). There is none before
 * or after the top-level value. Numbers have at most 16 integer and 16
 * fraction digits; a number with no bounds may carry an exponent of at most
 * 2 digits. Strings are UTF-8 with JSON's escapes; \u escapes of surrogates
 * are not written (a character outside the BMP is written as UTF-8). So a
 * schema whose strings all have maxLength, whose arrays all have maxItems
 * and which does not recurse has a longest document, cart_grammar_max_bytes,
 * and every decoding under it ends within that many tokens plus one (an
 * end-of-generation token).
 *
 * The JSON Schema subset (OpenAI's strict mode and a little more):
 *   type: object, array, string, number, integer, boolean, null, or an
 *     array of these (anyOf of each); without type, the keywords present
 *     decide (properties -> object, items -> array, ...), or any value;
 *   object: properties (written in their schema order), required,
 *     additionalProperties (false; true or a schema adds free-form
 *     members only to an object that declares no properties);
 *   array: items, minItems, maxItems;
 *   string: minLength, maxLength (in code points, as JSON Schema counts);
 *   number, integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum,
 *     compared as a JSON parser's double of the written number compares;
 *   enum, const (any JSON values, written compactly);
 *   anyOf; $ref to "#" or any JSON pointer in the document ($defs,
 *     definitions), recursion included;
 *   boolean schemas (true: any value; false: none); annotations (title,
 *     description, default, examples, $schema, $id, $comment, deprecated,
 *     readOnly, writeOnly) are ignored.
 * Any other keyword (pattern, format, multipleOf, oneOf, allOf, not,
 * patternProperties, minProperties, uniqueItems, prefixItems, ...) is
 * refused with CART_E_UNSUPPORTED and a message naming it and its JSON
 * pointer ("#/properties/age: 'multipleOf' is not supported ..."), unless
 * CART_GRAMMAR_LENIENT is given: then it is ignored (the documents are then
 * valid JSON of the schema's shape but may break that keyword; oneOf is read
 * as anyOf). Malformed schemas (a keyword of the wrong JSON type, a number
 * JSON doubles cannot hold, minimum above maximum, a $ref that points
 * nowhere, a $ref that recurses with no way out, more than 64 nested
 * subschemas, an enum of more than 10,000 values, a grammar of more than a
 * million parts) are CART_E_FORMAT with a message naming the place.
 */
#ifndef CART_GRAMMAR_H
#define CART_GRAMMAR_H

#include <stdint.h>
#include "common.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_grammar_flags {
    CART_GRAMMAR_LENIENT = 1 /* ignore unsupported keywords instead of refusing them */
} cart_grammar_flags;

typedef struct cart_grammar cart_grammar;
typedef struct cart_vocab cart_vocab;
typedef struct cart_matcher cart_matcher;

/* Compiles the JSON Schema in the len bytes at schema (UTF-8 JSON text)
 * into *out. flags: cart_grammar_flags. Returns CART_OK, or CART_E_FORMAT /
 * CART_E_UNSUPPORTED with a message naming the JSON pointer of the problem
 * (see above), CART_E_NOMEM. The caller frees *out with cart_grammar_free. */
int cart_grammar_from_schema(cart_grammar **out, const char *schema, int64_t len, int32_t flags);

/* The grammar of any JSON object (OpenAI's response_format json_object). */
int cart_grammar_any_object(cart_grammar **out);

void cart_grammar_free(cart_grammar *g);

/* The length in bytes of the longest document the grammar accepts, or -1
 * when documents are unbounded (a string without maxLength, an array
 * without maxItems, recursion, free-form objects). */
int64_t cart_grammar_max_bytes(const cart_grammar *g);

/* The vocabulary of a tokenizer for n_vocab token ids (a model's output
 * rows; ids the tokenizer lacks are never allowed): each token's bytes as
 * cart_tokenizer_piece gives them without special rendering, and its
 * end-of-generation flag. Tokens with no bytes that do not end generation
 * (control tokens) are never allowed. */
int cart_vocab_new(cart_vocab **out, const cart_tokenizer *tok, int64_t n_vocab);

/* The same from raw byte strings: token i is bytes[offsets[i] ..
 * offsets[i+1]) and ends generation when eog[i] is non-zero (eog may be
 * NULL). offsets has n + 1 entries, non-decreasing, from 0. */
int cart_vocab_from_pieces(cart_vocab **out, const char *bytes, const int64_t *offsets,
                           const uint8_t *eog, int64_t n);

void cart_vocab_free(cart_vocab *v);

/* The number of token ids, and the uint32 words a mask of them takes. */
int64_t cart_vocab_size(const cart_vocab *v);
int64_t cart_vocab_mask_words(const cart_vocab *v);

/* A matcher at the start of a document. g and v are borrowed and must
 * outlive it. */
int cart_matcher_new(cart_matcher **out, const cart_grammar *g, const cart_vocab *v);
void cart_matcher_free(cart_matcher *m);

/* Back to the start of a document. */
void cart_matcher_reset(cart_matcher *m);

/* Writes the tokens that can continue the document as bits: token i is
 * allowed iff bit (i % 32) of mask[i / 32] is set. n_words must be at least
 * cart_vocab_mask_words. *n_allowed (may be NULL) gets the number of
 * allowed tokens; 0 only when the vocabulary lacks the bytes or the
 * end-of-generation token the document needs. Returns CART_OK or
 * CART_E_ARG (short mask). */
int cart_matcher_mask(cart_matcher *m, uint32_t *mask, int64_t n_words, int64_t *n_allowed);

/* Advances by token id: CART_OK, or CART_E_ARG when the token cannot
 * continue the document (the matcher is then unchanged). An end-of-
 * generation token is accepted only when the document is complete, and
 * ends it. */
int cart_matcher_accept(cart_matcher *m, int32_t id);

/* Advances by raw bytes (text the caller writes itself): CART_OK, or
 * CART_E_ARG naming the first byte that cannot continue (unchanged). */
int cart_matcher_accept_bytes(cart_matcher *m, const char *bytes, int64_t len);

/* 1 when the len bytes could be accepted now, else 0; the matcher is not
 * changed. */
int32_t cart_matcher_try_bytes(cart_matcher *m, const char *bytes, int64_t len);

/* 1 when the bytes so far form a complete document (end of generation is
 * allowed), else 0. */
int32_t cart_matcher_can_end(const cart_matcher *m);

/* 1 when the document is complete and no byte can follow it (or an
 * end-of-generation token was accepted): decoding can stop here. */
int32_t cart_matcher_is_done(const cart_matcher *m);

/* Bytes accepted since the start. */
int64_t cart_matcher_bytes(const cart_matcher *m);

#ifdef __cplusplus
}
#endif

#endif
