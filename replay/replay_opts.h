/* replay_opts.h - the options of `attnreplay replay`: what each holds, the usage text, and the
 * parser (replay/replay_opts.c).  The engine (replay.c) reads them; nothing here runs a step. */
#ifndef AR_REPLAY_OPTS_H
#define AR_REPLAY_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../reference/datagen.h"
#include "backend.h"
#include "shard.h"
#include "verify.h"

/* Default seconds a backend call may take before the watchdog fails the run (--forward-timeout):
 * a GPU layer's forward takes milliseconds, so a minute-long one has hung; a host forward of a
 * long prefill on few cores can take many minutes. */
#define AR_FORWARD_TIMEOUT_GPU_S 300
#define AR_FORWARD_TIMEOUT_HOST_S 3600

typedef struct replay_opts {
    const char *trace;
    const char *db;
    const char *backend;         /* "auto" or a name */
    const char *dtype;           /* NULL = the trace's */
    const char *kv_dtype;        /* NULL = the trace's */
    double kv_scale;
    bool kv_scale_given;
    int layers;                  /* 0 = 1 */
    int64_t step_first, step_last;
    bool steps_given;
    ar_verify_mode verify;
    int sample_rows;
    int verify_layers;           /* 0 = all replayed layers, else the first K */
    bool verify_layers_first;    /* spelled "first" */
    size_t verify_mem;           /* --verify-mem bytes for the device verifier; 0 = its default share */
    bool seed_given;
    uint64_t seed;
    ar_fault fault;
    bool resume;
    int cascade_mode;            /* 0 off, 1 auto, 2 on */
    int repeat;
    int threads;
    ar_datadist data;
    int64_t dump_step;           /* -1 = none */
    const char *dump_dir;
    bool quiet;
    bool no_overlap;
    const char *shard_text;      /* --shard i/N, or NULL: the launcher's environment */
    ar_shard_by shard_by;
    int device;                  /* --device N, or -1: chosen by the local rank */
    bool plan_only;
    double forward_timeout;      /* seconds a backend call may take; < 0 = the default */
} replay_opts;

/* The usage and exit codes, as `replay --help` prints them. */
void ar_replay_usage(FILE *f);

/* Parses `replay`'s arguments (argv[0] is "replay" or the program).  Returns 0, 1 after printing
 * --help, or -1 on a bad option (message printed). */
int ar_replay_parse_opts(int argc, char **argv, replay_opts *o);

#endif
