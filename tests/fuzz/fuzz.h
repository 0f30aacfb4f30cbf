/* What the fuzz targets share: contexts made the same way in every run
 * (a fixed token, so that a corpus input's proof passes), and the peer's
 * side of an endpoint, played from the fuzzer's bytes.
 *
 * The endpoint's transport (fz_wire) is a test double of the byte stream
 * only: what it reads is the input, what the core writes to it is
 * dropped.  Everything above it (frames, protocol, matching, regions,
 * RPC) is the core's own code. */
#ifndef SLIME_FUZZ_H
#define SLIME_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "transport/transport.h"

#define FZ_TOKEN "dlslime-fuzz"
#define FZ_PEER_ID 0x7065657266757a7aull
/* The region peers' one-sided frames may name, fixed so a seed can name it. */
#define FZ_REGION_LEN 4096
#define FZ_RKEY 0x5eed0001u
#define FZ_RPC_PORT 7
#define FZ_RPC_DIGEST 0x6469676573747a7aull
#define FZ_RPC_METHOD 0x6d6574686f647a7aull

/* A context made as every run makes it; aborts when it cannot be made
 * (then the target has nothing to test). */
slime_ctx_t *fz_ctx_new(void);
/* One context for a whole run, for the targets that leave no state in it. */
slime_ctx_t *fz_ctx_shared(void);

typedef struct fz_stream {
    const uint8_t *p;
    size_t n;
    bool open;                /* readable: fz_ep_rx opens it */
} fz_stream_t;

/* An endpoint to peer FZ_PEER_ID, up, whose incoming bytes are s, which
 * nobody reads before fz_ep_rx: the progress thread must not race the
 * target's posts. */
slime_ep_t *fz_ep_new(slime_ctx_t *ctx, fz_stream_t *s);
/* Receives frames until s is consumed or the endpoint fails. */
void fz_ep_rx(slime_ep_t *ep);
/* Takes ep down and frees it (nothing else may hold it). */
void fz_ep_drop(slime_ep_t *ep);
void fz_ep_drop_locked(slime_ep_t *ep);
/* Under ctx->lock: closes every pending connection and drops every
 * endpoint, so that an input leaves nothing for the next one. */
void fz_ctx_sweep_locked(slime_ctx_t *ctx);

/* What the peer's frames can answer or name: a region with rkey FZ_RKEY,
 * receives on tags 1 (plain) and 2 (combining), a rendezvous send on tag
 * 3, a read and a write of the region, an immediate wait.  Posted in this
 * order in a fresh context, their wire ids are the same in every run. */
typedef struct fz_ops {
    slime_mr_t *mr;
    slime_req_t *recv, *reduce, *send, *read, *write, *imm;
} fz_ops_t;
void fz_ops_post(slime_ctx_t *ctx, slime_ep_t *ep, fz_ops_t *ops);
void fz_ops_free(fz_ops_t *ops);

/* The shm target's input: the dialer's hello and the memory it passes
 * (transport/shm_handshake.c), then the bytes of its ring to us. */
enum {
    FZ_SHM_SEG_FD = 1,        /* the hello carries the segment's fd */
    FZ_SHM_TABLE_FD = 2,      /* ...and the MR table's */
    FZ_SHM_SEG_SEALED = 4,    /* sealed against resizing */
    FZ_SHM_TABLE_SEALED = 8,
    FZ_SHM_SHORT_HELLO = 16,  /* a message shorter than a hello */
    FZ_SHM_EXTRA_FD = 32,     /* a third fd */
};
/* a header, the boxes and two rings of 16 KiB (transport/shm_internal.h) */
#define FZ_SHM_SEG_MAX shm_seg_size(16384)
typedef struct fz_shm_in {
    wire_hello_t hello;
    uint32_t flags;           /* FZ_SHM_* */
    uint32_t seg_len;         /* the segment memfd's size, mod FZ_SHM_SEG_MAX + 1 */
    uint32_t table_len;       /* the table memfd's size, at most a table's */
    uint32_t pad;
    uint64_t table_magic;
    _Alignas(64) uint8_t seg_head[512]; /* the segment's first bytes: its header, the rings' heads and tails */
} fz_shm_in_t;

/* A connected pair of unix sockets of type (SOCK_STREAM, SOCK_SEQPACKET). */
void fz_socketpair(int type, int sv[2]);

#endif
