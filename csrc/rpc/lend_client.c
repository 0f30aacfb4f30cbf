/* The client's side of lending (see lend.h): blocks of shared memory, a
 * small table of them that the process's clients reuse call after call. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rpc/lend.h"

/* Blocks grow in steps of this much: payloads of nearby sizes share one. */
#define LEND_ROUND (2u << 20)
/* The first channel's probe, faulted in (as payload_pool.c primes the
 * pool): the first large call after connect finds its block ready. */
#define LEND_PRIME_MB 8
/* Blocks the process keeps. */
#define LEND_BLOCKS 8

bool lend_wanted(const slime_ep_t *ep) { return ep->verified_pid != 0 && !env_off("DLSLIME_RPC_LEND"); }

lend_block_t *lend_block_new(size_t cap) {
    lend_block_t *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    if (memfd_sealed("dlslime-rpc-lend", cap, &b->fd) != SLIME_OK) {
        free(b);
        return NULL;
    }
    struct stat sb;
    /* faulted in here, in one go: the first payload copied in would take
     * a fault per page (7 ms for 16 MiB, against 1.3 ms to copy it) */
    void *p = fstat(b->fd, &sb) == 0 ? mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, b->fd, 0)
                                     : MAP_FAILED;
    if (p == MAP_FAILED) {
        close(b->fd);
        free(b);
        return NULL;
    }
    b->map = p;
    b->cap = cap;
    b->ino = (uint64_t)sb.st_ino;
    atomic_init(&b->refs, 1);
    return b;
}

lend_block_t *lend_probe_new(void) {
    static pthread_mutex_t prime_mu = PTHREAD_MUTEX_INITIALIZER;
    static bool primed;
    pthread_mutex_lock(&prime_mu);
    size_t cap = primed ? 0 : env_size("DLSLIME_RPC_POOL_PRIME_MB", LEND_PRIME_MB) << 20;
    primed = true;
    pthread_mutex_unlock(&prime_mu);
    lend_block_t *b = cap >= LEND_MIN ? lend_block_new(cap) : NULL;
    return b ? b : lend_block_new(4096);
}

void lend_block_unref(lend_block_t *b) {
    if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1) return;
    munmap(b->map, b->cap);
    close(b->fd);
    free(b);
}

void lend_block_drop(void *b) { lend_block_unref(b); }

void lend_describe(const lend_block_t *b, rpc_lend_t *d) {
    *d = (rpc_lend_t){.fd = b->fd, .ino = b->ino, .size = b->cap};
}

static bool idle(const lend_block_t *b) { return atomic_load_explicit(&b->refs, memory_order_acquire) == 1; }

/* The process's blocks, shared by its clients (as payload_pool.c's idle
 * buffers are): a channel opened later finds one faulted in already. */
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static lend_block_t *table[LEND_BLOCKS];

/* Under table_mu: the entry of the smallest idle block of at least len
 * bytes (-1: none), and in *spare an empty entry, else the smallest idle
 * block's (-1: every block busy). */
static int find_locked(size_t len, size_t max, int *spare) {
    int best = -1;
    *spare = -1;
    for (int i = 0; i < LEND_BLOCKS; i++) {
        lend_block_t *b = table[i];
        if (!b) {
            if (*spare < 0 || table[*spare]) *spare = i;
            continue;
        }
        if (!idle(b)) continue;
        if (b->cap >= len && b->cap <= max && (best < 0 || b->cap < table[best]->cap)) best = i;
        if (*spare < 0 || (table[*spare] && b->cap < table[*spare]->cap)) *spare = i;
    }
    return best;
}

lend_block_t *lend_take(size_t len, size_t max, bool *made) {
    *made = false;
    pthread_mutex_lock(&table_mu);
    int spare, best = find_locked(len, max, &spare);
    size_t cap = len <= SIZE_MAX - LEND_ROUND ? (len + LEND_ROUND - 1) / LEND_ROUND * LEND_ROUND : len;
    if (best < 0 && spare >= 0) {
        /* an empty entry, or the smallest idle block, makes way for one
         * large enough (made under the lock: at most LEND_BLOCKS times
         * for a size, and a second caller would make another) */
        lend_block_t *b = lend_block_new(cap < max ? cap : max);
        if (b) {
            lend_block_unref(table[spare]);
            table[spare] = b;
            *made = true;
            best = spare;
        }
    }
    lend_block_t *b = best < 0 ? NULL : table[best];
    if (b) atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&table_mu);
    return b;
}

bool lend_keep(lend_block_t *b) {
    pthread_mutex_lock(&table_mu);
    int spare;
    (void)find_locked(SIZE_MAX, SIZE_MAX, &spare);
    bool kept = spare >= 0 && !table[spare];
    if (kept) table[spare] = b;
    pthread_mutex_unlock(&table_mu);
    return kept;
}

void lend_forget(lend_block_t *b) {
    pthread_mutex_lock(&table_mu);
    for (int i = 0; i < LEND_BLOCKS; i++)
        if (table[i] == b) {
            table[i] = NULL;
            lend_block_unref(b);
        }
    pthread_mutex_unlock(&table_mu);
}
