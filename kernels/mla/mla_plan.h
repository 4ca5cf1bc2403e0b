/* mla_plan.h - the cuda-mla planners: how a decode launch's rows (query token x head) and keys
 * are cut into the CTAs of the latent attention and the combine that merges cut pieces; and the
 * prefill path's workspace passes and query tiles (at the end).
 *
 * A request's rows are taken ROWS (64) at a time ("row tiles"); a row tile's keys, in tiles of
 * KEYS (32) keys, are its own or cut into key pieces, each one work item (a CTA's task), and a
 * row tile cut into several pieces becomes a combine group whose partial outputs the combine
 * kernel merges.  Two plans:
 *   - ar_mla_build_plan: one piece a CTA; row tiles cut into pieces of total / SMs key tiles
 *     (FlashMLA's payload per SM, at least 4 tiles) only where list scheduling says the cut
 *     finishes sooner, or into force_splits pieces; longest first;
 *   - ar_mla_build_plan_persistent: the row tiles' key tiles in request order cut into num_ctas
 *     runs of equal length; CTA c runs the pieces of run c one after another (work[c], then the
 *     chain of work[].next).
 * Plain C, host only, so that tests/test_mla_plan.c checks the plans without a GPU; the kernels
 * (mla_common.cuh: work_item, combine_group) read the items exactly as laid out here, and
 * ar_mla_replan (mla_route.h) picks the plan of a kernel route. */
#ifndef AR_MLA_PLAN_H
#define AR_MLA_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_MLA_PLAN_ROWS 64   /* rows of one CTA tile (query token, head); row = token * H + head */
#define AR_MLA_PLAN_KEYS 32   /* keys of one key tile; pieces start at multiples of it */

/* One CTA of the latent attention: rows row0 .. row0 + 63 of request req, keys [key_begin,
 * key_end) (key_begin a multiple of AR_MLA_PLAN_KEYS). */
typedef struct ar_mla_work_item {
    int req;
    int row0;
    int key_begin;
    int key_end;
    int partial;        /* -1: write o_lat / lse; else the partial slot of this piece */
    int next;           /* persistent plans: the CTA's next piece, -1 none (else unused) */
    int pad1, pad2;
} ar_mla_work_item;

/* Pieces first_partial .. + count - 1 of one row tile, merged by the combine kernel. */
typedef struct ar_mla_combine_group {
    int req;
    int row0;
    int first_partial;
    int count;
} ar_mla_combine_group;

typedef struct ar_mla_plan {
    ar_mla_work_item *work;         /* [num_work] */
    ar_mla_combine_group *groups;   /* [num_groups] */
    int num_work, num_groups, num_partials;
    int num_ctas;       /* CTAs of the launch: num_work, or fewer for a persistent plan */
    int max_rows;       /* most rows (q_len * H) of a planned request */
    int64_t total_tiles; /* key tiles of all the row tiles (AR_MLA_PLAN_KEYS keys each, rounded up a row tile) */
} ar_mla_plan;

/* Frees the plan's arrays and zeroes it (a zeroed plan may be freed again). */
void ar_mla_plan_free(ar_mla_plan *p);

/* Row tiles of each request, each cut into key pieces so that the launch fills num_sms SMs,
 * sorted longest first (see the file comment); force_splits N >= 1 cuts every row tile into at
 * most N pieces instead.  R requests; qsl [R + 1] (query_start_loc), seq_lens [R]; include[r]
 * != 0 selects the requests to plan (NULL: all); H heads; causal 1: a query token sees the keys
 * up to its own position (seq_len - q_len + i); extra: 1 with the causal off-by-one fault.
 * 0 ok, -1 out of memory (p then zeroed). */
int ar_mla_build_plan(ar_mla_plan *p, int R, const int *qsl, const int *seq_lens, const unsigned char *include,
                      int H, int causal, int extra, int num_sms, int force_splits);

/* The persistent plan over num_ctas CTAs (see the file comment): every CTA gets the same number
 * of key tiles, ceil(total / num_ctas), the last one the rest; a row tile cut at a run boundary
 * becomes pieces merged by the combine; row tiles without a visible key ride with the run being
 * filled.  num_ctas of the result may be fewer than asked (rounding).  Same arguments and
 * return as ar_mla_build_plan. */
int ar_mla_build_plan_persistent(ar_mla_plan *p, int R, const int *qsl, const int *seq_lens,
                                 const unsigned char *include, int H, int causal, int extra, int num_ctas);

