/* cuda_plan.cuh - the "cuda" backend's plan of each attention launch: the geometry of each
 * kernel config (ar_attn_geometry, from the kernels' own templates) and the backend's state
 * handed to the decision function, ar_attn_build_plan in attn_plan.c (plain C, tested without a
 * GPU by tests/test_attn_plan.c), whose comment has the rule and the measurements behind it.
 * Part of cuda_backend.cu's translation unit (included once, after cuda_state). */
#ifndef AR_PAGED_PLAN_CUH
#define AR_PAGED_PLAN_CUH

ar_attn_geom ar_attn_geometry(int config, int hd)
{
    using namespace ar_attn;
    if (ar_attn_config_is_wg(config) && hd == 128) {
        ar_attn_geom r = {WgGeom<128>::ROWS, WgGeom<128>::BLOCK_N, 1, WgPipe<128>::THREADS, WgPipe<128>::SMEM};
        return r;
    }
    if (ar_attn_config_is_wg(config) && hd == 256) {
        ar_attn_geom r = {WgGeom<256>::ROWS, WgGeom<256>::BLOCK_N, 1, WgPipe<256>::THREADS, WgPipe<256>::SMEM};
        return r;
    }
    if (config == AR_CFG_DECODE_TMA && hd == 128) {
        ar_attn_geom r = {16, DecodeTmaGeom::BLOCK, 1, 32 * (DecodeTmaGeom::MAX_KV_HEADS + 1), DecodeTmaGeom::SMEM};
        return r;
    }
    if (config != AR_CFG_DECODE) {
        if (hd == 64) return geom_of<PrefillG64>();
        if (hd == 128) return geom_of<PrefillG128>();
        return geom_of<PrefillG256>();
    }
    if (hd == 64) return geom_of<DecodeG64>();
    if (hd == 128) return geom_of<DecodeG128>();
    return geom_of<DecodeG256>();
}

/* One attention launch's plan (attn_plan.h). */
typedef ar_attn_plan pass_plan;

static void pass_plan_free(pass_plan *pl) { ar_attn_plan_free(pl); }

/* What the decision function needs of this backend's state. */
static ar_attn_device device_of(const cuda_state *s)
{
    ar_attn_device d;
    memset(&d, 0, sizeof d);
    d.num_sms = s->num_sms;
    for (int c = 0; c < AR_CFG_COUNT; c++) {
        d.ctas_per_sm[c] = s->ctas_per_sm[c];
        d.geom[c] = ar_attn_geometry(c, c == AR_CFG_DECODE_TMA ? 128 : s->template_hd);
    }
    d.has_tma = s->has_tma;
    d.head_size = s->head_size;
    d.template_hd = s->template_hd;
    d.block_size = s->block_size;
    d.num_kv_heads = s->hkv;
    d.group = s->group;
    d.kv_fp8 = s->kv_fp8;
    d.elem_bytes = (int)s->elem_bytes;
    d.sliding_window = s->cfg.model.sliding_window;
    d.fault = s->cfg.fault;
    d.wgmma_auto = s->wgmma_auto;
    d.decode_tma_auto = s->decode_tma_auto;
    d.decode_tma_all = s->decode_tma_all;
    d.decode_tma_uneven = s->decode_tma_uneven;
    d.decode_tma_small = s->decode_tma_small;
    d.decode_tma_many = s->decode_tma_many;
    d.decode_tma_splits = s->decode_tma_splits;
    d.decode_tma_pieces = s->decode_tma_pieces;
    d.decode_splits = s->decode_splits;
    d.split_path_ratio = s->split_path_ratio;
    d.split_path_large = s->split_path_large;
    d.wg_section_bytes = s->wg_section_bytes;
    return d;
}

/* See ar_attn_build_plan (attn_plan.h). */
static int build_plan(const cuda_state *s, int R, const int *query_start_loc, const int *seq_lens,
                      bool non_causal, bool flat, int force_config, int force_splits, pass_plan *pl)
{
    const ar_attn_device d = device_of(s);
    return ar_attn_build_plan(&d, R, query_start_loc, seq_lens, non_causal, flat, force_config, force_splits, pl);
}

#endif
