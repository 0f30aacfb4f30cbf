/* The messages of the collective the worker is running: posted in the
 * communicator's tag space under the collective's sequence number,
 * waited for against the collective's deadline, and on failure cleaned
 * up so that nothing is left writing into the caller's buffers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* After a failure, how long sends to live peers and receives already
 * moving data get to finish before they are detached. */
#define RELEASE_GRACE_MS 500

void run_init(coll_run_t *r, slime_comm_t *comm, const coll_op_t *op) {
    /* field by field: a memset would clear the kilobyte of detail too,
     * for every small collective */
    r->comm = comm;
    r->op = op;
    r->x = NULL;
    r->nx = r->cap = 0;
    r->detail[0] = 0;
    r->timeout_ms = atomic_load(&comm->timeout_ms);
    r->deadline_ns = 0; /* run_deadline */
    r->phase = op->name;
    r->status = SLIME_OK;
}

uint64_t run_deadline(coll_run_t *r, uint64_t now) {
    if (r->deadline_ns) return r->deadline_ns;
    /* a timeout of centuries means "no deadline", not an overflow */
    r->deadline_ns = (uint64_t)r->timeout_ms >= (UINT64_MAX - now) / 1000000ull
                         ? UINT64_MAX
                         : now + (uint64_t)r->timeout_ms * 1000000ull;
    return r->deadline_ns;
}

static bool vfail(coll_run_t *r, slime_status_t st, const char *fmt, va_list ap) {
    if (r->status != SLIME_OK) return false; /* the first cause is the one to tell */
    char why[800];
    vsnprintf(why, sizeof why, fmt, ap);
    r->status = st;
    snprintf(r->detail, sizeof r->detail, "%s: %s", coll_what(r->op).text, why);
    /* now, not when the run returns: the algorithm's clean-up then
     * deregisters its regions, and a member reading from one must find
     * our notice on its way before it finds the region gone */
    comm_break(r->comm, st, r->detail);
    return false;
}

bool run_fail(coll_run_t *r, slime_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(r, st, fmt, ap);
    va_end(ap);
    return false;
}

