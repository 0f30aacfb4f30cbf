/* Everything that crosses a process boundary: the address blob, the
 * handshake, the MR descriptor and the frames of the stream protocol.
 * All fields are little-endian, fixed width; the handshake refuses a peer
 * whose magic or wire version differs, so nothing here is ever guessed. */
#ifndef SLIME_WIRE_H
#define SLIME_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "dlslime/dlslime.h"

#define WIRE_ADDR_MAGIC 0x444c5341u  /* "ASLD" */
#define WIRE_HELLO_MAGIC 0x4c4c4548u /* "HELL" */
#define WIRE_WELCOME_MAGIC 0x434c4557u
#define WIRE_DESC_MAGIC 0x524d4c53u  /* "SLMR" */
#define WIRE_MAX_HOSTS 8
/* Bytes of the secret a context's id is the digest of (token.c). */
#define SLIME_ID_SECRET 16

/* Where a peer can be reached and what decides "same host".  The core
 * fills the identity; each transport open in the context sets its bit
 * of flags and fills the fields it uses (transport/transport.h says
 * whose they are), and judges a peer's address by them. */
typedef struct wire_addr {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;                 /* ADDR_HAS_*, one bit per transport */
    uint64_t ctx_id;
    uint8_t boot_id[16];
    uint64_t pid_ns, net_ns;
    uint32_t uid;
    uint32_t pid;
    uint16_t port;
    uint16_t n_hosts;
    uint32_t hosts[WIRE_MAX_HOSTS]; /* IPv4, network byte order */
    /* ADDR_CAPABILITY: the digests of the context's own random token
     * (token.c), which a dialer presents; else zero, and the dialer
     * presents its own (a job's shared token) */
    uint64_t cap_proof, cap_job;
} wire_addr_t;
/* wire_addr_t.flags: the core's bit, above the transports' (ADDR_HAS_*) */
#define ADDR_CAPABILITY 0x8000u

/* First message on a new connection, dialer -> acceptor. */
typedef struct wire_hello {
    uint32_t magic;
    uint16_t version;
    uint8_t transport; /* the wire id of the dialer's transport */
    uint8_t pad;
    uint64_t proof;    /* digest of the job token; see token.c */
    uint64_t ctx_id;   /* the dialer */
    uint32_t pid;
    uint32_t pad2;
    uint64_t job;      /* the dialer's job id: what its descriptors carry */
    uint8_t id_secret[SLIME_ID_SECRET]; /* ctx_id is its digest: the dialer's proof of its id */
} wire_hello_t;

enum { WELCOME_OK = 0, WELCOME_REFUSED = 1, WELCOME_DUPLICATE = 2 };

/* Reply, acceptor -> dialer. */
typedef struct wire_welcome {
    uint32_t magic;
    uint16_t version;
    uint16_t verdict;
    uint64_t ctx_id;   /* the acceptor */
    uint32_t pid;
    uint32_t pad;
    char reason[96];
} wire_welcome_t;

/* The 64 bytes of slime_mr_desc_t. */
typedef struct wire_desc {
    uint32_t magic;
    uint16_t version;
    uint16_t access;
    uint64_t ctx_id;
    uint64_t job;      /* job id derived from the token (not the proof) */
    uint64_t handle;   /* slot << 32 | generation */
    uint32_t rkey;
    uint32_t pad;
    uint64_t addr;
    uint64_t len;
    uint64_t reserved;
} wire_desc_t;
_Static_assert(sizeof(wire_desc_t) == sizeof(slime_mr_desc_t), "desc size");

/* Frames of the stream protocol: a fixed header, then len payload bytes. */
enum frame_type {
    F_EAGER = 1,     /* a = tag; payload = message */
    F_RTS = 2,       /* a = tag, b = send req id, c = message length;
                        FF_RDMA: d = sender's address, rkey = its verbs
                        rkey (the receiver may fetch it by RDMA READ), or
                        0 over tcp (fetched by CMA: tcp_cma.c) */
    F_CTS = 3,       /* a = send req id, b = recv req id, u32 = status */
    F_DATA = 4,      /* a = recv req id; payload = message */
    F_WRITE = 5,     /* a = handle, b = offset, c = initiator req id,
                        rkey, u32 = imm if FF_IMM; payload = data */
    F_WRITE_ACK = 6, /* a = initiator req id, u32 = status; payload = text */
    F_READ_REQ = 7,  /* a = handle, b = offset, c = initiator req id,
                        d = length, rkey */
    F_READ_RESP = 8, /* a = initiator req id, u32 = status;
                        payload = data, or the error text */
    F_IMM = 9,       /* u32 = imm (after a write that went by CMA) */
    F_RNDV_DONE = 10, /* a = send req id, u32 = status: the receiver fetched
                        an FF_RDMA rendezvous itself */
    F_PING = 11,     /* no fields: answer with F_PONG (liveness.c) */
    F_PONG = 12,     /* no fields: we are here */
    F_TYPE_MAX = 13,
};
#define FF_IMM 0x1u
#define FF_RDMA 0x2u
/* The short form of an F_EAGER frame: only the first FRAME_SHORT bytes
 * (type to a) go on the wire, with the payload's length in u32.  A small
 * message then fits one cache line with its payload and the shm ring's
 * packet header (shm_ring.c): an 8-byte send is 32 bytes, not 72. */
#define FF_SHORT 0x4u
#define FRAME_SHORT 16u

typedef struct frame {
    uint8_t type;
    uint8_t flags;
    uint16_t pad;
    uint32_t u32;
    uint64_t a;    /* here, in the short form's bytes */
    uint32_t rkey;
    uint32_t pad2;
    uint64_t b, c, d;
    uint64_t len;
} frame_t;
_Static_assert(sizeof(frame_t) == 56, "frame header size");
_Static_assert(offsetof(frame_t, a) + sizeof(uint64_t) == FRAME_SHORT, "the short form ends with a");

#define WIRE_ERRTEXT_MAX 256

#endif
