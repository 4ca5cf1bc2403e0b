/* test_profile_import.c - LLMServingSim's per-layer profiles read into the step-time profile format
 * (sim/profile_import.c, `attnreplay profile --from-llmservingsim`): a hand-made bundle whose every
 * time follows a known formula is imported, saved and loaded back (format version 2: operations run
 * twice per layer or once per step, an operation on the first part of the token grid, the mixed
 * attention grid; version 3: a step's prompts in one lookup, and with skew.csv and skew_fit.csv
 * the correction for decodes of unequal contexts, its bucket axes and alpha_default derived as
 * LLMServingSim's fit_alpha.py does), and --step-time profile:DB must give exactly the formula's
 * step time; a bundle whose rows merge two grids keeps the complete part; every malformed input is
 * refused naming the file, the line and the rule; a damaged database is refused by the loader; and
 * the shipped RTX profiles (sim/profiles/) load and match their source rows. */
#include "testutil.h"

#include <ctype.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sim/sim.h"

static const ar_model_preset *l8(void) { return ar_model_preset_find("llama-3.1-8b"); }

/* The hand-made bundle's times: per-token modules (dense.csv) us = base + slope * tokens; the
 * per-sequence ones likewise; attention linear in each of its four axes. */
static const char *const dense_layers[] = {"embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj",
                                           "gate_up_proj", "act_fn", "down_proj", "final_layernorm"};
#define NUM_DENSE 9
static double dense_us(int layer, double tokens) { return 1.0 + layer + (0.5 + layer) * tokens; }
static double seq_us(int which, double seqs) { return which ? 20.0 + 2.0 * seqs : 500.0 + 5.0 * seqs; }
static double attn_us(double pc, double kp, double nd, double kd)
{
    return 7.0 + 0.25 * pc + 0.125 * kp + 3.0 * nd + 0.5 * kd + (pc > 0 && nd > 0 ? 11.0 : 0.0);
}

static const int tokens_grid[] = {1, 2, 4, 8, 16};
static const int seqs_grid[] = {1, 2, 4};
static const int pcs[] = {16, 32}, kps[] = {0, 16}, nds[] = {1, 2}, kds[] = {16, 32};

/* Writes the bundle into dir/tp1 (and dir/meta.yaml); extra_attention: rows appended to
 * attention.csv. */
static void write_bundle(const char *dir, const char *extra_attention)
{
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tp1", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/meta.yaml", dir);
    assert_int_equal(tu_write(path, "vllm_version: 0.19.0\ngpu: NVIDIA GeForce RTX 4090\nhardware: RTX4090\n"), 0);
    static char text[1 << 16];
    size_t n = (size_t)snprintf(text, sizeof text, "layer,tokens,time_us\n");
    for (int l = 0; l < NUM_DENSE; l++)
        for (size_t i = 0; i < sizeof tokens_grid / sizeof tokens_grid[0]; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s,%d,%g\n", dense_layers[l], tokens_grid[i],
                                  dense_us(l, tokens_grid[i]));
    snprintf(path, sizeof path, "%s/tp1/dense.csv", dir);
    assert_int_equal(tu_write(path, text), 0);
    n = (size_t)snprintf(text, sizeof text, "layer,sequences,time_us\n");
    for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < sizeof seqs_grid / sizeof seqs_grid[0]; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s,%d,%g\n", w ? "sampler" : "lm_head", seqs_grid[i],
                                  seq_us(w, seqs_grid[i]));
    snprintf(path, sizeof path, "%s/tp1/per_sequence.csv", dir);
    assert_int_equal(tu_write(path, text), 0);
    n = (size_t)snprintf(text, sizeof text, "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n");
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            n += (size_t)snprintf(text + n, sizeof text - n, "0,0,%d,%d,%g\n", nds[a], kds[b], attn_us(0, 0, nds[a], kds[b]));
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            n += (size_t)snprintf(text + n, sizeof text - n, "%d,%d,0,0,%g\n", pcs[a], kps[b], attn_us(pcs[a], kps[b], 0, 0));
            for (int c = 0; c < 2; c++)
                for (int d = 0; d < 2; d++)
                    n += (size_t)snprintf(text + n, sizeof text - n, "%d,%d,%d,%d,%g\n", pcs[a], kps[b], nds[c], kds[d],
                                          attn_us(pcs[a], kps[b], nds[c], kds[d]));
        }
    if (extra_attention) n += (size_t)snprintf(text + n, sizeof text - n, "%s", extra_attention);
    snprintf(path, sizeof path, "%s/tp1/attention.csv", dir);
    assert_int_equal(tu_write(path, text), 0);
}

