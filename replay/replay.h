/* replay.h - the commands that live in replay/: replay, info, backends, and the CLI helpers. */
#ifndef AR_REPLAY_H
#define AR_REPLAY_H

#include "backend.h"

/* `attnreplay replay TRACE --db FILE [...]` (argv[0] = "replay"); returns the exit code. */
int ar_replay_main(int argc, char **argv);
/* `attnreplay backends [--trace T]`. */
int ar_backends_main(int argc, char **argv);
/* The run configuration a trace header implies, with optional --dtype / --kv-dtype overrides. */
int ar_run_config_from_header(const ar_trace_header *h, const char *dtype, const char *kv_dtype,
                              double kv_scale, ar_run_config *cfg, char *err, size_t err_len);

#endif
