/* plugin.h - the host side of the plugin ABI (attnreplay_plugin.h): loading a plugin, and the
 * adapter that makes it an ar_backend like the built-in ones.
 *
 * `--backend plugin:PATH.so` loads PATH with dlopen and registers the backend
 * "plugin:<its name>"; the Python package (replay/python) registers its Python classes the same
 * way, through ar_plugin_register_init with an init function of its own, as "py:<name>".  A
 * registered plugin stays for the life of the process (never dlclosed).  These functions and
 * the DLPack helpers below are the C API libattnreplay.so offers to the Python package. */
#ifndef AR_PLUGIN_H
#define AR_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include "attnreplay_plugin.h"
#include "backend.h"

#define AR_PLUGIN_PREFIX "plugin:"
#define AR_PLUGIN_SLOTS 16           /* plugins one process can register */

/* Loads the plugin at path (a file path; "x.so" means "./x.so") and registers it.  Returns its
 * backend, or NULL with err saying what is wrong: the file cannot be loaded, it lacks the
 * attnreplay_plugin_init symbol, init refused, its ABI version differs from this host's, or its
 * descriptor is incomplete.  Loading the same path again returns the same backend. */
const ar_backend *ar_plugin_load(const char *path, char *err, size_t err_len);

/* Runs init and registers what it returns under prefix + its name ("plugin:", "py:").  source
 * names where it came from in messages (a path, "python module:Class").  NULL with err set when
 * the plugin is refused (the same rules as ar_plugin_load). */
const ar_backend *ar_plugin_register_init(attnreplay_plugin_init_fn init, const char *prefix,
                                          const char *source, char *err, size_t err_len);

/* False when b is a registered plugin without ATTNREPLAY_PLUGIN_CASCADE; true otherwise. */
bool ar_plugin_runs_cascade(const ar_backend *b);

/* Sizes of the ABI structs as this host was compiled, for bindings that mirror them (the Python
 * package checks its ctypes layouts against these).  which: 0 DLTensor, 1 host_api, 2 config,
 * 3 metadata, 4 forward_args, 5 plugin; -1 for another value. */
long ar_plugin_abi_sizeof(int which);
/* Offset of a field, for the same check: which as above, field a member name; -1 if unknown. */
long ar_plugin_abi_offsetof(int which, const char *field);
int ar_plugin_abi_version(void);

/* DLPack managed tensors for Python's __dlpack__ (the memory stays the host's; the deleter only
 * frees the wrapper).  Returns a malloc'd DLManagedTensor (versioned = 0) or
 * DLManagedTensorVersioned (versioned = 1, DLPack 1.1) describing t, with shape and strides
 * copied; NULL when out of memory. */
void *ar_dlpack_wrap(const DLTensor *t, int versioned);

#endif
