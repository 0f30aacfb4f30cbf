/* broadcast, in place.  Small messages (and two ranks): a binomial tree,
 * log2 n rounds.  Large ones: a chain from the root through every rank
 * in chunks, each rank forwarding a chunk as soon as it has it, so the
 * time is about one buffer's transfer plus n - 2 chunks. */
#include <stdint.h>
#include <stdlib.h>

#include "coll/coll.h"

#define BCAST_WINDOW 4

static bool binomial(coll_run_t *r, const coll_op_t *op) {
    const int n = r->comm->size;
    const int vr = mod_rank(r->comm->rank - op->root, n);
    int mask = 1;
    while (mask < n) mask <<= 1;
    r->phase = "binomial tree";
    if (vr != 0) {
        int low = vr & -vr;
        int h = run_recv(r, mod_rank(vr - low + op->root, n), 0, op->buf, op->bytes);
        if (h < 0 || !run_wait_one(r, h)) return false;
        mask = low;
    }
    for (int m = mask >> 1; m > 0; m >>= 1)
        if (vr + m < n && run_send_sync(r, mod_rank(vr + m + op->root, n), 0, op->buf, op->bytes) < 0) return false;
    return true; /* the worker waits for the sends */
}

static bool chain(coll_run_t *r, const coll_op_t *op) {
    const int n = r->comm->size;
    const int pos = mod_rank(r->comm->rank - op->root, n);
    const int prev = mod_rank(r->comm->rank - 1, n), next = mod_rank(r->comm->rank + 1, n);
    const bool forward = pos + 1 < n;
    const size_t chunk = coll_chunk_bytes();
    const size_t k = (op->bytes + chunk - 1) / chunk;
    uint8_t *buf = op->buf;
    r->phase = "chain";
    if (pos == 0) {
        for (size_t c = 0; c < k; c++) {
            size_t len = op->bytes - c * chunk < chunk ? op->bytes - c * chunk : chunk;
            if (run_send(r, next, (uint32_t)(c % COLL_STEP_LIMIT), buf + c * chunk, len) < 0) return false;
        }
        return true;
    }
    int window[BCAST_WINDOW];
    int *sends = forward ? malloc(k * sizeof *sends) : NULL;
    if (forward && !sends) return run_fail(r, SLIME_ERR_NOMEM, "out of memory");
    size_t posted = 0, reaped = 0;
    bool ok = true;
    for (size_t c = 0; ok && c < k; c++) {
        while (ok && posted < k && posted < c + BCAST_WINDOW) {
            size_t len = op->bytes - posted * chunk < chunk ? op->bytes - posted * chunk : chunk;
            window[posted % BCAST_WINDOW] =
                run_recv(r, prev, (uint32_t)(posted % COLL_STEP_LIMIT), buf + posted * chunk, len);
            ok = window[posted % BCAST_WINDOW] >= 0;
            posted++;
        }
        ok = ok && run_wait_one(r, window[c % BCAST_WINDOW]);
        if (ok && forward) {
            size_t len = op->bytes - c * chunk < chunk ? op->bytes - c * chunk : chunk;
            sends[c] = run_send(r, next, (uint32_t)(c % COLL_STEP_LIMIT), buf + c * chunk, len);
            ok = sends[c] >= 0;
            while (ok && reaped <= c && run_test(r, sends[reaped])) reaped++;
        }
    }
    free(sends);
    return ok;
}

static bool bcast_exec(coll_run_t *r, const coll_op_t *op) {
    const int n = r->comm->size;
    if (n == 1 || op->bytes == 0) return true;
    if (pairbox_usable(r, op->bytes)) return pairbox_broadcast(r, op);
    if (!run_ok(r)) return false;
    if (op->bytes <= coll_small_bytes() || n == 2) return binomial(r, op);
    return chain(r, op);
}

slime_status_t slime_broadcast(slime_comm_t *comm, void *buf, size_t bytes, int root, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "broadcast", true, root);
    if (st != SLIME_OK) return st;
    if (!buf && bytes) return slime_errorf(SLIME_ERR_INVAL, "broadcast: NULL buffer of %zu bytes", bytes);
    coll_op_t t = {.exec = bcast_exec, .name = "broadcast", .buf = buf, .bytes = bytes, .root = root};
    return coll_post(comm, &t, out);
}
