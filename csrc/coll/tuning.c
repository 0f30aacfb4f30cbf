/* The collectives' tuning: sizes from the environment, read once, and
 * the cores this process may run on. */
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "coll/coll.h"

typedef struct knob {
    _Atomic bool read;
    _Atomic size_t value;
} knob_t;

/* name's size (dflt when unset), at least min; racing first readers
 * compute the same value. */
static size_t knob_get(knob_t *k, const char *name, size_t dflt, size_t min) {
    if (!atomic_load_explicit(&k->read, memory_order_acquire)) {
        size_t v = env_size(name, dflt);
        atomic_store_explicit(&k->value, v < min ? min : v, memory_order_relaxed);
        atomic_store_explicit(&k->read, true, memory_order_release);
    }
    return atomic_load_explicit(&k->value, memory_order_relaxed);
}

size_t coll_chunk_bytes(void) {
    static knob_t k;
    return knob_get(&k, "DLSLIME_COLL_CHUNK", 512 * 1024, 4096);
}

/* The host's online cores: the same for every process on it, where the
 * affinity (p2p_affinity_cpus) may differ. */
static long host_cores(void) {
    static _Atomic long cores;
    long n = atomic_load(&cores);
    if (!n) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        atomic_store(&cores, n = n < 1 ? 1 : n);
    }
    return n;
}

/* Which way a reducing ring is faster depends on the machine.  On one
 * 2-core machine (AMD) two ranks' all_reduce ran faster through the shm
 * stream than by reads (torch_op_focus, medians of 5, alternating:
 * 16 MiB 3.6-3.7 ms vs 5.0-5.2, 64 MiB 14.3-16.3 ms vs 15.5-21.6),
 * while p2p_bench put MPI at 1.5x and 3.2x the stream's time there.  On
 * another (Intel, large L3), reads won from 2 MiB and the stream left
 * all_reduce at 0.56-0.79x MPI (p2p_bench, medians of 3, avg us, stream
 * / reads / MPI: 1 MiB 201 / 200 / 199, 2 MiB 436 / 352 / 343, 4 MiB
 * 872 / 629 / 641, 16 MiB 3558 / 2315 / 2336, 64 MiB 16014 / 14976 /
 * 31368; through torch at 4 ranks, 16 MiB 14.1-15.6 ms / 9.9-10.2).
 * Once the shm rings published 64 KiB pieces instead of 256 KiB, the
 * stream won at 1 MiB on that Intel machine too (p2p_bench, 8 rounds
 * alternating, avg us, reads / stream: 1 MiB 201 / 167, 1.5 MiB 293 /
 * 265, 2 MiB 367 / 404): reads from 2 MiB.  But the stream needs both
 * ends of a link on a core at once, and with more ranks than cores it
 * lost badly (through torch, 4 ranks on 2 cores, 1 MiB: reads 627-722
 * us, stream 1268-1271): there reads from 1 MiB.  The host's online
 * cores, not this process's affinity, so both ends of an shm link agree. */
size_t coll_cma_min_bytes(int comm_size) {
    static knob_t k;
    size_t set = knob_get(&k, "DLSLIME_COLL_CMA_MIN", SIZE_MAX, 0);
    if (set != SIZE_MAX) return set;
    return comm_size > host_cores() ? 1024 * 1024 : 2 * 1024 * 1024;
}

/* A ring that only copies (allgather) reads each block straight into
 * its place: one copy where the stream makes two, and no reduction for
 * the stream's pipelining to hide.  p2p_bench allgather, 2 ranks, the
 * stream and reads alternating (medians of 3, avg us): 128 KiB 9.0 ->
 * 7.4, 256 KiB 20.2 -> 10.3, 1 MiB 94.4 -> 24.8, 4 MiB 398 -> 201,
 * 256 MiB 30794 -> 26280; 64 KiB 5.0 -> 6.0, so not below 128 KiB.
 * (On the 2-core machine of the reducing rings' measurement above,
 * allgather was level either way.)  Once a ring's chunks were fetched by
 * their receivers (run_send_fetched: one copy too, with no reads to set
 * up), the fetches won up to 2 MiB (6 rounds, avg us, reads / fetched:
 * 128 KiB 6.5 / 4.2, 256 KiB 8.8 / 6.3, 1 MiB 21.8 / 18.9, 2 MiB 56.0
 * / 52.0, 4 MiB 177 / 171, 16 MiB 703 / 718): reads from 4 MiB.  Chunks
 * are fetched only with no more ranks than cores; with more, reads from
 * 128 KiB as before. */
size_t coll_cma_copy_min_bytes(int comm_size) {
    static knob_t k;
    size_t set = knob_get(&k, "DLSLIME_COLL_CMA_COPY_MIN", SIZE_MAX, 0);
    if (set != SIZE_MAX) return set;
    return comm_size > host_cores() ? 128 * 1024 : 4 * 1024 * 1024;
}

size_t coll_small_bytes(void) {
    static knob_t k;
    return knob_get(&k, "DLSLIME_COLL_SMALL", 64 * 1024, 0);
}

/* Two ranks' all_reduce over shm takes the ring sooner: it halves each
 * rank's share of the reduction, and its first receives are posted
 * before any block is sent.  Through torch on 2 cores, p50 of 3
 * alternating runs, 64 KiB: 2 ranks 20-22 us by recursive doubling, 17
 * by the ring; 4 ranks 138-172 against 203-209, and 2 ranks over tcp at
 * 48 KiB 39-40 against 49-68, so those keep coll_small_bytes. */
size_t coll_pair_small_bytes(void) {
    static knob_t k;
    return knob_get(&k, "DLSLIME_COLL_SMALL_PAIR", 32 * 1024, 0);
}

/* Past 4 KiB the box lost to messages: p2p_bench allreduce, alternating
 * runs with DLSLIME_PAIR_BOX=0, 8 B 0.6-0.8 us against 1.7-1.9, 2 KiB
 * 1.1-1.2 against 2.5-2.7, 4 KiB 2.2-2.8 against 3.0-3.3, 8 KiB
 * 5.2-6.1 against 4.8-5.2 */
size_t coll_pair_box_bytes(void) {
    static knob_t k;
    return knob_get(&k, "DLSLIME_PAIR_BOX_MAX", 4096, 0);
}

size_t coll_sync_bytes(void) {
    static knob_t k;
    return knob_get(&k, "DLSLIME_COLL_SYNC_MIN", 32 * 1024, 0);
}
