/* The per-communicator queue and its worker thread.  Collectives run one
 * at a time in post order; the caller gets a request at once.  A caller
 * that waits on a collective nobody has started yet runs it itself
 * (run_here), with no hand-off to the worker and back, the common case
 * of post-then-wait; otherwise it sleeps while the worker does the work
 * (the worker spins in its own waits, where spinning pays).  A post its
 * poster promised to wait on (slime_comm_next_waited) does not even wake
 * the worker; it is handed over only if that wait cannot run it.  A failed
 * collective breaks the communicator: everything after it fails fast
 * with the same cause. */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"

/* slime_comm_next_waited's word, taken by this thread's next collective
 * call (coll_check) and used by its post, if it gets that far */
static _Thread_local const slime_comm_t *next_waited;
static _Thread_local bool post_waited;

void slime_comm_next_waited(slime_comm_t *comm) { next_waited = comm; }

slime_status_t coll_check(const slime_comm_t *comm, slime_req_t **out, const char *name,
                          bool root_used, int root) {
    post_waited = comm && next_waited == comm;
    next_waited = NULL;
    if (out) *out = NULL;
    if (!comm) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL communicator", name);
    if (!out) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL request pointer", name);
    if (root_used && (root < 0 || root >= comm->size))
        return slime_errorf(SLIME_ERR_INVAL, "%s: root %d out of range [0, %d)", name, root, comm->size);
    return SLIME_OK;
}

coll_what_t coll_what(const coll_op_t *op) {
    coll_what_t w;
    if (op->typed)
        snprintf(w.text, sizeof w.text, "%s #%" PRIu64 " (%zu x %s, %s)", op->name, op->seq, op->count,
                 dtype_name(op->dtype), redop_name(op->redop));
    else
        snprintf(w.text, sizeof w.text, "%s #%" PRIu64 " (%zu bytes)", op->name, op->seq, op->bytes);
    return w;
}

/* What an op owns besides itself. */
static void op_free_args(coll_op_t *op) {
    free(op->v);
    coll_blocks_free(op->ptrs, op->ptrs_small);
}

static void op_free(coll_op_t *op) {
    op_free_args(op);
    free(op);
}

/* Under comm->mu: op is done with; the next post may take it. */
static void op_retire(slime_comm_t *comm, coll_op_t *op) {
    op_free_args(op);
    if (comm->spare_op) free(op);
    else comm->spare_op = op;
}

/* broken: the communicator's state when op was taken (under comm->mu) */
static void run_one(slime_comm_t *comm, coll_op_t *op, slime_status_t broken) {
    slime_status_t st = broken;
    char text[600];
    if (st != SLIME_OK) {
        pthread_mutex_lock(&comm->mu); /* comm_break writes the text under it */
        snprintf(text, sizeof text, "%s", comm->broken_text);
        pthread_mutex_unlock(&comm->mu);
    }
    if (st == SLIME_OK && (st = abort_received(comm, text, sizeof text)) != SLIME_OK)
        comm_break(comm, st, text);
    if (st != SLIME_OK) {
        p2p_req_worker_complete(op->req, st, "%s: communicator is broken: %s", coll_what(op).text, text);
        return;
    }
    coll_run_t run;
    run_init(&run, comm, op);
    bool ok = op->exec(&run, op) && run_wait_all(&run);
    if (!ok && run.status == SLIME_OK) /* an algorithm must record why */
        run_fail(&run, SLIME_ERR_PROTOCOL, "failed without a cause");
    run_release(&run);
    if (!ok) { /* run_fail broke the communicator already */
        p2p_req_worker_complete(op->req, run.status, "%s", run.detail);
        return;
    }
    p2p_req_worker_complete(op->req, SLIME_OK, NULL);
}

/* Under comm->mu: the next collective, now running; NULL if one runs. */
static coll_op_t *take_next(slime_comm_t *comm) {
    if (comm->running || list_empty(&comm->queue)) return NULL;
    coll_op_t *op = list_first(&comm->queue, coll_op_t, link);
    list_del(&op->link);
    comm->running = true;
    return op;
}

