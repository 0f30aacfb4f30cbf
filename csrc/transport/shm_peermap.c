/* Mappings of a peer's shared allocations (see core/shmem.c).
 *
 * The memfd behind a block is fetched from the peer with pidfd_getfd,
 * which the kernel allows exactly where it allows CMA (the ptrace access
 * check), checked against the inode the owner recorded, and mapped once;
 * a small cache keeps the mappings, least recently used out first.  When
 * the peer frees any block its MR table says so (mem_frees) and every
 * mapping is dropped: a mapping would otherwise keep the freed pages
 * alive, and the next access maps again. */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/shm_peermap.h"

#define PEERMAP_SLOTS 16

typedef struct mapping {
    uint64_t ino;              /* 0: free slot */
    uint8_t *map;
    size_t len;
    uint64_t owner_base;       /* the block's start in the owner */
    uint64_t used;             /* LRU tick */
} mapping_t;

struct peermap {
    int peer_pid;
    int pidfd;                 /* -1 until opened */
    bool disabled;             /* the kernel refuses: CMA alone from now on */
    const mr_shared_t *peer_table;
    uint64_t seen_frees;
    uint64_t tick;
    mapping_t slots[PEERMAP_SLOTS];
};

peermap_t *peermap_new(int peer_pid, const mr_shared_t *peer_table) {
    peermap_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->peer_pid = peer_pid;
    m->pidfd = -1;
    m->peer_table = peer_table;
    m->seen_frees = atomic_load(&peer_table->mem_frees);
    m->disabled = peer_pid <= 0;
    return m;
}

static void unmap_slot(mapping_t *s) {
    if (s->ino) munmap(s->map, s->len);
    *s = (mapping_t){0};
}

void peermap_free(peermap_t *m) {
    if (!m) return;
    for (int i = 0; i < PEERMAP_SLOTS; i++) unmap_slot(&m->slots[i]);
    if (m->pidfd >= 0) close(m->pidfd);
    free(m);
}

/* A peer's table entry's block fields, read once: the peer may rewrite
 * its table at any time, so what is checked must be what is used. */
typedef struct block_ref {
    int32_t fd;
    uint64_t ino, base, len;
} block_ref_t;

static block_ref_t block_ref(const mr_entry_t *e) {
    const volatile mr_entry_t *v = e;
    return (block_ref_t){.fd = v->block_fd, .ino = v->block_ino, .base = v->block_base, .len = v->block_len};
}

/* Maps block b into slot s; false (s left free) when it cannot be.  Only
 * a memfd sealed against shrinking is mapped (a shrink would fault our
 * copies); any other is left to CMA, which the kernel checks. */
static bool map_block(peermap_t *m, const block_ref_t *b, mapping_t *s) {
    if (b->len == 0) return false;
    if (m->pidfd < 0) {
        m->pidfd = pidfd_of(m->peer_pid);
        if (m->pidfd < 0) { m->disabled = true; return false; }
    }
    char why[64];
    int fd = memfd_take_checked(m->pidfd, b->fd, b->len, b->ino, why, sizeof why);
    if (fd < 0) {
        if (errno == EPERM || errno == ENOSYS || errno == EACCES) m->disabled = true;
        return false;
    }
    void *p = mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    *s = (mapping_t){.ino = b->ino, .map = p, .len = b->len, .owner_base = b->base};
    return true;
}

uint8_t *peermap_lookup(peermap_t *m, const mr_entry_t *e, uint64_t raddr, uint64_t len) {
    block_ref_t b = block_ref(e);
    if (!m || m->disabled || b.fd < 0) return NULL;
    /* all of [raddr, +len) inside the block, or CMA serves it */
    if (raddr < b.base || len > b.len || raddr - b.base > b.len - len) return NULL;
    uint64_t frees = atomic_load(&m->peer_table->mem_frees);
    if (frees != m->seen_frees) {
        for (int i = 0; i < PEERMAP_SLOTS; i++) unmap_slot(&m->slots[i]);
        m->seen_frees = frees;
    }
    mapping_t *hit = NULL, *victim = &m->slots[0];
    for (int i = 0; i < PEERMAP_SLOTS; i++) {
        mapping_t *s = &m->slots[i];
        if (s->ino == b.ino && s->owner_base == b.base && s->len == b.len) { hit = s; break; }
        if (!s->ino || (victim->ino && s->used < victim->used)) victim = s;
    }
    if (!hit) {
        unmap_slot(victim);
        if (!map_block(m, &b, victim)) return NULL;
        hit = victim;
    }
    hit->used = ++m->tick;
    return hit->map + (raddr - hit->owner_base);
}
