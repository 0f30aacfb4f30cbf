/*
 * p2p_bench - point-to-point latency and bandwidth of libdlslime, measured
 * next to the physical references of the same machine.
 *
 *   p2p_bench slime  --transport shm|tcp|verbs [--ops LIST] --sizes LIST
 *   p2p_bench socket [--ops LIST] --sizes LIST   plain blocking TCP, loopback
 *   p2p_bench memcpy --sizes LIST                single-thread memcpy
 *
 *   --ops       comma list of sendrecv,read,write,allreduce,broadcast,
 *               allgather,reduce_scatter (default: the first three)
 *   --sizes     comma list of byte counts
 *   --time S    target seconds of timed iterations per size (default 0.2)
 *   --min-iters N, --max-iters N   bounds on the timed iterations
 *   --deadline S   the whole run is killed after S seconds (default 900)
 *   --target-memory heap|shared   where the read/write target's region
 *               lives: the heap (default) or slime_mem_alloc, which shm
 *               peers map and copy with memcpy
 *
 * stdout carries one CSV line per measured (op, size), and nothing else:
 *   row,<bench>,<transport>,<op>,<bytes>,<iters>,<avg_us>,<p50_us>,<p99_us>,<gbps>
 * Progress and errors go to stderr.  bench/p2p_bench.py drives it.
 *
 * What a time means (so the three benches compare like with like):
 *   sendrecv  one-way time: half of a ping-pong round trip of `bytes` each
 *             way (the peer echoes what it received): a send waited for,
 *             then a receive, on both sides, as MPI's pair does it.
 *   read      one slime_read (socket: a 1-byte request, then `bytes` back)
 *             posted and waited for by the initiator.
 *   write     one slime_write (socket: `bytes`, then a 1-byte ack).
 *   allreduce one slime_allreduce (float32 SUM, in place) of a 2-rank
 *             communicator, as the initiator sees it (slime only; the
 *             socket has no such op; bench/mpi_bench.c measures MPI's).
 *   broadcast, allgather, reduce_scatter: the same for those collectives
 *             (broadcast from the initiator; allgather in place, `bytes`
 *             the whole output; reduce_scatter float32 SUM, `bytes` the
 *             whole input, each rank's result a half).
 *   memcpy    one memcpy; gbps comes from the best of a few runs.
 *   gbps      bytes / avg time, in 10^9 bytes per second.
 * Every (op, size) is followed by one untimed iteration whose bytes are
 * checked end to end, so a broken transport cannot post a number.
 *
 * Both processes come from one fork() made before any slime context
 * exists; they talk over a socketpair ("control channel") for everything
 * that must not be timed: address blobs, MR descriptors, iteration counts,
 * fill / zero / check requests.
 */
#include <dlslime/dlslime.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A 256 MiB operation at a crawl (tens of MB/s) must still fit. */
#define WAIT_MS 60000
#define CONNECT_MS 10000
#define TAG_PING 0x70696e67u
#define TAG_PONG 0x706f6e67u
#define MAX_SIZES 64
#define MEMCPY_MAX_RUNS 200

enum bench_kind { BENCH_SLIME, BENCH_SOCKET, BENCH_MEMCPY };
enum op_bit {
    OP_SENDRECV = 1u, OP_READ = 2u, OP_WRITE = 4u, OP_ALLREDUCE = 8u,
    OP_BROADCAST = 16u, OP_ALLGATHER = 32u, OP_REDUCE_SCATTER = 64u,
};
/* the collectives of the pair's communicator */
#define OPS_COLL (OP_ALLREDUCE | OP_BROADCAST | OP_ALLGATHER | OP_REDUCE_SCATTER)

static const struct {
    unsigned bit;
    const char *name;
} OP_NAMES[] = {{OP_SENDRECV, "sendrecv"}, {OP_READ, "read"}, {OP_WRITE, "write"},
                {OP_ALLREDUCE, "allreduce"}, {OP_BROADCAST, "broadcast"},
                {OP_ALLGATHER, "allgather"}, {OP_REDUCE_SCATTER, "reduce_scatter"}};
#define N_OPS (sizeof OP_NAMES / sizeof OP_NAMES[0])

struct options {
    enum bench_kind bench;
    const char *transport;
    unsigned ops;
    size_t sizes[MAX_SIZES];
    size_t nsizes;
    size_t max_size;
    double target_s;
    size_t min_iters, max_iters;
    unsigned deadline_s;
    bool shared_target;   /* the target's region from slime_mem_alloc */
};

/* ------------------------------------------------------------------ */
/* Small utilities                                                     */
/* ------------------------------------------------------------------ */

static const char *g_role = "main";

/* _exit, not exit: a forked target must not flush stdio buffers it
 * inherited, and every row is flushed as soon as it is printed. */
static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "p2p_bench[%s]: ", g_role);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(1);
}

static void on_deadline(int sig)
{
    static const char msg[] = "p2p_bench: deadline passed, giving up\n";
    (void)sig;
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    _exit(3);
}

static void arm_deadline(unsigned seconds)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_deadline;
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t clamp_size(double v, size_t lo, size_t hi)
{
    if (!(v > (double)lo))
        return lo;
    if (v > (double)hi)
        return hi;
    return (size_t)v;
}

/* Page-aligned and touched, so no page fault lands inside a timing. */
static unsigned char *buf_alloc(size_t len)
{
    size_t rounded = (len + 4095) & ~(size_t)4095;
    unsigned char *p = aligned_alloc(4096, rounded ? rounded : 4096);
    if (!p)
        fail("out of memory allocating %zu bytes", len);
    memset(p, 0, rounded);
    return p;
}

/* The check pattern: a seed per (op, size) makes stale bytes left by an
 * earlier size or iteration fail the check. */
