/* threadpool.h - a small persistent pthread pool for the CPU backends.
 *
 * ar_threadpool_run(pool, num_items, fn, ctx) calls fn(ctx, item, worker) once for every item
 * in 0..num_items-1, spread over the pool's threads (the calling thread works too, as worker 0),
 * and returns when all items are done.  Items are handed out one at a time from a shared
 * counter, so uneven items balance themselves.  `worker` (0..num_threads-1) lets a task use
 * per-thread scratch memory without locking.  One run at a time per pool. */
#ifndef AR_THREADPOOL_H
#define AR_THREADPOOL_H

typedef struct ar_threadpool ar_threadpool;
typedef void (*ar_task_fn)(void *ctx, int item, int worker);

/* num_threads <= 0 means all online cores.  Returns NULL when threads cannot be started. */
ar_threadpool *ar_threadpool_create(int num_threads);
int ar_threadpool_size(const ar_threadpool *pool);
void ar_threadpool_run(ar_threadpool *pool, int num_items, ar_task_fn fn, void *ctx);
void ar_threadpool_destroy(ar_threadpool *pool);
/* Online cores (at least 1). */
int ar_cpu_count(void);

#endif
