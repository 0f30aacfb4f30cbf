/* Memory regions and the shared MR table.
 *
 * The table lives in a memfd that same-host peers map, so a peer doing CMA
 * checks its access against the owner's table itself.  An access pins
 * its entry (inflight++) and re-checks it; deregistration marks the entry
 * dying and waits for the pins to go.  Sequentially consistent atomics
 * make the two sides see each other (one of them always does).  Peers map
 * the table writable (for the pins), so the owner trusts none of it: the
 * accesses its own progress engine serves are checked against its private
 * record of each region (ctx->mr_slots) and pinned there. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/md.h"

#define DEREG_WAIT_NS (5ull * 1000000000ull)

slime_status_t mr_table_create(int *fd_out, mr_shared_t **out) {
    int fd;
    slime_status_t st = memfd_sealed("dlslime-mrs", sizeof(mr_shared_t), &fd);
    if (st != SLIME_OK) return st;
    void *p = mmap(NULL, sizeof(mr_shared_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return slime_errorf(SLIME_ERR_SYSTEM, "MR table mmap: %s", strerror(e));
    }
    mr_shared_t *t = p;
    t->magic = MR_TABLE_MAGIC;
    *fd_out = fd;
    *out = t;
    return SLIME_OK;
}

slime_status_t mr_table_acquire(mr_shared_t *t, uint64_t handle, uint32_t rkey, uint64_t off,
                                uint64_t len, unsigned access, uint64_t *addr, char *why,
                                size_t whylen) {
    uint32_t slot = (uint32_t)(handle >> 32), gen = (uint32_t)handle;
    if (slot >= MR_TABLE_SLOTS) {
        snprintf(why, whylen, "no such region (slot %u)", slot);
        return SLIME_ERR_ACCESS;
    }
    mr_entry_t *e = &t->slots[slot];
    atomic_fetch_add(&e->inflight, 1);
    /* a peer's table may change under us: the range is checked against,
     * and computed from, one reading of the entry */
    const volatile mr_entry_t *v = e;
    uint64_t elen = v->len, eaddr = v->addr;
    slime_status_t st = SLIME_ERR_ACCESS;
    if (atomic_load(&e->state) != MR_VALID || atomic_load(&e->gen) != gen)
        snprintf(why, whylen, "region is not registered (deregistered or never was)");
    else if (e->rkey != rkey)
        snprintf(why, whylen, "wrong key for region");
    else if ((e->access & access) != access)
        snprintf(why, whylen, "region does not allow remote %s", access & SLIME_ACCESS_REMOTE_WRITE ? "write" : "read");
    else if (off > elen || len > elen - off)
        snprintf(why, whylen, "range [%" PRIu64 ", +%" PRIu64 ") is outside the region of %" PRIu64 " bytes",
                 off, len, elen);
    else {
        *addr = eaddr + off;
        st = SLIME_OK;
    }
    if (st != SLIME_OK) atomic_fetch_sub(&e->inflight, 1);
    return st;
}

void mr_table_release(mr_shared_t *t, uint64_t handle) {
    uint32_t slot = (uint32_t)(handle >> 32);
    if (slot < MR_TABLE_SLOTS) atomic_fetch_sub(&t->slots[slot].inflight, 1);
}

uint64_t mr_table_drop_pins(mr_shared_t *t, const _Atomic uint32_t *pins) {
    uint64_t dropped = 0;
    for (uint32_t s = 0; s < MR_TABLE_SLOTS; s++) {
        uint32_t left = atomic_load_explicit(&pins[s], memory_order_relaxed);
        _Atomic int32_t *inflight = &t->slots[s].inflight;
        int32_t cur = atomic_load(inflight);
        while (left && cur > 0) {
            int32_t take = left < (uint32_t)cur ? (int32_t)left : cur;
            if (atomic_compare_exchange_weak(inflight, &cur, cur - take)) {
                dropped += (uint64_t)take;
                break;
            }
        }
    }
    return dropped;
}

