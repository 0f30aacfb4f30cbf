/* Two ranks on one host: small collectives through a shared box.
 *
 * Through the core, a message costs each side a request, a frame, the
 * context's lock and a pass of the progress engine: an 8-byte allreduce
 * of two processes took 1.0-1.9 us here, where Open MPI's took 0.3-0.5
 * (its shared-memory fast boxes).  A cache line from one core to the
 * other costs about 0.1 us.  So a two-rank communicator whose endpoint
 * offers boxes (p2p_box_t: shm) agrees with its peer on one at its
 * first small collective, and from then on such a collective writes its
 * data into its own side of the box and reads the peer's, with no
 * request, frame or lock.
 *
 * A side (len bytes) holds a ring of message heads, two large buffers
 * and two lines:
 *   head[seq % HEADS]  stamp, total, and a small message's data (up to
 *                      SMALL bytes: an 8-byte message is one line)
 *   large[seq & 1]     a larger message's data (up to cap bytes)
 *   done     the stamp of the last message read from the peer's side
 *   sleep    non-zero while its owner sleeps on a futex in the box
 * Messages are numbered per communicator (seq: the same on both ranks,
 * since both run its collectives in the same order); a rank writes only
 * the messages its part of a collective sends (a broadcast's root alone,
 * both ranks in an exchange).  A stamp packs the communicator's id and
 * epoch with seq, so what an earlier user of the slot left behind never
 * passes for a message.  Before a rank writes a head or a large buffer
 * again it waits until the reader is done with its last message there
 * (a head: with seq - HEADS), and often knows without looking: every
 * collective keeps the rule that a rank writes message seq only after
 * it released every earlier message it reads, so a message of the
 * peer's numbered seq says it read ours up to seq - 1.
 *
 * The ring is for a broadcast's root, which only writes: small ones run
 * up to HEADS messages ahead of the reader, as eager sends would, and
 * the reader finds them in consecutive lines, which the hardware fetches
 * ahead.  With two buffers each message waited for the reader's last
 * one but one: 8-byte broadcasts took 0.19 us at the root (p50), Open
 * MPI's 0.06.
 *
 * total is the whole collective's size at the writer, which the reader
 * compares with its own: ranks that disagree on the size fail at once,
 * as they do through messages.
 *
 * The peer may write its side at any time: only a stamp equal to the one
 * wanted is believed, and no size or offset is taken from it. */
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"

#define LINE 64u
#define MSG_DATA 16u                /* the data's offset in a message */
#define SEQ_BITS 40
#define SEQ_MASK ((1ull << SEQ_BITS) - 1)
#define NAP_MS 10                   /* a sleeper's look at deadline and peer */
#define NAP_UNSURE_MS 1             /* ...and its nap when a wake-up may be missed */
/* the collective step that carries the offers (exchange.c names it) */
#define AGREE_STEP (COLL_STEP_LIMIT - 4)

typedef struct box_offer {
    uint32_t slots;                 /* free here, a bit each (0: no boxes) */
    uint32_t pad;
} box_offer_t;

#define HEADS 32u                   /* the ring of message heads */
#define HEAD_BYTES (2 * LINE)
#define SMALL (HEAD_BYTES - MSG_DATA)  /* data a head carries */
#define RING_BYTES ((size_t)HEADS * HEAD_BYTES)

static size_t large_stride(size_t len) { return ((len - RING_BYTES - 2 * LINE) / 2) & ~(size_t)(LINE - 1); }

size_t pairbox_cap(const slime_comm_t *c) { return large_stride(c->box.len); }

static uint64_t stamp_of(const slime_comm_t *c, uint64_t seq) {
    return (uint64_t)c->id << 48 | (uint64_t)c->epoch << SEQ_BITS | (seq & SEQ_MASK);
}

static _Atomic uint64_t *msg_stamp(uint8_t *side, uint64_t seq) {
    return (_Atomic uint64_t *)(side + (seq % HEADS) * HEAD_BYTES);
}
static uint8_t *msg_large(uint8_t *side, size_t len, uint64_t seq) {
    return side + RING_BYTES + (seq & 1) * large_stride(len);
}
static _Atomic uint64_t *done_word(uint8_t *side, size_t len) {
    return (_Atomic uint64_t *)(side + RING_BYTES + 2 * large_stride(len));
}
static _Atomic uint32_t *sleep_word(uint8_t *side, size_t len) {
    return (_Atomic uint32_t *)(side + RING_BYTES + 2 * large_stride(len) + LINE);
}
static uint8_t *theirs(const slime_comm_t *c) { return (uint8_t *)c->box.theirs; }

