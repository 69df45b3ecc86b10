/*
 * test_grammar.c - structured output (engine/grammar.h): documents each
 * schema feature accepts and refuses, the token mask against a brute-force
 * mask (every token tried byte by byte), random decodings that must parse
 * as JSON within the grammar's length bound, refused and hostile schemas,
 * the real Qwen3 vocabulary (when ../shared has it), and the masked sampler.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "grammar.h"
#include "gguf.h"
#include "rng.h"
#include "sampler.h"
#include "tokenizer.h"

#ifndef CART_SHARED_DIR
#define CART_SHARED_DIR CART_SOURCE_DIR "/../shared"
#endif

static const char *QWEN_REAL = CART_SHARED_DIR "/reference/qwen3-tiny-realvocab-f16.gguf";

/* ---- a test vocabulary: every byte, pieces a BPE vocabulary has, an
 * end-of-generation token and a control token (no bytes) ---------------- */

static const char *const PIECES[] = {
    "{\"", "\"}", "\":", "\": ", "\",", "\", \"", "{\"name\": \"", " \"", "\n", "\n  ", "\n    \"", "  ", "\t",
    "true", "false", "null", "nu", "ll", "tr", "ue", "fal", "se", "12", "123", "-1", "0.", ".5", "e+", "1e", "E-",
    "\\\"", "\\\\", "\\u", "00e9", "\\n", "\\ud83d", "\xC3\xA9", "\xC3", "\xA9", "\xE6\x97\xA5\xE6\x9C\xAC",
    "\xE6\x97", "\xA5", "\xF0\x9F\x98\x80", "\xF0\x9F", "\x98\x80", "\xED\xA0\x80", "abc", "hello", " world",
    ", ", ",", "[", "]", "[{\"", "}]", "\"]", "[\"", "},{\"", "}", "{", ":", "\"a\"", "\"b\"", "ab\"", "a\"}",
    "\"x\": 1", "0", "00", "-0", "9999999999999999", "1.25", "3.14159", "99", "42", "name", "age", "tags",
    "red", "\"red\"", "green", "blue", " true", " null", "\"\"", "[]", "{}", "1,", "1]", "1}", "\"\n", "\n}",
    "\r", "\x01", "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC",
    "x\"y", "ab\\", "\\/", "\\b\\f", "\\r\\t", "children", "value", "next", "\"value\": ", "\"next\": ",
};

typedef struct tvocab {
    cart_vocab *v;
    int32_t n, eos, control;
    char *bytes;
    int64_t *offsets;
    uint8_t *eog;
} tvocab;

static tvocab make_vocab(void) {
    tvocab t;
    int n_pieces = (int)(sizeof PIECES / sizeof PIECES[0]);
    t.n = 256 + n_pieces + 2;
    t.eos = t.n - 2;
    t.control = t.n - 1;
    t.offsets = calloc((size_t)t.n + 1, sizeof *t.offsets);
    t.eog = calloc((size_t)t.n, 1);
    size_t total = 256;
    for (int i = 0; i < n_pieces; i++) total += strlen(PIECES[i]);
    t.bytes = malloc(total);
    int64_t at = 0;
    for (int i = 0; i < t.n; i++) {
        t.offsets[i] = at;
        if (i < 256) t.bytes[at++] = (char)i;
        else if (i < 256 + n_pieces) {
            size_t len = strlen(PIECES[i - 256]);
            memcpy(t.bytes + at, PIECES[i - 256], len);
            at += (int64_t)len;
        }
    }
    t.offsets[t.n] = at;
    t.eog[t.eos] = 1;
    t.v = NULL;
    CHECK_OK(cart_vocab_from_pieces(&t.v, t.bytes, t.offsets, t.eog, t.n));
    return t;
}

static void free_vocab(tvocab *t) {
    cart_vocab_free(t->v);
    free(t->bytes);
    free(t->offsets);
    free(t->eog);
}

static cart_grammar *compile(const char *schema) {
    cart_grammar *g = NULL;
    int rc = cart_grammar_from_schema(&g, schema, (int64_t)strlen(schema), 0);
    if (rc != CART_OK) {
        fprintf(stderr, "  FAIL: schema %s did not compile: %s\n", schema, cart_last_error());
        check_failures++;
        check_case_failed = 1;
    }
    return g;
}

/* Whether doc is a complete document of g. */
static int accepts(const cart_grammar *g, const cart_vocab *v, const char *doc) {
    cart_matcher *m = NULL;
    if (cart_matcher_new(&m, g, v) != CART_OK) return -1;
    int ok = cart_matcher_accept_bytes(m, doc, (int64_t)strlen(doc)) == CART_OK && cart_matcher_can_end(m);
    cart_matcher_free(m);
    return ok;
}