/* skew.csv: alpha_default = (10 x 2 + 20 x 3 + 10 x 5) / (10^2 + 20^2 + 10^2) = 0.21667 -> 0.2167 (the
 * row without an alpha left out); axes n <= 2, <= 4, > 4; largest context <= 1k, > 1k; prompt
 * context 0, <= 512, > 512.  skew_fit.csv: three buckets. */
#define SKEW_ALPHA_DEFAULT 0.2167
static void write_skew(const char *dir)
{
    char path[700];
    snprintf(path, sizeof path, "%s/tp1/skew.csv", dir);
    assert_int_equal(tu_write(path, "regime,n,nb,ratio,skew,pc,kp,kvs,kv_big,kv_mean,t_mean_us,t_max_us,t_skew_us,alpha\n"
                                    "pure,2,1,0.5,4.0,0,0,16,64,40,10,20,12,0.2\n"
                                    "pure,4,1,0.25,4.0,0,0,16,64,28,10,30,13,0.15\n"
                                    "mixed,2,1,0.5,4.0,16,512,16,64,40,10,20,15,0.5\n"
                                    "pure,2,1,0.5,4.0,0,0,16,64,40,10,9,9.5,\n"), 0);
    snprintf(path, sizeof path, "%s/tp1/skew_fit.csv", dir);
    assert_int_equal(tu_write(path, "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\r\n"
                                    "0,n<=2,sr<=70%,kvB<=1k,kp=0,0.5,1\r\n"
                                    "0,n<=4,sr<=40%,kvB<=1k,kp=0,-0.25,1\r\n"
                                    "16,n<=2,sr<=70%,kvB<=1k,kp<=512,2.0,1\r\n"), 0);
}

static int find_op(const ar_profile_table *p, const char *name)
{
    for (int g = 0; g < p->num_gemms; g++)
        if (strcmp(p->gemm_name[g], name) == 0) return g;
    fail_msg("no operation %s", name);
    return -1;
}

