/*
 * grammar_schema.c - JSON Schema -> the grammar's element array, and the analysis that
 * makes every stack completable (grammar_internal.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar_internal.h"
#include "internal.h"
#include "utf8.h"


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
    s.lo = -cart_gr_max_magnitude(integer);
    s.hi = cart_gr_max_magnitude(integer);
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
            } else if (ch == '%' && cart_gr_is_hex((uint8_t)p[0]) && cart_gr_is_hex((uint8_t)p[1])) {
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
    i128 lo = -GR_SCALE * GR_SCALE, hi = GR_SCALE * GR_SCALE; /* in units of 10^-16, before clamping */
    static const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        rc = number_keyword(c, node, keys[k], &v, &has);
        if (rc) return rc;
        if (!has) continue;
        s.bounded = 1;
        i128 b;
        switch (k) {
        case 0: b = cart_gr_scaled_min_incl(v); if (b > lo) lo = b; break;
        case 1: b = cart_gr_scaled_max_incl(v); if (b < hi) hi = b; break;
        case 2: b = cart_gr_scaled_min_incl(nextafter(v, INFINITY)); if (b > lo) lo = b; break;
        default: b = cart_gr_scaled_max_incl(nextafter(v, -INFINITY)); if (b < hi) hi = b; break;
        }
    }
    if (integer) {
        lo = cart_gr_ceil_div(lo, GR_SCALE);
        hi = cart_gr_floor_div(hi, GR_SCALE);
    }
    i128 m = cart_gr_max_magnitude(integer);
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