/* Each doc in yes must be accepted, each in no refused. */
static void check_docs(const char *schema, const char *const *yes, const char *const *no) {
    tvocab t = make_vocab();
    cart_grammar *g = compile(schema);
    if (!g) {
        free_vocab(&t);
        return;
    }
    int n_yes = 0, n_no = 0;
    for (; *yes; yes++, n_yes++)
        CHECK_MSG(accepts(g, t.v, *yes) == 1, "schema %s should accept %s", schema, *yes);
    for (; *no; no++, n_no++)
        CHECK_MSG(accepts(g, t.v, *no) == 0, "schema %s should refuse %s", schema, *no);
    printf("  %-70.70s %2d accepted, %2d refused\n", schema, n_yes, n_no);
    cart_grammar_free(g);
    free_vocab(&t);
}

#define DOCS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_objects_and_required_properties(void) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
                    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    check_docs(s,
               DOCS("{\"name\":\"Ann\",\"age\":3}", "{ \"name\" : \"\" , \"age\" : -12 }",
                    "{\n  \"name\": \"x\",\n  \"age\": 0\n}", "{\n\t\t\"name\":\"\\u00e9\\n\",\"age\":1}"),
               DOCS("{\"age\":3,\"name\":\"Ann\"}", "{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":3,\"x\":1}",
                    "{\"name\":\"Ann\",\"age\":3.5}", "{\"name\":\"Ann\",\"age\":3,}", " {\"name\":\"a\",\"age\":1}",
                    "{\"name\":\"a\",\"age\":1} ", "{\"name\":\"a\",\"age\":1}\n", "{  \"name\":\"a\",\"age\":1}",
                    "{\n                      \"name\":\"a\",\"age\":1}", "{\"name\":\"a\"\"age\":1}",
                    "{\"name\":\"a\",\"age\":01}"));
    /* optional properties may be left out, in order */
    check_docs("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
               "\"c\":{\"type\":\"integer\"}},\"required\":[\"b\"]}",
               DOCS("{\"b\":1}", "{\"a\":1,\"b\":2}", "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"),
               DOCS("{}", "{\"a\":1}", "{\"c\":1}", "{\"b\":1,\"a\":2}", "{\"a\":1,\"c\":3}", "{,\"b\":1}"));
    /* an object that declares nothing takes free-form members */
    check_docs("{\"type\":\"object\"}",
               DOCS("{}", "{\"x\":[1,{\"y\":null}],\"\":\"\"}", "{\"a\":true,\"a\":false}"),
               DOCS("[]", "{\"x\"}", "{x:1}", "\"{}\""));
    check_docs("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
               DOCS("{}", "{\"k\":1,\"j\":-2}"), DOCS("{\"k\":\"1\"}", "{\"k\":1.5}"));
    check_docs("{\"type\":\"object\",\"additionalProperties\":false}", DOCS("{}", "{ }"), DOCS("{\"a\":1}"));
}

static void test_arrays_with_item_counts(void) {
    check_docs("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
               DOCS("[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1,\n  2\n]"),
               DOCS("[]", "[1,2,3,4]", "[1,]", "[,1]", "[1 2]", "[\"1\"]"));
    check_docs("{\"type\":\"array\"}", DOCS("[]", "[1,\"a\",[],{},null,true]"), DOCS("[1,,2]", "{}"));
    check_docs("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":1}}",
               DOCS("[[],[true],[false]]"), DOCS("[[true,false]]", "[true]"));
    check_docs("{\"type\":\"array\",\"maxItems\":0}", DOCS("[]"), DOCS("[1]"));
}

