/* test_workload.c - the workload importers of attnreplay sim (sim/workload.c): Mooncake's
 * pages and chained content keys, the public traces in ../shared/traces-public loading whole,
 * the synthetic generator's shared-prefix groups and arrival processes, and each importer's
 * bad-input errors (FILE:LINE and the rule; exit 2). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sim/sim.h"

/* ---- importers ------------------------------------------------------------------------------------ */

static void test_mooncake_pages_and_chained_keys(void **state)
{
    (void)state;
    char path[512], err[512];
    tu_tmp("mc.jsonl", path, sizeof path);
    assert_int_equal(tu_write(path,
                              "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [1, 2, 3]}\n"
                              "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [1, 9]}\n"
                              "{\"timestamp\": 7, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [5, 2]}\n"),
                     0);
    char spec[600];
    snprintf(spec, sizeof spec, "mooncake:%s", path);
    ar_workload wl;
    assert_int_equal(ar_workload_load(spec, 16, 2.0, 0, &wl, err, sizeof err), 0);
    assert_int_equal(wl.num_reqs, 3);
    assert_int_equal(wl.reqs[0].num_keys, 68);
    assert_int_equal(wl.reqs[1].num_keys, 37);
    assert_true(wl.reqs[1].arrival > 0.0099 && wl.reqs[1].arrival < 0.0101);   /* ms, x2 */
    const uint64_t *k0 = wl.keys + wl.reqs[0].key_offset, *k1 = wl.keys + wl.reqs[1].key_offset,
                   *k2 = wl.keys + wl.reqs[2].key_offset;
    for (int i = 0; i < 32; i++) assert_true(k0[i] == k1[i]);       /* hash 1 = 32 pages */
    assert_true(k0[32] != k1[32]);
    assert_true(k0[0] != k2[0]);
    assert_true(k0[32] != k2[32]);    /* same hash id 2 at the same place, but a different prefix */
    for (int i = 1; i < 68; i++) assert_true(k0[i] != k0[i - 1]);
    ar_workload_free(&wl);
    assert_int_equal(ar_workload_load(spec, 64, 1.0, 0, &wl, err, sizeof err), 0);
    assert_int_equal(wl.reqs[0].num_keys, 17);
    assert_true(wl.keys[wl.reqs[0].key_offset + 7] == wl.keys[wl.reqs[1].key_offset + 7]);
    assert_true(wl.keys[wl.reqs[0].key_offset + 8] != wl.keys[wl.reqs[1].key_offset + 8]);
    ar_workload_free(&wl);
    assert_int_equal(ar_workload_load(spec, 48, 1.0, 0, &wl, err, sizeof err), 2);
    assert_non_null(strstr(err, "512"));
}

static void test_public_traces_load(void **state)
{
    (void)state;
    char path[512], spec[600], err[512];
    ar_workload wl;
    if (!tu_public_trace("mooncake-fast25/synthetic_trace.jsonl", path, sizeof path)) skip();
    snprintf(spec, sizeof spec, "mooncake:%s", path);
    assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 0);
    assert_int_equal(wl.num_reqs, 3993);
    assert_int_equal(wl.reqs[0].prompt_len, 40160);
    assert_int_equal(wl.reqs[0].num_keys, 2510);
    ar_workload_free(&wl);
    assert_non_null(tu_public_trace("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", path, sizeof path));
    snprintf(spec, sizeof spec, "azure:%s", path);
    assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 0);
    assert_int_equal(wl.num_reqs, 19366);
    assert_int_equal(wl.reqs[0].prompt_len, 374);
    assert_int_equal(wl.reqs[0].output_len, 44);
    assert_true(wl.reqs[1].arrival > 4.31 && wl.reqs[1].arrival < 4.32);   /* 18:15:50.995 - 18:15:46.681 */
    assert_true(wl.reqs[wl.num_reqs - 1].arrival > 3000 && wl.reqs[wl.num_reqs - 1].arrival < 3700);
    ar_workload_free(&wl);
    assert_int_equal(ar_workload_load(spec, 16, 0.5, 100, &wl, err, sizeof err), 0);
    assert_int_equal(wl.num_reqs, 100);
    assert_true(wl.reqs[1].arrival > 2.15 && wl.reqs[1].arrival < 2.16);
    ar_workload_free(&wl);
    assert_non_null(tu_public_trace("vllm-runs-llmservingsim/RTX4090-Llama-3.1-8B", path, sizeof path));
    snprintf(spec, sizeof spec, "vllm-run:%s", path);
    assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 0);
    assert_int_equal(wl.num_reqs, 300);
    assert_int_equal(wl.reqs[0].prompt_len, 2358);
    assert_int_equal(wl.reqs[0].output_len, 531);
    assert_true(wl.reqs[1].arrival > 0.386 && wl.reqs[1].arrival < 0.387);   /* queued_ts difference */
    /* engine TTFT = first_token_ts - queued_ts; TPOT = (last - first) / (output - 1), row 1 */
    assert_true(fabs(wl.reqs[0].real_ttft - (27537.350135653 - 27536.660701067)) < 1e-6);
    assert_true(fabs(wl.reqs[0].real_tpot - (27554.231018618 - 27537.350135653) / 530.0) < 1e-9);
    ar_workload_free(&wl);
}

