/* test_item_order.c - the wgmma prefill kernel's item order (kernels/paged/item_order.c): a
 * permutation, longest first inside each section, sections whose groups' K/V stay within the
 * budget so that the items running side by side read few groups' keys, a tail that lets a queue
 * of CTAs finish together, the same order whatever order the items come in, and bad arguments
 * refused.  The shapes are bench_cuda's: the 16-sequence varlen batch, causal prefill B2 S8k at
 * head sizes 128 and 256, and the chunked step of 8,192 tokens after 90,112. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/item_order.h"

enum { CTAS = 132, MAX_ITEMS = 8192, MAX_REQS = 16 };

typedef struct shape {
    ar_order_item items[MAX_ITEMS];
    int64_t n;
    int num_reqs, num_kv_heads;
    int64_t group_bytes[MAX_REQS];
} shape;

/* items of 128 rows (pairs of token x query head in a group of `group`), causal, key tiles of
 * block_n, as cuda_plan.cuh's build_plan cuts them */
static void make_shape(shape *s, const int *q_lens, const int *seq_lens, int num_reqs, int num_kv_heads, int group,
                       int head_size)
{
    const int block_n = head_size == 128 ? 128 : 64;
    memset(s, 0, sizeof *s);
    s->num_reqs = num_reqs;
    s->num_kv_heads = num_kv_heads;
    for (int r = 0; r < num_reqs; r++) {
        s->group_bytes[r] = (int64_t)seq_lens[r] * head_size * 2 * 2;
        const int ctx = seq_lens[r] - q_lens[r], pairs = q_lens[r] * group;
        for (int h = 0; h < num_kv_heads; h++)
            for (int p0 = 0; p0 < pairs; p0 += 128) {
                int last = (p0 + 127) / group;
                if (last > q_lens[r] - 1) last = q_lens[r] - 1;
                assert_true(s->n < MAX_ITEMS);
                const ar_order_item it = {r, h, (ctx + last + 1 + block_n - 1) / block_n, p0, 0};
                s->items[s->n++] = it;
            }
    }
}

static const int varlen_lens[16] = {256, 384, 512, 640, 768, 896, 1024, 1152,
                                    1280, 1408, 1536, 1664, 1792, 1920, 2048, 128};

static void varlen(shape *s) { make_shape(s, varlen_lens, varlen_lens, 16, 16, 1, 128); }
static void prefill(shape *s, int head_size)
{
    const int lens[2] = {8192, 8192};
    make_shape(s, lens, lens, 2, head_size == 128 ? 16 : 8, 1, head_size);
}
static void chunk(shape *s)
{
    const int q[1] = {8192}, kv[1] = {98304};
    make_shape(s, q, kv, 1, 8, 4, 128);
}

static int64_t order_of(const shape *s, int64_t section_bytes, int64_t *order)
{
    const int got = ar_item_order(s->items, s->n, s->group_bytes, s->num_reqs, s->num_kv_heads, section_bytes, CTAS, order);
    assert_true(got >= 1);
    return got;
}

static void assert_permutation(const int64_t *order, int64_t n)
{
    char *seen = calloc((size_t)n, 1);
    assert_non_null(seen);
    for (int64_t i = 0; i < n; i++) {
        assert_true(order[i] >= 0 && order[i] < n);
        assert_int_equal(seen[order[i]], 0);
        seen[order[i]] = 1;
    }
    free(seen);
}

/* The time a queue of CTAS CTAs takes over the order (an item costs its tiles + 1), against the
 * bound max(work / CTAS, longest item). */
static double queue_makespan_over_bound(const shape *s, const int64_t *order)
{
    double free_at[CTAS] = {0}, work = 0, longest = 0;
    for (int64_t i = 0; i < s->n; i++) {
        const double cost = s->items[order[i]].tiles + 1.0;
        int c = 0;
        for (int k = 1; k < CTAS; k++)
            if (free_at[k] < free_at[c]) c = k;
        free_at[c] += cost;
        work += cost;
        if (cost > longest) longest = cost;
    }
    double end = 0;
    for (int k = 0; k < CTAS; k++)
        if (free_at[k] > end) end = free_at[k];
    const double bound = work / CTAS > longest ? work / CTAS : longest;
    return end / bound;
}

/* The most K/V bytes of distinct groups among any CTAS consecutive items: what the CTAs at work
 * at one time read. */
static int64_t widest_window_bytes(const shape *s, const int64_t *order)
{
    int *count = calloc((size_t)s->num_reqs * s->num_kv_heads, sizeof *count);
    assert_non_null(count);
    int64_t bytes = 0, widest = 0;
    for (int64_t i = 0; i < s->n; i++) {
        const ar_order_item *in = &s->items[order[i]];
        if (count[in->req * s->num_kv_heads + in->kv_head]++ == 0) bytes += s->group_bytes[in->req];
        if (i >= CTAS) {
            const ar_order_item *out = &s->items[order[i - CTAS]];
            if (--count[out->req * s->num_kv_heads + out->kv_head] == 0) bytes -= s->group_bytes[out->req];
        }
        if (bytes > widest) widest = bytes;
    }
    free(count);
    return widest;
}