static void test_strings_with_lengths_escapes_and_utf8(void) {
    check_docs("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
               DOCS("\"ab\"", "\"abc\"", "\"\\n\\t\"", "\"\xC3\xA9\xE6\x97\xA5\"", "\"\\u00e9\\\"\\\\\"",
                    "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""),
               DOCS("\"a\"", "\"abcd\"", "\"\\u00\"", "\"a\nb\"", "\"\\x\"", "\"\xC3\"", "\"\xA9\xA9\"",
                    "\"\xED\xA0\x80\xED\xA0\x80\"", "\"\\ud83d\\ude00\"", "\"\xC0\xAF\xC0\xAF\"", "ab", "'ab'",
                    "\"\xF5\x80\x80\x80\x41\""));
    check_docs("{\"type\":\"string\"}", DOCS("\"\"", "\"\\/\\b\\f\\r\\t\\u0041\\uFFFF\\uE000\"", "\"\x7F\""),
               DOCS("\"\t\"", "\"\\uD800\"", "\"\\udfff\"", "\"unterminated"));
}

static void test_numbers_and_integers_with_bounds(void) {
    check_docs("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}",
               DOCS("0", "-5", "120", "-0", "7", "99"), DOCS("-6", "121", "1.0", "1e2", "007", "+1", "1200", "-"));
    check_docs("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", DOCS("1", "9"),
               DOCS("0", "10", "-1"));
    check_docs("{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.3}",
               DOCS("0.1", "0.3", "0.2", "0.25", "0.1000000000000001", "0.2999999999999999"),
               DOCS("0.09", "0.31", "0", "1e-1", "0.30000000000001", "-0.2", ".2"));
    check_docs("{\"type\":\"number\"}",
               DOCS("0", "-1.5", "1e10", "2.5E-3", "9999999999999999.9999999999999999", "1e+99", "-0.0"),
               DOCS("1e100", "1.", "01", "1e", "99999999999999999", "0.12345678901234567", "NaN", "Infinity"));
    check_docs("{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":1}", DOCS("-0.5", "1", "0"),
               DOCS("-1", "1.0000000000000002", "2"));
}

static void test_enum_const_booleans_and_null(void) {
    check_docs("{\"enum\":[\"red\",\"green\",1,[1,{\"a\":null}],null,\"re\"]}",
               DOCS("\"red\"", "\"green\"", "1", "[1,{\"a\":null}]", "null", "\"re\""),
               DOCS("\"blue\"", "\"r\"", "2", "[1, {\"a\":null}]", "\"RED\""));
    check_docs("{\"const\":\"x\\\"y\"}", DOCS("\"x\\\"y\""), DOCS("\"x\"", "\"x\\u0022y\""));
    check_docs("{\"type\":\"string\",\"enum\":[\"a\",2,\"bb\"],\"maxLength\":1}", DOCS("\"a\""), DOCS("2", "\"bb\""));
    check_docs("{\"type\":\"boolean\"}", DOCS("true", "false"), DOCS("1", "\"true\"", "tru", "null"));
    check_docs("{\"type\":\"null\"}", DOCS("null"), DOCS("nul", "\"null\"", "{}"));
    check_docs("{\"type\":[\"string\",\"null\"],\"maxLength\":1}", DOCS("\"a\"", "null"), DOCS("\"ab\"", "0"));
}

static void test_anyof_refs_and_recursion(void) {
    check_docs("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
               "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},{\"type\":\"null\"}]}",
               DOCS("{\"a\":1}", "{\"a\":\"1\"}", "null"), DOCS("{\"a\":true}", "{}", "1"));
    /* a recursive tree through $defs */
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
        "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
        "\"required\":[\"value\",\"children\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    check_docs(tree,
               DOCS("{\"value\":1,\"children\":[]}",
                    "{\"value\":1,\"children\":[{\"value\":2,\"children\":[{\"value\":3,\"children\":[]}]}]}"),
               DOCS("{\"value\":1}", "{\"value\":1,\"children\":[{\"value\":2}]}"));
    /* a linked list through "#", null as its end */
    check_docs("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#\"},"
               "{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}",
               DOCS("{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"),
               DOCS("{\"v\":1,\"next\":{}}", "{\"v\":1}"));
    check_docs("{\"definitions\":{\"a b\":{\"type\":\"integer\"}},\"$ref\":\"#/definitions/a%20b\"}", DOCS("5"),
               DOCS("\"5\""));
    check_docs("true", DOCS("1", "{\"a\":[]}", "\"x\""), DOCS("", "{"));
    check_docs("{}", DOCS("null", "[[[]]]"), DOCS("nil"));
}

/* ---- the mask against a brute force ------------------------------------ */

/* The allowed set tried token by token: piece bytes stepped from the
 * current state; the end token when the document is complete. */
static void brute_mask(cart_matcher *m, const tvocab *t, uint32_t *mask, int64_t words) {
    memset(mask, 0, (size_t)words * sizeof *mask);
    for (int32_t i = 0; i < t->n; i++) {
        int64_t len = t->offsets[i + 1] - t->offsets[i];
        int ok = t->eog[i] ? cart_matcher_can_end(m) : len > 0 && cart_matcher_try_bytes(m, t->bytes + t->offsets[i], len);
        if (ok) mask[i / 32] |= 1u << (i % 32);
    }
}

static int is_set(const uint32_t *mask, int32_t i) {
    return (mask[i / 32] >> (i % 32)) & 1u;
}

typedef struct walk_stats {
    int docs, finished, steps, mismatches, unparsable, over_bound;
    int64_t longest;
} walk_stats;

/* Random decodings: at each step the mask must equal the brute-force mask;
 * a token is drawn from it uniformly (the end token with weight `stop`);
 * a finished text must parse as JSON and fit the grammar's bound. */
