/* The memory domains of a context, and what a region asks of them.
 *
 * ctx->mds holds the domains of the table present in this context, in
 * table order; a region's registration in ctx->mds[i] is mr->memh[i].
 * The domains open once per context (after the transports, since a
 * device's domain needs its device) and close after every region and
 * endpoint is gone. */
#include <stdlib.h>

#include "core/md.h"

slime_status_t md_open_all(slime_ctx_t *ctx) {
    ctx->mds = calloc(SLIME_MD_MAX, sizeof *ctx->mds);
    if (!ctx->mds) return slime_errorf(SLIME_ERR_NOMEM, "ctx_create: memory domains");
    for (size_t t = 0; t < slime_md_table_len && ctx->n_mds < SLIME_MD_MAX; t++) {
        md_t *md = &ctx->mds[ctx->n_mds];
        *md = (md_t){.ops = slime_md_table[t], .ctx = ctx, .index = ctx->n_mds};
        bool present = true;
        if (MD_HAS(md->ops, open)) {
            slime_status_t st = md->ops->open(md, &present);
            if (st != SLIME_OK) {
                md_close_all(ctx);
                return st;
            }
        }
        if (present) ctx->n_mds++;
    }
    return SLIME_OK;
}

void md_close_all(slime_ctx_t *ctx) {
    while (ctx->n_mds > 0) {
        md_t *md = &ctx->mds[--ctx->n_mds];
        if (MD_HAS(md->ops, close)) md->ops->close(md);
    }
    free(ctx->mds);
    ctx->mds = NULL;
}

static md_t *detect(slime_ctx_t *ctx, const void *addr, size_t len, int *device) {
    for (unsigned i = 0; i < ctx->n_mds; i++) {
        md_t *md = &ctx->mds[i];
        *device = -1;
        if (MD_HAS(md->ops, detect) && md->ops->detect(md, addr, len, device)) return md;
    }
    return NULL;
}

static slime_status_t reg_with(md_t *md, slime_mr_t *mr) {
    if (!MD_HAS(md->ops, reg)) return SLIME_OK;
    return md->ops->reg(md, mr->addr, mr->len, mr->access, 0, &mr->memh[md->index]);
}

slime_status_t md_mr_reg(slime_ctx_t *ctx, slime_mr_t *mr) {
    md_t *mem = detect(ctx, mr->addr, mr->len, &mr->device);
    if (!mem) return slime_errorf(SLIME_ERR_INVAL, "mr_reg: no memory domain claims %p + %zu", mr->addr, mr->len);
    mr->md = mem;
    /* the memory's own domain first: the host one moves the pages onto
     * huge pages before a device pins them */
    slime_status_t st = reg_with(mem, mr);
    for (unsigned i = 0; st == SLIME_OK && i < ctx->n_mds; i++) {
        md_t *md = &ctx->mds[i];
        if (!MD_HAS(md->ops, detect)) st = reg_with(md, mr);
    }
    if (st != SLIME_OK) md_mr_unreg(ctx, mr);
    return st;
}

void md_mr_pack(slime_ctx_t *ctx, const slime_mr_t *mr, mr_entry_t *e) {
    for (unsigned i = 0; i < ctx->n_mds; i++) {
        md_t *md = &ctx->mds[i];
        if (MD_HAS(md->ops, pack)) md->ops->pack(md, mr, mr->memh[i], e);
    }
}

void md_mr_revoke(slime_ctx_t *ctx, const slime_mr_t *mr) {
    for (unsigned i = 0; i < ctx->n_mds; i++) {
        md_t *md = &ctx->mds[i];
        if (mr->memh[i] && MD_HAS(md->ops, revoke)) md->ops->revoke(md, mr, mr->memh[i]);
    }
}

void md_mr_unreg(slime_ctx_t *ctx, slime_mr_t *mr) {
    for (unsigned i = ctx->n_mds; i-- > 0;) {
        md_t *md = &ctx->mds[i];
        if (mr->memh[i] && MD_HAS(md->ops, unreg)) md->ops->unreg(md, mr->memh[i]);
        mr->memh[i] = NULL;
    }
}
