/* Writes the seed corpus, tests/fuzz/corpus/<target>/, with the core's own
 * encoders (hello_fill, slime_ctx_address, rpc_hdr_fill, the wire structs)
 * and the ids a fresh fuzz context gives (fuzz.h): valid inputs that reach
 * deep, and the edge cases each decoder must refuse.  Run by
 * tests/fuzz/stage.sh --corpus; its output is checked in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "rpc/lend.h"
#include "transport/shm_internal.h"
#ifdef SLIME_HAVE_VERBS
#include <infiniband/verbs.h>

#include "transport/verbs_internal.h"
#endif

static const char *root;

typedef struct buf {
    uint8_t d[16384];
    size_t n;
} buf_t;

static void put(buf_t *b, const void *p, size_t n) {
    if (b->n + n > sizeof b->d) abort();
    memcpy(b->d + b->n, p, n);
    b->n += n;
}

static void save(const char *target, const char *name, const buf_t *b) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) { perror(path); exit(1); }
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->d, 1, b->n, f) != b->n || fclose(f) != 0) { perror(path); exit(1); }
}

static void frame(buf_t *b, uint8_t type, uint8_t flags, uint32_t u32, uint32_t rkey, uint64_t a, uint64_t bb,
                  uint64_t c, uint64_t d, const void *payload, uint64_t len) {
    frame_t h = {.type = type, .flags = flags, .u32 = u32, .rkey = rkey, .a = a, .b = bb, .c = c, .d = d, .len = len};
    put(b, &h, sizeof h);
    if (payload) put(b, payload, len);
}

/* A frame in the short form (FF_SHORT): its first FRAME_SHORT bytes, the
 * length in u32. */
static void frame_short(buf_t *b, uint8_t type, uint64_t a, const void *payload, uint32_t len) {
    frame_t h = {.type = type, .flags = FF_SHORT, .u32 = len, .a = a};
    put(b, &h, FRAME_SHORT);
    if (payload) put(b, payload, len);
}

/* ---- frames ---- */

typedef struct ids {
    uint64_t send, read, write, recv, handle, region;
} ids_t;

/* The ids a fresh fuzz context gives its operations, and the receive's
 * once an announcement on tag 1 met it. */
static void frame_ids(ids_t *ids) {
    buf_t b = {0};
    frame(&b, F_RTS, 0, 0, 0, 1, 77, 64, 0, NULL, 0);
    slime_ctx_t *ctx = fz_ctx_new();
    fz_stream_t s = {b.d, b.n, false};
    slime_ep_t *ep = fz_ep_new(ctx, &s);
    fz_ops_t ops;
    fz_ops_post(ctx, ep, &ops);
    fz_ep_rx(ep);
    *ids = (ids_t){.send = ops.send->id, .read = ops.read->id, .write = ops.write->id, .recv = ops.recv->id,
                   .handle = (uint64_t)ops.mr->slot << 32 | ops.mr->gen,
                   .region = (uint64_t)(uintptr_t)ops.mr->addr};
    fz_ep_drop(ep);
    fz_ops_free(&ops);
    slime_ctx_destroy(ctx);
}

