/* broken.c - deliberately broken plugins for tests/test_plugin.c and the Python package's tests.
 *
 * One source, built once per defect by the Makefile (-DBROKEN_<kind>, build/tests/plugins/):
 *   abi       reports plugin ABI version 99          -> refused at load, exit 2
 *   nosym     exports no attnreplay_plugin_init       -> refused at load, exit 2
 *   initnull  init returns NULL with a reason         -> refused at load, exit 2
 *   badflags  sets a capability flag the host lacks   -> refused at load, exit 2
 *   refuse    check() refuses every config             -> "cannot run this trace", exit 2
 *   openfail  open() refuses the config                -> exit 2
 *   forward   forward() fails from step 1 on           -> runtime failure, exit 3
 * Apart from its defect each is a CPU plugin whose forward writes zeros (it never passes). */
#include <math.h>
#include <string.h>

#include "../../replay/attnreplay_plugin.h"

#if defined(BROKEN_abi)
#define KIND "abi"
#elif defined(BROKEN_nosym)
#define KIND "nosym"
#elif defined(BROKEN_initnull)
#define KIND "initnull"
#elif defined(BROKEN_badflags)
#define KIND "badflags"
#elif defined(BROKEN_refuse)
#define KIND "refuse"
#elif defined(BROKEN_openfail)
#define KIND "openfail"
#elif defined(BROKEN_forward)
#define KIND "forward"
#else
#error "build with -DBROKEN_<kind>"
#endif

static const attnreplay_host_api *host;
static int dummy_state __attribute__((unused));

static int b_check(const attnreplay_config *cfg)
{
    (void)cfg;
#ifdef BROKEN_refuse
    host->set_error("broken-refuse does not run any config (head size, dtype: all refused)");
    return 1;
#else
    return 0;
#endif
}

static int b_open(const attnreplay_config *cfg, void **state)
{
    (void)cfg;
#ifdef BROKEN_openfail
    (void)state;
    host->set_error("broken-openfail cannot allocate its workspace for this config");
    return 1;
#else
    *state = &dummy_state;
    return 0;
#endif
}

static int b_plan(void *state, const attnreplay_metadata *md)
{
    (void)state;
    (void)md;
    return 0;
}

static int b_forward(void *state, const attnreplay_forward_args *a)
{
    (void)state;
#ifdef BROKEN_forward
    if (a->md->step >= 1) {
        host->set_error("broken-forward: kernel launch failed (planted)");
        return 1;
    }
#endif
    size_t n = 1, nl = 1;
    for (int i = 0; i < a->out.ndim; i++) n *= (size_t)a->out.shape[i];
    for (int i = 0; i < a->lse.ndim; i++) nl *= (size_t)a->lse.shape[i];
    memset(a->out.data, 0, n * (size_t)(a->out.dtype.bits / 8));
    for (size_t i = 0; i < nl; i++) ((float *)a->lse.data)[i] = 0.0f;
    return 0;
}

static void b_close(void *state) { (void)state; }

__attribute__((unused)) static const attnreplay_plugin broken = {
#ifdef BROKEN_abi
    .abi_version = 99,
#else
    .abi_version = ATTNREPLAY_PLUGIN_ABI_VERSION,
#endif
    .struct_size = sizeof(attnreplay_plugin),
    .name = "broken-" KIND,
    .summary = "a deliberately broken plugin (tests)",
    .capabilities = "none",
    .device_type = kDLCPU,
#ifdef BROKEN_badflags
    .flags = 0x80u,
#else
    .flags = 0,
#endif
    .check = b_check,
    .open = b_open,
    .plan = b_plan,
    .forward = b_forward,
    .close = b_close,
};

#ifdef BROKEN_nosym
ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init_misspelt(const attnreplay_host_api *h,
                                                                                 int v);
ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init_misspelt(const attnreplay_host_api *h,
                                                                                 int v)
#else
ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h, int v)
#endif
{
    (void)v;
    host = h;
#ifdef BROKEN_initnull
    h->set_error("broken-initnull needs a GPU driver that is not here (planted)");
    return NULL;
#else
    return &broken;
#endif
}