static void test_longest_first_without_sections(void **state)
{
    (void)state;
    static shape s;
    static int64_t order[MAX_ITEMS];
    varlen(&s);
    assert_int_equal(order_of(&s, 0, order), 1);
    assert_permutation(order, s.n);
    for (int64_t i = 1; i < s.n; i++) assert_true(s.items[order[i - 1]].tiles >= s.items[order[i]].tiles);
}

static void test_sections_bound_the_keys_in_flight(void **state)
{
    (void)state;
    static shape s;
    static int64_t order[MAX_ITEMS];
    const int64_t budget = (int64_t)16 << 20;
    varlen(&s);
    const int64_t sections = order_of(&s, budget, order);
    assert_permutation(order, s.n);
    assert_true(sections >= 4);
    /* longest first inside a section: the tiles grow again only where a section starts */
    int64_t rises = 0;
    for (int64_t i = 1; i < s.n; i++) rises += s.items[order[i]].tiles > s.items[order[i - 1]].tiles;
    assert_true(rises <= sections - 1);
    /* the CTAs at work at one time read at most three sections' keys (a window of CTAS items
     * spans two or three); longest first reads twice the whole L2 of an H200 (50 MB) */
    const int64_t sectioned = widest_window_bytes(&s, order);
    assert_true(sectioned <= 3 * budget);
    static int64_t plain[MAX_ITEMS];
    order_of(&s, 0, plain);
    assert_true(widest_window_bytes(&s, plain) > (int64_t)100 << 20);
    print_message("varlen: %lld sections, %.1f MiB in flight at most (longest first: %.1f)\n", (long long)sections,
                  sectioned / 1048576.0, widest_window_bytes(&s, plain) / 1048576.0);
}

static void test_tail_keeps_the_queue_even(void **state)
{
    (void)state;
    static shape s;
    static int64_t order[MAX_ITEMS];
    static const int section_mb[] = {AR_ITEM_ORDER_SECTION_MB, 8, 16, 24, 32};   /* the default first */
    for (int which = 0; which < 4; which++)
        for (size_t k = 0; k < sizeof section_mb / sizeof section_mb[0]; k++) {
            const int mb = section_mb[k];
            if (k > 0 && mb == AR_ITEM_ORDER_SECTION_MB) continue;   /* the default ran first */
            if (which == 0) varlen(&s);
            else if (which == 1) prefill(&s, 128);
            else if (which == 2) prefill(&s, 256);
            else chunk(&s);
            order_of(&s, (int64_t)mb << 20, order);
            assert_permutation(order, s.n);
            const double ratio = queue_makespan_over_bound(&s, order);
            if (ratio > 1.05) fail_msg("shape %d, %d MiB sections: the queue ends %.3fx past its bound", which, mb, ratio);
        }
}

/* The order depends on the items, not on the order they are given in. */
static void test_same_order_from_any_input_order(void **state)
{
    (void)state;
    static shape s, shuffled;
    static int64_t a[MAX_ITEMS], b[MAX_ITEMS];
    prefill(&s, 256);
    shuffled = s;
    uint64_t x = 12345;
    for (int64_t i = s.n - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t j = (int64_t)((x >> 33) % (uint64_t)(i + 1));
        const ar_order_item t = shuffled.items[i];
        shuffled.items[i] = shuffled.items[j];
        shuffled.items[j] = t;
    }
    order_of(&s, (int64_t)16 << 20, a);
    order_of(&shuffled, (int64_t)16 << 20, b);
    for (int64_t i = 0; i < s.n; i++) assert_memory_equal(&s.items[a[i]], &shuffled.items[b[i]], sizeof(ar_order_item));
}

static void test_bad_arguments(void **state)
{
    (void)state;
    const ar_order_item items[2] = {{0, 0, 2, 0, 0}, {1, 0, 3, 0, 0}};   /* the longer one second */
    const int64_t bytes[2] = {1024, 1024};
    int64_t order[2];
    assert_int_equal(ar_item_order(items, 2, bytes, 1, 1, 0, CTAS, order), -1);   /* req 1 of 1 */
    assert_int_equal(ar_item_order(items, 2, bytes, 2, 0, 0, CTAS, order), -1);   /* no KV heads */
    assert_int_equal(ar_item_order(items, 2, bytes, 2, 1, 0, 0, order), -1);      /* no CTAs */
    assert_int_equal(ar_item_order(items, 0, NULL, 0, 1, 0, CTAS, NULL), 0);      /* nothing to order */
    assert_int_equal(ar_item_order(items, 2, bytes, 2, 1, 0, CTAS, order), 1);
    assert_int_equal(order[0], 1);
    assert_int_equal(order[1], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_longest_first_without_sections),
        cmocka_unit_test(test_sections_bound_the_keys_in_flight),
        cmocka_unit_test(test_tail_keeps_the_queue_even),
        cmocka_unit_test(test_same_order_from_any_input_order),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
