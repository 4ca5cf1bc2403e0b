/* cuda_plan.cuh - the "cuda" backend's decision function: build_plan picks the kernel of each
 * attention launch (the configs of cuda_attn.cuh) and its split count, and has its work cut
 * into split-KV pieces (the items, the cut and the split rules themselves are attn_plan.c's,
 * plain C, tested without a GPU).  Part of cuda_backend.cu's translation unit (included once,
 * after cuda_state), kept apart so that the rule and its measurements read in one place.
 *
 * Which kernel runs a launch: decode launches (one query token per request) of at least half as
 * many requests as SMs with every context at most 16k keys, or of at least 0.9 x SMs requests,
 * head size 128, block size 16, at most 8 KV heads, on a compute-capability 9.0 device with
 * tensor maps take DECODE_TMA (one CTA per request, whole cache blocks by TMA; see
 * decode_tma_plan for the measurements behind the rule; the cascade suffix pass of a decode
 * batch is such a launch), and so do flat decode launches of 0.48 to 0.5 x SMs requests with
 * contexts of at most 16k keys (decode_tma_small_rule); other launches in the DECODE geometry
 * (every (request, KV head) within 16 rows) take the mma.sync DECODE kernel; other launches
 * with head size exactly 128 or 256 on a compute-capability 9.0 device whose driver encodes
 * tensor maps take PREFILL_WG (128-row tiles over 128 keys at head size 128, 64 keys at 256; two
 * ping-pong consumer warpgroups fed by a producer warpgroup whose whole-tile K/V copies are bulk
 * tensor copies; H200: causal prefill B=2 S=8k hd 128 500.6 TFLOP/s against 272 for the mma.sync
 * kernel, BENCHMARKS.md).  Everything else runs the
 * mma.sync PREFILL kernel.  AR_CUDA_WGMMA=0 in the environment keeps the mma.sync kernels
 * everywhere (the fallback, for comparisons).  An fp8 cache runs the fp8-KV variants of
 * DECODE_TMA, DECODE and PREFILL, by the same rule, except that PREFILL_WG launches take PREFILL
 * (forced too) and that fp8 DECODE_TMA batches are cut into pieces that fill the SMs
 * (decode_tma_splits); the split rule then uses those kernels' occupancy.
 *
 * Split heuristic (FlashAttention 2/3's num_splits_heuristic, the "85% of the best wave
 * efficiency" rule): let C be the CTAs of the unsplit launch and S_slots = SMs x CTAs that fit
 * on one SM.  If C >= 0.8 S_slots, do not split.  Otherwise, for s = 1 .. min(64, S_slots,
 * n_blocks) (n_blocks: the most key-tile units any CTA walks; a unit is one key tile per warp
 * column) skip every s that does not change ceil(n_blocks / s) and take the wave efficiency
 * e(s) = w / ceil(w) with w = C s / S_slots; choose the smallest s with e(s) >= 0.85 max e.
 * Our addition (the "tail rule"): when C >= 0.8 S_slots but under 4 waves, the last wave can
 * leave most SMs idle (C = 512 on 396 slots runs 2 waves for 1.29 waves of work), so take the
 * smallest s <= 8 whose ceil(C s / S_slots) / s is within 5% of the best.
 * Each work item is then cut into pieces of ceil(n_blocks / s) units (short ones stay whole),
 * so the split is per request, like FA3's dynamic varlen splits.
 *
 * Item order: the work list is sorted longest first, except a PREFILL_WG launch's: its CTAs take
 * their items from a queue, and wg_l2_order puts its list in item_order.h's order: longest first within sections
 * of (request, KV head) groups whose K/V take at most a third of the L2, so that the items at
 * work at one time share their keys through the L2 (H200, 2026-12-03 14:05 UTC, bench_cuda 10,
 * two rounds, TFLOP/s, before / after: varlen 375.2-377.0 / 409.3-409.6, DRAM bytes read 782 /
 * 235 MB and L2 hit rate 30.8% / 66.8% under ncu; causal hd 128 590.5-590.9 / 621.0-621.2, hd 256
 * 654.4-656.4 / 663.4-663.8, the chunked step 578.6-583.3 / 590.3-590.4; the queue alone over
 * the longest-first list, AR_CUDA_WG_SECTION_MB=0: 370.1-370.7 / 592.1-592.6 / 656.5-657.2 /
 * 570.6-576.2).  The other kernels keep the longest-first list (a CTA per item, in order).
 *
 * The environment's sweep knobs (cuda_backend.cu's opening comment) change these choices for
 * measurements: AR_CUDA_DECODE_SPLITS fixes DECODE's s; AR_CUDA_DECODE_TMA=rule keeps the
 * small-batch launches of decode_tma_small_rule on DECODE; AR_CUDA_DECODE_TMA=split lets DECODE_TMA
 * take the flat decode batches below its rule too, its requests cut into pieces (decode_tma_splits);
 * AR_CUDA_DECODE_TMA_SPLITS fixes that cut. */
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

