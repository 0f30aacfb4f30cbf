/* The progress engine.  Whoever holds ctx->lock may progress: the
 * progress thread, or a thread spinning in a wait (so short operations
 * finish with no hand-off between threads).  Idle, everyone sleeps:
 * waiters on a condition variable, the progress thread in epoll, woken by
 * sockets, by the eventfd, or by a peer's doorbell on a connection whose
 * bytes arrive in memory (TP_CAP_POLLED), which the peer rings only when
 * no thread of ours is polling (the `polling` count in our shared table). */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core/internal.h"
#include "transport/transport.h"

#define PT_SPIN_NS 5000ull       /* progress thread: spin this long idle */
/* ...or this long while a peer's one-sided write through polled memory
 * is half in: the rest is on its way and no waiter of ours drives it, so
 * a sleep would cost the writer a doorbell and us a wake-up for every
 * ring's worth (a ring carries the largest writes: CMA_MAX of the shm
 * transport) */
#define PT_MIDWAY_SPIN_NS 100000ull
#define GRACE_NS 100000ull       /* see mr_shared_t.grace_until */
#define SHORT_SLEEP_MS 1         /* the progress thread's nap during grace */
#define STANDBY_MS 10            /* ...its sleep while a waiter spins */
#define LONG_SLEEP_MS 1000       /* ...and when all is quiet */
#define SLEEP_MAX_NS 50000000ull /* a sleeping waiter looks at the clock this often */
#define SLEEP_UNSURE_NS 1000000ull /* ...or this often, its wake-up in doubt */

static void handle_event(slime_ctx_t *ctx, pollable_t *p, uint32_t events) {
    switch (p->kind) {
    case POLL_WAKE: return; /* only on pt_epfd, drained by the progress thread */
    case POLL_LISTEN: transports_accept(ctx, p->obj); return;
    case POLL_PENDING: pending_conn_progress(ctx, p->obj); return;
    case POLL_EP: {
        slime_ep_t *ep = p->obj;
        if (ep->state != EP_UP) return;
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) frames_rx(ep);
        if (ep->state == EP_UP && (events & EPOLLOUT)) frames_flush(ep);
        if (ep->state == EP_UP) ep->tp->fd_event(ep, events);
        return;
    }
    }
}

int progress_locked(slime_ctx_t *ctx) {
    int did = 0;
    bool midway = false;
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps) {
        slime_ep_t *ep = container_of(pos, slime_ep_t, link);
        if (ep->state != EP_UP) {
            ep_reap(ep);
            continue;
        }
        if (ep->rx.paused || ep->tp->rx_ready(ep)) did |= frames_rx(ep);
        /* no fd event says the peer freed room: look on every pass */
        bool polled = ep->tp->caps & TP_CAP_POLLED;
        if (ep->state == EP_UP && !list_empty(&ep->txq) && polled) did |= frames_flush(ep);
        if (ep->state == EP_UP && !list_empty(&ep->rmaq)) did |= proto_rma_progress(ep);
        midway |= ep->state == EP_UP && polled && ep->rx.state == RX_PAYLOAD && ep->rx.sink == SINK_WRITE;
    }
    ctx->midway = midway;
    if (ctx->n_resting) transports_wake_listeners(ctx);
    /* with no fd to watch, the epoll set (listeners, doorbells, hang-ups)
     * is looked at every 64th pass that found nothing: a pass that moved
     * something hurries back to its waiter, and the syscall (~0.3 us)
     * on one small message in 64 cost 8-byte send/recv over shm ~5 ns
     * on average */
    bool fds = ctx->n_fd_eps || ctx->poll_now || !list_empty(&ctx->pending_conns);
    if (fds || (!did && (++ctx->poll_tick & 63) == 0)) {
        ctx->poll_now = false;
        struct epoll_event evs[32];
        int n = epoll_wait(ctx->epfd, evs, 32, 0);
        for (int i = 0; i < n; i++) handle_event(ctx, evs[i].data.ptr, evs[i].events);
        if (n > 0) did = 1;
        if (!list_empty(&ctx->pending_conns)) pending_conn_expire(ctx);
    }
    return did;
}