static bool fail_at(coll_run_t *r, slime_status_t st, const xfer_t *x, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail_at(coll_run_t *r, slime_status_t st, const xfer_t *x, const char *fmt, ...) {
    char why[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    /* the last steps name messages outside the algorithm's rounds */
    static const char *const last[] = {"to-root", "link set-up", "end-of-reads", "box offer"};
    char step[32];
    uint32_t from_top = COLL_STEP_LIMIT - 1 - x->step;
    if (from_top < 4)
        snprintf(step, sizeof step, "%s", last[from_top]);
    else
        snprintf(step, sizeof step, "%u", x->step);
    return run_fail(r, st, "%s step %s: %s rank %d: %s", r->phase, step,
                    x->is_read ? "read from" : x->is_recv ? "recv from" : "send to", x->peer, why);
}

static int slot_new(coll_run_t *r) {
    for (size_t i = 0; i < r->nx; i++)
        if (!r->x[i].req) return (int)i;
    xfer_t *x = array_room(r->x, r->nx, &r->cap, sizeof *x, 16);
    if (!x) return -1;
    r->x = x;
    r->x[r->nx].req = NULL;
    return (int)r->nx++;
}

static void slot_free(coll_run_t *r, int h) {
    slime_req_free(r->x[h].req);
    r->x[h].req = NULL;
    while (r->nx > 0 && !r->x[r->nx - 1].req) r->nx--;
}

/* Takes a slot for a transfer with peer at step; -1 (the run failed) if
 * the run is over or no slot could be had. */
static int slot_begin(coll_run_t *r, int peer, uint32_t step, bool is_recv, bool is_read, size_t len) {
    if (!run_ok(r)) return -1;
    int h = slot_new(r);
    if (h < 0) {
        run_fail(r, SLIME_ERR_NOMEM, "%s step %u: out of memory", r->phase, step);
        return -1;
    }
    xfer_t *x = &r->x[h];
    x->peer = peer;
    x->step = step;
    x->is_recv = is_recv;
    x->is_read = is_read;
    x->expect = len;
    return h;
}

/* The slot's request was posted with status st: h, or -1 (the run failed). */
static int slot_posted(coll_run_t *r, int h, slime_status_t st) {
    if (st == SLIME_OK) return h;
    xfer_t *x = &r->x[h];
    x->req = NULL;
    fail_at(r, st, x, "%s", slime_last_error());
    return -1;
}

enum xfer_kind { XFER_RECV, XFER_SEND, XFER_SEND_POSTED, XFER_SEND_SYNC, XFER_SEND_FETCHED };

/* A synchronous send of a whole buffer up to this size is fetched by
 * its receiver (one copy by CMA) on any host; past it, and for every
 * other send, the stream carries the bytes.  2-rank broadcast (p2p_bench,
 * alternating, medians of 3, avg us, stream / fetched): 64 KiB 9.0 /
 * 3.9, 256 KiB 29.7 / 11.0, 1 MiB 96 / 108, 4 MiB 383 / 475.  With the
 * rings' 64 KiB pieces, on an Intel machine with 4 MiB of L2 (medians of
 * 6): 768 KiB 50.6 / 30.3, 1 MiB 68.5 / 53.5, 1.5 MiB 117 / 132; 2 and
 * 4 MiB fetched were slower on average (170 / 259, 350 / 513). */
#define SYNC_FETCH_MAX (1u << 20)

/* How a send's bytes go (send_path_t).  A collective's chunks keep to
 * the stream: its pipeline keeps both ends copying, where a fetch by the
 * receiver would leave the sender idle (4 ranks on 2 cores, all_reduce
 * of 16 MiB: 7.0 ms by the stream, 10-12.5 ms with its 512 KiB chunks
 * fetched).  A whole buffer its sender waits on (a broadcast's root, a
 * gather's leaves) has no pipeline to keep busy: there the two copies
 * through the stream cost more than the receiver's one.  So do the
 * chunks of a ring whose receivers only copy them (run_send_fetched). */
static send_path_t send_path(enum xfer_kind kind, size_t len) {
    bool whole = kind == XFER_SEND_SYNC && len >= coll_sync_bytes() && len <= SYNC_FETCH_MAX;
    return whole || kind == XFER_SEND_FETCHED ? SEND_PATH_FETCH : SEND_PATH_STREAM;
}

static int post(coll_run_t *r, enum xfer_kind kind, int peer, uint32_t step, void *buf, size_t len) {
    int h = slot_begin(r, peer, step, kind == XFER_RECV, false, len);
    if (h < 0) return -1;
    slime_comm_t *c = r->comm;
    uint64_t tag = comm_coll_tag(c, r->op->seq, step);
    slime_req_t **q = &r->x[h].req;
    slime_ep_t *ep = c->peers[peer];
    /* a typed collective reduces: its receivers combine what comes */
    const send_opts_t so = {.sync = kind == XFER_SEND_SYNC || kind == XFER_SEND_FETCHED,
                            .recv_posted = kind == XFER_SEND_POSTED,
                            .path = send_path(kind, len),
                            .coarse = r->op->typed};
    slime_status_t st = kind == XFER_RECV ? slime_recv(ep, buf, len, tag, q) : p2p_send(ep, buf, len, tag, &so, q);
    return slot_posted(r, h, st);
}

int run_send(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len) {
    return post(r, XFER_SEND, peer, step, (void *)buf, len);
}

int run_send_to_posted(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len) {
    return post(r, XFER_SEND_POSTED, peer, step, (void *)buf, len);
}

/* A rank that only sends in a collective (a broadcast's root, a gather's
 * other ranks, a reduce's leaves) could run any number of collectives
 * ahead of its receiver, whose unreceived messages count against its
 * budget for the peer: 2 ranks broadcasting 8 bytes in a loop got the
 * root disconnected after 16384 of them (DLSLIME_PEER_ITEMS_MAX).  So
 * every COLL_AHEAD_MAX-th collective such a send completes only once the
 * receiver took it, which costs one wait in that many. */
static bool bounds_run_ahead(const coll_run_t *r) {
    return r->op->seq % COLL_AHEAD_MAX == COLL_AHEAD_MAX - 1;
}

int run_send_bounded(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len) {
    return post(r, bounds_run_ahead(r) ? XFER_SEND_SYNC : XFER_SEND, peer, step, (void *)buf, len);
}

/* Whether a send to peer that waits for its receiver pays: only where
 * the receiver copies the bytes straight from ours (shm): over a socket
 * the bytes are copied twice either way and the rendezvous adds a round
 * trip (2 ranks over tcp, broadcast 256 KiB: 67-76 us eager, 111-113 us
 * so).  And only with no more ranks than cores: past that a receiver is
 * often off its core, and the sender waits a time slice for it (4 ranks
 * on 2 cores, broadcast 64 KiB: 23-29 us eager, 113-170 us so). */
static bool receiver_copies_from_us(const coll_run_t *r, int peer) {
    return r->comm->size <= p2p_affinity_cpus() && p2p_ep_can(r->comm->peers[peer], P2P_CAP_CPU_RMA);
}

int run_send_sync(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len) {
    /* besides the bound on running ahead */
    bool sync = bounds_run_ahead(r) || (len >= coll_sync_bytes() && receiver_copies_from_us(r, peer));
    return post(r, sync ? XFER_SEND_SYNC : XFER_SEND, peer, step, (void *)buf, len);
}

/* A ring's chunk its receiver only copies is fetched from this size up
 * to the largest chunk a ring cuts by default (coll_chunk_bytes).
 * p2p_bench, 2 ranks, old and new taking turns (medians of 4, avg us),
 * streamed / fetched: allgather 32 KiB 3.27 / 2.33, 64 KiB 4.46 / 3.01
 * (it read from 128 KiB then, coll_cma_copy_min_bytes); reduce_scatter
 * 64 KiB 5.03 / 3.97, 256 KiB 17.4 / 9.9, 1 MiB 104 / 52, 16 MiB 2442 /
 * 1819, 64 MiB 12141 / 11241.  But through torch, where the two ranks
 * reach each collective some microseconds apart, small chunks fetched
 * lost: a fetched send completes only once its receiver came and copied
 * it, so the late rank's copy and then the early one's run one after
 * the other (2 ranks, medians of 3, us per call, streamed / fetched from
 * 16 KiB / from 128 KiB: all_gather 64 KiB 14.0 / 19.1 / 13.2, 1 MiB 123
 * / 112 / 105, 2 MiB 280 / 246 / 244; reduce_scatter 64 KiB 15.0 / 15.8
 * / 13.5, 512 KiB 67.2 / 48.6 / 42.6, 1 MiB 164 / 132 / 119, 2 MiB 347 /
 * 401 / 396). */
#define CHUNK_FETCH_MIN (128u << 10)
#define CHUNK_FETCH_MAX (512u << 10)
/* A chunk kept as it comes (an allgather's) is fetched from 16 KiB: the
 * torch runs that found small fetched chunks slow were of the rings that
 * combine.  p2p_bench allgather, 2 ranks, streamed / fetched (medians of
 * 4 alternating, avg us): 32 KiB 3.92 / 2.96, 64 KiB 5.31 / 3.57, 128
 * KiB 9.74 / 5.13, where Open MPI took 3.0, 3.8 and 8.0; 16 KiB and
 * below level.  Through torch (medians of 10 alternating, us per call):
 * all_gather 64 KiB 21.7 / 21.8, 128 KiB 29.2 / 25.9; reduce_scatter
 * 64 KiB 22.1 / 26.2, so its chunks keep CHUNK_FETCH_MIN. */
#define KEPT_CHUNK_FETCH_MIN (16u << 10)

int run_send_fetched(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len, bool posted, bool kept) {
    size_t min = kept ? KEPT_CHUNK_FETCH_MIN : CHUNK_FETCH_MIN;
    bool fetch = len >= min && len <= CHUNK_FETCH_MAX && receiver_copies_from_us(r, peer);
    enum xfer_kind kind = fetch ? XFER_SEND_FETCHED : posted ? XFER_SEND_POSTED : XFER_SEND;
    return post(r, kind, peer, step, (void *)buf, len);
}

int run_recv(coll_run_t *r, int peer, uint32_t step, void *buf, size_t len) {
    return post(r, XFER_RECV, peer, step, buf, len);
}

int run_recv_cold(coll_run_t *r, int peer, uint32_t step, void *buf, size_t len) {
    int h = slot_begin(r, peer, step, true, false, len);
    if (h < 0) return -1;
    uint64_t tag = comm_coll_tag(r->comm, r->op->seq, step);
    recv_opts_t o = {.cold = true};
    return slot_posted(r, h, p2p_recv(r->comm->peers[peer], buf, len, tag, &o, &r->x[h].req));
}

int run_recv_reduce(coll_run_t *r, int peer, uint32_t step, void *buf, size_t count, slime_dtype_t dt,
                    slime_redop_t op) {
    int h = slot_begin(r, peer, step, true, false, count * slime_dtype_size(dt));
    if (h < 0) return -1;
    uint64_t tag = comm_coll_tag(r->comm, r->op->seq, step);
    return slot_posted(r, h, slime_recv_reduce(r->comm->peers[peer], buf, count, dt, op, tag, &r->x[h].req));
}

int run_read(coll_run_t *r, int peer, uint32_t step, slime_mr_t *local, size_t off,
             const slime_mr_desc_t *remote, size_t roff, size_t len) {
    /* it writes into our memory like a receive: never detach it early */
    int h = slot_begin(r, peer, step, true, true, len);
    if (h < 0) return -1;
    slime_status_t st = slime_read(r->comm->peers[peer], local, off, remote, roff, len, &r->x[h].req);
    return slot_posted(r, h, st);
}

static bool req_failed(const slime_req_t *q) {
    slime_status_t st = p2p_req_state(q);
    return st != SLIME_INPROGRESS && st != SLIME_OK;
}

typedef struct wait_arg {
    coll_run_t *r;
    const int *h;
    size_t n, next;
} wait_arg_t;

/* Done when every wanted message is, or when waiting on is pointless:
 * any message of the run failed, a member aborted, or destroy began. */
static bool wait_pred(void *arg) {
    wait_arg_t *a = arg;
    coll_run_t *r = a->r;
    while (a->next < a->n && p2p_req_done(r->x[a->h[a->next]].req)) a->next++;
    if (a->next == a->n) return true;
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req && req_failed(r->x[i].req)) return true;
    if (atomic_load_explicit(&r->comm->closing, memory_order_relaxed)) return true;
    slime_req_t *ab = r->comm->abort_req;
    return ab && p2p_req_done(ab);
}

/* The first failed message: of those waited on, else of the run. */
static xfer_t *first_failed(coll_run_t *r, const int *h, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (req_failed(r->x[h[i]].req)) return &r->x[h[i]];
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req && req_failed(r->x[i].req)) return &r->x[i];
    return NULL;
}

