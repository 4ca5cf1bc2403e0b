/* step_arena.h - the trace reader's per-step memory (traces/trace.c): an arena whose
 * allocations are freed together when the step is done, and a string -> int map reset every
 * step, with the FNV-1a hash of a string.  Internal to traces/. */
#ifndef AR_STEP_ARENA_H
#define AR_STEP_ARENA_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a 64-bit hash of the NUL-terminated string s. */
uint64_t ar_fnv1a(const char *s);
/* realloc of p to n elements of elem bytes (at least 1 element); NULL on overflow or out of memory. */
void *ar_xrealloc_array(void *p, size_t n, size_t elem);

/* The arena: chunks of growing size; ar_arena_reset keeps the first (largest) and empties it. */
typedef struct ar_arena_chunk {
    struct ar_arena_chunk *next;
    size_t cap, used;
    max_align_t data[];      /* the memory handed out; max_align_t keeps it aligned */
} ar_arena_chunk;

typedef struct ar_arena {
    ar_arena_chunk *head;
} ar_arena;

void ar_arena_reset(ar_arena *a);
void ar_arena_free(ar_arena *a);
/* n bytes (rounded up to 16), 16-byte aligned; NULL when out of memory. */
void *ar_arena_alloc(ar_arena *a, size_t n);
char *ar_arena_strdup(ar_arena *a, const char *s);

/* The string map (keys are not copied: they must outlive the step). */
typedef struct ar_str_map {
    const char **keys;   /* [cap] NULL = empty */
    int *values;         /* [cap] */
    size_t cap;          /* power of two */
} ar_str_map;

/* Empties m with room for n keys; -1 when out of memory. */
int ar_str_map_reset(ar_str_map *m, size_t n);
/* Inserts key; returns 1 when it was new, 0 when present already (value untouched). */
int ar_str_map_put(ar_str_map *m, const char *key, int value);
/* Returns the value, or -1 when absent. */
int ar_str_map_get(const ar_str_map *m, const char *key);
void ar_str_map_free(ar_str_map *m);

#endif