static void test_import_save_load_and_step_time(void **state)
{
    (void)state;
    char dir[512], tp1[600], db[512], err[1024], note[256];
    tu_tmp("bundle", dir, sizeof dir);
    write_bundle(dir, NULL);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    static ar_profile_table p, q;
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "NVIDIA GeForce RTX 4090", &p, note, sizeof note, err,
                                                     sizeof err), 0);
    assert_non_null(strstr(note, "mixed 2 x 2 x 2 x 2"));
    assert_null(strstr(note, "left out"));
    assert_int_equal(p.num_gemms, 11);
    assert_int_equal(p.num_m, 5);
    assert_int_equal(p.gemm_per_layer[find_op(&p, "layernorm")], 2);
    assert_int_equal(p.gemm_per_layer[find_op(&p, "embedding")], -1);
    assert_int_equal(p.gemm_per_layer[find_op(&p, "lm_head")], 0);
    assert_int_equal(p.gemm_num_m[find_op(&p, "lm_head")], 3);
    assert_int_equal(p.gemm_n[find_op(&p, "qkv")], (32 + 2 * 8) * 128);
    assert_int_equal(p.gemm_k[find_op(&p, "down")], 14336);
    assert_true(p.prompts_together);
    assert_int_equal(p.num_skew_pc, 0);
    assert_non_null(strstr(note, "no skew.csv"));
    /* saved and read back: the same table, as format version 3 (the prompts together) */
    tu_tmp("imported.profile.db", db, sizeof db);
    assert_int_equal(ar_profile_save(db, &p, "test", err, sizeof err), 0);
    assert_int_equal(tu_query_int(db, "SELECT value FROM meta WHERE key = 'version'"), 3);
    assert_int_equal(ar_profile_load(db, &q, err, sizeof err), 0);
    assert_int_equal(q.num_gemms, 11);
    assert_int_equal(q.gemm_num_m[find_op(&q, "sampler")], 3);
    assert_int_equal(q.num_mix_q * q.num_mix_ctx * q.num_mix_batch * q.num_mix_dctx, 16);
    for (int g = 0; g < q.num_gemms; g++)
        for (int i = 0; i < q.gemm_num_m[g]; i++) assert_true(q.gemm_us[g][i] == p.gemm_us[g][i]);
    /* the step time through profile:DB: every operation by its calls, attention by shape */
    ar_steptime st;
    char spec[700];
    /* 4 steps: decodes alone; a prefill alone; a mixed step with a second prompt; a request of no tokens */
    int q1[3] = {1, 1, 0}, c1[3] = {16, 32, 7};
    int q2[1] = {32}, c2[1] = {16};
    int q3[4] = {24, 1, 16, 1}, c3[4] = {8, 16, 0, 32};
    int q4[2] = {16, 16}, c4[2] = {0, 8};
    struct { int *q, *c, n; double attn, attn_alone; } cases[4] = {
        {q1, c1, 3, attn_us(0, 0, 2, 24), attn_us(0, 0, 2, 24)},
        {q2, c2, 1, attn_us(32, 16, 0, 0), attn_us(32, 16, 0, 0)},
        /* the prompts together with the decodes from the mixed grid (LLMServingSim's lookup); alone:
           the largest prompt with the decodes, the other prompt alone */
        {q3, c3, 4, attn_us(40, 8, 2, 24), attn_us(24, 8, 2, 24) + attn_us(16, 0, 0, 0)},
        /* prompts only: one lookup at the summed tokens and contexts, or each alone */
        {q4, c4, 2, attn_us(32, 8, 0, 0), attn_us(16, 0, 0, 0) + attn_us(16, 8, 0, 0)},
    };
    for (int alone = 0; alone < 2; alone++) {
    snprintf(spec, sizeof spec, "profile:%s,overhead=0,gap=0,graph=0,async=0%s", db, alone ? ",prompts_together=0" : "");
    if (ar_steptime_parse(spec, l8(), &st, err, sizeof err) != 0) fail_msg("%s", err);
    for (int k = 0; k < 4; k++) {
        ar_batch_features f = {.query_lens = cases[k].q, .context_lens = cases[k].c};
        for (int r = 0; r < cases[k].n; r++) f.num_tokens += cases[k].q[r];
        f.num_reqs = cases[k].n;
        double want_linear = 0;
        for (int l = 0; l < NUM_DENSE; l++) {
            int calls = l == 0 || l == 8 ? 0 : l == 1 ? 2 : 1;   /* embedding, final norm once; two norms */
            want_linear += (calls ? calls * 32.0 : 1.0) * dense_us(l, f.num_tokens);
        }
        want_linear += seq_us(0, f.num_reqs) + seq_us(1, f.num_reqs);
        double want = 1e-6 * (want_linear + 32.0 * (alone ? cases[k].attn_alone : cases[k].attn));
        double got = ar_steptime_eval(&st, &f);
        if (fabs(got / want - 1) > 1e-9) fail_msg("case %d (alone %d): step %.9f s, want %.9f s", k, alone, got, want);
    }
    }
    /* a profile without a skew table refuses skew=1 */
    snprintf(spec, sizeof spec, "profile:%s,skew=1", db);
    assert_int_equal(ar_steptime_parse(spec, l8(), &st, err, sizeof err), 2);
    assert_non_null(strstr(err, "no skew table"));
}

/* The skew correction: the axes and alpha_default derived from skew.csv, each bucket of
 * skew_fit.csv where a batch falls in it (alpha not clipped, negative too), alpha_default where
 * the table has no row (a pc it does not hold), none for equal contexts; through the database and
 * the step time, and off with skew=0. */
