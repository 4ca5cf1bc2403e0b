/* registry.h - choosing a backend: the selector and the record of why each one was passed over. */
#ifndef AR_REGISTRY_H
#define AR_REGISTRY_H

#include "backend.h"

#define AR_MAX_BACKENDS 8

typedef struct ar_selection_entry {
    const ar_backend *backend;
    bool ok;                  /* check() passed */
    bool chosen;
    char why[512];            /* check()'s reason, or "supported" */
} ar_selection_entry;

typedef struct ar_selection {
    int count;
    ar_selection_entry entries[AR_MAX_BACKENDS];
    ar_selection_entry *failed;   /* set when a forced backend's check failed */
} ar_selection;

/* name NULL or "auto": the first backend (priority order) whose check passes; otherwise that
 * backend or NULL with sel->failed set.  sel lists every backend's verdict either way. */
const ar_backend *ar_backend_select(const ar_run_config *cfg, const char *name, ar_selection *sel);

#endif
