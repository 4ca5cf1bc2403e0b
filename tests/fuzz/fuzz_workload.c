/* fuzz_workload.c - libFuzzer harness for the simulator's workload importers (sim/workload.c)
 * and, on small workloads, the simulator and the trace writer behind them.
 *
 * Input layout:
 *   byte 0   importer: 0 mooncake, 1 azure, 2 vllm-run, 3 synthetic (value mod 4)
 *   byte 1   block size: one of 1, 16, 32, 512, 7, 64, 3, 16 (value mod 8)
 *   byte 2   --limit (0 = all requests)
 *   byte 3   bit 0: also simulate; bit 1: prefix caching off; bits 2-4: KV blocks 2^(4+k)
 *   rest     the file's bytes (mooncake/azure/vllm-run) or the synthetic SPEC text.
 *
 * Properties checked on every workload that loads: at least one request, arrivals finite,
 * non-negative, non-decreasing and starting at 0, lengths positive, and each request's keys
 * (one per full prompt block) inside the key array.  When simulated (at most 32 requests,
 * prompts <= 4096 and outputs <= 64 tokens, so it stays fast), every step goes through the
 * trace writer and the resulting file must read back through the validating reader with the
 * same number of steps and no error: the simulator never emits a trace the replay rejects.
 *
 * Synthetic specs that name a number above 4096 are skipped: n=1e8,input=1e8 is a legal
 * request for a huge workload, not a bug, and would only measure the allocator. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../sim/sim.h"
#include "fuzz_common.h"

#define FUZZ_MAX_SIM_REQS 32
#define FUZZ_MAX_SIM_PROMPT 4096
#define FUZZ_MAX_SIM_OUTPUT 64
#define FUZZ_MAX_SIM_STEPS 20000
#define FUZZ_MAX_SPEC_NUMBER 4096.0

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_workload: property failed: %s\n", what);
        abort();
    }
}

/* True when every number in the synthetic spec is at most FUZZ_MAX_SPEC_NUMBER. */
static bool spec_is_small(const char *spec)
{
    const char *p = spec;
    while (*p) {
        if ((*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '+') {
            char *end;
            double v = strtod(p, &end);
            if (end == p) { p++; continue; }
            if (!(fabs(v) <= FUZZ_MAX_SPEC_NUMBER)) return false;
            p = end;
        } else if ((*p == 'i' || *p == 'I' || *p == 'n' || *p == 'N') && strtod(p, NULL) != 0) {
            return false;   /* inf / nan spelled out */
        } else {
            p++;
        }
    }
    return true;
}

static void check_workload(const ar_workload *wl)
{
    check(wl->num_reqs > 0, "a loaded workload has requests");
    check(wl->reqs[0].arrival == 0, "the first request arrives at 0");
    for (int i = 0; i < wl->num_reqs; i++) {
        const ar_workload_req *q = &wl->reqs[i];
        check(isfinite(q->arrival) && q->arrival >= 0, "arrival finite and >= 0");
        if (i > 0) check(q->arrival >= wl->reqs[i - 1].arrival, "arrivals non-decreasing");
        check(q->prompt_len > 0 && q->output_len > 0, "lengths positive");
        check(q->num_keys == q->prompt_len / wl->block_size, "one key per full prompt block");
        check(q->key_offset >= 0 && q->key_offset + q->num_keys <= wl->num_keys_total, "keys inside the array");
    }
}

/* Runs the simulator over wl, writing the trace to path; then reads it back. */
static void simulate(const ar_workload *wl, int block_size, int num_blocks, bool prefix_caching,
                     const char *path)
{
    const ar_model_preset *preset = ar_model_preset_find("llama-3.1-8b");
    check(preset != NULL, "the llama-3.1-8b preset exists");
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.steptime.kind = AR_STEPTIME_CONSTANT;
    cfg.steptime.constant_s = 0.02;
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = preset->model;
    h->cache.block_size = block_size;
    h->cache.num_blocks = num_blocks;
    h->cache.dtype = AR_BF16;
    h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = 512;
    h->sched.max_num_seqs = 8;
    h->sched.prefix_caching = prefix_caching;
    snprintf(h->source, sizeof h->source, "fuzz");
    h->seed = 1;
    cfg.num_sms = 132;
    char err[AR_ERR_MAX + 4096];
    ar_sim *s = ar_sim_create(&cfg, wl, err, sizeof err);
    if (!s) return;   /* a configuration it refuses (with a message) is fine */
    ar_trace_writer *w = ar_trace_create(path, h, err, sizeof err);
    check(w != NULL, "the trace writer opens a temporary file");
    int64_t steps = 0;
    for (;;) {
        const ar_step *step;
        int r = ar_sim_step(s, &step, err, sizeof err);
        if (r == 0) break;
        if (r < 0) {
            fprintf(stderr, "fuzz_workload: simulator internal error: %s\n", err);
            abort();
        }
        check(ar_trace_write_step(w, step, err, sizeof err) == 0, "the trace writer writes a step");
        steps++;
        check(steps <= FUZZ_MAX_SIM_STEPS, "a small workload finishes in a bounded number of steps");
    }
    check(ar_trace_finish(w, err, sizeof err) == 0, "the trace writer finishes");
    ar_sim_destroy(s);

    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "fuzz_workload: the simulator's trace does not open: %s\n", err);
        abort();
    }
    int64_t read = 0;
    const ar_step *st;
    int rc;
    while ((rc = ar_trace_next(r, &st, err, sizeof err)) == 1) read++;
    if (rc < 0) {
        fprintf(stderr, "fuzz_workload: the simulator wrote a trace the reader rejects: %s\n", err);
        abort();
    }
    check(read == steps, "the reader sees every step the simulator wrote");
    ar_trace_close(r);
}

