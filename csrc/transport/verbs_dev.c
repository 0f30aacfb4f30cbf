/* Which RDMA device, port and GID a context uses.
 *
 * Candidates: $DLSLIME_VERBS_DEVICES ("mlx5_0,mlx5_1:2"), else every
 * device; with several, $LOCAL_RANK picks where to start (one NIC per
 * local rank, as torchrun jobs want), and the next usable one is taken.
 * A port must be ACTIVE.  On InfiniBand the GID is index 0 (LID routed);
 * on RoCE the best GID is a RoCE v2 one, IPv4-mapped before global IPv6
 * before link-local, unless $DLSLIME_VERBS_GID_INDEX names one. */
#ifdef SLIME_HAVE_VERBS

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/verbs_internal.h"

#define MAX_CANDIDATES 16

typedef struct candidate {
    char name[VERBS_MAX_DEVNAME];
    int port; /* 0: any */
} candidate_t;

static void append(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t len, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

static int parse_candidates(const char *list, candidate_t *out) {
    int n = 0;
    const char *p = list;
    while (*p && n < MAX_CANDIDATES) {
        size_t k = strcspn(p, ", ");
        if (k > 0 && k < VERBS_MAX_DEVNAME) {
            memcpy(out[n].name, p, k);
            out[n].name[k] = 0;
            char *colon = strchr(out[n].name, ':');
            out[n].port = colon ? atoi(colon + 1) : 0;
            if (colon) *colon = 0;
            n++;
        }
        p += k;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

static bool gid_is_zero(const union ibv_gid *g) {
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, 16) == 0;
}

static bool gid_is_v4mapped(const union ibv_gid *g) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

static bool gid_is_linklocal(const union ibv_gid *g) { return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80; }

/* 2: RoCE v2, 1: RoCE v1 (or IB), 0: unknown (no sysfs) */
static int gid_version(const char *dev, int port, int index) {
    char path[192], text[32] = "";
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port, index);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(text, sizeof text, f)) text[0] = 0;
    fclose(f);
    if (strstr(text, "v2")) return 2;
    return text[0] ? 1 : 0;
}

static int gid_score(const char *dev, int port, int index, const union ibv_gid *g) {
    if (gid_is_zero(g)) return -1;
    int v = gid_version(dev, port, index);
    int kind = gid_is_v4mapped(g) ? 3 : gid_is_linklocal(g) ? 1 : 2;
    return v == 2 ? 6 + kind : v == 0 ? 3 + kind : kind;
}

static void gid_text(const union ibv_gid *g, char *buf, size_t len) {
    if (gid_is_v4mapped(g)) {
        snprintf(buf, len, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13], g->raw[14], g->raw[15]);
        return;
    }
    size_t at = 0;
    for (int i = 0; i < 16 && at + 6 < len; i += 2)
        at += (size_t)snprintf(buf + at, len - at, "%s%x", i ? ":" : "", (unsigned)(g->raw[i] << 8 | g->raw[i + 1]));
}

/* Picks the GID of an active port; -1 with why appended if none fits. */
static int pick_gid(verbs_dev_t *d, const struct ibv_port_attr *pa, char *why, size_t whylen) {
    const char *env = getenv("DLSLIME_VERBS_GID_INDEX");
    int forced = env && *env ? atoi(env) : -1;
    int best = -1, best_score = -1;
    for (int i = 0; i < pa->gid_tbl_len; i++) {
        if (forced >= 0 && i != forced) continue;
        union ibv_gid g;
        if (verbs_api.query_gid(d->ibv, d->port, i, &g) != 0) continue;
        int s = d->ethernet ? gid_score(d->name, d->port, i, &g) : (gid_is_zero(&g) ? -1 : (i == 0 ? 9 : 1));
        if (s > best_score) {
            best = i;
            best_score = s;
            d->gid = g;
        }
        if (!d->ethernet && forced < 0 && best == 0) break;
    }
    if (best < 0) {
        if (forced >= 0) append(why, whylen, "; %s port %u: GID index %d ($DLSLIME_VERBS_GID_INDEX) is empty or "
                                "out of the table of %d", d->name, d->port, forced, pa->gid_tbl_len);
        else append(why, whylen, "; %s port %u: no usable GID", d->name, d->port);
    }
    return best;
}

static const char *port_state_name(enum ibv_port_state s) {
    switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    default: return "not active";
    }
}

static size_t env_clamped(const char *name, size_t dflt, size_t lo, size_t hi) {
    size_t v = env_size(name, dflt);
    return v < lo ? lo : v > hi ? hi : v;
}