static walk_stats random_walks(const char *schema, const cart_grammar *g, const tvocab *t, int docs, int max_steps,
                               uint64_t seed) {
    walk_stats st = {0};
    int64_t words = cart_vocab_mask_words(t->v);
    uint32_t *mask = calloc((size_t)words, sizeof *mask), *brute = calloc((size_t)words, sizeof *brute);
    int32_t *allowed = malloc((size_t)t->n * sizeof *allowed);
    char *text = malloc(1 << 16);
    cart_rng rng;
    cart_rng_seed(&rng, seed);
    int64_t bound = cart_grammar_max_bytes(g);
    for (int d = 0; d < docs; d++) {
        cart_matcher *m = NULL;
        CHECK_OK(cart_matcher_new(&m, g, t->v));
        if (!m) break;
        size_t len = 0;
        int finished = 0;
        for (int s = 0; s < max_steps && !finished; s++) {
            if (cart_matcher_is_done(m)) {
                finished = 1;
                break;
            }
            int64_t n_allowed = 0;
            CHECK_OK(cart_matcher_mask(m, mask, words, &n_allowed));
            brute_mask(m, t, brute, words);
            if (memcmp(mask, brute, (size_t)words * sizeof *mask) != 0) {
                st.mismatches++;
                for (int32_t i = 0; i < t->n; i++)
                    if (is_set(mask, i) != is_set(brute, i) && st.mismatches < 4)
                        fprintf(stderr, "  FAIL %s: after %.*s, token %d (%.*s): mask %d, brute force %d\n", schema,
                                (int)len, text, i, (int)(t->offsets[i + 1] - t->offsets[i]), t->bytes + t->offsets[i],
                                is_set(mask, i), is_set(brute, i));
            }
            int n = 0;
            for (int32_t i = 0; i < t->n; i++)
                if (is_set(mask, i) && i != t->eos) allowed[n++] = i;
            CHECK(n_allowed == n + is_set(mask, t->eos));
            st.steps++;
            if (is_set(mask, t->eos) && (n == 0 || cart_rng_below(&rng, 8) == 0)) {
                CHECK_OK(cart_matcher_accept(m, t->eos));
                finished = 1;
                break;
            }
            if (n == 0) {
                CHECK_MSG(0, "%s: no token allowed after %.*s", schema, (int)len, text);
                break;
            }
            int32_t id = allowed[cart_rng_below(&rng, (uint64_t)n)];
            int64_t plen = t->offsets[id + 1] - t->offsets[id];
            CHECK_OK(cart_matcher_accept(m, id));
            if (len + (size_t)plen < (1 << 16) - 1) {
                memcpy(text + len, t->bytes + t->offsets[id], (size_t)plen);
                len += (size_t)plen;
            }
        }
        text[len] = 0;
        st.docs++;
        if (finished) {
            st.finished++;
            if ((int64_t)len > st.longest) st.longest = (int64_t)len;
            cJSON *doc = cJSON_ParseWithLength(text, len);
            if (!doc) {
                st.unparsable++;
                fprintf(stderr, "  FAIL %s: the document %s does not parse\n", schema, text);
            }
            cJSON_Delete(doc);
            if (bound >= 0 && (int64_t)len > bound) st.over_bound++;
            CHECK(cart_matcher_bytes(m) == (int64_t)len);
        }
        cart_matcher_free(m);
    }
    free(mask);
    free(brute);
    free(allowed);
    free(text);
    CHECK(st.mismatches == 0);
    CHECK(st.unparsable == 0);
    CHECK(st.over_bound == 0);
    return st;
}

static const char *const WALK_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"maxItems\":3}},\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":2.25},\"b\":{\"type\":"
    "\"boolean\"},\"c\":{\"type\":\"null\"},\"d\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}},\"required\":[\"b\"]}",
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":4},"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"const\":[1,\"two\",null]}},\"required\":[\"x\"]}]}",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\",\"maximum\":9},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"required\":[\"value\","
    "\"children\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":40},\"minItems\":1,\"maxItems\":2}",
    "{\"type\":\"number\"}",
};

