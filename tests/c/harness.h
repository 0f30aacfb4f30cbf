/*
 * harness.h - a small multi-process harness for the C tests of libdlslime.
 *
 * Each case runs in fresh processes: a supervisor (which never touches the
 * library) forks one process per rank, so a crash, a hang or a leak in one
 * case cannot hide or poison another.  Ranks talk out of band over control
 * sockets (rank 0 <-> every other rank) to swap address blobs, MR
 * descriptors and barriers.  Every rank creates its own slime context after
 * the fork: a progress thread does not survive fork().
 *
 * Nothing waits forever: every rank runs under alarm(), the supervisor kills
 * what outlives its deadline, and every library wait uses H_WAIT_MS.
 */
#ifndef DLSLIME_TEST_HARNESS_H
#define DLSLIME_TEST_HARNESS_H

#include <dlslime/dlslime.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define H_MAX_RANKS 4
/* Timeout of every library wait that is expected to complete. */
#define H_WAIT_MS 30000
/* A case (all its ranks) must be over by then; sanitizer builds are slow. */
#ifndef H_CASE_SECONDS
#define H_CASE_SECONDS 60
#endif
/* H_CASE_SECONDS, or $DLSLIME_TEST_CASE_S for a long soak run by hand */
int h_case_seconds(void);

#define H_KIB ((size_t)1024)
#define H_MIB ((size_t)1024 * 1024)

typedef struct h_rank {
    int rank;
    int nranks;
    /* rank 0: ctl[k] is the socket to rank k; rank k > 0: ctl[0] only. */
    int ctl[H_MAX_RANKS];
    /* rank 0 only: pids of the other ranks, and which ones it killed. */
    pid_t pid[H_MAX_RANKS];
    bool gone[H_MAX_RANKS];
    /* Set up by the harness unless the case is raw: a context from the
     * environment's defaults, connected to every other rank. */
    slime_ctx_t *ctx;
    slime_ep_t *ep[H_MAX_RANKS];
} h_rank_t;

typedef void (*h_case_fn)(h_rank_t *r);

typedef struct h_case {
    const char *name;
    h_case_fn fn;
    int nranks;
    /* raw: no context, no endpoints; the case builds its own. */
    bool raw;
    /* Bit k set: rank k may end by SIGKILL (a peer-loss case kills it). */
    unsigned mortal;
} h_case_t;

/* Exit code of a program skipped because DLSLIME_TRANSPORT forces a
 * transport this machine cannot give (verbs without an RDMA device); the
 * reason is printed.  ctest counts it as skipped (SKIP_RETURN_CODE). */
#define H_SKIP_EXIT 77

/* Runs every case (or only those named in argv[1..]) and returns the exit
 * code for main(). */
int h_main(const char *program, const h_case_t *cases, size_t ncases,
           int argc, char **argv);

/* The transport the environment forces ("shm", "tcp") or "auto". */
const char *h_transport(void);

/* ---- failing ------------------------------------------------------- */

_Noreturn void h_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prints a progress line prefixed with the case and rank. */
void h_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define H_CHECK(cond)                                                      \
    do {                                                                   \
        if (!(cond))                                                       \
            h_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);         \
    } while (0)

