/* A rendezvous fetched by the receiver with CMA: one copy, straight out
 * of the sending process's memory (cma_fetch.c).  Used by the tcp
 * transport between network namespaces (tcp_cma.c) and by shm on a host
 * with more of our processes than cores (shm_fetch.c). */
#ifndef SLIME_CMA_FETCH_H
#define SLIME_CMA_FETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* Copies len bytes at raddr in process pid to dst with the context's
 * copy team; false if any piece failed (dst is then partly written). */
bool cma_fetch(slime_ctx_t *ctx, uint32_t pid, void *dst, uint64_t raddr, size_t len);

#endif
