/* The pipelined ring: the blocks of a buffer (or blocks at addresses of
 * their own, ring_at) travel around the ranks in chunks.  At step s every rank sends block (rank + shift - s) to its
 * right neighbour and receives block (rank + shift - s - 1) from its left
 * one; the first reduce_steps steps combine what arrives with the local
 * block (reduce-scatter), the rest copy it into place (allgather).  A
 * chunk is forwarded as soon as it is ready, so a chunk is reduced while
 * the next ones are on the wire: receives are posted `window` chunks
 * ahead, each reduce step's chunk landing in a scratch slot of its own.
 *
 * A link between neighbours on one host (shm) can go by one-sided reads
 * instead (in-place plans): the sender registers each block (a region
 * apiece, since blocks may be scattered), announces
 * each chunk that is ready with an empty message, and the receiver
 * copies it straight out of the sender's buffer (one copy, by CMA,
 * instead of one into the shared ring and one out of it).  The sender of
 * a link chooses and says so first (link_hello_t), so both ends always
 * agree; DLSLIME_COLL_CMA=0 turns it off.  Below the size where reads
 * may be taken (links_setup) no hello is sent: coll_cma_min_bytes() for
 * reducing rings, coll_cma_copy_min_bytes() for copying ones (they say
 * what was measured).
 *
 * A chunk may be overwritten by the next step's data only after its
 * reader is done with it.  That holds by causality: the value that will
 * overwrite it can only exist after the reader combined (or copied) it.
 *
 * Tags: chunk c of step s is step s * kmax + c, kmax being the chunk
 * count of the largest block; both neighbours compute the same. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/reduce_kernels.h"

#define RING_WINDOW 4
/* Copy steps of a ring over at least this many bytes land their chunks
 * past the cache (run_recv_cold): a chunk is only one piece of the
 * buffer, nobody reads it before the collective ends, and in a large
 * buffer it would be evicted first; skipping the line fills leaves the
 * memory bus to the other copies.  The shm stream does the same for
 * one receive from 4 MiB (STREAM_MIN).  Measured with 2-rank all_reduce
 * over shm, per-op medians, alternating: 64 MiB 13.4-16.2 -> 12.2-13.5
 * ms, 16 MiB level or better. */
#define RING_COLD_MIN (4u << 20)
/* steps of the link set-up messages, above every chunk's (modulo the
 * step space: messages of one tag between a pair match in order) */
#define STEP_HELLO (COLL_STEP_LIMIT - 2)
#define STEP_DONE (COLL_STEP_LIMIT - 3)

typedef struct link_hello {
    uint32_t by_read;               /* 1: the receiver reads, desc names the blocks */
    uint32_t pad;
    slime_mr_desc_t desc[];         /* per block (n): a region each, as blocks may be scattered */
} link_hello_t;

void ring_block(const ring_plan_t *p, int n, int b, size_t *off, size_t *len) {
    size_t base = p->total / (size_t)n, rem = p->total % (size_t)n, ub = (size_t)b;
    *len = base + (ub < rem ? 1 : 0);
    *off = ub * base + (ub < rem ? ub : rem);
}

uint8_t *ring_at(const ring_plan_t *p, int n, int b, size_t first) {
    if (!p->blocks) return p->buf + first * p->esize;
    size_t off, len;
    ring_block(p, n, b, &off, &len);
    return p->blocks[b] + (first - off) * p->esize;
}

const uint8_t *ring_src_at(const ring_plan_t *p, int n, int b, size_t first) {
    if (!p->src_blocks) return p->src + first * p->esize;
    size_t off, len;
    ring_block(p, n, b, &off, &len);
    return p->src_blocks[b] + (first - off) * p->esize;
}

/* A unit's place: chunk c of the block received at step s. */
typedef struct ring_pos {
    int s;
    size_t c;
} ring_pos_t;

