/* faulty_cuda.cu - the CUDA side of the broken-kernel tests (tests/gpu_faults.c): the example CUDA
 * plugin (replay/plugins/example_cuda.cu, included here unchanged), whose forward, from step
 * ATTNREPLAY_FAULTY_STEP on (default 3), first launches a broken kernel on the replay's stream:
 *   -DFAULTY_oob   a kernel that writes 1 TiB past the output tensor (an illegal address: the
 *                  CUDA context is lost, every later call fails)
 *   -DFAULTY_hang  a kernel that waits for a flag nothing sets (never finishes)
 * Steps before it pass, so a run has committed steps when it breaks, and a --resume with the
 * variable set past the trace's end completes the run. */
#include <stdlib.h>

#include "../../replay/attnreplay_plugin.h"

/* the example plugin, its entry point renamed so that this file exports its own */
#define attnreplay_plugin_init example_cuda_plugin_init
#include "../../replay/plugins/example_cuda.cu"
#undef attnreplay_plugin_init

#if defined(FAULTY_oob)
#define KIND "oob"
#elif defined(FAULTY_hang)
#define KIND "hang"
#else
#error "build with -DFAULTY_<kind>"
#endif

/* out: the forward's output tensor (device memory); the write lands 2^38 floats past it */
__global__ void faulty_wild_write(float *out)
{
    out[(1LL << 38) + threadIdx.x] = 1.0f;
}

__device__ int faulty_release;   /* zero, and nothing ever sets it */

__global__ void faulty_spin(void)
{
    while (*(volatile int *)&faulty_release == 0) __nanosleep(1000);
}

static attnreplay_plugin faulty;
static const attnreplay_plugin *inner;

static int faulty_forward(void *st, const attnreplay_forward_args *a)
{
    const char *from = getenv("ATTNREPLAY_FAULTY_STEP");
    const long long step = from && *from ? atoll(from) : 3;
    if (a->md->step >= step) {
        cudaStream_t stream = (cudaStream_t)a->stream;
#if defined(FAULTY_oob)
        faulty_wild_write<<<1, 32, 0, stream>>>((float *)a->out.data);
#else
        faulty_spin<<<1, 32, 0, stream>>>();
#endif
    }
    return inner->forward(st, a);
}

extern "C" ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h,
                                                                                   int host_abi_version)
{
    inner = example_cuda_plugin_init(h, host_abi_version);
    if (!inner) return NULL;
    faulty = *inner;
    faulty.name = "faulty-cuda-" KIND;
    faulty.summary = "test plugin: the example CUDA kernel, broken (" KIND ") from step ATTNREPLAY_FAULTY_STEP on";
    faulty.forward = faulty_forward;
    return &faulty;
}