/* How long a read refused by a live member waits for that member's
 * notice: it was sent before the region went, so it is moments away. */
#define NOTICE_WAIT_MS 200

static bool notice_in(void *arg) {
    slime_req_t *ab = ((slime_comm_t *)arg)->abort_req;
    return ab && p2p_req_done(ab);
}

static bool refused_read(const xfer_t *x, slime_status_t st) {
    return st == SLIME_ERR_ACCESS && x->is_read;
}

static bool check_failures(coll_run_t *r, const int *h, size_t n) {
    char text[600];
    xfer_t *x = first_failed(r, h, n);
    slime_status_t st = x ? p2p_req_state(x->req) : SLIME_OK;
    if (x && refused_read(x, st))
        p2p_wait_until(r->comm->ctx, notice_in, r->comm, now_ns() + (uint64_t)NOTICE_WAIT_MS * 1000000ull);
    slime_status_t told = abort_received(r->comm, text, sizeof text);
    /* A member that gives up tells us why, then cancels our messages to
     * it, deregisters the regions we read from, or exits: with its
     * notice in, the cancel, the refused read or the hang-up is the
     * effect and the notice the cause (it was sent first). */
    bool effect = told != SLIME_OK &&
                  (st == SLIME_ERR_CANCELED || st == SLIME_ERR_PEER_LOST || refused_read(x, st));
    if (x && !effect) return fail_at(r, st, x, "%s", slime_req_error(x->req));
    return run_check_members(r, told, text);
}

