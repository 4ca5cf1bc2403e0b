/* registry.c - the backend table in selector priority order, fault names, and the selector.
 *
 * The order is DESIGN section 6's priority list: CUDA paged, CUDA MLA, CPU MLA, CPU.  The selector takes
 * the first backend whose check() passes and records, for every backend passed over, why. */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "../kernels/cpu/cpu_backend.h"
#include "../kernels/cuda_backend.h"
#include "../kernels/cuda_mla.h"

static const ar_backend *const backends[] = {
    &ar_cuda_backend,
    &ar_cuda_mla_backend,
    &ar_cpu_mla_backend,
    &ar_cpu_backend,
};

int ar_backend_count(void) { return (int)(sizeof backends / sizeof backends[0]); }

const ar_backend *ar_backend_at(int i)
{
    return (i >= 0 && i < ar_backend_count()) ? backends[i] : NULL;
}

const ar_backend *ar_backend_find(const char *name)
{
    for (int i = 0; i < ar_backend_count(); i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
}

static const char *const fault_names[AR_FAULT_COUNT] = {
    [AR_FAULT_NONE] = "none",
    [AR_FAULT_CAUSAL_OFF_BY_ONE] = "causal-off-by-one",
    [AR_FAULT_WRONG_SLOT] = "wrong-slot",
    [AR_FAULT_STALE_BLOCK_TABLE] = "stale-block-table",
    [AR_FAULT_WRONG_KV_HEAD] = "wrong-kv-head",
    [AR_FAULT_NO_RESCALE] = "no-rescale",
    [AR_FAULT_LSE_BASE2] = "lse-base2",
    [AR_FAULT_MERGE_NO_WEIGHTS] = "merge-no-weights",
    [AR_FAULT_MLA_NO_WUV] = "mla-no-wuv",
};

const char *ar_fault_name(ar_fault f)
{
    return (f >= 0 && f < AR_FAULT_COUNT) ? fault_names[f] : "?";
}

int ar_fault_parse(const char *name, ar_fault *out)
{
    for (int i = 0; i < AR_FAULT_COUNT; i++) {
        if (strcmp(name, fault_names[i]) == 0) {
            *out = (ar_fault)i;
            return 0;
        }
    }
    return -1;
}

const ar_backend *ar_backend_select(const ar_run_config *cfg, const char *name,
                                    ar_selection *sel)
{
    memset(sel, 0, sizeof *sel);
    for (int i = 0; i < ar_backend_count(); i++) {
        const ar_backend *b = backends[i];
        ar_selection_entry *e = &sel->entries[sel->count++];
        e->backend = b;
        e->ok = b->check(cfg, e->why, sizeof e->why);
        if (e->ok && !e->why[0]) snprintf(e->why, sizeof e->why, "supported");
    }
    const ar_backend *chosen = NULL;
    for (int i = 0; i < sel->count; i++) {
        ar_selection_entry *e = &sel->entries[i];
        bool wanted = !name || strcmp(name, "auto") == 0 || strcmp(name, e->backend->name) == 0;
        if (!wanted) continue;
        if (!e->ok) {
            if (name && strcmp(name, "auto") != 0) {
                sel->failed = e;
                return NULL;
            }
            continue;
        }
        if (!chosen) {
            chosen = e->backend;
            e->chosen = true;
        }
    }
    return chosen;
}
