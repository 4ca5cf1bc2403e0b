/* env_knobs.c - environment switches read and checked (env_knobs.h). */
#include "env_knobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ar_env_word(const char *who, const char *name, const char *const *words, int n, const char *takes, char *err,
                size_t err_len)
{
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, words[i]) == 0) return i;
    snprintf(err, err_len, "%s: %s=%s: not one of %s (unset: the default)", who, name, v, takes);
    return -2;
}

int ar_env_flag(const char *who, const char *name, char *err, size_t err_len)
{
    static const char *const binary[] = {"0", "1"};
    return ar_env_word(who, name, binary, 2, "0, 1", err, err_len);
}

int ar_env_int(const char *who, const char *name, long lo, long hi, long *out, char *err, size_t err_len)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > hi) {
        snprintf(err, err_len, "%s: %s=%s: not an integer from %ld to %ld (unset: the default)", who, name, v, lo, hi);
        return -2;
    }
    *out = x;
    return 1;
}