static void frames_seeds(const ids_t *id) {
    static const uint8_t bytes[512] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float twos[4] = {2, 2, 2, 2};
    const char err[] = "remote region: wrong key for region";
    static const char *const name[] = {
        "eager_matched", "eager_unexpected", "eager_combined", "eager_truncated", "rts_data",
        "rts_rdma_unexpected", "cts", "cts_truncated", "rndv_done", "write_imm", "write_bad_key",
        "read_req", "read_req_outside", "write_ack", "write_ack_error", "read_resp", "read_resp_error",
        "imm", "ping", "pong", "eager_short", "ping_not_empty", "short_not_eager", "unknown_type",
        "eager_over_cap",
    };
    static buf_t s[sizeof name / sizeof name[0]];
    int i = 0;
    frame(&s[i++], F_EAGER, 0, 0, 0, 1, 0, 0, 0, bytes, 16);
    frame(&s[i], F_EAGER, 0, 0, 0, 9, 0, 0, 0, bytes, 32);
    frame(&s[i++], F_EAGER, 0, 0, 0, 9, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_EAGER, 0, 0, 0, 2, 0, 0, 0, twos, sizeof twos);
    frame(&s[i++], F_EAGER, 0, 0, 0, 1, 0, 0, 0, bytes, 512);
    frame(&s[i], F_RTS, 0, 0, 0, 1, 77, 64, 0, NULL, 0);
    frame(&s[i++], F_DATA, 0, 0, 0, id->recv, 0, 0, 0, bytes, 64);
    frame(&s[i++], F_RTS, FF_RDMA, 0, 0x1234, 5, 78, 4096, 0x7f0000001000ull, NULL, 0);
    frame(&s[i++], F_CTS, 0, 0, 0, id->send, 42, 0, 0, NULL, 0);
    frame(&s[i++], F_CTS, 0, (uint32_t)SLIME_ERR_TRUNCATED, 0, id->send, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_RNDV_DONE, 0, 0, 0, id->send, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_WRITE, FF_IMM, 99, FZ_RKEY, id->handle, 64, 5, 0, bytes, 64);
    frame(&s[i++], F_WRITE, 0, 0, FZ_RKEY ^ 1, id->handle, 0, 6, 0, bytes, 8);
    frame(&s[i++], F_READ_REQ, 0, 0, FZ_RKEY, id->handle, 0, 7, 128, NULL, 0);
    frame(&s[i++], F_READ_REQ, 0, 0, FZ_RKEY, id->handle, FZ_REGION_LEN - 8, 8, 16, NULL, 0);
    frame(&s[i++], F_WRITE_ACK, 0, 0, 0, id->write, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_WRITE_ACK, 0, (uint32_t)SLIME_ERR_ACCESS, 0, id->write, 0, 0, 0, err, sizeof err - 1);
    frame(&s[i++], F_READ_RESP, 0, 0, 0, id->read, 0, 0, 0, bytes, 64);
    frame(&s[i++], F_READ_RESP, 0, (uint32_t)SLIME_ERR_ACCESS, 0, id->read, 0, 0, 0, err, sizeof err - 1);
    frame(&s[i], F_IMM, 0, 7, 0, 0, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_IMM, 0, 8, 0, 0, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_PING, 0, 0, 0, 0, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_PONG, 0, 0, 0, 0, 0, 0, 0, NULL, 0);
    frame_short(&s[i++], F_EAGER, 1, bytes, 8);
    frame(&s[i++], F_PING, 0, 0, 0, 5, 0, 0, 0, NULL, 0); /* pings carry nothing: a protocol error */
    frame_short(&s[i++], F_RTS, 1, NULL, 0);              /* only an eager frame is short */
    frame(&s[i++], 42, 0, 0, 0, 0, 0, 0, 0, NULL, 0);
    frame(&s[i++], F_EAGER, 0, 0, 0, 9, 0, 0, 0, NULL, 1ull << 40);
    buf_t all = {0};
    for (int k = 0; k < i; k++) {
        save("frames", name[k], &s[k]);
        if (k < i - 2) put(&all, s[k].d, s[k].n); /* every kind, in one stream */
    }
    save("frames", "all_kinds", &all);
}

/* ---- rpc ---- */

static void rpc_msg(buf_t *b, uint64_t tag, const rpc_hdr_t *h, const void *payload, size_t len) {
    uint8_t m[RPC_HDR + 64];
    memcpy(m, h, RPC_HDR);
    if (len) memcpy(m + RPC_HDR, payload, len);
    frame(b, F_EAGER, 0, 0, 0, tag, 0, 0, 0, m, RPC_HDR + len);
}

static rpc_hdr_t rpc_request(uint64_t req_id, uint64_t len, uint8_t flags) {
    rpc_hdr_t h;
    rpc_hdr_fill(&h, RPC_REQUEST, 3);
    h.flags = flags;
    h.method = FZ_RPC_METHOD;
    h.req_id = req_id;
    h.len = len;
    h.slot = SLIME_RPC_SLOT_MIN;
    return h;
}

