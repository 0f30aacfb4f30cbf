/* Contexts: creation (epoll sets, MR table, transports, progress thread)
 * and teardown.  Both are built from the same steps: creation unwinds
 * the ones it took, in reverse, and destroy takes them all down. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/md.h"

void slime_ctx_opts_init(slime_ctx_opts_t *opts) {
    if (opts) memset(opts, 0, sizeof *opts);
}

/* The context object itself: its locks, lists and identity. */
static slime_ctx_t *ctx_alloc(const slime_ctx_opts_t *opts, int force) {
    slime_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->sleep_mtx, NULL);
    pthread_mutex_init(&ctx->team_mtx, NULL);
    cond_init_monotonic(&ctx->sleep_cond);
    cond_init_monotonic(&ctx->worker_cond);
    list_init(&ctx->pending_conns);
    list_init(&ctx->eps);
    list_init(&ctx->accepted);
    list_init(&ctx->posted);
    list_init(&ctx->unexpected);
    list_init(&ctx->mrs);
    list_init(&ctx->callbacks);
    ctx->epfd = ctx->pt_epfd = ctx->wakefd = ctx->mr_fd = -1;
    context_id_init(ctx);
    ctx->force = force;
    token_init(ctx, opts->token, opts->token_len);
    ctx->unexp_cap = env_size("DLSLIME_UNEXPECTED_MAX", 256u << 20);
    wake_fence_register(ctx);
    budget_init(ctx);
    address_init(ctx);
    return ctx;
}

static void ctx_free(slime_ctx_t *ctx) {
    free(ctx->ids);
    free(ctx->id_gen);
    free(ctx->id_free);
    pthread_cond_destroy(&ctx->sleep_cond);
    pthread_cond_destroy(&ctx->worker_cond);
    pthread_mutex_destroy(&ctx->sleep_mtx);
    pthread_mutex_destroy(&ctx->team_mtx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static void epoll_close(slime_ctx_t *ctx) {
    close_fd(&ctx->wakefd);
    close_fd(&ctx->epfd);
    close_fd(&ctx->pt_epfd);
}

/* The epoll set of connections and listeners, nested in the one the
 * progress thread sleeps on, with the eventfd that wakes it. */
static slime_status_t epoll_open(slime_ctx_t *ctx) {
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->pt_epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->pt_epfd < 0 || ctx->wakefd < 0) {
        slime_status_t st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: epoll/eventfd: %s", strerror(errno));
        epoll_close(ctx);
        return st;
    }
    ctx->p_wake.kind = POLL_WAKE;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctx->p_wake};
    struct epoll_event nested = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(ctx->pt_epfd, EPOLL_CTL_ADD, ctx->wakefd, &ev) < 0 ||
        epoll_ctl(ctx->pt_epfd, EPOLL_CTL_ADD, ctx->epfd, &nested) < 0) {
        slime_status_t st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: epoll: %s", strerror(errno));
        epoll_close(ctx);
        return st;
    }
    return SLIME_OK;
}

static slime_status_t mrs_open(slime_ctx_t *ctx) {
    if (!(ctx->mr_slots = calloc(MR_TABLE_SLOTS, sizeof *ctx->mr_slots)))
        return slime_errorf(SLIME_ERR_NOMEM, "ctx_create: region slots");
    slime_status_t st = mr_table_create(&ctx->mr_fd, &ctx->mr_table);
    if (st == SLIME_OK && (st = shmem_table_add(ctx->mr_table)) != SLIME_OK) {
        munmap(ctx->mr_table, sizeof(mr_shared_t));
        close_fd(&ctx->mr_fd);
    }
    if (st != SLIME_OK) {
        free(ctx->mr_slots);
        ctx->mr_slots = NULL;
    }
    return st;
}

static void mrs_close(slime_ctx_t *ctx) {
    shmem_table_remove(ctx->mr_table);
    munmap(ctx->mr_table, sizeof(mr_shared_t));
    close_fd(&ctx->mr_fd);
    free(ctx->mr_slots);
    ctx->mr_slots = NULL;
}

slime_status_t slime_ctx_create(const slime_ctx_opts_t *opts, slime_ctx_t **out) {
    if (out) *out = NULL;
    if (!out) return slime_errorf(SLIME_ERR_INVAL, "ctx_create: NULL output");
    slime_ctx_opts_t dflt;
    slime_ctx_opts_init(&dflt);
    if (!opts) opts = &dflt;
    /* any process that finds our listener can present the empty token */
    if (opts->token && !opts->token_len)
        return slime_errorf(SLIME_ERR_INVAL, "ctx_create: an empty token would let in anyone; pass none (NULL) "
                                             "for a random token of the context's own");
    int force = 0;
    slime_status_t st = transports_parse(opts->transport ? opts->transport : getenv("DLSLIME_TRANSPORT"), &force);
    if (st != SLIME_OK) return st;
    uint64_t silence_ns;
    if ((st = live_silence_env(&silence_ns)) != SLIME_OK) return st;
    slime_ctx_t *ctx = ctx_alloc(opts, force);
    if (!ctx) return slime_errorf(SLIME_ERR_NOMEM, "ctx_create");
    ctx->silence_ns = silence_ns;
    if ((st = epoll_open(ctx)) != SLIME_OK) goto fail_epoll;
    if ((st = mrs_open(ctx)) != SLIME_OK) goto fail_mrs;
    /* before any MR exists: a transport may register every region */
    if ((st = transports_open(ctx, opts)) != SLIME_OK) goto fail_transports;
    /* a device's memory domain needs its transport's device */
    if ((st = md_open_all(ctx)) != SLIME_OK) goto fail_mds;
    int e = pthread_create(&ctx->thread, NULL, progress_thread_main, ctx);
    if (e) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: progress thread: %s", strerror(e));
        goto fail_thread;
    }
    *out = ctx;
    return SLIME_OK;