bool run_check_members(coll_run_t *r, slime_status_t told, const char *text) {
    if (atomic_load(&r->comm->closing))
        return run_fail(r, SLIME_ERR_CLOSED, "%s: communicator destroyed while the collective ran", r->phase);
    if (told != SLIME_OK) return run_fail(r, told, "%s: %s", r->phase, text);
    return true;
}

bool run_wait(coll_run_t *r, const int *h, size_t n) {
    if (!run_ok(r)) return false;
    for (size_t i = 0; i < n; i++)
        if (h[i] < 0 || (size_t)h[i] >= r->nx || !r->x[h[i]].req)
            return run_fail(r, SLIME_ERR_PROTOCOL, "%s: waiting on a message never posted", r->phase);
    wait_arg_t a = {r, h, n, 0};
    if (!wait_pred(&a)) p2p_wait_until(r->comm->ctx, wait_pred, &a, run_deadline(r, now_ns()));
    if (!check_failures(r, h, n)) return false;
    for (size_t i = 0; i < n; i++) {
        xfer_t *x = &r->x[h[i]];
        if (!p2p_req_done(x->req))
            return fail_at(r, SLIME_ERR_TIMEOUT, x, "timed out after %lld ms (the collective's timeout)",
                           (long long)r->timeout_ms);
    }
    for (size_t i = 0; i < n; i++) {
        xfer_t *x = &r->x[h[i]];
        size_t got = x->is_recv && !x->is_read ? slime_req_bytes(x->req) : x->expect;
        if (got != x->expect)
            return fail_at(r, SLIME_ERR_INVAL, x,
                           "got %zu bytes, expected %zu (do all ranks pass the same sizes?)", got, x->expect);
    }
    for (size_t i = 0; i < n; i++) slot_free(r, h[i]);
    return true;
}

