/*
 * test_coll_util.h - what the collective tests share: a communicator over
 * the harness's endpoints, deterministic inputs per (rank, element), and
 * a reference reduction each rank computes on its own.
 *
 * The reference is written independently of the library: integers are
 * reduced in 64-bit unsigned arithmetic and truncated, floats in double,
 * and half types are decoded and rounded with frexp/ldexp arithmetic
 * rather than bit tricks.
 */
#ifndef DLSLIME_TEST_COLL_UTIL_H
#define DLSLIME_TEST_COLL_UTIL_H

#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T_COMM_ID 7u

/* Every rank runs the same sequence of t_comm calls, so a counter gives
 * each new communicator the same epoch on every rank, and one that
 * differs from the last communicator's with the same id (the contract). */
static inline slime_comm_t *t_comm(h_rank_t *r, uint32_t id, int64_t timeout_ms)
{
    static uint32_t epoch;
    epoch = (epoch + 1) & 0xff;
    slime_comm_t *comm = NULL;
    H_CHECK_OK(slime_comm_create(r->ctx, id, epoch, r->rank, r->nranks, r->ep, timeout_ms, &comm));
    H_CHECK_EQ(slime_comm_rank(comm), r->rank);
    H_CHECK_EQ(slime_comm_size(comm), r->nranks);
    return comm;
}

/* Waits for a collective's request, which must succeed, and frees it. */
#define T_RUN(post_expr)                                                   \
    do {                                                                   \
        slime_req_t *q_ = NULL;                                            \
        H_CHECK_OK(post_expr);                                             \
        H_CHECK(q_ != NULL);                                               \
        H_WAIT_FREE(q_, SLIME_OK);                                         \
    } while (0)

static const slime_dtype_t t_dtypes[] = {
    SLIME_DT_INT8,    SLIME_DT_UINT8,   SLIME_DT_INT16,   SLIME_DT_INT32, SLIME_DT_INT64,
    SLIME_DT_FLOAT16, SLIME_DT_BFLOAT16, SLIME_DT_FLOAT32, SLIME_DT_FLOAT64, SLIME_DT_BOOL,
};
#define T_NDTYPES (sizeof t_dtypes / sizeof t_dtypes[0])
static const slime_redop_t t_ops[] = {
    SLIME_RED_SUM, SLIME_RED_PROD, SLIME_RED_MIN, SLIME_RED_MAX,
    SLIME_RED_AVG, SLIME_RED_BAND, SLIME_RED_BOR, SLIME_RED_BXOR,
};
#define T_NOPS (sizeof t_ops / sizeof t_ops[0])

static inline const char *t_dtype_name(slime_dtype_t dt)
{
    static const char *names[] = {"int8",    "uint8",    "int16",   "int32",   "int64",
                                  "float16", "bfloat16", "float32", "float64", "bool"};
    return (unsigned)dt < 10 ? names[dt] : "?";
}

static inline const char *t_op_name(slime_redop_t op)
{
    static const char *names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
    return (unsigned)op < 8 ? names[op] : "?";
}

static inline bool t_is_float(slime_dtype_t dt)
{
    return dt == SLIME_DT_FLOAT16 || dt == SLIME_DT_BFLOAT16 || dt == SLIME_DT_FLOAT32 ||
           dt == SLIME_DT_FLOAT64;
}

static inline bool t_is_signed(slime_dtype_t dt)
{
    return dt == SLIME_DT_INT8 || dt == SLIME_DT_INT16 || dt == SLIME_DT_INT32 ||
           dt == SLIME_DT_INT64;
}

/* Whether torch (and the library) defines op on dt. */
static inline bool t_applies(slime_redop_t op, slime_dtype_t dt)
{
    if (op == SLIME_RED_AVG)
        return t_is_float(dt);
    if (op == SLIME_RED_BAND || op == SLIME_RED_BOR || op == SLIME_RED_BXOR)
        return !t_is_float(dt);
    return true;
}

static inline uint64_t t_mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return x;
}

/* ---- half types, reference side ---------------------------------- */

