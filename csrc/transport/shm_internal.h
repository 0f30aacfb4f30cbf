/* The shm transport's private objects, shared by its files:
 *   shm.c            the transport's table, its per-context state, and a
 *                    connection's life (built from a handshake, closed)
 *   shm_handshake.c  listening, dialing and accepting (segment and MR
 *                    table fds passed over a unix socket)
 *   shm_ring.c       the two rings of the frame stream, and doorbells
 *   shm_box.c        the shared boxes (p2p_box_t) between header and rings
 *   shm_rma.c        one-sided ops by CMA or mapped blocks, split among
 *                    the copy team, small ones coalesced
 *   shm_pins.c       the pins on the peer's MR table, counted where the
 *                    peer finds them if this process ends mid-copy */
#ifndef SLIME_SHM_INTERNAL_H
#define SLIME_SHM_INTERNAL_H

#include "transport/shm_peermap.h"
#include "transport/transport.h"

#define SEG_MAGIC 0x534c494d45534547ull
#define SEG_HDR 4096
/* The shared boxes (shm_box.c): slots between the header and the rings,
 * each with a side of SHM_BOX_SIDE bytes per process (the dialer's
 * first).  A side holds two messages of up to 8 KiB and the lines its
 * owner answers and sleeps on (coll/pairbox.c): 260 KiB per connection,
 * mapped with the rings. */
#define SHM_BOX_SLOTS 8
#define SHM_BOX_SIDE ((16u << 10) + 256)
#define SHM_BOX_AREA ((size_t)SHM_BOX_SLOTS * 2 * SHM_BOX_SIDE)

/* The pins area (shm_pins.c): a side per process (the dialer's first),
 * each a count per slot of the other's MR table of the pins this side
 * holds on it right now: 32 KiB per connection. */
#define SHM_PINS_SIDE ((size_t)MR_TABLE_SLOTS * sizeof(uint32_t))
#define SHM_PINS_AREA (2 * SHM_PINS_SIDE)

/* The ring sizes a segment may have (DLSLIME_SHM_RING, or a dialer's
 * header): bounded, so that the segment's size cannot overflow, and
 * whole lines (SHM_LINE), where the packets start. */
#define RING_MIN 4096ull
#define RING_MAX (1ull << 32)
#define SHM_LINE 64u

/* A ring carries packets (shm_ring.c), each at the start of a line: an
 * 8-byte header, then len bytes of the frame stream.  The header is
 * the packet's length and its stamp, which the writer stores last and
 * the reader polls: a small frame arrives in the one line it reads.
 * The stamp is the packet's line number in the stream (mod 2^32), so a
 * header the last lap left there is told from a new one. */
#define SHM_PACKET_HDR 8u
static inline uint32_t shm_stamp(uint64_t pos) { return (uint32_t)(pos / SHM_LINE); }
static inline uint64_t shm_packet_header(uint64_t pos, uint32_t len) {
    return (uint64_t)shm_stamp(pos) << 32 | len;
}

typedef struct ring {
    /* the writer's count of stream bytes sent: what waits behind a parked
     * payload (shm_rx_beyond), not what the reader polls */
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint64_t head;       /* the reader's position: room */
    _Atomic uint32_t want_space;              /* producer waits for room */
} ring_t;

typedef struct seg_hdr {
    uint64_t magic;
    uint64_t ring_size;
    ring_t ring[2];                           /* [0]: dialer -> acceptor */
} seg_hdr_t;
_Static_assert(sizeof(seg_hdr_t) <= SEG_HDR, "segment header");

/* Unmapped one-sided ops larger than this (DLSLIME_SHM_CMA_MAX) go by the
 * rings, as frames the target's progress thread serves.  Past the
 * last-level cache both ways are bound by memory traffic, and CMA moves
 * three streams (the source, the destination read for ownership, the
 * destination written) where the rings move two (the ring stays cached
 * and its reader streams past the cache): 64 MiB took 5.7-6.1 ms by CMA
 * and 3.6-4.4 ms by the rings, while 16 MiB was level. */
#define CMA_MAX (32u << 20)

/* The segment's mapping: the connection holds it, and so does every box
 * open on it, since a thread may still poll a box after the connection
 * closed (the peer died); the last to let go unmaps it. */
typedef struct shm_mapping {
    uint8_t *addr;
    size_t len;
    _Atomic int refs;
} shm_mapping_t;

