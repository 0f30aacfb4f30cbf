/* Rendezvous by CMA between tcp peers on one host (tcp_cma.c). */
#ifndef SLIME_TCP_CMA_H
#define SLIME_TCP_CMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* A connection's answer, found on its first rendezvous. */
typedef enum { TCP_CMA_UNKNOWN = 0, TCP_CMA_ON, TCP_CMA_OFF } tcp_cma_t;

/* Whether the rendezvous of the tcp connection fd to the process pid
 * go by CMA: decided once (*state), then read. */
bool tcp_cma_usable(tcp_cma_t *state, int fd, uint32_t pid);

/* Copies len bytes at raddr in process pid to dst with the context's
 * copy team; false if any piece failed (dst is then partly written). */
bool tcp_cma_fetch(slime_ctx_t *ctx, uint32_t pid, void *dst, uint64_t raddr, size_t len);

#endif
