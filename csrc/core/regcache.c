/* Registrations for transfer buffers (a rendezvous the receiver fetches
 * by itself), in whichever memory domain the transport needs them.
 *
 * A buffer inside one of the user's registered regions uses that
 * region's registration: no cost, and safe, since the user keeps such
 * memory mapped until slime_mr_dereg (we hold a local use on the region
 * meanwhile, so it cannot be deregistered under us).
 *
 * Any other buffer is registered page-aligned for the transfer.  Keeping
 * that registration for the next transfer from the same buffer is only
 * correct while the memory is not unmapped and mapped anew at the same
 * address (the registration would still point at the old pages and the
 * peer would read stale bytes), and nothing sees that happen without
 * memory hooks.  So registrations are kept only inside watched memory
 * (memwatch.c, the one source of truth: the allocator promises an unwatch
 * first, which drops them; torch's CPU allocator under the backend and
 * the RPC payload pool do that), in an LRU per domain bounded by the
 * domain's byte limit and CACHE_MAX_ENTRIES.  Other buffers are
 * deregistered after their transfer.  Entries in use are never freed; one
 * whose memory is unwatched meanwhile leaves the cache and is freed by
 * its last user.
 *
 * Locking: get/put run under ctx->lock; the unwatch notice comes from any
 * thread.  rc->mu guards the LRU and entries' refs; the watched check and
 * the insertion happen under it, so the notice (which takes rc->mu after
 * the range left the watched set) always sees what it must drop. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/memwatch.h"
#include "core/regcache.h"

#define CACHE_MAX_ENTRIES 256
#define PAGE 4096u

struct regent {
    slime_list_t link;  /* the cache's LRU, most recent first */
    uintptr_t start, end;
    md_memh_t *memh;    /* the domain's registration (the user region's if lent) */
    unsigned refs;
    bool cached;
    slime_mr_t *user;   /* a user region lent to us instead */
};

struct regcache {
    md_t *md;
    pthread_mutex_t mu;
    slime_list_t lru;
    size_t bytes, max_bytes;
    unsigned n;
    bool keep, subscribed;
    atomic_uint_fast64_t registrations, reused; /* slime_ctx_counter */
};

static void push_front(slime_list_t *h, slime_list_t *n) {
    n->next = h->next;
    n->prev = h;
    h->next->prev = n;
    h->next = n;
}

static void on_unwatch(void *arg, uintptr_t start, uintptr_t end);

regcache_t *regcache_new(md_t *md, bool keep, size_t max_bytes) {
    regcache_t *rc = calloc(1, sizeof *rc);
    if (!rc) return NULL;
    rc->md = md;
    pthread_mutex_init(&rc->mu, NULL);
    list_init(&rc->lru);
    rc->max_bytes = max_bytes;
    /* without the notices nothing may be kept */
    rc->keep = keep && (rc->subscribed = memwatch_subscribe(on_unwatch, rc));
    return rc;
}

static void entry_free(regcache_t *rc, regent_t *e) {
    if (e->cached) {
        list_del(&e->link);
        rc->bytes -= e->end - e->start;
        rc->n--;
    }
    rc->md->ops->unreg(rc->md, e->memh);
    free(e);
}

static void evict(regcache_t *rc) {
    slime_list_t *pos = rc->lru.prev;
    while (pos != &rc->lru && (rc->n > CACHE_MAX_ENTRIES || rc->bytes > rc->max_bytes)) {
        regent_t *e = container_of(pos, regent_t, link);
        pos = pos->prev;
        if (e->refs == 0) entry_free(rc, e);
    }
}

/* Under rc->mu: the entry leaves the cache; freed now if unused, else by
 * its last regcache_put. */
static void uncache(regcache_t *rc, regent_t *e) {
    if (e->refs) {
        list_del(&e->link);
        list_init(&e->link);
        e->cached = false;
        rc->bytes -= e->end - e->start;
        rc->n--;
    } else {
        entry_free(rc, e);
    }
}

static void on_unwatch(void *arg, uintptr_t start, uintptr_t end) {
    regcache_t *rc = arg;
    pthread_mutex_lock(&rc->mu);
    slime_list_t *pos = rc->lru.next;
    while (pos != &rc->lru) {
        regent_t *e = container_of(pos, regent_t, link);
        pos = pos->next;
        if (e->start < end && start < e->end) uncache(rc, e);
    }
    pthread_mutex_unlock(&rc->mu);
}

