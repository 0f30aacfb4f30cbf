/* What the core calls of the verbs transport.  The transport proper
 * (verbs_*.c) exists only where CMake found <infiniband/verbs.h>
 * (SLIME_HAVE_VERBS); elsewhere verbs_stub.c answers every call with
 * "not in this build", so the core never needs an #ifdef. */
#ifndef SLIME_VERBS_H
#define SLIME_VERBS_H

#include <stdbool.h>

#include "core/internal.h"

/* Opens the RDMA device this context will use and sets ctx->verbs.
 * Without a usable one: forced, fails with SLIME_ERR_UNSUPPORTED and a
 * detail that says why; else returns SLIME_OK and leaves ctx->verbs NULL. */
slime_status_t verbs_open(slime_ctx_t *ctx, bool forced);
/* After every endpoint is closed and every MR unregistered. */
void verbs_close(slime_ctx_t *ctx);

/* Its memory domain (verbs_md.c), in the table of transport/domains.c
 * where the build has the transport. */
extern const struct md_ops slime_verbs_md;

/* slime_ctx_counter's verbs counters (0 without a device). */
uint64_t verbs_counter(const slime_ctx_t *ctx, slime_counter_t which);

#endif