/* Opens one device and finds an active port with a usable GID on it. */
static bool try_device(struct ibv_device *dev, int want_port, verbs_dev_t *d, char *why, size_t whylen) {
    snprintf(d->name, sizeof d->name, "%s", verbs_api.get_device_name(dev));
    d->ibv = verbs_api.open_device(dev);
    if (!d->ibv) {
        append(why, whylen, "; %s: cannot open (%s)", d->name, strerror(errno));
        return false;
    }
    struct ibv_device_attr da;
    if (verbs_api.query_device(d->ibv, &da) != 0) {
        append(why, whylen, "; %s: query_device failed", d->name);
        goto fail;
    }
    for (int p = 1; p <= da.phys_port_cnt; p++) {
        if (want_port && p != want_port) continue;
        struct ibv_port_attr pa;
        d->port = (uint8_t)p;
        if (verbs_query_port(d->ibv, d->port, &pa) != 0) {
            append(why, whylen, "; %s port %d: query_port failed", d->name, p);
            continue;
        }
        if (pa.state != IBV_PORT_ACTIVE) {
            append(why, whylen, "; %s port %d: %s", d->name, p, port_state_name(pa.state));
            continue;
        }
        d->ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        d->gid_index = pick_gid(d, &pa, why, whylen);
        if (d->gid_index < 0) continue;
        d->lid = pa.lid;
        d->mtu = pa.active_mtu;
        d->max_msg = pa.max_msg_sz ? pa.max_msg_sz : (1u << 30);
        int rd = da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom;
        d->rd_atom = rd > 16 ? 16 : rd < 1 ? 1 : rd;
        d->n_qps = (int)env_clamped("DLSLIME_VERBS_QPS", 4, 1, VERBS_MAX_QPS);
        d->slot_size = (uint32_t)env_clamped("DLSLIME_VERBS_SLOT", 32 * 1024, 4096, 1u << 20);
        d->recv_slots = (uint32_t)env_clamped("DLSLIME_VERBS_RECV_SLOTS", 64, 4, 4096);
        d->send_slots = (uint32_t)env_clamped("DLSLIME_VERBS_SEND_SLOTS", 64, 2, 4096);
        d->chunk = (uint32_t)env_clamped("DLSLIME_VERBS_CHUNK", 1u << 20, 4096, d->max_msg);
        d->sq_depth = (uint32_t)env_clamped("DLSLIME_VERBS_DEPTH", 64, 4, 1024);
        d->rndv_min = env_size("DLSLIME_VERBS_RNDV_MIN", 256 * 1024);
        /* 4.096 us * 2^20 = 4.3 s, as NCCL: a retry is costly and only a
         * lost packet needs one (a lost peer shows on the socket first) */
        d->timeout = (uint8_t)env_clamped("DLSLIME_VERBS_TIMEOUT", 20, 1, 31);
        d->retry_cnt = (uint8_t)env_clamped("DLSLIME_VERBS_RETRY", 7, 0, 7);
        d->stall_ns = verbs_stall_ns(d->timeout, d->retry_cnt);
        size_t need = (size_t)d->n_qps * (d->sq_depth + 2) + d->send_slots + d->recv_slots;
        if ((size_t)da.max_cqe < need || (uint32_t)da.max_qp_wr < d->sq_depth + d->send_slots + 2) {
            append(why, whylen, "; %s: queues too small (max_cqe %d, max_qp_wr %d)", d->name, da.max_cqe,
                   da.max_qp_wr);
            continue;
        }
        int fl = fcntl(d->ibv->async_fd, F_GETFL);
    fcntl(d->ibv->async_fd, F_SETFL, fl | O_NONBLOCK); /* read when a QP breaks */
    if (!(d->pd = verbs_api.alloc_pd(d->ibv))) {
            append(why, whylen, "; %s: alloc_pd failed (%s)", d->name, strerror(errno));
            goto fail;
        }
        char gt[48];
        gid_text(&d->gid, gt, sizeof gt);
        snprintf(d->desc, sizeof d->desc, "%s:%u gid[%d] %s%s mtu %d", d->name, d->port, d->gid_index, gt,
                 d->ethernet ? (gid_version(d->name, d->port, d->gid_index) == 1 ? " RoCEv1" : " RoCEv2") : " IB",
                 128 << d->mtu);
        return true;
    }
fail:
    verbs_api.close_device(d->ibv);
    d->ibv = NULL;
    return false;
}

/* Auto mode takes a device only where memory can be pinned: RDMA needs
 * its bounce slots and regions locked, and a container's default
 * RLIMIT_MEMLOCK (64 KiB) would make that fail later and worse. */
