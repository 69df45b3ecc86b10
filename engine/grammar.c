/*
 * grammar.c - JSON Schema -> grammar, vocabulary tries, the matcher (see grammar.h).
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
 * The matcher. The state of a document is a set of stacks (a schema may be
 * ambiguous: anyOf of two objects shares a prefix); a stack is a linked
 * list of frames, each a position in the element array plus the state of
 * the element there (bytes of a literal matched, code points of a string,
 * digits of a number, members of an object written...), the frame below
 * being where to go on when this sequence ends. Frames are immutable and
 * shared, so a byte step allocates only the frames that change. Every
 * stack in a state is "terminal": its top element consumes the next byte.
 * Stepping a byte consumes it on every stack, then expands each result
 * until it is terminal again (entering rules, leaving finished sequences,
 * offering each member an object may write next); reaching the bottom
 * means the document may end here. Identical stacks are merged.
 *
 * Every stack can be completed: at compile time each sequence gets the
 * least stack depth its completion needs (infinite when it has no finite
 * instance), and expansion never enters a frame whose completion would go
 * past MAX_DEPTH. So a live state always reaches a complete document, and
 * an unproductive branch (a recursive $ref with no base case under anyOf)
 * is never entered.
 *
 * The mask. The vocabulary's tokens sit in a byte trie; the mask walks it
 * depth first, stepping the state by each edge's byte and pruning a
 * subtree as soon as the state dies. Inside a free string most of a
 * vocabulary is allowed, so that case is precomputed: a "plain" token (no
 * quote, backslash or control byte, well-formed UTF-8 from a character
 * boundary, a last character possibly unfinished) can only add characters
 * to a string, so whether a string at a character boundary takes it
 * depends only on its character count; per-count masks of plain tokens
 * answer for those, and only the other tokens (a second, much smaller
 * trie) are walked.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar.h"
#include "internal.h"
#include "utf8.h"

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

static const uint32_t UNBOUNDED = UINT32_MAX;
static const uint16_t INFEASIBLE = MAX_DEPTH + 1;

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

#undef ARRAY_OF

/* Makes room for one more item in a growable array (p, n, cap); 0 on
 * success, CART_E_NOMEM or CART_E_FORMAT past MAX_PARTS. */
static int grow(void **p, uint32_t n, uint32_t *cap, size_t size, uint32_t limit) {
    if (n < *cap) return CART_OK;
    if (n >= limit)
        return cart_fail(CART_E_FORMAT, "the schema compiles to more than %u parts (a limit against hostile schemas)",
                         limit);
    uint32_t c = *cap ? *cap * 2 : 16;
    void *q = cart_realloc(*p, (size_t)c * size, "grammar");
    if (!q) return CART_E_NOMEM;
    *p = q;
    *cap = c;
    return CART_OK;
}

#define PUSH(arr, limit) grow((void **)&(arr).p, (arr).n, &(arr).cap, sizeof *(arr).p, (limit))

void cart_grammar_free(cart_grammar *g) {
    if (!g) return;
    free(g->elems.p);
    free(g->alts.p);
    free(g->rules.p);
    free(g->lits.p);
    free(g->strs.p);
    free(g->nums.p);
    free(g->objs.p);
    free(g->members.p);
    free(g->arrs.p);
    free(g->cnodes.p);
    free(g->need);
    free(g->rneed);
    free(g);
}

int64_t cart_grammar_max_bytes(const cart_grammar *g) {
    return g ? g->max_bytes : -1;
}

/* ---- numbers ------------------------------------------------------------ */

static const i128 SCALE = (i128)10000000000000000LL; /* 10^16 */

static i128 pow10_i(int k) {
    i128 r = 1;
    while (k-- > 0) r *= 10;
    return r;
}

/* The largest magnitude a number of this kind can be written with. */
static i128 max_magnitude(int integer) {
    return integer ? SCALE - 1 : SCALE * SCALE - 1;
}

/* floor and ceil of num * 2^sh. */
static void dyadic(i128 num, int sh, i128 *fl, i128 *ce) {
    if (sh >= 0) {
        *fl = *ce = num * ((i128)1 << sh);
        return;
    }
    int k = -sh;
    if (k > 120) {
        *fl = num > 0 ? 0 : num < 0 ? -1 : 0;
        *ce = num > 0 ? 1 : 0;
        return;
    }
    i128 mag = num < 0 ? -num : num;
    i128 q = mag >> k, r = mag & (((i128)1 << k) - 1);
    if (num >= 0) {
        *fl = q;
        *ce = q + (r != 0);
    } else {
        *fl = -(q + (r != 0));
        *ce = -q;
    }
}

/* x = mant * 2^exp with mant an integer of at most 53 bits. */
static void split_double(double x, int64_t *mant, int *exp) {
    int e;
    double f = frexp(x, &e);
    *mant = (int64_t)ldexp(f, 53);
    *exp = e - 53;
}

/* floor and ceil of (a + b) / 2 * 10^16, exactly, for adjacent doubles a,
 * b of magnitude below 1e17. */
static void scaled_midpoint(double a, double b, i128 *fl, i128 *ce) {
    int64_t ma, mb;
    int ea, eb;
    split_double(a, &ma, &ea);
    split_double(b, &mb, &eb);
    i128 sum;
    int e;
    if (ma == 0) {
        sum = mb, e = eb;
    } else if (mb == 0) {
        sum = ma, e = ea;
    } else {
        e = ea < eb ? ea : eb;
        sum = (i128)ma * ((i128)1 << (ea - e)) + (i128)mb * ((i128)1 << (eb - e));
    }
    /* 10^16 = 5^16 * 2^16 */
    dyadic(sum * (i128)152587890625LL, e - 1 + 16, fl, ce);
}

static int even_significand(double b) {
    uint64_t bits;
    memcpy(&bits, &b, sizeof bits);
    return (bits & 1) == 0;
}

/* The least X (in units of 10^-16) whose double, as a JSON parser rounds
 * it, is >= b. */
static i128 scaled_min_incl(double b) {
    if (b >= 1e17) return SCALE * SCALE;
    if (b <= -1e17) return -SCALE * SCALE;
    i128 fl, ce;
    scaled_midpoint(nextafter(b, -INFINITY), b, &fl, &ce);
    if (fl == ce) return even_significand(b) ? fl : fl + 1; /* a tie rounds to the even neighbour */
    return ce;
}

/* The greatest X whose double is <= b. */
static i128 scaled_max_incl(double b) {
    if (b >= 1e17) return SCALE * SCALE;
    if (b <= -1e17) return -SCALE * SCALE;
    i128 fl, ce;
    scaled_midpoint(b, nextafter(b, INFINITY), &fl, &ce);
    if (fl == ce) return even_significand(b) ? fl : fl - 1;
    return fl;
}

static i128 floor_div(i128 a, i128 d) {
    i128 q = a / d;
    if ((a % d != 0) && (a < 0)) q--;
    return q;
}

static i128 ceil_div(i128 a, i128 d) {
    i128 q = a / d;
    if ((a % d != 0) && (a > 0)) q++;
    return q;
}

/* Number frame state, packed in a frame's `a`:
 *   bit 0       negative
 *   bits 1-3    phase
 *   bits 4-8    integer digits
 *   bits 9-13   fraction digits
 *   bits 14-15  exponent digits
 *   bit 16      the integer part is a leading 0 (no more integer digits)
 * v0 holds the integer digits' value, v1 the fraction digits'. */
enum { N_START, N_MINUS, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS };

#define N_NEG(a) ((a) & 1u)
#define N_PHASE(a) (((a) >> 1) & 7u)
#define N_NINT(a) (((a) >> 4) & 31u)
#define N_NFRAC(a) (((a) >> 9) & 31u)
#define N_NEXP(a) (((a) >> 14) & 3u)
#define N_ZERO(a) (((a) >> 16) & 1u)
#define N_PACK(neg, phase, nint, nfrac, nexp, zero) \
    ((uint32_t)(neg) | (uint32_t)(phase) << 1 | (uint32_t)(nint) << 4 | (uint32_t)(nfrac) << 9 | \
     (uint32_t)(nexp) << 14 | (uint32_t)(zero) << 16)

/* Whether some completion of the number so far lies within the bounds. */
static int number_feasible(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    if (!s->bounded) return 1;
    i128 unit = s->integer ? 1 : SCALE;
    i128 L, H; /* the magnitudes allowed for this sign */
    if (!N_NEG(a)) {
        L = s->lo > 0 ? s->lo : 0;
        H = s->hi;
    } else {
        L = s->hi < 0 ? -s->hi : 0;
        H = -s->lo;
    }
    if (H < L || H < 0) return 0;
    i128 maxm = max_magnitude(s->integer);
    switch (N_PHASE(a)) {
    case N_START:
    case N_MINUS:
        return L <= maxm;
    case N_INT: {
        if (N_ZERO(a)) return s->integer ? L == 0 : L <= unit - 1;
        int n = (int)N_NINT(a);
        i128 p = 1;
        for (int j = 0; j + n <= NUM_DIGITS; j++, p *= 10) {
            i128 lo = (i128)I * p * unit, hi = ((i128)I + 1) * p * unit - 1;
            if (lo <= H && hi >= L) return 1;
        }
        return 0;
    }
    case N_DOT:
    case N_FRAC: {
        int k = (int)N_NFRAC(a);
        i128 step = pow10_i(NUM_DIGITS - k);
        i128 lo = (i128)I * SCALE + (i128)F * step, hi = lo + step - 1;
        return lo <= H && hi >= L;
    }
    default:
        return 1; /* exponents only when unbounded */
    }
}

/* Whether the number so far is a complete number within the bounds. */
static int number_complete(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    uint32_t ph = N_PHASE(a);
    if (ph != N_INT && ph != N_FRAC && ph != N_EXP_DIGITS) return 0;
    if (!s->bounded) return 1;
    i128 v = s->integer ? (i128)I : (i128)I * SCALE + (i128)F * pow10_i(NUM_DIGITS - (int)N_NFRAC(a));
    if (N_NEG(a)) v = -v;
    return v >= s->lo && v <= s->hi;
}

/* One byte of a number: 1 and the new state, or 0. */
static int number_step(const num_spec *s, uint32_t a, int64_t I, int64_t F, uint8_t c, uint32_t *na,
                       int64_t *nI, int64_t *nF) {
    uint32_t neg = N_NEG(a), ph = N_PHASE(a), ni = N_NINT(a), nf = N_NFRAC(a), ne = N_NEXP(a),
             zero = N_ZERO(a);
    int digit = c >= '0' && c <= '9';
    *nI = I;
    *nF = F;
    switch (ph) {
    case N_START:
        if (c == '-') {
            *na = N_PACK(1, N_MINUS, 0, 0, 0, 0);
            break;
        }
        /* fall through */
    case N_MINUS:
        if (!digit) return 0;
        *nI = c - '0';
        *na = N_PACK(neg, N_INT, 1, 0, 0, c == '0');
        break;
    case N_INT:
        if (digit) {
            if (zero || ni >= NUM_DIGITS) return 0;
            *nI = I * 10 + (c - '0');
            *na = N_PACK(neg, N_INT, ni + 1, 0, 0, 0);
        } else if (c == '.' && !s->integer) {
            *na = N_PACK(neg, N_DOT, ni, 0, 0, zero);
        } else if ((c == 'e' || c == 'E') && !s->bounded && !s->integer) {
            *na = N_PACK(neg, N_EXP, ni, 0, 0, zero);
        } else {
            return 0;
        }
        break;
    case N_DOT:
    case N_FRAC:
        if (digit) {
            if (nf >= NUM_DIGITS) return 0;
            *nF = F * 10 + (c - '0');
            *na = N_PACK(neg, N_FRAC, ni, nf + 1, 0, zero);
        } else if (ph == N_FRAC && (c == 'e' || c == 'E') && !s->bounded) {
            *na = N_PACK(neg, N_EXP, ni, nf, 0, zero);
        } else {
            return 0;
        }
        break;
    case N_EXP:
        if (c == '+' || c == '-') {
            *na = N_PACK(neg, N_EXP_SIGN, ni, nf, 0, zero);
            break;
        }
        /* fall through */
    case N_EXP_SIGN:
        if (!digit) return 0;
        *na = N_PACK(neg, N_EXP_DIGITS, ni, nf, 1, zero);
        break;
    case N_EXP_DIGITS:
        if (!digit || ne >= 2) return 0;
        *na = N_PACK(neg, N_EXP_DIGITS, ni, nf, ne + 1, zero);
        break;
    default:
        return 0;
    }
    return number_feasible(s, *na, *nI, *nF);
}

/* Whether some byte can continue the number (within its bounds). */
static int number_open(const num_spec *s, uint32_t a, int64_t I, int64_t F) {
    static const char next[] = "0123456789.eE-+";
    for (const char *c = next; *c; c++) {
        uint32_t na;
        int64_t nI, nF;
        if (number_step(s, a, I, F, (uint8_t)*c, &na, &nI, &nF)) return 1;
    }
    return 0;
}

/* ---- strings ------------------------------------------------------------ */

/* UTF-8 decoding state: bits 0-1 continuation bytes still expected, bits
 * 2-4 the allowed range of the next one. 0 is a character boundary. */
enum { U_ANY, U_A0_BF, U_80_9F, U_90_BF, U_80_8F };