typedef struct shm_conn {
    int sock;
    shm_mapping_t *seg;
    bool dialer;
    ring_t *tx, *rx;
    uint8_t *txd, *rxd;
    uint64_t size, chunk;
    /* the tx ring's head as last read: the reader moves it with every
     * message, so a fresh read is a cache miss on each send's path; a
     * stale one only understates the room, and is read again then */
    uint64_t tx_head_seen;
    /* Each side's own end of its rings, kept here: the copies in the
     * segment are for the peer to read (and are the peer's to scribble
     * on), and the offsets into the ring spare a division by the ring's
     * size on every read and write.  Positions count the ring's bytes
     * (packet headers and padding too), sent and got the stream's. */
    uint64_t tx_pos, tx_sent, rx_pos, rx_got;
    size_t tx_at, rx_at;                      /* tx_pos, rx_pos modulo size */
    size_t rx_left, rx_pad;                   /* of the packet being read: bytes, then padding */
    bool rx_head_unfenced;                    /* room given back, a writer's request not yet looked at */
    /* the tx ring's lines whose start holds payload of the last lap, a
     * bit each: a new packet's header must not follow one of those */
    uint64_t *tx_stale;
    mr_shared_t *peer;                        /* the peer's MR table */
    _Atomic uint32_t *my_pins, *peer_pins;    /* the pins area's sides (shm_pins.c) */
    int peer_pid;
    bool cma;
    size_t cma_max;                           /* larger unmapped ops go by the rings */
    /* whether our rendezvous offer the receiver a fetch (shm_fetch.c) */
    enum { SHM_FETCH_NEVER, SHM_FETCH_CROWDED, SHM_FETCH_ALWAYS } fetch;
    size_t fetch_max;                         /* ...up to this size (crowded, or asked for) */
    size_t fetch_roomy_min;                   /* ...from this size on a roomy host */
    peermap_t *map;                           /* the peer's shared blocks mapped here */
    bool hung_up;                             /* its socket said so; the ring may still hold bytes */
} shm_conn_t;

/* shm.c */
/* One more doorbell rung (SLIME_COUNTER_DOORBELLS). */
void shm_count_doorbell(slime_ctx_t *ctx);
/* One more rendezvous fetched (SLIME_COUNTER_SHM_FETCHES). */
void shm_count_fetch(slime_ctx_t *ctx);
/* n more pins a dead peer left, taken off (SLIME_COUNTER_DEAD_PEER_PINS). */
void shm_count_dead_pins(slime_ctx_t *ctx, uint64_t n);
/* The pid of the process at the other end of a unix socket, or 0. */
int shm_peer_pid(int sock);
/* fd mapped shared, read-write; NULL on failure. */
void *shm_map(int fd, size_t len);
/* A ring segment mapped with its pages faulted in (creator: allocated
 * first), up to a bound; NULL on failure. */
void *shm_map_ring(int fd, size_t len, bool creator);
/* For a ring between RING_MIN and RING_MAX. */
static inline size_t shm_seg_size(uint64_t ring) { return SEG_HDR + SHM_BOX_AREA + SHM_PINS_AREA + 2 * ring; }
/* A connection over the mapped segment seg, of two rings of ring bytes
 * (checked, and never read again from the segment), and the peer's MR
 * table: owns sock, seg and peer from then on; NULL when out of memory. */
shm_conn_t *shm_conn_new(int sock, uint8_t *seg, size_t seg_len, uint64_t ring, mr_shared_t *peer, bool dialer);

/* shm_pins.c */
/* mr_table_acquire on the peer's table, noting the pin in our side of
 * the pins area; shm_unpin undoes both. */
slime_status_t shm_pin(shm_conn_t *c, uint64_t handle, uint32_t rkey, uint64_t off, uint64_t len,
                       unsigned access, uint64_t *addr, char *why, size_t whylen);
void shm_unpin(shm_conn_t *c, uint64_t handle);
/* As the connection closes: if the peer's process has ended, takes the
 * pins it noted off our MR table. */
void shm_pins_reclaim(slime_ctx_t *ctx, shm_conn_t *c);

/* shm_handshake.c */
slime_status_t shm_listen(uint64_t ctx_id, int *fd);
slime_status_t shm_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline, void **conn,
                        int *fd_out, wire_welcome_t *w);
int shm_read_hello(slime_ctx_t *ctx, pending_conn_t *pc);
slime_status_t shm_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc, const wire_welcome_t *w, void **conn);

/* shm_ring.c */
ssize_t shm_writev(slime_ep_t *ep, const struct iovec *iov, int n);
ssize_t shm_read(slime_ep_t *ep, void *dst, size_t n);
size_t shm_rx_peek(slime_ep_t *ep, size_t n, const uint8_t **at);
void shm_rx_consume(slime_ep_t *ep, size_t k);
bool shm_rx_ready(slime_ep_t *ep);
bool shm_rx_beyond(slime_ep_t *ep, size_t n);
bool shm_has_work(slime_ep_t *ep);
void shm_fd_event(slime_ep_t *ep, uint32_t events);
/* memcpy with non-temporal stores (past the cache). */
void shm_copy_stream(uint8_t *dst, const uint8_t *src, size_t n);

/* shm_fetch.c: rendezvous the receiver fetches by CMA */
void shm_fetch_init(shm_conn_t *c);
void shm_rndv_offer(slime_ep_t *ep, slime_req_t *send, frame_t *rts);
slime_status_t shm_rndv_fetch(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq, uint64_t raddr, uint32_t rkey,
                              uint64_t len);

/* shm_box.c */
int shm_box_slots(slime_ep_t *ep);
bool shm_box_open(slime_ep_t *ep, int slot, p2p_box_t *box);
void shm_box_release(void *hold);
/* Lets go of a hold on the segment's mapping (the last unmaps it). */
void shm_mapping_put(shm_mapping_t *m);

/* shm_rma.c */
slime_status_t shm_rma(slime_ep_t *ep, slime_req_t *req, size_t max);

#endif
