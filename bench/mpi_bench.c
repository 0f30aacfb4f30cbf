/*
 * mpi_bench - MPI's send/recv and collectives, timed exactly as
 * p2p_bench times libdlslime's, so bench/p2p_bench.py can put MPI beside
 * the core.
 *
 *   mpirun -np 2 [MCA options] mpi_bench --transport LABEL [--ops LIST] --sizes LIST
 *           [--time S] [--min-iters N] [--max-iters N] [--deadline S]
 *
 *   --ops        comma list of sendrecv,allreduce,broadcast,allgather,
 *                reduce_scatter (default the first two)
 *   --transport  only a label for the rows: which BTL runs is mpirun's
 *                MCA options (p2p_bench.py passes vader or tcp)
 *
 * stdout (rank 0) carries one CSV line per measured (op, size):
 *   row,mpi,<transport>,<op>,<bytes>,<iters>,<avg_us>,<p50_us>,<p99_us>,<gbps>
 *   sendrecv   one-way time: half of a ping-pong round trip (rank 1 echoes)
 *   allreduce  one MPI_Allreduce (float32 SUM, in place) as rank 0 sees it
 *   broadcast  one MPI_Bcast from rank 0, as rank 0 sees it
 *   allgather  one MPI_Allgather, in place, `bytes` the whole output
 *   reduce_scatter  one MPI_Reduce_scatter_block (float32 SUM), `bytes`
 *              the whole input, each rank's result a half
 * Every (op, size) is followed by one untimed iteration whose values are
 * checked on both ranks, so a wrong result cannot post a number.
 *
 * Built by p2p_bench.py with mpicc (not by CMake: the core never needs MPI).
 */
#include <mpi.h>

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 64
#define TAG 7

enum { OP_SENDRECV = 1, OP_ALLREDUCE = 2, OP_BROADCAST = 4, OP_ALLGATHER = 8, OP_REDUCE_SCATTER = 16 };
static const struct { unsigned op; const char *name; } OPS[] = {
    {OP_SENDRECV, "sendrecv"},   {OP_ALLREDUCE, "allreduce"},
    {OP_BROADCAST, "broadcast"}, {OP_ALLGATHER, "allgather"},
    {OP_REDUCE_SCATTER, "reduce_scatter"}};
#define N_OPS (sizeof OPS / sizeof OPS[0])

struct options {
    const char *transport;
    unsigned ops;
    size_t sizes[MAX_SIZES], nsizes, max_size;
    double target_s;
    size_t min_iters, max_iters;
    unsigned deadline_s;
};

static int g_rank;