/* Value of a float16 / bfloat16 bit pattern, by its definition. */
static inline double t_half_value_slow(slime_dtype_t dt, uint16_t h)
{
    const int mbits = dt == SLIME_DT_FLOAT16 ? 10 : 7;
    const int ebits = dt == SLIME_DT_FLOAT16 ? 5 : 8;
    const int bias = (1 << (ebits - 1)) - 1;
    int sign = h >> 15;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(m + (1 << mbits)), e - bias - mbits);
    return sign ? -v : v;
}

/* The same from a table of all 65536 patterns, built once. */
static inline double t_half_value(slime_dtype_t dt, uint16_t h)
{
    static double *tables[2];
    int which = dt == SLIME_DT_FLOAT16 ? 0 : 1;
    if (!tables[which]) {
        double *t = malloc(65536 * sizeof *t);
        if (!t)
            h_fail(__FILE__, __LINE__, "out of memory");
        for (uint32_t i = 0; i < 65536; i++)
            t[i] = t_half_value_slow(dt, (uint16_t)i);
        tables[which] = t; /* kept for the process's life */
    }
    return tables[which][h];
}

/* m rounded to the nearest integer, ties to even: adding 2^52 leaves no
 * fraction bits, and the default rounding mode is to nearest even (no
 * libm needed). */
static inline double t_rint(double m)
{
    const double big = 0x1p52;
    if (fabs(m) >= big)
        return m;
    return m >= 0 ? (m + big) - big : -((-m + big) - big);
}

/* x rounded to the nearest float16 / bfloat16 value (ties to even). */
static inline double t_half_round(slime_dtype_t dt, double x)
{
    const int mbits = dt == SLIME_DT_FLOAT16 ? 10 : 7;
    const int emin = dt == SLIME_DT_FLOAT16 ? -14 : -126;
    const double max = dt == SLIME_DT_FLOAT16 ? 65504.0 : ldexp(255.0, 120);
    if (x != x || x == 0.0)
        return x;
    int e;
    frexp(fabs(x), &e);
    e -= 1; /* |x| in [2^e, 2^(e+1)) */
    if (e < emin)
        e = emin;
    double q = ldexp(1.0, e - mbits);
    double y = t_rint(x / q) * q;
    if (fabs(y) > max)
        return x > 0 ? INFINITY : -INFINITY;
    return y;
}

/* Encodes a value that is exactly representable. */
static inline uint16_t t_half_bits(slime_dtype_t dt, double v)
{
    /* search the positive patterns in order: they sort like their values */
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    uint16_t lo = 0, hi = dt == SLIME_DT_FLOAT16 ? 0x7c00 : 0x7f80;
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (t_half_value(dt, mid) < a)
            lo = (uint16_t)(mid + 1);
        else
            hi = mid;
    }
    if (t_half_value(dt, lo) != a)
        h_fail(__FILE__, __LINE__, "%g is not a %s value", v, t_dtype_name(dt));
    return (uint16_t)(sign | lo);
}

/* ---- elements ------------------------------------------------------ */

/* The raw bits of element i (zero-extended). */
static inline uint64_t t_get_bits(slime_dtype_t dt, const void *buf, size_t i)
{
    size_t es = slime_dtype_size(dt);
    uint64_t v = 0;
    memcpy(&v, (const uint8_t *)buf + i * es, es); /* little endian */
    return v;
}

static inline void t_set_bits(slime_dtype_t dt, void *buf, size_t i, uint64_t v)
{
    size_t es = slime_dtype_size(dt);
    memcpy((uint8_t *)buf + i * es, &v, es);
}

/* Element i as a double (floating types). */
static inline double t_get_float(slime_dtype_t dt, const void *buf, size_t i)
{
    uint64_t b = t_get_bits(dt, buf, i);
    if (dt == SLIME_DT_FLOAT32) {
        float f;
        uint32_t u = (uint32_t)b;
        memcpy(&f, &u, 4);
        return f;
    }
    if (dt == SLIME_DT_FLOAT64) {
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    return t_half_value(dt, (uint16_t)b);
}

/* Stores v, which must be representable in dt. */
static inline void t_set_float(slime_dtype_t dt, void *buf, size_t i, double v)
{
    if (dt == SLIME_DT_FLOAT32) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        t_set_bits(dt, buf, i, u);
    } else if (dt == SLIME_DT_FLOAT64) {
        uint64_t u;
        memcpy(&u, &v, 8);
        t_set_bits(dt, buf, i, u);
    } else {
        t_set_bits(dt, buf, i, t_half_bits(dt, v));
    }
}