static void rpc_seeds(void) {
    const uint64_t mbox = rpc_tag(RPC_TAG_REQ, FZ_RPC_PORT);
    static const uint8_t bulk[3000] = {9};
    rpc_hdr_t hello;
    rpc_hdr_fill(&hello, RPC_HELLO, 3);
    hello.credits = 4;
    hello.method = FZ_RPC_DIGEST;
    hello.req_id = 0xabcdef;
    buf_t b = {0};
    rpc_msg(&b, mbox, &hello, NULL, 0);
    save("rpc", "hello", &b);
    rpc_hdr_t r = rpc_request(1, 5, 0);
    rpc_msg(&b, mbox, &r, "hello", 5);
    save("rpc", "hello_request", &b);
    r = rpc_request(2, sizeof bulk, RPC_F_BULK);
    rpc_msg(&b, mbox, &r, NULL, 0);
    frame(&b, F_EAGER, 0, 0, 0, rpc_bulk_tag(RPC_TAG_BULK_REQ, 3, 2), 0, 0, 0, bulk, sizeof bulk);
    save("rpc", "hello_request_bulk", &b);
    buf_t l = {0}; /* lending (rpc/lend.h): a hello with a probe, a lent request and an in-block echo */
    rpc_lend_t probe = {.fd = 3, .ino = 1, .size = 4096};
    hello.flags = RPC_F_LENT;
    rpc_msg(&l, mbox, &hello, &probe, sizeof probe);
    hello.flags = 0;
    r = rpc_request(8, 1u << 20, RPC_F_LENT);
    rpc_lend_t block = {.fd = 3, .ino = 1, .size = 2u << 20};
    rpc_msg(&l, mbox, &r, &block, sizeof block);
    save("rpc", "lent_request", &l);
    buf_t e = {0};
    r = rpc_request(4, 2u << 20, RPC_F_BULK); /* over the target's budget */
    rpc_msg(&e, mbox, &r, NULL, 0);
    save("rpc", "bulk_over_budget", &e);
    e.n = 0;
    r = rpc_request(5, 5, 0);
    r.slot = 0; /* the reply cannot go inline: by bulk */
    rpc_msg(&e, mbox, &r, "abcde", 5);
    r = rpc_request(6, 1, 0);
    r.method = 1; /* not served */
    rpc_msg(&e, mbox, &r, "x", 1);
    r = rpc_request(7, 40, 0); /* says 40, carries 2 */
    rpc_msg(&e, mbox, &r, "xy", 2);
    save("rpc", "odd_requests", &e);
    e.n = 0;
    hello.method ^= 1; /* another service */
    rpc_msg(&e, mbox, &hello, NULL, 0);
    hello.magic ^= 1;
    rpc_msg(&e, mbox, &hello, NULL, 0);
    frame(&e, F_EAGER, 0, 0, 0, mbox, 0, 0, 0, "short", 5);
    save("rpc", "bad_hellos", &e);
}

/* ---- address and handshakes ---- */

static void address_seeds(slime_ctx_t *peer) {
    buf_t b = {.n = sizeof b.d};
    if (slime_ctx_address(peer, b.d, &b.n) != SLIME_OK) abort();
    save("address", "valid", &b);
    wire_addr_t *a = (wire_addr_t *)b.d;
    a->n_hosts = WIRE_MAX_HOSTS + 1;
    save("address", "too_many_hosts", &b);
    a->n_hosts = 0;
    save("address", "no_hosts", &b);
    a->n_hosts = 2;
    a->flags = 0xffff;
    a->cap_proof = 1;
    save("address", "every_flag", &b);
    a->version ^= 0xff;
    save("address", "other_version", &b);
    b.n -= 1;
    save("address", "short", &b);
}

