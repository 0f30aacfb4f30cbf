/* Combining receives (slime_recv_reduce): the payload is folded into the
 * receive buffer, buf[i] = combine(buf[i], in[i]), as it arrives, rather
 * than copied there.  A ring reduce step otherwise copies every chunk out
 * of the transport into scratch and then reads the scratch again to
 * reduce it; here a transport whose bytes lie in memory (a ring) is read
 * once, in place (rx_peek), and the others hand their bytes through a
 * small buffer on the stack that stays in L1.  Every path (streamed payloads, unexpected eager
 * messages, every transport) goes through combine_bytes, so the
 * semantics live in one place.
 *
 * Element boundaries need not fall on read boundaries: a frame header
 * may leave the payload at any offset of a ring, the ring wraps, and a
 * read returns whatever the writer has published.  The bytes of an
 * element split that way wait in rx->carry until the element is whole;
 * a run whose source is not aligned for its elements goes through an
 * aligned bounce buffer, as the fold reads whole typed elements. */
#include <inttypes.h>
#include <string.h>

#include "core/internal.h"
#include "transport/transport.h"

#define BOUNCE 4096

bool recv_misfit(const slime_req_t *r, uint64_t len) { return r->combine && len % r->esize != 0; }

void recv_refuse(slime_req_t *r, uint64_t len) {
    if (len > r->len)
        req_complete(r, SLIME_ERR_TRUNCATED,
                     "message of %" PRIu64 " bytes is larger than the receive buffer of %zu bytes", len, r->len);
    else
        req_complete(r, SLIME_ERR_INVAL, "message of %" PRIu64 " bytes is not a whole number of %zu-byte elements",
                     len, r->esize);
}

/* Folds n payload bytes that belong at byte offset pos of r's message
 * into r->buf; carry holds the pos % esize bytes already seen of a split
 * element (and is updated). */
static void combine_bytes(const slime_req_t *r, uint8_t *carry, size_t pos, const uint8_t *src, size_t n) {
    const size_t es = r->esize;
    uint8_t *buf = r->buf;
    size_t part = pos % es;
    if (part) {
        size_t k = min_sz(es - part, n);
        memcpy(carry + part, src, k);
        src += k;
        n -= k;
        pos += k;
        if (part + k < es) return; /* still not whole */
        r->combine(buf + pos - es, carry, 1);
    }
    size_t whole = n / es;
    if ((uintptr_t)src % es == 0) {
        if (whole) r->combine(buf + pos, src, whole);
    } else {
        _Alignas(16) uint8_t bounce[BOUNCE];
        const size_t per = BOUNCE / es;
        for (size_t done = 0; done < whole;) {
            size_t k = min_sz(whole - done, per);
            memcpy(bounce, src + done * es, k * es);
            r->combine(buf + pos + done * es, bounce, k);
            done += k;
        }
    }
    memcpy(carry, src + whole * es, n - whole * es); /* the start of a split element */
}

void recv_deliver(slime_req_t *r, const void *data, size_t len) {
    if (!r->combine) {
        if (len) memcpy(r->buf, data, len);
        return;
    }
    _Alignas(16) uint8_t carry[16];
    combine_bytes(r, carry, 0, data, len);
}

ssize_t frames_rx_combine(slime_ep_t *ep) {
    rx_ctx_t *rx = &ep->rx;
    const slime_req_t *r = rx->req;
    if (ep->tp->rx_peek) {
        const uint8_t *at;
        size_t n = ep->tp->rx_peek(ep, rx->left, &at);
        if (n == 0) return 0;
        combine_bytes(r, rx->carry, rx->got, at, n);
        ep->tp->rx_consume(ep, n);
        return (ssize_t)n;
    }
    /* small enough to stay in L1 between the copy and the fold */
    _Alignas(16) uint8_t bounce[16384];
    ssize_t n = ep->tp->read(ep, bounce, min_sz(rx->left, sizeof bounce));
    if (n > 0) combine_bytes(r, rx->carry, rx->got, bounce, (size_t)n);
    return n;
}