/* The split rules (ar_attn_split_count: FlashAttention's 85% rule and the tail rule;
 * ar_attn_prefix_split_count: the cascade prefix pass), the items and their cut into pieces are
 * attn_plan.c's, plain C. */

/* One attention launch's plan: geometry, split count and the work list (host, malloc'd). */
typedef struct pass_plan {
    int config;
    ar_attn_geom geom;
    int num_splits;
    int64_t num_work, num_groups, num_partials;
    ar_attn_work *work;             /* [num_work], sorted longest first (PREFILL_WG: in
                                       item_order.h's L2 sections, wg_l2_order) */
    ar_combine_group *groups;       /* [num_groups] */
} pass_plan;

static void pass_plan_free(pass_plan *pl)
{
    free(pl->work);
    free(pl->groups);
    memset(pl, 0, sizeof *pl);
}

/* The plan of a launch: its config, geometry and split count, and the pieces (taken over). */
static void pass_plan_take(pass_plan *pl, int config, ar_attn_geom geom, int splits, const ar_attn_pieces *pc)
{
    pl->config = config;
    pl->geom = geom;
    pl->num_splits = splits;
    pl->num_work = pc->num_work;
    pl->num_groups = pc->num_groups;
    pl->num_partials = pc->num_partials;
    pl->work = pc->work;
    pl->groups = pc->groups;
}

/* AR_CFG_DECODE_TMA (cuda_attn_decode_tma.cuh) can run this launch: Hopper with tensor maps,
 * a 16-bit or an fp8 cache, head size 128, block size 16, at most 8 KV heads, a group of at most 16, no planted fault
 * (the faults live in the general kernels), causal, and one query token per request.  The
 * automatic plan takes it (force_config -1, no forced split, AR_CUDA_DECODE_TMA not 0) for
 * batches of at least half as many requests as the device has SMs whose longest context is at
 * most DECODE_TMA_MAX_KEYS keys, and for batches of at least 0.9 x SMs requests at any
 * context: one CTA walks a whole request and (by default) never splits, so it needs most SMs
 * busy.  On the H200 (bench_cascade's FLAT lines, 128 decodes, GQA 32/8, whole-block boxes, out/run52.sh,
 * 2026-11-30): 128 keys (the cascade suffix pass) 30.7 us against 36.0 for DECODE; 1152 keys
 * 82.1 against 155.6; 8320 keys 480.0 against 761.4; 32896 keys 1845.8 against 2888.7; 33024
 * keys 1845-2030 against 3105.4.  With fewer requests DECODE's split-KV fills the machine (the
 * decode bench's 64 requests stay on it).  force_config AR_CFG_DECODE_TMA takes it whenever it
 * can run. */