static long futex(void *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

/* After writing a word of our side: a peer asleep on it needs a wake. */
static void wake_peer(slime_comm_t *c, _Atomic uint64_t *word) {
    p2p_shared_fence_writer(c->ctx);
    if (atomic_load_explicit(sleep_word(theirs(c), c->box.len), memory_order_relaxed))
        futex((void *)word, FUTEX_WAKE, INT_MAX, NULL);
}

/* Whether waiting on is worth it; the run fails with the reason if not. */
static bool still_waiting(coll_run_t *r, uint64_t now, const char *what) {
    slime_comm_t *c = r->comm;
    int peer = 1 - c->rank;
    char text[600];
    slime_status_t told = abort_received(c, text, sizeof text);
    if (!run_check_members(r, told, text)) return false;
    slime_status_t st = slime_ep_status(c->peers[peer]);
    if (st != SLIME_OK)
        return run_fail(r, st, "%s: %s rank %d: %s", r->phase, what, peer,
                        p2p_ep_down_reason(c->peers[peer]));
    if (now >= run_deadline(r, now))
        return run_fail(r, SLIME_ERR_TIMEOUT, "%s: %s rank %d: timed out after %lld ms "
                        "(the collective's timeout)", r->phase, what, peer, (long long)r->timeout_ms);
    return true;
}

/* Sleeps on word (the peer's side) while it holds seen, for at most a nap. */
static void nap(slime_comm_t *c, _Atomic uint64_t *word, uint64_t seen) {
    _Atomic uint32_t *flag = sleep_word(c->box.mine, c->box.len);
    atomic_store(flag, 1); /* before the last look: see wake_peer */
    long ms = p2p_shared_fence_sleeper() ? NAP_MS : NAP_UNSURE_MS;
    if (atomic_load(word) == seen) {
        struct timespec ts = {0, ms * 1000000l};
        /* the stamp's low half (x86: the first four bytes) changes with
         * every message */
        futex((void *)word, FUTEX_WAIT, (uint32_t)seen, &ts);
    }
    atomic_store(flag, 0);
}

/* Waits until *word is want (a message's stamp) or, at_least, a done word
 * at or past want; false, the run failed, when there is reason to give up. */
static bool box_wait(coll_run_t *r, _Atomic uint64_t *word, uint64_t want, bool at_least, const char *what) {
    slime_comm_t *c = r->comm;
    uint64_t start = 0, spins = 0;
    bool told = false;
    bool ok;
    for (;;) {
        uint64_t v = atomic_load_explicit(word, memory_order_acquire);
        /* done words: the same communicator, at or past want */
        if (at_least ? (v >> SEQ_BITS) == (want >> SEQ_BITS) && (v & SEQ_MASK) >= (want & SEQ_MASK) : v == want) {
            ok = true;
            break;
        }
        if (++spins & 63) { cpu_relax(); continue; }
        uint64_t t = now_ns();
        if (!start) start = t;
        if (!(ok = still_waiting(r, t, what))) break;
        if (t - start < P2P_WAIT_YIELD_NS) continue;
        if (t - start < P2P_WAIT_SPIN_NS) { sched_yield(); continue; }
        if (!told) { /* a stopped peer fails the endpoint within the silence limit */
            p2p_ep_wait_begin(c->peers[1 - c->rank]);
            told = true;
        }
        nap(c, word, v);
    }
    if (told) p2p_ep_wait_end(c->peers[1 - c->rank]);
    return ok;
}

/* Asks for a line of our next message head in the exclusive state:
 * the reader's copy (it read the head HEADS messages ago) must go
 * before we may write it, a round trip between cores that a locked
 * instruction after the write (any lock or counter) would otherwise
 * wait out on the collective's path. */
static inline void prefetch_for_write(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

/* Until the peer has read our message seq (none to wait for at 0). */
static bool peer_done_with(coll_run_t *r, uint64_t seq) {
    slime_comm_t *c = r->comm;
    if (seq <= c->box_peer_done) return true;
    _Atomic uint64_t *done = done_word(theirs(c), c->box.len);
    if (!box_wait(r, done, stamp_of(c, seq), true, "send to")) return false;
    /* all the peer read, which may be well past seq: the next messages
     * need not look (the word changes with every message it reads) */
    uint64_t ahead = (atomic_load_explicit(done, memory_order_acquire) - seq) & SEQ_MASK;
    c->box_peer_done = seq + (ahead < (1ull << (SEQ_BITS - 1)) ? ahead : 0);
    return true;
}

bool pairbox_put(coll_run_t *r, uint64_t seq, const void *data, size_t len, uint64_t total) {
    slime_comm_t *c = r->comm;
    if (seq > HEADS && !peer_done_with(r, seq - HEADS)) return false;
    _Atomic uint64_t *stamp = msg_stamp(c->box.mine, seq);
    if (len > SMALL) {
        if (!peer_done_with(r, c->box_written[seq & 1])) return false;
        memcpy(msg_large(c->box.mine, c->box.len, seq), data, len);
        c->box_written[seq & 1] = seq;
    } else if (len) {
        memcpy((uint8_t *)stamp + MSG_DATA, data, len);
    }
    ((uint64_t *)stamp)[1] = total;
    atomic_store_explicit(stamp, stamp_of(c, seq), memory_order_release);
    wake_peer(c, stamp);
    const uint8_t *next = (const uint8_t *)msg_stamp(c->box.mine, seq + 1);
    prefetch_for_write(next);
    prefetch_for_write(next + LINE);
    return true;
}

const uint8_t *pairbox_get(coll_run_t *r, uint64_t seq, size_t len, uint64_t total) {
    slime_comm_t *c = r->comm;
    _Atomic uint64_t *stamp = msg_stamp(theirs(c), seq);
    if (!box_wait(r, stamp, stamp_of(c, seq), false, "recv from")) return NULL;
    uint64_t got = read_once_u64(&((const uint64_t *)stamp)[1]);
    if (got != total) {
        run_fail(r, SLIME_ERR_INVAL, "%s: recv from rank %d: got %llu bytes, expected %llu (do all ranks pass the "
                 "same sizes?)", r->phase, 1 - c->rank, (unsigned long long)got, (unsigned long long)total);
        return NULL;
    }
    /* the peer wrote seq only after it released our messages before it */
    if (c->box_peer_done < seq - 1) c->box_peer_done = seq - 1;
    return len > SMALL ? msg_large(theirs(c), c->box.len, seq) : (const uint8_t *)stamp + MSG_DATA;
}

void pairbox_release(slime_comm_t *c, uint64_t seq) {
    _Atomic uint64_t *done = done_word(c->box.mine, c->box.len);
    atomic_store_explicit(done, stamp_of(c, seq), memory_order_release);
    wake_peer(c, done);
}

/* The two ranks offer each other the slots free at their end and take
 * the lowest both offered: the same answer at both ends. */
static bool agree(coll_run_t *r) {
    slime_comm_t *c = r->comm;
    int peer = 1 - c->rank;
    slime_ep_t *ep = c->peers[peer];
    box_offer_t mine = {0, 0}, other = {0, 0};
    if (!env_off("DLSLIME_PAIR_BOX")) mine.slots = p2p_box_reserve(ep);
    const char *phase = r->phase;
    r->phase = "shared box set-up";
    bool ok = run_exchange(r, peer, &mine, sizeof mine, peer, &other, sizeof other, AGREE_STEP);
    r->phase = phase;
    uint32_t both = ok ? mine.slots & other.slots : 0;
    int slot = both ? __builtin_ctz(both) : -1;
    p2p_box_unreserve(ep, slot < 0 ? mine.slots : mine.slots & ~(1u << slot));
    c->box_state = PAIRBOX_OFF;
    /* a box with no room for a message's data is no box; both ends map
     * the same one (the wire version fixes its size) */
    if (slot >= 0 && p2p_box_open(ep, slot, &c->box)) {
        if (c->box.len > RING_BYTES + 2 * LINE && large_stride(c->box.len) >= LINE) {
            memset(c->box.mine, 0, c->box.len);
            c->box_state = PAIRBOX_ON;
        } else {
            p2p_box_close(&c->box);
        }
    }
    return ok;
}

bool pairbox_usable(coll_run_t *r, size_t bytes) {
    slime_comm_t *c = r->comm;
    if (c->size != 2 || c->box_state == PAIRBOX_OFF || bytes > coll_pair_box_bytes()) return false;
    /* agreed on at the first collective that could use a box: both ranks
     * run it, with the same size */
    if (c->box_state == PAIRBOX_UNKNOWN && !agree(r)) return false;
    return c->box_state == PAIRBOX_ON;
}

void pairbox_close(slime_comm_t *c) {
    if (c->box_state == PAIRBOX_ON) p2p_box_close(&c->box);
    c->box_state = PAIRBOX_OFF;
}