/* Under ctx->lock: is there work no peer would wake us for? */
static bool busy_locked(slime_ctx_t *ctx) {
    slime_list_t *pos;
    if (!list_empty(&ctx->callbacks)) return true;
    for (pos = ctx->eps.next; pos != &ctx->eps; pos = pos->next) {
        slime_ep_t *ep = container_of(pos, slime_ep_t, link);
        if (ep->state != EP_UP) continue;
        if (!list_empty(&ep->rmaq) || ep->tp->rx_ready(ep)) return true;
        if (ep->tp->has_work && ep->tp->has_work(ep)) return true;
    }
    return false;
}

/* A thread of ours just posted or looked for its work (a post, a test,
 * a wait that stops spinning): it is likely to look again soon, so
 * peers skip doorbells for a grace period after.  Without this a thread
 * whose every wait found its message already taken (by the progress
 * thread, which a doorbell woke) never spun, so the grace ran out and
 * the peer rang for every message: a send syscall, and a third thread
 * woken on a 2-core machine.  The word is read by every send of every
 * peer: it is only rewritten when half the grace is gone.  A progress
 * thread in a long sleep must switch to naps, since only its nap covers
 * the grace (seq_cst store then load: see progress_thread_main). */
static void extend_grace_at(slime_ctx_t *ctx, uint64_t t) {
    if (t + GRACE_NS / 2 <= atomic_load_explicit(&ctx->mr_table->grace_until, memory_order_relaxed)) return;
    atomic_store(&ctx->mr_table->grace_until, t + GRACE_NS);
    ctx_rouse_long_sleeper(ctx);
}

void ctx_extend_grace(slime_ctx_t *ctx) { extend_grace_at(ctx, now_ns()); }

void ctx_rouse_long_sleeper(slime_ctx_t *ctx) {
    if (atomic_load(&ctx->pt_long_sleep)) ctx_kick(ctx);
}

/* A waiter starts polling.  Peers skip doorbells while it does: not
 * by the shared `polling` count, which each peer's send reads (a count
 * written at every wait's start and end cost a cache miss on both ends
 * of each small message), but by the grace, which the waiter keeps
 * extended as it spins (rewritten once per half grace).  A progress
 * thread in a long sleep must switch to naps: once this waiter leaves,
 * peers skip doorbells for the rest of the grace, and only the progress
 * thread's nap covers it. */
static uint64_t waiter_enter(slime_ctx_t *ctx) {
    atomic_fetch_add(&ctx->spinners, 1);
    uint64_t t = now_ns();
    extend_grace_at(ctx, t);
    ctx_rouse_long_sleeper(ctx);
    return t;
}

/* t: when the waiter last looked (its last turn's clock read: a fresh
 * one would cost the time between a message's arrival and the reply) */
static void waiter_leave(slime_ctx_t *ctx, uint64_t t) {
    extend_grace_at(ctx, t);
    atomic_fetch_sub(&ctx->spinners, 1);
}

void ctx_post_work(slime_ctx_t *ctx) {
    /* work was queued under ctx->lock; a progress thread that looked
     * before it did so is asleep with pt_asleep set, and needs a kick */
    if (atomic_load(&ctx->pt_asleep)) ctx_kick(ctx);
}

void ctx_kick(slime_ctx_t *ctx) {
    uint64_t one = 1;
    ssize_t r = write(ctx->wakefd, &one, sizeof one);
    (void)r; /* a full counter wakes the thread just the same */
}

void ctx_wake(slime_ctx_t *ctx, bool worker_sleepers) {
    /* one ordering for both kinds of sleeper: each completion pays it */
    wake_fence_completer(ctx);
    bool plain = atomic_load(&ctx->sleepers) != 0;
    bool workers = worker_sleepers && atomic_load(&ctx->worker_sleepers) != 0;
    if (!plain && !workers) return;
    pthread_mutex_lock(&ctx->sleep_mtx);
    if (plain) pthread_cond_broadcast(&ctx->sleep_cond);
    if (workers) pthread_cond_broadcast(&ctx->worker_cond);
    pthread_mutex_unlock(&ctx->sleep_mtx);
}