static void test_mask_equals_brute_force_on_random_decodings(void) {
    tvocab t = make_vocab();
    int n = (int)(sizeof WALK_SCHEMAS / sizeof WALK_SCHEMAS[0]);
    for (int i = 0; i < n; i++) {
        cart_grammar *g = compile(WALK_SCHEMAS[i]);
        if (!g) continue;
        walk_stats st = random_walks(WALK_SCHEMAS[i], g, &t, 40, 400, 1000 + (uint64_t)i);
        printf("  schema %d: %d decodings, %d finished, %d steps, longest %lld bytes (bound %lld), %d mask "
               "mismatches, %d unparsable\n",
               i, st.docs, st.finished, st.steps, (long long)st.longest, (long long)cart_grammar_max_bytes(g),
               st.mismatches, st.unparsable);
        CHECK(st.finished == st.docs || cart_grammar_max_bytes(g) < 0);
        cart_grammar_free(g);
    }
    /* json_object: any object */
    cart_grammar *g = NULL;
    CHECK_OK(cart_grammar_any_object(&g));
    if (g) {
        CHECK(cart_grammar_max_bytes(g) == -1);
        walk_stats st = random_walks("json_object", g, &t, 40, 200, 77);
        printf("  json_object: %d decodings, %d finished within 200 steps, %d steps, %d mask mismatches\n", st.docs,
               st.finished, st.steps, st.mismatches);
        CHECK(accepts(g, t.v, "{}") == 1);
        CHECK(accepts(g, t.v, "[]") == 0);
        cart_grammar_free(g);
    }
    free_vocab(&t);
}

static void test_bounded_schemas_have_a_longest_document(void) {
    tvocab t = make_vocab();
    struct {
        const char *schema;
        int64_t bytes;
    } cases[] = {
        {"{\"type\":\"boolean\"}", 5},
        {"{\"type\":\"integer\"}", 17},
        {"{\"type\":\"string\",\"maxLength\":3}", 2 + 6 * 3},
        {"{\"enum\":[\"a\",\"bcd\"]}", 5},
        {"{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":2}",
         /* [ ws  (, ws) null ws  x2  ] */ 1 + 21 + 2 * (1 + 21 + 4 + 21) + 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}},\"required\":[\"a\"]}",
         /* { ws , ws "a" ws : ws null ws } */ 1 + 21 + 1 + 21 + 3 + 21 + 1 + 21 + 4 + 21 + 1},
        {"{\"type\":\"string\"}", -1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"null\"}}", -1},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}}}", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cart_grammar *g = compile(cases[i].schema);
        if (!g) continue;
        CHECK_MSG(cart_grammar_max_bytes(g) == cases[i].bytes, "%s: max_bytes %lld, expected %lld", cases[i].schema,
                  (long long)cart_grammar_max_bytes(g), (long long)cases[i].bytes);
        cart_grammar_free(g);
    }
    free_vocab(&t);
}

/* ---- refused and hostile schemas ----------------------------------------- */

static void refused(const char *schema, int status, const char *mention) {
    cart_grammar *g = NULL;
    CHECK_ERR(cart_grammar_from_schema(&g, schema, (int64_t)strlen(schema), 0), status);
    CHECK(g == NULL);
    CHECK_ERROR_MENTIONS(mention);
    printf("  refused: %.60s -> %s\n", schema, cart_last_error());
    cart_grammar_free(g);
}

static void test_unsupported_keywords_are_refused_with_their_path(void) {
    refused("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":2}}}", CART_E_UNSUPPORTED,
            "#/properties/age: the keyword 'multipleOf'");
    refused("{\"type\":\"string\",\"pattern\":\"^a\"}", CART_E_UNSUPPORTED, "#: the keyword 'pattern'");
    refused("{\"type\":\"string\",\"format\":\"date-time\"}", CART_E_UNSUPPORTED, "'format'");
    refused("{\"oneOf\":[{\"type\":\"string\"}]}", CART_E_UNSUPPORTED, "'oneOf'");
    refused("{\"type\":\"array\",\"items\":{\"allOf\":[]}}", CART_E_UNSUPPORTED, "#/items: the keyword 'allOf'");
    refused("{\"anyOf\":[{\"type\":\"null\"},{\"not\":{}}]}", CART_E_UNSUPPORTED, "#/anyOf/1: the keyword 'not'");
    refused("{\"$defs\":{\"a/b\":{\"uniqueItems\":true}},\"$ref\":\"#/$defs/a~1b\"}", CART_E_UNSUPPORTED,
            "#/$defs/a~1b: the keyword 'uniqueItems'");
    refused("{\"type\":\"object\",\"anyOf\":[{}]}", CART_E_UNSUPPORTED, "'type' beside 'anyOf'");
    refused("{\"typo\":1}", CART_E_UNSUPPORTED, "'typo'");
    /* the same schemas compile when unsupported keywords may be ignored */
    const char *lenient[] = {"{\"type\":\"string\",\"format\":\"date-time\",\"pattern\":\"x\"}",
                             "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}",
                             "{\"type\":\"object\",\"anyOf\":[{}],\"minProperties\":1}"};
    for (size_t i = 0; i < 3; i++) {
        cart_grammar *g = NULL;
        CHECK_OK(cart_grammar_from_schema(&g, lenient[i], (int64_t)strlen(lenient[i]), CART_GRAMMAR_LENIENT));
        cart_grammar_free(g);
    }
}