/* One byte of UTF-8 from state *st: 1 and the new state (*started = 1 when
 * the byte begins a character), or 0 when the byte is ill-formed here. */
static int utf8_step(uint32_t *st, uint8_t c, int *started) {
    uint32_t need = *st & 3u, range = *st >> 2;
    *started = 0;
    if (need) {
        static const uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        if (c < lo[range] || c > hi[range]) return 0;
        *st = need - 1;
        return 1;
    }
    *started = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) *st = 1;
    else if (c == 0xE0) *st = 2 | U_A0_BF << 2;
    else if (c == 0xED) *st = 2 | U_80_9F << 2;
    else if (c >= 0xE1 && c <= 0xEF) *st = 2;
    else if (c == 0xF0) *st = 3 | U_90_BF << 2;
    else if (c == 0xF4) *st = 3 | U_80_8F << 2;
    else if (c >= 0xF1 && c <= 0xF3) *st = 3;
    else return 0;
    return 1;
}

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

static int is_hex(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One byte of a JSON string: STR_MORE with the new (a, b), STR_CLOSED at
 * the closing quote, or STR_DEAD. */
static int string_step(const str_spec *s, uint32_t a, uint32_t b, uint8_t c, uint32_t *na, uint32_t *nb) {
    *na = a;
    if (S_PHASE(b) == 0) {
        if (c != '"') return STR_DEAD;
        *nb = S_BOUNDARY;
        return STR_MORE;
    }
    uint32_t esc = S_ESC(b);
    if (esc == 1) {
        if (c == 'u') {
            *nb = S_PACK(2, 0, 0, 1);
            return STR_MORE;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return STR_DEAD;
        *nb = S_BOUNDARY;
        return STR_MORE;
    }
    if (esc >= 2) {
        if (!is_hex(c)) return STR_DEAD;
        uint32_t dhi = S_DHI(b);
        if (esc == 2) dhi = c == 'd' || c == 'D';
        else if (esc == 3 && dhi && c > '7') return STR_DEAD; /* D800-DFFF: surrogates */
        *nb = esc == 5 ? S_BOUNDARY : S_PACK(esc + 1, dhi, 0, 1);
        return STR_MORE;
    }
    uint32_t u = S_UTF(b);
    if (u == 0) {
        if (c == '"') {
            if (a < s->min) return STR_DEAD;
            return STR_CLOSED;
        }
        if (c < 0x20) return STR_DEAD;
        if (a >= s->max) return STR_DEAD;
        if (c == '\\') {
            *na = a + 1;
            *nb = S_PACK(1, 0, 0, 1);
            return STR_MORE;
        }
    }
    int started;
    if (!utf8_step(&u, c, &started)) return STR_DEAD;
    *na = a + (uint32_t)started;
    *nb = S_PACK(0, 0, u, 1);
    return STR_MORE;
}

/* ---- the compiler ------------------------------------------------------- */

typedef struct ref_memo {
    const cJSON *node;
    uint32_t rule;
} ref_memo;

typedef struct compiler {
    cart_grammar *g;
    const cJSON *root;
    int32_t flags;
    char path[512]; /* JSON pointer of the schema being compiled, for messages */
    size_t path_len;
    int depth;
    ref_memo *memo;
    uint32_t n_memo, cap_memo;
    int32_t any_rule; /* the rule of any JSON value, -1 until needed */
} compiler;

static const char SUPPORTED[] =
    "supported: type, properties, required, additionalProperties, items, minItems, maxItems, minLength, "
    "maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, $ref, $defs";

/* Appends "/<segment>" to the path (escaped as a JSON pointer); returns the
 * length to restore. */
static size_t path_push(compiler *c, const char *seg) {
    size_t old = c->path_len, n = c->path_len;
    if (n + 2 < sizeof c->path) c->path[n++] = '/';
    for (const char *s = seg; *s && n + 3 < sizeof c->path; s++) {
        if (*s == '~' || *s == '/') {
            c->path[n++] = '~';
            c->path[n++] = *s == '~' ? '0' : '1';
        } else {
            c->path[n++] = *s;
        }
    }
    c->path[n] = 0;
    c->path_len = n;
    return old;
}

static size_t path_push_index(compiler *c, int i) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", i);
    return path_push(c, buf);
}

static void path_pop(compiler *c, size_t old) {
    c->path_len = old;
    c->path[old] = 0;
}

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "something else";
}

static int emit_elem(compiler *c, elem e, uint32_t *at) {
    cart_grammar *g = c->g;
    int rc = PUSH(g->elems, MAX_PARTS);
    if (rc) return rc;
    if (at) *at = g->elems.n;
    g->elems.p[g->elems.n++] = e;
    return CART_OK;
}

/* Appends the sequence e[0..n) + END; *start gets its position. */
static int emit_seq(compiler *c, const elem *e, int n, uint32_t *start) {
    *start = c->g->elems.n;
    for (int i = 0; i < n; i++) {
        int rc = emit_elem(c, e[i], NULL);
        if (rc) return rc;
    }
    return emit_elem(c, (elem){E_END, 0, 0}, NULL);
}

static int new_rule(compiler *c, uint32_t *r) {
    cart_grammar *g = c->g;
    int rc = PUSH(g->rules, MAX_PARTS);
    if (rc) return rc;
    *r = g->rules.n;
    g->rules.p[g->rules.n++] = (rule){0, 0};
    return CART_OK;
}

/* Gives rule r the alternatives starting at starts[0..n). */
static int set_alts(compiler *c, uint32_t r, const uint32_t *starts, uint32_t n) {
    cart_grammar *g = c->g;
    uint32_t first = g->alts.n;
    for (uint32_t i = 0; i < n; i++) {
        int rc = PUSH(g->alts, MAX_PARTS);
        if (rc) return rc;
        g->alts.p[g->alts.n++] = starts[i];
    }
    g->rules.p[r] = (rule){first, n};
    return CART_OK;
}

/* A rule with one alternative for each element: { e_i END }. */
static int rule_of(compiler *c, const elem *e, uint32_t n, elem *out) {
    uint32_t r, *starts = cart_malloc((n ? n : 1) * sizeof *starts, "grammar");
    if (!starts) return CART_E_NOMEM;
    int rc = new_rule(c, &r);
    for (uint32_t i = 0; i < n && !rc; i++) rc = emit_seq(c, &e[i], 1, &starts[i]);
    if (!rc) rc = set_alts(c, r, starts, n);
    free(starts);
    *out = (elem){E_RULE, r, 0};
    return rc;
}

static int lit(compiler *c, const char *bytes, size_t n, elem *out) {
    cart_grammar *g = c->g;
    uint32_t at = g->lits.n;
    for (size_t i = 0; i < n; i++) {
        int rc = PUSH(g->lits, MAX_PARTS * 16u);
        if (rc) return rc;
        g->lits.p[g->lits.n++] = (uint8_t)bytes[i];
    }
    *out = (elem){E_LIT, at, (uint32_t)n};
    return CART_OK;
}

static int ws(elem *out) {
    *out = (elem){E_WS, 0, 0};
    return CART_OK;
}

/* A growable byte buffer for the texts of literals. */
typedef struct text {
    char *p;
    size_t n, cap;
    int failed;
} text;

static void put(text *t, const char *s, size_t n) {
    if (t->failed) return;
    if (t->n + n + 1 > t->cap) {
        size_t c = t->cap ? t->cap * 2 : 64;
        while (c < t->n + n + 1) c *= 2;
        char *q = realloc(t->p, c);
        if (!q) {
            t->failed = 1;
            return;
        }
        t->p = q;
        t->cap = c;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void puts_text(text *t, const char *s) {
    put(t, s, strlen(s));
}

/* s as a JSON string literal: quotes, backslashes and control characters
 * escaped, everything else (UTF-8 already checked) as it is. */
static void put_json_string(text *t, const char *s) {
    put(t, "\"", 1);
    for (; *s; s++) {
        uint8_t ch = (uint8_t)*s;
        char buf[8];
        switch (ch) {
        case '"': put(t, "\\\"", 2); break;
        case '\\': put(t, "\\\\", 2); break;
        case '\n': put(t, "\\n", 2); break;
        case '\r': put(t, "\\r", 2); break;
        case '\t': put(t, "\\t", 2); break;
        case '\b': put(t, "\\b", 2); break;
        case '\f': put(t, "\\f", 2); break;
        default:
            if (ch < 0x20) {
                snprintf(buf, sizeof buf, "\\u%04x", ch);
                put(t, buf, 6);
            } else {
                put(t, s, 1);
            }
        }
    }
    put(t, "\"", 1);
}

/* The shortest text that reads back as v. */
static void put_number(text *t, double v) {
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    puts_text(t, buf);
}

/* A JSON value written compactly (object members in document order).
 * Returns 0, or -1 when it holds a number JSON cannot (inf). */
static int put_value(text *t, const cJSON *v) {
    if (cJSON_IsString(v)) {
        put_json_string(t, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        if (!isfinite(v->valuedouble)) return -1;
        put_number(t, v->valuedouble);
    } else if (cJSON_IsTrue(v)) {
        puts_text(t, "true");
    } else if (cJSON_IsFalse(v)) {
        puts_text(t, "false");
    } else if (cJSON_IsNull(v)) {
        puts_text(t, "null");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        put(t, obj ? "{" : "[", 1);
        int first = 1;
        for (const cJSON *e = v->child; e; e = e->next) {
            if (!first) put(t, ",", 1);
            first = 0;
            if (obj) {
                put_json_string(t, e->string);
                put(t, ":", 1);
            }
            if (put_value(t, e) < 0) return -1;
        }
        put(t, obj ? "}" : "]", 1);
    }
    return 0;
}

/* Adds one text to the choice trie rooted at `root`. */
static int choice_add(compiler *c, uint32_t root, const char *s, size_t n) {
    cart_grammar *g = c->g;
    uint32_t node = root;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        uint32_t ch = g->cnodes.p[node].child, prev = 0;
        while (ch && g->cnodes.p[ch].byte != b) prev = ch, ch = g->cnodes.p[ch].sibling;
        if (!ch) {
            int rc = PUSH(g->cnodes, MAX_PARTS);
            if (rc) return rc;
            ch = g->cnodes.n++;
            g->cnodes.p[ch] = (cnode){0, 0, b, 0};
            if (prev) g->cnodes.p[prev].sibling = ch;
            else g->cnodes.p[node].child = ch;
        }
        node = ch;
    }
    g->cnodes.p[node].final = 1;
    return CART_OK;
}

static int choice_new(compiler *c, uint32_t *root) {
    cart_grammar *g = c->g;
    if (g->cnodes.n == 0) { /* node 0 is a sentinel: child/sibling 0 means none */
        int rc = PUSH(g->cnodes, MAX_PARTS);
        if (rc) return rc;
        g->cnodes.p[g->cnodes.n++] = (cnode){0, 0, 0, 0};
    }
    int rc = PUSH(g->cnodes, MAX_PARTS);
    if (rc) return rc;
    *root = g->cnodes.n++;
    g->cnodes.p[*root] = (cnode){0, 0, 0, 0};
    return CART_OK;
}

static int choice_of(compiler *c, const char *const *texts, int n, elem *out) {
    uint32_t root, longest = 0;
    int rc = choice_new(c, &root);
    for (int i = 0; i < n && !rc; i++) {
        rc = choice_add(c, root, texts[i], strlen(texts[i]));
        if (strlen(texts[i]) > longest) longest = (uint32_t)strlen(texts[i]);
    }
    *out = (elem){E_CHOICE, root, longest};
    return rc;
}

static int string_elem(compiler *c, uint32_t min, uint32_t max, elem *out) {
    cart_grammar *g = c->g;
    int rc = PUSH(g->strs, MAX_PARTS);
    if (rc) return rc;
    g->strs.p[g->strs.n] = (str_spec){min, max};
    *out = (elem){E_STRING, g->strs.n++, 0};
    return CART_OK;
}

static int number_elem(compiler *c, num_spec s, elem *out) {
    cart_grammar *g = c->g;
    int rc = PUSH(g->nums, MAX_PARTS);
    if (rc) return rc;
    g->nums.p[g->nums.n] = s;
    *out = (elem){E_NUMBER, g->nums.n++, 0};
    return CART_OK;
}

/* A rule of one sequence: open WS inner close ("{}" or "[]"). */
static int bracketed(compiler *c, const char *pair, elem inner, elem *out) {
    elem body[4];
    int rc = lit(c, pair, 1, &body[0]);
    ws(&body[1]);
    body[2] = inner;
    if (!rc) rc = lit(c, pair + 1, 1, &body[3]);
    uint32_t r = 0, start;
    if (!rc) rc = new_rule(c, &r);
    if (!rc) rc = emit_seq(c, body, 4, &start);
    if (!rc) rc = set_alts(c, r, &start, 1);
    *out = (elem){E_RULE, r, 0};
    return rc;
}

/* The array  "[" WS ARRAY "]"  of items `item`, min..max of them. */
static int array_rule(compiler *c, elem item, uint32_t min, uint32_t max, elem *out) {
    cart_grammar *g = c->g;
    elem seq[4];
    int rc = lit(c, ",", 1, &seq[0]);
    ws(&seq[1]);
    seq[2] = item;
    ws(&seq[3]);
    uint32_t item_seq;
    if (!rc) rc = emit_seq(c, seq, 4, &item_seq);
    if (!rc) rc = PUSH(g->arrs, MAX_PARTS);
    if (rc) return rc;
    g->arrs.p[g->arrs.n] = (arr_spec){item_seq, min, max};
    return bracketed(c, "[]", (elem){E_ARRAY, g->arrs.n++, 0}, out);
}

/* The member sequence  "," WS key WS ":" WS value WS ; key is a literal or
 * a string element. */
static int member_seq(compiler *c, elem key, elem value, uint32_t *start) {
    elem seq[8];
    int rc = lit(c, ",", 1, &seq[0]);
    ws(&seq[1]);
    seq[2] = key;
    ws(&seq[3]);
    if (!rc) rc = lit(c, ":", 1, &seq[4]);
    ws(&seq[5]);
    seq[6] = value;
    ws(&seq[7]);
    if (!rc) rc = emit_seq(c, seq, 8, start);
    return rc;
}

/* The object  "{" WS OBJECT "}"  with members[0..n) and, when extra is
 * not NULL, free-form members of value *extra. */
static int object_rule(compiler *c, const member *members, uint32_t n, const elem *extra, elem *out) {
    cart_grammar *g = c->g;
    obj_spec spec = {g->members.n, n, -1, -1};
    for (uint32_t i = 0; i < n; i++) {
        int rc = PUSH(g->members, MAX_PARTS);
        if (rc) return rc;
        g->members.p[g->members.n++] = members[i];
        if (members[i].required) spec.last_req = (int32_t)i;
    }
    if (extra) {
        elem key;
        uint32_t seq;
        int rc = string_elem(c, 0, UNBOUNDED, &key);
        if (!rc) rc = member_seq(c, key, *extra, &seq);
        if (rc) return rc;
        spec.extra = (int32_t)seq;
    }
    int rc = PUSH(g->objs, MAX_PARTS);
    if (rc) return rc;
    g->objs.p[g->objs.n] = spec;
    return bracketed(c, "{}", (elem){E_OBJECT, g->objs.n++, 0}, out);
}

static num_spec unbounded_number(int integer) {
    num_spec s;
    memset(&s, 0, sizeof s);
    s.integer = (uint8_t)integer;
    s.lo = -max_magnitude(integer);
    s.hi = max_magnitude(integer);
    return s;
}

/* The rule of any JSON value (made once per grammar). */
static int any_value(compiler *c, elem *out) {
    if (c->any_rule >= 0) {
        *out = (elem){E_RULE, (uint32_t)c->any_rule, 0};
        return CART_OK;
    }
    uint32_t r;
    int rc = new_rule(c, &r);
    if (rc) return rc;
    c->any_rule = (int32_t)r;
    elem self = {E_RULE, r, 0}, alt[5];
    rc = object_rule(c, NULL, 0, &self, &alt[0]);
    if (!rc) rc = array_rule(c, self, 0, UNBOUNDED, &alt[1]);
    if (!rc) rc = string_elem(c, 0, UNBOUNDED, &alt[2]);
    if (!rc) rc = number_elem(c, unbounded_number(0), &alt[3]);
    static const char *const words[] = {"true", "false", "null"};
    if (!rc) rc = choice_of(c, words, 3, &alt[4]);
    uint32_t starts[5];
    for (int i = 0; i < 5 && !rc; i++) rc = emit_seq(c, &alt[i], 1, &starts[i]);
    if (!rc) rc = set_alts(c, r, starts, 5);
    *out = self;
    return rc;
}

/* Records a CART_E_FORMAT error at the current JSON pointer. */
static int bad(compiler *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(compiler *c, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cart_fail(CART_E_FORMAT, "%s: %s", c->path_len ? c->path : "#", msg);
}

/* An unsupported keyword: an error, or (lenient) ignored. */
static int unsupported(compiler *c, const char *key) {
    if (c->flags & CART_GRAMMAR_LENIENT) return CART_OK;
    return cart_fail(CART_E_UNSUPPORTED, "%s: the keyword '%.64s' is not supported by structured output (%s)",
                     c->path, key, SUPPORTED);
}

/* body[key] as an integer in [0, 2^31 - 1]; *has = 0 when absent. */
static int count_keyword(compiler *c, const cJSON *node, const char *key, uint32_t *v, int *has) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, key);
    *has = x != NULL;
    if (!x) return CART_OK;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= 2147483647.0) ||
        x->valuedouble != floor(x->valuedouble))
        return bad(c, "%s must be an integer in [0, 2147483647]; got %s", key,
                   cJSON_IsNumber(x) ? "a number out of that range" : json_kind(x));
    *v = (uint32_t)x->valuedouble;
    return CART_OK;
}