/* mode byte (fuzz_hello.c), then bytes */
static void hello_save(const char *name, uint8_t mode, const void *p, size_t n, const buf_t *tail) {
    buf_t b = {0};
    put(&b, &mode, 1);
    put(&b, p, n);
    if (tail) put(&b, tail->d, tail->n);
    save("hello", name, &b);
}

static void hello_seeds(slime_ctx_t *self, slime_ctx_t *peer) {
    wire_hello_t h;
    hello_fill(self, &peer->addr, WIRE_TRANSPORT_TCP, &h);
    hello_save("valid", 0, &h, sizeof h, NULL);
    buf_t frames = {0};
    frame(&frames, F_EAGER, 0, 0, 0, 1, 0, 0, 0, "abcd", 4);
    frame(&frames, F_IMM, 0, 5, 0, 0, 0, 0, 0, NULL, 0);
    hello_save("valid_then_frames", 0, &h, sizeof h, &frames);
    hello_save("truncated", 0, &h, 20, NULL);
    wire_hello_t x = h;
    x.proof ^= 1;
    hello_save("wrong_proof", 0, &x, sizeof x, NULL);
    x = h;
    x.version = 99;
    hello_save("other_version", 0, &x, sizeof x, NULL);
    x = h;
    x.transport = WIRE_TRANSPORT_SHM;
    hello_save("shm_over_tcp", 0, &x, sizeof x, NULL);
    x.transport = WIRE_TRANSPORT_VERBS;
    hello_save("verbs_unavailable", 0, &x, sizeof x, NULL);
    x.transport = 200;
    hello_save("unknown_transport", 0, &x, sizeof x, NULL);
    x = h;
    x.magic ^= 1;
    hello_save("bad_magic", 0, &x, sizeof x, NULL);
    wire_welcome_t w = {.magic = WIRE_WELCOME_MAGIC, .version = SLIME_WIRE_VERSION, .verdict = WELCOME_OK,
                        .ctx_id = peer->id, .pid = 1};
    hello_save("welcome", 1, &w, sizeof w, NULL);
    w.verdict = WELCOME_REFUSED;
    memset(w.reason, 'r', sizeof w.reason); /* no terminator */
    hello_save("welcome_refused_unterminated", 1, &w, sizeof w, NULL);
    w.verdict = 7;
    hello_save("welcome_unknown_verdict", 1, &w, sizeof w, NULL);
}

static void shm_save(const char *name, const fz_shm_in_t *in, const buf_t *ring) {
    buf_t b = {0};
    put(&b, in, sizeof *in);
    if (ring) put(&b, ring->d, ring->n);
    save("shm", name, &b);
}