static void test_malformed_and_hostile_schemas_fail_cleanly(void) {
    refused("{\"type\":\"string\",\"maxLength\":\"5\"}", CART_E_FORMAT, "maxLength must be an integer");
    refused("{\"type\":\"string\",\"maxLength\":-1}", CART_E_FORMAT, "maxLength");
    refused("{\"type\":\"string\",\"maxLength\":1e20}", CART_E_FORMAT, "maxLength");
    refused("{\"type\":\"integer\",\"minimum\":1e999}", CART_E_FORMAT, "infinity");
    refused("{\"type\":\"integer\",\"minimum\":\"0\"}", CART_E_FORMAT, "minimum must be a number");
    refused("{\"enum\":[1e999]}", CART_E_FORMAT, "infinity");
    refused("{\"enum\":[]}", CART_E_FORMAT, "no value of enum");
    refused("{\"enum\":3}", CART_E_FORMAT, "enum must be an array");
    refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":3}", CART_E_FORMAT, "no integer");
    refused("{\"type\":\"integer\",\"minimum\":0.2,\"maximum\":0.8}", CART_E_FORMAT, "no integer");
    refused("{\"type\":\"integer\",\"minimum\":1e300}", CART_E_FORMAT, "no integer");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", CART_E_FORMAT, "minItems is greater");
    refused("{\"type\":\"strnig\"}", CART_E_FORMAT, "'strnig' is not a JSON Schema type");
    refused("{\"type\":7}", CART_E_FORMAT, "type must be");
    refused("{\"properties\":[]}", CART_E_FORMAT, "properties must be an object");
    refused("{\"properties\":{},\"required\":[\"x\"]}", CART_E_FORMAT, "required names 'x'");
    refused("{\"$ref\":\"#/$defs/missing\"}", CART_E_FORMAT, "points to nothing");
    refused("{\"$ref\":\"http://example.com/s.json\"}", CART_E_FORMAT, "only references within the schema");
    refused("{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}},\"required\":[\"next\"]}", CART_E_FORMAT,
            "no finite JSON value");
    refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", CART_E_FORMAT, "refers back to itself");
    refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
            CART_E_FORMAT, "refers back to itself");
    refused("false", CART_E_FORMAT, "no finite JSON value");
    refused("[1]", CART_E_FORMAT, "a schema must be an object or a boolean");
    refused("{\"type\":", CART_E_FORMAT, "not valid JSON");
    refused("{} x", CART_E_FORMAT, "text after the JSON value");
    refused("{\"const\":\"\xC3\"}", CART_E_FORMAT, "not valid UTF-8");
    refused("{\"const\":\"a\\u0000b\"}", CART_E_FORMAT, "NUL");
    /* 100 nested objects */
    char deep[4096] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"type\":\"object\",\"properties\":{\"a\":");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++) strcat(deep, "}}");
    refused(deep, CART_E_FORMAT, "more than 64 subschemas");
    /* an enum of 10,001 values */
    size_t cap = 200000;
    char *big = malloc(cap);
    strcpy(big, "{\"enum\":[0");
    for (int i = 1; i <= 10000; i++) snprintf(big + strlen(big), cap - strlen(big), ",%d", i);
    strcat(big, "]}");
    refused(big, CART_E_FORMAT, "more than the limit of 10000");
    free(big);
    /* a chain of refs deeper than the compile limit */
    char *chain = malloc(cap);
    strcpy(chain, "{\"$defs\":{");
    for (int i = 0; i < 200; i++)
        snprintf(chain + strlen(chain), cap - strlen(chain), "%s\"d%d\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/d%d\"}}",
                 i ? "," : "", i, i + 1);
    snprintf(chain + strlen(chain), cap - strlen(chain), ",\"d200\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
    refused(chain, CART_E_FORMAT, "more than 64 subschemas");
    free(chain);
    cart_grammar *g = NULL;
    CHECK_ERR(cart_grammar_from_schema(&g, NULL, 3, 0), CART_E_ARG);
}

/* ---- the matcher's contract ---------------------------------------------- */