uint64_t regcache_counter(const regcache_t *rc, slime_counter_t which) {
    if (!rc) return 0;
    switch (which) {
    case SLIME_COUNTER_BUF_REGISTRATIONS: return atomic_load(&((regcache_t *)rc)->registrations);
    case SLIME_COUNTER_BUF_REG_REUSED: return atomic_load(&((regcache_t *)rc)->reused);
    default: return 0; /* a count of the context's, not of registrations */
    }
    return 0;
}

void regcache_free(regcache_t *rc) {
    if (!rc) return;
    if (rc->subscribed) memwatch_unsubscribe(on_unwatch, rc);
    while (!list_empty(&rc->lru)) entry_free(rc, container_of(rc->lru.next, regent_t, link));
    pthread_mutex_destroy(&rc->mu);
    free(rc);
}

static regent_t *from_user_region(md_t *md, uintptr_t a, size_t len, unsigned access) {
    slime_list_t *pos;
    for (pos = md->ctx->mrs.next; pos != &md->ctx->mrs; pos = pos->next) {
        slime_mr_t *mr = container_of(pos, slime_mr_t, link);
        uintptr_t s = (uintptr_t)mr->addr;
        md_memh_t *h = mr->memh[md->index];
        if (a < s || len > mr->len || a - s > mr->len - len) continue;
        if (!h || (h->access & access) != access) continue;
        regent_t *e = calloc(1, sizeof *e);
        if (!e) return NULL;
        e->user = mr;
        e->memh = h;
        list_init(&e->link);
        atomic_fetch_add(&mr->local_users, 1);
        return e;
    }
    return NULL;
}

/* Under rc->mu: a kept registration covering [a, a+len) with access. */
static regent_t *cached_lookup(regcache_t *rc, uintptr_t a, size_t len, unsigned access) {
    slime_list_t *pos;
    for (pos = rc->lru.next; pos != &rc->lru; pos = pos->next) {
        regent_t *e = container_of(pos, regent_t, link);
        if (a < e->start || a + len > e->end || (e->memh->access & access) != access) continue;
        list_del(&e->link);
        push_front(&rc->lru, &e->link);
        e->refs++;
        return e;
    }
    return NULL;
}

/* A registration of the pages under [a, +len) for this transfer. */
static regent_t *fresh(regcache_t *rc, uintptr_t a, size_t len, unsigned access) {
    uintptr_t start = a & ~(uintptr_t)(PAGE - 1), end = (a + len + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    md_t *md = rc->md;
    md_memh_t *memh = NULL;
    /* asked with remote read as well: one registration then serves this
     * buffer's sends (peers read it) and receives (the device writes it) */
    md->ops->reg(md, (void *)start, end - start, access | SLIME_ACCESS_REMOTE_READ, MD_REG_HIDE_ERRORS, &memh);
    if (!memh) return NULL;
    regent_t *e = calloc(1, sizeof *e);
    if (!e) {
        md->ops->unreg(md, memh);
        return NULL;
    }
    atomic_fetch_add(&rc->registrations, 1);
    e->start = start;
    e->end = end;
    e->memh = memh;
    e->refs = 1;
    list_init(&e->link);
    return e;
}

regent_t *regcache_get(md_t *md, void *addr, size_t len, unsigned access, size_t new_min) {
    regcache_t *rc = md->cache;
    uintptr_t a = (uintptr_t)addr;
    regent_t *e = from_user_region(md, a, len, access);
    if (e || len < new_min) return e; /* too small to be worth a registration */
    if (rc->keep) {
        pthread_mutex_lock(&rc->mu);
        e = cached_lookup(rc, a, len, access);
        pthread_mutex_unlock(&rc->mu);
        if (e) {
            atomic_fetch_add(&rc->reused, 1);
            return e;
        }
    }
    if (!(e = fresh(rc, a, len, access)) || !rc->keep) return e;
    /* the buffer, not the rounded pages: those may belong to others */
    pthread_mutex_lock(&rc->mu);
    if (slime_mem_watched(addr, len)) {
        e->cached = true;
        push_front(&rc->lru, &e->link);
        rc->bytes += e->end - e->start;
        rc->n++;
        evict(rc);
    }
    pthread_mutex_unlock(&rc->mu);
    return e;
}

void regcache_put(md_t *md, regent_t *e) {
    regcache_t *rc = md->cache;
    if (e->user) {
        atomic_fetch_sub(&e->user->local_users, 1);
        free(e);
        return;
    }
    pthread_mutex_lock(&rc->mu);
    if (--e->refs == 0) {
        if (!e->cached) entry_free(rc, e);
        else evict(rc);
    }
    pthread_mutex_unlock(&rc->mu);
}

const md_memh_t *regent_memh(const regent_t *e) { return e->memh; }