slime_status_t mr_own_acquire(slime_ctx_t *ctx, uint64_t handle, uint32_t rkey, uint64_t off, uint64_t len,
                              unsigned access, uint64_t *addr, char *why, size_t whylen) {
    uint32_t slot = (uint32_t)(handle >> 32), gen = (uint32_t)handle;
    slime_mr_t *mr = slot < MR_TABLE_SLOTS ? ctx->mr_slots[slot] : NULL;
    if (!mr || mr->dying || mr->gen != gen)
        snprintf(why, whylen, "region is not registered (deregistered or never was)");
    else if (mr->rkey != rkey)
        snprintf(why, whylen, "wrong key for region");
    else if ((mr->access & access) != access)
        snprintf(why, whylen, "region does not allow remote %s", access & SLIME_ACCESS_REMOTE_WRITE ? "write" : "read");
    else if (off > mr->len || len > mr->len - off)
        snprintf(why, whylen, "range [%" PRIu64 ", +%" PRIu64 ") is outside the region of %zu bytes", off, len,
                 mr->len);
    else {
        atomic_fetch_add(&mr->pins, 1);
        *addr = (uint64_t)(uintptr_t)mr->addr + off;
        return SLIME_OK;
    }
    return SLIME_ERR_ACCESS;
}

void mr_own_release(slime_ctx_t *ctx, uint64_t handle) {
    uint32_t slot = (uint32_t)(handle >> 32);
    slime_mr_t *mr = slot < MR_TABLE_SLOTS ? ctx->mr_slots[slot] : NULL;
    if (mr) atomic_fetch_sub(&mr->pins, 1);
}

/* Under ctx->lock: gives mr a free slot of the shared table and makes
 * its entry valid, once every domain has packed its part. */
static slime_status_t mr_publish(slime_ctx_t *ctx, slime_mr_t *mr) {
    mr_shared_t *t = ctx->mr_table;
    uint32_t slot = 0;
    while (slot < MR_TABLE_SLOTS && ctx->mr_slots[slot]) slot++;
    if (slot == MR_TABLE_SLOTS)
        return slime_errorf(SLIME_ERR_NOMEM, "mr_reg: all %d region slots are in use", MR_TABLE_SLOTS);
    mr_entry_t *e = &t->slots[slot];
    mr->ctx = ctx;
    mr->slot = slot;
    mr->gen = atomic_load(&e->gen);
    mr->rkey = (uint32_t)random_u64() | 1u;
    e->rkey = mr->rkey;
    e->access = mr->access;
    e->addr = (uint64_t)(uintptr_t)mr->addr;
    e->len = mr->len;
    md_mr_pack(ctx, mr, e);
    atomic_store(&e->state, MR_VALID);
    ctx->mr_slots[slot] = mr;
    list_push_back(&ctx->mrs, &mr->link);
    return SLIME_OK;
}

slime_status_t slime_mr_reg(slime_ctx_t *ctx, void *addr, size_t len, unsigned access,
                            slime_mr_t **out) {
    if (out) *out = NULL;
    if (!ctx || !out) return slime_errorf(SLIME_ERR_INVAL, "mr_reg: NULL argument");
    if (!addr || len == 0) return slime_errorf(SLIME_ERR_INVAL, "mr_reg: empty region (addr %p, len %zu)", addr, len);
    if (access & ~SLIME_ACCESS_ALL) return slime_errorf(SLIME_ERR_INVAL, "mr_reg: unknown access bits 0x%x", access);
    if ((uintptr_t)addr + len < (uintptr_t)addr) return slime_errorf(SLIME_ERR_INVAL, "mr_reg: region wraps");
    slime_mr_t *mr = calloc(1, sizeof *mr);
    if (!mr) return slime_errorf(SLIME_ERR_NOMEM, "mr_reg");
    mr->addr = addr;
    mr->len = len;
    mr->access = access;
    /* the domains register it without the lock: pinning is slow */
    slime_status_t st = md_mr_reg(ctx, mr);
    if (st == SLIME_OK) {
        pthread_mutex_lock(&ctx->lock);
        st = mr_publish(ctx, mr);
        pthread_mutex_unlock(&ctx->lock);
        if (st != SLIME_OK) md_mr_unreg(ctx, mr);
    }
    if (st != SLIME_OK) {
        free(mr);
        return st;
    }
    *out = mr;
    return SLIME_OK;
}

/* No access copies the region: neither one our progress engine serves
 * nor a peer's by CMA (the peer's pin, in the shared table). */
static bool unpinned(void *arg) {
    slime_mr_t *mr = arg;
    return atomic_load(&mr->pins) == 0 && atomic_load(&mr->ctx->mr_table->slots[mr->slot].inflight) == 0;
}