static int number_keyword(compiler *c, const cJSON *node, const char *key, double *v, int *has) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, key);
    *has = x != NULL;
    if (!x) return CART_OK;
    if (!cJSON_IsNumber(x))
        return bad(c, "%s must be a number; got %s", key, json_kind(x));
    if (!isfinite(x->valuedouble))
        return bad(c, "%s is a number no JSON double can hold (it reads as infinity)", key);
    *v = x->valuedouble;
    return CART_OK;
}

/* The keywords this compiler reads, and the annotations it ignores. */
static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "anyOf", "$ref",
    "$defs", "definitions", "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", NULL};
static const char *const ANNOTATIONS[] = {"$defs", "definitions", "title", "description", "default", "examples",
                                          "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                          NULL};

static int in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (strcmp(*list, s) == 0) return 1;
    return 0;
}

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 };

static const char *const TYPE_NAMES[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static int type_bit(const char *name) {
    for (int i = 0; i < 7; i++)
        if (strcmp(name, TYPE_NAMES[i]) == 0) return 1 << i;
    return 0;
}

/* The set of types a schema node allows (its "type", or what its keywords
 * imply; 0 = any). */
static int node_types(compiler *c, const cJSON *node, int *types) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(node, "type");
    *types = 0;
    if (t) {
        if (cJSON_IsString(t)) {
            *types = type_bit(t->valuestring);
            if (!*types)
                return bad(c, "type '%.64s' is not a JSON Schema type (object, array, string, number, integer, "
                              "boolean, null)",
                           t->valuestring);
        } else if (cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0) {
            for (const cJSON *e = t->child; e; e = e->next) {
                int bit = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
                if (!bit)
                    return bad(c, "type must be a type name or an array of them (object, array, string, number, "
                                  "integer, boolean, null)");
                *types |= bit;
            }
        } else {
            return bad(c, "type must be a string or a non-empty array of strings; got %s", json_kind(t));
        }
        return CART_OK;
    }
    static const char *const obj_keys[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr_keys[] = {"items", "minItems", "maxItems", NULL};
    static const char *const str_keys[] = {"minLength", "maxLength", NULL};
    static const char *const num_keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    for (const cJSON *e = node->child; e; e = e->next) {
        if (in_list(obj_keys, e->string)) *types |= T_OBJECT;
        if (in_list(arr_keys, e->string)) *types |= T_ARRAY;
        if (in_list(str_keys, e->string)) *types |= T_STRING;
        if (in_list(num_keys, e->string)) *types |= T_NUMBER;
    }
    return CART_OK;
}

static int compile_node(compiler *c, const cJSON *node, elem *out);

/* Resolves a "#..." reference to the node it points at. */
static int resolve_ref(compiler *c, const char *ref, const cJSON **target) {
    if (ref[0] != '#')
        return bad(c, "$ref '%.200s' is not supported: only references within the schema ('#', '#/$defs/...') are",
                   ref);
    const cJSON *node = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return bad(c, "$ref '%.200s' is not a JSON pointer ('#/...')", ref);
    char seg[256];
    while (*p == '/') {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p == '0') ch = '~';
                else if (*p == '1') ch = '/';
                else return bad(c, "$ref '%.200s': '~' must be followed by 0 or 1", ref);
                p++;
            } else if (ch == '%' && is_hex((uint8_t)p[0]) && is_hex((uint8_t)p[1])) {
                char hex[3] = {p[0], p[1], 0};
                ch = (char)strtol(hex, NULL, 16);
                p += 2;
            }
            if (n + 1 >= sizeof seg) return bad(c, "$ref '%.200s': a segment is too long", ref);
            seg[n++] = ch;
        }
        seg[n] = 0;
        const cJSON *next = NULL;
        if (cJSON_IsObject(node)) {
            next = cJSON_GetObjectItemCaseSensitive(node, seg);
        } else if (cJSON_IsArray(node)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (*seg && !*end && (seg[0] != '0' || !seg[1]) && i >= 0) next = cJSON_GetArrayItem(node, (int)i);
        }
        if (!next) return bad(c, "$ref '%.200s' points to nothing in the schema (no '%.64s' there)", ref, seg);
        node = next;
    }
    *target = node;
    return CART_OK;
}

/* The rule of the node a $ref names: compiled once, so recursion ends. */
static int compile_ref(compiler *c, const char *ref, elem *out) {
    const cJSON *target = NULL;
    int rc = resolve_ref(c, ref, &target);
    if (rc) return rc;
    for (uint32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == target) {
            *out = (elem){E_RULE, c->memo[i].rule, 0};
            return CART_OK;
        }
    uint32_t r;
    rc = new_rule(c, &r);
    if (rc) return rc;
    if (c->n_memo == c->cap_memo) {
        uint32_t cap = c->cap_memo ? c->cap_memo * 2 : 16;
        ref_memo *m = cart_realloc(c->memo, cap * sizeof *m, "grammar");
        if (!m) return CART_E_NOMEM;
        c->memo = m;
        c->cap_memo = cap;
    }
    c->memo[c->n_memo++] = (ref_memo){target, r};
    /* messages inside the target name its place */
    char saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref);
    c->path_len = strlen(c->path);
    elem e;
    rc = compile_node(c, target, &e);
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    uint32_t start;
    if (!rc) rc = emit_seq(c, &e, 1, &start);
    if (!rc) rc = set_alts(c, r, &start, 1);
    *out = (elem){E_RULE, r, 0};
    return rc;
}

/* Code points in a UTF-8 string. */
static uint32_t code_points(const char *s) {
    uint32_t n = 0;
    for (; *s; s++)
        if (((uint8_t)*s & 0xC0) != 0x80) n++;
    return n;
}

/* Whether an enum value fits the node's own type and bounds (other values
 * can never be valid, so they are left out). */
static int value_fits(const cJSON *node, int types, const cJSON *v) {
    if (types) {
        int ok = 0;
        if ((types & T_OBJECT) && cJSON_IsObject(v)) ok = 1;
        if ((types & T_ARRAY) && cJSON_IsArray(v)) ok = 1;
        if ((types & T_STRING) && cJSON_IsString(v)) ok = 1;
        if ((types & T_NUMBER) && cJSON_IsNumber(v)) ok = 1;
        if ((types & T_INTEGER) && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) ok = 1;
        if ((types & T_BOOLEAN) && cJSON_IsBool(v)) ok = 1;
        if ((types & T_NULL) && cJSON_IsNull(v)) ok = 1;
        if (!ok) return 0;
    }
    const cJSON *k;
    if (cJSON_IsString(v)) {
        uint32_t n = code_points(v->valuestring);
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "minLength")) && cJSON_IsNumber(k) && n < k->valuedouble)
            return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "maxLength")) && cJSON_IsNumber(k) && n > k->valuedouble)
            return 0;
    }
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "minimum")) && cJSON_IsNumber(k) && !(x >= k->valuedouble))
            return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "maximum")) && cJSON_IsNumber(k) && !(x <= k->valuedouble))
            return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "exclusiveMinimum")) && cJSON_IsNumber(k) &&
            !(x > k->valuedouble))
            return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(node, "exclusiveMaximum")) && cJSON_IsNumber(k) &&
            !(x < k->valuedouble))
            return 0;
    }
    return 1;
}

/* enum and const: the values' compact texts as one choice. */
static int compile_enum(compiler *c, const cJSON *node, int types, elem *out) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(node, "const");
    if (en && (!cJSON_IsArray(en)))
        return bad(c, "enum must be an array of values; got %s", json_kind(en));
    if (en && cJSON_GetArraySize(en) > MAX_ENUM) {
        return bad(c, "enum has %d values, more than the limit of %d", cJSON_GetArraySize(en), MAX_ENUM);
    }
    static const char *const structural[] = {"properties", "items", "anyOf", "additionalProperties", "required",
                                             NULL};
    for (const cJSON *e = node->child; e; e = e->next)
        if (in_list(structural, e->string) && !(c->flags & CART_GRAMMAR_LENIENT))
            return bad(c, "enum or const together with '%s' is not supported: list the allowed values only",
                       e->string);
    text cn_text = {0}, t = {0};
    if (cn && put_value(&cn_text, cn) < 0) {
        free(cn_text.p);
        return bad(c, "const holds a number no JSON double can hold (it reads as infinity)");
    }
    uint32_t root;
    int rc = choice_new(c, &root);
    int kept = 0;
    size_t longest = 0;
    const cJSON *first = en ? en->child : cn;
    for (const cJSON *v = first; v && !rc; v = en ? v->next : NULL) {
        t.n = 0;
        if (put_value(&t, v) < 0) {
            rc = bad(c, "enum holds a number no JSON double can hold (it reads as infinity)");
            break;
        }
        if (t.failed || cn_text.failed) {
            rc = cart_fail(CART_E_NOMEM, "grammar: out of memory");
            break;
        }
        if (en && cn && (t.n != cn_text.n || memcmp(t.p, cn_text.p, t.n) != 0)) continue;
        if (!value_fits(node, types, v)) continue;
        rc = choice_add(c, root, t.p ? t.p : "", t.n);
        kept++;
        if (t.n > longest) longest = t.n;
    }
    free(t.p);
    free(cn_text.p);
    if (rc) return rc;
    if (!kept)
        return bad(c, "no value of enum/const fits the schema (its type, length or bounds)");
    if (longest > UINT32_MAX / 2) return bad(c, "an enum value is too long");
    *out = (elem){E_CHOICE, root, (uint32_t)longest};
    return CART_OK;
}

