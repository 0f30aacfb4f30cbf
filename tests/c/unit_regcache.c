/* The registration cache (core/regcache.c) over a test-only memory
 * domain that counts its registrations, without verbs or any device.
 *
 * Built from the core files it tests (CMakeLists.txt: unit tests), not
 * against the library, whose internals are hidden.  Proves: a watched
 * buffer is registered once and reused; an unwatch drops its registration
 * at once, or at its last put when in use; unwatched buffers and a cache
 * that keeps nothing register per transfer; a kept registration serves
 * only the access it grants; a user region's registration is lent (a
 * local use pins the region) and never made anew; small buffers outside
 * regions get none; a domain that refuses is no error; the LRU evicts
 * beyond its byte limit.  And the host domain: it claims any memory,
 * keeps no handle, and its copies are plain copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/md.h"
#include "core/regcache.h"

#include "unit_check.h"

#define PG 4096u

/* ---- the test domain: grants exactly the access asked ---- */
static struct {
    unsigned regs, unregs, live;
    unsigned last_flags;
    bool refuse;
} dom;

static slime_status_t tmd_reg(md_t *md, void *addr, size_t len, unsigned access, unsigned flags, md_memh_t **memh) {
    (void)md;
    (void)addr;
    (void)len;
    dom.last_flags = flags;
    *memh = NULL;
    if (dom.refuse) return SLIME_OK;
    md_memh_t *h = malloc(sizeof *h);
    CHECK(h);
    h->access = access;
    dom.regs++;
    dom.live++;
    *memh = h;
    return SLIME_OK;
}

static void tmd_unreg(md_t *md, md_memh_t *memh) {
    (void)md;
    dom.unregs++;
    dom.live--;
    free(memh);
}

static const md_ops_t test_md = {
    .size = sizeof(md_ops_t),
    .name = "test",
    .reg = tmd_reg,
    .unreg = tmd_unreg,
};

static slime_ctx_t *ctx;
static md_t md;
static uint8_t *arena; /* 16 pages, page-aligned */

static void setup(bool keep, size_t max_bytes) {
    memset(&dom, 0, sizeof dom);
    md = (md_t){.ops = &test_md, .ctx = ctx, .index = 1};
    md.cache = regcache_new(&md, keep, max_bytes);
    CHECK(md.cache);
}

static void teardown(void) {
    regcache_free(md.cache);
    CHECK(dom.live == 0); /* nothing leaked, nothing freed twice */
}

static uint64_t made(void) { return regcache_counter(md.cache, SLIME_COUNTER_BUF_REGISTRATIONS); }
static uint64_t reused(void) { return regcache_counter(md.cache, SLIME_COUNTER_BUF_REG_REUSED); }

/* A watched buffer: registered once, reused, dropped on unwatch. */
static void case_kept(void) {
    setup(true, 1 << 20);
    uint8_t *buf = arena + PG;
    CHECK(slime_mem_watch(buf, 2 * PG) == SLIME_OK);
    regent_t *e = regcache_get(&md, buf, 2 * PG, SLIME_ACCESS_REMOTE_READ, 0);
    CHECK(e && dom.regs == 1 && made() == 1 && reused() == 0);
    CHECK(dom.last_flags & MD_REG_HIDE_ERRORS); /* a failure would be no error */
    CHECK(regent_memh(e)->access & SLIME_ACCESS_REMOTE_READ);
    regcache_put(&md, e);
    CHECK(dom.unregs == 0);
    for (int k = 0; k < 3; k++) {
        e = regcache_get(&md, buf + 100, PG, SLIME_ACCESS_REMOTE_READ, 0); /* inside: the same one */
        CHECK(e && dom.regs == 1);
        regcache_put(&md, e);
    }
    CHECK(made() == 1 && reused() == 3);
    CHECK(slime_mem_unwatch(buf) == SLIME_OK);
    CHECK(dom.unregs == 1 && dom.live == 0); /* dropped on the notice */
    e = regcache_get(&md, buf, 2 * PG, SLIME_ACCESS_REMOTE_READ, 0);
    CHECK(e && dom.regs == 2 && reused() == 3); /* not watched: made anew... */
    regcache_put(&md, e);
    CHECK(dom.unregs == 2); /* ...and dropped after its transfer */
    teardown();
}

