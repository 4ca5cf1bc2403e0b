/* batch_reader.h - the replay engine's reader side (replay/batch_reader.c): the thread that reads
 * and validates the trace, applies each step record to the live request table and builds each
 * step as a self-contained batch in a ring of AR_BATCH_SLOTS slots, which the step loop
 * (replay.c) takes in step order and hands back; and the step counter, which counts the trace's
 * steps for the progress line while the run starts.  Internal to replay/; replay.c's opening
 * comment describes the three threads of a run. */
#ifndef AR_BATCH_READER_H
#define AR_BATCH_READER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "replay.h"

#define AR_BATCH_SLOTS 8         /* the step loop's, and up to 7 built ahead */
#define AR_NUM_SMS_DEFAULT 132   /* cascade cost model: an H200's SM count (vLLM uses the device's) */

enum { SLOT_FREE, SLOT_READY, SLOT_BUSY };
enum { SLOT_STEP, SLOT_END };

/* One step, self-contained: everything the step loop needs, owned by the slot (the reader's
 * live table moves on while the step runs). */
typedef struct ar_batch_slot {
    int state;                    /* SLOT_FREE / READY / BUSY (under the ring's lock) */
    int kind;                     /* SLOT_STEP, or SLOT_END: no more steps (end_rc says why) */
    int end_rc;                   /* 0 end of trace or range, 2 bad trace, 3 out of memory, or
                                     -1 a signal stopped the ar_batch_reader */
    char end_msg[AR_ERR_MAX + 64];
    int64_t step;
    double time;                  /* the step's trace time */
    int num_prefill;
    ar_batch b;                   /* the truth: fill and verification use it */
    ar_batch kb;                  /* what the kernels see (metadata faults applied) */
    int fill_count;
    int64_t bytes, flops;         /* one layer */
    int64_t total_context;
    double parse_s, build_s;      /* reader time spent on this slot (skipped steps included) */
    /* buffers, grown to the largest step and reused */
    size_t cap_reqs, cap_tokens, cap_table, cap_fill, cap_text;
    int *qsl, *seq, *ctx, *qlens, *table, *stale;
    uint64_t *keys, *req_keys;
    int64_t *slots, *bad_slots;
    const char **ids;             /* [num_reqs] into text */
    size_t *id_off;
    char *text;
    int64_t *fill_slots;
    uint64_t *fill_keys;
    int *fill_offsets;
} ar_batch_slot;

/* The reader side: the trace, the per-block written counts, the previous step's table (the
 * stale-block-table fault), and the ring of slots it fills in step order. */
typedef struct ar_batch_reader {
    ar_trace_reader *rd;
    const ar_run_config *cfg;
    int cascade_mode;
    int64_t step_first, step_last, resume_after;
    uint16_t *written;            /* [num_blocks]: leading offsets this run has written */
    /* previous step's rows, for the stale-block-table fault */
    int prev_count, prev_stride;
    size_t cap_prev_table, cap_prev_text, cap_prev_off;
    int *prev_table;
    char *prev_text;
    size_t *prev_off;
    /* what it saw, for the 'empty' message */
    int64_t last_step_seen;       /* -1 = the trace has no steps (so far) */
    /* the ring */
    ar_batch_slot slots[AR_BATCH_SLOTS];
    int next_fill, next_take;
    bool threaded, thread_started, stop, ended;
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} ar_batch_reader;

/* *p (*cap elements of elem bytes) grown to at least need elements, doubling from 64; 0 ok, -1
 * out of memory (*p unchanged). */
int ar_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Starts the reader: a thread of its own when threaded, else ar_reader_take builds each slot on
 * the caller's thread.  The caller has set rd, cfg, cascade_mode, the step range and written.
 * 0 ok, -1 (err) the thread could not start. */
int ar_reader_start(ar_batch_reader *r, bool threaded, char *err, size_t err_len);
/* The next slot in step order (SLOT_BUSY until ar_reader_release); *wait_s gets the time spent
 * waiting for the reader. */
ar_batch_slot *ar_reader_take(ar_batch_reader *r, double *wait_s);
void ar_reader_release(ar_batch_reader *r, ar_batch_slot *s);
/* Stops the reader thread and frees the slots (the trace reader itself is closed by the
 * caller). */
void ar_reader_finish(ar_batch_reader *r);

/* Counts a trace's steps on a thread of its own while the run starts (the progress line's
 * total): steps is -1 until counted (or when unreadable); stop cuts the count short. */
typedef struct ar_step_counter {
    const char *path;
    pthread_t tid;
    bool started;
    atomic_bool stop;
    atomic_llong steps;           /* -1 until counted */
} ar_step_counter;

/* A trace's steps: its lines after the header, read through zlib (plain or gzip); -1 when
 * unreadable or when *stop (may be NULL) is set while counting. */
long long ar_count_trace_steps(const char *path, atomic_bool *stop);
void ar_step_counter_init(ar_step_counter *c);
void ar_step_counter_start(ar_step_counter *c, const char *path);   /* no thread: steps stays -1 */
void ar_step_counter_stop(ar_step_counter *c);                      /* joins the thread, if any */

#endif