typedef struct ring_state {
    coll_run_t *r;
    const ring_plan_t *p;
    int n, rank, left, right;
    size_t ce;                      /* elements per chunk */
    size_t kmax;
    uint8_t *slots;                 /* window * ce * esize */
    int *sends;                     /* sends not yet reaped, in post order */
    size_t nsends, sends_head;
    int *dst_send;                  /* FROM_SRC: per chunk, a send still reading dst */
    /* one-sided links */
    bool read_in, read_out;         /* we read from left / right reads from us */
    slime_mr_t **block_mrs;         /* per block (n), NULL where not registered */
    slime_mr_t *slots_mr;
    link_hello_t *hello_in, *hello_out;
    size_t hello_len;
    int reads[RING_WINDOW];         /* the read of each window unit, or -1 */
    size_t read_next;               /* first unit whose read is not posted */
    int done_h;                     /* right's "finished reading us" */
    bool fold;                      /* reduce steps receive with slime_recv_reduce */
    /* the pipeline: units (a chunk of a step) are received in order,
     * up to RING_WINDOW of them posted ahead of the one processed */
    size_t total_units, posted, done;
    ring_pos_t post, proc;          /* the next unit to post, to process */
    int window[RING_WINDOW];        /* the receive of each window unit */
} ring_state_t;

static int send_block(const ring_state_t *g, int s) { return mod_rank(g->rank + g->p->shift - s, g->n); }
static int recv_block(const ring_state_t *g, int s) { return send_block(g, s + 1); }

static size_t chunks_of(const ring_state_t *g, int b) {
    size_t off, len;
    ring_block(g->p, g->n, b, &off, &len);
    return (len + g->ce - 1) / g->ce;
}

/* Chunk c of block b: its first element and length. */
static void chunk_of(const ring_state_t *g, int b, size_t c, size_t *first, size_t *len) {
    size_t off, blen;
    ring_block(g->p, g->n, b, &off, &blen);
    *first = off + c * g->ce;
    *len = blen - c * g->ce < g->ce ? blen - c * g->ce : g->ce;
}

/* Moves pos past the steps it has run out of chunks of. */
static void pos_settle(const ring_state_t *g, ring_pos_t *pos) {
    while (pos->s < g->p->steps && pos->c >= chunks_of(g, recv_block(g, pos->s))) {
        pos->s++;
        pos->c = 0;
    }
}

static void pos_next(const ring_state_t *g, ring_pos_t *pos) {
    pos->c++;
    pos_settle(g, pos);
}

static uint32_t unit_step(const ring_state_t *g, int s, size_t c) {
    return (uint32_t)(((uint64_t)s * g->kmax + c) % COLL_STEP_LIMIT);
}

/* Frees the sends that completed, oldest first. */
static void reap_sends(ring_state_t *g) {
    while (g->sends_head < g->nsends && run_test(g->r, g->sends[g->sends_head])) g->sends_head++;
}

/* Sends chunk c of step s (len bytes): fetched by the receiver where
 * it only copies it, into its place or a scratch slot; streamed where
 * an in-place ring reduces, whose receiver may combine its chunks
 * straight out of the stream (fold_decide). */
static int chunk_send(ring_state_t *g, int s, size_t c, const void *data, size_t len) {
    bool copied = g->p->reduce_steps == 0 || g->p->mode != RING_INPLACE;
    /* a run of no more units than the window posts every receive before
     * its first send (ring_run), and so does our right neighbour: ours
     * finds its receive posted unless that rank comes late.  Its chunks
     * are too few for a pipeline to hide a rendezvous's round trip each.
     * Through torch, 2 ranks over tcp, medians of 4 (us): all_reduce
     * 1 MiB 335 -> 285, 4 MiB 1247 -> 1140, all_gather 512 KiB 113 -> 86,
     * reduce_scatter 512 KiB 135 -> 96, 1 MiB 272 -> 233.  Over shm the
     * same runs were level within their noise (+-15%), so shm links,
     * whose rendezvous the receiver may fetch, keep them */
    bool posted = g->total_units <= RING_WINDOW && !p2p_ep_can(g->r->comm->peers[g->right], P2P_CAP_CPU_RMA);
    uint32_t step = unit_step(g, s, c);
    if (copied) return run_send_fetched(g->r, g->right, step, data, len, posted, g->p->reduce_steps == 0);
    return posted ? run_send_to_posted(g->r, g->right, step, data, len) : run_send(g->r, g->right, step, data, len);
}

