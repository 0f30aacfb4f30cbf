/* The client's side of lending (see lend.h): its blocks of shared memory,
 * a small table of them reused call after call. */
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rpc/lend.h"

/* Blocks grow in steps of this much: payloads of nearby sizes share one. */
#define LEND_ROUND (2u << 20)

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

lend_block_t *lend_take_locked(slime_rpc_client_t *cli, size_t len) {
    int best = -1, spare = -1; /* spare: an empty entry, else the smallest idle block */
    for (int i = 0; i < LEND_BLOCKS; i++) {
        lend_block_t *b = cli->lend[i];
        if (!b) {
            if (spare < 0 || cli->lend[spare]) spare = i;
            continue;
        }
        if (!idle(b)) continue;
        if (b->cap >= len && (best < 0 || b->cap < cli->lend[best]->cap)) best = i;
        if (spare < 0 || (cli->lend[spare] && b->cap < cli->lend[spare]->cap)) spare = i;
    }
    if (best < 0 && spare >= 0 && len <= SIZE_MAX - LEND_ROUND) {
        /* an empty entry, or the smallest idle block, makes way for one large enough */
        lend_block_t *b = lend_block_new((len + LEND_ROUND - 1) / LEND_ROUND * LEND_ROUND);
        if (b) {
            lend_block_unref(cli->lend[spare]);
            cli->lend[spare] = b;
            cli->lend_stats.blocks++;
            best = spare;
        }
    }
    if (best < 0) return NULL;
    atomic_fetch_add_explicit(&cli->lend[best]->refs, 1, memory_order_relaxed);
    return cli->lend[best];
}

void lend_forget_locked(slime_rpc_client_t *cli, lend_block_t *b) {
    for (int i = 0; i < LEND_BLOCKS; i++)
        if (cli->lend[i] == b) {
            cli->lend[i] = NULL;
            lend_block_unref(b);
        }
}

void lend_table_free(slime_rpc_client_t *cli) {
    for (int i = 0; i < LEND_BLOCKS; i++) {
        lend_block_unref(cli->lend[i]);
        cli->lend[i] = NULL;
    }
}