static int compile_object(compiler *c, const cJSON *node, elem *out) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return bad(c, "properties must be an object of schemas; got %s", json_kind(props));
    if (req && !cJSON_IsArray(req))
        return bad(c, "required must be an array of property names; got %s", json_kind(req));
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return bad(c, "additionalProperties must be a boolean or a schema; got %s", json_kind(add));
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return bad(c, "required must hold strings; got %s", json_kind(r));
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return bad(c, "required names '%.100s', which is not in properties (every required property must be "
                          "declared)",
                       r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    member *members = cart_calloc((size_t)(n ? n : 1), sizeof *members, "grammar");
    if (!members) return CART_E_NOMEM;
    int rc = CART_OK, i = 0;
    text key = {0};
    size_t old = path_push(c, "properties");
    for (const cJSON *p = props ? props->child : NULL; p && !rc; p = p->next, i++) {
        size_t o2 = path_push(c, p->string);
        elem value, k;
        rc = compile_node(c, p, &value);
        key.n = 0;
        put_json_string(&key, p->string);
        if (key.failed) rc = cart_fail(CART_E_NOMEM, "grammar: out of memory");
        if (!rc) rc = lit(c, key.p, key.n, &k);
        if (!rc) rc = member_seq(c, k, value, &members[i].seq);
        members[i].required = 0;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (strcmp(r->valuestring, p->string) == 0) members[i].required = 1;
        path_pop(c, o2);
    }
    path_pop(c, old);
    free(key.p);
    /* free-form members only where no property is declared (see grammar.h) */
    elem extra, *has_extra = NULL;
    if (!rc && cJSON_IsObject(add)) {
        old = path_push(c, "additionalProperties");
        rc = compile_node(c, add, &extra);
        path_pop(c, old);
        if (!props) has_extra = &extra;
    } else if (!rc && !props && !cJSON_IsFalse(add)) {
        rc = any_value(c, &extra);
        has_extra = &extra;
    }
    if (!rc) rc = object_rule(c, members, (uint32_t)n, has_extra, out);
    free(members);
    return rc;
}

static int compile_array(compiler *c, const cJSON *node, elem *out) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    uint32_t min = 0, max = UNBOUNDED;
    int has_min, has_max;
    int rc = count_keyword(c, node, "minItems", &min, &has_min);
    if (!rc) rc = count_keyword(c, node, "maxItems", &max, &has_max);
    if (rc) return rc;
    if (min > max) return bad(c, "minItems is greater than maxItems");
    elem item;
    if (items) {
        if (!cJSON_IsObject(items) && !cJSON_IsBool(items))
            return bad(c, "items must be a schema (an object or a boolean); got %s", json_kind(items));
        size_t old = path_push(c, "items");
        rc = compile_node(c, items, &item);
        path_pop(c, old);
    } else {
        rc = any_value(c, &item);
    }
    if (!rc) rc = array_rule(c, item, min, max, out);
    return rc;
}

static int compile_string(compiler *c, const cJSON *node, elem *out) {
    uint32_t min = 0, max = UNBOUNDED;
    int has_min, has_max;
    int rc = count_keyword(c, node, "minLength", &min, &has_min);
    if (!rc) rc = count_keyword(c, node, "maxLength", &max, &has_max);
    if (rc) return rc;
    if (min > max) return bad(c, "minLength is greater than maxLength");
    return string_elem(c, min, max, out);
}

static int compile_number(compiler *c, const cJSON *node, int integer, elem *out) {
    num_spec s = unbounded_number(integer);
    double v = 0;
    int has, rc;
    i128 lo = -SCALE * SCALE, hi = SCALE * SCALE; /* in units of 10^-16, before clamping */
    static const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        rc = number_keyword(c, node, keys[k], &v, &has);
        if (rc) return rc;
        if (!has) continue;
        s.bounded = 1;
        i128 b;
        switch (k) {
        case 0: b = scaled_min_incl(v); if (b > lo) lo = b; break;
        case 1: b = scaled_max_incl(v); if (b < hi) hi = b; break;
        case 2: b = scaled_min_incl(nextafter(v, INFINITY)); if (b > lo) lo = b; break;
        default: b = scaled_max_incl(nextafter(v, -INFINITY)); if (b < hi) hi = b; break;
        }
    }
    if (integer) {
        lo = ceil_div(lo, SCALE);
        hi = floor_div(hi, SCALE);
    }
    i128 m = max_magnitude(integer);
    if (lo < -m) lo = -m;
    if (hi > m) hi = m;
    if (s.bounded && lo > hi)
        return bad(c, "no %s with at most 16 integer digits%s lies within its minimum/maximum bounds",
                   integer ? "integer" : "number", integer ? "" : " and 16 fraction digits");
    if (s.bounded) {
        s.lo = lo;
        s.hi = hi;
    }
    return number_elem(c, s, out);
}

/* One type of a node (types is a single bit). */
static int compile_typed(compiler *c, const cJSON *node, int type, elem *out) {
    static const char *const tf[] = {"true", "false"}, *const nul[] = {"null"};
    switch (type) {
    case T_OBJECT: return compile_object(c, node, out);
    case T_ARRAY: return compile_array(c, node, out);
    case T_STRING: return compile_string(c, node, out);
    case T_NUMBER: return compile_number(c, node, 0, out);
    case T_INTEGER: return compile_number(c, node, 1, out);
    case T_BOOLEAN: return choice_of(c, tf, 2, out);
    default: return choice_of(c, nul, 1, out);
    }
}

static int compile_node(compiler *c, const cJSON *node, elem *out) {
    if (cJSON_IsTrue(node)) return any_value(c, out);
    if (cJSON_IsFalse(node)) return rule_of(c, NULL, 0, out); /* no alternative: nothing matches */
    if (!cJSON_IsObject(node)) return bad(c, "a schema must be an object or a boolean; got %s", json_kind(node));
    if (c->depth >= MAX_SCHEMA_DEPTH)
        return bad(c, "the schema nests more than 64 subschemas deep (a limit against hostile schemas)");
    c->depth++;
    int rc = CART_OK;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    if (!any && (c->flags & CART_GRAMMAR_LENIENT)) any = cJSON_GetObjectItemCaseSensitive(node, "oneOf");
    for (const cJSON *e = node->child; e && !rc; e = e->next) {
        if (!in_list(KNOWN, e->string)) rc = unsupported(c, e->string);
        else if ((ref || any) && e != ref && e != any && !in_list(ANNOTATIONS, e->string)) {
            if (!(c->flags & CART_GRAMMAR_LENIENT)) {
                rc = cart_fail(CART_E_UNSUPPORTED, "%s: '%.64s' beside '%s' is not supported (put it inside the %s)",
                               c->path, e->string, ref ? "$ref" : "anyOf",
                               ref ? "referenced schema" : "anyOf alternatives");
            }
        }
    }
    if (rc) goto done;
    if (ref) {
        if (!cJSON_IsString(ref)) {
            rc = bad(c, "$ref must be a string; got %s", json_kind(ref));
        } else {
            rc = compile_ref(c, ref->valuestring, out);
        }
        goto done;
    }
    if (any) {
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0) {
            rc = bad(c, "anyOf must be a non-empty array of schemas; got %s", json_kind(any));
            goto done;
        }
        int n = cJSON_GetArraySize(any), i = 0;
        elem *alts = cart_calloc((size_t)n, sizeof *alts, "grammar");
        if (!alts) {
            rc = CART_E_NOMEM;
            goto done;
        }
        size_t old = path_push(c, any->string);
        for (const cJSON *e = any->child; e && !rc; e = e->next, i++) {
            size_t o2 = path_push_index(c, i);
            rc = compile_node(c, e, &alts[i]);
            path_pop(c, o2);
        }
        path_pop(c, old);
        if (!rc) rc = rule_of(c, alts, (uint32_t)n, out);
        free(alts);
        goto done;
    }
    int types;
    rc = node_types(c, node, &types);
    if (rc) goto done;
    if (cJSON_GetObjectItemCaseSensitive(node, "enum") || cJSON_GetObjectItemCaseSensitive(node, "const")) {
        rc = compile_enum(c, node, types, out);
        goto done;
    }
    if (types == 0) {
        rc = any_value(c, out);
        goto done;
    }
    if ((types & T_NUMBER) && (types & T_INTEGER)) types &= ~T_INTEGER; /* every integer is a number */
    elem alts[7];
    int n = 0;
    for (int bit = 1; bit <= T_NULL && !rc; bit <<= 1)
        if (types & bit) rc = compile_typed(c, node, bit, &alts[n++]);
    if (rc) goto done;
    if (n == 1) *out = alts[0];
    else rc = rule_of(c, alts, (uint32_t)n, out);
done:
    c->depth--;
    return rc;
}

/* ---- analysis ------------------------------------------------------------ */

static uint16_t elem_need(const cart_grammar *g, uint32_t p, uint16_t step, uint16_t cap);

/* The least extra depth needed to finish the sequence at p. */
static uint16_t seq_need(const cart_grammar *g, uint32_t p, uint16_t step, uint16_t cap) {
    uint16_t v = 0;
    for (; g->elems.p[p].kind != E_END; p++) {
        uint16_t e = elem_need(g, p, step, cap);
        if (e > v) v = e;
    }
    return v;
}

static uint16_t plus(uint16_t a, uint16_t step, uint16_t cap) {
    return a >= cap || a + step >= cap ? cap : (uint16_t)(a + step);
}

static uint16_t elem_need(const cart_grammar *g, uint32_t p, uint16_t step, uint16_t cap) {
    const elem *e = &g->elems.p[p];
    switch (e->kind) {
    case E_RULE:
        return g->rneed[e->a];
    case E_OBJECT: {
        const obj_spec *o = &g->objs.p[e->a];
        uint16_t v = 0;
        for (int32_t i = 0; i <= o->last_req; i++)
            if (g->members.p[o->first + i].required) {
                uint16_t m = plus(seq_need(g, g->members.p[o->first + i].seq, step, cap), step, cap);
                if (m > v) v = m;
            }
        return v;
    }
    case E_ARRAY: {
        const arr_spec *a = &g->arrs.p[e->a];
        return a->min ? plus(seq_need(g, a->seq, step, cap), step, cap) : 0;
    }
    case E_CHOICE: {
        /* a choice with no text at all matches nothing */
        const cnode *n = &g->cnodes.p[e->a];
        return n->child || n->final ? 0 : cap;
    }
    default:
        return 0;
    }
}

/* The rules each rule's sequences call (directly, or in its members and
 * items): users[r] lists the rules that call r. CSR in (start, list). */
typedef struct graph {
    uint32_t *start, *list;
} graph;

static void calls_of_seq(const cart_grammar *g, uint32_t p, void (*f)(void *, uint32_t), void *ctx);

static void calls_of_elem(const cart_grammar *g, uint32_t p, void (*f)(void *, uint32_t), void *ctx) {
    const elem *e = &g->elems.p[p];
    if (e->kind == E_RULE) {
        f(ctx, e->a);
    } else if (e->kind == E_OBJECT) {
        const obj_spec *o = &g->objs.p[e->a];
        for (uint32_t i = 0; i < o->n; i++) calls_of_seq(g, g->members.p[o->first + i].seq, f, ctx);
        if (o->extra >= 0) calls_of_seq(g, (uint32_t)o->extra, f, ctx);
    } else if (e->kind == E_ARRAY) {
        calls_of_seq(g, g->arrs.p[e->a].seq, f, ctx);
    }
}

static void calls_of_seq(const cart_grammar *g, uint32_t p, void (*f)(void *, uint32_t), void *ctx) {
    for (; g->elems.p[p].kind != E_END; p++) calls_of_elem(g, p, f, ctx);
}

typedef struct edge_ctx {
    uint32_t from;
    uint32_t *count;          /* pass 1: per callee */
    uint32_t *fill, *list;    /* pass 2 */
} edge_ctx;

static void count_edge(void *ctx, uint32_t callee) {
    ((edge_ctx *)ctx)->count[callee]++;
}

static void fill_edge(void *ctx, uint32_t callee) {
    edge_ctx *e = ctx;
    e->list[e->fill[callee]++] = e->from;
}

/* users: for each rule the rules whose sequences call it. */
static int build_users(const cart_grammar *g, graph *out) {
    uint32_t nr = g->rules.n;
    uint32_t *count = cart_calloc((size_t)nr + 1, sizeof *count, "grammar");
    if (!count) return CART_E_NOMEM;
    edge_ctx e = {0, count, NULL, NULL};
    for (uint32_t r = 0; r < nr; r++) {
        e.from = r;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) calls_of_seq(g, g->alts.p[g->rules.p[r].first + a], count_edge, &e);
    }
    uint32_t *start = cart_calloc((size_t)nr + 1, sizeof *start, "grammar");
    if (!start) {
        free(count);
        return CART_E_NOMEM;
    }
    for (uint32_t r = 0; r < nr; r++) start[r + 1] = start[r] + count[r];
    uint32_t *list = cart_malloc(((size_t)start[nr] + 1) * sizeof *list, "grammar");
    if (!list) {
        free(count);
        free(start);
        return CART_E_NOMEM;
    }
    memcpy(count, start, (size_t)nr * sizeof *count);
    e.fill = count;
    e.list = list;
    for (uint32_t r = 0; r < nr; r++) {
        e.from = r;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) calls_of_seq(g, g->alts.p[g->rules.p[r].first + a], fill_edge, &e);
    }
    free(count);
    out->start = start;
    out->list = list;
    return CART_OK;
}