static void test_skew_correction(void **state)
{
    (void)state;
    char dir[512], tp1[600], db[512], err[1024], note[256];
    tu_tmp("bundle-skew", dir, sizeof dir);
    write_bundle(dir, NULL);
    write_skew(dir);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    static ar_profile_table p, q;
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "NVIDIA GeForce RTX 4090", &p, note, sizeof note, err,
                                                     sizeof err), 0);
    assert_non_null(strstr(note, "skew 3 buckets over 2 prompt-token values, alpha_default 0.2167 from 3 rows"));
    assert_true(p.skew_alpha_default == SKEW_ALPHA_DEFAULT);
    assert_int_equal(p.skew_bins[0], 3);
    assert_int_equal(p.skew_bins[1], 5);
    assert_int_equal(p.skew_bins[2], 2);
    assert_int_equal(p.skew_bins[3], 3);
    assert_true(p.skew_upper[0][1] == 4 && p.skew_upper[2][0] == 1024 && p.skew_upper[3][1] == 512);
    tu_tmp("skew.profile.db", db, sizeof db);
    assert_int_equal(ar_profile_save(db, &p, "test", err, sizeof err), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM attn_skew"), 3);
    assert_int_equal(ar_profile_load(db, &q, err, sizeof err), 0);
    assert_int_equal(q.num_skew_pc, 2);
    assert_true(q.skew_alpha_default == SKEW_ALPHA_DEFAULT && q.prompts_together);
    /* decode contexts 16, 32 (mean 24, rate 0.5): bucket pc 0, n <= 2, rate <= 70%: alpha 0.5;
       16, 16, 32 (mean 21.33, rate 0.33): n <= 4, rate <= 40%: alpha -0.25; with a 16-token prompt
       after 16: pc 16, prompt context <= 512: alpha 2; prompts of 8 + 16 tokens (pc 24, no row):
       alpha_default; equal contexts: none */
    int qa[2] = {1, 1}, ca[2] = {16, 32};
    int qb[3] = {1, 1, 1}, cb[3] = {16, 16, 32};
    int qc[3] = {16, 1, 1}, cc[3] = {16, 16, 32};
    int qd[4] = {8, 16, 1, 1}, cd[4] = {0, 8, 16, 32};
    int qe[2] = {1, 1}, ce[2] = {32, 32};
    double mb = 64.0 / 3;
    struct { int *q, *c, n; double plain, skewed; } cases[] = {
        {qa, ca, 2, attn_us(0, 0, 2, 24), attn_us(0, 0, 2, 24) + 0.5 * (attn_us(0, 0, 2, 32) - attn_us(0, 0, 2, 24))},
        {qb, cb, 3, attn_us(0, 0, 3, mb), attn_us(0, 0, 3, mb) - 0.25 * (attn_us(0, 0, 3, 32) - attn_us(0, 0, 3, mb))},
        {qc, cc, 3, attn_us(16, 16, 2, 24),
         attn_us(16, 16, 2, 24) + 2.0 * (attn_us(16, 16, 2, 32) - attn_us(16, 16, 2, 24))},
        {qd, cd, 4, attn_us(24, 8, 2, 24),
         attn_us(24, 8, 2, 24) + SKEW_ALPHA_DEFAULT * (attn_us(24, 8, 2, 32) - attn_us(24, 8, 2, 24))},
        {qe, ce, 2, attn_us(0, 0, 2, 32), attn_us(0, 0, 2, 32)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double got = ar_profile_attention_us(&q, cases[k].q, cases[k].c, cases[k].n);
        if (fabs(got / cases[k].skewed - 1) > 1e-12) fail_msg("case %zu: %.9f us, want %.9f", k, got, cases[k].skewed);
    }
    /* through the step time: on by default, off with skew=0 */
    ar_steptime on, off;
    char spec[700];
    snprintf(spec, sizeof spec, "profile:%s,overhead=0,gap=0,graph=0,async=0", db);
    assert_int_equal(ar_steptime_parse(spec, l8(), &on, err, sizeof err), 0);
    snprintf(spec, sizeof spec, "profile:%s,overhead=0,gap=0,graph=0,async=0,skew=0", db);
    assert_int_equal(ar_steptime_parse(spec, l8(), &off, err, sizeof err), 0);
    ar_batch_features f = {.query_lens = qa, .context_lens = ca, .num_reqs = 2, .num_tokens = 2};
    double d = ar_steptime_eval(&on, &f) - ar_steptime_eval(&off, &f);
    if (fabs(d / (1e-6 * 32 * (cases[0].skewed - cases[0].plain)) - 1) > 1e-6)
        fail_msg("skew on - off: %.9f s", d);
}

/* Rows of a second grid beside the first: the complete part is kept and the rest reported. */
static void test_merged_grids_keep_complete_part(void **state)
{
    (void)state;
    char dir[512], tp1[600], err[1024], note[256];
    tu_tmp("bundle-merged", dir, sizeof dir);
    /* a prefill chunk of 24 measured at one context only, and a decode context of 24 at one count */
    write_bundle(dir, "24,0,0,0,30\n0,0,1,24,40\n");
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    static ar_profile_table p;
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, note, sizeof note, err, sizeof err), 0);
    assert_int_equal(p.num_pre_q, 2);
    assert_true(p.pre_q[0] == 16 && p.pre_q[1] == 32);
    assert_int_equal(p.num_dec_ctx, 2);
    assert_true(p.dec_ctx[0] == 16 && p.dec_ctx[1] == 32);
    assert_non_null(strstr(note, "decode-only 2 x 2 (1 rows off the complete grid left out)"));
    assert_non_null(strstr(note, "prefill-only 2 x 2 (1 rows off"));
}

