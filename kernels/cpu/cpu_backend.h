/* cpu_backend.h - the CPU attention backends (float32 accumulation, pthreads).
 *
 *   ar_cpu_backend      "cpu": paged MHA/GQA/MQA attention with every feature (fp32/fp16/bf16,
 *                       fp8 e4m3 KV with kv_scale, sliding window, soft cap, cascade, all
 *                       kernel faults); kernels/cpu/cpu_backend.c.
 *   ar_cpu_mla_backend  "cpu-mla": DeepSeek MLA over the latent cache, absorbed decode and
 *                       chunked up-projected prefill; kernels/cpu/cpu_mla.c. */
#ifndef AR_CPU_BACKEND_H
#define AR_CPU_BACKEND_H

#include "../../replay/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const ar_backend ar_cpu_backend;
extern const ar_backend ar_cpu_mla_backend;

#ifdef __cplusplus
}
#endif
#endif
