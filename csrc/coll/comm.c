/* Communicators: creation and teardown, and point-to-point messages in
 * the communicator's tag space. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

typedef struct stale_arg {
    uint32_t id, epoch;
    bool this_epoch;                /* drop this epoch's, else the others' */
} stale_arg_t;

static bool tag_is_stale(uint64_t tag, void *arg) {
    const stale_arg_t *a = arg;
    if (tag >> COLL_ID_SHIFT != a->id) return false;
    return (((tag >> COLL_EPOCH_SHIFT) & COLL_EPOCH_MAX) == a->epoch) == a->this_epoch;
}

/* Messages of the comm id that no communicator will take would sit in
 * the unexpected queue for good, holding its budget: at create, those
 * of earlier epochs; at destroy, this one's own.  Never a later epoch's:
 * a member may already be posting on the next communicator. */
static void comm_drop_stale(slime_ctx_t *ctx, uint32_t id, uint32_t epoch, bool this_epoch) {
    stale_arg_t a = {id, epoch, this_epoch};
    p2p_drop_unexpected(ctx, tag_is_stale, &a);
}

slime_status_t slime_comm_create(slime_ctx_t *ctx, uint32_t comm_id, uint32_t epoch, int rank,
                                 int size, slime_ep_t *const *peers, int64_t timeout_ms,
                                 slime_comm_t **out) {
    if (out) *out = NULL;
    if (!ctx || !out) return slime_errorf(SLIME_ERR_INVAL, "comm_create: NULL %s", ctx ? "out" : "context");
    if (comm_id > 0xffffu)
        return slime_errorf(SLIME_ERR_INVAL, "comm_create: comm_id %u does not fit in 16 bits", comm_id);
    /* its tag space (top 16 bits all ones) is RPC's: SLIME_RPC_TAG_SPACE */
    if (comm_id == 0xffffu)
        return slime_errorf(SLIME_ERR_INVAL, "comm_create: comm_id 0xffff is reserved for RPC traffic");
    if (epoch > COLL_EPOCH_MAX)
        return slime_errorf(SLIME_ERR_INVAL, "comm_create: epoch %u does not fit in 8 bits", epoch);
    if (size < 1 || rank < 0 || rank >= size)
        return slime_errorf(SLIME_ERR_INVAL, "comm_create: rank %d of size %d", rank, size);
    if (timeout_ms < 0)
        return slime_errorf(SLIME_ERR_INVAL, "comm_create: negative timeout %lld", (long long)timeout_ms);
    if (size > 1 && !peers) return slime_errorf(SLIME_ERR_INVAL, "comm_create: NULL peers for size %d", size);
    for (int r = 0; r < size; r++) {
        if (r == rank) continue;
        if (!peers[r]) return slime_errorf(SLIME_ERR_INVAL, "comm_create: peers[%d] is NULL", r);
        if (p2p_ep_ctx(peers[r]) != ctx)
            return slime_errorf(SLIME_ERR_INVAL, "comm_create: peers[%d] belongs to another context", r);
        for (int q = 0; q < r; q++)
            if (q != rank && peers[q] == peers[r])
                return slime_errorf(SLIME_ERR_INVAL, "comm_create: ranks %d and %d share one endpoint", q, r);
    }

    slime_comm_t *c = calloc(1, sizeof *c);
    slime_ep_t **eps = calloc((size_t)size, sizeof *eps);
    slime_req_t **sends = calloc((size_t)size, sizeof *sends);
    if (!c || !eps || !sends) {
        free(c);
        free(eps);
        free(sends);
        return slime_errorf(SLIME_ERR_NOMEM, "comm_create: out of memory");
    }
    for (int r = 0; r < size; r++) eps[r] = r == rank ? NULL : peers[r];
    c->ctx = ctx;
    c->id = comm_id;
    c->epoch = epoch;
    c->rank = rank;
    c->size = size;
    c->peers = eps;
    c->abort_sends = sends;
    atomic_init(&c->timeout_ms, timeout_ms);
    atomic_init(&c->closing, false);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca; /* the worker's timed waits are on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    list_init(&c->queue);
    c->broken = SLIME_OK;
    comm_drop_stale(ctx, comm_id, epoch, false);
    slime_status_t st = abort_channel_open(c);
    if (st == SLIME_OK && !coll_live_add(c)) {
        abort_channel_close(c);
        st = slime_errorf(SLIME_ERR_NOMEM, "comm_create: out of memory");
    }
    if (st != SLIME_OK) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(sends);
        free(eps);
        free(c);
        return st;
    }
    *out = c;
    return SLIME_OK;
}

void slime_comm_destroy(slime_comm_t *comm) {
    if (!comm) return;
    coll_live_remove(comm); /* no waiter may start a collective of it now */
    coll_worker_stop(comm);
    free(comm->spare_op);
    abort_channel_close(comm);
    pairbox_close(comm);
    comm_drop_stale(comm->ctx, comm->id, comm->epoch, true);
    if (comm->rma_scratch_mr) slime_mr_dereg(comm->rma_scratch_mr);
    free(comm->rma_scratch);
    free(comm->scratch);
    free(comm->abort_sends);
    free(comm->peers);
    pthread_cond_destroy(&comm->cv);
    pthread_mutex_destroy(&comm->mu);
    free(comm);
}