static void test_synthetic_shared_prefix_groups(void **state)
{
    (void)state;
    ar_workload wl;
    char err[256];
    assert_int_equal(ar_workload_synthetic("groups=2,prompts=3,system=64,question=20,output=5,rate=4", 16, &wl, err,
                                           sizeof err), 0);
    assert_int_equal(wl.num_reqs, 6);
    int same = 0, diff = 0;
    for (int a = 0; a < 6; a++) {
        assert_int_equal(wl.reqs[a].prompt_len, 84);
        assert_int_equal(wl.reqs[a].num_keys, 5);
        for (int b = a + 1; b < 6; b++) {
            const uint64_t *ka = wl.keys + wl.reqs[a].key_offset, *kb = wl.keys + wl.reqs[b].key_offset;
            assert_true(ka[4] != kb[4]);     /* the question block is unique */
            if (ka[0] == kb[0]) {
                same++;
                assert_true(ka[3] == kb[3]);
            } else {
                diff++;
                assert_true(ka[3] != kb[3]);
            }
        }
    }
    assert_int_equal(same, 6);   /* 2 groups x C(3,2) pairs */
    assert_int_equal(diff, 9);
    ar_workload_free(&wl);
}

static void test_synthetic_arrivals(void **state)
{
    (void)state;
    ar_workload wl;
    char err[256];
    double rate = 5;
    const char *specs[] = {"n=4000,input=100,output=10,rate=5,arrival=poisson",
                           "n=4000,input=100,output=10,rate=5,arrival=gamma,cv=3"};
    double want_cv[] = {1.0, 3.0};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ar_workload_synthetic(specs[k], 16, &wl, err, sizeof err), 0);
        double sum = 0, sq = 0;
        int n = wl.num_reqs - 1;
        for (int i = 0; i < n; i++) {
            double gap = wl.reqs[i + 1].arrival - wl.reqs[i].arrival;
            assert_true(gap >= 0);
            sum += gap;
            sq += gap * gap;
        }
        double mean = sum / n, cv = sqrt(sq / n - mean * mean) / mean;
        assert_true(fabs(mean * rate - 1) < 0.12);
        assert_true(fabs(cv - want_cv[k]) < 0.25 * want_cv[k]);
        ar_workload_free(&wl);
    }
    assert_int_equal(ar_workload_synthetic("n=0,input=1,output=1", 16, &wl, err, sizeof err), 2);
    assert_int_equal(ar_workload_synthetic("groups=2,prompts=2,system=10,question=5", 16, &wl, err, sizeof err), 2);
    assert_int_equal(ar_workload_synthetic("n=3,input=5,output=5,bogus=1", 16, &wl, err, sizeof err), 2);
    assert_non_null(strstr(err, "bogus"));
    /* the seed is read exactly, in decimal: 2^53 + 1 is not 2^53 (as it was through a double),
     * and hex or an exponent is refused rather than read as another number */
    ar_workload a, b;
    assert_int_equal(ar_workload_synthetic("n=8,input=5,output=5,seed=9007199254740992", 16, &a, err, sizeof err), 0);
    assert_int_equal(ar_workload_synthetic("n=8,input=5,output=5,seed=9007199254740993", 16, &b, err, sizeof err), 0);
    assert_true(a.reqs[1].arrival != b.reqs[1].arrival);
    ar_workload_free(&a);
    ar_workload_free(&b);
    assert_int_equal(ar_workload_synthetic("n=8,input=5,output=5,seed=18446744073709551615", 16, &a, err, sizeof err), 0);
    ar_workload_free(&a);
    static const char *const bad_seeds[] = { "0x10", "1e3", "-2", "+2", "2.0", "18446744073709551616", "" };
    for (size_t i = 0; i < sizeof bad_seeds / sizeof bad_seeds[0]; i++) {
        char spec[128];
        snprintf(spec, sizeof spec, "n=3,input=5,output=5,seed=%s", bad_seeds[i]);
        assert_int_equal(ar_workload_synthetic(spec, 16, &wl, err, sizeof err), 2);
        if (!strstr(err, "must be a non-negative decimal integer below 2^64")) fail_msg("%s: error '%s'", spec, err);
        ar_workload_free(&wl);
    }
}

