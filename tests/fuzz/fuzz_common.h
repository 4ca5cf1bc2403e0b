/* fuzz_common.h - helpers shared by the libFuzzer harnesses in tests/fuzz/ and by the cmocka
 * test that replays their regression inputs (tests/test_fuzz_regressions.c).
 *
 * The harnesses drive path-based APIs (the trace reader, the workload importers, the CLI), so
 * each input is first written to a private temporary file; the directory is $AR_FUZZ_TMP, else
 * /dev/shm when it exists (no disk traffic), else $TMPDIR or /tmp. */
#ifndef AR_FUZZ_COMMON_H
#define AR_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Fills buf with "<dir>/arfuzz-<pid>-<tag><suffix>" (one name per process and tag). */
void ar_fuzz_tmp_path(char *buf, size_t len, const char *tag, const char *suffix);
/* Writes data [size] to path, gzip-compressed when gzip is true.  0 ok, -1 on failure. */
int ar_fuzz_write_file(const char *path, const uint8_t *data, size_t size, bool gzip);

/* One input through each harness (what LLVMFuzzerTestOneInput calls); always returns 0 and
 * abort()s when a property the code promises does not hold. */
int ar_fuzz_trace_one(const uint8_t *data, size_t size);
int ar_fuzz_workload_one(const uint8_t *data, size_t size);
int ar_fuzz_cli_one(const uint8_t *data, size_t size);

#endif
