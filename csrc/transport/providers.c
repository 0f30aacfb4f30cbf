/* The provider table: every transport of the library, in the order that
 * breaks ties between equally good ways to a peer (transport_ops_t.reach).
 * Adding a transport: its own files, and its line here. */
#include "transport/transport.h"

extern const transport_ops_t slime_shm_transport;
extern const transport_ops_t slime_verbs_transport;
extern const transport_ops_t slime_tcp_transport;

const transport_ops_t *const slime_transports[] = {
    &slime_shm_transport,
    &slime_verbs_transport,
    &slime_tcp_transport,
    NULL,
};
