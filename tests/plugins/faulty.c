/* faulty.c - a correct plugin that breaks from a given step on, for the broken-kernel tests
 * (tests/test_watchdog.c): the example CPU plugin's kernel (replay/plugins/example_cpu.c, included
 * here unchanged), whose forward, from step ATTNREPLAY_FAULTY_STEP on (default 3):
 *   -DFAULTY_segv  writes through a wild pointer (SIGSEGV, address 0x10)
 *   -DFAULTY_hang  never returns
 *   -DFAULTY_error returns an error, as a backend does that found a CUDA fault (the path a
 *                  faulted CUDA kernel takes: tests/gpu_faults.c)
 * Steps before it pass, so a run has committed steps when it breaks, and a --resume with the
 * variable set past the trace's end completes the run. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "../../replay/attnreplay_plugin.h"

/* the example plugin, its entry point renamed so that this file exports its own */
const attnreplay_plugin *example_cpu_plugin_init(const attnreplay_host_api *h, int host_abi_version);
#define attnreplay_plugin_init example_cpu_plugin_init
#include "../../replay/plugins/example_cpu.c"
#undef attnreplay_plugin_init

#if defined(FAULTY_segv)
#define KIND "segv"
#elif defined(FAULTY_hang)
#define KIND "hang"
#elif defined(FAULTY_error)
#define KIND "error"
#else
#error "build with -DFAULTY_<kind>"
#endif

static attnreplay_plugin faulty;
static const attnreplay_plugin *inner;
static const attnreplay_host_api *faulty_host;

static int faulty_forward(void *st, const attnreplay_forward_args *a)
{
    const char *from = getenv("ATTNREPLAY_FAULTY_STEP");
    const long long step = from && *from ? atoll(from) : 3;
    if (a->md->step >= step) {
#if defined(FAULTY_segv)
        volatile uintptr_t wild = 16;   /* volatile: the compiler cannot see the address */
        *(volatile int *)wild = 1;
#elif defined(FAULTY_error)
        faulty_host->set_error("an illegal memory access was encountered (planted)");
        return 1;
#else
        for (;;) {
            struct timespec second = {1, 0};
            nanosleep(&second, NULL);
        }
#endif
    }
    return inner->forward(st, a);
}

ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h,
                                                                        int host_abi_version)
{
    faulty_host = h;
    inner = example_cpu_plugin_init(h, host_abi_version);
    if (!inner) return NULL;
    faulty = *inner;
    faulty.name = "faulty-" KIND;
    faulty.summary = "test plugin: the example CPU kernel, broken (" KIND ") from step ATTNREPLAY_FAULTY_STEP on";
    faulty.forward = faulty_forward;
    return &faulty;
}