fail_thread:
    md_close_all(ctx);
fail_mds:
    transports_close(ctx);
fail_transports:
    mrs_close(ctx);
fail_mrs:
    epoll_close(ctx);
fail_epoll:
    ctx_free(ctx);
    return st;
}

/* Under ctx->lock, the progress thread gone: every endpoint, request,
 * queued message and pending connection fails; regions stay the
 * caller's to deregister. */
static void fail_everything(slime_ctx_t *ctx) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps)
        ep_fail(container_of(pos, slime_ep_t, link), SLIME_ERR_CLOSED, "context destroyed");
    while (!list_empty(&ctx->posted))
        req_complete(container_of(ctx->posted.next, slime_req_t, qlink), SLIME_ERR_CLOSED, "context destroyed");
    while (!list_empty(&ctx->unexpected)) umsg_free(ctx, container_of(ctx->unexpected.next, umsg_t, link));
    while (!list_empty(&ctx->pending_conns))
        pending_conn_close(ctx, container_of(ctx->pending_conns.next, pending_conn_t, link));
    while (!list_empty(&ctx->mrs)) {
        slime_mr_t *mr = container_of(ctx->mrs.next, slime_mr_t, link);
        list_del(&mr->link);
        ctx->mr_slots[mr->slot] = NULL;
        mr->ctx = NULL; /* the caller may still deregister (free) it */
        md_mr_unreg(ctx, mr); /* the domains close below */
    }
}

void slime_ctx_destroy(slime_ctx_t *ctx) {
    if (!ctx) return;
    ep_linger(ctx, NULL);
    atomic_store(&ctx->stop, true);
    ctx_kick(ctx);
    pthread_join(ctx->thread, NULL);
    pthread_mutex_lock(&ctx->lock);
    fail_everything(ctx);
    pthread_mutex_unlock(&ctx->lock);
    run_callbacks(ctx); /* the progress thread is gone: the last ones here */
    atomic_store(&ctx->closed, true);
    /* threads still inside a wait see closed (or their request failed) and
     * leave within one sleep slice; free nothing they may touch before */
    while (atomic_load(&ctx->users) > 0) {
        pthread_mutex_lock(&ctx->sleep_mtx);
        pthread_cond_broadcast(&ctx->sleep_cond);
        pthread_cond_broadcast(&ctx->worker_cond);
        pthread_mutex_unlock(&ctx->sleep_mtx);
        usleep(1000);
    }
    team_destroy(atomic_load(&ctx->team)); /* no thread is in a copy now */
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps) ep_orphan(container_of(pos, slime_ep_t, link));
    md_close_all(ctx);
    transports_close(ctx);
    mrs_close(ctx);
    epoll_close(ctx);
    ctx_free(ctx);
}

uint64_t slime_ctx_id(const slime_ctx_t *ctx) { return ctx ? ctx->id : 0; }

int p2p_affinity_cpus(void) {
    static _Atomic int cached;
    int v = atomic_load(&cached);
    if (!v) {
        cpu_set_t set;
        v = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (v < 1) v = 1;
        atomic_store(&cached, v);
    }
    return v;
}

bool ctx_crowded(const slime_ctx_t *ctx) {
    return atomic_load_explicit(&ctx->n_local_eps, memory_order_relaxed) + 1 > p2p_affinity_cpus();
}

uint64_t slime_ctx_counter(const slime_ctx_t *ctx, slime_counter_t which) {
    if (ctx && which == SLIME_COUNTER_PEER_PINGS) return atomic_load(&ctx->live_pings);
    if (ctx && which == SLIME_COUNTER_UNEXPECTED_COPIES) return atomic_load(&ctx->unexp_copies);
    if (ctx && which == SLIME_COUNTER_PARKED) return atomic_load(&ctx->parks);
    if (ctx && which == SLIME_COUNTER_BOX_OPS) return atomic_load(&ctx->box_ops);
    if (ctx && which == SLIME_COUNTER_RENDEZVOUS) return atomic_load(&ctx->rndv_sends);
    return ctx ? transports_counter(ctx, which) : 0;
}
