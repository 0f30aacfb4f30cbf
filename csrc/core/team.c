/* A copy team: helper threads that split one large chunked job with the
 * thread that runs it, fork-join.
 *
 * Why: a one-sided op on shm is one process copying with
 * process_vm_readv/writev while the target does nothing, and one core
 * copies at half the speed of two (the copy is bound by per-core page
 * walks and stores, not by memory bandwidth).  The thread that drives
 * progress for a large op hands out its chunks to the team and copies
 * chunks itself; it returns only when every chunk is done, so whatever
 * the chunks touch (the endpoint, the peer's mapped MR table) stays
 * alive, guarded by whatever the caller holds, for the whole job.
 *
 * Helpers start on first use (a context that never moves a large
 * one-sided op never starts one) and sleep on a condition variable
 * between jobs; a job already running (another thread's) makes the
 * caller run its own job alone rather than wait.
 */
#include "internal.h"

#include <stdlib.h>
#include <unistd.h>

#define TEAM_MAX_HELPERS 7

struct team {
    pthread_mutex_t mtx;
    pthread_cond_t job_cond;   /* helpers wait here for a job */
    pthread_cond_t done_cond;  /* the caller waits here for helpers to leave */
    pthread_t threads[TEAM_MAX_HELPERS];
    int n_threads;
    bool stop;
    /* the current job; fields are written under mtx before `open` */
    bool open;
    uint64_t gen;
    int inside;                /* helpers working on the job */
    team_chunk_fn fn;
    void *arg;
    size_t total, chunk;
    _Atomic size_t next;
    _Atomic int status;
    bool busy;                 /* a caller owns the job slot */
};

/* Claims chunks until none are left or one failed. */
static void team_work(team_t *t) {
    for (;;) {
        size_t off = atomic_fetch_add(&t->next, t->chunk);
        if (off >= t->total || atomic_load(&t->status) != SLIME_OK) return;
        size_t len = min_sz(t->chunk, t->total - off);
        slime_status_t st = t->fn(t->arg, off, len);
        if (st != SLIME_OK) {
            int ok = SLIME_OK;
            atomic_compare_exchange_strong(&t->status, &ok, (int)st);
        }
    }
}

static void *team_helper(void *arg) {
    team_t *t = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mtx);
    for (;;) {
        while (!t->stop && !(t->open && t->gen != seen)) pthread_cond_wait(&t->job_cond, &t->mtx);
        if (t->stop) break;
        seen = t->gen;
        t->inside++;
        pthread_mutex_unlock(&t->mtx);
        team_work(t);
        pthread_mutex_lock(&t->mtx);
        if (--t->inside == 0) pthread_cond_signal(&t->done_cond);
    }
    pthread_mutex_unlock(&t->mtx);
    return NULL;
}

/* Helpers wanted: DLSLIME_COPY_THREADS, else one per other online core
 * (at most 3: beyond that the copy is memory-bound anyway). */
static int team_helpers_wanted(void) {
    const char *env = getenv("DLSLIME_COPY_THREADS");
    if (env && *env) {
        long n = strtol(env, NULL, 10);
        return n < 0 ? 0 : n > TEAM_MAX_HELPERS ? TEAM_MAX_HELPERS : (int)n;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus <= 1 ? 0 : cpus - 1 > 3 ? 3 : (int)(cpus - 1);
}

static team_t *team_start(void) {
    int want = team_helpers_wanted();
    if (want == 0) return NULL;
    team_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mtx, NULL);
    pthread_cond_init(&t->job_cond, NULL);
    pthread_cond_init(&t->done_cond, NULL);
    for (int i = 0; i < want; i++) {
        if (pthread_create(&t->threads[i], NULL, team_helper, t) != 0) break;
        t->n_threads++;
    }
    if (t->n_threads == 0) { /* no threads to be had: copy alone */
        team_destroy(t);
        return NULL;
    }
    return t;
}

void team_destroy(team_t *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mtx);
    t->stop = true;
    pthread_cond_broadcast(&t->job_cond);
    pthread_mutex_unlock(&t->mtx);
    for (int i = 0; i < t->n_threads; i++) pthread_join(t->threads[i], NULL);
    pthread_cond_destroy(&t->job_cond);
    pthread_cond_destroy(&t->done_cond);
    pthread_mutex_destroy(&t->mtx);
    free(t);
}

/* The context's team, started on first call; NULL when there is none. */
static team_t *ctx_team(slime_ctx_t *ctx) {
    team_t *t = atomic_load_explicit(&ctx->team, memory_order_acquire);
    if (t || atomic_load(&ctx->team_failed)) return t;
    pthread_mutex_lock(&ctx->team_mtx);
    t = atomic_load(&ctx->team);
    if (!t && !atomic_load(&ctx->team_failed)) {
        t = team_start();
        if (t) atomic_store_explicit(&ctx->team, t, memory_order_release);
        else atomic_store(&ctx->team_failed, true);
    }
    pthread_mutex_unlock(&ctx->team_mtx);
    return t;
}

slime_status_t team_run(slime_ctx_t *ctx, team_chunk_fn fn, void *arg, size_t total, size_t chunk) {
    team_t *t = total > chunk ? ctx_team(ctx) : NULL;
    if (t) {
        pthread_mutex_lock(&t->mtx);
        if (t->busy) { /* another caller's job: ours runs alone */
            pthread_mutex_unlock(&t->mtx);
            t = NULL;
        } else {
            t->busy = true;
        }
    }
    if (!t) {
        for (size_t off = 0; off < total; off += chunk) {
            slime_status_t st = fn(arg, off, min_sz(chunk, total - off));
            if (st != SLIME_OK) return st;
        }
        return SLIME_OK;
    }
    t->fn = fn;
    t->arg = arg;
    t->total = total;
    t->chunk = chunk;
    atomic_store(&t->next, 0);
    atomic_store(&t->status, SLIME_OK);
    t->gen++;
    t->open = true;
    pthread_cond_broadcast(&t->job_cond);
    pthread_mutex_unlock(&t->mtx);

    team_work(t);

    pthread_mutex_lock(&t->mtx);
    t->open = false; /* a helper that wakes late finds no job */
    while (t->inside > 0) pthread_cond_wait(&t->done_cond, &t->mtx);
    t->busy = false;
    slime_status_t st = (slime_status_t)atomic_load(&t->status);
    pthread_mutex_unlock(&t->mtx);
    return st;
}