static void test_matcher_accepts_only_allowed_tokens_and_ends(void) {
    tvocab t = make_vocab();
    cart_grammar *g = compile("{\"type\":\"integer\",\"maximum\":5}");
    cart_matcher *m = NULL;
    CHECK_OK(cart_matcher_new(&m, g, t.v));
    CHECK(!cart_matcher_can_end(m) && !cart_matcher_is_done(m));
    CHECK_ERR(cart_matcher_accept(m, t.eos), CART_E_ARG);
    CHECK_ERR(cart_matcher_accept(m, t.control), CART_E_ARG);
    CHECK_ERR(cart_matcher_accept(m, '6'), CART_E_ARG);
    CHECK_ERR(cart_matcher_accept(m, t.n), CART_E_ARG);
    CHECK(cart_matcher_bytes(m) == 0);
    CHECK_OK(cart_matcher_accept(m, '5'));
    CHECK(cart_matcher_can_end(m) && cart_matcher_is_done(m)); /* 5 is the largest: nothing can follow */
    uint32_t mask[64];
    int64_t n = -1;
    CHECK_ERR(cart_matcher_mask(m, mask, 1, &n), CART_E_ARG);
    CHECK_OK(cart_matcher_mask(m, mask, 64, &n));
    CHECK(n == 1 && is_set(mask, t.eos));
    CHECK_OK(cart_matcher_accept(m, t.eos));
    CHECK(cart_matcher_is_done(m) && !cart_matcher_can_end(m));
    CHECK_OK(cart_matcher_mask(m, mask, 64, &n));
    CHECK(n == 0);
    cart_matcher_reset(m);
    CHECK(cart_matcher_bytes(m) == 0 && !cart_matcher_is_done(m));
    CHECK_OK(cart_matcher_accept(m, '-'));
    CHECK(!cart_matcher_can_end(m) && !cart_matcher_is_done(m));
    CHECK_OK(cart_matcher_accept_bytes(m, "12", 2));
    CHECK(cart_matcher_can_end(m) && !cart_matcher_is_done(m));
    CHECK_ERR(cart_matcher_accept_bytes(m, "3x", 2), CART_E_ARG);
    CHECK_ERROR_MENTIONS("byte 1");
    CHECK(cart_matcher_bytes(m) == 3); /* unchanged by the refused bytes */
    cart_matcher_free(m);
    cart_grammar_free(g);
    free_vocab(&t);
}

/* A string of a million characters keeps the matcher's memory bounded
 * (the pool is compacted) and still ends. */
static void test_long_documents_keep_memory_bounded(void) {
    tvocab t = make_vocab();
    cart_grammar *g = compile("{\"type\":\"array\",\"items\":{\"type\":\"string\"}}");
    cart_matcher *m = NULL;
    CHECK_OK(cart_matcher_new(&m, g, t.v));
    CHECK_OK(cart_matcher_accept_bytes(m, "[\"", 2));
    int32_t hello = -1;
    for (int32_t i = 256; i < t.n; i++)
        if (t.offsets[i + 1] - t.offsets[i] == 5 && memcmp(t.bytes + t.offsets[i], "hello", 5) == 0) hello = i;
    CHECK(hello > 0);
    for (int i = 0; i < 200000 && hello > 0; i++) CHECK(cart_matcher_accept(m, hello) == CART_OK || (i = 200000));
    CHECK_OK(cart_matcher_accept_bytes(m, "\",\"\\u00e9\"]", 11));
    CHECK(cart_matcher_is_done(m));
    printf("  accepted %lld bytes\n", (long long)cart_matcher_bytes(m));
    cart_matcher_free(m);
    cart_grammar_free(g);
    free_vocab(&t);
}

/* ---- the real Qwen3 vocabulary ------------------------------------------- */

