/* step_arena.c - the trace reader's per-step memory (step_arena.h): an arena that every
 * allocation of one step comes from and that is reset as a whole before the next, and an
 * open-addressing map from strings (request ids, owned by the arena) to ints, also reset every
 * step; plus the FNV-1a string hash both the map and the live-request table use. */
#include "step_arena.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

uint64_t ar_fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

void *ar_xrealloc_array(void *p, size_t n, size_t elem)
{
    if (n == 0) n = 1;
    if (n > SIZE_MAX / elem) return NULL;
    return realloc(p, n * elem);
}

/* ---- the arena: every allocation of one step, freed together ---- */


/* Frees the chain of chunks from c on. */
static void free_chunks(ar_arena_chunk *c)
{
    while (c) {
        ar_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
}

void ar_arena_reset(ar_arena *a)
{
    /* keep the first (largest) chunk, free the rest */
    ar_arena_chunk *c = a->head;
    if (!c) return;
    free_chunks(c->next);
    c->next = NULL;
    c->used = 0;
}

void ar_arena_free(ar_arena *a)
{
    free_chunks(a->head);
    a->head = NULL;
}

void *ar_arena_alloc(ar_arena *a, size_t n)
{
    n = (n + 15u) & ~(size_t)15u;
    if (n == 0) n = 16;
    ar_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = c ? c->cap * 2 : 65536;
        while (cap < n) cap *= 2;
        ar_arena_chunk *nc = malloc(offsetof(ar_arena_chunk, data) + cap);
        if (!nc) return NULL;
        nc->cap = cap;
        nc->used = 0;
        nc->next = c;
        a->head = nc;
        c = nc;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

char *ar_arena_strdup(ar_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ar_arena_alloc(a, n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- the string map ---- */


int ar_str_map_reset(ar_str_map *m, size_t n)
{
    size_t want = 16;
    while (want < 2 * n + 2) want *= 2;
    if (want > m->cap) {
        const char **k = ar_xrealloc_array(m->keys, want, sizeof *k);
        if (!k) return -1;
        m->keys = k;
        int *v = ar_xrealloc_array(m->values, want, sizeof *v);
        if (!v) return -1;
        m->values = v;
        m->cap = want;
    }
    memset(m->keys, 0, m->cap * sizeof *m->keys);
    return 0;
}

/* Inserts key; returns 1 when it was new, 0 when present already (value untouched). */
int ar_str_map_put(ar_str_map *m, const char *key, int value)
{
    size_t mask = m->cap - 1, i = (size_t)ar_fnv1a(key) & mask;
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) return 0;
        i = (i + 1) & mask;
    }
    m->keys[i] = key;
    m->values[i] = value;
    return 1;
}

/* Returns the value, or -1 when absent. */
int ar_str_map_get(const ar_str_map *m, const char *key)
{
    if (m->cap == 0) return -1;
    size_t mask = m->cap - 1, i = (size_t)ar_fnv1a(key) & mask;
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) return m->values[i];
        i = (i + 1) & mask;
    }
    return -1;
}

void ar_str_map_free(ar_str_map *m)
{
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}
