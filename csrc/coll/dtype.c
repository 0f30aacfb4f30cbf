/* Element types and reduction operations: sizes, names, and which
 * operation applies to which type (torch's rules). */
#include <stdio.h>

#include "coll/coll.h"

size_t slime_dtype_size(slime_dtype_t dtype) {
    switch (dtype) {
    case SLIME_DT_INT8:
    case SLIME_DT_UINT8:
    case SLIME_DT_BOOL: return 1;
    case SLIME_DT_INT16:
    case SLIME_DT_FLOAT16:
    case SLIME_DT_BFLOAT16: return 2;
    case SLIME_DT_INT32:
    case SLIME_DT_FLOAT32: return 4;
    case SLIME_DT_INT64:
    case SLIME_DT_FLOAT64: return 8;
    }
    return 0;
}

const char *dtype_name(slime_dtype_t dt) {
    switch (dt) {
    case SLIME_DT_INT8: return "int8";
    case SLIME_DT_UINT8: return "uint8";
    case SLIME_DT_INT16: return "int16";
    case SLIME_DT_INT32: return "int32";
    case SLIME_DT_INT64: return "int64";
    case SLIME_DT_FLOAT16: return "float16";
    case SLIME_DT_BFLOAT16: return "bfloat16";
    case SLIME_DT_FLOAT32: return "float32";
    case SLIME_DT_FLOAT64: return "float64";
    case SLIME_DT_BOOL: return "bool";
    }
    return "unknown dtype";
}

const char *redop_name(slime_redop_t op) {
    switch (op) {
    case SLIME_RED_SUM: return "sum";
    case SLIME_RED_PROD: return "prod";
    case SLIME_RED_MIN: return "min";
    case SLIME_RED_MAX: return "max";
    case SLIME_RED_AVG: return "avg";
    case SLIME_RED_BAND: return "band";
    case SLIME_RED_BOR: return "bor";
    case SLIME_RED_BXOR: return "bxor";
    }
    return "unknown op";
}

static bool is_float(slime_dtype_t dt) {
    return dt == SLIME_DT_FLOAT16 || dt == SLIME_DT_BFLOAT16 || dt == SLIME_DT_FLOAT32 ||
           dt == SLIME_DT_FLOAT64;
}

slime_status_t slime_redop_check(slime_redop_t op, slime_dtype_t dtype) {
    if (slime_dtype_size(dtype) == 0)
        return slime_errorf(SLIME_ERR_INVAL, "unknown dtype %d", (int)dtype);
    switch (op) {
    case SLIME_RED_SUM:
    case SLIME_RED_PROD:
    case SLIME_RED_MIN:
    case SLIME_RED_MAX: return SLIME_OK;
    case SLIME_RED_AVG:
        if (is_float(dtype)) return SLIME_OK;
        return slime_errorf(SLIME_ERR_UNSUPPORTED,
                            "reduction avg does not apply to %s (floating types only)",
                            dtype_name(dtype));
    case SLIME_RED_BAND:
    case SLIME_RED_BOR:
    case SLIME_RED_BXOR:
        if (!is_float(dtype)) return SLIME_OK;
        return slime_errorf(SLIME_ERR_UNSUPPORTED,
                            "reduction %s does not apply to %s (integer and bool types only)",
                            redop_name(op), dtype_name(dtype));
    }
    return slime_errorf(SLIME_ERR_INVAL, "unknown reduction op %d", (int)op);
}

slime_status_t coll_check_reduce(const char *name, slime_dtype_t dt, slime_redop_t op) {
    slime_status_t st = slime_redop_check(op, dt);
    if (st == SLIME_OK) return SLIME_OK;
    char why[400];
    snprintf(why, sizeof why, "%s", slime_last_error());
    return slime_errorf(st, "%s: %s", name, why);
}
