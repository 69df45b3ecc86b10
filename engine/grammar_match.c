/*
 * grammar_match.c - the matcher (grammar_internal.h, grammar.h).
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
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "internal.h"

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
            if (cart_gr_number_open(s, f->a, f->v0, f->v1)) add_terminal(m, f);
            if (cart_gr_number_complete(s, f->a, f->v0, f->v1)) {
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
        int r = cart_gr_string_step(&g->strs.p[e->a], f->a, f->b, c, &na, &nb);
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
        if (!cart_gr_number_step(&g->nums.p[e->a], f->a, f->v0, f->v1, c, &na, &I, &F)) return;
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
