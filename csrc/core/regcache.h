/* Registrations of transfer buffers, in any memory domain (regcache.c):
 * lent from the user's regions, or made for the transfer and kept while
 * memwatch says the memory stays. */
#ifndef SLIME_REGCACHE_H
#define SLIME_REGCACHE_H

#include "core/md.h"

typedef struct regcache regcache_t;
typedef struct regent regent_t;

/* The cache of domain md (md->cache); keep false: every registration is
 * dropped after its transfer.  NULL when out of memory. */
regcache_t *regcache_new(md_t *md, bool keep, size_t max_bytes);
/* After every regent_t of it was put. */
void regcache_free(regcache_t *rc);
/* Under md->ctx->lock.  A registration in domain md covering [addr, +len)
 * with access (SLIME_ACCESS_REMOTE_READ, MD_ACCESS_LOCAL_WRITE): a user
 * region's, else, if len >= new_min, a kept or a new one; NULL if none
 * can be had (the caller moves the bytes another way). */
regent_t *regcache_get(md_t *md, void *addr, size_t len, unsigned access, size_t new_min);
/* Under md->ctx->lock: the transfer is over. */
void regcache_put(md_t *md, regent_t *e);
const md_memh_t *regent_memh(const regent_t *e);
/* slime_ctx_counter's buffer registration counters. */
uint64_t regcache_counter(const regcache_t *rc, slime_counter_t which);

#endif