/* Puts a NUL byte into path one character after the first `after`. */
static void plant_nul(const char *path, const char *after)
{
    char *text = tu_slurp(path), *at = text ? strstr(text, after) : NULL;
    assert_non_null(at);
    size_t cut = (size_t)(at - text) + strlen(after) + 1, len = strlen(text);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, cut, f), cut);
    assert_int_equal(fputc(0, f), 0);
    assert_int_equal(fwrite(text + cut, 1, len - cut, f), len - cut);
    assert_int_equal(fclose(f), 0);
    free(text);
}

/* Each damage to a file of the bundle, and the "FILE:LINE: rule" it must be refused with. */
static void test_malformed_bundles(void **state)
{
    (void)state;
    static const struct { const char *file, *from, *to, *where, *rule; } cases[] = {
        {"dense.csv", "layer,tokens,time_us", "layer,tokens,us", "dense.csv:", "1: header must be"},
        {"dense.csv", "qkv_proj,2,", "qkv_proj,2,0\nx,", "dense.csv:", "positive time"},
        {"dense.csv", "o_proj,4,", "o_proj,4.5,", "dense.csv:", "non-negative whole number"},
        /* decimal text only (strtod took hexadecimal and a leading blank) and no more than 1e15 */
        {"dense.csv", "o_proj,4,", "o_proj,0x4,", "dense.csv:", "non-negative whole number"},
        {"dense.csv", "o_proj,4,", "o_proj, 4,", "dense.csv:", "non-negative whole number"},
        {"dense.csv", "qkv_proj,2,", "qkv_proj,2,1e308\nx,", "dense.csv:", "positive time"},
        {"dense.csv", "act_fn,1,", "qk_norm,1,", "dense.csv:", "unknown layer 'qk_norm'"},
        {"dense.csv", "act_fn,2,", "act_fn,1,", "dense.csv:", "repeats line"},
        {"dense.csv", "down_proj,8,", "down_proj,8,1,", "dense.csv:", "fields, the header has 3"},
        {"dense.csv", "o_proj,16,", "o_proj,32,", "dense.csv:", "other token counts"},
        {"per_sequence.csv", "lm_head,1,", "lm_head,3,", "per_sequence.csv:", "first of its token counts"},
        {"attention.csv", "0,0,1,16,", "0,0,0,0,", "attention.csv:", "empty batch"},
        {"attention.csv", "0,0,1,16,", "0,16,1,16,", "attention.csv:", "a context without its requests"},
        {"attention.csv", "0,0,1,32,", "0,0,1,16,", "attention.csv:", "the same shape as line"},
        {"attention.csv", "16,0,1,16,", "1,0,1,16,", "attention.csv:", "one token is a decode"},
        {"skew.csv", "regime,n,", "regime,n_decode,", "skew.csv:", "1: header must be"},
        {"skew.csv", "pure,4,1,", "pure,1,1,", "skew.csv:", "at least 2 decodes"},
        {"skew.csv", "mixed,2,1,", ",2,1,", "skew.csv:", "regime) is empty"},
        {"skew.csv", ",10,20,12,0.2", ",10,20,0,0.2", "skew.csv:", "a positive number"},
        {"skew.csv", ",10,20,12,0.2", ",10,20,12,0.2x", "skew.csv:", "must be a number"},
        {"skew.csv", ",10,20,12,0.2", ",10,20,12,0x1p-2", "skew.csv:", "must be a number"},
        {"skew.csv", "16,64,40,10,20,15", "16,64,40,10,20,15,1", "skew.csv:", "fields, the header has 14"},
        {"skew_fit.csv", "0,n<=4,", "0,n<=8,", "skew_fit.csv:", "none of the bins skew.csv's rows give (n<=2 ... n>4)"},
        {"skew_fit.csv", "kvB<=1k,kp<=512", "kvB<=1k,kp<=1k", "skew_fit.csv:", "none of the bins"},
        {"skew_fit.csv", "0,n<=4,sr<=40%", "0,n<=2,sr<=70%", "skew_fit.csv:", "the bucket of line 2 again"},
        {"skew_fit.csv", "-0.25,1", "-0.25,0", "skew_fit.csv:", "n_samples must be at least 1"},
        {"skew_fit.csv", "2.0,1", "nan?,1", "skew_fit.csv:", "must be a number"},
        {"skew_fit.csv", "16,n<=2", "16.5,n<=2", "skew_fit.csv:", "non-negative whole number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512], tp1[600], path[700], err[1024], name[32];
        snprintf(name, sizeof name, "bundle-bad%zu", i);
        tu_tmp(name, dir, sizeof dir);
        write_bundle(dir, NULL);
        write_skew(dir);
        snprintf(tp1, sizeof tp1, "%s/tp1", dir);
        snprintf(path, sizeof path, "%s/%s", tp1, cases[i].file);
        char *text = tu_slurp(path), *at = text ? strstr(text, cases[i].from) : NULL;
        assert_non_null(at);
        static char out[1 << 16];
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, cases[i].to, at + strlen(cases[i].from));
        free(text);
        assert_int_equal(tu_write(path, out), 0);
        static ar_profile_table p;
        err[0] = 0;
        assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 2);
        /* the file with a line number (FILE:N:), then the rule */
        const char *w = strstr(err, cases[i].where);
        if (!w || !isdigit((unsigned char)w[strlen(cases[i].where)]) || !strstr(err, cases[i].rule))
            fail_msg("case %zu: '%s' lacks '%sLINE:' or '%s'", i, err, cases[i].where, cases[i].rule);
    }
    /* a missing file, a missing layer */
    char dir[512], tp1[600], path[700], err[1024];
    tu_tmp("bundle-missing", dir, sizeof dir);
    write_bundle(dir, NULL);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    snprintf(path, sizeof path, "%s/per_sequence.csv", tp1);
    assert_int_equal(tu_write(path, "layer,sequences,time_us\nlm_head,1,5\n"), 0);
    static ar_profile_table p;
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 2);
    assert_non_null(strstr(err, "per_sequence.csv: lacks layer sampler"));
    remove(path);
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 2);
    assert_non_null(strstr(err, "per_sequence.csv: cannot open"));
    /* one skew file without the other */
    tu_tmp("bundle-skew-half", dir, sizeof dir);
    write_bundle(dir, NULL);
    write_skew(dir);
    snprintf(path, sizeof path, "%s/tp1/skew.csv", dir);
    remove(path);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 2);
    assert_non_null(strstr(err, "skew.csv: skew.csv and skew_fit.csv come together"));
    /* a NUL byte (a damaged or binary file) in a row of either reader: refused, not cut short */
    static const char *const nul_in[][2] = {{"dense.csv", "qkv_proj,2,"}, {"skew.csv", "pure,4,1,"}};
    for (size_t i = 0; i < 2; i++) {
        char name[32], want[64];
        snprintf(name, sizeof name, "bundle-nul%zu", i);
        tu_tmp(name, dir, sizeof dir);
        write_bundle(dir, NULL);
        write_skew(dir);
        snprintf(tp1, sizeof tp1, "%s/tp1", dir);
        snprintf(path, sizeof path, "%s/%s", tp1, nul_in[i][0]);
        plant_nul(path, nul_in[i][1]);
        assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 2);
        snprintf(want, sizeof want, "%s:", nul_in[i][0]);
        const char *w = strstr(err, want);
        if (!w || !isdigit((unsigned char)w[strlen(want)]) || !strstr(err, "a NUL byte"))
            fail_msg("%s: '%s' lacks '%sLINE:' or 'a NUL byte'", nul_in[i][0], err, want);
    }
}