/* ---- the prefill path's workspace passes ----------------------------------------------------
 * Requests with is_pf[r] != 0 take cuda-mla's expanded prefill path: their keys and values are
 * up-projected into a workspace one pass at a time, vLLM's chunked-context prefill.  Pass p <
 * num_ctx_chunks holds, of every such request with context, the context positions [p * chunk,
 * min((p + 1) * chunk, ctx)); the last pass holds each one's new tokens [ctx, ctx + q_len).
 * chunk = workspace_tokens / (requests with context), rounded down to a multiple of block_size,
 * at least block_size.  A pass's rows are request by request, each request's rows consecutive
 * positions from its lowest: the tensor-core attention skips a query tile's invisible keys by
 * that order.  The prefill tokens are taken in request order (pf_tok) and cut into query tiles
 * of at most AR_MLA_PREFILL_TILE tokens of one request. */
#define AR_MLA_PREFILL_TILE 64

typedef struct ar_mla_prefill_passes {
    int num_reqs;           /* requests on the prefill path */
    int num_tokens;         /* their new tokens (pf_tok's length) */
    int num_tiles;          /* query tiles */
    int num_pairs;          /* pairs of a request's consecutive query tiles (ar_mla_pair_prefill_tiles) */
    int num_ctx_chunks;     /* context passes (0 when no request has context) */
    int num_passes;         /* num_ctx_chunks + 1, or 0 without a prefill request */
    int chunk;              /* context positions of one request a pass */
    int max_rows;           /* most workspace rows of a pass */
    int *rows;              /* [num_passes] workspace rows of each pass */
} ar_mla_prefill_passes;

/* The passes of a step: R requests, qsl [R + 1], seq_lens [R], is_pf [R].  0, or -1 out of
 * memory (pp zeroed).  ar_mla_prefill_passes_free frees rows and zeroes pp. */
int ar_mla_plan_prefill(ar_mla_prefill_passes *pp, int R, const int *qsl, const int *seq_lens,
                        const unsigned char *is_pf, int workspace_tokens, int block_size);
void ar_mla_prefill_passes_free(ar_mla_prefill_passes *pp);

/* Pass p's workspace rows: row_req / row_pos [rows[p]] (request and position of each row), and
 * kb / ke [R]: request r's rows are [kb[r], ke[r]) (empty for the others). */
void ar_mla_fill_prefill_pass(const ar_mla_prefill_passes *pp, int p, int R, const int *qsl, const int *seq_lens,
                              const unsigned char *is_pf, int *row_req, int *row_pos, int *kb, int *ke);

/* The prefill tokens in request order, pf_tok [num_tokens], and the query tiles, tiles
 * [num_tiles][3]: first pf_tok index, token count (1..AR_MLA_PREFILL_TILE), request. */
void ar_mla_fill_prefill_tokens(int R, const int *qsl, const unsigned char *is_pf, int *pf_tok, int *tiles);

/* The query tiles of ar_mla_fill_prefill_tokens in pairs, for the two-warpgroup prefill attention
 * (one CTA a pair, each tile on its own warpgroup, every key tile loaded once for both): pairs
 * [num_pairs][2] holds tile indices, request by request tiles 2k and 2k + 1 of a request, the
 * second -1 where a request has an odd count.  Ordered by the position of the pair's last
 * token, highest first (the pairs with the most keys start first, so the launch's tail holds
 * short ones), ties in tile order.  0, or -1 out of memory. */
int ar_mla_pair_prefill_tiles(const ar_mla_prefill_passes *pp, int R, const int *qsl, const int *seq_lens,
                              const unsigned char *is_pf, int *pairs);

/* The decode requests' tokens (is_dec[r] != 0, q_len > 0) as runs of consecutive tokens, in
 * order: rows [num_runs][2] holds [begin, end) token ranges, adjacent requests' tokens merged
 * into one run.  cuda-mla runs the absorption and W_UV GEMMs on these rows only.  Past max_runs
 * runs, one span [first decode token, qsl[R]) instead: the return value is 1 (the span holds
 * other tokens too), else 0.  *num_runs 0 without a decode token. */
int ar_mla_decode_runs(int R, const int *qsl, const unsigned char *is_dec, int max_runs, int *rows, int *num_runs);

#ifdef __cplusplus
}
#endif

#endif