#define DECODE_TMA_MAX_KEYS 16384
static bool decode_tma_rule(const cuda_state *s, int R, int max_seq)
{
    return (2 * R >= s->num_sms && max_seq <= DECODE_TMA_MAX_KEYS) || 10 * R >= 9 * s->num_sms;
}
/* Just below that rule, a flat decode launch of at least 0.48 x SMs requests with contexts of at
 * most DECODE_TMA_MAX_KEYS keys takes DECODE_TMA too, whole requests: one DECODE_TMA CTA streams
 * about 67 GB/s (H200, kernels/paged/decode_sweep.sh, 8k contexts, GQA 32:8, 2026-12-02: B 48 in
 * 500.2 us = 3.22 TB/s over 48 CTAs, B 64 in 505.3 us = 4.25 TB/s over 64), so it takes about
 * the copy ceiling (4.23 TB/s) / 67 GB/s = 64 CTAs, 0.48 of the 132 SMs, to read at the rate of
 * the DRAM.  There B 64 runs in 505.3-509.1 us against 542.8 us on DECODE (3 splits, 1536 CTAs
 * and their combine) and 528.8 us for FA3's paged decode in the same run; at B 48 DECODE keeps it
 * (395.1 us; cut into pieces, DECODE_TMA took 413.6).  AR_CUDA_DECODE_TMA=rule keeps these
 * launches on DECODE. */
static bool decode_tma_small_rule(const cuda_state *s, int R, int max_seq)
{
    return s->decode_tma_small && 25 * R >= 12 * s->num_sms && max_seq <= DECODE_TMA_MAX_KEYS;
}
/* flat: a flat launch (not a cascade pass); AR_CUDA_DECODE_TMA=split (s->decode_tma_all) lets the
 * automatic plan take DECODE_TMA for every flat decode launch it can run, below the rule's batch
 * sizes too (decode_tma_splits then cuts the requests so that the pieces fill the SMs). */
static bool decode_tma_plan(const cuda_state *s, int R, const int *query_start_loc, const int *seq_lens,
                            bool non_causal, int force_config, int force_splits, bool flat)
{
    if (!s->has_tma || non_causal || s->head_size != 128 || s->template_hd != 128 ||
        s->block_size != 16 || s->hkv > 8 || s->group > 16 || s->cfg.fault != AR_FAULT_NONE)
        return false;
    int max_seq = 0;
    for (int r = 0; r < R; r++) {
        if (query_start_loc[r + 1] - query_start_loc[r] > 1) return false;
        if (seq_lens[r] > max_seq) max_seq = seq_lens[r];
    }
    if (force_config == AR_CFG_DECODE_TMA) return true;
    if (force_config >= 0 || force_splits > 0 || !s->decode_tma_auto) return false;
    return decode_tma_rule(s, R, max_seq) || (flat && (s->decode_tma_all || decode_tma_small_rule(s, R, max_seq)));
}

/* The pieces per request of a DECODE_TMA launch (1: whole requests, the default).  Only flat
 * launches split: a forced split with force_config AR_CFG_DECODE_TMA, else
 * AR_CUDA_DECODE_TMA_SPLITS (s->decode_tma_splits), else choose_num_splits over SMs x CTAs per
 * SM for every batch with an fp8 cache, and under AR_CUDA_DECODE_TMA=split for a 16-bit batch
 * below decode_tma_rule's sizes (B 64 on 132 SMs: 2, 128 CTAs in one wave).  An fp8 CTA is bound
 * by its consumers' widening and MMAs, not by its copies, so the number of CTAs at work sets the
 * rate; on the H200, 8k keys, GQA 32:8 (bench_cuda, 2026-12-02 16:37 and 17:04 UTC), us by
 * pieces per request 1 / 2 / 3 / 4 (fp8 DECODE): B 64 570.8 / 302.2-304.2 / 399.3 / - (459.8);
 * B 96 565.0-565.3 / 581.6 / 585.0 / 456.1 (648.0), where choose_num_splits takes 4 (2.9 waves);
 * B 128 570.9-571.2 / 588.0 / 595.0 / 600.3 (897.4), where it takes 1.  A 16-bit cache streams
 * at the DRAM's rate from 64 CTAs on and keeps whole requests (B 128: 1015.3-1019.0 / 1030.3 /
 * 1033.9 / 1041.0; B 64, 17:19 UTC, three repeats: 530.9-533.3 / 522.9-527.0 / 582.2-582.8, 2
 * pieces 1.2% ahead, within the run-to-run spread of other calls, so not taken).  max_blocks: the
 * most key blocks of any request. */