/* Rank's input element i for a reduction with op, as bits of dt:
 * integers take any bit pattern (so sums and products wrap), floats
 * small integers (so every order of summation is exact), bools 0 or 1. */
static inline uint64_t t_input(slime_dtype_t dt, slime_redop_t op, int rank, size_t i)
{
    uint64_t h = t_mix((uint64_t)rank * 0x100000001b3ull + i * 0x3bull + (uint64_t)dt * 977 + 1);
    size_t es = slime_dtype_size(dt);
    if (dt == SLIME_DT_BOOL)
        return h & 1;
    if (!t_is_float(dt))
        return es == 8 ? h : h & ((1ull << (8 * es)) - 1);
    /* the bits of the integers -8..8 in each float type, encoded once */
    static uint64_t small[10][17];
    static bool have[10];
    if (!have[dt]) {
        for (int v = -8; v <= 8; v++) {
            uint8_t tmp[8];
            t_set_float(dt, tmp, 0, (double)v);
            small[dt][v + 8] = t_get_bits(dt, tmp, 0);
        }
        have[dt] = true;
    }
    int v = op == SLIME_RED_PROD ? (int)(h % 5) - 2 : (int)(h % 17) - 8;
    return small[dt][v + 8];
}

static inline void t_fill_input(slime_dtype_t dt, slime_redop_t op, int rank, void *buf, size_t count)
{
    for (size_t i = 0; i < count; i++)
        t_set_bits(dt, buf, i, t_input(dt, op, rank, i));
}

static inline int64_t t_sext(uint64_t v, size_t es)
{
    if (es == 8)
        return (int64_t)v;
    unsigned bits = (unsigned)es * 8;
    uint64_t m = 1ull << (bits - 1);
    v &= (1ull << bits) - 1;
    return (int64_t)((v ^ m) - m);
}

/* The reduction over ranks [0, n) of element i, as bits of dt. */
static inline uint64_t t_reference(slime_dtype_t dt, slime_redop_t op, int n, size_t i)
{
    const size_t es = slime_dtype_size(dt);
    if (dt == SLIME_DT_BOOL) {
        bool acc = false;
        for (int r = 0; r < n; r++) {
            bool v = t_input(dt, op, r, i) != 0;
            if (r == 0)
                acc = v;
            else if (op == SLIME_RED_SUM || op == SLIME_RED_MAX || op == SLIME_RED_BOR)
                acc = acc || v;
            else if (op == SLIME_RED_BXOR)
                acc = acc != v;
            else
                acc = acc && v;
        }
        return acc;
    }
    if (!t_is_float(dt)) {
        uint64_t acc = 0;
        for (int r = 0; r < n; r++) {
            uint64_t v = t_input(dt, op, r, i);
            if (r == 0) {
                acc = v;
                continue;
            }
            switch (op) {
            case SLIME_RED_SUM: acc += v; break;
            case SLIME_RED_PROD: acc *= v; break;
            case SLIME_RED_BAND: acc &= v; break;
            case SLIME_RED_BOR: acc |= v; break;
            case SLIME_RED_BXOR: acc ^= v; break;
            case SLIME_RED_MIN:
            case SLIME_RED_MAX: {
                bool less = t_is_signed(dt) ? t_sext(v, es) < t_sext(acc, es)
                                            : (v & ((es == 8) ? ~0ull : (1ull << (8 * es)) - 1)) <
                                                  (acc & ((es == 8) ? ~0ull : (1ull << (8 * es)) - 1));
                if (less == (op == SLIME_RED_MIN))
                    acc = v;
                break;
            }
            default: h_fail(__FILE__, __LINE__, "no reference for %s", t_op_name(op));
            }
        }
        return es == 8 ? acc : acc & ((1ull << (8 * es)) - 1);
    }
    double acc = 0;
    for (int r = 0; r < n; r++) {
        uint64_t bits = t_input(dt, op, r, i);
        double v = t_get_float(dt, &bits, 0);
        if (r == 0)
            acc = v;
        else if (op == SLIME_RED_SUM || op == SLIME_RED_AVG)
            acc += v;
        else if (op == SLIME_RED_PROD)
            acc *= v;
        else if (op == SLIME_RED_MIN)
            acc = v < acc ? v : acc;
        else
            acc = v > acc ? v : acc;
    }
    if (op == SLIME_RED_AVG) {
        /* the sum is exact; one division in the type's own precision (in
         * float for the half types, then rounded to them) */
        if (dt == SLIME_DT_FLOAT64)
            acc = acc / n;
        else
            acc = (double)((float)acc / (float)n);
    }
    if (dt == SLIME_DT_FLOAT16 || dt == SLIME_DT_BFLOAT16)
        acc = t_half_round(dt, acc);
    uint8_t out[8];
    t_set_float(dt, out, 0, acc);
    return t_get_bits(dt, out, 0);
}

