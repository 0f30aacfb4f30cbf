/* The address blob: how peers reach a context and how they tell that it
 * runs on their host (same boot, user, pid and network namespace: then
 * abstract unix sockets and CMA work between them). */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
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

static int list_hosts(uint32_t *hosts) {
    struct ifaddrs *ifs, *i;
    int n = 0;
    if (getifaddrs(&ifs) != 0) return 0;
    /* routable addresses first, loopback last */
    for (int pass = 0; pass < 2; pass++) {
        for (i = ifs; i && n < WIRE_MAX_HOSTS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
            int lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
            if (lo != pass) continue;
            hosts[n++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        }
    }
    freeifaddrs(ifs);
    return n;
}

slime_status_t address_init(slime_ctx_t *ctx, const char *host, int have_shm) {
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
    if (have_shm) a->flags |= ADDR_HAS_SHM;
    if (ctx->tcp_listen_fd >= 0) {
        a->flags |= ADDR_HAS_TCP;
        if (host && *host && strcmp(host, "0.0.0.0") != 0) {
            struct in_addr in;
            if (inet_pton(AF_INET, host, &in) != 1)
                return slime_errorf(SLIME_ERR_INVAL, "tcp host '%s' is not an IPv4 address", host);
            a->hosts[0] = in.s_addr;
            a->n_hosts = 1;
        } else {
            a->n_hosts = (uint16_t)list_hosts(a->hosts);
            if (a->n_hosts == 0) { a->hosts[0] = htonl(INADDR_LOOPBACK); a->n_hosts = 1; }
        }
    }
    return SLIME_OK;
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