/* Unwatched while a transfer uses it: freed by its last put. */
static void case_unwatch_in_use(void) {
    setup(true, 1 << 20);
    uint8_t *buf = arena;
    CHECK(slime_mem_watch(buf, PG) == SLIME_OK);
    regent_t *e = regcache_get(&md, buf, PG, MD_ACCESS_LOCAL_WRITE, 0);
    regent_t *f = regcache_get(&md, buf, PG, MD_ACCESS_LOCAL_WRITE, 0);
    CHECK(e && e == f && dom.regs == 1 && reused() == 1);
    CHECK(slime_mem_unwatch(buf) == SLIME_OK);
    CHECK(dom.unregs == 0);
    regcache_put(&md, e);
    CHECK(dom.unregs == 0);
    regcache_put(&md, f);
    CHECK(dom.unregs == 1);
    teardown();
}

/* A cache told to keep nothing registers per transfer, watched or not. */
static void case_keep_nothing(void) {
    setup(false, 1 << 20);
    CHECK(slime_mem_watch(arena, PG) == SLIME_OK);
    for (int k = 0; k < 2; k++) {
        regent_t *e = regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, 0);
        CHECK(e);
        regcache_put(&md, e);
    }
    CHECK(dom.regs == 2 && dom.unregs == 2 && reused() == 0);
    CHECK(slime_mem_unwatch(arena) == SLIME_OK);
    teardown();
}

/* Kept registrations are asked with remote read too; one that lacks an
 * access is not reused for it. */
static void case_access(void) {
    setup(true, 1 << 20);
    CHECK(slime_mem_watch(arena, PG) == SLIME_OK);
    regent_t *e = regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, 0);
    CHECK(e && !(regent_memh(e)->access & MD_ACCESS_LOCAL_WRITE));
    regcache_put(&md, e);
    e = regcache_get(&md, arena, PG, MD_ACCESS_LOCAL_WRITE, 0);
    CHECK(e && dom.regs == 2 && reused() == 0);
    CHECK(regent_memh(e)->access == (MD_ACCESS_LOCAL_WRITE | SLIME_ACCESS_REMOTE_READ));
    regcache_put(&md, e);
    e = regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, 0); /* either serves it */
    CHECK(e && dom.regs == 2 && reused() == 1);
    regcache_put(&md, e);
    CHECK(slime_mem_unwatch(arena) == SLIME_OK);
    CHECK(dom.live == 0);
    teardown();
}

/* A buffer inside a user region borrows the region's registration. */
static void case_lent(void) {
    setup(true, 1 << 20);
    md_memh_t rw = {.access = SLIME_ACCESS_REMOTE_READ | MD_ACCESS_LOCAL_WRITE};
    md_memh_t ro = {.access = SLIME_ACCESS_REMOTE_READ};
    slime_mr_t user = {.addr = arena, .len = 4 * PG}, other = {.addr = arena + 8 * PG, .len = 4 * PG};
    user.memh[md.index] = &rw;
    other.memh[md.index] = &ro;
    slime_mr_t bare = {.addr = arena + 12 * PG, .len = 4 * PG}; /* no registration in this domain */
    list_push_back(&ctx->mrs, &user.link);
    list_push_back(&ctx->mrs, &other.link);
    list_push_back(&ctx->mrs, &bare.link);
    regent_t *e = regcache_get(&md, arena + PG, PG, MD_ACCESS_LOCAL_WRITE, 1u << 30);
    CHECK(e && regent_memh(e) == &rw && atomic_load(&user.local_users) == 1 && dom.regs == 0);
    regcache_put(&md, e);
    CHECK(atomic_load(&user.local_users) == 0 && dom.unregs == 0);
    /* a region without the access, or without a registration here, lends nothing */
    CHECK(!regcache_get(&md, arena + 8 * PG, PG, MD_ACCESS_LOCAL_WRITE, 1u << 30));
    CHECK(!regcache_get(&md, arena + 12 * PG, PG, SLIME_ACCESS_REMOTE_READ, 1u << 30));
    /* straddling the region's end: not inside it */
    CHECK(!regcache_get(&md, arena + 3 * PG, 2 * PG, SLIME_ACCESS_REMOTE_READ, 1u << 30));
    e = regcache_get(&md, arena + 8 * PG, PG, SLIME_ACCESS_REMOTE_READ, 1u << 30);
    CHECK(e && regent_memh(e) == &ro && atomic_load(&other.local_users) == 1);
    regcache_put(&md, e);
    CHECK(dom.regs == 0 && made() == 0);
    list_del(&user.link);
    list_del(&other.link);
    list_del(&bare.link);
    teardown();
}