/* Runs a taken collective; the next one may start after it. */
static void run_taken(slime_comm_t *comm, coll_op_t *op, slime_status_t broken) {
    run_one(comm, op, broken);
    pthread_mutex_lock(&comm->mu);
    op_retire(comm, op);
    comm->running = false;
    /* the worker may take the next one now (destroy polls `running`):
     * with nothing queued, a wake-up would only cost it a turn */
    if (!list_empty(&comm->queue)) pthread_cond_signal(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
}

/* How long the worker leaves a new collective to the thread that posted
 * it.  Callers mostly wait right after posting, and a waiter runs the
 * collective itself (run_here): the worker taking it first instead costs
 * two thread hand-offs, several microseconds on a small collective.
 * One nobody waits for starts this much later. */
#define WORKER_GRACE_NS 50000ull
/* posted_ns of a lazy collective its poster handed over: long due */
#define HANDED_OVER_NS 1ull

/* Under comm->mu: the next collective for the worker, now running, or
 * NULL after sleeping (until woken, or until the first queued one has
 * been left to its poster long enough). */
static coll_op_t *worker_take(slime_comm_t *comm) {
    if (comm->running || list_empty(&comm->queue)) {
        pthread_cond_wait(&comm->cv, &comm->mu);
        return NULL;
    }
    coll_op_t *first = list_first(&comm->queue, coll_op_t, link);
    uint64_t t = now_ns();
    if (!first->posted_ns) first->posted_ns = t; /* lazy: see coll_post */
    uint64_t due = first->posted_ns + WORKER_GRACE_NS;
    if (t >= due) return take_next(comm);
    struct timespec ts = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)};
    /* it looks at the queue again when due: posts need not wake it */
    comm->worker_watching = true;
    pthread_cond_timedwait(&comm->cv, &comm->mu, &ts);
    comm->worker_watching = false;
    return NULL;
}

/* Every post the worker is not already watching for wakes it, though
 * mostly only to leave the collective to its poster (WORKER_GRACE_NS).
 * Woken as an ordinary thread, it preempted the poster on the poster's
 * own core: two context switches inside the post, and two more when its
 * grace ran out.  A batch thread gets the same share of the CPU but does
 * not preempt on waking.  torch, 2 ranks on 2 cores, all_reduce posted
 * with asyncOp and waited at once (the backend's own call): 8 B 30-42 ->
 * 2.8 us, 64 KiB 36-43 -> 14-18, 1 MiB 269-297 -> 191. */
static void become_batch_thread(void) {
#ifdef SCHED_BATCH
    struct sched_param sp = {0};
    (void)sched_setscheduler(0, SCHED_BATCH, &sp); /* 0: this thread; best effort */
#endif
}

static void *worker_main(void *arg) {
    slime_comm_t *comm = arg;
    become_batch_thread(); /* before the name, by which tests find it */
    /* a name for top -H, perf and the tests (/proc/PID/task/TID/comm) */
    pthread_setname_np(pthread_self(), "slime-coll");
    pthread_mutex_lock(&comm->mu);
    for (;;) {
        coll_op_t *op = NULL;
        while (!comm->stopping && !(op = worker_take(comm))) continue;
        if (!op) break; /* stopping: destroy fails what is left */
        slime_status_t broken = comm->broken;
        pthread_mutex_unlock(&comm->mu);
        run_taken(comm, op, broken);
        pthread_mutex_lock(&comm->mu);
    }
    pthread_mutex_unlock(&comm->mu);
    return NULL;
}

/* Live communicators, so that a waiter holding only its request can tell
 * whether the communicator it names still exists. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static slime_comm_t **live;
static size_t n_live, cap_live;

bool coll_live_add(slime_comm_t *comm) {
    pthread_mutex_lock(&live_mu);
    slime_comm_t **grown = array_room(live, n_live, &cap_live, sizeof *live, 16);
    if (grown) {
        live = grown;
        live[n_live++] = comm;
    }
    pthread_mutex_unlock(&live_mu);
    return grown != NULL;
}

void coll_live_remove(slime_comm_t *comm) {
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < n_live; i++)
        if (live[i] == comm) {
            live[i] = live[--n_live];
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

/* How far a waiter's timeout may fall short of the collective's own
 * and the waiter still run it (it cannot stop earlier): a sixteenth of
 * the timeout, at most a second.  Waiters pass about the very timeout
 * the collective has (torch's Work, p2p_bench), but may have spent a
 * little of it already; without the grace none of them ever ran a
 * collective itself and every small one paid two thread hand-offs. */
static int64_t run_here_grace_ms(int64_t timeout_ms) {
    int64_t grace_ms = timeout_ms / 16;
    return grace_ms < 1000 ? grace_ms : 1000;
}

/* Under comm->mu: req's collective, if still queued without the worker
 * woken for it (lazy), is the worker's now; its poster will not run it. */
static void hand_over(slime_comm_t *comm, const slime_req_t *req) {
    slime_list_t *pos;
    for (pos = comm->queue.next; pos != &comm->queue; pos = pos->next) {
        coll_op_t *op = container_of(pos, coll_op_t, link);
        if (op->req != req) continue;
        if (op->lazy && !comm->worker_watching) pthread_cond_signal(&comm->cv);
        /* its poster will not run it: the worker need not leave it a grace */
        if (op->lazy) op->posted_ns = HANDED_OVER_NS;
        op->lazy = false;
        return;
    }
}

/* run_here of a collective's request: if its collective is next in line
 * and nothing runs, run it in this thread.  Only when the wait would
 * last about the collective's own timeout (run_here_grace_ms), since
 * running it cannot stop at an earlier deadline.  The live list (a
 * communicator found there is locked before the list is let go) keeps a
 * destroyed communicator from being touched: destroy removes it first. */
