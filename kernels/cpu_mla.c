/* cpu_mla.c - the "cpu-mla" backend: DeepSeek MLA on the host (placeholder).
 *
 * Until the absorbed-decode / chunked-prefill implementation lands, check() declines every
 * configuration with a reason, so the selector passes over it and the registry links. */
#include "cpu_backend.h"

#include <stdio.h>

static bool cpu_mla_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    snprintf(why, why_len, "cpu-mla is not implemented yet");
    return false;
}

static int cpu_mla_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    *state = NULL;
    cpu_mla_check(cfg, err, err_len);
    return 2;
}

const ar_backend ar_cpu_mla_backend = {
    .name = "cpu-mla",
    .summary = "host MLA (absorbed decode, chunked prefill) - not implemented yet",
    .capabilities = "MLA models only",
    .needs_gpu = false,
    .check = cpu_mla_check,
    .open = cpu_mla_open,
};
