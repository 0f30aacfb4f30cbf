/* The reduction loops.  Each (dtype, op) pair gets its own loops, made by
 * macros.  The loops walk fixed blocks of RED_BLOCK elements: GCC at -O2
 * vectorises only loops whose trip count it knows, so the fixed inner
 * loop becomes plain SIMD without -O3 or -march flags.
 *
 * Semantics follow torch: integers wrap (computed in unsigned arithmetic,
 * so overflow is defined), MIN/MAX propagate NaN, bool SUM/MAX are
 * logical OR and PROD/MIN logical AND, half types combine in float and
 * round back to nearest even. */
#include "coll/reduce_kernels.h"

#include <stdint.h>

#include "coll/half.h"

#define RED_BLOCK 32

typedef void (*acc_fn)(void *restrict, const void *restrict, size_t);
typedef void (*comb_fn)(void *restrict, const void *restrict, const void *restrict, size_t);

/* The loop of every kernel: OUT[i] = EXPR of a = A[i] and b = B[i], in
 * blocks of RED_BLOCK (see above), then the rest one by one.  OUT may
 * be A or B itself: each element is read before it is written. */
#define RED_LOOP(T, EXPR, OUT, A, B)                                                       \
    size_t i = 0;                                                                          \
    for (; i + RED_BLOCK <= n; i += RED_BLOCK)                                             \
        for (size_t j = 0; j < RED_BLOCK; j++) {                                           \
            T a = A[i + j], b = B[i + j];                                                  \
            OUT[i + j] = (T)(EXPR);                                                        \
        }                                                                                  \
    for (; i < n; i++) {                                                                   \
        T a = A[i], b = B[i];                                                              \
        OUT[i] = (T)(EXPR);                                                                \
    }

/* The loops of one (dtype, op): accumulate, accumulate with the operands
 * swapped, and combine, for element type T and the expression EXPR of a
 * and b (both T). */
#define KERNEL(name, T, EXPR)                                                              \
    static void acc_##name(void *restrict accv, const void *restrict inv, size_t n) {      \
        T *restrict acc = accv;                                                            \
        const T *restrict in = inv;                                                        \
        RED_LOOP(T, EXPR, acc, acc, in)                                                    \
    }                                                                                      \
    static void swp_##name(void *restrict accv, const void *restrict inv, size_t n) {      \
        T *restrict acc = accv;                                                            \
        const T *restrict in = inv;                                                        \
        RED_LOOP(T, EXPR, acc, in, acc)                                                    \
    }                                                                                      \
    static void comb_##name(void *restrict outv, const void *restrict av,                 \
                            const void *restrict bv, size_t n) {                           \
        T *restrict out = outv;                                                            \
        const T *restrict pa = av, *restrict pb = bv;                                      \
        RED_LOOP(T, EXPR, out, pa, pb)                                                     \
    }

/* Integers: T the type, U its unsigned twin, W the unsigned type the
 * arithmetic happens in (never promoted to signed int). */
