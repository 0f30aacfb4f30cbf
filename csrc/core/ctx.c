/* Contexts: creation (listeners, MR table, progress thread), teardown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/md.h"
#include "transport/transport.h"
#include "transport/verbs.h"
#include "transport/verbs.h"

void slime_ctx_opts_init(slime_ctx_opts_t *opts) {
    if (opts) memset(opts, 0, sizeof *opts);
}

static slime_status_t parse_transport(const char *name, int *force) {
    if (!name || !*name || strcmp(name, "auto") == 0) { *force = 0; return SLIME_OK; }
    if (strcmp(name, "tcp") == 0) { *force = WIRE_TRANSPORT_TCP; return SLIME_OK; }
    if (strcmp(name, "shm") == 0) { *force = WIRE_TRANSPORT_SHM; return SLIME_OK; }
    if (strcmp(name, "verbs") == 0) { *force = WIRE_TRANSPORT_VERBS; return SLIME_OK; }
    return slime_errorf(SLIME_ERR_INVAL, "unknown transport '%s' (expected auto, shm, tcp or verbs)", name);
}

static void watch(slime_ctx_t *ctx, int fd, pollable_t *p, enum pollable_kind kind) {
    p->kind = kind;
    p->obj = ctx;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};
    epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev);
}

slime_status_t slime_ctx_create(const slime_ctx_opts_t *opts, slime_ctx_t **out) {
    if (out) *out = NULL;
    if (!out) return slime_errorf(SLIME_ERR_INVAL, "ctx_create: NULL output");
    slime_ctx_opts_t dflt;
    slime_ctx_opts_init(&dflt);
    if (!opts) opts = &dflt;
    int force = 0;
    slime_status_t st = parse_transport(opts->transport ? opts->transport : getenv("DLSLIME_TRANSPORT"), &force);
    if (st != SLIME_OK) return st;

    slime_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return slime_errorf(SLIME_ERR_NOMEM, "ctx_create");
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->sleep_mtx, NULL);
    pthread_mutex_init(&ctx->team_mtx, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ctx->sleep_cond, &ca);
    pthread_cond_init(&ctx->worker_cond, &ca);
    pthread_condattr_destroy(&ca);
    list_init(&ctx->pending_conns);
    list_init(&ctx->eps);
    list_init(&ctx->accepted);
    list_init(&ctx->posted);
    list_init(&ctx->unexpected);
    list_init(&ctx->mrs);
    list_init(&ctx->callbacks);
    ctx->epfd = ctx->pt_epfd = ctx->wakefd = ctx->tcp_listen_fd = ctx->shm_listen_fd = ctx->mr_fd = -1;
    do ctx->id = random_u64(); while (ctx->id == 0);
    ctx->force = force;

    const void *tok = opts->token;
    size_t toklen = opts->token_len;
    if (!tok) {
        tok = getenv("DLSLIME_TOKEN");
        toklen = tok ? strlen(tok) : 0;
    }
    ctx->proof = token_digest("dlslime-hello-1", tok ? tok : "", toklen);
    ctx->job = token_digest("dlslime-job-1", tok ? tok : "", toklen);
    ctx->eager_tcp = env_size("DLSLIME_EAGER_TCP", 256 * 1024);
    ctx->eager_shm = env_size("DLSLIME_EAGER_SHM", 64 * 1024);
    ctx->eager_verbs = env_size("DLSLIME_EAGER_VERBS", 64 * 1024);
    ctx->unexp_cap = env_size("DLSLIME_UNEXPECTED_MAX", 256u << 20);

    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->pt_epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->pt_epfd < 0 || ctx->wakefd < 0) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    ctx->p_wake.kind = POLL_WAKE;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctx->p_wake};
    struct epoll_event nested = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(ctx->pt_epfd, EPOLL_CTL_ADD, ctx->wakefd, &ev) < 0 ||
        epoll_ctl(ctx->pt_epfd, EPOLL_CTL_ADD, ctx->epfd, &nested) < 0) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: epoll: %s", strerror(errno));
        goto fail;
    }
    if ((st = mr_table_create(&ctx->mr_fd, &ctx->mr_table)) != SLIME_OK) goto fail;
    if ((st = shmem_table_add(ctx->mr_table)) != SLIME_OK) {
        munmap(ctx->mr_table, sizeof(mr_shared_t));
        ctx->mr_table = NULL;
        goto fail;
    }
    /* before any MR exists: every region is registered with the device */
    if ((st = verbs_open(ctx, force == WIRE_TRANSPORT_VERBS)) != SLIME_OK) goto fail;
    if ((st = md_open_all(ctx)) != SLIME_OK) goto fail; /* a device's domain needs its device */

    const char *host = opts->tcp_host ? opts->tcp_host : getenv("DLSLIME_HOST");
    uint16_t port = 0;
    if ((st = tcp_listen(ctx, host, opts->tcp_port, &ctx->tcp_listen_fd, &port)) != SLIME_OK) goto fail;
    watch(ctx, ctx->tcp_listen_fd, &ctx->p_tcp, POLL_TCP_LISTEN);
    if (force != WIRE_TRANSPORT_TCP && force != WIRE_TRANSPORT_VERBS) {
        if ((st = shm_listen(ctx, &ctx->shm_listen_fd)) != SLIME_OK) goto fail;
        watch(ctx, ctx->shm_listen_fd, &ctx->p_shm, POLL_SHM_LISTEN);
    }
    if ((st = address_init(ctx, host, ctx->shm_listen_fd >= 0)) != SLIME_OK) goto fail;
    ctx->addr.tcp_port = port;
    if (ctx->verbs) ctx->addr.flags |= ADDR_HAS_VERBS;

    int e = pthread_create(&ctx->thread, NULL, progress_thread_main, ctx);
    if (e) { st = slime_errorf(SLIME_ERR_SYSTEM, "ctx_create: progress thread: %s", strerror(e)); goto fail; }
    *out = ctx;
    return SLIME_OK;