static bool run_here(slime_req_t *req, void *key, int64_t wait_ms) {
    pthread_mutex_lock(&live_mu);
    slime_comm_t *comm = NULL;
    for (size_t i = 0; i < n_live && !comm; i++)
        if (live[i] == key) comm = live[i];
    if (!comm) {
        pthread_mutex_unlock(&live_mu);
        return false;
    }
    pthread_mutex_lock(&comm->mu);
    pthread_mutex_unlock(&live_mu);
    coll_op_t *op = NULL;
    int64_t t = atomic_load(&comm->timeout_ms);
    t = t > 0 ? t : 0;
    bool long_enough = wait_ms != P2P_NO_WAITER && wait_ms >= t - run_here_grace_ms(t);
    if (long_enough && !comm->stopping && !list_empty(&comm->queue) &&
        list_first(&comm->queue, coll_op_t, link)->req == req)
        op = take_next(comm);
    if (!op) hand_over(comm, req);
    slime_status_t broken = comm->broken;
    pthread_mutex_unlock(&comm->mu);
    if (!op) return false;
    run_taken(comm, op, broken);
    return true;
}

slime_status_t coll_post(slime_comm_t *comm, const coll_op_t *tmpl, slime_req_t **out) {
    pthread_mutex_lock(&comm->mu);
    coll_op_t *op = comm->spare_op ? comm->spare_op : malloc(sizeof *op);
    slime_req_t *req = op ? p2p_req_worker_new(comm->ctx, run_here, comm) : NULL;
    if (!req) {
        if (op != comm->spare_op) free(op);
        pthread_mutex_unlock(&comm->mu);
        free(tmpl->v);
        coll_blocks_free(tmpl->ptrs, tmpl->ptrs_small);
        return slime_errorf(SLIME_ERR_NOMEM, "%s: out of memory", tmpl->name);
    }
    comm->spare_op = NULL;
    *op = *tmpl;
    if (tmpl->ptrs == tmpl->ptrs_small) op->ptrs = op->ptrs_small; /* in place: the copy's own */
    op->req = req;
    op->lazy = post_waited;
    post_waited = false;
    list_init(&op->link);
    /* a lazy post's poster waits on it at once: the worker, should it
     * see it first, counts the grace from then (worker_take), and the
     * post saves a clock read */
    op->posted_ns = op->lazy ? 0 : now_ns();
    op->seq = comm->next_seq++;
    if (comm->broken != SLIME_OK) {
        /* nothing will run again: fail it here, the order is moot */
        slime_status_t st = comm->broken;
        char text[600];
        snprintf(text, sizeof text, "%s", comm->broken_text);
        pthread_mutex_unlock(&comm->mu);
        p2p_req_worker_complete(req, st, "%s: communicator is broken: %s", coll_what(op).text, text);
        op_free(op);
        *out = req;
        return SLIME_OK;
    }
    if (!comm->worker_started) {
        if (pthread_create(&comm->worker, NULL, worker_main, comm) != 0) {
            pthread_mutex_unlock(&comm->mu);
            op_free(op);
            slime_req_free(req);
            return slime_errorf(SLIME_ERR_SYSTEM, "%s: cannot start the communicator's worker thread", tmpl->name);
        }
        comm->worker_started = true;
    }
    list_push_back(&comm->queue, &op->link);
    if (!op->lazy && !comm->worker_watching) pthread_cond_signal(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
    *out = req;
    return SLIME_OK;
}

void coll_worker_stop(slime_comm_t *comm) {
    pthread_mutex_lock(&comm->mu);
    comm->stopping = true;
    atomic_store(&comm->closing, true);
    slime_list_t left;
    list_init(&left);
    while (!list_empty(&comm->queue)) {
        slime_list_t *n = comm->queue.next;
        list_del(n);
        list_push_back(&left, n);
    }
    pthread_cond_broadcast(&comm->cv);
    bool started = comm->worker_started;
    pthread_mutex_unlock(&comm->mu);
    /* a worker asleep in a wait looks at `closing` when woken */
    p2p_wake_waiters(comm->ctx);
    if (started) pthread_join(comm->worker, NULL);
    /* a waiter running a collective itself (run_here) gives up as soon */
    pthread_mutex_lock(&comm->mu);
    while (comm->running) {
        pthread_mutex_unlock(&comm->mu);
        p2p_wake_waiters(comm->ctx);
        usleep(1000);
        pthread_mutex_lock(&comm->mu);
    }
    pthread_mutex_unlock(&comm->mu);
    while (!list_empty(&left)) {
        coll_op_t *op = list_first(&left, coll_op_t, link);
        list_del(&op->link);
        p2p_req_worker_complete(op->req, SLIME_ERR_CLOSED, "%s: communicator destroyed before it ran",
                                coll_what(op).text);
        op_free(op);
    }
}