/* Least fixpoint of the rules' needs with a worklist: each rule's need is
 * the least over its alternatives of step + the most its elements need;
 * values saturate at cap (which then means "never"). step 0, cap 1 gives
 * productivity (0: has a finite instance). */
static int solve_needs(cart_grammar *g, const graph *users, uint16_t step, uint16_t cap) {
    uint32_t nr = g->rules.n;
    for (uint32_t r = 0; r < nr; r++) g->rneed[r] = cap;
    uint32_t *queue = cart_malloc(((size_t)nr + 1) * sizeof *queue, "grammar");
    uint8_t *queued = cart_calloc((size_t)nr + 1, 1, "grammar");
    if (!queue || !queued) {
        free(queue);
        free(queued);
        return CART_E_NOMEM;
    }
    uint32_t head = 0, n = 0; /* a ring of at most nr entries */
    for (uint32_t r = 0; r < nr; r++) queue[n++] = r, queued[r] = 1;
    while (n) {
        uint32_t r = queue[head];
        head = (head + 1) % nr;
        n--;
        queued[r] = 0;
        uint16_t best = cap;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) {
            uint16_t v = plus(seq_need(g, g->alts.p[g->rules.p[r].first + a], step, cap), step, cap);
            if (v < best) best = v;
        }
        if (best < g->rneed[r]) {
            g->rneed[r] = best;
            for (uint32_t k = users->start[r]; k < users->start[r + 1]; k++) {
                uint32_t u = users->list[k];
                if (!queued[u]) {
                    queue[(head + n) % nr] = u;
                    n++;
                    queued[u] = 1;
                }
            }
        }
    }
    free(queue);
    free(queued);
    return CART_OK;
}

/* A rule that can call itself before writing a byte ($ref loops through
 * anyOf or plain $refs) would make the matcher loop: refused. */
static int check_left_recursion(const cart_grammar *g) {
    uint32_t nr = g->rules.n;
    /* Kahn's algorithm on "r calls r' first": rules left over sit on a cycle */
    uint32_t *indeg = cart_calloc((size_t)nr + 1, sizeof *indeg, "grammar");
    uint32_t *stack = cart_malloc(((size_t)nr + 1) * sizeof *stack, "grammar");
    if (!indeg || !stack) {
        free(indeg);
        free(stack);
        return CART_E_NOMEM;
    }
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) {
            const elem *e = &g->elems.p[g->alts.p[g->rules.p[r].first + a]];
            if (e->kind == E_RULE) indeg[e->a]++;
        }
    uint32_t top = 0, done = 0;
    for (uint32_t r = 0; r < nr; r++)
        if (!indeg[r]) stack[top++] = r;
    while (top) {
        uint32_t r = stack[--top];
        done++;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) {
            const elem *e = &g->elems.p[g->alts.p[g->rules.p[r].first + a]];
            if (e->kind == E_RULE && --indeg[e->a] == 0) stack[top++] = e->a;
        }
    }
    free(indeg);
    free(stack);
    if (done < nr)
        return cart_fail(CART_E_FORMAT, "#: a $ref refers back to itself before any value is written (for example "
                                        "through anyOf or a chain of $refs): the schema describes no finite "
                                        "value");
    return CART_OK;
}

/* The longest document, or -1: rules in topological order of their calls
 * (a rule on a cycle is unbounded, and so is everything that calls it). */
static int64_t seq_max(const cart_grammar *g, const int64_t *rmax, uint32_t p);

static int64_t add_sat(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || a > INT64_MAX - b) return -1;
    return a + b;
}

static int64_t mul_sat(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (b && a > INT64_MAX / b) return -1;
    return a * b;
}

static int64_t elem_max(const cart_grammar *g, const int64_t *rmax, uint32_t p) {
    const elem *e = &g->elems.p[p];
    switch (e->kind) {
    case E_LIT: return e->b;
    case E_RULE: return rmax[e->a];
    case E_WS: return 1 + WS_INDENT;
    case E_STRING: {
        const str_spec *s = &g->strs.p[e->a];
        return s->max == UNBOUNDED ? -1 : add_sat(2, mul_sat(6, s->max)); /* \uXXXX is the longest character */
    }
    case E_NUMBER: {
        const num_spec *s = &g->nums.p[e->a];
        if (s->integer) return 1 + NUM_DIGITS;
        return 1 + NUM_DIGITS + 1 + NUM_DIGITS + (s->bounded ? 0 : 4);
    }
    case E_CHOICE:
        return e->b; /* the longest text */
    case E_OBJECT: {
        const obj_spec *o = &g->objs.p[e->a];
        if (o->extra >= 0) return -1;
        int64_t v = 0;
        for (uint32_t i = 0; i < o->n; i++) v = add_sat(v, seq_max(g, rmax, g->members.p[o->first + i].seq));
        return v;
    }
    case E_ARRAY: {
        const arr_spec *a = &g->arrs.p[e->a];
        if (a->max == UNBOUNDED) return -1;
        return mul_sat(a->max, seq_max(g, rmax, a->seq));
    }
    default:
        return 0;
    }
}

static int64_t seq_max(const cart_grammar *g, const int64_t *rmax, uint32_t p) {
    int64_t v = 0;
    for (; g->elems.p[p].kind != E_END; p++) v = add_sat(v, elem_max(g, rmax, p));
    return v;
}

static void count_callee(void *ctx, uint32_t callee) {
    (void)callee;
    (*(uint32_t *)ctx)++;
}

typedef struct kahn_ctx {
    uint32_t *pending;
    uint32_t *stack, *top;
} kahn_ctx;

static int compute_max_bytes(cart_grammar *g, const graph *users) {
    uint32_t nr = g->rules.n;
    int64_t *rmax = cart_malloc(((size_t)nr + 1) * sizeof *rmax, "grammar");
    uint32_t *pending = cart_calloc((size_t)nr + 1, sizeof *pending, "grammar");
    uint32_t *stack = cart_malloc(((size_t)nr + 1) * sizeof *stack, "grammar");
    if (!rmax || !pending || !stack) {
        free(rmax);
        free(pending);
        free(stack);
        return CART_E_NOMEM;
    }
    /* pending[r]: calls r makes (with multiplicity) to rules not yet sized;
     * unproductive alternatives are never taken and do not count */
    for (uint32_t r = 0; r < nr; r++) {
        rmax[r] = -1;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) {
            uint32_t p = g->alts.p[g->rules.p[r].first + a];
            if (g->need[p] < INFEASIBLE) calls_of_seq(g, p, count_callee, &pending[r]);
        }
    }
    uint32_t top = 0;
    for (uint32_t r = 0; r < nr; r++)
        if (!pending[r]) stack[top++] = r;
    uint8_t *sized = cart_calloc((size_t)nr + 1, 1, "grammar");
    if (!sized) {
        free(rmax);
        free(pending);
        free(stack);
        return CART_E_NOMEM;
    }
    while (top) {
        uint32_t r = stack[--top];
        int64_t best = 0;
        for (uint32_t a = 0; a < g->rules.p[r].n; a++) {
            uint32_t p = g->alts.p[g->rules.p[r].first + a];
            if (g->need[p] >= INFEASIBLE) continue;
            int64_t v = seq_max(g, rmax, p);
            if (v < 0) {
                best = -1;
                break;
            }
            if (v > best) best = v;
        }
        rmax[r] = best;
        sized[r] = 1;
        for (uint32_t k = users->start[r]; k < users->start[r + 1]; k++) {
            uint32_t u = users->list[k];
            if (pending[u] && --pending[u] == 0 && !sized[u]) stack[top++] = u;
        }
    }
    /* users lists a caller once per call, and unproductive calls were not
     * counted: a caller may reach 0 early or stay above; rules never sized
     * are on (or behind) a cycle and stay -1 */
    g->max_bytes = seq_max(g, rmax, g->root);
    free(rmax);
    free(pending);
    free(stack);
    free(sized);
    return CART_OK;
}

/* Needs, productivity, left recursion and the longest document. */
static int analyse(cart_grammar *g) {
    g->rneed = cart_malloc(((size_t)g->rules.n + 1) * sizeof *g->rneed, "grammar");
    g->need = cart_malloc(((size_t)g->elems.n + 1) * sizeof *g->need, "grammar");
    if (!g->rneed || !g->need) return CART_E_NOMEM;
    int rc = check_left_recursion(g);
    if (rc) return rc;
    graph users = {0};
    rc = build_users(g, &users);
    if (rc) return rc;
    /* productivity first, for the message */
    rc = solve_needs(g, &users, 0, 1);
    if (!rc && seq_need(g, g->root, 0, 1) != 0)
        rc = cart_fail(CART_E_FORMAT, "#: no finite JSON value satisfies the schema (a $ref that recurses with no "
                                      "way out, or a required property or minItems whose schema matches nothing)");
    if (!rc) rc = solve_needs(g, &users, 1, INFEASIBLE);
    if (!rc) {
        /* per position: the need of the rest of its sequence */
        for (uint32_t p = g->elems.n; p-- > 0;) {
            if (g->elems.p[p].kind == E_END) {
                g->need[p] = 0;
            } else {
                uint16_t e = elem_need(g, p, 1, INFEASIBLE), rest = g->need[p + 1];
                g->need[p] = e > rest ? e : rest;
            }
        }
        if (g->need[g->root] + 1 > MAX_DEPTH)
            rc = cart_fail(CART_E_FORMAT, "#: the schema needs values nested deeper than this engine's limit of "
                                          "%d stack levels", MAX_DEPTH);
    }
    if (!rc) rc = compute_max_bytes(g, &users);
    free(users.start);
    free(users.list);
    return rc;
}

/* ---- compiling entry points --------------------------------------------- */

static int finish_grammar(compiler *c, elem root) {
    uint32_t start;
    int rc = emit_seq(c, &root, 1, &start);
    if (rc) return rc;
    c->g->root = start;
    return analyse(c->g);
}

/* Schema texts must be UTF-8 and may not escape NUL (cJSON would cut the
 * string there and read a different schema). */
static int lex_schema(const char *s, int64_t len) {
    int64_t bad_at = cart_utf8_invalid_offset(s, len);
    if (bad_at >= 0) return cart_fail(CART_E_FORMAT, "schema: byte %lld is not valid UTF-8", (long long)bad_at);
    int in_string = 0;
    for (int64_t i = 0; i < len; i++) {
        if (in_string && s[i] == '\\') {
            if (i + 5 < len && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                return cart_fail(CART_E_FORMAT, "schema: byte %lld: a string escapes NUL (\\u0000), which this "
                                                "engine cannot hold in a name or value", (long long)i);
            i++;
            continue;
        }
        if (s[i] == '"') in_string = !in_string;
    }
    return CART_OK;
}

static int new_grammar(cart_grammar **g) {
    *g = cart_calloc(1, sizeof **g, "grammar");
    return *g ? CART_OK : CART_E_NOMEM;
}

int cart_grammar_from_schema(cart_grammar **out, const char *schema, int64_t len, int32_t flags) {
    *out = NULL;
    if (!schema || len < 0) return cart_fail(CART_E_ARG, "cart_grammar_from_schema: no schema text");
    int rc = lex_schema(schema, len);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(schema, (size_t)len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= schema && at <= schema + len ? (long)(at - schema) : 0;
        return cart_fail(CART_E_FORMAT, "schema: not valid JSON (near byte %ld)", off);
    }
    for (; end && end < schema + len; end++)
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            cJSON_Delete(root);
            return cart_fail(CART_E_FORMAT, "schema: text after the JSON value (byte %ld)", (long)(end - schema));
        }
    cart_grammar *g;
    rc = new_grammar(&g);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    compiler c;
    memset(&c, 0, sizeof c);
    c.g = g;
    c.root = root;
    c.flags = flags;
    c.any_rule = -1;
    strcpy(c.path, "#");
    c.path_len = 1;
    elem e;
    /* the root is also what "#" names: compile it through the memo */
    rc = compile_ref(&c, "#", &e);
    if (!rc) rc = finish_grammar(&c, e);
    free(c.memo);
    cJSON_Delete(root);
    if (rc) {
        cart_grammar_free(g);
        return rc == CART_E_NOMEM ? rc : cart_fail_context(rc, "schema");
    }
    *out = g;
    return CART_OK;
}

int cart_grammar_any_object(cart_grammar **out) {
    *out = NULL;
    cart_grammar *g;
    int rc = new_grammar(&g);
    if (rc) return rc;
    compiler c;
    memset(&c, 0, sizeof c);
    c.g = g;
    c.any_rule = -1;
    elem any, obj;
    rc = any_value(&c, &any);
    if (!rc) rc = object_rule(&c, NULL, 0, &any, &obj);
    if (!rc) rc = finish_grammar(&c, obj);
    if (rc) {
        cart_grammar_free(g);
        return rc;
    }
    *out = g;
    return CART_OK;
}

