/* plugin_abi.c - the plugin ABI as the Python package sees it (plugin.h): DLPack managed tensors
 * wrapped around the host's DLTensors for __dlpack__, and the ABI's version, struct sizes and
 * field offsets, which attnreplay.abi checks its ctypes mirror against. */
#include "plugin.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* DLPack's managed tensors, for Python's __dlpack__ (plugin.h). */
typedef struct { uint32_t major, minor; } dl_version;
typedef struct dl_managed {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;
typedef struct dl_managed_versioned {
    dl_version version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_versioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} dl_managed_versioned;

static void dl_delete(dl_managed *m) { free(m); }
static void dl_delete_versioned(dl_managed_versioned *m) { free(m); }

void *ar_dlpack_wrap(const DLTensor *t, int versioned)
{
    if (!t || t->ndim < 0 || t->ndim > 8) return NULL;
    size_t head = versioned ? sizeof(dl_managed_versioned) : sizeof(dl_managed);
    size_t dims = sizeof(int64_t) * (size_t)(t->ndim > 0 ? t->ndim : 1);
    unsigned char *mem = calloc(1, head + 2 * dims);
    if (!mem) return NULL;
    int64_t *shape = (int64_t *)(mem + head), *strides = shape + (t->ndim > 0 ? t->ndim : 1);
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = t->shape[i];
        strides[i] = t->strides ? t->strides[i] : 0;
    }
    if (!t->strides && t->ndim > 0) {
        int64_t s = 1;
        for (int i = t->ndim - 1; i >= 0; i--) { strides[i] = s; s *= shape[i]; }
    }
    DLTensor copy = *t;
    copy.shape = shape;
    copy.strides = strides;
    if (versioned) {
        dl_managed_versioned *m = (dl_managed_versioned *)mem;
        m->version.major = 1;
        m->version.minor = 1;
        m->deleter = dl_delete_versioned;
        m->dl_tensor = copy;
        return m;
    }
    dl_managed *m = (dl_managed *)mem;
    m->deleter = dl_delete;
    m->dl_tensor = copy;
    return m;
}

int ar_plugin_abi_version(void) { return ATTNREPLAY_PLUGIN_ABI_VERSION; }

long ar_plugin_abi_sizeof(int which)
{
    switch (which) {
    case 0: return (long)sizeof(DLTensor);
    case 1: return (long)sizeof(attnreplay_host_api);
    case 2: return (long)sizeof(attnreplay_config);
    case 3: return (long)sizeof(attnreplay_metadata);
    case 4: return (long)sizeof(attnreplay_forward_args);
    case 5: return (long)sizeof(attnreplay_plugin);
    default: return -1;
    }
}

#define FIELD(type, f) if (strcmp(field, #f) == 0) return (long)offsetof(type, f)
long ar_plugin_abi_offsetof(int which, const char *field)
{
    if (!field) return -1;
    switch (which) {
    case 0:
        FIELD(DLTensor, data); FIELD(DLTensor, device); FIELD(DLTensor, ndim); FIELD(DLTensor, dtype);
        FIELD(DLTensor, shape); FIELD(DLTensor, strides); FIELD(DLTensor, byte_offset);
        break;
    case 1:
        FIELD(attnreplay_host_api, set_error); FIELD(attnreplay_host_api, log);
        FIELD(attnreplay_host_api, cuda_stream); FIELD(attnreplay_host_api, time_mark);
        break;
    case 2:
        FIELD(attnreplay_config, model_name); FIELD(attnreplay_config, num_q_heads);
        FIELD(attnreplay_config, scale); FIELD(attnreplay_config, sliding_window);
        FIELD(attnreplay_config, logits_soft_cap); FIELD(attnreplay_config, block_size);
        FIELD(attnreplay_config, num_layers); FIELD(attnreplay_config, dtype);
        FIELD(attnreplay_config, kv_dtype); FIELD(attnreplay_config, kv_scale);
        FIELD(attnreplay_config, cascade); FIELD(attnreplay_config, inject);
        FIELD(attnreplay_config, repeat); FIELD(attnreplay_config, device);
        FIELD(attnreplay_config, attention); FIELD(attnreplay_config, kv_lora_rank);
        FIELD(attnreplay_config, qk_rope_head_dim);
        break;
    case 3:
        FIELD(attnreplay_metadata, step); FIELD(attnreplay_metadata, num_reqs);
        FIELD(attnreplay_metadata, max_seq_len); FIELD(attnreplay_metadata, query_start_loc);
        FIELD(attnreplay_metadata, block_table); FIELD(attnreplay_metadata, slot_mapping);
        FIELD(attnreplay_metadata, use_cascade); FIELD(attnreplay_metadata, common_prefix_len);
        FIELD(attnreplay_metadata, cu_prefix_query_lens); FIELD(attnreplay_metadata, suffix_kv_lens);
        FIELD(attnreplay_metadata, query_start_loc_cpu); FIELD(attnreplay_metadata, context_lens_cpu);
        break;
    case 4:
        FIELD(attnreplay_forward_args, layer); FIELD(attnreplay_forward_args, md);
        FIELD(attnreplay_forward_args, q); FIELD(attnreplay_forward_args, kv_cache);
        FIELD(attnreplay_forward_args, out); FIELD(attnreplay_forward_args, lse);
        FIELD(attnreplay_forward_args, stream);
        break;
    case 5:
        FIELD(attnreplay_plugin, name); FIELD(attnreplay_plugin, device_type); FIELD(attnreplay_plugin, flags);
        FIELD(attnreplay_plugin, check); FIELD(attnreplay_plugin, open); FIELD(attnreplay_plugin, plan);
        FIELD(attnreplay_plugin, forward); FIELD(attnreplay_plugin, close);
        break;
    default: break;
    }
    return -1;
}
#undef FIELD