int ar_fuzz_workload_one(const uint8_t *data, size_t size)
{
    static const int block_sizes[8] = {1, 16, 32, 512, 7, 64, 3, 16};
    static const char *const kinds[4] = {"mooncake", "azure", "vllm-run", "synthetic"};
    if (size < 4) return 0;
    int kind = data[0] % 4;
    int block_size = block_sizes[data[1] % 8];
    int limit = data[2];
    bool want_sim = data[3] & 1, prefix_caching = !(data[3] & 2);
    int num_blocks = 1 << (4 + ((data[3] >> 2) & 7));
    const uint8_t *body = data + 4;
    size_t body_len = size - 4;

    char path[256], trace_path[256], spec[4200];
    ar_fuzz_tmp_path(path, sizeof path, "workload", kind == 2 ? ".jsonl" : ".txt");
    ar_fuzz_tmp_path(trace_path, sizeof trace_path, "simtrace", ".jsonl");
    if (kind == 3) {
        if (body_len > 4000) return 0;
        char text[4001];
        memcpy(text, body, body_len);
        text[body_len] = 0;
        if (!spec_is_small(text)) return 0;
        snprintf(spec, sizeof spec, "synthetic:%s", text);
    } else {
        if (ar_fuzz_write_file(path, body, body_len, false) != 0) return 0;
        snprintf(spec, sizeof spec, "%s:%s", kinds[kind], path);
    }
    ar_workload wl;
    char err[AR_ERR_MAX + 4096];
    int rc = ar_workload_load(spec, block_size, 1.0, limit, &wl, err, sizeof err);
    if (rc == 0) {
        check_workload(&wl);
        bool small = wl.num_reqs <= FUZZ_MAX_SIM_REQS;
        for (int i = 0; small && i < wl.num_reqs; i++)
            small = wl.reqs[i].prompt_len <= FUZZ_MAX_SIM_PROMPT && wl.reqs[i].output_len <= FUZZ_MAX_SIM_OUTPUT;
        if (want_sim && small) simulate(&wl, block_size, num_blocks, prefix_caching, trace_path);
        ar_workload_free(&wl);
    } else {
        check(rc == 2 && err[0] != 0, "a refused workload says why (exit code 2)");
    }
    unlink(path);
    unlink(trace_path);
    return 0;
}

#ifndef AR_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ar_fuzz_workload_one(data, size);
}
#endif
