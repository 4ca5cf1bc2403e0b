/* env_knobs.h - a backend's environment switches read and checked: a switch takes one of its
 * listed words, a knob an integer in its range, unset or empty is the default, and anything else
 * is refused with "WHO: VAR=VALUE: not ..." so that the backend's open fails with exit 2 instead
 * of running its default under a misspelt name.  Used by the cuda backend (kernels/paged/
 * cuda_knobs.c) and the cuda-mla backend (kernels/mla/mla_knobs.c); plain C. */
#ifndef AR_ENV_KNOBS_H
#define AR_ENV_KNOBS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which of words [n] the variable holds: -1 unset or empty, -2 none of them (err: "WHO:
 * NAME=VALUE: not one of TAKES (unset: the default)"). */
int ar_env_word(const char *who, const char *name, const char *const *words, int n, const char *takes, char *err,
                size_t err_len);

/* A 0 / 1 switch: -1 unset or empty, 0 or 1, -2 anything else (err as ar_env_word's). */
int ar_env_flag(const char *who, const char *name, char *err, size_t err_len);

/* The variable's integer in lo..hi: 0 unset or empty, 1 with *out set, -2 anything else (err:
 * "WHO: NAME=VALUE: not an integer from LO to HI (unset: the default)"). */
int ar_env_int(const char *who, const char *name, long lo, long hi, long *out, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
