/* replay.h - the commands that live in replay/: replay, merge, info, backends, and the CLI helpers. */
#ifndef AR_REPLAY_H
#define AR_REPLAY_H

#include "backend.h"

/* `attnreplay replay TRACE --db FILE [...]` (argv[0] = "replay"); returns the exit code. */
int ar_replay_main(int argc, char **argv);
/* `attnreplay merge OUT.db SHARD.db...` (replay/merge.c): the shards of a sharded replay as one run. */
int ar_merge_main(int argc, char **argv);
/* `attnreplay backends [--trace T]`. */
int ar_backends_main(int argc, char **argv);
/* The run configuration a trace header implies, with optional --dtype / --kv-dtype overrides. */
int ar_run_config_from_header(const ar_trace_header *h, const char *dtype, const char *kv_dtype,
                              double kv_scale, ar_run_config *cfg, char *err, size_t err_len);
/* The summary's verdict on cascade steps, from their attention time with cascade and flat:
 * "(saved N%)" when cascade was no slower, "(cost N% more: flat was faster on these steps)"
 * when it was (--cascade on forces it onto steps where it is); "" when flat_us <= 0. */
void ar_cascade_verdict(double cascade_us, double flat_us, char *buf, size_t len);

#endif
