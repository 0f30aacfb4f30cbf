/* Rendezvous by CMA between tcp peers on one host (tcp_cma.c). */
#ifndef SLIME_TCP_CMA_H
#define SLIME_TCP_CMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* A connection's answer, found on its first rendezvous: whether its
 * rendezvous go by CMA, and up to what size (larger ones take the
 * socket). */
typedef struct tcp_cma {
    enum { TCP_CMA_UNKNOWN = 0, TCP_CMA_ON, TCP_CMA_OFF } state;
    size_t max;
} tcp_cma_t;

/* Whether a rendezvous of len bytes on the tcp connection fd to the
 * process pid goes by CMA: the connection's part decided once, in *cma. */
bool tcp_cma_usable(tcp_cma_t *cma, int fd, uint32_t pid, size_t len);

#endif
