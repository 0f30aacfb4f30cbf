/* The server's side of lending (see lend.h): fetching a client's block
 * and the mappings kept per peer.
 *
 * A mapping is counted: each call reading it holds a reference, and one
 * detached (a handler kept a view past its reply) is memory the binding
 * owns, with a reference of its own that slime_rpc_mem_free drops.  The
 * pages are unmapped when the last goes: never under a view. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc/lend.h"

/* Idle mappings kept per peer, and mappings per peer in all: a peer's
 * numbers must not exhaust our address space or map count. */
#define LEND_CACHE 4
#define LEND_PEER_MAX 64

struct lend_map {
    slime_list_t link;     /* peer->maps, until detached */
    uint64_t ino, size;
    uint8_t *map;
    _Atomic uint32_t refs; /* calls reading it, and the binding's once detached */
    uint64_t used;         /* when a call last let it go (ns) */
    bool detached;
};

/* The client's memfd d names, fetched and checked: sealed against
 * resizing (a shrink would fault our reads), at least d->size bytes, the
 * inode it said.  -1 with a reason in why. */
static int fetch_checked(uint32_t pid, const rpc_lend_t *d, char *why, size_t whylen) {
    if (!pid || d->fd < 0) {
        snprintf(why, whylen, "no process to fetch a lent block from");
        return -1;
    }
    int pidfd = pidfd_of((int)pid);
    if (pidfd < 0) {
        snprintf(why, whylen, "fetching the lent block: %s", strerror(errno));
        return -1;
    }
    char what[128];
    int fd = memfd_take_checked(pidfd, d->fd, d->size, d->ino, what, sizeof what);
    close(pidfd);
    if (fd < 0) snprintf(why, whylen, "the lent block: %s", what);
    return fd;
}

bool lend_probe_ok(uint32_t pid, const rpc_lend_t *d) {
    char why[160];
    int fd = fetch_checked(pid, d, why, sizeof why);
    if (fd < 0) return false;
    close(fd);
    return true;
}

uint8_t *lend_map_base(const lend_map_t *m) { return m->map; }

static void map_unref(void *arg) {
    lend_map_t *m = arg;
    if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1) return;
    munmap(m->map, m->size);
    free(m);
}

/* Under srv->mu: idle mappings past keep go, the least recently used
 * first. */
static void trim_locked(rpc_peer_t *p, uint32_t keep) {
    for (;;) {
        lend_map_t *oldest = NULL;
        uint32_t n_idle = 0;
        for (slime_list_t *pos = p->maps.next; pos != &p->maps; pos = pos->next) {
            lend_map_t *m = container_of(pos, lend_map_t, link);
            if (atomic_load(&m->refs)) continue;
            n_idle++;
            if (!oldest || m->used < oldest->used) oldest = m;
        }
        if (n_idle <= keep) return;
        list_del(&oldest->link);
        p->n_maps--;
        munmap(oldest->map, oldest->size);
        free(oldest);
    }
}

static lend_map_t *cached_locked(rpc_peer_t *p, const rpc_lend_t *d) {
    for (slime_list_t *pos = p->maps.next; pos != &p->maps; pos = pos->next) {
        lend_map_t *m = container_of(pos, lend_map_t, link);
        if (m->ino == d->ino && m->size == d->size) return m;
    }
    return NULL;
}

lend_map_t *lend_map_get_locked(rpc_peer_t *p, const rpc_lend_t *d, uint64_t len, uint64_t size_max, bool prefault,
                                char *why, size_t whylen) {
    if (d->size == 0 || d->size > size_max || len > d->size || d->zero) {
        snprintf(why, whylen, "a lent block of %llu bytes for a %llu-byte payload (at most %llu)",
                 (unsigned long long)d->size, (unsigned long long)len, (unsigned long long)size_max);
        return NULL;
    }
    lend_map_t *m = cached_locked(p, d);
    if (m) {
        atomic_fetch_add(&m->refs, 1);
        return m;
    }
    if (p->n_maps >= LEND_PEER_MAX) trim_locked(p, 0);
    if (p->n_maps >= LEND_PEER_MAX) {
        snprintf(why, whylen, "%u lent blocks in use at once", p->n_maps);
        return NULL;
    }
    int fd = fetch_checked(p->ep->verified_pid, d, why, whylen);
    if (fd < 0) return NULL;
    /* Faulting in costs about as much as reading every page once (and a
     * fifth of writing each once), so only where no call waits for it;
     * a call's new mapping is left to fault as its handler touches it
     * (an echo or a forward touches nothing). */
    void *map = mmap(NULL, d->size, PROT_READ | PROT_WRITE, MAP_SHARED | (prefault ? MAP_POPULATE : 0), fd, 0);
    int e = errno;
    close(fd);
    m = map == MAP_FAILED ? NULL : calloc(1, sizeof *m);
    if (!m) {
        snprintf(why, whylen, "mapping a lent block of %llu bytes: %s", (unsigned long long)d->size,
                 map == MAP_FAILED ? strerror(e) : "out of memory");
        if (map != MAP_FAILED) munmap(map, d->size);
        return NULL;
    }
    *m = (lend_map_t){.ino = d->ino, .size = d->size, .map = map};
    atomic_init(&m->refs, 1);
    list_push_back(&p->maps, &m->link);
    p->n_maps++;
    trim_locked(p, LEND_CACHE);
    return m;
}

void lend_map_put_locked(rpc_peer_t *p, lend_map_t *m) {
    if (m->detached) {
        map_unref(m);
        return;
    }
    m->used = now_ns();
    atomic_fetch_sub(&m->refs, 1);
    trim_locked(p, LEND_CACHE);
}

void *lend_map_detach_locked(rpc_peer_t *p, lend_map_t *m) {
    if (!m->detached) {
        list_del(&m->link);
        p->n_maps--;
        m->detached = true;
    }
    atomic_fetch_add(&m->refs, 1);
    if (!rpc_mem_adopt(m->map, map_unref, m)) {
        atomic_fetch_sub(&m->refs, 1);
        return NULL;
    }
    return m->map;
}

void lend_maps_free(rpc_peer_t *p) { trim_locked(p, 0); }