/* Passes chunk c of step s on: the bytes, or (read link) a notice. */
static bool send_tracked(ring_state_t *g, int s, size_t c, const void *data, size_t len) {
    int h = g->read_out ? run_send(g->r, g->right, unit_step(g, s, c), NULL, 0)
                        : chunk_send(g, s, c, data, len * g->p->esize);
    if (h < 0) return false;
    g->sends[g->nsends++] = h;
    return true;
}

/* An in-place reduce step takes its chunk with a combining receive
 * (slime_recv_reduce): the chunk is reduced into the block straight out
 * of the transport (the shm ring), instead of being copied into a
 * scratch slot and read again from there; 16-64 MiB all_reduce on two
 * ranks over shm spent about a fifth of its time on that copy.  Chunks
 * read one-sidedly land in slots, and FROM_SRC combines two inputs into
 * a third buffer, so both keep the slots.
 *
 * Decides g->fold, once the links are agreed on (both ends of a link
 * need not agree: a combining receive matches any send).  A buffer not
 * aligned for its elements (a caller's odd pointer) keeps the slots, as
 * slime_recv_reduce refuses it. */
static void fold_decide(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    g->fold = p->mode == RING_INPLACE && !g->read_in;
    for (int b = 0; g->fold && b < g->n; b++) {
        size_t off, len;
        ring_block(p, g->n, b, &off, &len);
        if (len && (uintptr_t)ring_at(p, g->n, b, off) % p->esize) g->fold = false;
    }
}

static uint8_t *slot_of(const ring_state_t *g, size_t unit) {
    return g->slots + (unit % RING_WINDOW) * g->ce * g->p->esize;
}

/* Where the chunk of step s lands: a scratch slot, or its place in buf. */
static uint8_t *recv_target(const ring_state_t *g, int s, size_t c, size_t unit) {
    const ring_plan_t *p = g->p;
    if (s < p->reduce_steps) return slot_of(g, unit);
    size_t first, len;
    chunk_of(g, recv_block(g, s), c, &first, &len);
    return ring_at(p, g->n, recv_block(g, s), first);
}

/* The chunk of step s arrived: combine or keep it, then pass it on. */
static bool ring_process(ring_state_t *g, int s, size_t c, size_t unit) {
    const ring_plan_t *p = g->p;
    coll_run_t *r = g->r;
    int b = recv_block(g, s);
    size_t first, len;
    chunk_of(g, b, c, &first, &len);
    const size_t es = p->esize;
    bool last_reduce = s == p->reduce_steps - 1;
    if (p->mode == RING_FROM_SRC) {
        /* partial sums are staged in dst (exactly one block), chunk c at
         * c * ce; the send of the previous step's partial must be done
         * before its chunk is overwritten.  That send went to the right
         * neighbour one step ago, so this wait never forms a cycle */
        uint8_t *out = p->dst + c * g->ce * es;
        if (g->dst_send[c] >= 0) {
            if (!run_wait_one(r, g->dst_send[c])) return false;
            g->dst_send[c] = -1;
        }
        red_combine(p->dtype, p->redop, out, slot_of(g, unit), ring_src_at(p, g->n, b, first), len);
        if (last_reduce) {
            if (p->avg) red_divide(p->dtype, out, len, g->n);
            return true;
        }
        g->dst_send[c] = chunk_send(g, s + 1, c, out, len * es);
        return g->dst_send[c] >= 0;
    }
    uint8_t *region = ring_at(p, g->n, b, first);
    if (s < p->reduce_steps) {
        if (!g->fold) red_accumulate(p->dtype, p->redop, region, slot_of(g, unit), len);
        if (last_reduce && p->avg) red_divide(p->dtype, region, len, g->n);
    }
    if (s + 1 < p->steps) return send_tracked(g, s + 1, c, region, len);
    return true;
}

/* ---- one-sided links ---- */

/* Reads pay where they are one copy by this CPU (the shm stream costs
 * two); a NIC's reads would free the CPU instead, a different trade. */
