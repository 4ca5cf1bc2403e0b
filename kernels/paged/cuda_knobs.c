/* cuda_knobs.c - the "cuda" backend's environment switches and sweep knobs, read and checked
 * (cuda_knobs.h).  Each switch takes its listed words, each knob an integer in its range; anything
 * else is refused with the variable, the value and what it takes. */
#include "cuda_knobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_plan.h"

/* The variable's value, NULL when unset or empty (the default). */
static const char *knob_value(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Which of words [n] the variable holds: -1 unset, -2 none of them (err written). */
static int knob_word(const char *name, const char *const *words, int n, const char *takes, char *err,
                     size_t err_len)
{
    const char *v = knob_value(name);
    if (!v) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, words[i]) == 0) return i;
    snprintf(err, err_len, "cuda backend: %s=%s: not one of %s (unset: the default)", name, v, takes);
    return -2;
}

/* The variable's integer in lo..hi: 0 unset, or 1 with *out set; -2 not such a number (err
 * written). */
static int knob_int(const char *name, long lo, long hi, long *out, char *err, size_t err_len)
{
    const char *v = knob_value(name);
    if (!v) return 0;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > hi) {
        snprintf(err, err_len, "cuda backend: %s=%s: not an integer from %ld to %ld (unset: the default)", name, v,
                 lo, hi);
        return -2;
    }
    *out = x;
    return 1;
}

/* A switch of 0 / 1 whose default is on: *off true for 0; 0, or -2 refused (err written). */
static int knob_off(const char *name, bool *off, char *err, size_t err_len)
{
    static const char *const words[] = {"0", "1"};
    const int w = knob_word(name, words, 2, "0, 1", err, err_len);
    if (w == -2) return -2;
    *off = w == 0;
    return 0;
}

int ar_cuda_knobs_read(ar_cuda_knobs *k, int most_stages, char *err, size_t err_len)
{
    memset(k, 0, sizeof *k);
    k->wg_section_mb = -1;
    if (knob_off("AR_CUDA_WGMMA", &k->wgmma_off, err, err_len) ||
        knob_off("AR_CUDA_WG_PERSIST", &k->wg_persist_off, err, err_len) ||
        knob_off("AR_CUDA_CASCADE_FOLD", &k->cascade_fold_off, err, err_len))
        return 2;
    static const char *const binary[] = {"0", "1"};
    const int live_rows = knob_word("AR_CUDA_SPLIT_LIVE_ROWS", binary, 2, "0, 1", err, err_len);
    if (live_rows == -2) return 2;
    k->split_live_rows = live_rows == 1;

    static const char *const tma_words[] = {"0", "1", "rule", "split", "uneven"};
    switch (knob_word("AR_CUDA_DECODE_TMA", tma_words, 5, "0, 1, rule, split, uneven", err, err_len)) {
    case -2: return 2;
    case 0: k->decode_tma_off = true; break;
    case 2: k->decode_tma_rule = true; break;
    case 3: k->decode_tma_split = true; break;
    case 4: k->decode_tma_uneven = true; break;
    default: break;
    }
    static const char *const merge_words[] = {"fused", "separate"};
    const int merge = knob_word("AR_CUDA_CASCADE_MERGE", merge_words, 2, "fused, separate", err, err_len);
    if (merge == -2) return 2;
    k->cascade_merge_separate = merge == 1;

    long v = 0;
    int r;
    if ((r = knob_int("AR_CUDA_WG_SECTION_MB", 0, 4096, &v, err, err_len)) < 0) return 2;
    if (r) k->wg_section_mb = (int)v;
    if ((r = knob_int("AR_CUDA_DECODE_TMA_SPLITS", 1, AR_MAX_SPLITS, &v, err, err_len)) < 0) return 2;
    if (r) k->decode_tma_splits = (int)v;
    if ((r = knob_int("AR_CUDA_DECODE_TMA_STAGES", 1, most_stages, &v, err, err_len)) < 0) return 2;
    if (r) k->decode_tma_stages = (int)v;
    if ((r = knob_int("AR_CUDA_DECODE_SPLITS", 1, AR_MAX_SPLITS, &v, err, err_len)) < 0) return 2;
    if (r) k->decode_splits = (int)v;
    const char *ratio = knob_value("AR_CUDA_SPLIT_PATH_RATIO");
    if (ratio && strcmp(ratio, "off") == 0) {
        k->split_path_ratio = -1;
    } else if ((r = knob_int("AR_CUDA_SPLIT_PATH_RATIO", 1, 64, &v, err, err_len)) < 0) {
        snprintf(err, err_len, "cuda backend: AR_CUDA_SPLIT_PATH_RATIO=%s: not off or an integer from 1 to 64 "
                 "(unset: the default)", ratio);
        return 2;
    } else if (r) {
        k->split_path_ratio = (int)v;
    }
    return 0;
}
