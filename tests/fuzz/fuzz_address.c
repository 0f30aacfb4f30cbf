/* The address blob decoder (core/address.c) and what reads a parsed
 * blob's fields: the choice of transport by each one's reach, and the
 * order of the peer's tcp addresses to dial. */
#include "fuzz.h"
#include "transport/sockio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    slime_ctx_t *ctx = fz_ctx_shared();
    wire_addr_t a;
    if (address_parse(data, size, &a) != SLIME_OK) return 0;
    const transport_ops_t *tp;
    (void)transports_choose(ctx, &a, &tp);
    (void)address_same_host(&ctx->addr, &a);
    uint32_t order[WIRE_MAX_HOSTS + 1];
    int n = sock_peer_hosts(ctx, &a, order);
    if (n < 0 || n > WIRE_MAX_HOSTS + 1) __builtin_trap();
    return 0;
}
