/*
 * slime_py.h - shared declarations of the dlslime_torch._C binding.
 *
 * The binding is a thin, one-to-one view of dlslime.h.  What it adds is
 * lifetime safety for Python code:
 *   - every Endpoint, MemoryRegion and Request holds a strong reference to
 *     its Context, so the C context outlives everything that points into it;
 *   - the memory an operation reads or writes stays acquired (Py_buffer)
 *     until the binding has seen the request complete (see hold.h);
 *   - calls that may block or copy run with the GIL released.
 */
#ifndef SLIME_PY_H
#define SLIME_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlslime/dlslime.h>

#include "buffer.h"
#include "hold.h"

/* A Context closes in two steps: CLOSING waits for the GIL-free calls
 * already running on its objects to return (the C library must not be
 * inside a wait or test on the context while it is destroyed), then the
 * C context is destroyed and it is CLOSED. */
typedef enum {
    SLIME_PY_OPEN,
    SLIME_PY_CLOSING,
    SLIME_PY_CLOSED,
} slime_py_ctx_state_t;

typedef struct {
    PyObject_HEAD
    slime_ctx_t *ctx;          /* NULL unless OPEN */
    slime_py_ctx_state_t state;
    /* int(slime_ep_t *) -> weakref(Endpoint): one Python object per live
     * C endpoint, so connect() twice hands back the same object. */
    PyObject *endpoints;
    /* Holds of requests freed while still pending (detached in C): their
     * memory must stay alive until the C context is destroyed. */
    slime_py_hold_t *graveyard;
    /* GIL-free calls into the C library on this context or anything it
     * owns (endpoints, MRs, requests); close() waits for them to return. */
    int users;
    /* The subset that may block for long (connect, accept): close()
     * refuses while any runs rather than wait out its timeout. */
    int blocking_users;
} SlimeContextObject;

typedef struct {
    PyObject_HEAD
    SlimeContextObject *context;
    slime_ep_t *ep;            /* valid while context->ctx is open */
    uint64_t peer_id;          /* cached: constant for the endpoint's life */
    PyObject *transport;       /* cached str */
    PyObject *weakrefs;
    int lent;                  /* .handle lent ep to C code: a hold never given back */
} SlimeEndpointObject;

typedef struct {
    PyObject_HEAD
    SlimeContextObject *context;
    slime_mr_t *mr;            /* NULL once deregistered */
    void *addr;
    size_t len;
    slime_py_buf_t buf;        /* the registered memory, kept acquired */
    /* Requests using this region whose completion the binding has not
     * seen yet; dereg() refuses while non-zero. */
    Py_ssize_t pending_uses;
} SlimeMemoryRegionObject;

typedef struct {
    PyObject_HEAD
    SlimeContextObject *context;
    slime_req_t *req;
    slime_status_t final;      /* SLIME_INPROGRESS until seen complete */
    slime_py_hold_t *hold;     /* NULL once released */
} SlimeRequestObject;

extern PyTypeObject SlimeContext_Type;
extern PyTypeObject SlimeEndpoint_Type;
extern PyTypeObject SlimeMemoryRegion_Type;
extern PyTypeObject SlimeRequest_Type;
extern PyTypeObject SlimeSharedMemory_Type;

/* errors.c */
int slime_py_errors_init(PyObject *module);
/* Raises the exception class of status with detail; returns NULL. */
PyObject *slime_py_raise(slime_status_t status, const char *detail);
/* Same, with slime_last_error() of this thread as the detail. */
PyObject *slime_py_raise_last(slime_status_t status);
/* SlimeError(CLOSED) for a use of a closed Context. */
PyObject *slime_py_raise_closed(void);

/* args.c: "O&" converters; each returns 1 on success, 0 with an error. */
int slime_py_conv_size(PyObject *obj, void *out);      /* size_t, >= 0 */
int slime_py_conv_u64(PyObject *obj, void *out);       /* uint64_t */
int slime_py_conv_u32(PyObject *obj, void *out);       /* uint32_t */
int slime_py_conv_timeout(PyObject *obj, void *out);   /* int64_t, >= 0 */
int slime_py_conv_desc(PyObject *obj, void *out);      /* slime_mr_desc_t */

/* context.c */
/* Before a call that starts something new on an open context (connect,
 * accept, reg_mr, an operation): fails with SlimeClosedError unless OPEN,
 * else counts the call until slime_py_context_end_call.  blocking: the
 * call may wait for long (connect, accept). */
int slime_py_context_begin_call(SlimeContextObject *self, int blocking);
void slime_py_context_end_call(SlimeContextObject *self, int blocking);
/* Before any call on an object the context owns (request, MR): while the
 * context is CLOSING, waits (GIL released) until it is CLOSED, when such
 * calls are safe again.  Returns whether the call was counted; pass that
 * to slime_py_context_leave_child. */
int slime_py_context_enter_child(SlimeContextObject *self);
/* Waits (GIL released) while the context is CLOSING. */
void slime_py_context_settle(SlimeContextObject *self);
void slime_py_context_leave_child(SlimeContextObject *self, int counted);
/* The Endpoint object of ep (new reference), created if needed: one per
 * C endpoint, owning one hold on it (slime_ep_hold).  held: the caller
 * passes one in (connect, accept), else the object takes its own. */
PyObject *slime_py_context_endpoint(SlimeContextObject *self, slime_ep_t *ep, int held);
/* Takes a detached request's hold until the context is destroyed. */
void slime_py_context_bury(SlimeContextObject *self, slime_py_hold_t *hold);

/* endpoint.c */
PyObject *slime_py_endpoint_new(SlimeContextObject *context, slime_ep_t *ep);
/* Checks that obj is an Endpoint of context; returns its ep or NULL. */
slime_ep_t *slime_py_endpoint_of(SlimeContextObject *context, PyObject *obj);

/* mr.c */
/* Checks that obj is a registered MemoryRegion of context. */
SlimeMemoryRegionObject *slime_py_mr_of(SlimeContextObject *context,
                                        PyObject *obj);

/* request.c */
/* Wraps req, the outcome of a post that returned `posted`; takes
 * ownership of hold (may be NULL).  If the post failed, releases hold and
 * raises its error; on a failure here, frees req and releases hold. */
PyObject *slime_py_request_new(SlimeContextObject *context, slime_status_t posted,
                               slime_req_t *req, slime_py_hold_t *hold);
PyObject *slime_py_wait_all(PyObject *module, PyObject *args, PyObject *kwargs);

/* rpc.c: the RPC types (RpcServer, RpcCall, RpcClient, RpcRequest). */
int slime_py_rpc_init(PyObject *module);

/* batch.c */
PyObject *slime_py_batch(SlimeContextObject *context, PyObject *ops);

/* rdma_check.c: the checks of dlslime_torch.rdma (rdma_check.h), as
 * _C.rdma_check* and _C.RdmaRefusal. */
int slime_py_rdma_init(PyObject *module);

/* rdma.c: the fast path of dlslime_torch.rdma (METH_FASTCALL). */
PyObject *slime_py_rdma_post(SlimeContextObject *context, PyObject *const *args,
                             Py_ssize_t nargs);
PyObject *slime_py_rdma_batch(SlimeContextObject *context, PyObject *const *args,
                              Py_ssize_t nargs);

/* Wall-clock budget of one GIL-free wait slice, so that Ctrl-C and other
 * signals are seen during long waits. */
#define SLIME_PY_WAIT_SLICE_MS 200

#endif /* SLIME_PY_H */