static bool link_reads_by_cpu(const ring_state_t *g, int peer) {
    return p2p_ep_can(g->r->comm->peers[peer], P2P_CAP_CPU_RMA);
}

static bool cma_allowed(void) {
    return !env_off("DLSLIME_COLL_CMA");
}

static void blocks_dereg(ring_state_t *g) {
    /* dereg waits for a peer's copy still under way (a failed run) */
    for (int b = 0; b < g->n; b++) {
        if (g->block_mrs[b]) slime_mr_dereg(g->block_mrs[b]);
        g->block_mrs[b] = NULL;
    }
}

/* Registers every non-empty block, a region each (blocks may lie
 * anywhere), with their descriptors into descs when not NULL. */
static slime_status_t blocks_reg(ring_state_t *g, unsigned access, slime_mr_desc_t *descs) {
    const ring_plan_t *p = g->p;
    for (int b = 0; b < g->n; b++) {
        size_t off, len;
        ring_block(p, g->n, b, &off, &len);
        if (len == 0) continue;
        slime_status_t st =
            slime_mr_reg(g->r->comm->ctx, ring_at(p, g->n, b, off), len * p->esize, access, &g->block_mrs[b]);
        if (st == SLIME_OK && descs) st = slime_mr_desc(g->block_mrs[b], &descs[b]);
        if (st != SLIME_OK) return st;
    }
    return SLIME_OK;
}

/* The size from which an in-place plan's links may read (the same on
 * every rank); SIZE_MAX for other plans. */
static size_t reads_min_bytes(const ring_state_t *g) {
    const ring_plan_t *p = g->p;
    if (p->mode != RING_INPLACE) return SIZE_MAX;
    int n = g->r->comm->size;
    return p->reduce_steps > 0 ? coll_cma_min_bytes(n) : coll_cma_copy_min_bytes(n);
}

/* The size from which a plan cuts its chunks for reading links: where
 * its links read on a host with a core for each rank (or from what the
 * environment sets, which every rank must set alike), whatever this
 * host's cores. */
static size_t read_chunks_min(const ring_plan_t *p) {
    if (p->mode != RING_INPLACE) return SIZE_MAX;
    /* one rank: the size for a communicator that crowds no host */
    return p->reduce_steps > 0 ? coll_cma_min_bytes(1) : coll_cma_copy_min_bytes(1);
}

/* Agrees with both neighbours on how each link moves chunks.  Below
 * reads_min_bytes() both ends know that no link reads, so they exchange
 * nothing: a hello round trip cost every ring collective a small
 * message's latency and a meeting of the neighbours before the first
 * chunk could move. */
static bool links_setup(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    coll_run_t *r = g->r;
    g->done_h = -1;
    for (int k = 0; k < RING_WINDOW; k++) g->reads[k] = -1;
    size_t bytes = p->total * p->esize;
    if (bytes < reads_min_bytes(g)) return true;
    /* a hello goes only over a link whose ends may read (shm): both ends
     * see the same transport, so over tcp neither waits for one */
    bool out_may = link_reads_by_cpu(g, g->right), in_may = link_reads_by_cpu(g, g->left);
    if (!out_may && !in_may) return true;
    if (out_may && cma_allowed()) {
        if (blocks_reg(g, SLIME_ACCESS_REMOTE_READ, g->hello_out->desc) == SLIME_OK)
            g->hello_out->by_read = 1;
        else
            blocks_dereg(g); /* the right neighbour gets the bytes sent instead */
    }
    g->read_out = g->hello_out->by_read == 1;
    const char *phase = r->phase;
    r->phase = "ring set-up";
    int h_in = -1;
    if (in_may && (h_in = run_recv(r, g->left, STEP_HELLO, g->hello_in, g->hello_len)) < 0) return false;
    if (out_may && run_send(r, g->right, STEP_HELLO, g->hello_out, g->hello_len) < 0) return false;
    if (g->read_out && (g->done_h = run_recv(r, g->right, STEP_DONE, NULL, 0)) < 0) return false;
    if (in_may && !run_wait_one(r, h_in)) return false;
    r->phase = phase;
    g->read_in = in_may && g->hello_in->by_read == 1;
    if (!g->read_in) return true;
    /* reads land in the blocks or in registered scratch */
    if (!g->read_out) {
        slime_status_t st = blocks_reg(g, 0, NULL);
        if (st != SLIME_OK) return run_fail(r, st, "%s: cannot register the buffer: %s", r->phase, slime_last_error());
    }
    if (p->reduce_steps > 0) {
        g->slots = comm_rma_scratch(r->comm, (size_t)RING_WINDOW * g->ce * p->esize, &g->slots_mr);
        if (!g->slots) return run_fail(r, SLIME_ERR_NOMEM, "%s: out of registered scratch", r->phase);
    }
    return true;
}

