/*
 * test_shm_fetch.c - shm rendezvous the receiver fetches by CMA
 * (transport/shm_fetch.c).  Both ranks use shm whatever the environment
 * forces.  DLSLIME_SHM_FETCH=1 fetches on any host; the default only on
 * a crowded one, which the test makes by confining both ranks to one
 * core.  Each case moves rendezvous both ways, with the receive posted
 * before and after the announcement, checks every byte, and counts what
 * this rank fetched (SLIME_COUNTER_SHM_FETCHES).
 */
#include "harness.h"
#include "test_coll_util.h"

#include <sched.h>
#include <stdlib.h>

#define TAG 50

/* Past the eager limit (256 KiB), up to 4 MiB (the default fetch limit
 * is 16 MiB). */
static const size_t sizes[] = {300 * H_KIB, H_MIB + 3, 4 * H_MIB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Moves every size both ways over shm; returns this rank's fetches. */
static uint64_t exchange(h_rank_t *r, const char *mode) {
    return h_rendezvous_counted(r, "shm", "DLSLIME_SHM_FETCH", mode, sizes, NSIZES, TAG, SLIME_COUNTER_SHM_FETCHES);
}

/* Asked for, every rendezvous is fetched by its receiver. */
static void case_fetched(h_rank_t *r) {
    H_CHECK_EQ(exchange(r, "1"), NSIZES);
}

/* Past DLSLIME_SHM_FETCH_MAX a rendezvous takes the rings: of the sizes,
 * only the first is fetched. */
static void case_limit(h_rank_t *r) {
    H_CHECK(setenv("DLSLIME_SHM_FETCH_MAX", "1M", 1) == 0);
    H_CHECK_EQ(exchange(r, "1"), 1);
}

/* Switched off, nothing is fetched. */
static void case_off(h_rank_t *r) {
    H_CHECK_EQ(exchange(r, "0"), 0);
}

/* Whether both ranks have two cores or more (false: logged, not run):
 * the rings fetch only with no more ranks than cores. */
static bool cores_for_both(h_rank_t *r) {
    cpu_set_t set;
    H_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    int cpus = CPU_COUNT(&set);
    h_ctl_send_u64(r, h_peer(r), (uint64_t)cpus);
    uint64_t theirs = h_ctl_recv_u64(r, h_peer(r));
    if (cpus >= 2 && theirs >= 2) return true;
    h_log("not run: a rank has a single core (a crowded host)");
    return false;
}

/* The default, with a core for each rank: the rings carry everything
 * below DLSLIME_SHM_FETCH_ROOMY (8 MiB)... */
static void case_roomy(h_rank_t *r) {
    if (cores_for_both(r)) H_CHECK_EQ(exchange(r, NULL), 0);
}

/* ...and from it on, a rendezvous is fetched there too; 0 turns that off. */
static void case_roomy_large(h_rank_t *r) {
    static const size_t large[] = {8 * H_MIB, 16 * H_MIB + 5};
    if (!cores_for_both(r)) return;
    H_CHECK_EQ(h_rendezvous_counted(r, "shm", "DLSLIME_SHM_FETCH", NULL, large, 2, TAG, SLIME_COUNTER_SHM_FETCHES), 2);
    H_CHECK(setenv("DLSLIME_SHM_FETCH_ROOMY", "0", 1) == 0);
    H_CHECK_EQ(h_rendezvous_counted(r, "shm", "DLSLIME_SHM_FETCH", NULL, large, 2, TAG, SLIME_COUNTER_SHM_FETCHES), 0);
}

/* The default on a crowded host (both ranks on one core): every
 * rendezvous is fetched. */
static void case_crowded(h_rank_t *r) {
    cpu_set_t set, one;
    H_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
            CPU_SET(c, &one);
            break;
        }
    H_CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
    H_CHECK_EQ(exchange(r, NULL), NSIZES);
}

/* A receiver the kernel refuses CMA still gets every byte of an offered
 * rendezvous (by a plain CTS and the rings); its peer, which may read
 * it, fetches as before. */
static void case_refused(h_rank_t *r) {
    if (r->rank == 1) h_refuse_cma();
    H_CHECK_EQ(exchange(r, "1"), r->rank == 1 ? 0 : NSIZES);
}

/* A 2-rank communicator (id) on a fresh shm context made with
 * DLSLIME_SHM_FETCH=mode (unset: NULL), returned in *ctx. */
static slime_comm_t *pair_comm(h_rank_t *r, const char *mode, uint32_t id, slime_ctx_t **ctx) {
    slime_ep_t *ep = NULL;
    *ctx = h_pair_ctx(r, "shm", "DLSLIME_SHM_FETCH", mode, &ep);
    slime_ep_t *peers[2] = {NULL, NULL};
    peers[h_peer(r)] = ep;
    slime_comm_t *comm = NULL;
    H_CHECK_OK(slime_comm_create(*ctx, id, 1, r->rank, 2, peers, H_WAIT_MS, &comm));
    return comm;
}