#define INT_KERNELS(tn, T, U, W)                                                           \
    KERNEL(tn##_sum, T, (U)((W)(U)a + (W)(U)b))                                            \
    KERNEL(tn##_prod, T, (U)((W)(U)a * (W)(U)b))                                           \
    KERNEL(tn##_min, T, a < b ? a : b)                                                     \
    KERNEL(tn##_max, T, a > b ? a : b)                                                     \
    KERNEL(tn##_band, T, (U)((U)a & (U)b))                                                 \
    KERNEL(tn##_bor, T, (U)((U)a | (U)b))                                                  \
    KERNEL(tn##_bxor, T, (U)((U)a ^ (U)b))

INT_KERNELS(i8, int8_t, uint8_t, uint32_t)
INT_KERNELS(u8, uint8_t, uint8_t, uint32_t)
INT_KERNELS(i16, int16_t, uint16_t, uint32_t)
INT_KERNELS(i32, int32_t, uint32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t, uint64_t)

/* bool bytes may hold any non-zero value for true; results are 0 or 1 */
KERNEL(b_or, uint8_t, (a | b) != 0)
KERNEL(b_and, uint8_t, (a != 0) & (b != 0))
KERNEL(b_xor, uint8_t, (a != 0) ^ (b != 0))

/* NaN wins MIN and MAX, as in torch.minimum / torch.maximum */
#define FMIN(a, b) ((a) < (b) || (a) != (a) ? (a) : (b))
#define FMAX(a, b) ((a) > (b) || (a) != (a) ? (a) : (b))

#define FLOAT_KERNELS(tn, T)                                                               \
    KERNEL(tn##_sum, T, a + b)                                                             \
    KERNEL(tn##_prod, T, a * b)                                                            \
    KERNEL(tn##_min, T, FMIN(a, b))                                                        \
    KERNEL(tn##_max, T, FMAX(a, b))

FLOAT_KERNELS(f32, float)
FLOAT_KERNELS(f64, double)

/* half types: raw uint16_t, combined in float */
#define HALF_KERNELS(tn, TO_F, FROM_F)                                                     \
    KERNEL(tn##_sum, uint16_t, FROM_F(TO_F(a) + TO_F(b)))                                  \
    KERNEL(tn##_prod, uint16_t, FROM_F(TO_F(a) * TO_F(b)))                                 \
    KERNEL(tn##_min, uint16_t, FROM_F(FMIN(TO_F(a), TO_F(b))))                             \
    KERNEL(tn##_max, uint16_t, FROM_F(FMAX(TO_F(a), TO_F(b))))

HALF_KERNELS(f16, f16_to_f32, f32_to_f16)
HALF_KERNELS(bf16, bf16_to_f32, f32_to_bf16)

typedef struct kernel_loops {
    acc_fn acc, swapped;
    comb_fn comb;
} kernel_loops_t;

#define LOOPS(name) {acc_##name, swp_##name, comb_##name}
#define NO_LOOPS {0, 0, 0}

/* [dtype][op]; AVG uses SUM's loops, the rest are refused earlier by
 * slime_redop_check */
static const kernel_loops_t kernels[10][8] = {
#define INT_ROW(tn)                                                                        \
    {LOOPS(tn##_sum), LOOPS(tn##_prod), LOOPS(tn##_min), LOOPS(tn##_max), NO_LOOPS,             \
     LOOPS(tn##_band), LOOPS(tn##_bor), LOOPS(tn##_bxor)}
#define FLOAT_ROW(tn)                                                                      \
    {LOOPS(tn##_sum), LOOPS(tn##_prod), LOOPS(tn##_min), LOOPS(tn##_max), LOOPS(tn##_sum),      \
     NO_LOOPS, NO_LOOPS, NO_LOOPS}
    [SLIME_DT_INT8] = INT_ROW(i8),
    [SLIME_DT_UINT8] = INT_ROW(u8),
    [SLIME_DT_INT16] = INT_ROW(i16),
    [SLIME_DT_INT32] = INT_ROW(i32),
    [SLIME_DT_INT64] = INT_ROW(i64),
    [SLIME_DT_FLOAT16] = FLOAT_ROW(f16),
    [SLIME_DT_BFLOAT16] = FLOAT_ROW(bf16),
    [SLIME_DT_FLOAT32] = FLOAT_ROW(f32),
    [SLIME_DT_FLOAT64] = FLOAT_ROW(f64),
    [SLIME_DT_BOOL] = {LOOPS(b_or), LOOPS(b_and), LOOPS(b_and), LOOPS(b_or), NO_LOOPS, LOOPS(b_and),
                       LOOPS(b_or), LOOPS(b_xor)},
};

void red_accumulate(slime_dtype_t dt, slime_redop_t op, void *acc, const void *in, size_t n) {
    if (n) kernels[dt][op].acc(acc, in, n);
}

void red_accumulate_swapped(slime_dtype_t dt, slime_redop_t op, void *acc, const void *in, size_t n) {
    if (n) kernels[dt][op].swapped(acc, in, n);
}

void (*red_accumulator(slime_dtype_t dt, slime_redop_t op))(void *acc, const void *in, size_t n) {
    return kernels[dt][op].acc;
}

void red_combine(slime_dtype_t dt, slime_redop_t op, void *out, const void *a, const void *b,
                 size_t n) {
    if (n) kernels[dt][op].comb(out, a, b, n);
}

void red_divide(slime_dtype_t dt, void *buf, size_t n, int divisor) {
    switch (dt) {
    case SLIME_DT_FLOAT32: {
        float *p = buf, d = (float)divisor;
        for (size_t i = 0; i < n; i++) p[i] /= d;
        return;
    }
    case SLIME_DT_FLOAT64: {
        double *p = buf, d = (double)divisor;
        for (size_t i = 0; i < n; i++) p[i] /= d;
        return;
    }
    case SLIME_DT_FLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / (float)divisor);
        return;
    }
    case SLIME_DT_BFLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)divisor);
        return;
    }
    default: return;
    }
}
