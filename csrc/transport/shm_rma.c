/* One-sided ops of a shm connection, copied by the initiator alone:
 * with memcpy where the peer's block is mapped here (shm_peermap.c), else
 * by CMA (process_vm_readv/writev), each access checked against the
 * peer's MR table and pinned there while it copies. */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "transport/shm_internal.h"

/* One-sided ops are copied in pieces of this size by the context's copy
 * team (core/team.c): one core alone copies at half the speed of two,
 * and small pieces let the caller take most of them while a helper is
 * still waking up.  Below the team minimum the caller copies alone, as
 * waking a helper costs more than it saves: a mapped block is copied
 * with memcpy, where a helper pays only from 2 MiB; CMA of a registered
 * region, which is on huge pages (core/md_host.c), ran one core at
 * 27 GB/s, and 1-2 MiB ops took 47-49 / 87-91 us alone against 57-76 /
 * 99-103 us with the team (rdma_bench, measured alternately). */
#define RMA_PIECE (512u << 10)
#define MAPPED_TEAM_MIN (2u << 20)
#define CMA_TEAM_MIN (4u << 20)

/* A share of a one-sided op, copied by whichever team thread claims it:
 * with memcpy where the peer's block is mapped here (shm_peermap.c),
 * else by CMA.  The op's range is pinned in the peer's table meanwhile. */
typedef struct rma_job {
    shm_conn_t *c;
    slime_req_t *req;
    size_t base;               /* offset in req of the job's first byte */
    uint64_t raddr;            /* where that byte is in the peer */
    uint8_t *mapped;           /* ...and here, when mapped; else NULL */
    _Atomic int err;           /* errno of the first failed copy, or 0 */
} rma_job_t;

static slime_status_t rma_piece(void *arg, size_t off, size_t len) {
    rma_job_t *j = arg;
    slime_req_t *req = j->req;
    uint8_t *local = (uint8_t *)req->buf + j->base + off;
    if (j->mapped) {
        uint8_t *dst = req->is_write ? j->mapped + off : local;
        const uint8_t *src = req->is_write ? local : j->mapped + off;
        /* an op past the cache (the size the rings take over at for CMA)
         * streams its stores, as the rings' reader does: two streams of
         * memory traffic instead of three */
        if (req->len > CMA_MAX) shm_copy_stream(dst, src, len);
        else memcpy(dst, src, len);
        return SLIME_OK;
    }
    uint64_t raddr = j->raddr + off;
    while (len) {
        struct iovec l = {.iov_base = local, .iov_len = len};
        struct iovec r = {.iov_base = (void *)(uintptr_t)raddr, .iov_len = len};
        ssize_t n = req->is_write ? process_vm_writev(j->c->peer_pid, &l, 1, &r, 1, 0)
                                  : process_vm_readv(j->c->peer_pid, &l, 1, &r, 1, 0);
        if (n <= 0) { /* 0: nothing moved, which a valid range never gives */
            int first = 0;
            atomic_compare_exchange_strong(&j->err, &first, n < 0 ? errno : EFAULT);
            return SLIME_ERR_ACCESS;
        }
        local += n;
        raddr += (uint64_t)n;
        len -= (size_t)n;
    }
    return SLIME_OK;
}

/* A batch of small one-sided ops costs a system call each, and the
 * call's fixed part (finding the peer's mm, importing the iovecs) is
 * most of a small op's time.  So the small CMA ops queued right behind
 * the head of the queue in its direction are copied with it in one
 * process_vm_readv/writev; each copied whole is marked done, which
 * leaves shm_rma only its completion.  An op that does not fit (large,
 * mapped, refused by the region table) ends the run; a call that fails
 * or copies short leaves the rest to the one-by-one path, which reports
 * errors op by op (a partial copy never splits an iovec). */
#define COALESCE_OP_MAX (64u << 10)
#define COALESCE_OPS 256 /* iovecs a call, under IOV_MAX */