/* Destroys both, once the other rank is done with its side too. */
static void pair_comm_end(h_rank_t *r, slime_ctx_t *ctx, slime_comm_t *comm) {
    slime_comm_destroy(comm);
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* A collective's chunks keep to the rings even where a fetch is asked
 * for (send_path_t): a 2-rank all_reduce of 16 MiB, whose 512 KiB chunks
 * go by rendezvous (the ring's reads switched off), fetches nothing and
 * sums right. */
static void case_collective(h_rank_t *r) {
    H_CHECK(setenv("DLSLIME_COLL_CMA", "0", 1) == 0);
    slime_ctx_t *ctx = NULL;
    slime_comm_t *comm = pair_comm(r, "1", 7, &ctx);
    h_barrier(r);
    const size_t n = 4 * H_MIB; /* floats: 16 MiB */
    float *buf = h_alloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 1021) + (float)r->rank;
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_allreduce(comm, buf, n, SLIME_DT_FLOAT32, SLIME_RED_SUM, &req));
    H_WAIT_FREE(req, SLIME_OK);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != 2.0f * (float)(i % 1021) + 1.0f) H_CHECK_EQ(i, n); /* names the first wrong one */
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 0);
    free(buf);
    pair_comm_end(r, ctx, comm);
}

/* Rank 1's fetches after a 2-rank broadcast of bytes from rank 0 on a
 * shm context with the default DLSLIME_SHM_FETCH; every byte checked. */
static uint64_t broadcast_fetches(h_rank_t *r, size_t bytes) {
    slime_ctx_t *ctx = NULL;
    slime_comm_t *comm = pair_comm(r, NULL, 8, &ctx);
    uint8_t *buf = h_alloc(bytes);
    if (r->rank == 0) h_fill(buf, bytes, 77, 0);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_broadcast(comm, buf, bytes, 0, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_EQ(h_mismatch(buf, bytes, 77, 0), -1);
    uint64_t fetched = slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES);
    free(buf);
    pair_comm_end(r, ctx, comm);
    return r->rank == 1 ? fetched : 0;
}

/* A broadcast's root waits on its whole buffer, with no pipeline to keep
 * it busy: its receiver fetches it on any host, crowded or not, up to
 * 1 MiB (send_path_t, coll/exchange.c); past that the rings carry it. */
static void case_broadcast(h_rank_t *r) {
    H_CHECK_EQ(broadcast_fetches(r, 256 * H_KIB), (r->rank == 1 ? 1 : 0));
    H_CHECK_EQ(broadcast_fetches(r, H_MIB), (r->rank == 1 ? 1 : 0));
    H_CHECK_EQ(broadcast_fetches(r, 2 * H_MIB), 0);
}

/* A ring whose receivers only copy its chunks has them fetched, one
 * copy where the rings make two (run_send_fetched): an allgather's from
 * 16 KiB, a reduce_scatter's (copied into a slot to combine) from 128
 * KiB.  So a 2-rank allgather of 128 or 64 KiB per rank (below the size
 * where its links read) and a reduce_scatter of two 128 KiB blocks each
 * fetch the one chunk a rank receives; an allgather of 8 KiB per rank, a
 * reduce_scatter of two 64 KiB blocks and an all_reduce, whose reduce
 * step combines out of the rings, fetch nothing.  Every element checked. */
static void case_copying_rings(h_rank_t *r) {
    if (!cores_for_both(r)) return;
    slime_ctx_t *ctx = NULL;
    slime_comm_t *comm = pair_comm(r, NULL, 9, &ctx);
    const size_t n = 32 * H_KIB; /* floats per rank: 128 KiB */
    t_allgather_checked(comm, 2, r->rank, n * sizeof(float), false, 1);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 1);
    t_allgather_checked(comm, 2, r->rank, n / 2 * sizeof(float), false, 2);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 2);
    t_allgather_checked(comm, 2, r->rank, n / 16 * sizeof(float), false, 3);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 2);
    t_reduce_scatter_checked(comm, 2, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, n, false);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 3);
    t_reduce_scatter_checked(comm, 2, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, n / 2, false);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 3);
    t_allreduce_checked(comm, 2, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 2 * n);
    H_CHECK_EQ(slime_ctx_counter(ctx, SLIME_COUNTER_SHM_FETCHES), 3);
    pair_comm_end(r, ctx, comm);
}

int main(int argc, char **argv) {
    static const h_case_t cases[] = {
        {"fetched", case_fetched, 2, true, 0},     {"limit", case_limit, 2, true, 0},
        {"off", case_off, 2, true, 0},             {"roomy", case_roomy, 2, true, 0},
        {"roomy_large", case_roomy_large, 2, true, 0},
        {"crowded", case_crowded, 2, true, 0},     {"refused", case_refused, 2, true, 0},
        {"collective", case_collective, 2, true, 0}, {"broadcast", case_broadcast, 2, true, 0},
        {"copying_rings", case_copying_rings, 2, true, 0},
    };
    return h_main("test_shm_fetch", cases, sizeof cases / sizeof cases[0], argc, argv);
}
