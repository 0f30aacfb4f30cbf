/* Memory of large RPC payloads, kept for reuse.
 *
 * Why: malloc hands out large blocks as fresh mappings and unmaps them on
 * free, so every large call paid for faulting in its buffers (about a
 * microsecond per 4 KiB page: more than moving the bytes on shm).  A
 * payload of POOL_MIN bytes or more comes from here and goes back here
 * when freed; a few idle buffers (DLSLIME_RPC_POOL_MB, 256 MiB by
 * default) stay faulted in for the next call.  slime_rpc_mem_free takes
 * any pointer the RPC layer handed out, pooled or not.  Pooled buffers
 * are watched (slime_mem_watch) from malloc to free, so transports that
 * register send/recv buffers (verbs) keep their registrations too.
 *
 * A block that the pool has no idle one for is still faulted in afresh:
 * the first calls after start-up, or a larger payload than before.  A
 * block of HUGE_PAGE bytes or more is aligned to HUGE_PAGE and asks for
 * transparent huge pages, so it faults in a few 2 MiB pages instead of
 * 512 small ones each (a 4 MiB payload: 2 faults, not 1024; the 4 KiB
 * faults cost a cold 4 MiB call several milliseconds in a VM).
 *
 * And a fresh process has no idle block at all: the first channel it
 * opens (client or server) primes the pool with one faulted block of
 * DLSLIME_RPC_POOL_PRIME_MB (8 by default, 0 for none), which a pooled
 * payload of any size up to it may take when no closer block is idle, so
 * the first large call after connect finds its memory ready.
 *
 * Memory of another kind may be adopted (rpc_mem_adopt: a lent block's
 * mapping that a call's payload lies in), so that slime_rpc_mem_free
 * still takes whatever the RPC layer handed out. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rpc/rpc_internal.h"

#define POOL_MIN (256u << 10)
#define POOL_ROUND (64u << 10)
#define POOL_IDLE_MAX 8
#define PRIME_MB_DEFAULT 8
#define HUGE_PAGE (2u << 20) /* a transparent huge page on x86-64 and arm64 (4 KiB base pages) */

typedef struct pooled {
    void *p;
    size_t cap;
    bool primed; /* the block rpc_mem_prime made: lent for any size it fits */
    void (*drop)(void *arg); /* memory adopted (rpc_mem_adopt): how it goes */
    void *arg;
} pooled_t;

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pooled_t *lent;               /* handed out, not yet freed */
static size_t n_lent, cap_lent;
static pooled_t idle[POOL_IDLE_MAX]; /* oldest first */
static size_t n_idle, idle_bytes;
static size_t idle_max;              /* bytes; read once */

/* Under pool_mu: records p as handed out; false when out of memory. */
static bool lend_locked(pooled_t b) {
    pooled_t *grown = array_room(lent, n_lent, &cap_lent, sizeof *lent, 16);
    if (!grown) return false;
    lent = grown;
    lent[n_lent++] = b;
    return true;
}

static size_t idle_max_locked(void) {
    if (!idle_max) idle_max = env_size("DLSLIME_RPC_POOL_MB", 256) << 20;
    return idle_max;
}

/* A pooled buffer goes back to malloc: end its watch first. */
static void release(void *p) {
    (void)slime_mem_unwatch(p);
    free(p);
}

/* A new block of cap bytes. */
static void *fresh_block(size_t cap) {
    if (cap < HUGE_PAGE) return malloc(cap);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, cap)) return NULL;
    (void)madvise(p, cap, MADV_HUGEPAGE); /* advice: small pages if refused */
    return p;
}