static void damage(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
}

/* The loader's rules for what versions 2 and 3 add. */
static void test_loader_rules_for_version_2(void **state)
{
    (void)state;
    char dir[512], tp1[600], db[512], err[1024];
    tu_tmp("bundle-loader", dir, sizeof dir);
    write_bundle(dir, NULL);
    write_skew(dir);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    static ar_profile_table p, q;
    assert_int_equal(ar_profile_import_llmservingsim(tp1, l8(), 1, "x", &p, NULL, 0, err, sizeof err), 0);
    static const struct { const char *sql, *rule; int ok; } cases[] = {
        {"DELETE FROM gemm WHERE name = 'lm_head' AND m = 4;", NULL, 1},   /* a shorter first part: fine */
        {"DELETE FROM gemm WHERE name = 'lm_head' AND m = 1;", "or at a first part of it", 0},
        {"DELETE FROM gemm WHERE name = 'layernorm' AND m = 16;", "every token count", 0},
        {"UPDATE gemm SET per_layer = -2 WHERE name = 'act_fn';", "per_layer -2", 0},
        {"DELETE FROM attn_mixed WHERE q = 32 AND ctx = 16 AND batch = 2 AND dctx = 16;", "attn_mixed lacks", 0},
        {"UPDATE attn_mixed SET us = 0 WHERE q = 16 AND ctx = 0 AND batch = 1 AND dctx = 16;", "not positive", 0},
        {"UPDATE meta SET value = '4' WHERE key = 'version';", "version 1 to 3", 0},
        {"UPDATE meta SET value = 'sometimes' WHERE key = 'attn_prompts';", "attn_prompts must be", 0},
        {"UPDATE meta SET value = 'x' WHERE key = 'skew_alpha_default';", "skew_alpha_default a number", 0},
        {"UPDATE attn_skew SET n = 3 WHERE pc = 16;", "a bin off its axis", 0},
        {"DELETE FROM attn_skew;", "table attn_skew empty", 0},
        {"DELETE FROM attn_skew_axis WHERE axis = 1 AND bin >= 3;", "a bin off its axis", 0},
        {"UPDATE attn_skew_axis SET upper = 9 WHERE axis = 0 AND bin = 0;", "ascending bounds", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "v2-%zu.profile.db", i);
        tu_tmp(name, db, sizeof db);
        assert_int_equal(ar_profile_save(db, &p, "test", err, sizeof err), 0);
        damage(db, cases[i].sql);
        err[0] = 0;
        int rc = ar_profile_load(db, &q, err, sizeof err);
        if (cases[i].ok) {
            if (rc != 0) fail_msg("case %zu: %s", i, err);
            assert_int_equal(q.gemm_num_m[find_op(&q, "lm_head")], 2);
        } else if (rc != 2 || !strstr(err, cases[i].rule) || !strstr(err, db)) {
            fail_msg("case %zu: rc %d, '%s' lacks '%s' or the path", i, rc, err, cases[i].rule);
        }
    }
}

