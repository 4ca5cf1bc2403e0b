/* registry.c - the backend table in selector priority order, fault names, and the selector.
 *
 * The order is DESIGN section 6's priority list: CUDA paged, CUDA MLA, CPU MLA, CPU.  The selector takes
 * the first backend whose check() passes and records, for every backend passed over, why.
 * Backends made at run time (plugins: `--backend plugin:PATH.so` loads one here; the Python package
 * registers its own) are found by name only, never by "auto". */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "../kernels/cpu/cpu_backend.h"
#include "../kernels/paged/cuda_backend.h"
#include "../kernels/mla/cuda_mla.h"
#include "plugin.h"

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

#define AR_MAX_RUNTIME_BACKENDS 32
static const ar_backend *runtime_backends[AR_MAX_RUNTIME_BACKENDS];
static int runtime_count;

int ar_backend_register(const ar_backend *b)
{
    for (int i = 0; i < runtime_count; i++)
        if (runtime_backends[i] == b) return 0;
    if (runtime_count >= AR_MAX_RUNTIME_BACKENDS) return -1;
    runtime_backends[runtime_count++] = b;
    return 0;
}

bool ar_backend_runs_cascade(const ar_backend *b)
{
    return ar_plugin_runs_cascade(b);
}

const ar_backend *ar_backend_find(const char *name)
{
    for (int i = 0; i < ar_backend_count(); i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    for (int i = 0; i < runtime_count; i++)
        if (strcmp(runtime_backends[i]->name, name) == 0) return runtime_backends[i];
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

/* A plugin that could not be loaded: the selection's failed entry names it and says why. */
static char failed_plugin_name[256];
static const ar_backend failed_plugin = {.name = failed_plugin_name};

/* --backend plugin:PATH.so or a registered run-time backend: the selection holds it alone. */
static const ar_backend *select_runtime(const ar_run_config *cfg, const char *name, ar_selection *sel)
{
    ar_selection_entry *e = &sel->entries[sel->count++];
    const ar_backend *b = ar_backend_find(name);
    if (!b && strncmp(name, AR_PLUGIN_PREFIX, strlen(AR_PLUGIN_PREFIX)) == 0) {
        char err[sizeof e->why];
        b = ar_plugin_load(name + strlen(AR_PLUGIN_PREFIX), err, sizeof err);
        if (!b) {
            snprintf(failed_plugin_name, sizeof failed_plugin_name, "%s", name);
            e->backend = &failed_plugin;
            snprintf(e->why, sizeof e->why, "%s", err);
            sel->failed = e;
            return NULL;
        }
    }
    e->backend = b;
    e->ok = b->check(cfg, e->why, sizeof e->why);
    if (!e->ok) {
        sel->failed = e;
        return NULL;
    }
    if (!e->why[0]) snprintf(e->why, sizeof e->why, "supported");
    e->chosen = true;
    return b;
}

const ar_backend *ar_backend_select(const ar_run_config *cfg, const char *name,
                                    ar_selection *sel)
{
    memset(sel, 0, sizeof *sel);
    if (name && strcmp(name, "auto") != 0) {
        bool builtin = false;
        for (int i = 0; i < ar_backend_count(); i++) builtin |= strcmp(backends[i]->name, name) == 0;
        if (!builtin && (ar_backend_find(name) || strncmp(name, AR_PLUGIN_PREFIX, strlen(AR_PLUGIN_PREFIX)) == 0))
            return select_runtime(cfg, name, sel);
    }
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
