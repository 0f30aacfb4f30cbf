/* The shm transport's shared boxes (p2p_box_t): SHM_BOX_SLOTS slots in
 * the segment, between its header and the rings, a side per process in
 * each.  The segment is mapped by both processes from the connect on, so
 * a box costs nothing to open; what is kept is the mapping, held while a
 * box is open because the connection may close (the peer died) while a
 * thread of ours still polls it. */
#include <stdlib.h>
#include <sys/mman.h>

#include "transport/shm_internal.h"

void shm_mapping_put(shm_mapping_t *m) {
    if (atomic_fetch_sub(&m->refs, 1) != 1) return;
    munmap(m->addr, m->len);
    free(m);
}

int shm_box_slots(slime_ep_t *ep) { return ep->conn ? SHM_BOX_SLOTS : 0; }

bool shm_box_open(slime_ep_t *ep, int slot, p2p_box_t *box) {
    shm_conn_t *c = ep->conn;
    if (!c || slot < 0 || slot >= SHM_BOX_SLOTS) return false;
    uint8_t *at = c->seg->addr + SEG_HDR + (size_t)slot * 2 * SHM_BOX_SIDE;
    uint8_t *dialer_side = at, *acceptor_side = at + SHM_BOX_SIDE;
    box->mine = c->dialer ? dialer_side : acceptor_side;
    box->theirs = c->dialer ? acceptor_side : dialer_side;
    box->len = SHM_BOX_SIDE;
    atomic_fetch_add(&c->seg->refs, 1);
    box->hold = c->seg;
    return true;
}

void shm_box_release(void *hold) { shm_mapping_put(hold); }
