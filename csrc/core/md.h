/* Memory domains: the second table of the core (the first is the
 * transports'), in the style of UCX's uct_md_ops, with a size field first
 * as in libfabric so the table can grow.
 *
 * Why: registering a region, telling peers how to reach it, taking that
 * back when it goes, and copying its bytes depend on what the memory is
 * (plain host memory, a shared block, device memory) and on which devices
 * must reach it (an RDMA NIC).  The core asks the domains instead of
 * naming any of them; adding one touches its own file and one line of the
 * table (transport/domains.c).
 *
 * One table, two roles:
 * - a memory domain owns bytes (host memory, shared blocks; CUDA next):
 *   it has detect, and a region belongs to the first one in table order
 *   that claims its range (the host domain, last of them, claims any);
 *   copy_in/copy_out move bytes between such memory and host memory;
 * - a registration domain (an RDMA device's) has no detect and
 *   registers every region, whatever its memory, so that its device can
 *   reach it.
 * A region is registered with its memory domain and with every
 * registration domain open in its context (md.c). */
#ifndef SLIME_MD_H
#define SLIME_MD_H

#include <stddef.h>

#include "core/internal.h"

/* Access beyond SLIME_ACCESS_*: the device may write into the memory
 * (a READ lands there).  Registrations of transfer buffers ask for it. */
#define MD_ACCESS_LOCAL_WRITE 0x100u

/* reg's flags.  HIDE_ERRORS: a failure is no error (a buffer that goes
 * by another path when it cannot be registered): SLIME_OK with no handle,
 * nothing recorded.  As UCX's UCT_MD_MEM_FLAG_HIDE_ERRORS. */
#define MD_REG_HIDE_ERRORS 0x1u

/* What every domain's registration handle starts with. */
struct md_memh {
    unsigned access; /* what it grants: SLIME_ACCESS_* | MD_ACCESS_LOCAL_WRITE */
};

typedef struct md_ops {
    size_t size;     /* sizeof(md_ops_t) the domain was built against */
    const char *name;
    /* Per context, before any region exists.  *present = false: the
     * domain is absent from this context (no device), not an error. */
    slime_status_t (*open)(md_t *md, bool *present);
    /* After every region and every endpoint of the context is gone. */
    void (*close)(md_t *md);
    /* Memory domains: whether [addr, +len) is memory of this domain, and
     * on which device of it (-1: none). */
    bool (*detect)(md_t *md, const void *addr, size_t len, int *device);
    /* Registers [addr, +len) for at least access (it may grant more, as
     * the handle says).  SLIME_OK with *memh NULL: the domain keeps no
     * registration of it, and its ops on that memory will be refused.
     * Runs without ctx->lock (pinning is slow). */
    slime_status_t (*reg)(md_t *md, void *addr, size_t len, unsigned access, unsigned flags, md_memh_t **memh);
    void (*unreg)(md_t *md, md_memh_t *memh);
    /* Under ctx->lock, before the region's shared table entry e becomes
     * valid: writes what peers need to reach the region through this
     * domain (into e, or the domain's own per-slot keys).  Called for
     * every region, memh NULL where the domain has no registration of it,
     * so that nothing a former region of the slot left is kept. */
    void (*pack)(md_t *md, const slime_mr_t *mr, const md_memh_t *memh, mr_entry_t *e);
    /* Under ctx->lock, once the region's entry is dying: peers that hold
     * keys of this domain's registration must drop them.  Each such peer
     * holds a pin on the entry until it has (or is lost), so
     * slime_mr_dereg's wait for the pins covers their accesses. */
    void (*revoke)(md_t *md, const slime_mr_t *mr, const md_memh_t *memh);
    /* Memory domains: copies between their memory (dst of copy_in, src of
     * copy_out) and host memory.  Transports that touch the bytes of a
     * region ask its domain (issue #14 routes them here). */
    slime_status_t (*copy_in)(md_t *md, void *dst, const void *src, size_t len);
    slime_status_t (*copy_out)(md_t *md, void *dst, const void *src, size_t len);
} md_ops_t;

/* Whether ops has the member f, and set (a table built against an older,
 * shorter md_ops_t lacks the later members). */
#define MD_HAS(ops, f) ((ops)->size >= offsetof(md_ops_t, f) + sizeof((ops)->f) && (ops)->f)

/* One domain open in one context (ctx->mds[index]). */
struct md {
    const md_ops_t *ops;
    slime_ctx_t *ctx;
    unsigned index;             /* its slot in slime_mr.memh */
    void *priv;                 /* the domain's own state */
    struct regcache *cache;     /* kept transfer-buffer registrations (regcache.c), or NULL */
};

/* The table (transport/domains.c, beside the transports it names). */
extern const md_ops_t *const slime_md_table[];
extern const size_t slime_md_table_len;
extern const md_ops_t slime_host_md;  /* md_host.c */
extern const md_ops_t slime_block_md; /* shmem.c */

/* The host domain's registration and copies, which shared blocks (host
 * memory too) share. */
slime_status_t md_host_reg(md_t *md, void *addr, size_t len, unsigned access, unsigned flags, md_memh_t **memh);
slime_status_t md_host_copy(md_t *md, void *dst, const void *src, size_t len);

/* ---- the core's side (md.c) ---- */
/* Opens every domain of the table present in ctx (ctx->mds); on failure
 * closes those it opened. */
slime_status_t md_open_all(slime_ctx_t *ctx);
/* Closes them, last opened first; harmless when none is open. */
void md_close_all(slime_ctx_t *ctx);
/* Sets mr's memory domain and device, and registers mr with its memory
 * domain, then with every registration domain; undone on failure. */
slime_status_t md_mr_reg(slime_ctx_t *ctx, slime_mr_t *mr);
/* Under ctx->lock: every domain packs its part of mr's entry e. */
void md_mr_pack(slime_ctx_t *ctx, const slime_mr_t *mr, mr_entry_t *e);
/* Under ctx->lock: every domain that registered mr revokes peers' keys. */
void md_mr_revoke(slime_ctx_t *ctx, const slime_mr_t *mr);
/* Drops mr's registrations in every domain. */
void md_mr_unreg(slime_ctx_t *ctx, slime_mr_t *mr);

#endif