void *rpc_mem_alloc(size_t len) {
    if (len < POOL_MIN) return malloc(len ? len : 1);
    pthread_mutex_lock(&pool_mu);
    (void)idle_max_locked();
    size_t best = n_idle;
    for (size_t i = 0; i < n_idle; i++) /* the smallest that fits, if not twice too large */
        if (idle[i].cap >= len && (idle[i].cap / 2 <= len || idle[i].primed) &&
            (best == n_idle || idle[i].cap < idle[best].cap))
            best = i;
    if (best < n_idle && lend_locked(idle[best])) {
        void *p = idle[best].p;
        idle_bytes -= idle[best].cap;
        for (size_t i = best + 1; i < n_idle; i++) idle[i - 1] = idle[i];
        n_idle--;
        pthread_mutex_unlock(&pool_mu);
        return p;
    }
    pthread_mutex_unlock(&pool_mu);
    size_t cap = len > SIZE_MAX - POOL_ROUND ? len : (len + POOL_ROUND - 1) / POOL_ROUND * POOL_ROUND;
    void *p = fresh_block(cap);
    if (!p) return NULL;
    pthread_mutex_lock(&pool_mu);
    bool ok = lend_locked((pooled_t){.p = p, .cap = cap});
    pthread_mutex_unlock(&pool_mu);
    if (!ok) {
        free(p);
        return NULL;
    }
    (void)slime_mem_watch(p, cap); /* only an optimisation: fine if it fails */
    return p;
}

void slime_rpc_mem_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&pool_mu);
    size_t i = 0;
    while (i < n_lent && lent[i].p != p) i++;
    if (i == n_lent) { /* a small payload: plain malloc */
        pthread_mutex_unlock(&pool_mu);
        free(p);
        return;
    }
    pooled_t b = lent[i];
    lent[i] = lent[--n_lent];
    if (b.drop) {
        pthread_mutex_unlock(&pool_mu);
        b.drop(b.arg);
        return;
    }
    void *evicted[POOL_IDLE_MAX + 1];
    size_t n_evicted = 0;
    if (b.cap > idle_max) {
        evicted[n_evicted++] = b.p;
    } else {
        while (n_idle && (n_idle == POOL_IDLE_MAX || idle_bytes + b.cap > idle_max)) {
            evicted[n_evicted++] = idle[0].p;
            idle_bytes -= idle[0].cap;
            for (size_t k = 1; k < n_idle; k++) idle[k - 1] = idle[k];
            n_idle--;
        }
        idle[n_idle++] = b;
        idle_bytes += b.cap;
    }
    pthread_mutex_unlock(&pool_mu);
    for (size_t k = 0; k < n_evicted; k++) release(evicted[k]);
}

bool rpc_mem_adopt(void *p, void (*drop)(void *arg), void *arg) {
    pthread_mutex_lock(&pool_mu);
    bool ok = lend_locked((pooled_t){.p = p, .drop = drop, .arg = arg});
    pthread_mutex_unlock(&pool_mu);
    return ok;
}

void rpc_mem_prime(void) {
    static pthread_mutex_t prime_mu = PTHREAD_MUTEX_INITIALIZER;
    static bool primed;
    pthread_mutex_lock(&prime_mu); /* a second channel opening meanwhile waits for the block */
    if (!primed) {
        primed = true;
        pthread_mutex_lock(&pool_mu);
        size_t want = env_size("DLSLIME_RPC_POOL_PRIME_MB", PRIME_MB_DEFAULT) << 20;
        bool room = want >= POOL_MIN && idle_bytes + want <= idle_max_locked() && n_idle < POOL_IDLE_MAX;
        pthread_mutex_unlock(&pool_mu);
        void *p = room ? fresh_block(want) : NULL;
        if (p) {
            memset(p, 0, want); /* the faults, here rather than in the first call */
            (void)slime_mem_watch(p, want);
            pthread_mutex_lock(&pool_mu);
            bool kept = n_idle < POOL_IDLE_MAX && idle_bytes + want <= idle_max; /* calls freed blocks meanwhile */
            if (kept) {
                idle[n_idle++] = (pooled_t){.p = p, .cap = want, .primed = true};
                idle_bytes += want;
            }
            pthread_mutex_unlock(&pool_mu);
            if (!kept) release(p);
        }
    }
    pthread_mutex_unlock(&prime_mu);
}
