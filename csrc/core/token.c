/* Digests of the job token and random ids.
 *
 * The handshake carries a digest of the token, never the token; the MR
 * descriptor carries a different digest, so a leaked descriptor does not
 * let a stranger pass the handshake.  This keeps strangers and crossed
 * jobs out; it is not meant to stop an eavesdropper on the wire.
 *
 * A context given no token makes a random one of its own, never the
 * empty one (which any local process could present): its address blob
 * carries the digests, so whoever was given the blob may connect, and
 * nobody else.  A job's shared token (torch's, published in its store)
 * never goes into a blob.
 *
 * A context's id is a digest of a secret of its own (context_id): the
 * hello carries the secret, and an acceptor takes the id only with the
 * secret it is the digest of, so the id in an address blob, which is
 * public, is not enough to pass for that context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t token_digest(const char *domain, const void *tok, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix */
    for (const char *d = domain; *d; d++) h = (h ^ (uint8_t)*d) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
    const uint8_t *p = tok;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return mix(h ^ len);
}

void token_init(slime_ctx_t *ctx, const void *tok, size_t len) {
    uint8_t own[32];
    const char *env = getenv("DLSLIME_TOKEN");
    if (!tok && env && *env) {
        tok = env;
        len = strlen(env);
    }
    ctx->own_token = !tok;
    if (!tok) {
        for (size_t i = 0; i < sizeof own; i += 8) {
            uint64_t r = random_u64();
            memcpy(own + i, &r, 8);
        }
        tok = own;
        len = sizeof own;
    }
    ctx->proof = token_digest("dlslime-hello-1", tok, len);
    ctx->job = token_digest("dlslime-job-1", tok, len);
}

uint64_t context_id(const uint8_t secret[SLIME_ID_SECRET]) {
    static const char domain[] = "dlslime-id-1";
    uint8_t msg[sizeof domain + SLIME_ID_SECRET], d[32];
    memcpy(msg, domain, sizeof domain);
    memcpy(msg + sizeof domain, secret, SLIME_ID_SECRET);
    sha256(msg, sizeof msg, d);
    uint64_t id;
    memcpy(&id, d, sizeof id);
    return id;
}

void context_id_init(slime_ctx_t *ctx) {
    do {
        for (size_t i = 0; i < SLIME_ID_SECRET; i += 8) {
            uint64_t r = random_u64();
            memcpy(ctx->id_secret + i, &r, 8);
        }
        ctx->id = context_id(ctx->id_secret);
    } while (ctx->id == 0);
}

uint64_t random_u64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return mix((uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_sec);
}