static bool can_pin(void) {
    struct rlimit rl;
    if (geteuid() == 0 || getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return true;
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (256ull << 20);
}

static struct ibv_device *find_device(struct ibv_device **list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(verbs_api.get_device_name(list[i]), name) == 0) return list[i];
    return NULL;
}

slime_status_t verbs_dev_open(bool forced, verbs_dev_t **out) {
    *out = NULL;
    if (!forced && env_off("DLSLIME_VERBS")) return SLIME_OK; /* auto mode may be told to leave devices alone */
    if (!forced && !can_pin()) return SLIME_OK;
    char why[1024] = "";
    if (!verbs_api_load(why, sizeof why))
        return forced ? slime_errorf(SLIME_ERR_UNSUPPORTED, "transport 'verbs': %s", why) : SLIME_OK;
    int n = 0;
    struct ibv_device **list = verbs_api.get_device_list(&n);
    if (!list || n == 0) {
        int e = errno;
        if (list) verbs_api.free_device_list(list);
        if (!forced) return SLIME_OK;
        if (list) return slime_errorf(SLIME_ERR_UNSUPPORTED, "transport 'verbs': no RDMA device on this machine");
        return slime_errorf(SLIME_ERR_UNSUPPORTED, "transport 'verbs': no RDMA device on this machine "
                            "(ibv_get_device_list: %s%s)", strerror(e),
                            e == ENOSYS ? ": this kernel has no RDMA support" : "");
    }
    candidate_t cand[MAX_CANDIDATES];
    int nc = 0;
    const char *env = getenv("DLSLIME_VERBS_DEVICES");
    if (env && *env) nc = parse_candidates(env, cand);
    for (int i = 0; nc == 0 && i < n && i < MAX_CANDIDATES; i++) {
        snprintf(cand[i].name, sizeof cand[i].name, "%s", verbs_api.get_device_name(list[i]));
        cand[i].port = 0;
        if (i == n - 1 || i == MAX_CANDIDATES - 1) nc = i + 1;
    }
    const char *lr = getenv("LOCAL_RANK");
    int start = lr && *lr && nc > 0 ? atoi(lr) % nc : 0;
    if (start < 0) start = 0;
    verbs_dev_t *d = calloc(1, sizeof *d);
    if (!d) {
        verbs_api.free_device_list(list);
        return slime_errorf(SLIME_ERR_NOMEM, "verbs device");
    }
    bool ok = false;
    for (int i = 0; i < nc && !ok; i++) {
        const candidate_t *c = &cand[(start + i) % nc];
        struct ibv_device *dev = find_device(list, n, c->name);
        if (!dev) append(why, sizeof why, "; %s: no such device", c->name);
        else ok = try_device(dev, c->port, d, why, sizeof why);
    }
    verbs_api.free_device_list(list);
    if (!ok) {
        free(d);
        if (!forced) return SLIME_OK;
        return slime_errorf(SLIME_ERR_UNSUPPORTED, "transport 'verbs': no usable RDMA device%s%s",
                            env && *env ? " in $DLSLIME_VERBS_DEVICES" : "", why);
    }
    d->forced = forced;
    *out = d;
    return SLIME_OK;
}


const char *verbs_async_why(verbs_conn_t *c) {
    verbs_dev_t *d = c->dev;
    struct ibv_async_event ev;
    while (verbs_api.get_async_event(d->ibv, &ev) == 0) {
        bool qp = ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_QP_REQ_ERR ||
                  ev.event_type == IBV_EVENT_QP_ACCESS_ERR || ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED;
        if (qp) {
            unsigned k = d->n_qp_events++ % (sizeof d->qp_events / sizeof d->qp_events[0]);
            d->qp_events[k].qp_num = ev.element.qp->qp_num;
            d->qp_events[k].type = ev.event_type;
        }
        verbs_api.ack_async_event(&ev);
    }
    unsigned n = d->n_qp_events < 32 ? d->n_qp_events : 32;
    for (unsigned k = 0; k < n; k++)
        for (int i = 0; i < c->n_qps; i++)
            if (c->qp[i] && d->qp_events[k].qp_num == c->qp[i]->qp_num)
                return verbs_api.event_type_str(d->qp_events[k].type);
    return NULL;
}

void verbs_dev_close(verbs_dev_t *d) {
    verbs_api.dealloc_pd(d->pd);
    verbs_api.close_device(d->ibv);
    free(d);
}

#else
typedef int verbs_dev_unused;
#endif
