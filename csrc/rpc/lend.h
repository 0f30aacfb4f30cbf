/* Large payloads in shared memory that a client lends to a server on its
 * host.
 *
 * Why: a 16 MiB echo over shm moved the bytes twice, client to server and
 * back, each time through the ring, and those copies were its whole cost.
 * A client on the same host instead copies a large payload once into a
 * block of its own shared memory (a memfd sealed against resizing); the
 * server maps the block (pidfd_getfd, which the kernel allows where it
 * allows CMA) and hands its handler a view of it, with no copy.  A reply
 * whose bytes lie in the request's own payload (an echo, a slice of it, a
 * buffer changed in place) goes back as an offset, and the client reads
 * it in place.
 *
 * Who owns a block: the client's process, always (its clients share a
 * table of them, so a channel opened later finds one faulted in).  It is
 * lent from the request to the reply; a reply in place hands it to the
 * request's result, until that is freed.  A server whose handler kept a
 * view of it past the reply says so (RPC_F_KEPT), and the client drops
 * the block from the table: the pages live on in the server's mapping
 * until that goes, and the client never writes into memory someone still
 * views.  The server keeps the mappings it made (LEND_CACHE idle ones per
 * peer) for the next lend of the same block: mapping and faulting 16 MiB
 * again on each call costs more than the copy it saves.
 *
 * Where it cannot work (another host, a kernel that refuses pidfd_getfd,
 * DLSLIME_RPC_LEND=0) the hello's probe block is not fetched, and every
 * call goes by the mailbox and bulk transfers. */
#ifndef SLIME_RPC_LEND_H
#define SLIME_RPC_LEND_H

#include "rpc/rpc_internal.h"

/* Payloads from this size are lent (a smaller one costs about as much
 * through the ring, and a block per call would waste memory). */
#define LEND_MIN (1u << 20)

/* On the wire, inline after the header of a lent request or a hello. */
typedef struct rpc_lend {
    int32_t fd;       /* the memfd's number in the client */
    uint32_t zero;
    uint64_t ino;     /* its inode, checked once fetched */
    uint64_t size;    /* bytes the server maps: the memfd is at least as large */
} rpc_lend_t;

/* ---- client (lend_client.c) ---- */
typedef struct lend_block {
    _Atomic int refs; /* the client's table: 1; each request or result using it: 1 */
    int fd;
    uint64_t ino;
    uint8_t *map;
    size_t cap;
} lend_block_t;

/* Whether this client may lend: DLSLIME_RPC_LEND is not 0 and the
 * endpoint reaches a process the kernel named (shm). */
bool lend_wanted(const slime_ep_t *ep);
/* A block of cap bytes (faulted in); NULL if none could be made. */
lend_block_t *lend_block_new(size_t cap);
/* The hello's probe: the process's first one is a block of
 * DLSLIME_RPC_POOL_PRIME_MB (8) that the client keeps to lend, later
 * ones a small block; NULL if none could be made. */
lend_block_t *lend_probe_new(void);
void lend_block_unref(lend_block_t *b);
/* lend_block_unref for rpc_mem_adopt: a result read in place, detached. */
void lend_block_drop(void *b);
void lend_describe(const lend_block_t *b, rpc_lend_t *d);
/* An idle block of the process's table of len to max bytes (len <= max:
 * the server's limit), with a reference for the caller (*made: a new one;
 * the table makes room for it if it can); NULL: every block is busy, or
 * none could be made. */
lend_block_t *lend_take(size_t len, size_t max, bool *made);
/* b joins the table (the caller's reference goes with it) if there is an
 * empty entry; false (the reference is still the caller's) if not. */
bool lend_keep(lend_block_t *b);
/* The server kept b: out of the table, never lent again. */
void lend_forget(lend_block_t *b);

/* ---- server (lend_server.c) ---- */
typedef struct lend_map lend_map_t;

/* Whether the process at pid lets us fetch and map the probe d. */
bool lend_probe_ok(uint32_t pid, const rpc_lend_t *d);
/* Under srv->mu: the mapping of the block d names, lent by peer p for a
 * payload of len bytes, with a reference for the call; NULL with a
 * reason in why.  size_max bounds what a peer may make us map.  prefault:
 * a new mapping has its pages faulted in now (a hello's probe: the first
 * handler that reads or writes its payload takes no fault per page). */
lend_map_t *lend_map_get_locked(rpc_peer_t *p, const rpc_lend_t *d, uint64_t len, uint64_t size_max, bool prefault,
                                char *why, size_t whylen);
uint8_t *lend_map_base(const lend_map_t *m);
/* Under srv->mu: the call is done with m (it stays cached for the next
 * lend of its block). */
void lend_map_put_locked(rpc_peer_t *p, lend_map_t *m);
/* Under srv->mu: m leaves the cache and becomes memory of the caller's,
 * unmapped by slime_rpc_mem_free; returns its base (NULL: no memory). */
void *lend_map_detach_locked(rpc_peer_t *p, lend_map_t *m);
/* p's mappings, when p goes (none referenced then). */
void lend_maps_free(rpc_peer_t *p);

#endif
