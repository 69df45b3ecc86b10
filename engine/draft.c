/*
 * draft.c - a suffix automaton over token ids (see draft.h).
 *
 * States carry len (longest string in the state), link (suffix link) and
 * last_end (the largest end position, in the reference, of the strings in
 * the state: filled in after construction by pushing every state's end
 * positions up its suffix links). Transitions live in one open-addressing
 * hash table keyed by (state, token).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "draft.h"

typedef struct sam_state {
    int32_t len;
    int32_t link;
    int64_t last_end; /* index of the last token of the latest occurrence; -1 for the root */
} sam_state;

typedef struct edge {
    uint64_t key;  /* (state << 32) | token, or EMPTY */
    int32_t next;
    int32_t pad;
} edge;

#define EMPTY UINT64_MAX

struct cart_sam {
    int32_t *ids; /* the reference, copied */
    int64_t n;
    sam_state *st;
    int32_t n_states;
    edge *edges;
    uint64_t cap;  /* slots, a power of two */
    uint64_t used;
};

static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static int32_t get(const cart_sam *s, int32_t state, int32_t token) {
    uint64_t key = ((uint64_t)(uint32_t)state << 32) | (uint32_t)token;
    for (uint64_t i = mix(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->edges[i].key == key) return s->edges[i].next;
        if (s->edges[i].key == EMPTY) return -1;
    }
}

static void put(cart_sam *s, int32_t state, int32_t token, int32_t next) {
    uint64_t key = ((uint64_t)(uint32_t)state << 32) | (uint32_t)token;
    for (uint64_t i = mix(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->edges[i].key == key) {
            s->edges[i].next = next;
            return;
        }
        if (s->edges[i].key == EMPTY) {
            s->edges[i].key = key;
            s->edges[i].next = next;
            s->used++;
            return;
        }
    }
}

/* A clone needs the edges of the state it copies, which the hash table
 * cannot list; construction keeps a per-state adjacency list (pool + head)
 * beside it and frees it at the end. */
typedef struct adj {
    int32_t token;
    int32_t next_edge; /* index into the adjacency pool, -1 ends */
} adj;

void cart_sam_free(cart_sam *s) {
    if (!s) return;
    free(s->ids);
    free(s->st);
    free(s->edges);
    free(s);
}