/* ---- the vocabulary ------------------------------------------------------ */

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

static void trie_free(trie *t) {
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok_start);
    free(t->ids);
}

void cart_vocab_free(cart_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->offsets);
    trie_free(&v->all);
    trie_free(&v->special);
    free(v->eog);
    free(v->plain_le);
    free(v->plain_all);
    free(v->plain_long);
    free(v);
}

int64_t cart_vocab_size(const cart_vocab *v) {
    return v->n;
}

int64_t cart_vocab_mask_words(const cart_vocab *v) {
    return v->words;
}

static const cart_vocab *sort_vocab; /* qsort has no context argument */

static int compare_tokens(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const cart_vocab *v = sort_vocab;
    int64_t la = v->offsets[a + 1] - v->offsets[a], lb = v->offsets[b + 1] - v->offsets[b];
    int c = memcmp(v->bytes + v->offsets[a], v->bytes + v->offsets[b], (size_t)(la < lb ? la : lb));
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Builds the preorder trie of ids[0..n) (sorted by bytes). */
static int trie_build(const cart_vocab *v, const int32_t *ids, int64_t n, trie *t) {
    int64_t total = 1;
    for (int64_t i = 0; i < n; i++) total += v->offsets[ids[i] + 1] - v->offsets[ids[i]];
    if (total > UINT32_MAX / 2) return cart_fail(CART_E_ARG, "vocab: the tokens hold too many bytes");
    t->byte = cart_malloc((size_t)total, "vocab");
    t->depth = cart_malloc((size_t)total * sizeof *t->depth, "vocab");
    t->skip = cart_malloc((size_t)total * sizeof *t->skip, "vocab");
    t->tok_start = cart_calloc((size_t)total + 1, sizeof *t->tok_start, "vocab");
    t->ids = cart_malloc((size_t)(n ? n : 1) * sizeof *t->ids, "vocab");
    uint32_t *path = cart_malloc(((size_t)MAX_TOKEN_BYTES + 2) * sizeof *path, "vocab");
    if (!t->byte || !t->depth || !t->skip || !t->tok_start || !t->ids || !path) {
        free(path);
        return CART_E_NOMEM;
    }
    /* path[d]: the node at depth d on the current branch */
    uint32_t nodes = 1;
    t->byte[0] = 0;
    t->depth[0] = 0;
    path[0] = 0;
    int64_t depth = 0;
    const char *prev = NULL;
    int64_t prev_len = 0;
    uint32_t *count = t->tok_start + 1; /* tokens per node, turned into starts below */
    for (int64_t i = 0; i < n; i++) {
        const char *s = v->bytes + v->offsets[ids[i]];
        int64_t len = v->offsets[ids[i] + 1] - v->offsets[ids[i]];
        int64_t common = 0;
        while (prev && common < len && common < prev_len && s[common] == prev[common]) common++;
        while (depth > common) t->skip[path[depth--]] = nodes;
        for (; depth < len;) {
            uint32_t k = nodes++;
            t->byte[k] = (uint8_t)s[depth];
            t->depth[k] = (uint16_t)(depth + 1);
            path[++depth] = k;
            if (depth > t->max_depth) t->max_depth = (uint16_t)depth;
        }
        count[path[len]]++;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) t->skip[path[depth--]] = nodes;
    t->skip[0] = nodes;
    t->n = nodes;
    for (uint32_t k = 0; k < nodes; k++) t->tok_start[k + 1] += t->tok_start[k];
    /* the ids in node order: the sorted order already is node order */
    memcpy(t->ids, ids, (size_t)n * sizeof *ids);
    free(path);
    return CART_OK;
}

/* A token that a JSON string at a character boundary takes whole, adding
 * only characters: returns its code point count (an unfinished last
 * character counts), or 0 when it is not plain. */
static uint32_t plain_chars(const char *s, int64_t len) {
    uint32_t st = 0, chars = 0;
    for (int64_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        if (st == 0 && (c < 0x20 || c == '"' || c == '\\')) return 0;
        int started;
        if (!utf8_step(&st, c, &started)) return 0;
        chars += (uint32_t)started;
    }
    return chars;
}

static int vocab_build(cart_vocab *v, const uint8_t *eog) {
    int64_t n = v->n;
    v->words = (n + 31) / 32;
    int32_t *all = cart_malloc((size_t)(n ? n : 1) * sizeof *all, "vocab");
    int32_t *special = cart_malloc((size_t)(n ? n : 1) * sizeof *special, "vocab");
    uint32_t *chars = cart_calloc((size_t)(n ? n : 1), sizeof *chars, "vocab");
    v->eog = cart_malloc((size_t)(n ? n : 1) * sizeof *v->eog, "vocab");
    v->plain_le = cart_calloc((size_t)(PLAIN_R + 1) * (size_t)(v->words ? v->words : 1), sizeof *v->plain_le, "vocab");
    v->plain_all = cart_calloc((size_t)(v->words ? v->words : 1), sizeof *v->plain_all, "vocab");
    if (!all || !special || !chars || !v->eog || !v->plain_le || !v->plain_all) {
        free(all);
        free(special);
        free(chars);
        return CART_E_NOMEM;
    }
    int64_t n_all = 0, n_special = 0, n_long = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = v->offsets[i + 1] - v->offsets[i];
        if (eog && eog[i]) {
            v->eog[v->n_eog++] = (int32_t)i;
            continue;
        }
        if (len == 0) continue; /* control tokens: no bytes, never allowed */
        all[n_all++] = (int32_t)i;
        chars[i] = plain_chars(v->bytes + v->offsets[i], len);
        if (!chars[i]) {
            special[n_special++] = (int32_t)i;
            continue;
        }
        v->plain_all[i / 32] |= 1u << (i % 32);
        if (chars[i] > v->max_plain) v->max_plain = chars[i];
        if (chars[i] > PLAIN_R) n_long++;
        for (uint32_t r = chars[i]; r <= PLAIN_R; r++) v->plain_le[(size_t)r * v->words + i / 32] |= 1u << (i % 32);
    }
    v->plain_long = cart_malloc((size_t)(n_long ? n_long : 1) * sizeof *v->plain_long, "vocab");
    int rc = v->plain_long ? CART_OK : CART_E_NOMEM;
    for (int64_t i = 0; i < n && !rc; i++)
        if (chars[i] > PLAIN_R) v->plain_long[v->n_plain_long++] = (long_plain){(int32_t)i, chars[i]};
    /* fewest code points first (insertion order within a count) */
    for (int64_t i = 1; i < v->n_plain_long; i++) {
        long_plain x = v->plain_long[i];
        int64_t j = i;
        while (j > 0 && v->plain_long[j - 1].chars > x.chars) v->plain_long[j] = v->plain_long[j - 1], j--;
        v->plain_long[j] = x;
    }
    if (!rc) {
        sort_vocab = v;
        qsort(all, (size_t)n_all, sizeof *all, compare_tokens);
        qsort(special, (size_t)n_special, sizeof *special, compare_tokens);
        sort_vocab = NULL;
        rc = trie_build(v, all, n_all, &v->all);
        if (!rc) rc = trie_build(v, special, n_special, &v->special);
    }
    free(all);
    free(special);
    free(chars);
    return rc;
}

int cart_vocab_from_pieces(cart_vocab **out, const char *bytes, const int64_t *offsets, const uint8_t *eog,
                           int64_t n) {
    *out = NULL;
    if (n < 0 || n > INT32_MAX || !offsets || (n > 0 && offsets[0] != 0))
        return cart_fail(CART_E_ARG, "vocab: %lld tokens, or offsets that do not start at 0", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t len = offsets[i + 1] - offsets[i];
        if (len < 0 || len > MAX_TOKEN_BYTES)
            return cart_fail(CART_E_ARG, "vocab: token %lld has %lld bytes (0 to %d allowed)", (long long)i,
                             (long long)len, MAX_TOKEN_BYTES);
    }
    if (n > 0 && offsets[n] > 0 && !bytes) return cart_fail(CART_E_ARG, "vocab: no bytes");
    cart_vocab *v = cart_calloc(1, sizeof *v, "vocab");
    if (!v) return CART_E_NOMEM;
    v->n = n;
    int64_t total = n > 0 ? offsets[n] : 0;
    v->bytes = cart_malloc((size_t)(total ? total : 1), "vocab");
    v->offsets = cart_malloc(((size_t)n + 1) * sizeof *v->offsets, "vocab");
    if (!v->bytes || !v->offsets) {
        cart_vocab_free(v);
        return CART_E_NOMEM;
    }
    if (total) memcpy(v->bytes, bytes, (size_t)total);
    if (n > 0) memcpy(v->offsets, offsets, ((size_t)n + 1) * sizeof *offsets);
    else v->offsets[0] = 0;
    int rc = vocab_build(v, eog);
    if (rc) {
        cart_vocab_free(v);
        return rc;
    }
    *out = v;
    return CART_OK;
}

int cart_vocab_new(cart_vocab **out, const cart_tokenizer *tok, int64_t n_vocab) {
    *out = NULL;
    if (!tok || n_vocab < 0 || n_vocab > INT32_MAX)
        return cart_fail(CART_E_ARG, "cart_vocab_new: no tokenizer, or n_vocab %lld out of range", (long long)n_vocab);
    int64_t have = cart_tokenizer_vocab_size(tok);
    int64_t cap = 1 << 20, used = 0;
    char *bytes = cart_malloc((size_t)cap, "vocab");
    int64_t *offsets = cart_malloc(((size_t)n_vocab + 1) * sizeof *offsets, "vocab");
    uint8_t *eog = cart_calloc((size_t)(n_vocab ? n_vocab : 1), 1, "vocab");
    int rc = bytes && offsets && eog ? CART_OK : CART_E_NOMEM;
    for (int64_t i = 0; i < n_vocab && !rc; i++) {
        offsets[i] = used;
        if (i >= have) continue;
        eog[i] = cart_tokenizer_is_eog(tok, (int32_t)i) != 0;
        int64_t len = 0;
        for (;;) {
            rc = cart_tokenizer_piece(tok, (int32_t)i, 0, bytes + used, cap - used, &len);
            if (rc || len <= cap - used) break;
            while (cap - used < len) cap *= 2;
            char *b = cart_realloc(bytes, (size_t)cap, "vocab");
            if (!b) {
                rc = CART_E_NOMEM;
                break;
            }
            bytes = b;
        }
        used += len;
    }
    if (!rc) offsets[n_vocab] = used;
    if (!rc) rc = cart_vocab_from_pieces(out, bytes, offsets, eog, n_vocab);
    free(bytes);
    free(offsets);
    free(eog);
    return rc;
}

/* ---- the matcher --------------------------------------------------------- */

typedef struct frame {
    const struct frame *up; /* where to go on when this sequence ends; NULL: the document ends */
    uint32_t pos;           /* element index */
    uint32_t a, b;          /* the element's state (see the *_step functions) */
    uint16_t depth;         /* frames on the stack, this one included */
    uint16_t persistent;    /* lives in the committed pool, not the scratch arena */
    uint32_t hash;          /* of the whole stack */
    int64_t v0, v1;         /* number digits */
} frame;

/* A bump allocator of chunks; a mark is (chunk, offset). */
typedef struct chunk {
    struct chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} chunk;

typedef struct arena {
    chunk *head, *cur;
} arena;

typedef struct mark {
    chunk *c;
    size_t used;
} mark;

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->cur && a->cur->used + n <= a->cur->size) {
        void *p = a->cur->data + a->cur->used;
        a->cur->used += n;
        return p;
    }
    /* the next chunk, reused if it is big enough, else a new one after cur */
    chunk *next = a->cur ? a->cur->next : a->head;
    if (!next || next->size < n) {
        size_t size = n > (1u << 16) ? n : (1u << 16);
        chunk *c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        c->next = next;
        if (a->cur) a->cur->next = c;
        else a->head = c;
        next = c;
    }
    a->cur = next;
    next->used = n;
    return next->data;
}

static mark arena_mark(const arena *a) {
    return (mark){a->cur, a->cur ? a->cur->used : 0};
}

static void arena_reset(arena *a, mark m) {
    a->cur = m.c;
    if (m.c) m.c->used = m.used;
    else if (a->head) a->head->used = 0;
    /* chunks after cur are reused as they come (their `used` is reset then) */
}

static void arena_free(arena *a) {
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = a->cur = NULL;
}

static void arena_clear(arena *a) {
    a->cur = NULL;
    if (a->head) a->head->used = 0;
}

typedef struct state {
    const frame **stacks; /* terminal stacks */
    int32_t n;
    uint8_t accept; /* the document may end here */
} state;

typedef struct slot {
    const frame *f;
    uint32_t stamp;
} slot;

typedef struct copy_slot {
    const frame *from;
    frame *to;
    uint32_t stamp;
} copy_slot;

struct cart_matcher {
    const cart_grammar *g;
    const cart_vocab *v;
    arena scratch;
    arena pool[2]; /* the committed state's frames live in pool[cur_pool] */
    int cur_pool;
    state cur;     /* stacks array owned (malloc) */
    int32_t cap_stacks;
    uint8_t done;  /* an end-of-generation token was accepted */
    uint8_t oom;
    int64_t bytes;
    /* the step being built */
    slot *set;
    uint32_t set_cap, set_used, stamp;
    const frame **work;
    uint32_t work_cap;
    const frame **terms;
    uint32_t terms_cap, n_terms;
    uint8_t accept;
    uint32_t created;
    /* the mask walk */
    state *levels;
    mark *marks;
    uint32_t levels_cap;
    /* copying into the pool */
    copy_slot *copy;
    uint32_t copy_cap, copy_used, copy_stamp;
};

