/*
 * grammar_internal.h - what the grammar's files share (grammar.h is the API):
 * the limits, the element array a schema compiles to, the vocabulary's
 * tries, and the lexical steps of JSON numbers and strings.
 *
 *   grammar_schema.c  JSON Schema -> the element array, and its analysis
 *   grammar_lex.c     JSON numbers within bounds, JSON strings by code points
 *   grammar_vocab.c   the vocabulary's tries and per-length string masks
 *   grammar_match.c   the matcher: byte steps, the token mask, commits
 *
 * The grammar. A schema compiles to a flat array of elements. A sequence is
 * a run of elements ended by E_END; a rule is a set of alternative
 * sequences. The elements:
 *   E_LIT     a literal byte string: "{", ":", "\"key\""
 *   E_RULE    a call: one alternative of the rule, then what follows
 *   E_STRING  a whole JSON string, quotes included, of minLength..maxLength
 *             code points (escapes count one)
 *   E_NUMBER  a JSON number, integer or not, with bounds
 *   E_WS      one whitespace chunk: nothing, " ", or "\n" and up to 20
 *             spaces or tabs
 *   E_CHOICE  one of a set of literal texts, kept as a byte trie (enum,
 *             const, true/false/null)
 *   E_OBJECT  the members of an object: declared properties in schema
 *             order (optional ones may be left out), then free-form
 *             members where allowed; commas between them
 *   E_ARRAY   minItems..maxItems items, commas between them
 * An object value is the sequence  "{" WS OBJECT "}"  (called as a rule), a
 * member  [",", WS,] "\"key\"" WS ":" WS value WS  (the comma when another
 * member came first), an array  "[" WS ARRAY "]"  and an item  [",", WS,]
 * value WS.
 *
 * Not part of the API: hidden, never exported from libcartridge.
 */
#ifndef CART_GRAMMAR_INTERNAL_H
#define CART_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "grammar.h"

#pragma GCC visibility push(hidden)

__extension__ typedef __int128 i128;


enum {
    MAX_DEPTH = 256,          /* frames on a stack */
    MAX_SCHEMA_DEPTH = 64,    /* nested subschemas while compiling */
    MAX_ENUM = 10000,         /* values of one enum */
    MAX_PARTS = 1 << 20,      /* elements, rules, choice nodes, literal bytes / 16 */
    MAX_STACKS = 1024,        /* stacks of one state */
    MAX_EXPAND = 1 << 16,     /* frames one byte step may create */
    WS_INDENT = 20,           /* spaces or tabs after a newline */
    NUM_DIGITS = 16,          /* integer digits, and fraction digits */
    PLAIN_R = 32,             /* per-count plain masks kept for 1..PLAIN_R */
    MAX_TOKEN_BYTES = 65535,
};

#define UNBOUNDED UINT32_MAX                   /* no upper bound */
#define INFEASIBLE ((uint16_t)(MAX_DEPTH + 1)) /* no finite completion */

enum { E_END, E_LIT, E_RULE, E_STRING, E_NUMBER, E_WS, E_CHOICE, E_OBJECT, E_ARRAY };

typedef struct elem {
    uint8_t kind;
    uint32_t a; /* LIT: offset in lits; RULE: rule; STRING/NUMBER/OBJECT/ARRAY: spec; CHOICE: root node */
    uint32_t b; /* LIT: length */
} elem;

typedef struct rule {
    uint32_t first; /* into alts */
    uint32_t n;
} rule;

typedef struct str_spec {
    uint32_t min, max; /* code points; max UNBOUNDED */
} str_spec;

typedef struct num_spec {
    uint8_t integer; /* no fraction */
    uint8_t bounded; /* min/max given: no exponent, feasibility checked */
    i128 lo, hi;     /* value bounds, in units of 1 (integer) or 10^-16 (number) */
} num_spec;

typedef struct obj_spec {
    uint32_t first, n;   /* members[first .. first+n) */
    int32_t last_req;    /* index of the last required member, -1 when none */
    int32_t extra;       /* sequence of a free-form member, -1 when none */
} obj_spec;

typedef struct member {
    uint32_t seq; /* the member's sequence, comma first; +2 skips ", WS" */
    uint8_t required;
} member;

typedef struct arr_spec {
    uint32_t seq; /* the item's sequence, comma first; +2 skips ", WS" */
    uint32_t min, max;
} arr_spec;

typedef struct cnode {
    uint32_t child, sibling; /* 0: none (node 0 is never a child) */
    uint8_t byte, final;
} cnode;

#define ARRAY_OF(type) \
    struct {           \
        type *p;       \
        uint32_t n, cap; \
    }

