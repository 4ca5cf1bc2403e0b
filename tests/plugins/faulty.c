/* faulty.c - a correct plugin that breaks in one given place, for the broken-kernel tests
 * (tests/test_watchdog.c): the example CPU plugin's kernel (replay/plugins/example_cpu.c, included
 * here unchanged), built once per defect by the Makefile (-DFAULTY_<kind>,
 * build/tests/plugins/faulty-<kind>.so).  Forward, from step ATTNREPLAY_FAULTY_STEP on (default 3):
 *   -DFAULTY_segv       writes through a wild pointer (SIGSEGV, address 0x10)
 *   -DFAULTY_hang       never returns
 *   -DFAULTY_error      returns an error, as a backend does that found a CUDA fault (the path a
 *                       faulted CUDA kernel takes: tests/gpu_faults.c)
 * Steps before it pass, so a run has committed steps when it breaks, and a --resume with the
 * variable set past the trace's end completes the run.  The plugin's other entry points, every
 * time they are called:
 *   -DFAULTY_initsegv   attnreplay_plugin_init writes through the wild pointer
 *   -DFAULTY_initabort  attnreplay_plugin_init calls abort() (a failed assert)
 *   -DFAULTY_inithang   attnreplay_plugin_init never returns
 *   -DFAULTY_checksegv  check() writes through the wild pointer
 *   -DFAULTY_checkhang  check() never returns
 *   -DFAULTY_closesegv  close() writes through the wild pointer (after a run that passes)
 *   -DFAULTY_closehang  close() never returns (after a run that passes) */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "../../replay/attnreplay_plugin.h"

/* the example plugin, its entry point renamed so that this file exports its own */
const attnreplay_plugin *example_cpu_plugin_init(const attnreplay_host_api *h, int host_abi_version);
#define attnreplay_plugin_init example_cpu_plugin_init
#include "../../replay/plugins/example_cpu.c"
#undef attnreplay_plugin_init

/* where it breaks (AT_*) and how (HOW_*) */
enum { AT_FORWARD, AT_INIT, AT_CHECK, AT_CLOSE };
enum { HOW_SEGV, HOW_HANG, HOW_ERROR, HOW_ABORT };

#if defined(FAULTY_segv)
#define KIND "segv"
#define AT AT_FORWARD
#define HOW HOW_SEGV
#elif defined(FAULTY_hang)
#define KIND "hang"
#define AT AT_FORWARD
#define HOW HOW_HANG
#elif defined(FAULTY_error)
#define KIND "error"
#define AT AT_FORWARD
#define HOW HOW_ERROR
#elif defined(FAULTY_initsegv)
#define KIND "initsegv"
#define AT AT_INIT
#define HOW HOW_SEGV
#elif defined(FAULTY_initabort)
#define KIND "initabort"
#define AT AT_INIT
#define HOW HOW_ABORT
#elif defined(FAULTY_inithang)
#define KIND "inithang"
#define AT AT_INIT
#define HOW HOW_HANG
#elif defined(FAULTY_checksegv)
#define KIND "checksegv"
#define AT AT_CHECK
#define HOW HOW_SEGV
#elif defined(FAULTY_checkhang)
#define KIND "checkhang"
#define AT AT_CHECK
#define HOW HOW_HANG
#elif defined(FAULTY_closesegv)
#define KIND "closesegv"
#define AT AT_CLOSE
#define HOW HOW_SEGV
#elif defined(FAULTY_closehang)
#define KIND "closehang"
#define AT AT_CLOSE
#define HOW HOW_HANG
#else
#error "build with -DFAULTY_<kind>"
#endif

static attnreplay_plugin faulty;
static const attnreplay_plugin *inner;
static const attnreplay_host_api *faulty_host;

/* The defect itself; HOW_ERROR returns (1 after set_error), the others do not. */
static int break_here(void)
{
    switch (HOW) {
    case HOW_SEGV: {
        volatile uintptr_t wild = 16;   /* volatile: the compiler cannot see the address */
        *(volatile int *)wild = 1;
        break;
    }
    case HOW_ABORT:
        abort();
    case HOW_ERROR:
        faulty_host->set_error("an illegal memory access was encountered (planted)");
        return 1;
    default:
        break;
    }
    for (;;) {
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
}

static int faulty_forward(void *st, const attnreplay_forward_args *a)
{
    const char *from = getenv("ATTNREPLAY_FAULTY_STEP");
    const long long step = from && *from ? atoll(from) : 3;
    if (AT == AT_FORWARD && a->md->step >= step) return break_here();
    return inner->forward(st, a);
}

static int faulty_check(const attnreplay_config *cfg)
{
    if (AT == AT_CHECK) return break_here();
    return inner->check(cfg);
}

static void faulty_close(void *st)
{
    if (AT == AT_CLOSE) break_here();
    inner->close(st);
}

ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h,
                                                                        int host_abi_version)
{
    faulty_host = h;
    if (AT == AT_INIT) break_here();
    inner = example_cpu_plugin_init(h, host_abi_version);
    if (!inner) return NULL;
    faulty = *inner;
    faulty.name = "faulty-" KIND;
    faulty.summary = "test plugin: the example CPU kernel, broken (" KIND ")";
    faulty.forward = faulty_forward;
    faulty.check = faulty_check;
    faulty.close = faulty_close;
    return &faulty;
}