/* The command: the GPU of meta.yaml must be --device's card, and is recorded; a measurement's
 * options (--quick, --trace, --synthetic, ...) are refused, not ignored. */
static void test_command(void **state)
{
    (void)state;
    char dir[512], tp1[600], db[512];
    tu_tmp("bundle-cli", dir, sizeof dir);
    write_bundle(dir, NULL);
    snprintf(tp1, sizeof tp1, "%s/tp1", dir);
    tu_tmp("cli.profile.db", db, sizeof db);
    char *bad[] = {"profile", "--from-llmservingsim", tp1, "--device", "rtxpro6000", "--model", "llama-3.1-8b", "--db", db, NULL};
    assert_int_equal(ar_profile_main(9, bad), 2);
    /* options of a measurement would be ignored by an import: refused (before, exit 0 without them) */
    char *ignored[][3] = {{"--quick", NULL}, {"--trace", "x.trace.jsonl"}, {"--synthetic", "h200"},
                          {"--repeat", "5"}, {"--backend", "cpu"}, {"--trace-steps", "5"}};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        char *with[] = {"profile", "--from-llmservingsim", tp1, "--device", "rtx4090", "--model", "llama-3.1-8b",
                        "--db", db, ignored[i][0], ignored[i][1], NULL};
        assert_int_equal(ar_profile_main(ignored[i][1] ? 11 : 10, with), 2);
        assert_int_not_equal(access(db, F_OK), 0);
    }
    char *good[] = {"profile", "--from-llmservingsim", tp1, "--device", "rtx4090", "--model", "llama-3.1-8b", "--db", db, NULL};
    assert_int_equal(ar_profile_main(9, good), 0);
    char device[128];
    tu_query_text(db, "SELECT value FROM meta WHERE key = 'device'", device, sizeof device);
    assert_string_equal(device, "NVIDIA GeForce RTX 4090");
    ar_steptime st;
    char spec[600], err[1024];
    snprintf(spec, sizeof spec, "profile:%s", db);
    assert_int_equal(ar_steptime_parse(spec, l8(), &st, err, sizeof err), 0);
    assert_string_equal(st.device.name, "rtx4090");   /* the interconnect's preset, from the recorded GPU */
}