/* Loads text as KIND from a temp file; returns the rc and leaves the message in err. */
static int load_text(const char *kind, const char *name, const char *text, char *err, size_t err_len, char *path,
                     size_t path_len)
{
    tu_tmp(name, path, path_len);
    assert_int_equal(tu_write(path, text), 0);
    char spec[700];
    snprintf(spec, sizeof spec, "%s:%s", kind, path);
    ar_workload wl;
    int rc = ar_workload_load(spec, 16, 1.0, 0, &wl, err, err_len);
    if (rc == 0) ar_workload_free(&wl);
    return rc;
}

static void expect_error(const char *kind, const char *name, const char *text, int line, const char *words)
{
    char err[1024], path[512], want[600];
    assert_int_equal(load_text(kind, name, text, err, sizeof err, path, sizeof path), 2);
    snprintf(want, sizeof want, "%s:%d:", path, line);
    if (!strstr(err, want) || !strstr(err, words)) fail_msg("error '%s' lacks '%s' or '%s'", err, want, words);
}

static void test_bad_input_messages(void **state)
{
    (void)state;
    const char *ok = "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n";
    char text[1024];
    snprintf(text, sizeof text, "%s{\"timestamp\": 1, \"input_length\": 100,\n", ok);
    expect_error("mooncake", "m1.jsonl", text, 2, "malformed JSON");
    snprintf(text, sizeof text, "%s{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 3, \"hash_ids\": [1]}\n", ok);
    expect_error("mooncake", "m2.jsonl", text, 2, "positive");
    snprintf(text, sizeof text, "{\"timestamp\": 9, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n%s", ok);
    expect_error("mooncake", "m3.jsonl", text, 2, "back in time");
    expect_error("mooncake", "m4.jsonl", "{\"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n", 1,
                 "timestamp");
    expect_error("mooncake", "m5.jsonl", "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [1]}\n",
                 1, "hash_ids");
    expect_error("azure", "a1.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47,x,4\n",
                 3, "malformed");
    expect_error("azure", "a2.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,0\n", 2, "positive");
    expect_error("azure", "a3.csv",
                 "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4\n2023-11-16 18:15:40.00,374,4\n", 3,
                 "back in time");
    expect_error("azure", "a4.csv", "time,ctx,gen\n", 1, "header");
    /* a time before 1970 is named as such, not as a malformed row (1969-12-31 23:59:59 is
     * timegm's -1, its error value) */
    expect_error("azure", "a6.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1969-12-31 23:59:59,374,4\n", 2,
                 "timestamp 1969-12-31 23:59:59 is before 1970-01-01 00:00:00 UTC");
    expect_error("azure", "a7.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1950-06-01 10:00:00.5,374,4\n", 2,
                 "timestamp 1950-06-01 10:00:00.5 is before 1970-01-01");
    /* a day past its month's end is refused, not rolled over by timegm into the next month
     * (2023-02-31 read as 2023-03-03); 29 February of a leap year is a date */
    expect_error("azure", "a8.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-28 10:00:00,374,4\n2023-02-31 10:00:00,374,4\n",
                 3, "a8.csv:3: timestamp 2023-02-31 10:00:00 is not a date (month 02 of 2023 has 28 days)");
    expect_error("azure", "a9.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-04-31 10:00:00.25,374,4\n", 2,
                 "timestamp 2023-04-31 10:00:00.25 is not a date (month 04 of 2023 has 30 days)");
    expect_error("azure", "a10.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2100-02-29 10:00:00,374,4\n", 2,
                 "month 02 of 2100 has 28 days");
    {
        char path[512], err[512], spec[700];
        tu_tmp("a-leap.csv", path, sizeof path);
        assert_int_equal(tu_write(path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-02-29 10:00:00,374,4\n"
                                        "2024-03-01 10:00:00,374,4\n"), 0);
        snprintf(spec, sizeof spec, "azure:%s", path);
        ar_workload wl;
        assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 0);
        assert_int_equal(wl.num_reqs, 2);
        assert_true(wl.reqs[1].arrival == 86400.0);
        ar_workload_free(&wl);
    }
    /* a negative timestamp is named as negative, whatever row it is on (-1 is the importers'
     * "no previous row" mark: -0.5 was taken, -5 said "goes back in time (previous -1.000)") */
    expect_error("mooncake", "m9.jsonl", "{\"timestamp\": -5, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n",
                 1, "timestamp -5.000 is negative");
    expect_error("mooncake", "m10.jsonl", "{\"timestamp\": -0.5, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n",
                 1, "timestamp -0.500 is negative");
    snprintf(text, sizeof text, "%s{\"timestamp\": -3, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n", ok);
    expect_error("mooncake", "m11.jsonl", text, 2, "timestamp -3.000 is negative");
    expect_error("vllm-run", "v5.jsonl", "{\"queued_ts\": -5.0, \"input_toks\": 10, \"output_toks\": 4}\n", 1,
                 "queued_ts -5.000000 is negative");
    expect_error("vllm-run", "v6.jsonl", "{\"arrival_time\": -0.25, \"input_toks\": 10, \"output_toks\": 4}\n", 1,
                 "arrival_time -0.250000 is negative");
    expect_error("vllm-run", "v1.jsonl", "{\"queued_ts\": 1.0, \"input_toks\": 10}\n", 1, "output_toks");
    expect_error("vllm-run", "v2.jsonl", "[1, 2]\n", 1, "malformed");
    /* a field given twice is refused with the key, never silently last-wins */
    snprintf(text, sizeof text, "%s{\"timestamp\": 1, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1], "
             "\"input_length\": 200}\n", ok);
    expect_error("mooncake", "m8.jsonl", text, 2, "duplicate key in a JSON object (duplicate object key near '\"input_length\"')");
    expect_error("vllm-run", "v4.jsonl", "{\"queued_ts\": 1.0, \"input_toks\": 10, \"output_toks\": 4, \"queued_ts\": 7.0}\n",
                 1, "duplicate key in a JSON object (duplicate object key near '\"queued_ts\"')");
    /* a count too large is named as too large, not as "must be positive" */
    expect_error("mooncake", "m6.jsonl",
                 "{\"timestamp\": 0, \"input_length\": 4611686018427387904, \"output_length\": 3, \"hash_ids\": [1]}\n", 1,
                 "input_length 4611686018427387904 exceeds the limit of 100000000 tokens");
    expect_error("mooncake", "m7.jsonl", "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 3, \"hash_ids\": [1]}\n",
                 1, "input_length must be positive (got 0)");
    expect_error("azure", "a5.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,900000000\n", 2,
                 "GeneratedTokens 900000000 exceeds the limit");
    expect_error("vllm-run", "v3.jsonl", "{\"queued_ts\": 1.0, \"input_toks\": 200000000, \"output_toks\": 4}\n", 1,
                 "input_toks 200000000 exceeds the limit");
    char err[512];
    ar_workload wl;
    struct { const char *spec, *words; } synthetic_cases[] = {
        { "n=1000000000,input=5,output=5", "n=1000000000 exceeds the limit of 100000000" },
        { "n=2.5,input=5,output=5", "n=2.5 must be a non-negative integer" },
        { "groups=2,prompts=3,system=64,question=8,output=4,n=6", "not keys of both forms" },
        { "n=6,input=64,output=4,groups=2", "not keys of both forms" },
        { "groups=4000,prompts=4000,system=64,question=8,output=4", "groups x prompts = 16000000 requests exceeds" },
    };
    for (size_t i = 0; i < sizeof synthetic_cases / sizeof synthetic_cases[0]; i++) {
        char spec[128];
        snprintf(spec, sizeof spec, "synthetic:%s", synthetic_cases[i].spec);
        assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 2);
        if (!strstr(err, synthetic_cases[i].words)) fail_msg("%s: error '%s' lacks '%s'", spec, err, synthetic_cases[i].words);
    }
    /* a directory is named as one, not as a file without requests */
    static const char *const kinds[] = { "mooncake", "azure" };
    for (size_t i = 0; i < 2; i++) {
        char spec[600];
        snprintf(spec, sizeof spec, "%s:%s", kinds[i], tu_tmpdir());
        assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 2);
        if (!strstr(err, "is a directory")) fail_msg("%s: error '%s' does not say it is a directory", spec, err);
    }
    assert_int_equal(ar_workload_load("nosuch:foo", 16, 1.0, 0, &wl, err, sizeof err), 2);
    assert_int_equal(ar_workload_load("mooncake:/nonexistent/x.jsonl", 16, 1.0, 0, &wl, err, sizeof err), 2);
    assert_non_null(strstr(err, "/nonexistent/x.jsonl"));
}

