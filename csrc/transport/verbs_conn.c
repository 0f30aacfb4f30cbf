/* An endpoint's verbs resources: completion channel and queue, RC queue
 * pairs walked INIT -> RTR -> RTS against the peer's handshake info, and
 * the registered bounce slots of the stream (receives pre-posted on QP 0
 * before the peer can send anything). */
#ifdef SLIME_HAVE_VERBS

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/sockio.h"
#include "transport/verbs_internal.h"

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static bool post_recv_all(verbs_conn_t *c) {
    for (uint32_t i = 0; i < c->dev->recv_slots; i++) {
        vslot_t *s = &c->rx[i];
        struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = c->dev->slot_size, .lkey = c->mem_mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = (uintptr_t)s, .sg_list = &sge, .num_sge = 1}, *bad;
        if (ibv_post_recv(c->qp[0], &wr, &bad) != 0) return false;
        s->posted = true;
    }
    return true;
}

static bool qp_init(verbs_conn_t *c, int i) {
    verbs_dev_t *d = c->dev;
    struct ibv_qp_init_attr ia = {
        .send_cq = c->cq,
        .recv_cq = c->cq,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1,
        .cap = {.max_send_wr = d->sq_depth + (i == 0 ? c->sq_cap : 0), .max_recv_wr = i == 0 ? d->recv_slots : 1,
                .max_send_sge = 1, .max_recv_sge = 1},
    };
    if (!(c->qp[i] = verbs_api.create_qp(d->pd, &ia))) return false;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = d->port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
    };
    if (verbs_api.modify_qp(c->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return false;
    c->psn[i] = (uint32_t)random_u64() & 0xffffff;
    return true;
}

slime_status_t vconn_new(slime_ctx_t *ctx, int n_qps, verbs_conn_t **out) {
    verbs_dev_t *d = verbs_dev_of(ctx);
    *out = NULL;
    errno = 0;
    verbs_conn_t *c = calloc(1, sizeof *c);
    if (!c) return slime_errorf(SLIME_ERR_NOMEM, "verbs conn");
    c->dev = d;
    c->ctx = ctx;
    c->sock = c->epfd = -1;
    c->n_qps = n_qps;
    c->credit_wr = VW_CREDIT;
    list_init(&c->tx_free);
    list_init(&c->tx_ready);
    list_init(&c->rx_got);
    list_init(&c->ctrl_backlog);
    list_init(&c->ops);
    list_init(&c->post_q);
    list_init(&c->imm_q);
    list_init(&c->rmrs);
    list_init(&c->offers);
    const char *what = "completion channel";
    if (!(c->ch = verbs_api.create_comp_channel(d->ibv))) goto fail;
    int fl = fcntl(c->ch->fd, F_GETFL);
    fcntl(c->ch->fd, F_SETFL, fl | O_NONBLOCK); /* drained until EAGAIN */
    c->sq_cap = d->send_slots + 2;
    int cqe = (int)(n_qps * d->sq_depth + d->send_slots + 2 + d->recv_slots + 16);
    what = "completion queue";
    if (!(c->cq = verbs_api.create_cq(d->ibv, cqe, c, c->ch, 0))) goto fail;
    what = "queue pair";
    for (int i = 0; i < n_qps; i++)
        if (!qp_init(c, i)) goto fail;
    what = "bounce slots";
    size_t slot = d->slot_size, total = round_up((size_t)(d->send_slots + d->recv_slots) * slot, 4096);
    c->mem = aligned_alloc(4096, total);
    c->tx = calloc(d->send_slots, sizeof *c->tx);
    c->rx = calloc(d->recv_slots, sizeof *c->rx);
    c->peer_pins = calloc(MR_TABLE_SLOTS / 64, sizeof *c->peer_pins);
    if (!c->mem || !c->tx || !c->rx || !c->peer_pins) goto fail;
    what = "registration of the bounce slots";
    if (!(c->mem_mr = verbs_api.reg_mr(d->pd, c->mem, total, IBV_ACCESS_LOCAL_WRITE))) goto fail;
    for (uint32_t i = 0; i < d->send_slots; i++) {
        c->tx[i] = (vslot_t){.kind = VW_SEND, .buf = c->mem + i * slot};
        list_init(&c->tx[i].link);
        list_push_back(&c->tx_free, &c->tx[i].link);
    }
    for (uint32_t i = 0; i < d->recv_slots; i++) {
        c->rx[i] = (vslot_t){.kind = VW_RECV, .buf = c->mem + (d->send_slots + i) * slot};
        list_init(&c->rx[i].link);
    }
    what = "posting receives";
    if (!post_recv_all(c)) goto fail;
    *out = c;
    return SLIME_OK;
fail:;
    int e = errno ? errno : EINVAL;
    vconn_free(c);
    return slime_errorf(e == ENOMEM ? SLIME_ERR_NOMEM : SLIME_ERR_SYSTEM, "verbs: creating the %s on %s failed: %s",
                        what, d->name, strerror(e));
}

void vconn_info(const verbs_conn_t *c, wire_verbs_info_t *out) {
    const verbs_dev_t *d = c->dev;
    memset(out, 0, sizeof *out);
    out->magic = VERBS_INFO_MAGIC;
    out->n_qps = (uint16_t)c->n_qps;
    out->mtu = (uint8_t)d->mtu;
    out->ethernet = d->ethernet;
    memcpy(out->gid, d->gid.raw, 16);
    out->lid = d->lid;
    out->rd_atom = (uint8_t)d->rd_atom;
    out->recv_slots = d->recv_slots;
    out->slot_size = d->slot_size;
    for (int i = 0; i < c->n_qps; i++) {
        out->qpn[i] = c->qp[i]->qp_num;
        out->psn[i] = c->psn[i];
    }
    snprintf(out->dev, sizeof out->dev, "%.16s:%u gid[%d]", d->name, d->port, d->gid_index);
}

bool verbs_info_valid(const wire_verbs_info_t *in, char *why, size_t whylen) {
    if (in->magic != VERBS_INFO_MAGIC) snprintf(why, whylen, "verbs handshake: bad info magic");
    else if (in->n_qps < 1 || in->n_qps > VERBS_MAX_QPS) snprintf(why, whylen, "verbs handshake: %u QPs", in->n_qps);
    else if (in->mtu < IBV_MTU_256 || in->mtu > IBV_MTU_4096) snprintf(why, whylen, "verbs handshake: bad MTU");
    else if (in->recv_slots < 2 || in->slot_size < 4096 || in->rd_atom < 1)
        snprintf(why, whylen, "verbs handshake: bad slot parameters");
    else return true;
    return false;
}

slime_status_t vconn_connect(verbs_conn_t *c, const wire_verbs_info_t *peer) {
    verbs_dev_t *d = c->dev;
    int m = c->n_qps < peer->n_qps ? c->n_qps : peer->n_qps;
    for (int i = m; i < c->n_qps; i++) {
        verbs_api.destroy_qp(c->qp[i]);
        c->qp[i] = NULL;
    }
    c->n_qps = m;
    enum ibv_mtu mtu = d->mtu < (enum ibv_mtu)peer->mtu ? d->mtu : (enum ibv_mtu)peer->mtu;
    c->tx_size = d->slot_size < peer->slot_size ? d->slot_size : peer->slot_size;
    c->credits = peer->recv_slots;
    union ibv_gid dgid;
    memcpy(dgid.raw, peer->gid, 16);
    /* RoCE always routes by GID; InfiniBand only across subnets */
    bool global = d->ethernet || memcmp(dgid.raw, d->gid.raw, 8) != 0;
    for (int i = 0; i < m; i++) {
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = mtu,
            .dest_qp_num = peer->qpn[i],
            .rq_psn = peer->psn[i],
            .max_dest_rd_atomic = (uint8_t)d->rd_atom,
            .min_rnr_timer = 12,
            .ah_attr = {.dlid = peer->lid, .port_num = d->port, .is_global = global,
                        .grh = {.dgid = dgid, .sgid_index = (uint8_t)d->gid_index, .hop_limit = 64}},
        };
        int e = verbs_api.modify_qp(c->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        if (e) return slime_errorf(SLIME_ERR_SYSTEM, "verbs: QP %d to RTR on %s (GID index %d): %s", i, d->name,
                                   d->gid_index, strerror(e));
        struct ibv_qp_attr b = {
            .qp_state = IBV_QPS_RTS,
            .timeout = d->timeout,
            .retry_cnt = d->retry_cnt,
            .rnr_retry = 7, /* credits prevent RNR; if one happens, retry */
            .sq_psn = c->psn[i],
            .max_rd_atomic = (uint8_t)(d->rd_atom < peer->rd_atom ? d->rd_atom : peer->rd_atom),
        };
        e = verbs_api.modify_qp(c->qp[i], &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
        if (e) return slime_errorf(SLIME_ERR_SYSTEM, "verbs: QP %d to RTS on %s: %s", i, d->name, strerror(e));
    }
    char pdev[sizeof peer->dev + 1];
    memcpy(pdev, peer->dev, sizeof peer->dev);
    pdev[sizeof peer->dev] = 0;
    snprintf(c->desc, sizeof c->desc, "verbs %.150s <-> peer %.32s, path mtu %d, %d QP%s", d->desc, pdev, 128 << mtu, m,
             m == 1 ? "" : "s");
    return SLIME_OK;
}

int vconn_set_socket(verbs_conn_t *c, int sock) {
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return -1;
    struct epoll_event s = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = 1};
    struct epoll_event ch = {.events = EPOLLIN, .data.u32 = 2};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sock, &s) < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, c->ch->fd, &ch) < 0) {
        close(epfd);
        return -1;
    }
    c->sock = sock;
    c->same_host = sock_same_host(sock);
    c->epfd = epfd;
    return epfd;
}

void vconn_free(verbs_conn_t *c) {
    if (!c) return;
    /* queue pairs first: after that nothing touches our memory */
    for (int i = 0; i < VERBS_MAX_QPS; i++)
        if (c->qp[i]) verbs_api.destroy_qp(c->qp[i]);
    vops_free_all(c);
    rkeys_conn_close(c);
    verbs_offers_free(c);
    vconn_ctrl_free(c);
    if (c->cq) verbs_api.destroy_cq(c->cq);
    if (c->ch) verbs_api.destroy_comp_channel(c->ch);
    if (c->mem_mr) verbs_api.dereg_mr(c->mem_mr);
    free(c->mem);
    free(c->tx);
    free(c->rx);
    free(c->peer_pins);
    if (c->epfd >= 0) close(c->epfd);
    if (c->sock >= 0) close(c->sock);
    free(c);
}

#else
typedef int verbs_conn_unused;
#endif