static int decode_tma_splits(const cuda_state *s, int R, int max_seq, int max_blocks, int force_config,
                             int force_splits, bool flat)
{
    if (!flat) return 1;
    int n = 1;
    if (force_config == AR_CFG_DECODE_TMA && force_splits > 0) n = force_splits;
    else if (force_splits <= 0 && s->decode_tma_splits > 0) n = s->decode_tma_splits;
    else if (force_splits <= 0 && force_config < 0 &&
             (s->kv_fp8 || (s->decode_tma_all && !decode_tma_rule(s, R, max_seq))))
        n = ar_attn_split_count(R, max_blocks, s->num_sms * s->ctas_per_sm[AR_CFG_DECODE_TMA]);
    return n < 1 ? 1 : n > AR_MAX_SPLITS ? AR_MAX_SPLITS : n;
}

/* PREFILL_WG takes its items from a queue (cuda_attn_wgmma.cuh) in the order of item_order.h:
 * longest first within sections of (request, KV head) groups whose K/V fit in
 * s->wg_section_bytes.  work [n] is put in that order in place (whatever order it came in: the
 * order's keys break every tie); where item_order refuses its arguments, longest first.  0 ok,
 * 3 out of host memory. */
static int wg_l2_order(const cuda_state *s, int R, const int *seq_lens, int config, ar_attn_work *work, int64_t n)
{
    if (n <= 1) return 0;
    ar_order_item *items = (ar_order_item *)malloc((size_t)n * sizeof *items);
    int64_t *order = (int64_t *)malloc((size_t)n * sizeof *order);
    int64_t *group_bytes = (int64_t *)malloc((size_t)(R > 0 ? R : 1) * sizeof *group_bytes);
    ar_attn_work *copy = (ar_attn_work *)malloc((size_t)n * sizeof *copy);
    int rc = 0;
    if (!items || !order || !group_bytes || !copy) rc = 3;
    if (!rc) {
        for (int r = 0; r < R; r++) group_bytes[r] = (int64_t)seq_lens[r] * s->head_size * 2 * (int64_t)s->elem_bytes;
        for (int64_t i = 0; i < n; i++) {
            const ar_order_item it = {work[i].req, work[i].kv_head, work[i].tile_end - work[i].tile_begin, work[i].pair0,
                                      work[i].tile_begin};
            items[i] = it;
        }
        const int slots = s->num_sms * s->ctas_per_sm[config];
        const int got = ar_item_order(items, n, group_bytes, R, s->hkv, s->wg_section_bytes, slots > 0 ? slots : 1, order);
        if (got == -2) rc = 3;
        else if (got > 0) {
            memcpy(copy, work, (size_t)n * sizeof *copy);
            for (int64_t i = 0; i < n; i++) work[i] = copy[order[i]];
        } else {
            ar_attn_sort_longest_first(work, n);
        }
    }
    free(items);
    free(order);
    free(group_bytes);
    free(copy);
    return rc;
}

/* Flattens one launch into work items.  R sequences; query_start_loc [R + 1], seq_lens [R].
 * non_causal: every query of a sequence sees all its seq_len keys (cascade prefix pass: its
 * own split rule), and the sliding window is not applied.  flat: a flat launch (not a cascade
 * pass; DECODE_TMA splits only these).  force_config -1 / force_splits 0 = automatic, then the
 * environment's knobs (cuda_backend.cu's opening comment).  0 ok, 3 out of host memory. */