/* The simulated clock counts whole microseconds in a double, exact up to 2^53 us (about 285
 * years): an arrival past it is refused naming the row, never simulated with steps that stop
 * advancing the clock (a Mooncake timestamp of 1e300 ms gave 10 steps at one time and a TPOT of
 * 0); time-scale included; just under it loads. */
static void test_arrivals_past_the_clock_range(void **state)
{
    (void)state;
#define ROW0 "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n"
#define ROW1(T) "{\"timestamp\": " T ", \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n"
    static const struct { const char *kind, *name, *text; int line; const char *words; } cases[] = {
        { "mooncake", "clock1.jsonl", ROW0 ROW1("1e300"), 2, "beyond the simulated clock's range" },
        { "mooncake", "clock2.jsonl", ROW0 ROW1("1e16"), 2, "2^53 us" },
        { "azure", "clock3.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00,374,4\n"
                                 "9999-11-16 18:15:46.1,374,4\n", 3, "beyond the simulated clock's range" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].kind, cases[i].name, cases[i].text, cases[i].line, cases[i].words);
    char path[512], err[1024], spec[700];
    ar_workload wl;
    tu_tmp("clock4.jsonl", path, sizeof path);
    assert_int_equal(tu_write(path, ROW0 ROW1("9e12")), 0);
#undef ROW0
#undef ROW1
    snprintf(spec, sizeof spec, "mooncake:%s", path);
    assert_int_equal(ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err), 0);   /* 9e9 s: inside */
    ar_workload_free(&wl);
    assert_int_equal(ar_workload_load(spec, 16, 2.0, 0, &wl, err, sizeof err), 2);   /* x2: past it */
    if (!strstr(err, ":2:") || !strstr(err, "--time-scale")) fail_msg("error '%s'", err);
}

