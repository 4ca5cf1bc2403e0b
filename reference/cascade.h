/* cascade.h - vLLM's cascade-attention decision, as pure functions (semantics section 5).
 *
 * common prefix length P: num_common_prefix_blocks * block_size, capped at the smallest
 * context (num_computed_tokens before the step) of the scheduled requests, rounded down to a
 * block; then use_cascade_attention (flash_attn.py) decides whether it is worth it, with the
 * FlashDecoding cost model that needs the device's SM count. */
#ifndef AR_CASCADE_H
#define AR_CASCADE_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* P before the heuristic; 0 when there is no usable common prefix. */
int ar_common_prefix_len(int num_common_prefix_blocks, int block_size,
                         const int *context_lens /* [num_reqs] */, int num_reqs);

/* vLLM's use_cascade_attention(common_prefix_len, query_lens, num_query_heads, num_kv_heads,
 * use_alibi=false, use_sliding_window, use_local_attention=false, num_sms, dcp_world_size=1). */
bool ar_use_cascade(int common_prefix_len, const int *query_lens /* [num_reqs] */, int num_reqs,
                    int num_q_heads, int num_kv_heads, bool sliding_window, int num_sms);

#ifdef __cplusplus
}
#endif
#endif
