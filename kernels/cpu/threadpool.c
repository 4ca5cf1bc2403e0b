/* threadpool.c - the persistent pthread pool of threadpool.h.
 *
 * Workers sleep on a condition variable until a new generation of work is posted, take items
 * from an atomic counter until it runs past num_items, then report done.  The caller takes
 * items too, then waits for the workers that are still busy. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct ar_threadpool {
    int num_threads;               /* including the caller */
    pthread_t *threads;            /* [num_threads - 1] */
    pthread_mutex_t mutex;
    pthread_cond_t work_posted;
    pthread_cond_t work_done;
    unsigned long generation;      /* bumped for every run */
    int busy_workers;              /* workers still inside the current run */
    bool quit;
    ar_task_fn fn;
    void *ctx;
    int num_items;
    atomic_int next_item;
};

typedef struct worker_arg {
    ar_threadpool *pool;
    int worker;
} worker_arg;

int ar_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void take_items(ar_threadpool *pool, int worker)
{
    for (;;) {
        int item = atomic_fetch_add(&pool->next_item, 1);
        if (item >= pool->num_items) break;
        pool->fn(pool->ctx, item, worker);
    }
}

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    ar_threadpool *pool = arg->pool;
    int worker = arg->worker;
    free(arg);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mutex);
        while (!pool->quit && pool->generation == seen)
            pthread_cond_wait(&pool->work_posted, &pool->mutex);
        if (pool->quit) {
            pthread_mutex_unlock(&pool->mutex);
            return NULL;
        }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->mutex);

        take_items(pool, worker);

        pthread_mutex_lock(&pool->mutex);
        if (--pool->busy_workers == 0) pthread_cond_signal(&pool->work_done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

ar_threadpool *ar_threadpool_create(int num_threads)
{
    if (num_threads <= 0) num_threads = ar_cpu_count();
    ar_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->num_threads = 1;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->work_posted, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    atomic_init(&pool->next_item, 0);
    if (num_threads > 1) {
        pool->threads = calloc((size_t)num_threads - 1, sizeof *pool->threads);
        if (!pool->threads) { ar_threadpool_destroy(pool); return NULL; }
        for (int i = 1; i < num_threads; i++) {
            worker_arg *arg = malloc(sizeof *arg);
            if (!arg) { ar_threadpool_destroy(pool); return NULL; }
            arg->pool = pool;
            arg->worker = i;
            if (pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
                free(arg);
                ar_threadpool_destroy(pool);
                return NULL;
            }
            pool->num_threads = i + 1;
        }
    }
    return pool;
}

int ar_threadpool_size(const ar_threadpool *pool)
{
    return pool->num_threads;
}

void ar_threadpool_run(ar_threadpool *pool, int num_items, ar_task_fn fn, void *ctx)
{
    if (num_items <= 0) return;
    if (pool->num_threads == 1 || num_items == 1) {
        for (int i = 0; i < num_items; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->num_items = num_items;
    atomic_store(&pool->next_item, 0);
    pool->busy_workers = pool->num_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_posted);
    pthread_mutex_unlock(&pool->mutex);

    take_items(pool, 0);

    pthread_mutex_lock(&pool->mutex);
    while (pool->busy_workers > 0) pthread_cond_wait(&pool->work_done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}

void ar_threadpool_destroy(ar_threadpool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    pool->quit = true;
    pthread_cond_broadcast(&pool->work_posted);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i + 1 < pool->num_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->work_posted);
    pthread_cond_destroy(&pool->work_done);
    free(pool->threads);
    free(pool);
}