void ctx_wake_sleepers(slime_ctx_t *ctx) { ctx_wake(ctx, false); }

static bool wait_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline);
static bool sleep_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline,
                        pthread_cond_t *cond, _Atomic int *sleepers);

bool ctx_sleep_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline) {
    if (done(arg)) return true;
    atomic_fetch_add(&ctx->users, 1);
    bool ok = sleep_until(ctx, done, arg, deadline, &ctx->worker_cond, &ctx->worker_sleepers);
    atomic_fetch_sub(&ctx->users, 1);
    return ok;
}

bool ctx_wait_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline) {
    if (done(arg)) return true;
    /* slime_ctx_destroy waits for us to leave before it frees ctx */
    atomic_fetch_add(&ctx->users, 1);
    bool ok = wait_until(ctx, done, arg, deadline);
    atomic_fetch_sub(&ctx->users, 1);
    return ok;
}

static bool wait_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline) {
    uint64_t t = waiter_enter(ctx), last = t;
    const bool crowded = ctx_crowded(ctx);
    bool ok = false, timed_out = false;
    for (;;) {
        if (done(arg)) { ok = true; break; }
        /* block on the lock rather than try it: a holder preempted by
         * our own spinning would otherwise stall us for a whole spin */
        pthread_mutex_lock(&ctx->lock);
        int did = progress_locked(ctx);
        pthread_mutex_unlock(&ctx->lock);
        /* what this turn moved may be what we wait for: look before the
         * clock read and the pause, which would only delay the reply */
        if (did && done(arg)) { ok = true; break; }
        /* one clock read a turn: it costs as much as a pause (~25 ns) */
        t = now_ns();
        if (did) last = t;
        extend_grace_at(ctx, t);
        if (t >= deadline || atomic_load(&ctx->closed)) { timed_out = true; break; }
        if (t - last > P2P_WAIT_SPIN_NS) break;
        /* past a short spin, let whoever else wants this core run: on an
         * oversubscribed machine that is often the very peer we wait for.
         * Before that one pause a turn: a turn is how late we see what a
         * peer sent, and eight pauses made it ~0.6 us, most of a small
         * message's trip.  On a host crowded with our processes
         * (ctx_crowded) some other process of ours waits for this core at
         * any moment: yield from the first turn.  Through torch, 4 ranks
         * on 2 cores over shm (medians of 3 alternating runs, avg us):
         * all_reduce 1 MiB 675 -> 562, broadcast 1 MiB 656 -> 409,
         * all_gather 1 MiB 358 -> 315, reduce_scatter 64 KiB 73 -> 51,
         * send/recv 64 KiB 26 -> 22; broadcast 64 KiB 35 -> 38. */
        if (crowded || t - last > P2P_WAIT_YIELD_NS) sched_yield();
        else cpu_relax();
    }
    waiter_leave(ctx, t);
    if (ok || timed_out) return ok || done(arg);
    /* we stop spinning but keep waiting: the progress thread takes over */
    if (atomic_load(&ctx->spinners) == 0) ctx_kick(ctx);
    return sleep_until(ctx, done, arg, deadline, &ctx->sleep_cond, &ctx->sleepers);
}

/* Sleeps until done() or the deadline; whoever completes what done()
 * looks at broadcasts sleep_cond (ctx_wake_sleepers). */