/* Every element of buf (count of dt) must be the reference over n ranks;
 * element i of buf is reference element first + i. */
static inline void t_check_reduced(const char *what, slime_dtype_t dt, slime_redop_t op, int n,
                                   const void *buf, size_t first, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t want = t_reference(dt, op, n, first + i);
        uint64_t got = t_get_bits(dt, buf, i);
        if (got != want)
            h_fail(__FILE__, __LINE__,
                   "%s %s %s over %d ranks: element %zu is %#llx, want %#llx", what,
                   t_dtype_name(dt), t_op_name(op), n, first + i, (unsigned long long)got,
                   (unsigned long long)want);
    }
}

/* One allreduce of count elements from this rank's reference input,
 * checked against the reference, and the byte past the buffer untouched. */
static inline void t_allreduce_checked(slime_comm_t *comm, int n, int rank, slime_dtype_t dt, slime_redop_t op,
                                       size_t count)
{
    size_t es = slime_dtype_size(dt);
    uint8_t *buf = h_alloc(count * es + 1);
    t_fill_input(dt, op, rank, buf, count);
    buf[count * es] = 0xa5;
    T_RUN(slime_allreduce(comm, count ? buf : NULL, count, dt, op, &q_));
    t_check_reduced("allreduce", dt, op, n, buf, 0, count);
    H_CHECK_EQ(buf[count * es], 0xa5);
    free(buf);
}

/* The byte pattern of rank's part in the checked call what. */
static inline uint64_t t_seed(int rank, int what)
{
    return 5000 + (uint64_t)rank * 64 + (uint64_t)what;
}

/* An allgather of len bytes per rank, out of place or in place, every
 * byte checked and the byte past the output untouched. */
static inline void t_allgather_checked(slime_comm_t *comm, int n, int rank, size_t len, bool in_place, int what)
{
    uint8_t *src = h_alloc(len), *dst = h_alloc((size_t)n * len + 1);
    memset(dst, 0xee, (size_t)n * len + 1);
    uint8_t *from = in_place ? dst + (size_t)rank * len : src;
    h_fill(from, len, t_seed(rank, what), len);
    T_RUN(slime_allgather(comm, from, len, dst, &q_));
    for (int k = 0; k < n; k++)
        H_CHECK_PATTERN(dst + (size_t)k * len, len, t_seed(k, what), len);
    H_CHECK_BYTES(dst + (size_t)n * len, 1, 0xee);
    free(src);
    free(dst);
}

/* A reduce_scatter of count elements per rank, checked against the
 * reference; in place, dst is this rank's own block of src. */
static inline void t_reduce_scatter_checked(slime_comm_t *comm, int n, int rank, slime_dtype_t dt, slime_redop_t op,
                                            size_t count, bool in_place)
{
    size_t es = slime_dtype_size(dt);
    uint8_t *src = h_alloc((size_t)n * count * es + 1), *dst = h_alloc(count * es + 1);
    t_fill_input(dt, op, rank, src, (size_t)n * count);
    memset(dst, 0xee, count * es + 1);
    uint8_t *out = in_place ? src + (size_t)rank * count * es : dst;
    T_RUN(slime_reduce_scatter(comm, src, out, count, dt, op, &q_));
    t_check_reduced("reduce_scatter", dt, op, n, out, (size_t)rank * count, count);
    if (!in_place)
        H_CHECK_BYTES(dst + count * es, 1, 0xee);
    free(src);
    free(dst);
}

#endif /* DLSLIME_TEST_COLL_UTIL_H */