static void test_real_qwen3_vocabulary(void) {
    FILE *f = fopen(QWEN_REAL, "rb");
    if (!f) {
        printf("  skipped: %s not found (the ../shared fixtures are absent)\n", QWEN_REAL);
        return;
    }
    fclose(f);
    cart_gguf *gg = NULL;
    cart_tokenizer *tok = NULL;
    CHECK_OK(cart_gguf_open(&gg, QWEN_REAL));
    if (!gg) return;
    CHECK_OK(cart_tokenizer_load(&tok, gg));
    cart_gguf_close(gg);
    if (!tok) return;
    int64_t nv = cart_tokenizer_vocab_size(tok);
    double t0 = cart_now_seconds();
    cart_vocab *v = NULL;
    CHECK_OK(cart_vocab_new(&v, tok, nv));
    double t1 = cart_now_seconds();
    printf("  vocab of %lld tokens built in %.0f ms\n", (long long)nv, (t1 - t0) * 1e3);
    cart_grammar *g = compile(WALK_SCHEMAS[0]);
    cart_matcher *m = NULL;
    if (v && g) CHECK_OK(cart_matcher_new(&m, g, v));
    if (m) {
        int64_t words = cart_vocab_mask_words(v);
        uint32_t *mask = calloc((size_t)words, sizeof *mask), *brute = calloc((size_t)words, sizeof *brute);
        char piece[512];
        /* a fixed prefix through each kind of position, then the brute force at each */
        const char *doc = "{\"name\": \"Ab\xC3\xA9\", \"age\": 4, \"tags\": [\"red\"]}";
        int steps = 0, mismatches = 0;
        double mask_s = 0;
        for (size_t k = 0; k <= strlen(doc); k++) {
            double a = cart_now_seconds();
            int64_t n = 0;
            CHECK_OK(cart_matcher_mask(m, mask, words, &n));
            mask_s += cart_now_seconds() - a;
            memset(brute, 0, (size_t)words * sizeof *brute);
            for (int32_t i = 0; i < nv; i++) {
                int64_t len = 0;
                int ok;
                if (cart_tokenizer_is_eog(tok, i)) {
                    ok = cart_matcher_can_end(m);
                } else {
                    cart_tokenizer_piece(tok, i, 0, piece, sizeof piece, &len);
                    ok = len > 0 && len <= (int64_t)sizeof piece && cart_matcher_try_bytes(m, piece, len);
                }
                if (ok) brute[i / 32] |= 1u << (i % 32);
            }
            if (memcmp(mask, brute, (size_t)words * sizeof *mask) != 0) mismatches++;
            steps++;
            if (k < strlen(doc)) CHECK_OK(cart_matcher_accept_bytes(m, doc + k, 1));
        }
        printf("  %d states along %s: %d mask mismatches against the brute force; %.2f ms per mask\n", steps, doc,
               mismatches, mask_s / steps * 1e3);
        CHECK(mismatches == 0);
        CHECK(cart_matcher_is_done(m));
        free(mask);
        free(brute);
    }
    cart_matcher_free(m);
    cart_grammar_free(g);
    cart_vocab_free(v);
    cart_tokenizer_free(tok);
}

/* ---- the masked sampler --------------------------------------------------- */

static void test_sampler_picks_only_masked_in_tokens(void) {
    enum { N = 300 };
    float logits[N];
    uint32_t mask[(N + 31) / 32];
    cart_rng rng;
    cart_rng_seed(&rng, 3);
    for (int i = 0; i < N; i++) logits[i] = (float)cart_rng_normal(&rng) * 3.0f;
    memset(mask, 0, sizeof mask);
    int32_t allowed[] = {7, 100, 101, 299};
    for (int i = 0; i < 4; i++) mask[allowed[i] / 32] |= 1u << (allowed[i] % 32);
    cart_sampler_params p;
    cart_sampler_default_params(&p);
    cart_sampler *s = NULL;
    CHECK_OK(cart_sampler_new(&s, &p));
    int32_t best = allowed[0];
    for (int i = 1; i < 4; i++)
        if (logits[allowed[i]] > logits[best]) best = allowed[i];
    CHECK(cart_sampler_sample_masked(s, logits, N, mask) == best);
    cart_sampler_free(s);
    p.temperature = 1.5f;
    p.top_k = 2;
    p.seed = 9;
    CHECK_OK(cart_sampler_new(&s, &p));
    int counts[N] = {0};
    for (int k = 0; k < 2000; k++) {
        int32_t id = cart_sampler_sample_masked(s, logits, N, mask);
        CHECK(id >= 0 && id < N && is_set(mask, id));
        if (id >= 0 && id < N) counts[id]++;
    }
    int kinds = 0;
    for (int i = 0; i < N; i++) kinds += counts[i] > 0;
    CHECK(kinds == 2); /* top_k 2 among the allowed */
    memset(mask, 0, sizeof mask);
    CHECK(cart_sampler_sample_masked(s, logits, N, mask) == -1);
    CHECK(cart_sampler_sample_masked(s, logits, N, NULL) >= 0);
    cart_sampler_free(s);
}

int main(void) {
    RUN(test_objects_and_required_properties);
    RUN(test_arrays_with_item_counts);
    RUN(test_strings_with_lengths_escapes_and_utf8);
    RUN(test_numbers_and_integers_with_bounds);
    RUN(test_enum_const_booleans_and_null);
    RUN(test_anyof_refs_and_recursion);
    RUN(test_mask_equals_brute_force_on_random_decodings);
    RUN(test_bounded_schemas_have_a_longest_document);
    RUN(test_unsupported_keywords_are_refused_with_their_path);
    RUN(test_malformed_and_hostile_schemas_fail_cleanly);
    RUN(test_matcher_accepts_only_allowed_tokens_and_ends);
    RUN(test_long_documents_keep_memory_bounded);
    RUN(test_real_qwen3_vocabulary);
    RUN(test_sampler_picks_only_masked_in_tokens);
    return check_finish("grammar");
}