int cart_sam_build(cart_sam **out, const int32_t *ids, int64_t n) {
    *out = NULL;
    if (n < 0 || n > (INT64_C(1) << 30))
        return cart_fail(CART_E_ARG, "cart_sam_build: %lld tokens (at most 2^30)", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0) return cart_fail(CART_E_ARG, "cart_sam_build: token %lld is negative", (long long)i);
    cart_sam *s = cart_calloc(1, sizeof *s, "suffix automaton");
    if (!s) return CART_E_NOMEM;
    int64_t max_states = 2 * n + 2;
    s->ids = cart_malloc(sizeof(int32_t) * (size_t)(n ? n : 1), "suffix automaton");
    s->st = cart_malloc(sizeof(sam_state) * (size_t)max_states, "suffix automaton states");
    uint64_t cap = 16;
    while (cap < (uint64_t)(3 * n + 8) * 2) cap <<= 1; /* load factor <= 1/2 */
    s->cap = cap;
    s->edges = cart_malloc(sizeof(edge) * cap, "suffix automaton transitions");
    adj *pool = cart_malloc(sizeof(adj) * (size_t)(3 * n + 8), "suffix automaton build lists");
    int32_t *head = cart_malloc(sizeof(int32_t) * (size_t)max_states, "suffix automaton build lists");
    if (!s->ids || !s->st || !s->edges || !pool || !head) {
        free(pool);
        free(head);
        cart_sam_free(s);
        return CART_E_NOMEM;
    }
    if (n) memcpy(s->ids, ids, sizeof(int32_t) * (size_t)n);
    s->n = n;
    for (uint64_t i = 0; i < cap; i++) s->edges[i].key = EMPTY;
    int32_t n_pool = 0;
    s->st[0] = (sam_state){0, -1, -1};
    head[0] = -1;
    s->n_states = 1;
    int32_t last = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t c = ids[i];
        int32_t cur = s->n_states++;
        s->st[cur] = (sam_state){s->st[last].len + 1, 0, i};
        head[cur] = -1;
        int32_t p = last;
        while (p != -1 && get(s, p, c) < 0) {
            put(s, p, c, cur);
            pool[n_pool] = (adj){c, head[p]};
            head[p] = n_pool++;
            p = s->st[p].link;
        }
        if (p != -1) {
            int32_t q = get(s, p, c);
            if (s->st[p].len + 1 == s->st[q].len) {
                s->st[cur].link = q;
            } else {
                int32_t clone = s->n_states++;
                s->st[clone] = (sam_state){s->st[p].len + 1, s->st[q].link, s->st[q].last_end};
                head[clone] = -1;
                for (int32_t e = head[q]; e >= 0; e = pool[e].next_edge) {
                    put(s, clone, pool[e].token, get(s, q, pool[e].token));
                    pool[n_pool] = (adj){pool[e].token, head[clone]};
                    head[clone] = n_pool++;
                }
                while (p != -1 && get(s, p, c) == q) {
                    put(s, p, c, clone);
                    p = s->st[p].link;
                }
                s->st[q].link = clone;
                s->st[cur].link = clone;
            }
        }
        last = cur;
    }
    /* last_end: the latest occurrence of every state's strings. Each state's
     * own end position reaches all states on its suffix-link path; visit
     * states by decreasing len so children come before their links. */
    int32_t *order = head; /* reuse: counting sort by len */
    int64_t *count = cart_calloc((size_t)n + 2, sizeof(int64_t), "suffix automaton sort");
    if (!count) {
        free(pool);
        free(head);
        cart_sam_free(s);
        return CART_E_NOMEM;
    }
    for (int32_t v = 0; v < s->n_states; v++) count[s->st[v].len]++;
    for (int64_t l = 1; l <= n; l++) count[l] += count[l - 1];
    for (int32_t v = s->n_states - 1; v >= 0; v--) order[--count[s->st[v].len]] = v;
    for (int32_t k = s->n_states - 1; k > 0; k--) {
        int32_t v = order[k], l = s->st[v].link;
        if (l > 0 && s->st[v].last_end > s->st[l].last_end) s->st[l].last_end = s->st[v].last_end;
    }
    free(count);
    free(pool);
    free(head);
    *out = s;
    return CART_OK;
}

int64_t cart_sam_length(const cart_sam *s) {
    return s->n;
}

uint64_t cart_sam_bytes(const cart_sam *s) {
    return sizeof *s + (uint64_t)s->n * 4 + (uint64_t)s->n_states * sizeof(sam_state) +
           s->cap * sizeof(edge);
}

void cart_sam_cursor_reset(cart_sam_cursor *c) {
    c->state = 0;
    c->length = 0;
}

void cart_sam_feed(const cart_sam *s, cart_sam_cursor *c, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int32_t t = ids[i];
        int32_t next = t >= 0 ? get(s, c->state, t) : -1;
        while (next < 0 && c->state != 0) {
            c->state = s->st[c->state].link;
            c->length = s->st[c->state].len;
            next = get(s, c->state, t);
        }
        if (next >= 0) {
            c->state = next;
            c->length++;
        } else {
            c->state = 0;
            c->length = 0;
        }
    }
}

int32_t cart_sam_draft(const cart_sam *s, const cart_sam_cursor *c, int32_t min_match,
                       int32_t *draft, int32_t max) {
    if (c->length < (min_match > 1 ? min_match : 1) || max <= 0) return 0;
    int64_t end = s->st[c->state].last_end; /* last token of the latest occurrence */
    int32_t k = 0;
    for (int64_t i = end + 1; i < s->n && k < max; i++) draft[k++] = s->ids[i];
    return k;
}