static uint32_t mix(uint32_t h, uint32_t x) {
    h ^= x;
    h *= 0x9E3779B1u;
    return h ^ (h >> 15);
}

static uint32_t frame_hash(const frame *f) {
    uint32_t h = f->up ? f->up->hash : 0x2545F491u;
    h = mix(h, f->pos);
    h = mix(h, f->a);
    h = mix(h, f->b);
    h = mix(h, (uint32_t)f->v0);
    h = mix(h, (uint32_t)(f->v0 >> 32));
    h = mix(h, (uint32_t)f->v1);
    return h;
}

static int frames_equal(const frame *x, const frame *y) {
    for (;;) {
        if (x == y) return 1;
        if (!x || !y) return 0;
        if (x->hash != y->hash || x->pos != y->pos || x->a != y->a || x->b != y->b || x->v0 != y->v0 ||
            x->v1 != y->v1 || x->depth != y->depth)
            return 0;
        x = x->up;
        y = y->up;
    }
}

static frame *new_frame(cart_matcher *m, uint32_t pos, const frame *up) {
    if (++m->created > MAX_EXPAND) return NULL;
    frame *f = arena_alloc(&m->scratch, sizeof *f);
    if (!f) {
        m->oom = 1;
        return NULL;
    }
    f->up = up;
    f->pos = pos;
    f->a = f->b = 0;
    f->v0 = f->v1 = 0;
    f->persistent = 0;
    f->depth = (uint16_t)(up ? up->depth + 1 : 1);
    const elem *e = &m->g->elems.p[pos];
    if (e->kind == E_CHOICE) f->a = e->a;
    return f;
}

static void seal(frame *f) {
    f->hash = frame_hash(f);
}

/* The frame that goes on after f's element: the next position, or (at
 * the end of its sequence) the frame below. */
static const frame *next_of(cart_matcher *m, const frame *f, int *ok) {
    *ok = 1;
    if (m->g->elems.p[f->pos + 1].kind == E_END) return f->up;
    frame *n = new_frame(m, f->pos + 1, f->up);
    if (!n) {
        *ok = 0;
        return NULL;
    }
    n->depth = f->depth;
    seal(n);
    return n;
}

/* Inserts f in this step's set; 0 when an equal frame is already there. */
static int set_insert(cart_matcher *m, const frame *f) {
    if ((m->set_used + 1) * 2 > m->set_cap) {
        uint32_t cap = m->set_cap ? m->set_cap * 2 : 256;
        slot *s = calloc(cap, sizeof *s);
        if (!s) {
            m->oom = 1;
            return 0;
        }
        for (uint32_t i = 0; i < m->set_cap; i++)
            if (m->set[i].stamp == m->stamp && m->set[i].f) {
                uint32_t k = m->set[i].f->hash & (cap - 1);
                while (s[k].stamp == m->stamp) k = (k + 1) & (cap - 1);
                s[k] = m->set[i];
            }
        free(m->set);
        m->set = s;
        m->set_cap = cap;
    }
    uint32_t k = f->hash & (m->set_cap - 1);
    while (m->set[k].stamp == m->stamp) {
        if (frames_equal(m->set[k].f, f)) return 0;
        k = (k + 1) & (m->set_cap - 1);
    }
    m->set[k].f = f;
    m->set[k].stamp = m->stamp;
    m->set_used++;
    return 1;
}

static void begin_step(cart_matcher *m) {
    if (++m->stamp == 0) { /* wrapped: clear the stamps once */
        if (m->set) memset(m->set, 0, m->set_cap * sizeof *m->set);
        m->stamp = 1;
    }
    m->set_used = 0;
    m->n_terms = 0;
    m->accept = 0;
    m->created = 0;
}

static void add_terminal(cart_matcher *m, const frame *f) {
    if (m->n_terms >= MAX_STACKS) return;
    if (m->n_terms == m->terms_cap) {
        uint32_t cap = m->terms_cap ? m->terms_cap * 2 : 16;
        const frame **t = realloc(m->terms, cap * sizeof *t);
        if (!t) {
            m->oom = 1;
            return;
        }
        m->terms = t;
        m->terms_cap = cap;
    }
    m->terms[m->n_terms++] = f;
}

static int work_push(cart_matcher *m, uint32_t *n, const frame *f) {
    if (*n == m->work_cap) {
        uint32_t cap = m->work_cap ? m->work_cap * 2 : 64;
        const frame **w = realloc(m->work, cap * sizeof *w);
        if (!w) {
            m->oom = 1;
            return 0;
        }
        m->work = w;
        m->work_cap = cap;
    }
    m->work[(*n)++] = f;
    return 1;
}

/* Pushes f on the expansion work list unless an equal frame was already
 * seen in this step (NULL, the end of the document, always goes). */
static void push_new(cart_matcher *m, uint32_t *n, const frame *f) {
    if (f && !set_insert(m, f)) return;
    work_push(m, n, f);
}

/* A copy of f with a new element state, sealed. */
static frame *restate(cart_matcher *m, const frame *f, uint32_t a, uint32_t b, int64_t v0, int64_t v1) {
    frame *n = new_frame(m, f->pos, f->up);
    if (!n) return NULL;
    n->depth = f->depth;
    n->a = a;
    n->b = b;
    n->v0 = v0;
    n->v1 = v1;
    seal(n);
    return n;
}

/* Pushes sequence p as the child of a continuation of f (f's element in
 * state a, b): the object member, extra property or array item that comes
 * next, when the depth allows it. 0 when frames ran out (try no more). */
static int push_child(cart_matcher *m, uint32_t *n, const frame *f, uint32_t p, uint32_t a, uint32_t b) {
    if (f->depth + 1 + m->g->need[p] > MAX_DEPTH) return 1;
    frame *cont = restate(m, f, a, b, 0, 0);
    frame *child = cont ? new_frame(m, p, cont) : NULL;
    if (!child) return 0;
    seal(child);
    push_new(m, n, child);
    return 1;
}

/* Expands f (or NULL: the end) into terminal stacks: a frame whose element
 * consumes the next byte becomes a stack of the step; the others lead on. */
static void expand(cart_matcher *m, const frame *start) {
    const cart_grammar *g = m->g;
    uint32_t n = 0;
    push_new(m, &n, start);
    int ok;
    while (n) {
        const frame *f = m->work[--n];
        if (!f) {
            m->accept = 1;
            continue;
        }
        const elem *e = &g->elems.p[f->pos];
        switch (e->kind) {
        case E_END:
            push_new(m, &n, f->up);
            break;
        case E_LIT:
        case E_STRING:
            add_terminal(m, f);
            break;
        case E_NUMBER: {
            const num_spec *s = &g->nums.p[e->a];
            if (number_open(s, f->a, f->v0, f->v1)) add_terminal(m, f);
            if (number_complete(s, f->a, f->v0, f->v1)) {
                const frame *nx = next_of(m, f, &ok);
                if (ok) push_new(m, &n, nx);
            }
            break;
        }
        case E_WS: {
            if (f->a == 0 || (f->a >= 2 && f->a - 2 < WS_INDENT)) add_terminal(m, f);
            const frame *nx = next_of(m, f, &ok);
            if (ok) push_new(m, &n, nx);
            break;
        }
        case E_CHOICE: {
            const cnode *c = &g->cnodes.p[f->a];
            if (c->child) add_terminal(m, f);
            if (c->final) {
                const frame *nx = next_of(m, f, &ok);
                if (ok) push_new(m, &n, nx);
            }
            break;
        }
        case E_RULE: {
            const rule *r = &g->rules.p[e->a];
            const frame *cont = next_of(m, f, &ok);
            if (!ok) break;
            uint16_t depth = cont ? cont->depth : 0;
            for (uint32_t i = 0; i < r->n; i++) {
                uint32_t p = g->alts.p[r->first + i];
                if (depth + 1 + g->need[p] > MAX_DEPTH) continue;
                frame *alt = new_frame(m, p, cont);
                if (!alt) break;
                seal(alt);
                push_new(m, &n, alt);
            }
            break;
        }
        case E_OBJECT: {
            const obj_spec *o = &g->objs.p[e->a];
            uint32_t i = f->a, wrote = f->b;
            /* member j may come next if every member before it is optional */
            for (uint32_t j = i; j < o->n; j++) {
                const member *mb = &g->members.p[o->first + j];
                if (!push_child(m, &n, f, mb->seq + (wrote ? 0 : 2), j + 1, 1)) break;
                if (mb->required) break;
            }
            if ((int32_t)i > o->last_req) {
                if (o->extra >= 0) push_child(m, &n, f, (uint32_t)o->extra + (wrote ? 0 : 2), o->n, 1);
                const frame *nx = next_of(m, f, &ok);
                if (ok) push_new(m, &n, nx);
            }
            break;
        }
        case E_ARRAY: {
            const arr_spec *a = &g->arrs.p[e->a];
            uint32_t count = f->a;
            if (count < a->max) push_child(m, &n, f, a->seq + (count ? 0 : 2), count + 1, 0);
            if (count >= a->min) {
                const frame *nx = next_of(m, f, &ok);
                if (ok) push_new(m, &n, nx);
            }
            break;
        }
        }
    }
}

/* Consumes byte c on stack f, expanding what follows into this step. */
static void step_stack(cart_matcher *m, const frame *f, uint8_t c) {
    const cart_grammar *g = m->g;
    const elem *e = &g->elems.p[f->pos];
    int ok;
    switch (e->kind) {
    case E_LIT:
        if (g->lits.p[e->a + f->a] != c) return;
        if (f->a + 1 == e->b) {
            const frame *nx = next_of(m, f, &ok);
            if (ok) expand(m, nx);
        } else {
            frame *n = restate(m, f, f->a + 1, 0, 0, 0);
            if (n && set_insert(m, n)) add_terminal(m, n);
        }
        return;
    case E_STRING: {
        uint32_t na, nb;
        int r = string_step(&g->strs.p[e->a], f->a, f->b, c, &na, &nb);
        if (r == STR_DEAD) return;
        if (r == STR_CLOSED) {
            const frame *nx = next_of(m, f, &ok);
            if (ok) expand(m, nx);
            return;
        }
        frame *n = restate(m, f, na, nb, 0, 0);
        if (n && set_insert(m, n)) add_terminal(m, n);
        return;
    }
    case E_NUMBER: {
        uint32_t na;
        int64_t I, F;
        if (!number_step(&g->nums.p[e->a], f->a, f->v0, f->v1, c, &na, &I, &F)) return;
        frame *n = restate(m, f, na, 0, I, F);
        if (n) expand(m, n);
        return;
    }
    case E_WS: {
        uint32_t a = f->a, na;
        if (a == 0 && c == ' ') na = 1;
        else if (a == 0 && c == '\n') na = 2;
        else if (a >= 2 && a - 2 < WS_INDENT && (c == ' ' || c == '\t')) na = a + 1;
        else return;
        frame *n = restate(m, f, na, 0, 0, 0);
        if (n) expand(m, n);
        return;
    }
    case E_CHOICE: {
        uint32_t ch = g->cnodes.p[f->a].child;
        while (ch && g->cnodes.p[ch].byte != c) ch = g->cnodes.p[ch].sibling;
        if (!ch) return;
        frame *n = restate(m, f, ch, 0, 0, 0);
        if (n) expand(m, n);
        return;
    }
    default:
        return;
    }
}

/* The state after byte c, its stacks in the scratch arena. Returns 0 when
 * nothing survives (no stack and no end). */
static int advance(cart_matcher *m, const state *s, uint8_t c, state *out) {
    begin_step(m);
    for (int32_t i = 0; i < s->n; i++) step_stack(m, s->stacks[i], c);
    out->accept = m->accept;
    out->n = (int32_t)m->n_terms;
    out->stacks = NULL;
    if (m->n_terms) {
        const frame **st = arena_alloc(&m->scratch, m->n_terms * sizeof *st);
        if (!st) {
            m->oom = 1;
            out->n = 0;
            return out->accept;
        }
        memcpy(st, m->terms, m->n_terms * sizeof *st);
        out->stacks = st;
    }
    return out->n > 0 || out->accept;
}

/* ---- committing ---------------------------------------------------------- */

/* The copy of f in the pool being filled (copy_stack), found through an
 * open-addressing table stamped per commit. */
static frame *copy_lookup(cart_matcher *m, const frame *f, uint32_t *at) {
    uint32_t k = (uint32_t)(((uintptr_t)f >> 4) * 0x9E3779B1u) & (m->copy_cap - 1);
    while (m->copy[k].stamp == m->copy_stamp) {
        if (m->copy[k].from == f) return m->copy[k].to;
        k = (k + 1) & (m->copy_cap - 1);
    }
    *at = k;
    return NULL;
}

