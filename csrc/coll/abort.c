/* The abort channel.  A rank whose collective fails tells every member,
 * so that a rank waiting on a healthy peer that gave up (not on the lost
 * one itself) fails within moments too, instead of at its timeout; and a
 * rank that reaches the collective late fails at once.  Each
 * communicator keeps one receive from any member posted for it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* How long destroy lets our own notices leave before it gives up on them. */
#define ABORT_FLUSH_MS 500

slime_status_t abort_channel_open(slime_comm_t *comm) {
    if (comm->size == 1) return SLIME_OK;
    slime_status_t st = slime_recv_any(comm->ctx, &comm->abort_in, sizeof comm->abort_in,
                                       comm_abort_tag(comm), &comm->abort_req);
    if (st != SLIME_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", slime_last_error());
        return slime_errorf(st, "comm_create: posting the abort receive: %s", why);
    }
    return SLIME_OK;
}

slime_status_t abort_received(slime_comm_t *comm, char *text, size_t len) {
    slime_req_t *req = comm->abort_req;
    if (!req || !p2p_req_done(req)) return SLIME_OK;
    slime_status_t st = slime_req_test(req);
    if (st != SLIME_OK) {
        /* the receive itself failed: the context is going away */
        snprintf(text, len, "abort channel: %s", slime_req_error(req));
        return st;
    }
    abort_msg_t *m = &comm->abort_in;
    m->text[sizeof m->text - 1] = '\0';
    slime_status_t told = (slime_status_t)m->status;
    if (told >= SLIME_OK) told = SLIME_ERR_PROTOCOL; /* a notice always means failure */
    snprintf(text, len, "rank %d aborted the communicator: %s", (int)m->rank, m->text);
    return told;
}

void abort_broadcast(slime_comm_t *comm, slime_status_t st, const char *text) {
    if (comm->size == 1 || comm->abort_out) return; /* once per communicator */
    abort_msg_t *m = calloc(1, sizeof *m);
    if (!m) return;
    m->status = st;
    m->rank = comm->rank;
    snprintf(m->text, sizeof m->text, "%s", text);
    comm->abort_out = m;
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank || slime_ep_status(comm->peers[r]) != SLIME_OK) continue;
        if (slime_send(comm->peers[r], m, sizeof *m, comm_abort_tag(comm), &comm->abort_sends[r]) != SLIME_OK)
            comm->abort_sends[r] = NULL;
    }
}

void comm_break(slime_comm_t *comm, slime_status_t st, const char *text) {
    pthread_mutex_lock(&comm->mu);
    bool first = comm->broken == SLIME_OK;
    if (first) {
        comm->broken = st;
        /* the cause may be longer than what is kept of it: cut it, and
         * say so to GCC, whose -O3 format-truncation check fails the build */
        snprintf(comm->broken_text, sizeof comm->broken_text, "%.*s", (int)sizeof comm->broken_text - 1, text);
    }
    pthread_mutex_unlock(&comm->mu);
    if (first && st != SLIME_ERR_CLOSED) abort_broadcast(comm, st, text);
}

void abort_channel_close(slime_comm_t *comm) {
    if (comm->abort_req) {
        slime_req_free(comm->abort_req); /* cancels it if still posted */
        comm->abort_req = NULL;
    }
    if (!comm->abort_out) return;
    bool all_gone = true;
    uint64_t deadline = now_ns() + (uint64_t)ABORT_FLUSH_MS * 1000000ull;
    for (int r = 0; r < comm->size; r++) {
        slime_req_t *s = comm->abort_sends[r];
        if (!s) continue;
        uint64_t t = now_ns();
        int64_t left = t < deadline ? (int64_t)((deadline - t) / 1000000ull) : 0;
        if (slime_req_wait(s, left) == SLIME_ERR_TIMEOUT && !p2p_req_done(s)) all_gone = false;
        slime_req_free(s); /* detaches one still pending */
        comm->abort_sends[r] = NULL;
    }
    /* a notice still queued to a peer that stopped reading keeps pointing
     * at the message: leave it to the process rather than free it early */
    if (all_gone) free(comm->abort_out);
    comm->abort_out = NULL;
}