bool run_wait_all(coll_run_t *r) {
    if (!run_ok(r)) return false;
    size_t n = 0;
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req) n++;
    if (n == 0) return true;
    int stack[64];
    int *h = n <= 64 ? stack : malloc(n * sizeof *h);
    if (!h) return run_fail(r, SLIME_ERR_NOMEM, "%s: out of memory", r->phase);
    n = 0;
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req) h[n++] = (int)i;
    bool ok = run_wait(r, h, n);
    if (h != stack) free(h);
    return ok;
}

bool run_test(coll_run_t *r, int h) {
    if (!run_ok(r) || h < 0 || (size_t)h >= r->nx) return false;
    xfer_t *x = &r->x[h];
    if (!x->req || !p2p_req_done(x->req) || req_failed(x->req)) return false;
    if (x->is_recv && !x->is_read && slime_req_bytes(x->req) != x->expect) return false; /* run_wait tells */
    slot_free(r, h);
    return true;
}

bool run_exchange(coll_run_t *r, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                  size_t rlen, uint32_t step) {
    int h[2];
    h[0] = run_recv(r, from, step, rbuf, rlen);
    h[1] = run_send(r, to, step, sbuf, slen);
    return run_ok(r) && run_wait(r, h, 2);
}

static bool all_done_pred(void *arg) {
    coll_run_t *r = arg;
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req && !p2p_req_done(r->x[i].req)) return false;
    return true;
}

void run_release(coll_run_t *r) {
    bool pending = false;
    for (size_t i = 0; i < r->nx; i++) {
        xfer_t *x = &r->x[i];
        if (!x->req || p2p_req_done(x->req)) continue;
        if (x->is_recv && slime_req_cancel(x->req) == SLIME_OK) continue;
        pending = true;
    }
    if (pending)
        p2p_wait_until(r->comm->ctx, all_done_pred, r, now_ns() + (uint64_t)RELEASE_GRACE_MS * 1000000ull);
    for (size_t i = 0; i < r->nx; i++)
        if (r->x[i].req) slime_req_free(r->x[i].req); /* detaches what is still pending */
    free(r->x);
    r->x = NULL;
    r->nx = r->cap = 0;
}
