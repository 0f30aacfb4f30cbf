/* libibverbs, loaded with dlopen the first time a context wants a device.
 * libdlslime never links it: a machine without rdma-core runs every other
 * transport, and only DLSLIME_TRANSPORT=verbs says what is missing.  The
 * data path (post_send, post_recv, poll_cq, req_notify_cq) is inline in
 * <infiniband/verbs.h> and calls the provider through the context's ops,
 * so only the setup calls below need symbols.  The library stays loaded
 * for the life of the process (providers keep threads and state). */
#ifdef SLIME_HAVE_VERBS

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "transport/verbs_internal.h"

verbs_api_t verbs_api;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[256];

#define SYM(field, name) {(void **)&verbs_api.field, name}

static void load(void) {
    const char *names[] = {"libibverbs.so.1", "libibverbs.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error,
                 "libibverbs.so.1 cannot be loaded (%s); install rdma-core's libibverbs1 and a provider "
                 "(ibverbs-providers)", e ? e : "not found");
        return;
    }
    const struct {
        void **slot;
        const char *name;
    } syms[] = {
        SYM(get_device_list, "ibv_get_device_list"),
        SYM(free_device_list, "ibv_free_device_list"),
        SYM(get_device_name, "ibv_get_device_name"),
        SYM(open_device, "ibv_open_device"),
        SYM(close_device, "ibv_close_device"),
        SYM(query_device, "ibv_query_device"),
        SYM(query_port, "ibv_query_port"),
        SYM(query_gid, "ibv_query_gid"),
        SYM(alloc_pd, "ibv_alloc_pd"),
        SYM(dealloc_pd, "ibv_dealloc_pd"),
        SYM(reg_mr, "ibv_reg_mr"),
        SYM(dereg_mr, "ibv_dereg_mr"),
        SYM(create_comp_channel, "ibv_create_comp_channel"),
        SYM(destroy_comp_channel, "ibv_destroy_comp_channel"),
        SYM(create_cq, "ibv_create_cq"),
        SYM(destroy_cq, "ibv_destroy_cq"),
        SYM(create_qp, "ibv_create_qp"),
        SYM(modify_qp, "ibv_modify_qp"),
        SYM(destroy_qp, "ibv_destroy_qp"),
        SYM(get_cq_event, "ibv_get_cq_event"),
        SYM(ack_cq_events, "ibv_ack_cq_events"),
        SYM(wc_status_str, "ibv_wc_status_str"),
        SYM(get_async_event, "ibv_get_async_event"),
        SYM(ack_async_event, "ibv_ack_async_event"),
        SYM(event_type_str, "ibv_event_type_str"),
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(lib, syms[i].name);
        if (!p) {
            snprintf(load_error, sizeof load_error, "libibverbs has no %s (too old?)", syms[i].name);
            memset(&verbs_api, 0, sizeof verbs_api);
            dlclose(lib);
            return;
        }
        *syms[i].slot = p;
    }
}

bool verbs_api_load(char *why, size_t whylen) {
    pthread_once(&load_once, load);
    if (verbs_api.get_device_list) return true;
    snprintf(why, whylen, "%s", load_error);
    return false;
}

int verbs_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
    memset(a, 0, sizeof *a);
    /* the extended op fills the whole struct; the old entry point a prefix */
    struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
    if (vctx) return vctx->query_port(c, port, a, sizeof *a);
    return verbs_api.query_port(c, port, (struct _compat_ibv_port_attr *)a);
}

#else
typedef int verbs_api_unused;
#endif
