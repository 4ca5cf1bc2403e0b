/* cascade.c - vLLM's cascade-attention decision (semantics sections 5.3 and 5.4): the common
 * prefix length the model runner derives from the scheduler's block count, and the
 * use_cascade_attention heuristic with its FlashDecoding cost model. */
#include "cascade.h"

static long long ceil_div(long long a, long long b)
{
    return (a + b - 1) / b;
}

int ar_common_prefix_len(int num_common_prefix_blocks, int block_size,
                         const int *context_lens /* [num_reqs] */, int num_reqs)
{
    if (num_common_prefix_blocks <= 0 || block_size <= 0 || num_reqs <= 0 || !context_lens)
        return 0;
    long long prefix = (long long)num_common_prefix_blocks * block_size;
    for (int r = 0; r < num_reqs; r++)
        if (context_lens[r] < prefix) prefix = context_lens[r];
    if (prefix <= 0) return 0;
    return (int)(prefix / block_size * block_size);
}

bool ar_use_cascade(int common_prefix_len, const int *query_lens /* [num_reqs] */, int num_reqs,
                    int num_q_heads, int num_kv_heads, bool sliding_window, int num_sms)
{
    /* Too short a prefix, or a mask the prefix pass cannot express. */
    if (common_prefix_len < 256) return false;
    if (sliding_window) return false;
    /* Too few requests to share the prefix among. */
    if (num_reqs < 8) return false;
    if (!query_lens || num_q_heads <= 0 || num_kv_heads <= 0) return false;

    int queries_per_kv = num_q_heads / num_kv_heads;
    bool all_decodes = true;
    for (int r = 0; r < num_reqs; r++)
        if (query_lens[r] != 1) all_decodes = false;
    bool flash_decoding = queries_per_kv > 1 && !sliding_window && all_decodes;
    if (!flash_decoding) return true;

    /* FlashDecoding would be used: compare waves of 128x128 tiles on num_sms SMs. */
    const int q_tile = 128, kv_tile = 128;
    if (num_sms <= 0) num_sms = 1;
    long long prefix_tiles = ceil_div(common_prefix_len, kv_tile);
    long long cascade_ctas = (long long)num_q_heads * ceil_div(num_reqs, q_tile);
    long long cascade_time = ceil_div(cascade_ctas, num_sms) * prefix_tiles;
    long long fd_ctas = (long long)num_reqs * num_kv_heads * ceil_div(queries_per_kv, q_tile) *
                        prefix_tiles;
    long long fd_time = ceil_div(fd_ctas, num_sms);
    return cascade_time < fd_time;
}
