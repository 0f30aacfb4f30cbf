/* The address blob: who a context is and how peers tell that it runs on
 * their host (same boot, user, pid and network namespace: then abstract
 * unix sockets and CMA work between them).  How to reach it is each
 * transport's part (transport_ops_t.address). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

static void read_boot_id(uint8_t out[16]) {
    char buf[64] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    memset(out, 0, 16);
    int n = 0;
    for (char *p = buf; *p && n < 32; p++) {
        int v = (*p >= '0' && *p <= '9') ? *p - '0' : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10 : -1;
        if (v < 0) continue;
        out[n / 2] |= (uint8_t)(v << ((n % 2) ? 0 : 4));
        n++;
    }
}

static uint64_t ns_inode(const char *which) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/self/ns/%s", which);
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

void address_init(slime_ctx_t *ctx) {
    wire_addr_t *a = &ctx->addr;
    memset(a, 0, sizeof *a);
    a->magic = WIRE_ADDR_MAGIC;
    a->version = SLIME_WIRE_VERSION;
    a->ctx_id = ctx->id;
    read_boot_id(a->boot_id);
    a->pid_ns = ns_inode("pid");
    a->net_ns = ns_inode("net");
    a->uid = (uint32_t)getuid();
    a->pid = (uint32_t)getpid();
    if (ctx->own_token) {
        a->flags |= ADDR_CAPABILITY;
        a->cap_proof = ctx->proof;
        a->cap_job = ctx->job;
    }
}

slime_status_t slime_ctx_address(slime_ctx_t *ctx, void *buf, size_t *len) {
    if (!ctx || !len) return slime_errorf(SLIME_ERR_INVAL, "ctx_address: NULL argument");
    size_t need = sizeof(wire_addr_t);
    size_t cap = *len;
    *len = need;
    if (!buf || cap < need)
        return slime_errorf(SLIME_ERR_INVAL, "ctx_address: buffer of %zu bytes, need %zu", cap, need);
    memcpy(buf, &ctx->addr, need);
    return SLIME_OK;
}

slime_status_t address_parse(const void *buf, size_t len, wire_addr_t *out) {
    if (!buf) return slime_errorf(SLIME_ERR_INVAL, "address is NULL");
    if (len != sizeof *out)
        return slime_errorf(SLIME_ERR_INVAL, "address blob of %zu bytes, expected %zu (not from slime_ctx_address?)",
                            len, sizeof *out);
    memcpy(out, buf, sizeof *out);
    if (out->magic != WIRE_ADDR_MAGIC)
        return slime_errorf(SLIME_ERR_INVAL, "address blob has a bad magic (not from slime_ctx_address)");
    if (out->version != SLIME_WIRE_VERSION)
        return slime_errorf(SLIME_ERR_REFUSED, "peer speaks wire version %u, this library speaks %u",
                            out->version, SLIME_WIRE_VERSION);
    if (out->n_hosts > WIRE_MAX_HOSTS) return slime_errorf(SLIME_ERR_INVAL, "address blob lists too many hosts");
    return SLIME_OK;
}

bool address_same_host(const wire_addr_t *a, const wire_addr_t *b) {
    return memcmp(a->boot_id, b->boot_id, 16) == 0 && a->pid_ns == b->pid_ns && a->net_ns == b->net_ns &&
           a->uid == b->uid;
}
