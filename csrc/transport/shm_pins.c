/* Pins a peer that ended left on our MR table.
 *
 * A CMA access pins its entry in the owner's table for the copy.  A
 * reader killed in the middle of one never unpins, and the owner's
 * deregistration then waits for it until it gives up (mr.c, seconds),
 * where a lost peer should cost about a second in all.  So each side
 * also counts the pins it holds, per slot, in its half of the
 * connection's pins area: pin, then count; uncount, then unpin; the
 * count never exceeds the pins.  When the connection closes and the
 * peer's process has ended, the owner takes the peer's counts off its
 * table: a process that ended copies nothing (its copies ended with it,
 * before its sockets closed).  A peer merely stopped or silent keeps its
 * pins: it may copy again. */
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include "transport/shm_internal.h"

/* How long a closing connection waits for the peer's process to be
 * seen ended, when it left pins: its sockets close moments before. */
#define ENDED_WAIT_MS 50

/* Our counts have one writer at a time (one-sided ops run under the
 * context's lock): a plain load and store each, no locked instruction
 * on a small op's path.  The table's pin and unpin are sequentially
 * consistent, so the count moves after the one and before the other. */
static void count_add(_Atomic uint32_t *n, uint32_t delta) {
    atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed) + delta, memory_order_relaxed);
}

slime_status_t shm_pin(shm_conn_t *c, uint64_t handle, uint32_t rkey, uint64_t off, uint64_t len,
                       unsigned access, uint64_t *addr, char *why, size_t whylen) {
    slime_status_t st = mr_table_acquire(c->peer, handle, rkey, off, len, access, addr, why, whylen);
    if (st == SLIME_OK) count_add(&c->my_pins[(uint32_t)(handle >> 32)], 1);
    return st;
}

void shm_unpin(shm_conn_t *c, uint64_t handle) {
    count_add(&c->my_pins[(uint32_t)(handle >> 32)], (uint32_t)-1);
    mr_table_release(c->peer, handle);
}

static bool any_counted(const _Atomic uint32_t *pins) {
    for (size_t s = 0; s < MR_TABLE_SLOTS; s++)
        if (atomic_load_explicit(&pins[s], memory_order_relaxed)) return true;
    return false;
}

/* Whether process pid has ended (a zombie has), waiting up to wait_ms;
 * false where that cannot be told. */
static bool process_ended(int pid, int wait_ms) {
    if (pid <= 0) return false;
    int fd = pidfd_of(pid);
    if (fd < 0) return errno == ESRCH; /* reaped already */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    while ((n = poll(&p, 1, wait_ms)) < 0 && errno == EINTR) {}
    close(fd);
    return n == 1 && (p.revents & POLLIN);
}

void shm_pins_reclaim(slime_ctx_t *ctx, shm_conn_t *c) {
    if (!any_counted(c->peer_pins) || !process_ended(c->peer_pid, ENDED_WAIT_MS)) return;
    uint64_t n = mr_table_drop_pins(ctx->mr_table, c->peer_pins);
    if (!n) return;
    shm_count_dead_pins(ctx, n);
    ctx_wake_sleepers(ctx); /* a deregistration may be waiting on them */
}