static int build_plan(const cuda_state *s, int R, const int *query_start_loc, const int *seq_lens,
                      bool non_causal, bool flat, int force_config, int force_splits, pass_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    int max_q = 0;
    for (int r = 0; r < R; r++) {
        int ql = query_start_loc[r + 1] - query_start_loc[r];
        if (ql > max_q) max_q = ql;
    }
    int config = max_q * s->group <= 16 ? AR_CFG_DECODE : AR_CFG_PREFILL;
    if (force_config == AR_CFG_PREFILL) config = AR_CFG_PREFILL;
    const bool wg_ok = s->has_tma && (s->head_size == 128 || s->head_size == 256) && !s->kv_fp8;
    if (ar_attn_config_is_wg(force_config)) config = wg_ok ? force_config : AR_CFG_PREFILL;
    if (force_config < 0 && config == AR_CFG_PREFILL && s->wgmma_auto && wg_ok) config = s->wgmma_auto;
    if (config == AR_CFG_DECODE &&
        decode_tma_plan(s, R, query_start_loc, seq_lens, non_causal, force_config, force_splits, flat)) {
        /* one item per request with its token (key blocks from the window's start), or, split,
         * pieces of chunk blocks: piece p of a request cut into n writes partial slots base + p +
         * h x n for KV head h, and (request, h) is a combine group of the n slots from base + h x n */
        const int window0 = s->cfg.model.sliding_window;
        int max_seq = 0, max_blocks = 0;
        ar_attn_decode_tma_extent(R, query_start_loc, seq_lens, window0, &max_blocks, &max_seq);
        const int splits = decode_tma_splits(s, R, max_seq, max_blocks, force_config, force_splits, flat);
        ar_attn_pieces pieces;
        if (ar_attn_decode_tma_items(R, query_start_loc, seq_lens, window0, s->hkv, splits, max_blocks, &pieces))
            return 3;
        ar_attn_sort_longest_first(pieces.work, pieces.num_work);
        pass_plan_take(pl, AR_CFG_DECODE_TMA, ar_attn_geometry(AR_CFG_DECODE_TMA, 128), splits, &pieces);
        return 0;
    }
    ar_attn_geom geom = ar_attn_geometry(config, s->template_hd);
    const ar_attn_shape shape = {R, query_start_loc, seq_lens, s->hkv, s->group, geom.rows, geom.block_n, geom.warps_n,
                                 non_causal, s->cfg.model.sliding_window,
                                 s->cfg.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0};
    ar_attn_work *items;
    int64_t n_items;
    int max_units;
    if (ar_attn_items(&shape, &items, &n_items, &max_units)) return 3;
    int slots = s->num_sms * s->ctas_per_sm[config];
    int splits = force_splits > 0                                       ? force_splits
                 : non_causal                                           ? ar_attn_prefix_split_count((int)n_items, max_units, slots)
                 : config == AR_CFG_DECODE && s->decode_splits > 0      ? s->decode_splits
                                                                        : ar_attn_split_count((int)n_items, max_units, slots);
    if (splits > AR_MAX_SPLITS) splits = AR_MAX_SPLITS;
    ar_attn_pieces pieces;
    const int cut_rc = ar_attn_cut(items, n_items, splits, max_units, geom.warps_n, &pieces);
    free(items);
    if (cut_rc) return 3;
    if (!ar_attn_config_is_wg(config)) ar_attn_sort_longest_first(pieces.work, pieces.num_work);
    else if (wg_l2_order(s, R, seq_lens, config, pieces.work, pieces.num_work)) {
        ar_attn_pieces_free(&pieces);
        return 3;
    }
    pass_plan_take(pl, config, geom, splits, &pieces);
    return 0;
}

#endif