static void shm_seeds(slime_ctx_t *self, slime_ctx_t *peer) {
    fz_shm_in_t in;
    memset(&in, 0, sizeof in);
    hello_fill(self, &peer->addr, WIRE_TRANSPORT_SHM, &in.hello);
    in.flags = FZ_SHM_SEG_FD | FZ_SHM_TABLE_FD | FZ_SHM_SEG_SEALED | FZ_SHM_TABLE_SEALED;
    in.seg_len = (uint32_t)shm_seg_size(RING_MIN);
    in.table_len = sizeof(mr_shared_t);
    in.table_magic = MR_TABLE_MAGIC;
    seg_hdr_t *h = (seg_hdr_t *)in.seg_head;
    h->magic = SEG_MAGIC;
    h->ring_size = RING_MIN;
    shm_save("valid", &in, NULL);
    /* frames in the dialer's ring, a packet (shm_ring.c), the tail past them */
    buf_t frames = {0}, ring = {0};
    frame_short(&frames, F_EAGER, 1, "abcd", 4);
    frame(&frames, F_WRITE, 0, 0, 1, 1ull << 32 | 1, 0, 3, 0, "wxyz", 4);
    frame(&frames, F_IMM, 0, 5, 0, 0, 0, 0, 0, NULL, 0);
    uint64_t packet = shm_packet_header(0, (uint32_t)frames.n);
    put(&ring, &packet, sizeof packet);
    put(&ring, frames.d, frames.n);
    atomic_store(&h->ring[0].tail, frames.n);
    shm_save("valid_with_frames", &in, &ring);
    /* the peer's head of our ring, and its tail, where no writer put them */
    fz_shm_in_t x = in;
    seg_hdr_t *xh = (seg_hdr_t *)x.seg_head;
    atomic_store(&xh->ring[0].tail, 1ull << 63);
    atomic_store(&xh->ring[1].head, 3 * RING_MIN + 5);
    shm_save("ring_scribbled", &x, &ring);
    /* issue 13, 1: a ring size that wraps the segment's size check */
    x = in;
    ((seg_hdr_t *)x.seg_head)->ring_size = RING_MIN + (1ull << 63);
    shm_save("ring_size_wraps", &x, NULL);
    x = in;
    ((seg_hdr_t *)x.seg_head)->ring_size = 2 * RING_MIN;
    shm_save("ring_size_mismatch", &x, NULL);
    x = in;
    x.flags &= ~(uint32_t)FZ_SHM_SEG_SEALED;
    shm_save("segment_unsealed", &x, NULL);
    x = in;
    x.flags &= ~(uint32_t)FZ_SHM_TABLE_SEALED;
    shm_save("table_unsealed", &x, NULL);
    x = in;
    x.table_len = 64;
    shm_save("table_short", &x, NULL);
    x = in;
    x.table_magic ^= 1;
    shm_save("table_bad_magic", &x, NULL);
    x = in;
    x.seg_len = 100;
    shm_save("segment_short", &x, NULL);
    x = in;
    x.flags = FZ_SHM_SEG_FD | FZ_SHM_SEG_SEALED;
    shm_save("one_fd", &x, NULL);
    x = in;
    x.flags |= FZ_SHM_EXTRA_FD | FZ_SHM_SHORT_HELLO;
    shm_save("short_hello_three_fds", &x, NULL);
}

#ifdef SLIME_HAVE_VERBS
static void verbs_seeds(slime_ctx_t *self, slime_ctx_t *peer) {
    wire_hello_t h;
    hello_fill(self, &peer->addr, WIRE_TRANSPORT_VERBS, &h);
    wire_verbs_info_t info = {.magic = VERBS_INFO_MAGIC, .n_qps = 2, .mtu = IBV_MTU_1024, .ethernet = 1,
                              .lid = 0, .rd_atom = 16, .recv_slots = 64, .slot_size = 8192,
                              .qpn = {17, 18}, .psn = {0x123, 0x456}};
    snprintf(info.dev, sizeof info.dev, "rxe0:1 gid[1]");
    struct { const char *name; wire_verbs_info_t v; } s[] = {
        {"valid", info}, {"no_qps", info}, {"too_many_qps", info}, {"bad_mtu", info}, {"no_slots", info},
        {"dev_unterminated", info},
    };
    s[1].v.n_qps = 0;
    s[2].v.n_qps = 0xffff;
    s[3].v.mtu = 0;
    s[4].v.recv_slots = 1;
    memset(s[5].v.dev, 'd', sizeof s[5].v.dev);
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        buf_t b = {0};
        put(&b, &h, sizeof h);
        put(&b, &s[i].v, sizeof s[i].v);
        save("verbs", s[i].name, &b);
    }
    buf_t b = {0};
    put(&b, &h, sizeof h);
    put(&b, &info, 10);
    save("verbs", "info_truncated", &b);
}
#endif

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) { perror(root); return 1; }
    ids_t ids;
    frame_ids(&ids);
    frames_seeds(&ids);
    rpc_seeds();
    slime_ctx_t *self = fz_ctx_new(), *peer = fz_ctx_new();
    address_seeds(peer);
    hello_seeds(self, peer);
    shm_seeds(self, peer);
#ifdef SLIME_HAVE_VERBS
    verbs_seeds(self, peer);
#endif
    slime_ctx_destroy(self);
    slime_ctx_destroy(peer);
    return 0;
}