#define H_CHECK_EQ(a, b)                                                   \
    do {                                                                   \
        unsigned long long a_ = (unsigned long long)(a);                   \
        unsigned long long b_ = (unsigned long long)(b);                   \
        if (a_ != b_)                                                      \
            h_fail(__FILE__, __LINE__, "%s == %s failed: %llu != %llu",    \
                   #a, #b, a_, b_);                                        \
    } while (0)

/* A call that must return SLIME_OK. */
#define H_CHECK_OK(expr) H_CHECK_STATUS(expr, SLIME_OK)

/* A call that must return exactly want. */
#define H_CHECK_STATUS(expr, want)                                         \
    h_check_status_(__FILE__, __LINE__, #expr, (expr), (want))

/* Waits H_WAIT_MS for req; its final status must be want. */
#define H_WAIT(req, want) h_wait_(__FILE__, __LINE__, #req, (req), (want))

/* H_WAIT, then frees the request. */
#define H_WAIT_FREE(req, want)                                             \
    do {                                                                   \
        slime_req_t *r_ = (req);                                           \
        H_WAIT(r_, want);                                                  \
        slime_req_free(r_);                                                \
    } while (0)

/* The final status of an operation that may fail either when posted (an
 * argument error: then req must stay NULL) or when it completes.  req must
 * be NULL before; the request, if any, is waited for and freed.  The detail
 * text is kept for h_detail(). */
#define H_OUTCOME(req, post_expr)                                          \
    h_outcome_(__FILE__, __LINE__, #post_expr, (post_expr), &(req))

/* The outcome must be one of the listed statuses. */
#define H_CHECK_ONE_OF(status, ...)                                        \
    h_check_one_of_(__FILE__, __LINE__, #status, (status),                 \
                    (const slime_status_t[]){__VA_ARGS__},                 \
                    sizeof((const slime_status_t[]){__VA_ARGS__}) /        \
                        sizeof(slime_status_t))

void h_check_status_(const char *file, int line, const char *what,
                     slime_status_t got, slime_status_t want);
void h_wait_(const char *file, int line, const char *what, slime_req_t *req,
             slime_status_t want);
slime_status_t h_outcome_(const char *file, int line, const char *what,
                          slime_status_t posted, slime_req_t **req);
void h_check_one_of_(const char *file, int line, const char *what,
                     slime_status_t got, const slime_status_t *allowed,
                     size_t n);
/* Detail text of the last H_OUTCOME ("" if it succeeded). */
const char *h_detail(void);

/* ---- control channel (rank 0 <-> rank k) --------------------------- */

void h_ctl_send(h_rank_t *r, int to, const void *buf, size_t len);
/* Receives one message; it must fit cap.  Returns its length. */
size_t h_ctl_recv(h_rank_t *r, int from, void *buf, size_t cap);
void h_ctl_send_u64(h_rank_t *r, int to, uint64_t v);
uint64_t h_ctl_recv_u64(h_rank_t *r, int from);
/* All ranks still alive meet here. */
void h_barrier(h_rank_t *r);
/* In a two-rank case, the other rank. */
int h_peer(const h_rank_t *r);

/* ---- contexts ------------------------------------------------------ */

slime_ctx_t *h_ctx_create(const slime_ctx_opts_t *opts);
/* Writes ctx's address blob into buf (SLIME_ADDRESS_MAX bytes). */
size_t h_ctx_address(slime_ctx_t *ctx, uint8_t *buf);
/* Every rank passes its ctx; all swap address blobs through rank 0:
 * blobs[k] / lens[k] become rank k's.  Returns this rank's length. */
size_t h_exchange_addresses(h_rank_t *r, slime_ctx_t *ctx,
                            uint8_t blobs[][SLIME_ADDRESS_MAX], size_t *lens);
/* Every rank passes its ctx; all swap address blobs through rank 0 and
 * each connects to every other rank, filling eps[] (eps[rank] = NULL). */
void h_connect_all(h_rank_t *r, slime_ctx_t *ctx, slime_ep_t **eps);
/* Rank 0 only: SIGKILLs rank k; the supervisor reaps it. */
void h_kill_rank(h_rank_t *r, int k);

/* ---- fetched rendezvous (harness_rndv.c, harness_seccomp.c) ------ */

/* A context of its own on `transport`, made with $env set to mode
 * (unset when mode is NULL) and connected to the other rank; *ep is the
 * endpoint to it, checked to be of that transport. */
slime_ctx_t *h_pair_ctx(h_rank_t *r, const char *transport, const char *env, const char *mode, slime_ep_t **ep);
/* Sends each of the n sizes from rank 0 to rank 1 and back over ep
 * (tags tag + i), receives posted before and after their announcement,
 * every byte checked; ends with a barrier. */
void h_rendezvous_both_ways(h_rank_t *r, slime_ep_t *ep, const size_t *sizes, size_t n, uint64_t tag);
/* h_rendezvous_both_ways on a fresh h_pair_ctx, which it then destroys;
 * returns that context's counter `which` as it stood at the end. */
uint64_t h_rendezvous_counted(h_rank_t *r, const char *transport, const char *env, const char *mode,
                              const size_t *sizes, size_t n, uint64_t tag, slime_counter_t which);
/* process_vm_readv fails with EPERM in this process from now on. */
void h_refuse_cma(void);
/* Puts each rank in a network namespace of its own, joined by a veth
 * pair (10.215.0.1 and .2), and makes it listen on its end; false on
 * both ranks when either could not (not root: said in the log). */
bool h_own_netns(h_rank_t *r);

/* ---- memory -------------------------------------------------------- */

/* Zeroed memory; fails the case if none. */
void *h_alloc(size_t len);
slime_mr_t *h_mr_reg(slime_ctx_t *ctx, void *addr, size_t len,
                     unsigned access);
/* Sends mr's descriptor to rank `to` / receives one from rank `from`. */
void h_send_desc(h_rank_t *r, int to, const slime_mr_t *mr);
slime_mr_desc_t h_recv_desc(h_rank_t *r, int from);

/* ---- deterministic byte patterns ----------------------------------- */

/* Byte i of the stream named seed; streams of different seeds differ. */
uint8_t h_pattern_byte(uint64_t seed, uint64_t i);
/* buf[j] = h_pattern_byte(seed, start + j). */
void h_fill(void *buf, size_t len, uint64_t seed, uint64_t start);
/* Index of the first j with buf[j] != h_pattern_byte(seed, start + j), or
 * -1 if all match. */
long long h_mismatch(const void *buf, size_t len, uint64_t seed,
                     uint64_t start);
/* Index of the first byte != value, or -1. */
long long h_mismatch_byte(const void *buf, size_t len, uint8_t value);

#define H_CHECK_PATTERN(buf, len, seed, start)                             \
    do {                                                                   \
        long long at_ = h_mismatch((buf), (len), (seed), (start));         \
        if (at_ >= 0)                                                      \
            h_fail(__FILE__, __LINE__,                                     \
                   "%s: byte %lld of %zu differs from pattern %llu",       \
                   #buf, at_, (size_t)(len), (unsigned long long)(seed));  \
    } while (0)

#define H_CHECK_BYTES(buf, len, value)                                     \
    do {                                                                   \
        long long at_ = h_mismatch_byte((buf), (len), (value));            \
        if (at_ >= 0)                                                      \
            h_fail(__FILE__, __LINE__, "%s: byte %lld of %zu is not 0x%02x",\
                   #buf, at_, (size_t)(len), (unsigned)(value));           \
    } while (0)

/* ---- time ---------------------------------------------------------- */

int64_t h_now_ms(void);
void h_sleep_ms(int ms);

#endif /* DLSLIME_TEST_HARNESS_H */
