/* The verbs memory domain: registrations with the context's RDMA device
 * (ibv_reg_mr on the device's protection domain).
 *
 * A registration domain: it registers every region of the context, and
 * the transfer buffers of the rendezvous through the core's registration
 * cache (core/regcache.c).  It is present only where the verbs transport
 * opened a device in the context.  In auto mode a region the device
 * cannot register is kept without (shm and tcp need none): only verbs ops
 * on it fail, with SLIME_ERR_ACCESS. */
#ifdef SLIME_HAVE_VERBS

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/regcache.h"
#include "transport/verbs_internal.h"

typedef struct vmr {
    md_memh_t h; /* h.access has MD_ACCESS_LOCAL_WRITE: a READ may land in it */
    struct ibv_mr *mr;
} vmr_t;

static const vmr_t *vmr_of(const md_memh_t *h) { return h ? container_of(h, vmr_t, h) : NULL; }

static slime_status_t vmd_open(md_t *md, bool *present) {
    verbs_dev_t *d = verbs_dev_of(md->ctx);
    *present = d != NULL;
    if (!d) return SLIME_OK;
    /* $DLSLIME_VERBS_REGCACHE=0 keeps no buffer registration */
    md->cache = regcache_new(md, !env_off("DLSLIME_VERBS_REGCACHE"), env_size("DLSLIME_VERBS_REGCACHE_MB", 1024) << 20);
    if (!md->cache) return slime_errorf(SLIME_ERR_NOMEM, "ctx_create: verbs registration cache");
    md->priv = d;
    d->md = md;
    return SLIME_OK;
}

static void vmd_close(md_t *md) {
    verbs_dev_t *d = md->priv;
    regcache_free(md->cache);
    md->cache = NULL;
    d->md = NULL;
}

static int ibv_access(unsigned access) {
    return (access & MD_ACCESS_LOCAL_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0) |
           (access & SLIME_ACCESS_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
           (access & SLIME_ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0);
}

static slime_status_t reg_failed(const verbs_dev_t *d, size_t len, int e) {
    struct rlimit rl;
    char lim[64] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
        else snprintf(lim, sizeof lim, "%llu bytes", (unsigned long long)rl.rlim_cur);
    }
    return slime_errorf(e == ENOMEM ? SLIME_ERR_NOMEM : SLIME_ERR_SYSTEM,
                        "mr_reg: ibv_reg_mr of %zu bytes on %s failed: %s (RLIMIT_MEMLOCK: %s)", len, d->name,
                        strerror(e), lim);
}

/* Registered with local write as well where the memory allows it. */
static slime_status_t vmd_reg(md_t *md, void *addr, size_t len, unsigned access, unsigned flags, md_memh_t **memh) {
    verbs_dev_t *d = md->priv;
    *memh = NULL;
    vmr_t *v = calloc(1, sizeof *v);
    if (!v) return flags & MD_REG_HIDE_ERRORS ? SLIME_OK : slime_errorf(SLIME_ERR_NOMEM, "mr_reg");
    v->h.access = access | MD_ACCESS_LOCAL_WRITE;
    v->mr = verbs_api.reg_mr(d->pd, addr, len, ibv_access(v->h.access));
    if (!v->mr && !(access & (MD_ACCESS_LOCAL_WRITE | SLIME_ACCESS_REMOTE_WRITE))) {
        /* read-only memory: it can still be read by peers and written
         * from; only a READ into it is refused (verbs_rma checks) */
        v->h.access = access;
        v->mr = verbs_api.reg_mr(d->pd, addr, len, ibv_access(access));
    }
    if (v->mr) {
        *memh = &v->h;
        return SLIME_OK;
    }
    int e = errno;
    free(v);
    /* auto mode: shm and tcp need no registration; only verbs ops on
     * this region will be refused */
    if (!d->forced || (flags & MD_REG_HIDE_ERRORS)) return SLIME_OK;
    return reg_failed(d, len, e);
}

static void vmd_unreg(md_t *md, md_memh_t *memh) {
    (void)md;
    vmr_t *v = container_of(memh, vmr_t, h);
    verbs_api.dereg_mr(v->mr);
    free(v);
}

/* The key peers ask for (verbs_rkeys.c answers from slot_vkey). */
static void vmd_pack(md_t *md, const slime_mr_t *mr, const md_memh_t *memh, mr_entry_t *e) {
    (void)e;
    verbs_dev_t *d = md->priv;
    const vmr_t *v = vmr_of(memh);
    d->slot_vkey[mr->slot] = v ? VKEY_VALID | v->mr->rkey : 0;
}

static void vmd_revoke(md_t *md, const slime_mr_t *mr, const md_memh_t *memh) {
    (void)memh;
    rkeys_revoke(md->ctx, mr);
}

const md_ops_t slime_verbs_md = {
    .size = sizeof(md_ops_t),
    .name = "verbs",
    .open = vmd_open,
    .close = vmd_close,
    .reg = vmd_reg,
    .unreg = vmd_unreg,
    .pack = vmd_pack,
    .revoke = vmd_revoke,
};

/* For the rest of the transport: a user region's keys. */
bool verbs_mr_keys(const slime_mr_t *mr, uint32_t *lkey, uint32_t *rkey, bool *writable) {
    const vmr_t *v = vmr_of(mr->memh[verbs_dev_of(mr->ctx)->md->index]);
    if (!v) return false;
    if (lkey) *lkey = v->mr->lkey;
    if (rkey) *rkey = v->mr->rkey;
    if (writable) *writable = v->h.access & MD_ACCESS_LOCAL_WRITE;
    return true;
}

uint32_t regent_lkey(const regent_t *e) { return vmr_of(regent_memh(e))->mr->lkey; }
uint32_t regent_rkey(const regent_t *e) { return vmr_of(regent_memh(e))->mr->rkey; }

uint64_t verbs_md_counter(const verbs_dev_t *d, slime_counter_t which) {
    return d->md ? regcache_counter(d->md->cache, which) : 0;
}

#else
typedef int verbs_md_unused;
#endif