static int copy_reserve(cart_matcher *m) {
    if ((m->copy_used + 1) * 2 <= m->copy_cap) return CART_OK;
    uint32_t cap = m->copy_cap ? m->copy_cap * 2 : 256;
    copy_slot *t = calloc(cap, sizeof *t);
    if (!t) return CART_E_NOMEM;
    for (uint32_t i = 0; i < m->copy_cap; i++)
        if (m->copy[i].stamp == m->copy_stamp) {
            uint32_t k = (uint32_t)(((uintptr_t)m->copy[i].from >> 4) * 0x9E3779B1u) & (cap - 1);
            while (t[k].stamp == m->copy_stamp) k = (k + 1) & (cap - 1);
            t[k] = m->copy[i];
        }
    free(m->copy);
    m->copy = t;
    m->copy_cap = cap;
    return CART_OK;
}

/* f and the frames below it, copied into pool where they are not there
 * yet (all of them with `all`); shared frames are copied once. Recursion
 * depth is the stack's, at most MAX_DEPTH. */
static const frame *copy_stack(cart_matcher *m, arena *pool, const frame *f, int all) {
    if (!f || (f->persistent && !all)) return f;
    uint32_t at = 0;
    if (copy_reserve(m)) {
        m->oom = 1;
        return NULL;
    }
    frame *done = copy_lookup(m, f, &at);
    if (done) return done;
    const frame *below = copy_stack(m, pool, f->up, all);
    if (m->oom || copy_reserve(m)) {
        m->oom = 1;
        return NULL;
    }
    frame *to = arena_alloc(pool, sizeof *to);
    if (!to) {
        m->oom = 1;
        return NULL;
    }
    *to = *f;
    to->up = below;
    to->persistent = 1;
    copy_lookup(m, f, &at); /* the table may have grown below */
    m->copy[at] = (copy_slot){f, to, m->copy_stamp};
    m->copy_used++;
    return to;
}

/* Makes s the committed state: its frames that are not in the pool yet are
 * copied there. With fresh_pool, every frame is copied into the other
 * pool, which then becomes the pool (compaction). */
static int commit(cart_matcher *m, const state *s, int fresh_pool) {
    arena *pool = &m->pool[fresh_pool ? 1 - m->cur_pool : m->cur_pool];
    if (fresh_pool) arena_clear(pool);
    if (s->n > m->cap_stacks) {
        const frame **st = realloc(m->cur.stacks, (size_t)s->n * sizeof *st);
        if (!st) return CART_E_NOMEM;
        m->cur.stacks = st;
        m->cap_stacks = s->n;
    }
    if (++m->copy_stamp == 0) {
        if (m->copy) memset(m->copy, 0, m->copy_cap * sizeof *m->copy);
        m->copy_stamp = 1;
    }
    m->copy_used = 0;
    for (int32_t i = 0; i < s->n; i++) {
        const frame *f = copy_stack(m, pool, s->stacks[i], fresh_pool);
        if (m->oom) return CART_E_NOMEM;
        m->cur.stacks[i] = f;
    }
    m->cur.n = s->n;
    m->cur.accept = s->accept;
    if (fresh_pool) m->cur_pool = 1 - m->cur_pool;
    return CART_OK;
}

/* Pool size in bytes (its chunks in use). */
static size_t pool_bytes(const arena *a) {
    size_t n = 0;
    for (chunk *c = a->head; c; c = c->next) {
        n += c->used;
        if (c == a->cur) break;
    }
    return n;
}

/* Rewrites the committed state into a fresh pool when the old one holds
 * mostly frames no stack uses any more. */
static int compact(cart_matcher *m) {
    if (pool_bytes(&m->pool[m->cur_pool]) < (1u << 20)) return CART_OK;
    /* commit writes m->cur.stacks while reading s: give it a copy */
    state s = {NULL, m->cur.n, m->cur.accept};
    const frame **copy = malloc((size_t)(s.n ? s.n : 1) * sizeof *copy);
    if (!copy) return CART_E_NOMEM;
    memcpy(copy, m->cur.stacks, (size_t)s.n * sizeof *copy);
    s.stacks = copy;
    m->oom = 0;
    int rc = commit(m, &s, 1);
    free(copy);
    return rc;
}

static void start_state(cart_matcher *m) {
    arena_clear(&m->scratch);
    arena_clear(&m->pool[0]);
    arena_clear(&m->pool[1]);
    m->cur_pool = 0;
    m->done = 0;
    m->oom = 0;
    m->bytes = 0;
    begin_step(m);
    frame *root = new_frame(m, m->g->root, NULL);
    if (root) {
        seal(root);
        expand(m, root);
    }
    state s = {m->terms, (int32_t)m->n_terms, m->accept};
    if (commit(m, &s, 0)) m->oom = 1;
    arena_clear(&m->scratch);
}

int cart_matcher_new(cart_matcher **out, const cart_grammar *g, const cart_vocab *v) {
    *out = NULL;
    if (!g || !v) return cart_fail(CART_E_ARG, "cart_matcher_new: a grammar and a vocab are needed");
    cart_matcher *m = cart_calloc(1, sizeof *m, "matcher");
    if (!m) return CART_E_NOMEM;
    m->g = g;
    m->v = v;
    uint32_t levels = (uint32_t)(v->all.max_depth > v->special.max_depth ? v->all.max_depth : v->special.max_depth) + 2;
    m->levels = cart_calloc(levels, sizeof *m->levels, "matcher");
    m->marks = cart_calloc(levels, sizeof *m->marks, "matcher");
    m->levels_cap = levels;
    if (!m->levels || !m->marks) {
        cart_matcher_free(m);
        return CART_E_NOMEM;
    }
    start_state(m);
    if (m->oom) {
        cart_matcher_free(m);
        return cart_fail(CART_E_NOMEM, "matcher: out of memory");
    }
    *out = m;
    return CART_OK;
}

void cart_matcher_free(cart_matcher *m) {
    if (!m) return;
    arena_free(&m->scratch);
    arena_free(&m->pool[0]);
    arena_free(&m->pool[1]);
    free(m->cur.stacks);
    free(m->set);
    free(m->work);
    free(m->terms);
    free(m->levels);
    free(m->marks);
    free(m->copy);
    free(m);
}

void cart_matcher_reset(cart_matcher *m) {
    start_state(m);
}

int32_t cart_matcher_can_end(const cart_matcher *m) {
    return !m->done && m->cur.accept;
}

int32_t cart_matcher_is_done(const cart_matcher *m) {
    return m->done || (m->cur.accept && m->cur.n == 0);
}

int64_t cart_matcher_bytes(const cart_matcher *m) {
    return m->bytes;
}

/* Walks trie t from state s (the root), setting the bits of every token
 * whose bytes all step. */
static void walk(cart_matcher *m, const trie *t, const state *s, uint32_t *mask) {
    if (t->n <= 1 || s->n == 0) return;
    mark base = arena_mark(&m->scratch);
    m->levels[0] = *s;
    m->marks[0] = base;
    uint32_t k = 1;
    while (k < t->n) {
        uint16_t d = t->depth[k];
        arena_reset(&m->scratch, m->marks[d - 1]);
        state ns;
        if (!advance(m, &m->levels[d - 1], t->byte[k], &ns)) {
            k = t->skip[k];
            continue;
        }
        for (uint32_t j = t->tok_start[k]; j < t->tok_start[k + 1]; j++) {
            int32_t id = t->ids[j];
            mask[id / 32] |= 1u << (id % 32);
        }
        if (ns.n == 0) {
            k = t->skip[k];
            continue;
        }
        m->levels[d] = ns;
        m->marks[d] = arena_mark(&m->scratch);
        k++;
    }
    arena_reset(&m->scratch, base);
}

int cart_matcher_mask(cart_matcher *m, uint32_t *mask, int64_t n_words, int64_t *n_allowed) {
    const cart_vocab *v = m->v;
    if (n_allowed) *n_allowed = 0;
    if (!mask || n_words < v->words)
        return cart_fail(CART_E_ARG, "cart_matcher_mask: the mask has %lld words; this vocabulary needs %lld",
                         (long long)n_words, (long long)v->words);
    memset(mask, 0, (size_t)n_words * sizeof *mask);
    if (m->done) return CART_OK;
    arena_clear(&m->scratch);
    m->oom = 0;
    /* split the stacks: strings at a character boundary (F) and the rest */
    const cart_grammar *g = m->g;
    state S = m->cur, O;
    const frame **other = arena_alloc(&m->scratch, (size_t)(S.n ? S.n : 1) * sizeof *other);
    if (!other) return cart_fail(CART_E_NOMEM, "matcher: out of memory");
    O.stacks = other;
    O.n = 0;
    O.accept = 0;
    int64_t room = -1; /* the most code points a boundary string may still add; -1: none is there */
    for (int32_t i = 0; i < S.n; i++) {
        const frame *f = S.stacks[i];
        const elem *e = &g->elems.p[f->pos];
        if (e->kind == E_STRING && f->b == S_BOUNDARY) {
            const str_spec *sp = &g->strs.p[e->a];
            int64_t r = sp->max == UNBOUNDED ? INT64_MAX : (int64_t)sp->max - f->a;
            if (r > room) room = r;
        } else {
            other[O.n++] = f;
        }
    }
    if (room < 0) {
        walk(m, &v->all, &S, mask);
    } else {
        if (room >= (int64_t)v->max_plain) {
            for (int64_t w = 0; w < v->words; w++) mask[w] |= v->plain_all[w];
        } else if (room > 0) {
            int64_t r = room < PLAIN_R ? room : PLAIN_R;
            const uint32_t *row = v->plain_le + (size_t)r * (size_t)v->words;
            for (int64_t w = 0; w < v->words; w++) mask[w] |= row[w];
            for (int64_t j = 0; j < v->n_plain_long && v->plain_long[j].chars <= room; j++) {
                int32_t id = v->plain_long[j].id;
                mask[id / 32] |= 1u << (id % 32);
            }
        }
        walk(m, &v->special, &S, mask);
        if (O.n) walk(m, &v->all, &O, mask);
    }
    if (m->cur.accept)
        for (int64_t i = 0; i < v->n_eog; i++) mask[v->eog[i] / 32] |= 1u << (v->eog[i] % 32);
    arena_clear(&m->scratch);
    if (m->oom) return cart_fail(CART_E_NOMEM, "matcher: out of memory while computing the mask");
    if (n_allowed) {
        int64_t n = 0;
        for (int64_t w = 0; w < v->words; w++) n += __builtin_popcount(mask[w]);
        *n_allowed = n;
    }
    return CART_OK;
}

/* Steps the committed state through len bytes; with commit_each the new
 * state is committed after every byte. Returns the number of bytes that
 * stepped (len on success). */
static int64_t run_bytes(cart_matcher *m, const char *bytes, int64_t len, int do_commit) {
    state s = m->cur;
    arena_clear(&m->scratch);
    for (int64_t i = 0; i < len; i++) {
        state ns;
        if (s.n == 0 || !advance(m, &s, (uint8_t)bytes[i], &ns)) return i;
        if (do_commit) {
            if (commit(m, &ns, 0)) {
                m->oom = 1;
                return i;
            }
            arena_clear(&m->scratch);
            s = m->cur;
        } else {
            s = ns;
        }
    }
    return len;
}

int32_t cart_matcher_try_bytes(cart_matcher *m, const char *bytes, int64_t len) {
    if (m->done) return len == 0;
    m->oom = 0;
    int64_t n = run_bytes(m, bytes, len, 0);
    arena_clear(&m->scratch);
    return n == len && !m->oom;
}

int cart_matcher_accept_bytes(cart_matcher *m, const char *bytes, int64_t len) {
    if (len < 0 || (len > 0 && !bytes)) return cart_fail(CART_E_ARG, "cart_matcher_accept_bytes: no bytes");
    if (m->done) {
        if (len == 0) return CART_OK;
        return cart_fail(CART_E_ARG, "matcher: the document has ended; nothing can follow");
    }
    m->oom = 0;
    int64_t ok = run_bytes(m, bytes, len, 0);
    arena_clear(&m->scratch);
    if (m->oom) return cart_fail(CART_E_NOMEM, "matcher: out of memory");
    if (ok < len) {
        uint8_t c = (uint8_t)bytes[ok];
        return cart_fail(CART_E_ARG, "matcher: byte %lld (0x%02x '%c') cannot continue the document",
                         (long long)ok, c, c >= 0x20 && c < 0x7F ? c : '?');
    }
    /* the bytes fit: step again, committing as it goes */
    if (run_bytes(m, bytes, len, 1) < len || m->oom) return cart_fail(CART_E_NOMEM, "matcher: out of memory");
    arena_clear(&m->scratch);
    m->bytes += len;
    if (compact(m)) return cart_fail(CART_E_NOMEM, "matcher: out of memory");
    return CART_OK;
}

int cart_matcher_accept(cart_matcher *m, int32_t id) {
    const cart_vocab *v = m->v;
    if (id < 0 || id >= v->n) return cart_fail(CART_E_ARG, "matcher: token %d is not in the vocabulary", id);
    for (int64_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) {
            if (!cart_matcher_can_end(m))
                return cart_fail(CART_E_ARG, "matcher: token %d ends generation but the document is not complete", id);
            m->done = 1;
            return CART_OK;
        }
    int64_t len = v->offsets[id + 1] - v->offsets[id];
    if (len == 0) return cart_fail(CART_E_ARG, "matcher: token %d has no bytes and cannot continue a document", id);
    int rc = cart_matcher_accept_bytes(m, v->bytes + v->offsets[id], len);
    if (rc) return cart_fail_context(rc, "token %d", id);
    return CART_OK;
}
