/*
 * harness_check.c - status checks, memory helpers, byte patterns and time.
 */
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char g_detail[512];

void h_check_status_(const char *file, int line, const char *what,
                     slime_status_t got, slime_status_t want)
{
    if (got != want)
        h_fail(file, line, "%s -> %s, want %s (last error: \"%s\")", what,
               slime_status_name(got), slime_status_name(want),
               slime_last_error());
}

void h_wait_(const char *file, int line, const char *what, slime_req_t *req,
             slime_status_t want)
{
    if (req == NULL)
        h_fail(file, line, "wait on %s: request is NULL", what);
    slime_status_t got = slime_req_wait(req, H_WAIT_MS);
    if (got != want)
        h_fail(file, line,
               "wait(%s) -> %s, want %s (request error: \"%s\", last error: "
               "\"%s\")",
               what, slime_status_name(got), slime_status_name(want),
               slime_req_error(req), slime_last_error());
}

slime_status_t h_outcome_(const char *file, int line, const char *what,
                          slime_status_t posted, slime_req_t **req)
{
    if (posted != SLIME_OK) {
        if (*req != NULL)
            h_fail(file, line, "%s -> %s but handed back a request", what,
                   slime_status_name(posted));
        snprintf(g_detail, sizeof g_detail, "%s", slime_last_error());
        return posted;
    }
    if (*req == NULL)
        h_fail(file, line, "%s -> SLIME_OK without a request", what);
    slime_status_t got = slime_req_wait(*req, H_WAIT_MS);
    if (got == SLIME_ERR_TIMEOUT || got == SLIME_INPROGRESS)
        h_fail(file, line, "%s: still pending after %d ms", what, H_WAIT_MS);
    snprintf(g_detail, sizeof g_detail, "%s", slime_req_error(*req));
    slime_req_free(*req);
    *req = NULL;
    return got;
}

void h_check_one_of_(const char *file, int line, const char *what,
                     slime_status_t got, const slime_status_t *allowed,
                     size_t n)
{
    char want[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (got == allowed[i])
            return;
        int w = snprintf(want + used, sizeof want - used, "%s%s",
                         i ? " or " : "", slime_status_name(allowed[i]));
        if (w > 0 && (size_t)w < sizeof want - used)
            used += (size_t)w;
    }
    h_fail(file, line, "%s is %s (\"%s\"), want %s", what,
           slime_status_name(got), g_detail, want);
}

const char *h_detail(void)
{
    return g_detail;
}

slime_ctx_t *h_ctx_create(const slime_ctx_opts_t *opts)
{
    slime_ctx_t *ctx = NULL;
    H_CHECK_OK(slime_ctx_create(opts, &ctx));
    H_CHECK(ctx != NULL);
    return ctx;
}

size_t h_ctx_address(slime_ctx_t *ctx, uint8_t *buf)
{
    size_t len = SLIME_ADDRESS_MAX;
    H_CHECK_OK(slime_ctx_address(ctx, buf, &len));
    H_CHECK(len > 0 && len <= SLIME_ADDRESS_MAX);
    return len;
}

void *h_alloc(size_t len)
{
    void *p = calloc(1, len ? len : 1);
    if (p == NULL)
        h_fail(__FILE__, __LINE__, "out of memory for %zu bytes", len);
    return p;
}

slime_mr_t *h_mr_reg(slime_ctx_t *ctx, void *addr, size_t len,
                     unsigned access)
{
    slime_mr_t *mr = NULL;
    H_CHECK_OK(slime_mr_reg(ctx, addr, len, access, &mr));
    H_CHECK(mr != NULL);
    H_CHECK(slime_mr_addr(mr) == addr);
    H_CHECK_EQ(slime_mr_len(mr), len);
    return mr;
}

void h_send_desc(h_rank_t *r, int to, const slime_mr_t *mr)
{
    slime_mr_desc_t desc;
    H_CHECK_OK(slime_mr_desc(mr, &desc));
    H_CHECK_EQ(slime_mr_desc_len(&desc), slime_mr_len(mr));
    h_ctl_send(r, to, &desc, sizeof desc);
}

slime_mr_desc_t h_recv_desc(h_rank_t *r, int from)
{
    slime_mr_desc_t desc;
    H_CHECK_EQ(h_ctl_recv(r, from, &desc, sizeof desc), sizeof desc);
    return desc;
}

/* splitmix64: cheap, and every bit of the input moves every output bit. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint8_t h_pattern_byte(uint64_t seed, uint64_t i)
{
    return (uint8_t)(mix(mix(seed) + (i >> 3)) >> ((i & 7) * 8));
}

void h_fill(void *buf, size_t len, uint64_t seed, uint64_t start)
{
    uint8_t *b = buf;
    const uint64_t key = mix(seed);
    size_t j = 0;
    while (j < len) {
        uint64_t i = start + j;
        uint64_t word = mix(key + (i >> 3));
        for (unsigned k = (unsigned)(i & 7); k < 8 && j < len; k++, j++)
            b[j] = (uint8_t)(word >> (k * 8));
    }
}

long long h_mismatch(const void *buf, size_t len, uint64_t seed,
                     uint64_t start)
{
    const uint8_t *b = buf;
    const uint64_t key = mix(seed);
    size_t j = 0;
    while (j < len) {
        uint64_t i = start + j;
        uint64_t word = mix(key + (i >> 3));
        for (unsigned k = (unsigned)(i & 7); k < 8 && j < len; k++, j++)
            if (b[j] != (uint8_t)(word >> (k * 8)))
                return (long long)j;
    }
    return -1;
}

long long h_mismatch_byte(const void *buf, size_t len, uint8_t value)
{
    const uint8_t *b = buf;
    for (size_t j = 0; j < len; j++)
        if (b[j] != value)
            return (long long)j;
    return -1;
}

int64_t h_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void h_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
