/* The verbs transport where the build had no <infiniband/verbs.h>:
 * DLSLIME_TRANSPORT=verbs fails with a clear error, and elsewhere it is
 * never open in a context, so auto never picks it and an incoming verbs
 * hello is refused (hello_accept); the core calls none of its
 * connection ops. */
#ifndef SLIME_HAVE_VERBS

#include "transport/transport.h"
#include "transport/verbs.h"


static slime_status_t stub_ctx_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, enum tp_mode mode,
                                    void **state) {
    (void)ctx;
    (void)opts;
    *state = NULL;
    if (mode != TP_FORCED) return SLIME_OK;
    return slime_errorf(SLIME_ERR_UNSUPPORTED,
                        "transport 'verbs' is not in this build: <infiniband/verbs.h> was missing when "
                        "libdlslime was built (install libibverbs-dev and rebuild)");
}

const transport_ops_t slime_verbs_transport = {
    .size = sizeof(transport_ops_t),
    .name = "verbs",
    .wire = WIRE_TRANSPORT_VERBS,
    .absent = "has no usable RDMA device",
    .via = WIRE_TRANSPORT_TCP,
    .ctx_open = stub_ctx_open,
};

#else
typedef int verbs_stub_unused; /* ISO C wants something in a translation unit */
#endif