fail:
    md_close_all(ctx);
    verbs_close(ctx);
    if (ctx->tcp_listen_fd >= 0) close(ctx->tcp_listen_fd);
    if (ctx->shm_listen_fd >= 0) close(ctx->shm_listen_fd);
    if (ctx->mr_table) {
        shmem_table_remove(ctx->mr_table);
        munmap(ctx->mr_table, sizeof(mr_shared_t));
    }
    if (ctx->mr_fd >= 0) close(ctx->mr_fd);
    if (ctx->wakefd >= 0) close(ctx->wakefd);
    if (ctx->epfd >= 0) close(ctx->epfd);
    if (ctx->pt_epfd >= 0) close(ctx->pt_epfd);
    pthread_cond_destroy(&ctx->sleep_cond);
    pthread_cond_destroy(&ctx->worker_cond);
    pthread_mutex_destroy(&ctx->sleep_mtx);
    pthread_mutex_destroy(&ctx->team_mtx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return st;
}

void slime_ctx_destroy(slime_ctx_t *ctx) {
    if (!ctx) return;
    atomic_store(&ctx->stop, true);
    ctx_kick(ctx);
    pthread_join(ctx->thread, NULL);

    pthread_mutex_lock(&ctx->lock);
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
        mr->ctx = NULL; /* the caller may still deregister (free) it */
        md_mr_unreg(ctx, mr); /* the domains close below */
    }
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
    list_for_each_safe(pos, tmp, &ctx->eps) ep_free(container_of(pos, slime_ep_t, link));
    md_close_all(ctx);
    verbs_close(ctx);

    close(ctx->tcp_listen_fd);
    if (ctx->shm_listen_fd >= 0) close(ctx->shm_listen_fd);
    shmem_table_remove(ctx->mr_table);
    munmap(ctx->mr_table, sizeof(mr_shared_t));
    close(ctx->mr_fd);
    close(ctx->wakefd);
    close(ctx->epfd);
    close(ctx->pt_epfd);
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

uint64_t slime_ctx_id(const slime_ctx_t *ctx) { return ctx ? ctx->id : 0; }

uint64_t slime_ctx_counter(const slime_ctx_t *ctx, slime_counter_t which) { return ctx ? verbs_counter(ctx, which) : 0; }