static _Noreturn void fail(const char *what)
{
    fprintf(stderr, "mpi_bench[rank %d]: %s\n", g_rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

static void on_deadline(int sig)
{
    static const char msg[] = "mpi_bench: deadline passed, giving up\n";
    (void)sig;
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    _exit(3);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The check values: small integers, exact in float32 when summed. */
static float value(size_t i, int rank)
{
    return (float)(i % 1021) + 4096.0f * (float)rank;
}

/* One op on buf (bytes); reduce_scatter's result goes to out. */
static void one(unsigned op, float *buf, float *out, size_t bytes)
{
    int n = (int)(op == OP_SENDRECV || op == OP_BROADCAST ? bytes : bytes / sizeof(float));
    if (op == OP_ALLREDUCE) {
        MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == OP_BROADCAST) {
        MPI_Bcast(buf, n, MPI_BYTE, 0, MPI_COMM_WORLD);
    } else if (op == OP_ALLGATHER) {
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n / 2, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op == OP_REDUCE_SCATTER) {
        MPI_Reduce_scatter_block(buf, out, n / 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (g_rank == 0) {
        MPI_Send(buf, n, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
        MPI_Recv(buf, n, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(buf, n, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, n, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
    }
}

/* Runs iters iterations (the count is rank 0's, sent to rank 1); rank 0
 * keeps one time (us) each. */
static size_t batch(unsigned op, float *buf, float *out, size_t bytes, size_t iters, double *us)
{
    unsigned long long n = iters;
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) {
        double t0 = now_us();
        one(op, buf, out, bytes);
        us[i] = now_us() - t0;
    }
    return (size_t)n;
}

static size_t clamp(double v, size_t lo, size_t hi)
{
    return !(v > (double)lo) ? lo : v > (double)hi ? hi : (size_t)v;
}

/* Element i of a checked run's result at this rank: rank 0's values
 * (sendrecv, broadcast), each rank's own half (allgather), or sums. */
static float expected(unsigned op, size_t i, size_t n)
{
    if (op == OP_SENDRECV || op == OP_BROADCAST)
        return value(i, 0);
    if (op == OP_ALLGATHER)
        return value(i, i < n / 2 ? 0 : 1);
    if (op == OP_REDUCE_SCATTER)
        i += (size_t)g_rank * n / 2;
    return value(i, 0) + value(i, 1);
}

/* Element i of this rank's fresh data for a checked run: its own values,
 * where a receiver's are -1 (sendrecv, broadcast) and, in allgather,
 * outside its own half. */
static float input(unsigned op, size_t i, size_t n)
{
    bool receives = (op == OP_SENDRECV || op == OP_BROADCAST) && g_rank;
    bool others = op == OP_ALLGATHER && (i < n / 2) != (g_rank == 0);
    return receives || others ? -1.0f : value(i, g_rank);
}

/* One untimed iteration on fresh values, checked on both ranks. */
static void verify(unsigned op, const char *name, float *buf, float *out, size_t bytes)
{
    size_t n = bytes / sizeof(float);
    int ok = 1, all_ok;
    for (size_t i = 0; i < n; i++)
        buf[i] = input(op, i, n);
    one(op, buf, out, bytes);
    const float *got = op == OP_REDUCE_SCATTER ? out : buf;
    size_t m = op == OP_REDUCE_SCATTER ? n / 2 : n;
    for (size_t i = 0; i < m && ok; i++)
        ok = got[i] == expected(op, i, n);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        char text[80];
        snprintf(text, sizeof text, "%s: wrong result", name);
        fail(text);
    }
}

#define WARM_MIN_S 0.05 /* p2p_bench.c's: the shortest warm-up of a size */

static void measure(const struct options *o, unsigned op, const char *name, size_t bytes,
                    float *buf, float *out, double *us)
{
    size_t iters, warm;
    double cost, sum = 0;

    memset(buf, 0, bytes);
    batch(op, buf, out, bytes, 2, us);
    cost = us[0] < us[1] ? us[0] : us[1];
    /* as p2p_bench.c's warm-up: a tenth of the budget, at least
     * WARM_MIN_S, in batches whose count rank 0 gives (0: done) */
    double warm_s = 0.1 * o->target_s > WARM_MIN_S ? 0.1 * o->target_s : WARM_MIN_S;
    double warm_until = now_us() + warm_s * 1e6;
    while ((warm = batch(op, buf, out, bytes, now_us() < warm_until ? clamp(warm_s * 1e6 / cost, 0, 2000) : 0, us))) {
        qsort(us, warm, sizeof *us, cmp_double);
        cost = us[warm / 2];
    }
    iters = batch(op, buf, out, bytes, clamp(o->target_s * 1e6 / cost, o->min_iters, o->max_iters),
                  us);
    verify(op, name, buf, out, bytes);
    if (g_rank)
        return;
    for (size_t i = 0; i < iters; i++)
        sum += us[i] /= op == OP_SENDRECV ? 2 : 1;
    qsort(us, iters, sizeof *us, cmp_double);
    printf("row,mpi,%s,%s,%zu,%zu,%.4f,%.4f,%.4f,%.6g\n", o->transport, name, bytes, iters,
           sum / (double)iters, us[(50 * iters + 99) / 100 - 1],
           us[(99 * iters + 99) / 100 - 1], (double)bytes * (double)iters / (sum * 1e3));
    fflush(stdout);
}

static _Noreturn void usage(const char *why)
{
    if (g_rank == 0)
        fprintf(stderr, "mpi_bench: %s\nusage: mpirun -np 2 mpi_bench --transport LABEL "
                        "[--ops sendrecv,allreduce,broadcast,allgather,reduce_scatter] --sizes LIST [--time S] [--min-iters N] "
                        "[--max-iters N] [--deadline S]\n", why);
    MPI_Finalize();
    exit(2);
}

static void parse_list(const char *list, struct options *o, int sizes)
{
    char buf[1024], *save = NULL;
    if (strlen(list) >= sizeof buf)
        usage("a list is too long");
    strcpy(buf, list);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!sizes) {
            size_t k = 0;
            while (k < N_OPS && strcmp(t, OPS[k].name))
                k++;
            if (k == N_OPS)
                usage("--ops: sendrecv,allreduce,broadcast,allgather,reduce_scatter");
            o->ops |= OPS[k].op;
            continue;
        }
        char *end;
        unsigned long long v = strtoull(t, &end, 10);
        if (*end || v == 0 || v > (1ull << 31) || o->nsizes == MAX_SIZES)
            usage("--sizes takes up to 64 byte counts from 1 to 2 GiB");
        o->sizes[o->nsizes++] = (size_t)v;
        o->max_size = v > o->max_size ? (size_t)v : o->max_size;
    }
}

static void parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->target_s = 0.2;
    o->min_iters = 5;
    o->max_iters = 100000;
    o->deadline_s = 900;
    for (int i = 1; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage("an option lacks its value");
        if (!strcmp(k, "--transport"))
            o->transport = v;
        else if (!strcmp(k, "--ops"))
            parse_list(v, o, 0);
        else if (!strcmp(k, "--sizes"))
            parse_list(v, o, 1);
        else if (!strcmp(k, "--time"))
            o->target_s = atof(v);
        else if (!strcmp(k, "--min-iters"))
            o->min_iters = (size_t)atoll(v);
        else if (!strcmp(k, "--max-iters"))
            o->max_iters = (size_t)atoll(v);
        else if (!strcmp(k, "--deadline"))
            o->deadline_s = (unsigned)atoi(v);
        else
            usage("unknown option");
    }
    o->ops = o->ops ? o->ops : OP_SENDRECV | OP_ALLREDUCE;
    if (!o->transport || !o->nsizes)
        usage("--transport and --sizes are required");
    if (!(o->target_s > 0 && o->target_s < 60) || o->min_iters < 1 ||
        o->max_iters < o->min_iters || o->max_iters > 10000000 || o->deadline_s < 1)
        usage("need 0 < --time < 60, 1 <= --min-iters <= --max-iters <= 10000000, --deadline >= 1");
}

int main(int argc, char **argv)
{
    struct options o;
    int world;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    parse_args(argc, argv, &o);
    if (world != 2)
        usage("runs on exactly 2 ranks (mpirun -np 2)");
    signal(SIGALRM, on_deadline);
    alarm(o.deadline_s);
    /* whole floats for the checks; touched, so no page fault is timed */
    float *buf = calloc((o.max_size + 3) / 4, sizeof(float));
    float *out = calloc((o.max_size + 7) / 8, sizeof(float));
    double *us = malloc(sizeof(double) * (o.max_iters > 2000 ? o.max_iters : 2000));
    if (!buf || !out || !us)
        fail("out of memory");
    for (size_t k = 0; k < N_OPS; k++) {
        if (!(o.ops & OPS[k].op))
            continue;
        for (size_t s = 0; s < o.nsizes; s++) {
            /* whole float32s, whole halves of them: as in p2p_bench */
            size_t unit = OPS[k].op & (OP_ALLGATHER | OP_REDUCE_SCATTER) ? 2 * sizeof(float)
                        : OPS[k].op == OP_ALLREDUCE ? sizeof(float) : 1;
            if (o.sizes[s] % unit)
                continue;
            if (g_rank == 0)
                fprintf(stderr, "mpi_bench: mpi %s %s %zu B\n", o.transport, OPS[k].name,
                        o.sizes[s]);
            measure(&o, OPS[k].op, OPS[k].name, o.sizes[s], buf, out, us);
        }
    }
    free(out);
    free(buf);
    free(us);
    MPI_Finalize();
    return 0;
}
