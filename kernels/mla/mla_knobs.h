/* mla_knobs.h - the cuda-mla backend's decode switches, read and checked in plain C when the
 * backend opens (env_knobs.h's rule: a value a switch does not take fails the open with exit 2):
 * AR_MLA_KERNEL forces a decode kernel, AR_MLA_TMA=0 makes no tensor map of the latent cache,
 * AR_MLA_SPLITS=N cuts every 64-row tile's keys into at most N pieces (cuda_mla.cu's opening
 * comment and README.md say what each does).  tests/test_env_knobs.c checks them. */
#ifndef AR_MLA_KNOBS_H
#define AR_MLA_KNOBS_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_mla_knobs {
    ar_cuda_mla_kernel kernel;   /* AR_MLA_KERNEL=simt|tc-split-qk|tc-wgmma|tc-narrow|tc-narrow-bulk, AUTO unset */
    bool no_tensor_map;          /* AR_MLA_TMA=0 (1: the default) */
    int splits;                  /* AR_MLA_SPLITS=1..1024, 0 unset */
} ar_mla_knobs;

/* Reads the switches into k: 0, or 2 with "cuda-mla backend: VAR=VALUE: not ..." in err. */
int ar_mla_knobs_read(ar_mla_knobs *k, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
