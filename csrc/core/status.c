/* Status codes, their texts, and the per-thread detail of the last error. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static _Thread_local char last_error[512];

const char *slime_strerror(slime_status_t s) {
    switch (s) {
    case SLIME_OK: return "success";
    case SLIME_INPROGRESS: return "operation in progress";
    case SLIME_ERR_INVAL: return "invalid argument";
    case SLIME_ERR_NOMEM: return "out of memory";
    case SLIME_ERR_TIMEOUT: return "timed out";
    case SLIME_ERR_PEER_LOST: return "peer lost";
    case SLIME_ERR_REFUSED: return "connection refused by peer";
    case SLIME_ERR_ACCESS: return "memory access denied";
    case SLIME_ERR_TRUNCATED: return "message truncated";
    case SLIME_ERR_CANCELED: return "canceled";
    case SLIME_ERR_UNSUPPORTED: return "not supported";
    case SLIME_ERR_PROTOCOL: return "protocol error";
    case SLIME_ERR_SYSTEM: return "system error";
    case SLIME_ERR_CLOSED: return "closed";
    case SLIME_ERR_BUSY: return "busy";
    }
    return "unknown status";
}

const char *slime_status_name(slime_status_t s) {
    switch (s) {
    case SLIME_OK: return "SLIME_OK";
    case SLIME_INPROGRESS: return "SLIME_INPROGRESS";
    case SLIME_ERR_INVAL: return "SLIME_ERR_INVAL";
    case SLIME_ERR_NOMEM: return "SLIME_ERR_NOMEM";
    case SLIME_ERR_TIMEOUT: return "SLIME_ERR_TIMEOUT";
    case SLIME_ERR_PEER_LOST: return "SLIME_ERR_PEER_LOST";
    case SLIME_ERR_REFUSED: return "SLIME_ERR_REFUSED";
    case SLIME_ERR_ACCESS: return "SLIME_ERR_ACCESS";
    case SLIME_ERR_TRUNCATED: return "SLIME_ERR_TRUNCATED";
    case SLIME_ERR_CANCELED: return "SLIME_ERR_CANCELED";
    case SLIME_ERR_UNSUPPORTED: return "SLIME_ERR_UNSUPPORTED";
    case SLIME_ERR_PROTOCOL: return "SLIME_ERR_PROTOCOL";
    case SLIME_ERR_SYSTEM: return "SLIME_ERR_SYSTEM";
    case SLIME_ERR_CLOSED: return "SLIME_ERR_CLOSED";
    case SLIME_ERR_BUSY: return "SLIME_ERR_BUSY";
    }
    return "SLIME_UNKNOWN";
}

const char *slime_last_error(void) { return last_error; }

slime_status_t slime_verrorf(slime_status_t st, const char *fmt, va_list ap) {
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return st;
}

slime_status_t slime_errorf(slime_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    slime_verrorf(st, fmt, ap);
    va_end(ap);
    return st;
}

bool env_off(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '0';
}

size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': n <<= 10; break;
    case 'm': case 'M': n <<= 20; break;
    case 'g': case 'G': n <<= 30; break;
    default: break;
    }
    return n ? (size_t)n : dflt;
}