/* Posts the reads of every unit in the window whose notice came. */
static bool post_reads(ring_state_t *g, size_t posted, size_t wait_for, const int *window) {
    const ring_plan_t *p = g->p;
    coll_run_t *r = g->r;
    while (g->read_next < posted) {
        size_t u = g->read_next;
        int k = (int)(u % RING_WINDOW);
        bool have = u == wait_for ? run_wait_one(r, window[k]) : run_test(r, window[k]);
        if (!have) return run_ok(r) && u != wait_for;
        /* which (step, chunk) u is: walk from the unit being processed */
        int s = 0;
        size_t c = u, left_units;
        while ((left_units = chunks_of(g, recv_block(g, s))) <= c) {
            c -= left_units;
            s++;
        }
        int b = recv_block(g, s);
        size_t first, len, boff, blen;
        chunk_of(g, b, c, &first, &len);
        ring_block(p, g->n, b, &boff, &blen);
        /* offsets within block b's region, on both sides */
        size_t at = (first - boff) * p->esize;
        bool to_slot = s < p->reduce_steps;
        slime_mr_t *mr = to_slot ? g->slots_mr : g->block_mrs[b];
        size_t local_off = to_slot ? (size_t)(slot_of(g, u) - g->slots) : at;
        g->reads[k] = run_read(r, g->left, unit_step(g, s, c), mr, local_off, &g->hello_in->desc[b], at,
                               len * p->esize);
        if (g->reads[k] < 0) return false;
        g->read_next++;
    }
    return true;
}

static void links_close(ring_state_t *g) {
    if (g->block_mrs) blocks_dereg(g);
}

/* ---- the run ---- */

/* Whether every link of the ring may read (shm, CMA allowed): agreed on
 * by all ranks once per communicator, at its first ring that would cut
 * reading chunks, since each rank sees only its own links and all must
 * cut the same chunks.  False when the run failed. */
static bool read_links_agreed(ring_state_t *g) {
    slime_comm_t *c = g->r->comm;
    if (c->read_links != READ_LINKS_UNKNOWN) return true;
    bool mine = cma_allowed() && link_reads_by_cpu(g, g->left) && link_reads_by_cpu(g, g->right), all;
    if (!run_agree_all(g->r, mine, &all)) return false;
    c->read_links = all ? READ_LINKS_ALL : READ_LINKS_NOT_ALL;
    return true;
}

/* Cuts the chunks and allocates the arrays of g; false (the run failed)
 * when out of memory. */
