/* datagen.c - the non-inline parts of the data generator (datagen.h): the request key and the
 * payloads that chain block content keys. */
#include "datagen.h"

#define AR_FNV_OFFSET 0xcbf29ce484222325ull
#define AR_FNV_PRIME 0x100000001b3ull

uint64_t ar_req_key(const char *req_id)
{
    uint64_t h = AR_FNV_OFFSET;
    if (req_id) {
        for (const unsigned char *c = (const unsigned char *)req_id; *c; c++) {
            h ^= *c;
            h *= AR_FNV_PRIME;
        }
    }
    return ar_mix64(h);
}

/* FNV-1a 64 over the token ids, each as 4 bytes little endian. */
uint64_t ar_tokens_payload(const int32_t *tokens /* [n] */, int n)
{
    uint64_t h = AR_FNV_OFFSET;
    for (int i = 0; tokens && i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xffu;
            h *= AR_FNV_PRIME;
        }
    }
    return h;
}

uint64_t ar_private_payload(uint64_t req_key, int block_index)
{
    return req_key ^ ((uint64_t)(int64_t)block_index * AR_GEN_GOLDEN) ^ 1u;
}