static void rma_coalesce(slime_ep_t *ep, slime_req_t *head) {
    shm_conn_t *c = ep->conn;
    struct iovec l[COALESCE_OPS], r[COALESCE_OPS];
    slime_req_t *reqs[COALESCE_OPS];
    size_t n = 0;
    unsigned access = head->is_write ? SLIME_ACCESS_REMOTE_WRITE : SLIME_ACCESS_REMOTE_READ;
    for (slime_list_t *it = &head->qlink; it != &ep->rmaq && n < COALESCE_OPS; it = it->next) {
        slime_req_t *q = container_of(it, slime_req_t, qlink);
        uint64_t raddr;
        char why[160];
        if (q->done || q->len > COALESCE_OP_MAX || q->is_write != head->is_write) break;
        if (shm_pin(c, q->r_handle, q->r_rkey, q->r_off, q->len, access, &raddr, why, sizeof why) != SLIME_OK)
            break;
        if (peermap_lookup(c->map, &c->peer->slots[(uint32_t)(q->r_handle >> 32)], raddr, q->len)) {
            shm_unpin(c, q->r_handle); /* memcpy serves it */
            break;
        }
        l[n] = (struct iovec){.iov_base = q->buf, .iov_len = q->len};
        r[n] = (struct iovec){.iov_base = (void *)(uintptr_t)raddr, .iov_len = q->len};
        reqs[n++] = q;
    }
    if (n >= 2) {
        ssize_t got = head->is_write ? process_vm_writev(c->peer_pid, l, n, r, n, 0)
                                     : process_vm_readv(c->peer_pid, l, n, r, n, 0);
        for (size_t i = 0; i < n && got >= (ssize_t)reqs[i]->len; i++) {
            reqs[i]->done = reqs[i]->len;
            got -= (ssize_t)reqs[i]->len;
        }
    }
    for (size_t i = 0; i < n; i++) shm_unpin(c, reqs[i]->r_handle);
}

slime_status_t shm_rma(slime_ep_t *ep, slime_req_t *req, size_t max) {
    shm_conn_t *c = ep->conn;
    if (!c->cma) return SLIME_ERR_UNSUPPORTED;
    /* the head of the queue (which rma is always given) with ops behind it */
    if (req->done == 0 && req->len <= COALESCE_OP_MAX && req->qlink.next != &ep->rmaq)
        rma_coalesce(ep, req);
    while (req->done < req->len && max) {
        size_t k = min_sz(req->len - req->done, max);
        rma_job_t j = {.c = c, .req = req, .base = req->done};
        char why[160];
        slime_status_t st = shm_pin(c, req->r_handle, req->r_rkey, req->r_off + req->done, k,
                                    req->is_write ? SLIME_ACCESS_REMOTE_WRITE : SLIME_ACCESS_REMOTE_READ, &j.raddr,
                                    why, sizeof why);
        if (st != SLIME_OK) {
            req_complete(req, st, "remote region: %s", why);
            return st;
        }
        j.mapped = peermap_lookup(c->map, &c->peer->slots[(uint32_t)(req->r_handle >> 32)], j.raddr, k);
        if (!j.mapped && req->done == 0 && req->len > c->cma_max) {
            shm_unpin(c, req->r_handle);
            return SLIME_ERR_UNSUPPORTED; /* by the rings, see CMA_MAX */
        }
        st = team_run(ep->ctx, rma_piece, &j, k, k < (j.mapped ? MAPPED_TEAM_MIN : CMA_TEAM_MIN) ? k : RMA_PIECE);
        shm_unpin(c, req->r_handle);
        if (st == SLIME_OK) {
            req->done += k;
            max -= k;
            continue;
        }
        int err = atomic_load(&j.err);
        if (err == EPERM || err == ENOSYS || err == EACCES) {
            c->cma = false; /* the frames path will serve it, from the start */
            return SLIME_ERR_UNSUPPORTED;
        }
        if (err == ESRCH) {
            ep_fail(ep, SLIME_ERR_PEER_LOST, "peer process is gone");
            return SLIME_ERR_PEER_LOST;
        }
        req_complete(req, SLIME_ERR_ACCESS, "cross-memory %s failed: %s",
                     req->is_write ? "write" : "read", strerror(err));
        return SLIME_ERR_ACCESS;
    }
    return req->done < req->len ? SLIME_INPROGRESS : SLIME_OK;
}