static bool ring_alloc(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    /* the same on every rank: other chunks from the size where the links
     * may read on a host with a core per rank.  Not by reads_min_bytes(),
     * which follows the host's cores: ranks on hosts of different sizes
     * would cut different chunks.  A copying ring's are twice as large:
     * one syscall and one page walk per chunk, and nothing to do between
     * them.  A reducing ring's are half as large where every link may
     * read (read_links_agreed): the neighbour reads each one back
     * sooner.  p2p_bench allreduce over shm, 2 ranks, 1 MiB / 256 KiB
     * chunks (medians of 4-6 alternating, avg us): 2 MiB 336 / 329,
     * 4 MiB 586 / 549, 16 MiB 2161 / 2007, 32 MiB 5220 / 4682, 128 MiB
     * 32774 / 31461, 64 and 256 MiB level.  Over tcp they lost 2-3x
     * (eager chunks past the receives posted), and allgather lost with
     * them (4 MiB 192 / 228, 256 MiB 25544 / 29633). */
    size_t chunk = coll_chunk_bytes();
    if (p->total * p->esize >= read_chunks_min(p)) {
        if (p->reduce_steps > 0 && !read_links_agreed(g)) return false;
        bool halve = p->reduce_steps > 0 && g->r->comm->read_links == READ_LINKS_ALL;
        chunk = halve ? chunk / 2 : chunk * 2;
    }
    g->ce = chunk / p->esize;
    if (g->ce == 0) g->ce = 1;
    g->kmax = (p->total / (size_t)g->n + 1 + g->ce - 1) / g->ce;

    size_t total_sends = 0;
    for (int s = 0; s < p->steps; s++) {
        total_sends += chunks_of(g, send_block(g, s));
        g->total_units += chunks_of(g, recv_block(g, s));
    }
    g->sends = malloc((total_sends ? total_sends : 1) * sizeof *g->sends);
    g->dst_send = malloc((g->kmax ? g->kmax : 1) * sizeof *g->dst_send);
    g->block_mrs = calloc((size_t)g->n, sizeof *g->block_mrs);
    g->hello_len = sizeof(link_hello_t) + (size_t)g->n * sizeof(slime_mr_desc_t);
    g->hello_in = calloc(1, g->hello_len);
    g->hello_out = calloc(1, g->hello_len);
    if (!g->sends || !g->dst_send || !g->block_mrs || !g->hello_in || !g->hello_out)
        return run_fail(g->r, SLIME_ERR_NOMEM, "%s: out of memory", g->r->phase);
    for (size_t c = 0; c < g->kmax; c++) g->dst_send[c] = -1;
    return true;
}

static void ring_free(ring_state_t *g) {
    free(g->sends);
    free(g->dst_send);
    free(g->block_mrs);
    free(g->hello_in);
    free(g->hello_out);
}

/* Everything before the first chunk moves: arrays, links, slots. */
static bool ring_setup(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    coll_run_t *r = g->r;
    if (!ring_alloc(g) || !links_setup(g)) return false;
    fold_decide(g);
    if (p->reduce_steps > 0 && !g->slots && !g->fold) {
        g->slots = comm_scratch(r->comm, (size_t)RING_WINDOW * g->ce * p->esize);
        if (!g->slots) return run_fail(r, SLIME_ERR_NOMEM, "%s: out of memory for scratch", r->phase);
    }
    return true;
}

/* plan.own_src into this rank's block. */
static void own_into_place(const ring_state_t *g) {
    size_t off, len;
    ring_block(g->p, g->n, g->rank, &off, &len);
    memmove(ring_at(g->p, g->n, g->rank, off), g->p->own_src, len * g->p->esize);
}

/* Step 0 depends on nothing: all of it at once (above the eager limit a
 * send is only an announcement until the receiver asks).  An own block
 * given apart (own_src) is sent from there, and copied into its place
 * only then, while the neighbour fetches it: copied first, its lines
 * were the neighbour's to read (it fetched them the call before) and
 * each store took them back, a 512 KiB copy 48 us instead of about 10
 * (all_gather 1 MiB through torch, 2 ranks over shm: 88 us out of place
 * against 31 in place).  A link that reads our blocks in place needs it
 * there before its notice. */
static bool send_first_block(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    int b0 = send_block(g, 0);
    const uint8_t *own = p->mode == RING_INPLACE && b0 == g->rank ? p->own_src : NULL;
    size_t own_off = 0, own_len;
    if (own && g->read_out) {
        own_into_place(g);
        own = NULL;
    }
    if (own) ring_block(p, g->n, b0, &own_off, &own_len);
    bool ok = true;
    for (size_t c = 0; ok && c < chunks_of(g, b0); c++) {
        size_t first, len;
        chunk_of(g, b0, c, &first, &len);
        const uint8_t *at = p->mode == RING_FROM_SRC ? ring_src_at(p, g->n, b0, first)
                            : own                    ? own + (first - own_off) * p->esize
                                                     : ring_at(p, g->n, b0, first);
        ok = send_tracked(g, 0, c, at, len);
    }
    if (own) own_into_place(g);
    return ok;
}