int slime_comm_rank(const slime_comm_t *comm) { return comm ? comm->rank : -1; }
int slime_comm_size(const slime_comm_t *comm) { return comm ? comm->size : 0; }

slime_status_t slime_comm_set_timeout(slime_comm_t *comm, int64_t timeout_ms) {
    if (!comm) return slime_errorf(SLIME_ERR_INVAL, "comm_set_timeout: NULL communicator");
    if (timeout_ms < 0)
        return slime_errorf(SLIME_ERR_INVAL, "comm_set_timeout: negative timeout %lld", (long long)timeout_ms);
    atomic_store(&comm->timeout_ms, timeout_ms);
    return SLIME_OK;
}

int comm_rank_of(const slime_comm_t *comm, const slime_ep_t *ep) {
    if (!ep) return -1;
    for (int r = 0; r < comm->size; r++)
        if (comm->peers[r] == ep) return r;
    return -1;
}

void *comm_scratch(slime_comm_t *comm, size_t len) {
    if (len <= comm->scratch_cap) return comm->scratch;
    void *p = malloc(len);
    if (!p) return NULL;
    free(comm->scratch);
    comm->scratch = p;
    comm->scratch_cap = len;
    return p;
}

void *comm_rma_scratch(slime_comm_t *comm, size_t len, slime_mr_t **mr) {
    if (len <= comm->rma_scratch_cap) {
        *mr = comm->rma_scratch_mr;
        return comm->rma_scratch;
    }
    if (comm->rma_scratch_mr && slime_mr_dereg(comm->rma_scratch_mr) != SLIME_OK) return NULL;
    free(comm->rma_scratch);
    comm->rma_scratch = NULL;
    comm->rma_scratch_mr = NULL;
    comm->rma_scratch_cap = 0;
    void *p = malloc(len);
    if (!p) return NULL;
    if (slime_mr_reg(comm->ctx, p, len, 0, mr) != SLIME_OK) {
        free(p);
        return NULL;
    }
    comm->rma_scratch = p;
    comm->rma_scratch_mr = *mr;
    comm->rma_scratch_cap = len;
    return p;
}

static slime_status_t p2p_check(const slime_comm_t *comm, int peer, const void *buf, size_t len,
                                uint64_t tag, slime_req_t **out, const char *what, bool any_ok) {
    if (out) *out = NULL;
    if (!comm || !out) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL %s", what, comm ? "out" : "communicator");
    if (!buf && len) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL buffer of %zu bytes", what, len);
    if (tag > COLL_USER_TAG_MAX)
        return slime_errorf(SLIME_ERR_INVAL, "%s: tag %#llx does not fit in 39 bits", what,
                            (unsigned long long)tag);
    if (any_ok && peer == SLIME_ANY_SOURCE) return SLIME_OK;
    if (peer < 0 || peer >= comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "%s: peer %d out of range [0, %d)", what, peer, comm->size);
    if (peer == comm->rank)
        return slime_errorf(SLIME_ERR_INVAL, "%s: peer %d is this rank (no endpoint to itself)", what, peer);
    return SLIME_OK;
}

slime_status_t slime_comm_send(slime_comm_t *comm, int peer, const void *buf, size_t len,
                               uint64_t tag, slime_req_t **out) {
    slime_status_t st = p2p_check(comm, peer, buf, len, tag, out, "comm_send", false);
    if (st != SLIME_OK) return st;
    return slime_send(comm->peers[peer], buf, len, comm_user_tag(comm, tag), out);
}

slime_status_t slime_comm_recv(slime_comm_t *comm, int peer, void *buf, size_t cap, uint64_t tag,
                               slime_req_t **out) {
    slime_status_t st = p2p_check(comm, peer, buf, cap, tag, out, "comm_recv", true);
    if (st != SLIME_OK) return st;
    if (peer == SLIME_ANY_SOURCE) return slime_recv_any(comm->ctx, buf, cap, comm_user_tag(comm, tag), out);
    return slime_recv(comm->peers[peer], buf, cap, comm_user_tag(comm, tag), out);
}

int slime_comm_req_source(const slime_comm_t *comm, const slime_req_t *req) {
    if (!comm || !req) return -1;
    return comm_rank_of(comm, slime_req_ep(req));
}