static bool sleep_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg, uint64_t deadline,
                        pthread_cond_t *cond, _Atomic int *sleepers) {
    bool ok;
    pthread_mutex_lock(&ctx->sleep_mtx);
    atomic_fetch_add(sleepers, 1);
    /* a completion that missed our count may have skipped the wake-up:
     * then look again soon */
    uint64_t nap = wake_fence_sleeper(ctx) ? SLEEP_MAX_NS : SLEEP_UNSURE_NS;
    while (!(ok = done(arg))) {
        uint64_t t = now_ns();
        if (t >= deadline || atomic_load(&ctx->closed)) break;
        uint64_t until = t + nap < deadline ? t + nap : deadline;
        struct timespec ts = timespec_at_ns(until);
        pthread_cond_timedwait(cond, &ctx->sleep_mtx, &ts);
    }
    atomic_fetch_sub(sleepers, 1);
    pthread_mutex_unlock(&ctx->sleep_mtx);
    return ok;
}

void *progress_thread_main(void *arg) {
    slime_ctx_t *ctx = arg;
    atomic_fetch_add(&ctx->mr_table->polling, 1);
    uint64_t idle_since = now_ns();
    while (!atomic_load(&ctx->stop)) {
        pthread_mutex_lock(&ctx->lock);
        int did = progress_locked(ctx);
        bool due = !list_empty(&ctx->callbacks), midway = ctx->midway;
        uint64_t looked = now_ns();
        if (looked >= ctx->live_next_ns) live_check(ctx, looked);
        pthread_mutex_unlock(&ctx->lock);
        if (due) run_callbacks(ctx);
        if (did || due) { idle_since = now_ns(); continue; }
        /* spin a moment, then sleep.  Not all through a grace, though
         * peers send no doorbells then: a grace lasts while our threads
         * keep testing and waiting (ctx_extend_grace), which they do
         * themselves, and a progress thread spinning beside them took a
         * core of two from them; it naps instead (SHORT_SLEEP_MS) */
        uint64_t t = now_ns();
        if (atomic_load(&ctx->spinners) == 0 && t - idle_since < (midway ? PT_MIDWAY_SPIN_NS : PT_SPIN_NS)) {
            cpu_relax();
            continue;
        }
        atomic_fetch_sub(&ctx->mr_table->polling, 1);
        atomic_store(&ctx->pt_asleep, true); /* before the look, see ctx_post_work */
        atomic_store(&ctx->pt_long_sleep, true);
        /* three ways to sleep: while a waiter spins it does our work, so
         * stay out of its way (it kicks us when it stops spinning); during
         * the grace after one left, peers send no doorbells, so nap; else
         * sleep until an fd or a doorbell says there is work (a waiter
         * that starts meanwhile sees pt_long_sleep and kicks us) */
        bool spinner = atomic_load(&ctx->spinners) > 0;
        bool grace = !spinner && now_ns() <= atomic_load(&ctx->mr_table->grace_until);
        if (spinner || grace) atomic_store(&ctx->pt_long_sleep, false);
        pthread_mutex_lock(&ctx->lock);
        bool busy = busy_locked(ctx);
        int timeout = live_sleep_ms(ctx, list_empty(&ctx->pending_conns) && !ctx->n_resting ? LONG_SLEEP_MS : 100);
        pthread_mutex_unlock(&ctx->lock);
        if (!busy) {
            struct pollfd wake = {.fd = ctx->wakefd, .events = POLLIN};
            struct epoll_event ev;
            int woke = spinner ? poll(&wake, 1, STANDBY_MS) > 0
                               : epoll_wait(ctx->pt_epfd, &ev, 1, grace ? SHORT_SLEEP_MS : timeout) > 0 &&
                                     ev.data.ptr == &ctx->p_wake;
            if (woke) {
                uint64_t v;
                while (read(ctx->wakefd, &v, sizeof v) > 0) {
                }
            }
            pthread_mutex_lock(&ctx->lock);
            ctx->poll_now = true;
            pthread_mutex_unlock(&ctx->lock);
        }
        atomic_store(&ctx->pt_long_sleep, false);
        atomic_store(&ctx->pt_asleep, false);
        atomic_fetch_add(&ctx->mr_table->polling, 1);
        idle_since = now_ns();
    }
    atomic_fetch_sub(&ctx->mr_table->polling, 1);
    return NULL;
}
