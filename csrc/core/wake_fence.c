/* The order between a completion and a sleeper's look at it, paid by
 * the sleeper (and the same between processes, for the shared boxes).
 * A completer stores a request's state, then looks whether
 * anyone sleeps (ctx_wake); a sleeper counts itself in, then looks at
 * the state.  Each side's store must be seen before its own look, or
 * both may miss the other: a full fence on each side.  The completer's
 * side runs on every completion, on a small message's path; the
 * sleeper's only after a wait gave up spinning.  So where the kernel has
 * membarrier(2), the sleeper forces a full fence on every running thread
 * of the process, and the completer needs only to keep the compiler from
 * reordering its look (p2p_bench sendrecv, 8 B over shm: ~5 ns of ~260
 * one way). */
#include <linux/membarrier.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/internal.h"

static int membarrier(int cmd) { return (int)syscall(__NR_membarrier, cmd, 0, 0); }

/* A writer's side: a compiler barrier where a sleeper's membarrier
 * covers it (light), else a full fence. */
static void writer_fence(bool light) {
    if (light)
        atomic_signal_fence(memory_order_seq_cst);
    else
        atomic_thread_fence(memory_order_seq_cst);
}

/* Each context asks (again is harmless): a process that forked and
 * creates its contexts in the child registers there. */
void wake_fence_register(slime_ctx_t *ctx) {
    int cmds = membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds < 0) cmds = 0;
    atomic_store(&ctx->light_wake, (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                                       membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0);
    ctx->light_shared =
        (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
}

void wake_fence_completer(slime_ctx_t *ctx) {
    writer_fence(atomic_load_explicit(&ctx->light_wake, memory_order_relaxed));
}

/* Between processes: a writer to shared memory, then its look at the
 * reader's sleep flag, against a reader's flag, then its look at what it
 * waits for (coll/pairbox.c).  A registered writer (light_shared) needs
 * no fence: a sleeper's global membarrier reaches every registered
 * process.  One not registered keeps its own fence.  An 8-byte two-rank
 * allreduce, allgather or reduce_scatter: ~20 ns of ~285. */
void p2p_shared_fence_writer(const slime_ctx_t *ctx) { writer_fence(ctx->light_shared); }

bool p2p_shared_fence_sleeper(void) {
    if (membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0) return true;
    atomic_thread_fence(memory_order_seq_cst); /* for writers that fence */
    return false;
}

bool wake_fence_sleeper(slime_ctx_t *ctx) {
    if (!atomic_load_explicit(&ctx->light_wake, memory_order_relaxed)) return true;
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
    /* refused after all: completers fence from now on; those that did
     * not may have missed us, so our sleep must be short this time */
    atomic_store(&ctx->light_wake, false);
    return false;
}
