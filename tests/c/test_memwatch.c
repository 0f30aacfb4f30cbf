/* Watched memory (slime_mem_watch) and the registrations kept inside it.
 *
 * api: bad ranges, overlaps and unknown unwatches refused; a few hundred
 * ranges watched and unwatched in shuffled order always agree with a
 * plain list of what should be watched.
 *
 * kept: large messages from and into watched buffers.  On verbs each
 * buffer is registered once and reused (slime_ctx_counter), an unwatched
 * buffer is registered per message, and memory unwatched, unmapped and
 * mapped anew at the same address is registered again: the peer gets the
 * new bytes, never the old pages'.  Elsewhere nothing is registered. */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MSG (1u << 20) /* above the verbs rendezvous minimum (256 KiB) */
#define SENDS 4
#define N_RANGES 300

static void case_api(h_rank_t *r)
{
    (void)r;
    static uint8_t arena[N_RANGES * 64];
    H_CHECK(slime_mem_watch(NULL, 10) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_watch(arena, 0) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_watch((void *)(UINTPTR_MAX - 8), 64) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_unwatch(arena) == SLIME_ERR_INVAL);
    H_CHECK(strstr(slime_last_error(), "no watched range") != NULL);
    H_CHECK(!slime_mem_watched(arena, 1));

    H_CHECK_OK(slime_mem_watch(arena + 64, 64));
    H_CHECK(slime_mem_watch(arena + 64, 64) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_watch(arena + 100, 8) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_watch(arena, 65) == SLIME_ERR_INVAL);
    H_CHECK(strstr(slime_last_error(), "overlaps") != NULL);
    H_CHECK(slime_mem_unwatch(arena + 65) == SLIME_ERR_INVAL);
    H_CHECK(slime_mem_watched(arena + 64, 64) && slime_mem_watched(arena + 127, 1));
    H_CHECK(!slime_mem_watched(arena + 63, 2) && !slime_mem_watched(arena + 64, 65));
    H_CHECK(!slime_mem_watched(arena + 64, 0));
    H_CHECK_OK(slime_mem_unwatch(arena + 64));
    H_CHECK(!slime_mem_watched(arena + 64, 1));

    /* ranges i: [64 i, 64 i + 1 + i % 63), watched and unwatched shuffled */
    bool want[N_RANGES] = {false};
    srand(7);
    for (int step = 0; step < 4000; step++) {
        int i = rand() % N_RANGES;
        uint8_t *p = arena + 64 * i;
        size_t len = 1 + (size_t)(i % 63);
        if (want[i]) H_CHECK_OK(slime_mem_unwatch(p));
        else H_CHECK_OK(slime_mem_watch(p, len));
        want[i] = !want[i];
        int j = rand() % N_RANGES;
        uint8_t *q = arena + 64 * j;
        size_t qlen = 1 + (size_t)(j % 63);
        H_CHECK_EQ(slime_mem_watched(q, qlen), want[j]);
        H_CHECK(!slime_mem_watched(q + qlen, 1) && !slime_mem_watched(q, 65));
    }
    for (int i = 0; i < N_RANGES; i++)
        if (want[i]) H_CHECK_OK(slime_mem_unwatch(arena + 64 * i));
}

static bool on_verbs(h_rank_t *r)
{
    return strcmp(slime_ep_transport(r->ep[h_peer(r)]), "verbs") == 0;
}

static void counts(h_rank_t *r, uint64_t *made, uint64_t *reused)
{
    *made = slime_ctx_counter(r->ctx, SLIME_COUNTER_BUF_REGISTRATIONS);
    *reused = slime_ctx_counter(r->ctx, SLIME_COUNTER_BUF_REG_REUSED);
}

/* The side's counters moved by exactly this much (nothing off verbs). */
static void check_moved(h_rank_t *r, uint64_t made0, uint64_t reused0, uint64_t made, uint64_t reused)
{
    uint64_t m, u;
    counts(r, &m, &u);
    if (!on_verbs(r)) made = reused = 0;
    H_CHECK_EQ(m - made0, made);
    H_CHECK_EQ(u - reused0, reused);
}

static void *map_at(void *where)
{
    void *p = mmap(where, MSG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (where ? MAP_FIXED : 0), -1, 0);
    H_CHECK(p != MAP_FAILED);
    return p;
}

static void transfer(h_rank_t *r, uint8_t *buf, uint64_t seed)
{
    slime_req_t *req = NULL;
    if (r->rank == 0) {
        h_fill(buf, MSG, seed, 0);
        H_CHECK_OK(slime_send(r->ep[1], buf, MSG, seed, &req));
        H_WAIT_FREE(req, SLIME_OK);
    } else {
        memset(buf, 0, MSG);
        H_CHECK_OK(slime_recv(r->ep[0], buf, MSG, seed, &req));
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_PATTERN(buf, MSG, seed, 0);
    }
}

static void case_kept(h_rank_t *r)
{
    uint64_t m0, u0;
    uint8_t *buf = map_at(NULL);
    H_CHECK_OK(slime_mem_watch(buf, MSG));
    counts(r, &m0, &u0);
    for (uint64_t k = 0; k < SENDS; k++) transfer(r, buf, 100 + k);
    check_moved(r, m0, u0, 1, SENDS - 1);

    /* freed and mapped anew at the same address: registered again */
    H_CHECK_OK(slime_mem_unwatch(buf));
    H_CHECK_EQ(munmap(buf, MSG), 0);
    H_CHECK(map_at(buf) == buf);
    H_CHECK_OK(slime_mem_watch(buf, MSG));
    counts(r, &m0, &u0);
    transfer(r, buf, 200);
    transfer(r, buf, 201);
    check_moved(r, m0, u0, 1, 1);
    H_CHECK_OK(slime_mem_unwatch(buf));

    /* not watched: a registration per message, none kept */
    counts(r, &m0, &u0);
    transfer(r, buf, 300);
    transfer(r, buf, 301);
    check_moved(r, m0, u0, 2, 0);
    H_CHECK_EQ(munmap(buf, MSG), 0);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"api", case_api, 1, true, 0},
        {"kept", case_kept, 2, false, 0},
    };
    return h_main("test_memwatch", cases, sizeof cases / sizeof cases[0], argc, argv);
}
