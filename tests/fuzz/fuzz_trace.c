/* fuzz_trace.c - libFuzzer harness for the trace reader (traces/trace.c), plain and gzip.
 *
 * One input is one trace file.  The harness writes it to a private temporary file and reads
 * it to the end with the streaming reader, walking the live-request table after every step
 * (ar_trace_find, ar_trace_live_at) and touching every array of the step it returns, so ASan
 * sees each element the reader hands out.  It then gzip-compresses the same bytes, reads that
 * file too, and requires the two reads to agree (same number of steps, same error), which
 * holds because zlib's gz layer is the only difference.  Finally the statistics pass
 * (ar_trace_stats_compute, used by `attnreplay info`) runs over the plain file.
 *
 * Inputs that are already gzip (the sample traces are) exercise the decompressor on mutated
 * gzip streams in the first read; the second read then sees a gzip-inside-gzip file, which
 * must fail the same way.
 *
 * Build: `make fuzz` (clang -fsanitize=fuzzer,address,undefined).  The same file, compiled
 * without -fsanitize=fuzzer and with AR_FUZZ_NO_MAIN unset, is not used: the regression test
 * tests/test_fuzz_regressions.c calls ar_fuzz_trace_one directly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../../traces/trace.h"
#include "fuzz_common.h"

/* Reads path to the end; returns the number of steps read, and copies the error (or "") into
 * err.  checksum accumulates everything the reader handed out so nothing is optimised away. */
static int64_t read_all(const char *path, char *err, size_t err_len, uint64_t *checksum)
{
    err[0] = 0;
    ar_trace_reader *r = ar_trace_open(path, err, err_len);
    if (!r) return -1;
    const ar_trace_header *h = ar_trace_header_of(r);
    *checksum += (uint64_t)h->cache.num_blocks + (uint64_t)h->model.num_q_heads;
    int64_t steps = 0;
    for (;;) {
        const ar_step *st = NULL;
        int rc = ar_trace_next(r, &st, err, err_len);
        if (rc <= 0) {
            if (rc == 0) err[0] = 0;
            break;
        }
        steps++;
        *checksum += (uint64_t)st->step;
        for (int i = 0; i < st->num_new; i++) {
            const ar_new_req *nr = &st->new_reqs[i];
            *checksum += strlen(nr->req) + (uint64_t)nr->prompt_len;
            for (int k = 0; k < nr->num_block_ids; k++) *checksum += (uint64_t)nr->block_ids[k];
            for (int k = 0; k < nr->num_block_keys; k++) *checksum ^= nr->block_keys[k];
        }
        for (int i = 0; i < st->num_cached; i++) {
            const ar_cached_req *cr = &st->cached[i];
            *checksum += strlen(cr->req) + (uint64_t)cr->num_computed_tokens;
            for (int k = 0; k < cr->num_new_block_ids; k++) *checksum += (uint64_t)cr->new_block_ids[k];
        }
        for (int i = 0; i < st->num_scheduled; i++) {
            const ar_live_req *lr = ar_trace_find(r, st->scheduled[i].req);
            /* the reader promises every scheduled request is live after the step applies */
            if (!lr) {
                fprintf(stderr, "fuzz_trace: scheduled request '%s' is not live\n", st->scheduled[i].req);
                abort();
            }
            *checksum += (uint64_t)st->scheduled[i].num_tokens + (uint64_t)lr->num_blocks;
        }
        for (int i = 0; i < st->num_finished; i++) *checksum += strlen(st->finished[i]);
        for (int i = 0; i < st->num_preempted; i++) *checksum += strlen(st->preempted[i]);
        int live = ar_trace_live_count(r);
        for (int i = 0; i < live; i++) {
            const ar_live_req *lr = ar_trace_live_at(r, i);
            for (int k = 0; k < lr->num_blocks; k++) {
                int blk = lr->block_ids[k];
                if (blk <= 0 || blk >= h->cache.num_blocks) {
                    fprintf(stderr, "fuzz_trace: live block %d outside 1..%d\n", blk, h->cache.num_blocks - 1);
                    abort();
                }
            }
            for (int k = 0; k < lr->num_prompt_keys; k++) *checksum ^= lr->prompt_keys[k];
            /* a request's blocks must cover its computed tokens */
            if ((int64_t)lr->num_blocks * h->cache.block_size < lr->num_computed_tokens) {
                fprintf(stderr, "fuzz_trace: %s has %d blocks for %d computed tokens\n", lr->req,
                        lr->num_blocks, lr->num_computed_tokens);
                abort();
            }
        }
    }
    ar_trace_close(r);
    return steps;
}

/* Strips the "PATH:" prefix so errors from two files with different names compare. */
static const char *after_path(const char *err, const char *path)
{
    size_t n = strlen(path);
    return strncmp(err, path, n) == 0 ? err + n : err;
}

int ar_fuzz_trace_one(const uint8_t *data, size_t size)
{
    char plain[256], gz[256];
    ar_fuzz_tmp_path(plain, sizeof plain, "trace", ".jsonl");
    ar_fuzz_tmp_path(gz, sizeof gz, "trace", ".jsonl.gz");
    if (ar_fuzz_write_file(plain, data, size, false) != 0) return 0;
    if (ar_fuzz_write_file(gz, data, size, true) != 0) {
        unlink(plain);
        return 0;
    }
    char err1[AR_ERR_MAX], err2[AR_ERR_MAX];
    uint64_t sum1 = 0, sum2 = 0;
    int64_t n1 = read_all(plain, err1, sizeof err1, &sum1);
    int64_t n2 = read_all(gz, err2, sizeof err2, &sum2);
    const char *e1 = after_path(err1, plain), *e2 = after_path(err2, gz);
    /* The gz read of bytes that are themselves gzip sees a different (doubly compressed)
     * stream only when the input starts with the gzip magic; everything else must agree. */
    bool input_is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    if (!input_is_gzip && (n1 != n2 || sum1 != sum2 || strcmp(e1, e2) != 0)) {
        fprintf(stderr, "fuzz_trace: plain and gzip reads differ: %lld steps '%s' vs %lld steps '%s'\n",
                (long long)n1, err1, (long long)n2, err2);
        abort();
    }
    ar_trace_stats st;
    ar_trace_header h;
    char err3[AR_ERR_MAX];
    int rc = ar_trace_stats_compute(plain, &st, &h, err3, sizeof err3);
    if ((rc == 0) != (n1 >= 0 && err1[0] == 0)) {
        fprintf(stderr, "fuzz_trace: stats (%d: %s) disagree with the reader (%lld: %s)\n", rc,
                rc ? err3 : "", (long long)n1, err1);
        abort();
    }
    if (rc == 0 && st.steps != n1) {
        fprintf(stderr, "fuzz_trace: stats count %lld steps, the reader %lld\n", (long long)st.steps,
                (long long)n1);
        abort();
    }
    unlink(plain);
    unlink(gz);
    return 0;
}

#ifndef AR_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ar_fuzz_trace_one(data, size);
}
#endif