slime_status_t slime_mr_dereg(slime_mr_t *mr) {
    if (!mr) return slime_errorf(SLIME_ERR_INVAL, "mr_dereg: NULL region");
    slime_ctx_t *ctx = mr->ctx;
    if (!ctx) { free(mr); return SLIME_OK; } /* its context is gone */
    if (atomic_load(&mr->local_users))
        return slime_errorf(SLIME_ERR_BUSY, "mr_dereg: %d local operations still use the region",
                            atomic_load(&mr->local_users));
    mr_entry_t *e = &ctx->mr_table->slots[mr->slot];
    atomic_store(&e->state, MR_DYING);
    pthread_mutex_lock(&ctx->lock);
    mr->dying = true;
    md_mr_revoke(ctx, mr);
    pthread_mutex_unlock(&ctx->lock);
    /* accesses that pinned the entry before it died finish their copy */
    if (!ctx_wait_until(ctx, unpinned, mr, now_ns() + DEREG_WAIT_NS)) {
        return slime_errorf(SLIME_ERR_BUSY, "mr_dereg: remote accesses still copying after %llu s; "
                            "the region refuses new ones, call again", DEREG_WAIT_NS / 1000000000ull);
    }
    pthread_mutex_lock(&ctx->lock);
    atomic_fetch_add(&e->gen, 1);
    atomic_store(&e->state, MR_FREE);
    ctx->mr_slots[mr->slot] = NULL;
    list_del(&mr->link);
    pthread_mutex_unlock(&ctx->lock);
    md_mr_unreg(ctx, mr);
    free(mr);
    return SLIME_OK;
}

void *slime_mr_addr(const slime_mr_t *mr) { return mr ? mr->addr : NULL; }
size_t slime_mr_len(const slime_mr_t *mr) { return mr ? mr->len : 0; }

slime_status_t slime_mr_desc(const slime_mr_t *mr, slime_mr_desc_t *out) {
    if (!mr || !out) return slime_errorf(SLIME_ERR_INVAL, "mr_desc: NULL argument");
    if (!mr->ctx) return slime_errorf(SLIME_ERR_CLOSED, "mr_desc: the region's context is destroyed");
    wire_desc_t d = {
        .magic = WIRE_DESC_MAGIC,
        .version = SLIME_WIRE_VERSION,
        .access = (uint16_t)mr->access,
        .ctx_id = mr->ctx->id,
        .job = mr->ctx->job,
        .handle = (uint64_t)mr->slot << 32 | mr->gen,
        .rkey = mr->rkey,
        .addr = (uint64_t)(uintptr_t)mr->addr,
        .len = mr->len,
    };
    memcpy(out->bytes, &d, sizeof d);
    return SLIME_OK;
}

uint64_t slime_mr_desc_len(const slime_mr_desc_t *desc) {
    if (!desc) return 0;
    wire_desc_t d;
    memcpy(&d, desc->bytes, sizeof d);
    return d.magic == WIRE_DESC_MAGIC ? d.len : 0;
}

/* The initiator's early check: catches foreign and out-of-range
 * descriptors before anything moves.  The owner checks again. */
slime_status_t desc_check(const slime_ep_t *ep, const slime_mr_desc_t *desc, uint64_t off,
                          uint64_t len, unsigned access, wire_desc_t *out) {
    if (!desc) return slime_errorf(SLIME_ERR_INVAL, "remote descriptor is NULL");
    memcpy(out, desc->bytes, sizeof *out);
    if (out->magic != WIRE_DESC_MAGIC || out->version != SLIME_WIRE_VERSION)
        return slime_errorf(SLIME_ERR_INVAL, "remote descriptor is malformed (not from slime_mr_desc)");
    if (out->job != ep->peer_job)
        return slime_errorf(SLIME_ERR_ACCESS, "remote descriptor belongs to another job (token differs)");
    if (out->ctx_id != ep->peer_id)
        return slime_errorf(SLIME_ERR_ACCESS, "remote descriptor belongs to context %016" PRIx64
                            ", not to this endpoint's peer %016" PRIx64, out->ctx_id, ep->peer_id);
    if ((out->access & access) != access)
        return slime_errorf(SLIME_ERR_ACCESS, "remote region does not allow remote %s",
                            access & SLIME_ACCESS_REMOTE_WRITE ? "write" : "read");
    if (off > out->len || len > out->len - off)
        return slime_errorf(SLIME_ERR_ACCESS, "remote range [%" PRIu64 ", +%" PRIu64
                            ") is outside the region of %" PRIu64 " bytes", off, len, out->len);
    return SLIME_OK;
}
