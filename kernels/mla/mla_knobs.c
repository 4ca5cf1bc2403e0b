/* mla_knobs.c - the cuda-mla backend's decode switches, read and checked (mla_knobs.h). */
#include "mla_knobs.h"

#include <string.h>

#include "../common/env_knobs.h"

#define WHO "cuda-mla backend"

int ar_mla_knobs_read(ar_mla_knobs *k, char *err, size_t err_len)
{
    memset(k, 0, sizeof *k);
    k->kernel = AR_MLA_KERNEL_AUTO;
    static const char *const names[] = {"simt", "tc-split-qk", "tc-wgmma", "tc-narrow", "tc-narrow-bulk"};
    static const ar_cuda_mla_kernel kernels[] = {AR_MLA_KERNEL_SIMT, AR_MLA_KERNEL_TC_SPLIT_QK, AR_MLA_KERNEL_TC_WGMMA,
                                                 AR_MLA_KERNEL_TC_NARROW, AR_MLA_KERNEL_TC_NARROW_BULK};
    const int kernel = ar_env_word(WHO, "AR_MLA_KERNEL", names, 5,
                                   "simt, tc-split-qk, tc-wgmma, tc-narrow, tc-narrow-bulk", err, err_len);
    if (kernel == -2) return 2;
    if (kernel >= 0) k->kernel = kernels[kernel];
    const int tma = ar_env_flag(WHO, "AR_MLA_TMA", err, err_len);
    if (tma == -2) return 2;
    k->no_tensor_map = tma == 0;
    long splits = 0;
    if (ar_env_int(WHO, "AR_MLA_SPLITS", 1, 1024, &splits, err, err_len) < 0) return 2;
    k->splits = (int)splits;
    return 0;
}
