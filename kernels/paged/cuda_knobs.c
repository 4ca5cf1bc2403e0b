/* cuda_knobs.c - the "cuda" backend's environment switches and sweep knobs, read and checked
 * (cuda_knobs.h) through env_knobs.h: each switch takes its listed words, each knob an integer in
 * its range; anything else is refused with the variable, the value and what it takes. */
#include "cuda_knobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/env_knobs.h"
#include "attn_plan.h"

#define WHO "cuda backend"

/* A 0 / 1 switch into *on (left as it is when unset); 0, or -2 refused (err written). */
static int knob_flag(const char *name, bool *on, char *err, size_t err_len)
{
    const int w = ar_env_flag(WHO, name, err, err_len);
    if (w >= 0) *on = w == 1;
    return w == -2 ? -2 : 0;
}

/* A knob's integer in lo..hi into *out (left as it is when unset); 0, or -2 refused. */
static int knob_int(const char *name, long lo, long hi, int *out, char *err, size_t err_len)
{
    long v = 0;
    const int r = ar_env_int(WHO, name, lo, hi, &v, err, err_len);
    if (r == 1) *out = (int)v;
    return r < 0 ? -2 : 0;
}

/* A split ratio knob: off (-1) or an integer from 1 to 64 into *out (left as it is when unset);
 * 0, or -2 refused. */
static int knob_ratio(const char *name, int *out, char *err, size_t err_len)
{
    const char *value = getenv(name);
    if (value && strcmp(value, "off") == 0) {
        *out = -1;
        return 0;
    }
    if (knob_int(name, 1, 64, out, err, err_len) == 0) return 0;
    snprintf(err, err_len, WHO ": %s=%s: not off or an integer from 1 to 64 (unset: the default)", name, value);
    return -2;
}

/* The combine's team (attn_plan.h ar_attn_combine_team): rule, fill, or a power of two from 1
 * to AR_COMBINE_TEAM_MOST, into *out (left as it is when unset); 0, or -2 refused. */
static int knob_team(const char *name, int *out, char *err, size_t err_len)
{
    const char *value = getenv(name);
    if (value && strcmp(value, "rule") == 0) {
        *out = AR_COMBINE_TEAM_RULE;
        return 0;
    }
    if (value && strcmp(value, "fill") == 0) {
        *out = AR_COMBINE_TEAM_FILL;
        return 0;
    }
    int team = 0;
    if (knob_int(name, 1, AR_COMBINE_TEAM_MOST, &team, err, err_len) == 0 && (team & (team - 1)) == 0) {
        if (team > 0) *out = team;
        return 0;
    }
    snprintf(err, err_len, WHO ": %s=%s: not rule, fill or a power of two from 1 to %d (unset: rule)", name, value,
             AR_COMBINE_TEAM_MOST);
    return -2;
}

int ar_cuda_knobs_read(ar_cuda_knobs *k, int most_stages, char *err, size_t err_len)
{
    memset(k, 0, sizeof *k);
    k->wg_section_mb = -1;
    bool wgmma = true, wg_persist = true, cascade_fold = true, decode_tma_many = true;
    if (knob_flag("AR_CUDA_WGMMA", &wgmma, err, err_len) ||
        knob_flag("AR_CUDA_DECODE_TMA_MANY", &decode_tma_many, err, err_len) ||
        knob_flag("AR_CUDA_WG_PERSIST", &wg_persist, err, err_len) ||
        knob_flag("AR_CUDA_CASCADE_FOLD", &cascade_fold, err, err_len) ||
        knob_flag("AR_CUDA_SPLIT_LIVE_ROWS", &k->split_live_rows, err, err_len))
        return 2;
    k->wgmma_off = !wgmma;
    k->wg_persist_off = !wg_persist;
    k->cascade_fold_off = !cascade_fold;
    k->decode_tma_many_off = !decode_tma_many;

    static const char *const tma_words[] = {"0", "1", "rule", "split", "uneven"};
    switch (ar_env_word(WHO, "AR_CUDA_DECODE_TMA", tma_words, 5, "0, 1, rule, split, uneven", err, err_len)) {
    case -2: return 2;
    case 0: k->decode_tma_off = true; break;
    case 2: k->decode_tma_rule = true; break;
    case 3: k->decode_tma_split = true; break;
    case 4: k->decode_tma_uneven = true; break;
    default: break;
    }
    static const char *const merge_words[] = {"fused", "separate"};
    const int merge = ar_env_word(WHO, "AR_CUDA_CASCADE_MERGE", merge_words, 2, "fused, separate", err, err_len);
    if (merge == -2) return 2;
    k->cascade_merge_separate = merge == 1;

    if (knob_int("AR_CUDA_WG_SECTION_MB", 0, 4096, &k->wg_section_mb, err, err_len) ||
        knob_int("AR_CUDA_DECODE_TMA_SPLITS", 1, AR_MAX_SPLITS, &k->decode_tma_splits, err, err_len) ||
        knob_int("AR_CUDA_DECODE_TMA_PIECES", 1, AR_MAX_DECODE_TMA_PIECES, &k->decode_tma_pieces, err, err_len) ||
        knob_int("AR_CUDA_DECODE_TMA_STAGES", 1, most_stages, &k->decode_tma_stages, err, err_len) ||
        knob_int("AR_CUDA_DECODE_SPLITS", 1, AR_MAX_SPLITS, &k->decode_splits, err, err_len) ||
        knob_ratio("AR_CUDA_SPLIT_PATH_RATIO", &k->split_path_ratio, err, err_len) ||
        knob_ratio("AR_CUDA_SPLIT_PATH_LARGE", &k->split_path_large, err, err_len) ||
        knob_team("AR_CUDA_COMBINE_TEAM", &k->combine_team, err, err_len))
        return 2;
    return 0;
}
