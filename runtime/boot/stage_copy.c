/* The mmap upload's copy loop without the interpreter (runtime/upload_native.py builds and loads this file).

   Threads take pieces from one counter. For each piece a thread waits until one of its own page-locked
   staging slots is free (the event recorded after that slot's last host-to-device copy), copies the piece out
   of the read-only file mapping into the slot, optionally drops the piece's page tables (MADV_DONTNEED: the
   page cache keeps the pages), then issues the slot's asynchronous copy on its own stream and records the
   slot's event. The CUDA driver calls come in as function pointers, so this file needs no CUDA headers and
   the tests can pass host-only stand-ins. The Python copy threads pay the interpreter's lock at every piece;
   here small, cache-resident slots cost nothing per piece but the copies themselves. */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int (*ctx_set_fn)(void *ctx);
typedef int (*copy_fn)(uint64_t dst, const void *src, size_t n, void *stream);
typedef int (*record_fn)(void *event, void *stream);
typedef int (*sync_fn)(void *event);

typedef struct {
    const uint64_t *pieces; /* n rows of (source address, device address, bytes) */
    int64_t n;
    const uint64_t *slots; /* threads x per_thread slot addresses, each slot_bytes, page-locked */
    int per_thread;
    void *const *streams; /* one per thread */
    void *const *events;  /* threads x per_thread */
    void *ctx;
    ctx_set_fn ctx_set;
    copy_fn copy;
    record_fn record;
    sync_fn sync;
    int drop;
    long page;
    int64_t next;        /* the next piece (atomic) */
    int64_t *done_bytes; /* bytes issued so far (atomic; the caller reads it for progress) */
    int error;           /* the first failing driver result (atomic) */
    const int *stop;     /* set by the caller to stop early (an interrupt); read atomically */
    double *stats;       /* per thread: seconds waiting for a slot, copying, issuing */
} job_t;

typedef struct {
    job_t *job;
    int index;
} worker_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(job_t *j, int code) {
    int none = 0;
    __atomic_compare_exchange_n(&j->error, &none, code, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static void drop_pages(const job_t *j, uint64_t addr, uint64_t n) {
    uint64_t lo = (addr + (uint64_t)j->page - 1) / (uint64_t)j->page * (uint64_t)j->page;
    uint64_t hi = (addr + n) / (uint64_t)j->page * (uint64_t)j->page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void *work(void *arg) {
    worker_t *w = arg;
    job_t *j = w->job;
    int t = w->index, k = 0;
    double *st = j->stats + 3 * t;
    char used[64] = {0};
    if (j->ctx_set != NULL) {
        int e = j->ctx_set(j->ctx);
        if (e != 0) {
            fail(j, e);
            return NULL;
        }
    }
    for (;;) {
        if (__atomic_load_n(&j->error, __ATOMIC_RELAXED) != 0) break;
        if (j->stop != NULL && __atomic_load_n(j->stop, __ATOMIC_RELAXED) != 0) break;
        int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n) break;
        const uint64_t *p = j->pieces + 3 * i;
        void *event = j->events[t * j->per_thread + k];
        uint8_t *slot = (uint8_t *)(uintptr_t)j->slots[t * j->per_thread + k];
        double t0 = now();
        if (used[k]) {
            int e = j->sync(event); /* the slot's previous copy has left it */
            if (e != 0) {
                fail(j, e);
                break;
            }
        }
        double t1 = now();
        memcpy(slot, (const void *)(uintptr_t)p[0], (size_t)p[2]);
        if (j->drop) drop_pages(j, p[0], p[2]);
        double t2 = now();
        int e = j->copy(p[1], slot, (size_t)p[2], j->streams[t]);
        if (e == 0) e = j->record(event, j->streams[t]);
        if (e != 0) {
            fail(j, e);
            break;
        }
        used[k] = 1;
        st[0] += t1 - t0;
        st[1] += t2 - t1;
        st[2] += now() - t2;
        __atomic_fetch_add(j->done_bytes, (int64_t)p[2], __ATOMIC_RELAXED);
        k = (k + 1) % j->per_thread;
    }
    for (k = 0; k < j->per_thread; k++) { /* every copy out of this thread's slots has completed */
        if (used[k]) {
            int e = j->sync(j->events[t * j->per_thread + k]);
            if (e != 0) fail(j, e);
        }
    }
    return NULL;
}

/* Copy every piece (or until *stop is set); returns 0, the first failing driver result, or -1 (bad arguments / no
   thread). Every copy it issued has completed when it returns. */
int tfc_stage(const uint64_t *pieces, int64_t n, const uint64_t *slots, int threads, int per_thread,
              void *const *streams, void *const *events, void *ctx, void *ctx_set, void *copy, void *record,
              void *sync, int drop, int64_t *done_bytes, double *stats, const int *stop) {
    if (threads < 1 || per_thread < 1 || per_thread > 64 || copy == NULL || record == NULL || sync == NULL)
        return -1;
    job_t job = {pieces, n, slots, per_thread, streams, events, ctx, (ctx_set_fn)ctx_set, (copy_fn)copy,
                 (record_fn)record, (sync_fn)sync, drop, sysconf(_SC_PAGESIZE), 0, done_bytes, 0, stop, stats};
    pthread_t *ids = calloc((size_t)threads, sizeof(pthread_t));
    worker_t *ws = calloc((size_t)threads, sizeof(worker_t));
    int started = 0;
    if (ids == NULL || ws == NULL) {
        free(ids);
        free(ws);
        return -1;
    }
    for (int t = 0; t < threads; t++) {
        ws[t].job = &job;
        ws[t].index = t;
        if (pthread_create(&ids[t], NULL, work, &ws[t]) != 0) {
            fail(&job, -1);
            break;
        }
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(ids[t], NULL);
    free(ids);
    free(ws);
    return job.error;
}