struct cart_grammar {
    ARRAY_OF(elem) elems;
    ARRAY_OF(uint32_t) alts;
    ARRAY_OF(rule) rules;
    ARRAY_OF(uint8_t) lits;
    ARRAY_OF(str_spec) strs;
    ARRAY_OF(num_spec) nums;
    ARRAY_OF(obj_spec) objs;
    ARRAY_OF(member) members;
    ARRAY_OF(arr_spec) arrs;
    ARRAY_OF(cnode) cnodes;
    uint16_t *need;    /* per element: least extra stack depth to finish its sequence from it */
    uint16_t *rneed;   /* per rule: least extra depth a call needs */
    uint32_t root;     /* position of the root sequence */
    int64_t max_bytes; /* -1: unbounded */
};


/* ---- the vocabulary (grammar_vocab.c) ----------------------------------- */

typedef struct trie {
    uint32_t n;          /* nodes; node 0 is the root */
    uint8_t *byte;       /* (n) the byte on the edge into the node */
    uint16_t *depth;     /* (n) */
    uint32_t *skip;      /* (n) the first node after the subtree */
    uint32_t *tok_start; /* (n + 1) the tokens ending at node k: ids[tok_start[k] .. tok_start[k + 1]) */
    int32_t *ids;
    uint16_t max_depth;
} trie;

typedef struct long_plain {
    int32_t id;
    uint32_t chars;
} long_plain;

struct cart_vocab {
    int64_t n, words;
    char *bytes;        /* every token's bytes */
    int64_t *offsets;   /* (n + 1) */
    trie all, special;  /* every allowed-able token; those that are not plain */
    int32_t *eog;
    int64_t n_eog;
    uint32_t *plain_le; /* (PLAIN_R + 1) x words: plain tokens of at most r code points */
    uint32_t *plain_all;
    uint32_t max_plain;
    long_plain *plain_long; /* plain tokens above PLAIN_R code points, fewest first */
    int64_t n_plain_long;
};

/* ---- JSON numbers and strings (grammar_lex.c) --------------------------- */

#define GR_SCALE ((i128)10000000000000000LL) /* 10^16: the fixed point of bounds */

/* Bounds (grammar_lex.c): the largest magnitude a number of this kind can
 * be written with (NUM_DIGITS digits; GR_SCALE units unless integer); the
 * least scaled X whose double, as a JSON parser rounds it, is >= b, and the
 * greatest whose double is <= b; i128 division rounding down and up. */
i128 cart_gr_max_magnitude(int integer);
i128 cart_gr_scaled_min_incl(double b);
i128 cart_gr_scaled_max_incl(double b);
i128 cart_gr_floor_div(i128 a, i128 d);
i128 cart_gr_ceil_div(i128 a, i128 d);

/* A number frame (state a, the digits' values I and F): whether it is a
 * complete number within the bounds; whether some byte can continue it;
 * one byte of it (1 and the new state, or 0). */
int cart_gr_number_complete(const num_spec *s, uint32_t a, int64_t I, int64_t F);
int cart_gr_number_open(const num_spec *s, uint32_t a, int64_t I, int64_t F);
int cart_gr_number_step(const num_spec *s, uint32_t a, int64_t I, int64_t F, uint8_t c, uint32_t *na,
                        int64_t *nI, int64_t *nF);

/* String frame state: `a` counts code points; `b` packs
 *   bits 0-3   escape: 0 none, 1 after a backslash, 2..5 after \u and 0..3 hex digits
 *   bit 4      the first \u hex digit was d/D (the next must be 0-7: no surrogates)
 *   bits 8-15  the UTF-8 state
 *   bits 16-17 phase: 0 before the opening quote, 1 in the body */
#define S_ESC(b) ((b) & 15u)
#define S_DHI(b) (((b) >> 4) & 1u)
#define S_UTF(b) (((b) >> 8) & 255u)
#define S_PHASE(b) ((b) >> 16)
#define S_PACK(esc, dhi, utf, phase) \
    ((uint32_t)(esc) | (uint32_t)(dhi) << 4 | (uint32_t)(utf) << 8 | (uint32_t)(phase) << 16)
#define S_BOUNDARY (1u << 16) /* in the body, at a character boundary */

enum { STR_DEAD, STR_MORE, STR_CLOSED };

/* Strings (grammar_lex.c): a hex digit; one byte of UTF-8 from state *st
 * (1 and the new state, *started = 1 when the byte begins a character; 0
 * when the byte is ill-formed there); one byte of a JSON string (STR_MORE
 * with the new (a, b), STR_CLOSED at the closing quote, or STR_DEAD). */
int cart_gr_is_hex(uint8_t c);
int cart_gr_utf8_step(uint32_t *st, uint8_t c, int *started);
int cart_gr_string_step(const str_spec *s, uint32_t a, uint32_t b, uint8_t c, uint32_t *na, uint32_t *nb);

#pragma GCC visibility pop

#endif
