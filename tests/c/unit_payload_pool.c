/* The RPC payload pool (rpc/payload_pool.c) on its own, built from its
 * files (CMakeLists.txt: unit tests).  Proves what makes a first large
 * call after connect as fast as a later one (issue 18): the primed block
 * is resident before any call, is lent to a pooled payload of any size it
 * fits, and comes back for the next; a block that is not primed serves
 * only payloads at least half its size; a fresh block of 2 MiB or more
 * is huge-page aligned; priming happens once per process. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc/rpc_internal.h"

#include "unit_check.h"

#define KIB (1u << 10)
#define MIB (1u << 20)

/* Whether every page of [p, p+len) is resident. */
static bool resident(void *p, size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg;
    unsigned char *vec = malloc(n);
    CHECK(vec && mincore(p, len, vec) == 0);
    bool all = true;
    for (size_t i = 0; i < n; i++) all = all && (vec[i] & 1);
    free(vec);
    return all;
}

int main(void) {
    setenv("DLSLIME_RPC_POOL_PRIME_MB", "8", 1);
    rpc_mem_prime();
    rpc_mem_prime(); /* a second channel: no second block */

    void *a = rpc_mem_alloc(300 * KIB); /* far smaller than the block: lent all the same */
    CHECK(a && resident(a, 8 * MIB));
    void *b = rpc_mem_alloc(300 * KIB); /* the primed block is out: a block of its own */
    CHECK(b && b != a);
    slime_rpc_mem_free(b);
    slime_rpc_mem_free(a);

    void *c = rpc_mem_alloc(4 * MIB + 100); /* the next call takes it back */
    CHECK(c == a);
    memset(c, 1, 4 * MIB + 100);
    void *d = rpc_mem_alloc(4 * MIB); /* a fresh block: huge-page aligned */
    CHECK(d && ((uintptr_t)d & (2 * MIB - 1)) == 0);
    memset(d, 2, 4 * MIB);
    slime_rpc_mem_free(d);
    void *e = rpc_mem_alloc(1 * MIB); /* d is idle but over twice too large: not lent */
    CHECK(e && e != d);
    slime_rpc_mem_free(e);
    CHECK(rpc_mem_alloc(4 * MIB) == d);
    slime_rpc_mem_free(d);
    slime_rpc_mem_free(c);
    printf("unit_payload_pool: ok\n");
    return 0;
}