/* A vLLM run's engine timings must be in order: first_token_ts before queued_ts, or
 * last_token_ts before first_token_ts, was taken as no timing and the comparison with the real
 * engine dropped the request without a word (one row of each: "TPOT 0.000 vs 0.000 ms"). */
static void test_vllm_run_timings_in_order(void **state)
{
    (void)state;
    expect_error("vllm-run", "vt1.jsonl",
                 "{\"queued_ts\": 1.0, \"input_toks\": 10, \"output_toks\": 4, \"first_token_ts\": 2.0, \"last_token_ts\": 3.0}\n"
                 "{\"queued_ts\": 100.0, \"input_toks\": 10, \"output_toks\": 5, \"first_token_ts\": 90.0, \"last_token_ts\": 95.0}\n",
                 2, "first_token_ts 90.000000 is before queued_ts 100.000000");
    expect_error("vllm-run", "vt2.jsonl",
                 "{\"queued_ts\": 100.0, \"input_toks\": 10, \"output_toks\": 5, \"first_token_ts\": 1e308, \"last_token_ts\": -1e308}\n",
                 1, "last_token_ts");
    char path[512], err[1024];
    assert_int_equal(load_text("vllm-run", "vt3.jsonl",
                               "{\"queued_ts\": 1.0, \"input_toks\": 10, \"output_toks\": 4, \"first_token_ts\": 1.0, "
                               "\"last_token_ts\": 1.0}\n", err, sizeof err, path, sizeof path), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mooncake_pages_and_chained_keys),
        cmocka_unit_test(test_public_traces_load),
        cmocka_unit_test(test_synthetic_shared_prefix_groups),
        cmocka_unit_test(test_synthetic_arrivals),
        cmocka_unit_test(test_bad_input_messages),
        cmocka_unit_test(test_arrivals_past_the_clock_range),
        cmocka_unit_test(test_vllm_run_timings_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
