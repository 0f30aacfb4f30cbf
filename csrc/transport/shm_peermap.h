/* A peer's shared allocations (core/shmem.c), mapped into this process so
 * that one-sided ops on them are plain memcpy instead of CMA. */
#ifndef DLSLIME_SHM_PEERMAP_H
#define DLSLIME_SHM_PEERMAP_H

#include "core/internal.h"

typedef struct peermap peermap_t;

/* NULL when out of memory: the caller goes on with CMA alone. */
peermap_t *peermap_new(int peer_pid, const mr_shared_t *peer_table);
void peermap_free(peermap_t *m);

/* Where the owner range [raddr, +len) of the pinned entry e lies in this
 * process, mapping e's block on first use; NULL when e is not in a
 * shared block, the range is not all inside it, or the block cannot be
 * mapped (CMA serves it then).
 * Called by one thread at a time (the progress lock). */
uint8_t *peermap_lookup(peermap_t *m, const mr_entry_t *e, uint64_t raddr, uint64_t len);

#endif
