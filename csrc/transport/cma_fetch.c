/* A rendezvous fetched by the receiver with CMA (process_vm_readv): the
 * copy, in pieces for the context's copy team (core/team.c).  Whether a
 * transport may fetch from a process at all is its own question: the
 * pid must be one the kernel vouched for. */
#include "transport/cma_fetch.h"

#include <sys/uio.h>

/* Pieces for the copy team, and the size below which the receiver
 * copies alone: the sizes shm_rma.c measured for CMA. */
#define FETCH_PIECE (512u << 10)
#define FETCH_TEAM_MIN (4u << 20)

typedef struct fetch_job {
    pid_t pid;
    uint8_t *dst;
    uint64_t raddr;
} fetch_job_t;

static slime_status_t fetch_piece(void *arg, size_t off, size_t len) {
    const fetch_job_t *j = arg;
    uint8_t *dst = j->dst + off;
    uint64_t raddr = j->raddr + off;
    while (len) {
        struct iovec l = {.iov_base = dst, .iov_len = len};
        struct iovec r = {.iov_base = (void *)(uintptr_t)raddr, .iov_len = len};
        ssize_t n = process_vm_readv(j->pid, &l, 1, &r, 1, 0);
        if (n <= 0) return SLIME_ERR_ACCESS; /* 0: nothing moved, which a valid range never gives */
        dst += n;
        raddr += (uint64_t)n;
        len -= (size_t)n;
    }
    return SLIME_OK;
}

bool cma_fetch(slime_ctx_t *ctx, uint32_t pid, void *dst, uint64_t raddr, size_t len) {
    fetch_job_t j = {.pid = (pid_t)pid, .dst = dst, .raddr = raddr};
    return team_run(ctx, fetch_piece, &j, len, len < FETCH_TEAM_MIN ? len : FETCH_PIECE) == SLIME_OK;
}