/* Too small to be worth a registration; a domain that refuses. */
static void case_none(void) {
    setup(true, 1 << 20);
    CHECK(!regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, PG + 1));
    CHECK(dom.regs == 0);
    dom.refuse = true;
    CHECK(!regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, 0));
    CHECK(made() == 0);
    teardown();
}

/* Beyond the byte limit the least recently used unused entry goes. */
static void case_evict(void) {
    setup(true, 2 * PG);
    CHECK(slime_mem_watch(arena, 3 * PG) == SLIME_OK);
    for (unsigned k = 0; k < 3; k++) {
        regent_t *e = regcache_get(&md, arena + k * PG, PG, SLIME_ACCESS_REMOTE_READ, 0);
        CHECK(e);
        regcache_put(&md, e);
    }
    CHECK(dom.regs == 3 && dom.unregs == 1 && dom.live == 2);
    regent_t *e = regcache_get(&md, arena, PG, SLIME_ACCESS_REMOTE_READ, 0); /* the oldest went */
    CHECK(e && dom.regs == 4);
    regcache_put(&md, e);
    e = regcache_get(&md, arena + 2 * PG, PG, SLIME_ACCESS_REMOTE_READ, 0); /* the newest stayed */
    CHECK(e && dom.regs == 4 && reused() == 1);
    regcache_put(&md, e);
    CHECK(slime_mem_unwatch(arena) == SLIME_OK);
    CHECK(dom.live == 0);
    teardown();
}

/* The host domain claims any memory, keeps no handle, copies bytes. */
static void case_host(void) {
    md_t host = {.ops = &slime_host_md, .ctx = ctx};
    int device = 7;
    CHECK(MD_HAS(host.ops, detect) && host.ops->detect(&host, arena, PG, &device) && device == -1);
    md_memh_t dummy, *h = &dummy;
    CHECK(host.ops->reg(&host, arena, PG, SLIME_ACCESS_REMOTE_READ, 0, &h) == SLIME_OK && h == NULL);
    CHECK(!MD_HAS(host.ops, unreg) && !MD_HAS(host.ops, open));
    uint8_t src[64], dst[64];
    for (int i = 0; i < 64; i++) src[i] = (uint8_t)(i * 7 + 1);
    CHECK(host.ops->copy_in(&host, arena, src, sizeof src) == SLIME_OK);
    CHECK(host.ops->copy_out(&host, dst, arena, sizeof dst) == SLIME_OK);
    CHECK(memcmp(src, dst, sizeof src) == 0);
}

int main(void) {
    ctx = calloc(1, sizeof *ctx);
    arena = aligned_alloc(PG, 16 * PG);
    CHECK(ctx && arena);
    list_init(&ctx->mrs);
    case_kept();
    case_unwatch_in_use();
    case_keep_nothing();
    case_access();
    case_lent();
    case_none();
    case_evict();
    case_host();
    free(arena);
    free(ctx);
    printf("unit_regcache: all cases passed\n");
    return 0;
}