/* Posts the receive of unit g->posted (at g->post) into its window slot:
 * a notice (read link), a combining receive, or a plain one. */
static bool post_unit(ring_state_t *g) {
    const ring_plan_t *p = g->p;
    coll_run_t *r = g->r;
    const int s = g->post.s;
    const size_t c = g->post.c;
    int k = (int)(g->posted % RING_WINDOW);
    size_t first, len;
    chunk_of(g, recv_block(g, s), c, &first, &len);
    uint32_t step = unit_step(g, s, c);
    if (g->read_in)
        g->window[k] = run_recv(r, g->left, step, NULL, 0);
    else if (s < p->reduce_steps && g->fold)
        g->window[k] = run_recv_reduce(r, g->left, step, ring_at(p, g->n, recv_block(g, s), first), len, p->dtype,
                                       p->redop);
    else if (s >= p->reduce_steps && p->total * p->esize >= RING_COLD_MIN)
        g->window[k] = run_recv_cold(r, g->left, step, recv_target(g, s, c, g->posted), len * p->esize);
    else
        g->window[k] = run_recv(r, g->left, step, recv_target(g, s, c, g->posted), len * p->esize);
    g->posted++;
    pos_next(g, &g->post);
    return g->window[k] >= 0;
}

/* Waits for unit g->done (at g->proc), processes it, keeps the reads of
 * the window going and reaps the sends that finished. */
static bool process_unit(ring_state_t *g) {
    coll_run_t *r = g->r;
    int k = (int)(g->done % RING_WINDOW);
    bool ok;
    if (g->read_in) {
        ok = post_reads(g, g->posted, g->done, g->window) && run_wait_one(r, g->reads[k]);
        g->reads[k] = -1;
    } else {
        ok = run_wait_one(r, g->window[k]);
    }
    ok = ok && ring_process(g, g->proc.s, g->proc.c, g->done);
    g->done++;
    pos_next(g, &g->proc);
    if (ok && g->read_in) ok = post_reads(g, g->posted, SIZE_MAX, g->window);
    reap_sends(g);
    return ok;
}

/* Keeps RING_WINDOW receives posted ahead of the unit being processed. */
static bool post_window(ring_state_t *g) {
    bool ok = true;
    while (ok && g->posted < g->total_units && g->posted < g->done + RING_WINDOW) ok = post_unit(g);
    return ok;
}

static bool ring_pipeline(ring_state_t *g) {
    bool ok = true;
    while (ok && g->done < g->total_units) ok = post_window(g) && process_unit(g);
    return ok;
}

/* A reader tells us when it is done with our buffer; we tell ours.  Then
 * every message of the run must be over: nothing may read buf once it is
 * deregistered.  On failure the rest is released. */
static bool ring_finish(ring_state_t *g, bool ok) {
    coll_run_t *r = g->r;
    const char *phase = r->phase;
    if (g->read_in || g->read_out) r->phase = "ring end";
    if (ok && g->read_in) ok = run_send(r, g->left, STEP_DONE, NULL, 0) >= 0;
    if (ok && g->done_h >= 0) ok = run_wait_one(r, g->done_h);
    if (ok) ok = run_wait_all(r);
    if (!ok) run_release(r);
    links_close(g);
    if (ok) r->phase = phase;
    return ok;
}

bool ring_run(coll_run_t *r, const ring_plan_t *p) {
    slime_comm_t *comm = r->comm;
    ring_state_t g = {.r = r, .p = p, .n = comm->size, .rank = comm->rank};
    if (g.n == 1 || p->steps == 0) return true;
    g.left = mod_rank(g.rank - 1, g.n);
    g.right = mod_rank(g.rank + 1, g.n);
    bool ok = ring_setup(&g);
    pos_settle(&g, &g.post);
    pos_settle(&g, &g.proc);
    /* the receives go first: a neighbour's chunk that finds its receive
     * posted lands in place, where one that comes first is copied into
     * an unexpected message and again out of it */
    ok = ok && post_window(&g) && send_first_block(&g) && ring_pipeline(&g);
    ok = ring_finish(&g, ok);
    ring_free(&g);
    return ok && run_ok(r);
}
