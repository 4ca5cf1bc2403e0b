/* cuda_knobs.h - the "cuda" backend's environment switches and sweep knobs (cuda_backend.cu's
 * opening comment says what each does), read and checked in plain C when the backend opens.
 * A value that is not one of a switch's words or a knob's integers is refused: the backend's open
 * fails with exit 2 naming the variable, its value and what it takes, so that a misspelt knob
 * (AR_CUDA_DECODE_TMA=unevn) never measures the default plan under another name.  Unset or empty
 * is the default (kernels/common/env_knobs.h).  tests/test_env_knobs.c checks every knob
 * without a GPU. */
#ifndef AR_CUDA_KNOBS_H
#define AR_CUDA_KNOBS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_cuda_knobs {
    bool wgmma_off;            /* AR_CUDA_WGMMA=0: the mma.sync kernels everywhere (1: the default) */
    bool wg_persist_off;       /* AR_CUDA_WG_PERSIST=0: one wgmma prefill CTA per work item */
    int wg_section_mb;         /* AR_CUDA_WG_SECTION_MB=0..4096 MiB, -1 unset (AR_ITEM_ORDER_SECTION_MB) */
    bool decode_tma_off;       /* AR_CUDA_DECODE_TMA=0 */
    bool decode_tma_rule;      /* AR_CUDA_DECODE_TMA=rule: no small-batch rule */
    bool decode_tma_many_off;  /* AR_CUDA_DECODE_TMA_MANY=0: no many-request uneven rule */
    bool decode_tma_split;     /* AR_CUDA_DECODE_TMA=split */
    bool decode_tma_uneven;    /* AR_CUDA_DECODE_TMA=uneven */
    int decode_tma_splits;     /* AR_CUDA_DECODE_TMA_SPLITS=1..AR_MAX_SPLITS, 0 unset */
    int decode_tma_pieces;     /* AR_CUDA_DECODE_TMA_PIECES=1..AR_MAX_DECODE_TMA_PIECES, 0 unset */
    int decode_tma_stages;     /* AR_CUDA_DECODE_TMA_STAGES=1..most_stages, 0 unset */
    int decode_splits;         /* AR_CUDA_DECODE_SPLITS=1..AR_MAX_SPLITS, 0 unset */
    int split_path_ratio;      /* AR_CUDA_SPLIT_PATH_RATIO=1..64, 0 unset, -1 off */
    int split_path_large;      /* AR_CUDA_SPLIT_PATH_LARGE=1..64, 0 unset, -1 off */
    bool split_live_rows;      /* AR_CUDA_SPLIT_LIVE_ROWS=1 (0: the default) */
    int combine_team;          /* AR_CUDA_COMBINE_TEAM=1, 2, 4 .. 32; rule or unset: AR_COMBINE_TEAM_RULE (0); fill: AR_COMBINE_TEAM_FILL */
    bool cascade_fold_off;     /* AR_CUDA_CASCADE_FOLD=0 (1: the default) */
    bool cascade_merge_separate; /* AR_CUDA_CASCADE_MERGE=separate (fused: the default) */
} ar_cuda_knobs;

/* Reads the knobs from the environment into k.  most_stages: DECODE_TMA's deepest ring.  0, or
 * 2 with "cuda backend: VAR=VALUE: ..." in err (k then holds the defaults for what was read). */
int ar_cuda_knobs_read(ar_cuda_knobs *k, int most_stages, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