static uint64_t pattern_word(uint64_t seed, uint64_t j)
{
    uint64_t x = seed + (j + 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

static void pattern_fill(unsigned char *buf, size_t len, uint64_t seed)
{
    size_t words = len / 8;
    for (size_t j = 0; j < words; j++) {
        uint64_t w = pattern_word(seed, j);
        memcpy(buf + 8 * j, &w, 8);
    }
    if (len % 8) {
        uint64_t w = pattern_word(seed, words);
        memcpy(buf + 8 * words, &w, len % 8);
    }
}

/* Offset of the first wrong byte, or len when every byte is right. */
static size_t pattern_check(const unsigned char *buf, size_t len, uint64_t seed)
{
    unsigned char want[8];
    for (size_t off = 0; off < len; off += 8) {
        uint64_t w = pattern_word(seed, off / 8);
        size_t n = len - off < 8 ? len - off : 8;
        memcpy(want, &w, 8);
        for (size_t i = 0; i < n; i++)
            if (buf[off + i] != want[i])
                return off + i;
    }
    return len;
}

/* allreduce's check: small integers, exact in float32 when summed; rank
 * r holds float_value(i, r) and both must end with the sum of the two. */
static float float_value(size_t i, int rank)
{
    return (float)(i % 1021) + 4096.0f * (float)rank;
}

static void float_fill(unsigned char *buf, size_t bytes, int rank)
{
    for (size_t i = 0; i < bytes / sizeof(float); i++) {
        float v = float_value(i, rank);
        memcpy(buf + i * sizeof v, &v, sizeof v);
    }
}

/* Index of the first wrong sum, or bytes / 4 when all are right; buf
 * holds the sums of elements first, first + 1, ... */
static size_t float_check_sum(const unsigned char *buf, size_t bytes, size_t first)
{
    size_t n = bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) {
        float v, want = float_value(first + i, 0) + float_value(first + i, 1);
        memcpy(&v, buf + i * sizeof v, sizeof v);
        if (v != want)
            return i;
    }
    return n;
}

static uint64_t seed_for(unsigned op, size_t bytes)
{
    return ((uint64_t)op << 56) ^ ((uint64_t)bytes * 0x100000001B3ull) ^ 0x5EEDu;
}

struct stats {
    double avg_us, p50_us, p99_us;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentiles; sorts us in place. */
static struct stats stats_of(double *us, size_t n)
{
    struct stats s = {0, 0, 0};
    double sum = 0;
    qsort(us, n, sizeof *us, cmp_double);
    for (size_t i = 0; i < n; i++)
        sum += us[i];
    s.avg_us = sum / (double)n;
    s.p50_us = us[(50 * n + 99) / 100 - 1];
    s.p99_us = us[(99 * n + 99) / 100 - 1];
    return s;
}

static void print_row(const char *bench, const char *transport, const char *op,
                      size_t bytes, size_t iters, struct stats s, double gbps)
{
    printf("row,%s,%s,%s,%zu,%zu,%.4f,%.4f,%.4f,%.6g\n", bench, transport, op,
           bytes, iters, s.avg_us, s.p50_us, s.p99_us, gbps);
    fflush(stdout);
}

/* ------------------------------------------------------------------ */
/* Byte streams: the control channel and the socket reference          */
/* ------------------------------------------------------------------ */

static int write_full(int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void write_or_fail(int fd, const void *buf, size_t len, const char *what)
{
    if (write_full(fd, buf, len))
        fail("%s: send failed: %s", what, errno ? strerror(errno) : "closed");
}

static void read_or_fail(int fd, void *buf, size_t len, const char *what)
{
    errno = 0;
    if (read_full(fd, buf, len))
        fail("%s: receive failed: %s", what,
             errno ? strerror(errno) : "peer closed the connection");
}

enum ctl_kind {
    CMD_PINGPONG = 1,   /* iters x (receive bytes, echo them) */
    CMD_PINGPONG_CHECK, /* one ping-pong; check the bytes against seed */
    CMD_SINK,           /* socket: iters x (receive bytes, send 1-byte ack) */
    CMD_SOURCE,         /* socket: iters x (receive 1-byte request, send bytes) */
    CMD_FILL,           /* fill [0, bytes) of the target buffer from seed */
    CMD_ZERO,           /* zero [0, bytes) of the target buffer */
    CMD_CHECK,          /* check [0, bytes) of the target buffer against seed */
    CMD_COLL,           /* iters x the collective `op` on the target buffer */
    CMD_COLL_CHECK,     /* one of it on fresh data; check what the target got */
    CMD_DONE,
};

struct ctl_cmd {
    uint32_t kind;
    uint32_t op;        /* CMD_COLL*: which collective (an op_bit) */
    uint64_t bytes, iters, seed;
};

struct ctl_reply {
    int32_t ok;
    char detail[252];
};

static void ctl_post_op(int ctl, uint32_t kind, uint32_t op, size_t bytes, size_t iters,
                        uint64_t seed)
{
    struct ctl_cmd c = {kind, op, bytes, iters, seed};
    write_or_fail(ctl, &c, sizeof c, "control channel");
}

static void ctl_post(int ctl, uint32_t kind, size_t bytes, size_t iters, uint64_t seed)
{
    ctl_post_op(ctl, kind, 0, bytes, iters, seed);
}

/* A control message, looked for without sleeping for up to CTL_SPIN_NS
 * first.  A process that sleeps here is woken by the other's write, and
 * the scheduler likes to wake it on the writer's core: the two then
 * share one core for the first milliseconds of the timed run that
 * follows, each spinning while the other waits to run (an 8-byte round
 * trip of 4-8 us instead of 0.5 in 1-5% of the samples).  MPI's ranks,
 * bound to a core each, meet in a spinning collective between batches. */
#define CTL_SPIN_NS 50000000ull

static void ctl_read(int ctl, void *buf, size_t len, const char *what)
{
    uint64_t until = now_ns() + CTL_SPIN_NS;
    char probe;
    while (now_ns() < until && recv(ctl, &probe, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
           (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        ;
    read_or_fail(ctl, buf, len, what);
}

static void ctl_reply(int ctl, const char *what)
{
    struct ctl_reply r;
    ctl_read(ctl, &r, sizeof r, "control channel (did the target die?)");
    if (!r.ok)
        fail("%s: target reports: %.*s", what, (int)sizeof r.detail, r.detail);
}

static void ctl_call(int ctl, uint32_t kind, size_t bytes, size_t iters,
                     uint64_t seed, const char *what)
{
    ctl_post(ctl, kind, bytes, iters, seed);
    ctl_reply(ctl, what);
}

/* ------------------------------------------------------------------ */
/* memcpy reference                                                    */
/* ------------------------------------------------------------------ */

/* Called through a volatile pointer so the compiler cannot elide or
 * shrink copies whose result it can see is never read. */
static void *(*volatile memcpy_fn)(void *, const void *, size_t) = memcpy;

static double time_copies_us(unsigned char *dst, const unsigned char *src,
                             size_t bytes, size_t k)
{
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < k; i++)
        memcpy_fn(dst, src, bytes);
    return (double)(now_ns() - t0) / 1e3;
}

static void run_memcpy(const struct options *o)
{
    unsigned char *src = buf_alloc(o->max_size), *dst = buf_alloc(o->max_size);
    double us[MEMCPY_MAX_RUNS];

    g_role = "memcpy";
    pattern_fill(src, o->max_size, 1);
    for (size_t si = 0; si < o->nsizes; si++) {
        size_t bytes = o->sizes[si], k = 1, runs;
        double batch_us, best;
        struct stats s;

        /* Batches of k copies long enough that reading the clock costs
         * nothing; growing k also warms caches and the TLB. */
        for (;;) {
            batch_us = time_copies_us(dst, src, bytes, k);
            if (batch_us >= 20.0 || k >= ((size_t)1 << 24))
                break;
            k *= 2;
        }
        runs = clamp_size(o->target_s * 1e6 / batch_us, 5, MEMCPY_MAX_RUNS);
        for (size_t r = 0; r < runs; r++)
            us[r] = time_copies_us(dst, src, bytes, k) / (double)k;
        if (memcmp(dst, src, bytes))
            fail("memcpy produced wrong bytes at size %zu", bytes);
        s = stats_of(us, runs);
        best = us[0];
        print_row("memcpy", "-", "memcpy", bytes, runs * k, s, (double)bytes / (best * 1e3));
    }
    free(src);
    free(dst);
}

/* ------------------------------------------------------------------ */
/* The target: the passive process of a pair                          */
/* ------------------------------------------------------------------ */

struct target {
    int ctl;
    unsigned char *buf;
    size_t cap;
    slime_ep_t *ep; /* slime: data moves through this endpoint */
    int fd;         /* socket reference: data moves through this socket */
    slime_comm_t *comm; /* collectives: the pair as ranks 0 (initiator) and 1 */
    unsigned char *out; /* reduce_scatter's result */
};

static const char *op_name(unsigned op)
{
    for (size_t k = 0; k < N_OPS; k++)
        if (OP_NAMES[k].bit == op)
            return OP_NAMES[k].name;
    return "?";
}

/* One collective op of the pair's communicator as `rank` runs it on buf
 * (bytes: all of it; allgather's and reduce_scatter's blocks are its
 * halves, reduce_scatter's result goes to out), waited for at once, as
 * torch's synchronous ops are. */
static void comm_coll(slime_comm_t *comm, unsigned op, int rank, unsigned char *buf,
                      unsigned char *out, size_t bytes)
{
    slime_req_t *req = NULL;
    size_t half = bytes / 2;
    slime_status_t st;
    slime_comm_next_waited(comm);
    if (op == OP_ALLREDUCE)
        st = slime_allreduce(comm, buf, bytes / sizeof(float), SLIME_DT_FLOAT32, SLIME_RED_SUM, &req);
    else if (op == OP_BROADCAST)
        st = slime_broadcast(comm, buf, bytes, 0, &req);
    else if (op == OP_ALLGATHER)
        st = slime_allgather(comm, buf + (size_t)rank * half, half, buf, &req);
    else
        st = slime_reduce_scatter(comm, buf, out, half / sizeof(float), SLIME_DT_FLOAT32,
                                  SLIME_RED_SUM, &req);
    if (st != SLIME_OK)
        fail("slime %s: %s (%s)", op_name(op), slime_status_name(st), slime_last_error());
    st = slime_req_wait(req, WAIT_MS);
    if (st != SLIME_OK)
        fail("slime %s of %zu bytes: %s (%s)", op_name(op), bytes, slime_status_name(st),
             slime_req_error(req));
    slime_req_free(req);
}

/* Fresh data for one checked collective of bytes at rank (seed: the
 * bytes' pattern), and the offset of the first wrong byte or element
 * after it, or SIZE_MAX when all are right. */
static void coll_fill(unsigned op, int rank, unsigned char *buf, size_t bytes, uint64_t seed)
{
    size_t half = bytes / 2;
    if (op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER)
        float_fill(buf, bytes, rank);
    else if (op == OP_BROADCAST && rank == 0)
        pattern_fill(buf, bytes, seed);
    else if (op == OP_BROADCAST)
        memset(buf, 0, bytes);
    else
        pattern_fill(buf + (size_t)rank * half, half, seed + (uint64_t)rank);
}

static size_t coll_first_wrong(unsigned op, int rank, const unsigned char *buf,
                                const unsigned char *out, size_t bytes, uint64_t seed)
{
    size_t half = bytes / 2, n = half / sizeof(float), bad;
    if (op == OP_ALLREDUCE)
        return (bad = float_check_sum(buf, bytes, 0)) == bytes / sizeof(float) ? SIZE_MAX : bad;
    if (op == OP_REDUCE_SCATTER)
        return (bad = float_check_sum(out, half, (size_t)rank * n)) == n ? SIZE_MAX : bad;
    if (op == OP_BROADCAST)
        return (bad = pattern_check(buf, bytes, seed)) == bytes ? SIZE_MAX : bad;
    for (int r = 0; r < 2; r++)
        if ((bad = pattern_check(buf + (size_t)r * half, half, seed + (uint64_t)r)) != half)
            return (size_t)r * half + bad;
    return SIZE_MAX;
}

static void target_recv(struct target *t, void *dst, size_t bytes)
{
    slime_req_t *req = NULL;
    slime_status_t st;

    if (!t->ep) {
        read_or_fail(t->fd, dst, bytes, "socket receive");
        return;
    }
    st = slime_recv(t->ep, dst, bytes, TAG_PING, &req);
    if (st != SLIME_OK)
        fail("slime_recv: %s (%s)", slime_status_name(st), slime_last_error());
    st = slime_req_wait(req, WAIT_MS);
    if (st != SLIME_OK)
        fail("slime_recv of %zu bytes: %s (%s)", bytes, slime_status_name(st),
             slime_req_error(req));
    if (slime_req_bytes(req) != bytes)
        fail("slime_recv: got %zu bytes, expected %zu", slime_req_bytes(req), bytes);
    slime_req_free(req);
}

static void target_send(struct target *t, const void *src, size_t bytes)
{
    slime_req_t *req = NULL;
    slime_status_t st;

    if (!t->ep) {
        write_or_fail(t->fd, src, bytes, "socket send");
        return;
    }
    st = slime_send(t->ep, src, bytes, TAG_PONG, &req);
    if (st != SLIME_OK)
        fail("slime_send: %s (%s)", slime_status_name(st), slime_last_error());
    st = slime_req_wait(req, WAIT_MS);
    if (st != SLIME_OK)
        fail("slime_send of %zu bytes: %s (%s)", bytes, slime_status_name(st),
             slime_req_error(req));
    slime_req_free(req);
}

static void check_into_reply(const struct target *t, size_t bytes, uint64_t seed,
                             struct ctl_reply *r)
{
    size_t bad = pattern_check(t->buf, bytes, seed);
    if (bad != bytes) {
        r->ok = 0;
        snprintf(r->detail, sizeof r->detail,
                 "wrong byte at offset %zu of a %zu-byte transfer", bad, bytes);
    }
}

static void target_coll_check(struct target *t, unsigned op, size_t bytes, uint64_t seed,
                              struct ctl_reply *r)
{
    coll_fill(op, 1, t->buf, bytes, seed);
    comm_coll(t->comm, op, 1, t->buf, t->out, bytes);
    size_t bad = coll_first_wrong(op, 1, t->buf, t->out, bytes, seed);
    if (bad != SIZE_MAX) {
        r->ok = 0;
        snprintf(r->detail, sizeof r->detail, "wrong result at %s %zu of a %zu-byte %s",
                 op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER ? "element" : "byte", bad, bytes,
                 op_name(op));
    }
}

static void target_serve(struct target *t)
{
    for (;;) {
        struct ctl_cmd c;
        struct ctl_reply r;
        unsigned char one = 0;

        memset(&r, 0, sizeof r);
        r.ok = 1;
        ctl_read(t->ctl, &c, sizeof c, "control channel");
        if (c.bytes > t->cap)
            fail("command for %llu bytes, buffer holds %zu",
                 (unsigned long long)c.bytes, t->cap);
        switch (c.kind) {
        case CMD_PINGPONG:
            for (uint64_t i = 0; i < c.iters; i++) {
                target_recv(t, t->buf, c.bytes);
                target_send(t, t->buf, c.bytes);
            }
            break;
        case CMD_PINGPONG_CHECK:
            memset(t->buf, 0, c.bytes);
            target_recv(t, t->buf, c.bytes);
            check_into_reply(t, c.bytes, c.seed, &r);
            /* echo even wrong bytes, so the initiator is not left waiting */
            target_send(t, t->buf, c.bytes);
            break;
        case CMD_SINK:
            for (uint64_t i = 0; i < c.iters; i++) {
                target_recv(t, t->buf, c.bytes);
                target_send(t, &one, 1);
            }
            break;
        case CMD_SOURCE:
            for (uint64_t i = 0; i < c.iters; i++) {
                target_recv(t, &one, 1);
                target_send(t, t->buf, c.bytes);
            }
            break;
        case CMD_FILL:
            pattern_fill(t->buf, c.bytes, c.seed);
            break;
        case CMD_ZERO:
            memset(t->buf, 0, c.bytes);
            break;
        case CMD_CHECK:
            check_into_reply(t, c.bytes, c.seed, &r);
            break;
        case CMD_COLL:
            for (uint64_t i = 0; i < c.iters; i++)
                comm_coll(t->comm, c.op, 1, t->buf, t->out, c.bytes);
            break;
        case CMD_COLL_CHECK:
            target_coll_check(t, c.op, c.bytes, c.seed, &r);
            break;
        case CMD_DONE:
            write_or_fail(t->ctl, &r, sizeof r, "control channel");
            return;
        default:
            fail("unknown command %u", c.kind);
        }
        write_or_fail(t->ctl, &r, sizeof r, "control channel");
    }
}

/* ------------------------------------------------------------------ */
/* The initiator: the timing process of a pair                         */
/* ------------------------------------------------------------------ */

struct initiator {
    int ctl;
    unsigned char *sbuf; /* send and write source */
    unsigned char *rbuf; /* receive and read destination */
    slime_ctx_t *ctx;
    slime_ep_t *ep;
    slime_mr_t *smr, *rmr;
    slime_mr_desc_t remote;
    int fd;
    slime_comm_t *comm;
};

typedef void (*once_fn)(struct initiator *in, size_t bytes);

struct op_plan {
    unsigned op;
    once_fn once;
    uint32_t peer_cmd; /* what the target must do per iteration, or 0 */
    int round_trip;    /* the iteration moves the bytes both ways */
};

static void req_finish(slime_req_t *req, const char *what, size_t bytes)
{
    slime_status_t st = slime_req_wait(req, WAIT_MS);
    if (st != SLIME_OK)
        fail("%s of %zu bytes: %s (%s)", what, bytes, slime_status_name(st),
             slime_req_error(req));
}

static void post_check(slime_status_t st, const char *what)
{
    if (st != SLIME_OK)
        fail("%s: %s (%s)", what, slime_status_name(st), slime_last_error());
}

static void slime_sendrecv_once(struct initiator *in, size_t bytes)
{
    slime_req_t *rreq = NULL, *sreq = NULL;

    /* a blocking send, then a blocking receive: the pair mpi_bench.c
     * times (MPI_Send, MPI_Recv) and torch's dist.send, dist.recv.  The
     * reply cannot come before the send is done, and the receive's post
     * is left out of the round trip just as MPI_Recv's is */
    post_check(slime_send(in->ep, in->sbuf, bytes, TAG_PING, &sreq), "slime_send");
    req_finish(sreq, "slime_send", bytes);
    post_check(slime_recv(in->ep, in->rbuf, bytes, TAG_PONG, &rreq), "slime_recv");
    req_finish(rreq, "slime_recv", bytes);
    if (slime_req_bytes(rreq) != bytes)
        fail("slime_recv: got %zu bytes, expected %zu", slime_req_bytes(rreq), bytes);
    slime_req_free(sreq);
    slime_req_free(rreq);
}

/* the collectives: buf sbuf, reduce_scatter's result rbuf */
static void slime_allreduce_once(struct initiator *in, size_t bytes)
{
    comm_coll(in->comm, OP_ALLREDUCE, 0, in->sbuf, in->rbuf, bytes);
}

static void slime_broadcast_once(struct initiator *in, size_t bytes)
{
    comm_coll(in->comm, OP_BROADCAST, 0, in->sbuf, in->rbuf, bytes);
}

static void slime_allgather_once(struct initiator *in, size_t bytes)
{
    comm_coll(in->comm, OP_ALLGATHER, 0, in->sbuf, in->rbuf, bytes);
}

static void slime_reduce_scatter_once(struct initiator *in, size_t bytes)
{
    comm_coll(in->comm, OP_REDUCE_SCATTER, 0, in->sbuf, in->rbuf, bytes);
}

static void slime_read_once(struct initiator *in, size_t bytes)
{
    slime_req_t *req = NULL;
    post_check(slime_read(in->ep, in->rmr, 0, &in->remote, 0, bytes, &req), "slime_read");
    req_finish(req, "slime_read", bytes);
    slime_req_free(req);
}

static void slime_write_once(struct initiator *in, size_t bytes)
{
    slime_req_t *req = NULL;
    post_check(slime_write(in->ep, in->smr, 0, &in->remote, 0, bytes, &req), "slime_write");
    req_finish(req, "slime_write", bytes);
    slime_req_free(req);
}

static void sock_sendrecv_once(struct initiator *in, size_t bytes)
{
    write_or_fail(in->fd, in->sbuf, bytes, "socket ping");
    read_or_fail(in->fd, in->rbuf, bytes, "socket pong");
}

static void sock_read_once(struct initiator *in, size_t bytes)
{
    unsigned char one = 1;
    write_or_fail(in->fd, &one, 1, "socket read request");
    read_or_fail(in->fd, in->rbuf, bytes, "socket read data");
}

static void sock_write_once(struct initiator *in, size_t bytes)
{
    unsigned char one;
    write_or_fail(in->fd, in->sbuf, bytes, "socket write data");
    read_or_fail(in->fd, &one, 1, "socket write ack");
}

static struct op_plan plan_for(enum bench_kind bench, unsigned op)
{
    struct op_plan p = {op, NULL, 0, op == OP_SENDRECV};
    if (bench == BENCH_SLIME) {
        p.once = op == OP_SENDRECV  ? slime_sendrecv_once
               : op == OP_READ      ? slime_read_once
               : op == OP_WRITE     ? slime_write_once
               : op == OP_ALLREDUCE ? slime_allreduce_once
               : op == OP_BROADCAST ? slime_broadcast_once
               : op == OP_ALLGATHER ? slime_allgather_once
                                    : slime_reduce_scatter_once;
        p.peer_cmd = op == OP_SENDRECV ? CMD_PINGPONG : op & OPS_COLL ? CMD_COLL : 0;
    } else if (!(op & OPS_COLL)) {
        p.once = op == OP_SENDRECV ? sock_sendrecv_once
               : op == OP_READ     ? sock_read_once
                                   : sock_write_once;
        p.peer_cmd = op == OP_SENDRECV ? CMD_PINGPONG
                   : op == OP_READ     ? CMD_SOURCE
                                       : CMD_SINK;
    }
    return p;
}

/* Times iters iterations, one sample (microseconds) each. */
static void run_batch(struct initiator *in, const struct op_plan *p, size_t bytes,
                      size_t iters, double *us)
{
    if (iters == 0)
        return;
    if (p->peer_cmd)
        ctl_post_op(in->ctl, p->peer_cmd, p->op, bytes, iters, 0);
    for (size_t i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        p->once(in, bytes);
        us[i] = (double)(now_ns() - t0) / 1e3;
    }
    if (p->peer_cmd)
        ctl_reply(in->ctl, "timed batch");
}

static void expect_pattern(const unsigned char *buf, size_t bytes, uint64_t seed,
                           const char *what)
{
    size_t bad = pattern_check(buf, bytes, seed);
    if (bad != bytes)
        fail("%s: wrong byte at offset %zu of a %zu-byte transfer", what, bad, bytes);
}

/* One untimed iteration on fresh state, checked end to end. */
static void verify_once(struct initiator *in, const struct op_plan *p, size_t bytes,
                        uint64_t seed)
{
    double ignored;
    switch (p->op) {
    case OP_SENDRECV:
        memset(in->rbuf, 0, bytes);
        ctl_post(in->ctl, CMD_PINGPONG_CHECK, bytes, 1, seed);
        p->once(in, bytes);
        ctl_reply(in->ctl, "sendrecv: bytes received by the target");
        expect_pattern(in->rbuf, bytes, seed, "sendrecv: bytes echoed back");
        break;
    case OP_READ:
        memset(in->rbuf, 0, bytes);
        run_batch(in, p, bytes, 1, &ignored);
        expect_pattern(in->rbuf, bytes, seed, "read: bytes read");
        break;
    case OP_ALLREDUCE:
    case OP_BROADCAST:
    case OP_ALLGATHER:
    case OP_REDUCE_SCATTER: {
        coll_fill(p->op, 0, in->sbuf, bytes, seed);
        ctl_post_op(in->ctl, CMD_COLL_CHECK, p->op, bytes, 1, seed);
        p->once(in, bytes);
        ctl_reply(in->ctl, "collective: what the target got");
        size_t bad = coll_first_wrong(p->op, 0, in->sbuf, in->rbuf, bytes, seed);
        if (bad != SIZE_MAX)
            fail("%s: wrong result at %zu of a %zu-byte run", op_name(p->op), bad, bytes);
        break;
    }
    default:
        ctl_call(in->ctl, CMD_ZERO, bytes, 0, 0, "write: zeroing the target");
        run_batch(in, p, bytes, 1, &ignored);
        ctl_call(in->ctl, CMD_CHECK, bytes, 0, seed, "write: bytes written");
        break;
    }
}

/* The shortest warm-up of a size.  Two processes that start on one
 * core (the first size of a run) take milliseconds to be parted by the
 * scheduler, each spinning while the other waits for the core: with a
 * 2000-iteration warm-up (1 ms at 8 bytes) 1-3% of the first size's
 * timed round trips took 4 us instead of 0.5. */
#define WARM_MIN_S 0.05

static void measure(struct initiator *in, const struct options *o, const char *bench,
                    const char *transport, const struct op_plan *p, const char *op_name,
                    size_t bytes, double *us)
{
    uint64_t seed = seed_for(p->op, bytes);
    size_t warm, iters;
    double iter_us;
    struct stats s;

    if (p->op == OP_READ)
        ctl_call(in->ctl, CMD_FILL, bytes, 0, seed, "read: filling the target");
    else if (p->op & OPS_COLL)
        memset(in->sbuf, 0, bytes); /* zeros on both sides: sums stay 0, never denormal */
    else
        pattern_fill(in->sbuf, bytes, seed);

    /* Two iterations give a rough cost; a longer warm-up (a tenth of the
     * budget, and at least WARM_MIN_S) settles caches, the progress
     * engine and the scheduler's placement of the two processes, and
     * gives the cost that sizes the timed run. */
    run_batch(in, p, bytes, 2, us);
    iter_us = us[0] < us[1] ? us[0] : us[1];
    double warm_s = 0.1 * o->target_s > WARM_MIN_S ? 0.1 * o->target_s : WARM_MIN_S;
    uint64_t warm_until = now_ns() + (uint64_t)(warm_s * 1e9);
    while (now_ns() < warm_until && (warm = clamp_size(warm_s * 1e6 / iter_us, 0, 2000))) {
        run_batch(in, p, bytes, warm, us);
        iter_us = stats_of(us, warm).p50_us;
    }
    iters = clamp_size(o->target_s * 1e6 / iter_us, o->min_iters, o->max_iters);
    run_batch(in, p, bytes, iters, us);
    if (p->round_trip)
        for (size_t i = 0; i < iters; i++)
            us[i] /= 2;
    s = stats_of(us, iters);
    verify_once(in, p, bytes, seed);
    print_row(bench, transport, op_name, bytes, iters, s, (double)bytes / (s.avg_us * 1e3));
}

static void initiator_run(struct initiator *in, const struct options *o,
                          const char *bench, const char *transport)
{
    double *us = malloc(sizeof(double) * (o->max_iters > 2000 ? o->max_iters : 2000));
    if (!us)
        fail("out of memory");
    for (size_t k = 0; k < N_OPS; k++) {
        struct op_plan p;
        if (!(o->ops & OP_NAMES[k].bit))
            continue;
        p = plan_for(o->bench, OP_NAMES[k].bit);
        if (!p.once)
            continue; /* the socket has no collectives */
        for (size_t si = 0; si < o->nsizes; si++) {
            /* whole float32s; allgather's and reduce_scatter's halves too */
            size_t unit = p.op & (OP_ALLGATHER | OP_REDUCE_SCATTER) ? 2 * sizeof(float)
                        : p.op == OP_ALLREDUCE ? sizeof(float) : 1;
            if (o->sizes[si] % unit) {
                fprintf(stderr, "p2p_bench: %s %zu B: not whole float32s, skipped\n",
                        OP_NAMES[k].name, o->sizes[si]);
                continue;
            }
            fprintf(stderr, "p2p_bench: %s %s %s %zu B\n", bench, transport,
                    OP_NAMES[k].name, o->sizes[si]);
            measure(in, o, bench, transport, &p, OP_NAMES[k].name, o->sizes[si], us);
        }
    }
    free(us);
    ctl_call(in->ctl, CMD_DONE, 0, 0, 0, "finishing");
}

/* ------------------------------------------------------------------ */
/* Pair setup: slime                                                   */
/* ------------------------------------------------------------------ */

/* The pair's communicator (only when a collective is measured: otherwise
 * no worker thread shares the machine with the other ops). */
static slime_comm_t *pair_comm(const struct options *o, slime_ctx_t *ctx, slime_ep_t *ep,
                               int rank)
{
    slime_ep_t *peers[2] = {rank ? ep : NULL, rank ? NULL : ep};
    slime_comm_t *comm = NULL;
    if (o->ops & OPS_COLL)
        post_check(slime_comm_create(ctx, 1, 1, rank, 2, peers, WAIT_MS, &comm),
                   "slime_comm_create");
    return comm;
}

static slime_ctx_t *slime_open(const struct options *o, const unsigned char *token,
                               size_t token_len)
{
    slime_ctx_opts_t opts;
    slime_ctx_t *ctx = NULL;

    slime_ctx_opts_init(&opts);
    opts.transport = o->transport;
    opts.tcp_host = "127.0.0.1"; /* the benchmark stays on loopback */
    opts.token = token;
    opts.token_len = token_len;
    post_check(slime_ctx_create(&opts, &ctx), "slime_ctx_create");
    return ctx;
}

static void expect_transport(slime_ep_t *ep, const char *want)
{
    const char *got = slime_ep_transport(ep);
    if (!got || strcmp(got, want))
        fail("asked for transport %s, the endpoint uses %s", want, got ? got : "(null)");
}

static void slime_target(const struct options *o, int ctl, const unsigned char *token,
                         size_t token_len)
{
    struct target t = {ctl, NULL, o->max_size, NULL, -1, NULL, NULL};
    if (o->ops & OP_REDUCE_SCATTER)
        t.out = buf_alloc(o->max_size / 2 + 1);
    if (o->shared_target)
        post_check(slime_mem_alloc(o->max_size, (void **)&t.buf), "slime_mem_alloc");
    else
        t.buf = buf_alloc(o->max_size);
    slime_ctx_t *ctx = slime_open(o, token, token_len);
    unsigned char addr[SLIME_ADDRESS_MAX];
    uint64_t addr_len64;
    size_t addr_len = sizeof addr;
    slime_mr_t *mr = NULL;
    slime_mr_desc_t desc;

    post_check(slime_ctx_address(ctx, addr, &addr_len), "slime_ctx_address");
    post_check(slime_mr_reg(ctx, t.buf, t.cap, SLIME_ACCESS_ALL, &mr), "slime_mr_reg");
    post_check(slime_mr_desc(mr, &desc), "slime_mr_desc");
    addr_len64 = addr_len;
    write_or_fail(ctl, &addr_len64, sizeof addr_len64, "control channel");
    write_or_fail(ctl, addr, addr_len, "control channel");
    write_or_fail(ctl, &desc, sizeof desc, "control channel");
    post_check(slime_ep_accept(ctx, CONNECT_MS, &t.ep), "slime_ep_accept");
    expect_transport(t.ep, o->transport);
    t.comm = pair_comm(o, ctx, t.ep, 1);

    target_serve(&t);

    if (t.comm)
        slime_comm_destroy(t.comm);

    post_check(slime_mr_dereg(mr), "slime_mr_dereg");
    slime_ctx_destroy(ctx);
    if (o->shared_target)
        post_check(slime_mem_free(t.buf), "slime_mem_free");
    else
        free(t.buf);
    free(t.out);
}

static void slime_initiator(const struct options *o, int ctl, const unsigned char *token,
                            size_t token_len)
{
    struct initiator in;
    unsigned char addr[SLIME_ADDRESS_MAX];
    uint64_t addr_len;

    memset(&in, 0, sizeof in);
    in.ctl = ctl;
    in.fd = -1;
    in.sbuf = buf_alloc(o->max_size);
    in.rbuf = buf_alloc(o->max_size);
    in.ctx = slime_open(o, token, token_len);
    read_or_fail(ctl, &addr_len, sizeof addr_len, "control channel");
    if (addr_len > sizeof addr)
        fail("target address blob of %llu bytes", (unsigned long long)addr_len);
    read_or_fail(ctl, addr, addr_len, "control channel");
    read_or_fail(ctl, &in.remote, sizeof in.remote, "control channel");
    post_check(slime_ep_connect(in.ctx, addr, addr_len, CONNECT_MS, &in.ep),
               "slime_ep_connect");
    expect_transport(in.ep, o->transport);
    post_check(slime_mr_reg(in.ctx, in.sbuf, o->max_size, SLIME_ACCESS_ALL, &in.smr),
               "slime_mr_reg");
    post_check(slime_mr_reg(in.ctx, in.rbuf, o->max_size, SLIME_ACCESS_ALL, &in.rmr),
               "slime_mr_reg");

    in.comm = pair_comm(o, in.ctx, in.ep, 0);

    initiator_run(&in, o, "slime", o->transport);

    if (in.comm)
        slime_comm_destroy(in.comm);

    post_check(slime_mr_dereg(in.smr), "slime_mr_dereg");
    post_check(slime_mr_dereg(in.rmr), "slime_mr_dereg");
    slime_ctx_destroy(in.ctx);
    free(in.sbuf);
    free(in.rbuf);
}

/* ------------------------------------------------------------------ */
/* Pair setup: the plain socket reference                              */
/* ------------------------------------------------------------------ */

static void set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
        fail("TCP_NODELAY: %s", strerror(errno));
}

static void socket_target(const struct options *o, int ctl)
{
    struct target t = {ctl, buf_alloc(o->max_size), o->max_size, NULL, -1, NULL, NULL};
    struct sockaddr_in sa;
    socklen_t sa_len = sizeof sa;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t port;

    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sa_len))
        fail("listening on 127.0.0.1: %s", strerror(errno));
    port = ntohs(sa.sin_port);
    write_or_fail(ctl, &port, sizeof port, "control channel");
    t.fd = accept(lfd, NULL, NULL);
    if (t.fd < 0)
        fail("accept: %s", strerror(errno));
    close(lfd);
    set_nodelay(t.fd);

    target_serve(&t);

    close(t.fd);
    free(t.buf);
}

static void socket_initiator(const struct options *o, int ctl)
{
    struct initiator in;
    struct sockaddr_in sa;
    uint16_t port;

    memset(&in, 0, sizeof in);
    in.ctl = ctl;
    in.sbuf = buf_alloc(o->max_size);
    in.rbuf = buf_alloc(o->max_size);
    read_or_fail(ctl, &port, sizeof port, "control channel");
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    in.fd = socket(AF_INET, SOCK_STREAM, 0);
    if (in.fd < 0 || connect(in.fd, (struct sockaddr *)&sa, sizeof sa))
        fail("connecting to 127.0.0.1:%u: %s", port, strerror(errno));
    set_nodelay(in.fd);

    initiator_run(&in, o, "socket", "socket");

    close(in.fd);
    free(in.sbuf);
    free(in.rbuf);
}

/* ------------------------------------------------------------------ */
/* The pair                                                            */
/* ------------------------------------------------------------------ */

/* The target's exit status, or -1 if it had to be killed. */
static int reap(pid_t pid, int seconds)
{
    struct timespec tick = {0, 10 * 1000 * 1000};
    int status;
    for (int i = 0; i < seconds * 100; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0)
            return -1;
        nanosleep(&tick, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static int run_pair(const struct options *o)
{
    unsigned char token[16];
    int sv[2], rc;
    pid_t pid;

    /* A fresh per-run secret, shared by the two processes through fork. */
    if (getrandom(token, sizeof token, 0) != (ssize_t)sizeof token)
        fail("getrandom: %s", strerror(errno));
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        fail("socketpair: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        fail("fork: %s", strerror(errno));
    if (pid == 0) {
        g_role = "target";
        /* one local rank each: verbs puts them on different devices
         * where $DLSLIME_VERBS_DEVICES lists several */
        setenv("LOCAL_RANK", "1", 1);
        /* never outlive the initiator, even when it is killed */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(1);
        arm_deadline(o->deadline_s);
        close(sv[0]);
        if (o->bench == BENCH_SLIME)
            slime_target(o, sv[1], token, sizeof token);
        else
            socket_target(o, sv[1]);
        close(sv[1]);
        _exit(0);
    }
    g_role = "initiator";
    setenv("LOCAL_RANK", "0", 1);
    close(sv[1]);
    if (o->bench == BENCH_SLIME)
        slime_initiator(o, sv[0], token, sizeof token);
    else
        socket_initiator(o, sv[0]);
    close(sv[0]);
    rc = reap(pid, 10);
    if (rc != 0)
        fail("target exited with status %d", rc);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Command line                                                        */
/* ------------------------------------------------------------------ */

static _Noreturn void usage(const char *why)
{
    fprintf(stderr,
            "p2p_bench: %s\n"
            "usage: p2p_bench slime --transport shm|tcp|verbs [--ops LIST] --sizes LIST [opts]\n"
            "       (--ops: sendrecv,read,write,allreduce,broadcast,allgather,reduce_scatter;\n"
            "       default the first three)\n"
            "       p2p_bench socket [--ops LIST] --sizes LIST [opts]\n"
            "       p2p_bench memcpy --sizes LIST [opts]\n"
            "opts:  --time S  --min-iters N  --max-iters N  --deadline S\n"
            "       --target-memory heap|shared\n",
            why);
    exit(2);
}

static unsigned long long parse_number(const char *s, const char *what)
{
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        usage(what);
    return v;
}

static unsigned parse_ops(const char *list)
{
    unsigned ops = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        size_t k;
        for (k = 0; k < N_OPS; k++)
            if (strlen(OP_NAMES[k].name) == len && !strncmp(p, OP_NAMES[k].name, len))
                break;
        if (k == N_OPS)
            usage("--ops takes sendrecv,read,write,allreduce,broadcast,allgather,reduce_scatter");
        ops |= OP_NAMES[k].bit;
        p += len;
        if (*p == ',')
            p++;
    }
    if (!ops)
        usage("--ops is empty");
    return ops;
}

static void parse_sizes(const char *list, struct options *o)
{
    char buf[1024];
    char *save = NULL, *tok;
    if (strlen(list) >= sizeof buf)
        usage("--sizes is too long");
    strcpy(buf, list);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long v = parse_number(tok, "--sizes takes byte counts");
        if (v == 0 || v > ((unsigned long long)1 << 34))
            usage("a size must be between 1 byte and 16 GiB");
        if (o->nsizes == MAX_SIZES)
            usage("too many sizes");
        o->sizes[o->nsizes++] = (size_t)v;
        if (v > o->max_size)
            o->max_size = (size_t)v;
    }
}

static void parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->ops = OP_SENDRECV | OP_READ | OP_WRITE;
    o->target_s = 0.2;
    o->min_iters = 5;
    o->max_iters = 100000;
    o->deadline_s = 900;
    if (argc < 2)
        usage("which bench?");
    if (!strcmp(argv[1], "slime"))
        o->bench = BENCH_SLIME;
    else if (!strcmp(argv[1], "socket"))
        o->bench = BENCH_SOCKET;
    else if (!strcmp(argv[1], "memcpy"))
        o->bench = BENCH_MEMCPY;
    else
        usage("the bench is slime, socket or memcpy");
    for (int i = 2; i < argc; i += 2) {
        const char *key = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            usage("an option lacks its value");
        if (!strcmp(key, "--transport"))
            o->transport = val;
        else if (!strcmp(key, "--ops"))
            o->ops = parse_ops(val);
        else if (!strcmp(key, "--sizes"))
            parse_sizes(val, o);
        else if (!strcmp(key, "--time")) {
            char *end;
            o->target_s = strtod(val, &end);
            if (*end || !(o->target_s > 0 && o->target_s < 60))
                usage("--time takes seconds in (0, 60)");
        } else if (!strcmp(key, "--min-iters"))
            o->min_iters = (size_t)parse_number(val, "--min-iters takes a count");
        else if (!strcmp(key, "--max-iters"))
            o->max_iters = (size_t)parse_number(val, "--max-iters takes a count");
        else if (!strcmp(key, "--target-memory")) {
            if (strcmp(val, "heap") && strcmp(val, "shared"))
                usage("--target-memory takes heap or shared");
            o->shared_target = !strcmp(val, "shared");
        } else if (!strcmp(key, "--deadline"))
            o->deadline_s = (unsigned)parse_number(val, "--deadline takes seconds");
        else
            usage("unknown option");
    }
    if (!o->nsizes)
        usage("--sizes is required");
    if (o->min_iters < 1 || o->max_iters < o->min_iters || o->max_iters > 10000000)
        usage("need 1 <= --min-iters <= --max-iters <= 10000000");
    if (o->deadline_s < 1)
        usage("--deadline must be at least 1 second");
    if (o->bench == BENCH_SLIME &&
        (!o->transport ||
         (strcmp(o->transport, "shm") && strcmp(o->transport, "tcp") && strcmp(o->transport, "verbs"))))
        usage("slime needs --transport shm, tcp or verbs");
}

int main(int argc, char **argv)
{
    struct options o;

    parse_args(argc, argv, &o);
    arm_deadline(o.deadline_s);
    if (o.bench == BENCH_MEMCPY) {
        run_memcpy(&o);
        return 0;
    }
    return run_pair(&o);
}
