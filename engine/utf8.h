/*
 * utf8.h - UTF-8 validation and safe cut points for streamed text.
 */
#ifndef CART_UTF8_H
#define CART_UTF8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns -1 when the len bytes at s are well-formed UTF-8 (no overlong forms,
 * no surrogates, nothing above U+10FFFF, no truncated sequence), else the
 * byte offset of the first byte that breaks the rule. */
int64_t cart_utf8_invalid_offset(const char *s, int64_t len);

/* The length of the longest prefix of s that does not end inside an
 * incomplete UTF-8 sequence: a streaming decoder prints that much and holds
 * the rest back until more bytes arrive. Bytes that can never complete a
 * character (invalid ones) are not held back. */
int64_t cart_utf8_complete_prefix(const char *s, int64_t len);

/* Copies s to out with every ill-formed part replaced by U+FFFD (EF BF BD),
 * one per maximal subpart as Unicode 3.9 and the WHATWG decoder count them
 * (a truncated sequence at the end becomes one U+FFFD). Returns the bytes
 * written; out must hold 3 * len bytes. Well-formed input is copied as is. */
int64_t cart_utf8_sanitize(const char *s, int64_t len, char *out);

#ifdef __cplusplus
}
#endif

#endif
