/* What the core calls of the verbs transport beyond its ops table.  The
 * transport proper (verbs_*.c) exists only where CMake found
 * <infiniband/verbs.h> (SLIME_HAVE_VERBS); elsewhere verbs_stub.c answers
 * every call with "not in this build", so the core never needs an #ifdef. */
#ifndef SLIME_VERBS_H
#define SLIME_VERBS_H

#include <stdbool.h>

#include "core/internal.h"

/* Memory regions (mr.c).  reg/unreg run without ctx->lock (pinning is
 * slow); bind and revoke with it.  In auto mode a region the device cannot
 * register is kept without (reg returns SLIME_OK): only verbs ops on it
 * fail, with SLIME_ERR_ACCESS. */
slime_status_t verbs_mr_reg(slime_ctx_t *ctx, slime_mr_t *mr);
void verbs_mr_bind(slime_ctx_t *ctx, const slime_mr_t *mr);
/* The region is dying: peers that cached its key must drop it.  Each
 * such peer holds a pin on the table entry until it has (or is lost), so
 * slime_mr_dereg's wait for the pins covers their in-flight accesses. */
void verbs_mr_revoke(slime_ctx_t *ctx, const slime_mr_t *mr);
void verbs_mr_unreg(slime_mr_t *mr);

#endif