/* The shipped profiles: each loads, and a few of its numbers are the source rows'. */
static void test_shipped_profiles(void **state)
{
    (void)state;
    static const struct { const char *device; double lm_head_1, qkv_2048, dec_32_1024, alpha_default, alpha_first; } ship[] = {
        {"rtx4090", 1096.93, 631.1, 181.391, 0.0224, 0.0317},
        {"rtxpro6000", 714.006, 303.0, 119.286, 0.0543, 0.0328},
    };
    for (int i = 0; i < 2; i++) {
        char db[700], err[1024];
        snprintf(db, sizeof db, "%s/sim/profiles/llama-3.1-8b.%s.llmservingsim.profile.db", tu_src_dir(), ship[i].device);
        static ar_profile_table p;
        if (ar_profile_load(db, &p, err, sizeof err) != 0) fail_msg("%s", err);
        assert_true(ar_device_match(p.device) == ar_device_find(ship[i].device));
        assert_true(fabs(ar_profile_gemm_us(&p, find_op(&p, "lm_head"), 1) - ship[i].lm_head_1) < 1e-6);
        assert_true(fabs(ar_profile_gemm_us(&p, find_op(&p, "qkv"), 2048) / ship[i].qkv_2048 - 1) < 1e-3);
        int ql[32], cl[32];
        for (int r = 0; r < 32; r++) { ql[r] = 1; cl[r] = 1024; }
        assert_true(fabs(ar_profile_attention_us(&p, ql, cl, 32) - ship[i].dec_32_1024) < 1e-6);
        assert_true(p.num_mix_q > 0);
        /* LLMServingSim's lookup: the prompts together, 3982 buckets of skew_fit.csv over 9 prompt-token
           values; the first row (pc 0, n <= 128, rate <= 15%, largest <= 16k, prompt context 0) */
        assert_true(p.prompts_together);
        assert_int_equal(p.num_skew_pc, 9);
        assert_true(p.skew_alpha_default == ship[i].alpha_default);
        int nan_cells = 0;
        for (int c = 0; c < 9 * 9 * 5 * 4 * 7; c++) nan_cells += isnan(p.skew_alpha[c]);
        assert_int_equal(9 * 9 * 5 * 4 * 7 - nan_cells, 3982);
        assert_true(p.skew_alpha[(((0 * 9 + 6) * 5 + 1) * 4 + 2) * 7 + 0] == ship[i].alpha_first);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_import_save_load_and_step_time),
        cmocka_unit_test(test_skew_correction),
        cmocka_unit_test(test_merged_grids_keep_complete_part),
        cmocka_unit_test(test_malformed_bundles),
        cmocka_unit_test(test_loader_rules_for_version_2),
        cmocka_unit_test(test_command),
        cmocka_unit_test(test_shipped_profiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
