/*
 * context.c - _C.Context: one slime_ctx_t.
 *
 * The Context is the root of every other object: they all hold a strong
 * reference to it, so the C context is destroyed only after the last of
 * them is gone, or explicitly by close() (after which they fail cleanly
 * with SlimeClosedError, and MRs and requests stay safe to drop).
 */
#include "slime_py.h"

#include <time.h>

#define DEFAULT_TIMEOUT_MS 30000

int slime_py_context_begin_call(SlimeContextObject *self, int blocking)
{
    if (self->state != SLIME_PY_OPEN) {
        slime_py_raise_closed();
        return -1;
    }
    self->users++;
    self->blocking_users += blocking;
    return 0;
}

void slime_py_context_end_call(SlimeContextObject *self, int blocking)
{
    self->users--;
    self->blocking_users -= blocking;
}

/* Lets other threads run (close() among them) for a moment. */
static void pause_without_gil(void)
{
    Py_BEGIN_ALLOW_THREADS
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    Py_END_ALLOW_THREADS
}

void slime_py_context_settle(SlimeContextObject *self)
{
    while (self->state == SLIME_PY_CLOSING)
        pause_without_gil();
}

int slime_py_context_enter_child(SlimeContextObject *self)
{
    slime_py_context_settle(self);
    if (self->state == SLIME_PY_CLOSED)
        return 0;
    self->users++;
    return 1;
}

void slime_py_context_leave_child(SlimeContextObject *self, int counted)
{
    if (counted)
        self->users--;
}

static void release_graveyard(SlimeContextObject *self)
{
    while (self->graveyard) {
        slime_py_hold_t *hold = self->graveyard;
        self->graveyard = hold->next;
        slime_py_hold_release(hold);
    }
}

void slime_py_context_bury(SlimeContextObject *self, slime_py_hold_t *hold)
{
    if (!hold)
        return;
    hold->next = self->graveyard;
    self->graveyard = hold;
}

/* Closes in the two steps described in slime_py.h.  The GIL is released
 * while waiting and while destroying (it joins the progress thread). */
static void context_destroy(SlimeContextObject *self)
{
    slime_py_context_settle(self);   /* another thread was closing it */
    if (self->state == SLIME_PY_CLOSED)
        return;
    slime_ctx_t *ctx = self->ctx;
    /* From here on new calls see a closed context. */
    self->ctx = NULL;
    self->state = SLIME_PY_CLOSING;
    if (self->endpoints)
        PyDict_Clear(self->endpoints);
    /* Waits and tests run in slices of SLIME_PY_WAIT_SLICE_MS, so this
     * takes at most about one slice. */
    while (self->users > 0)
        pause_without_gil();
    Py_BEGIN_ALLOW_THREADS
    slime_ctx_destroy(ctx);
    Py_END_ALLOW_THREADS
    self->state = SLIME_PY_CLOSED;
    release_graveyard(self);
}

PyObject *slime_py_context_endpoint(SlimeContextObject *self, slime_ep_t *ep, int held)
{
    if (self->state != SLIME_PY_OPEN)
        return slime_py_raise_closed(); /* its holds go with the context */
    PyObject *key = PyLong_FromVoidPtr(ep);
    PyObject *ref = key ? PyDict_GetItemWithError(self->endpoints, key) : NULL;
    if (ref) {
        PyObject *alive = PyObject_CallNoArgs(ref);
        if (!alive || alive != Py_None) {
            Py_DECREF(key);
            if (held) /* the object has its own */
                slime_ep_release(ep);
            return alive;
        }
        Py_DECREF(alive);
    } else if (!key || PyErr_Occurred()) {
        Py_XDECREF(key);
        if (held)
            slime_ep_release(ep);
        return NULL;
    }
    if (!held)
        slime_ep_hold(ep);
    /* the object owns that hold: its dealloc gives it back */
    PyObject *obj = slime_py_endpoint_new(self, ep);
    if (!obj)
        goto fail;
    ref = PyWeakref_NewRef(obj, NULL);
    if (!ref || PyDict_SetItem(self->endpoints, key, ref) < 0) {
        Py_XDECREF(ref);
        Py_DECREF(obj);
        goto fail;
    }
    Py_DECREF(ref);
    Py_DECREF(key);
    return obj;
fail:
    Py_DECREF(key);
    return NULL;
}

/* str, or bytes-like for the token; None leaves *out NULL (default). */
static int token_get(PyObject *obj, Py_buffer *view, const void **out,
                     size_t *len)
{
    *out = NULL;
    *len = 0;
    if (obj == Py_None)
        return 0;
    if (PyUnicode_Check(obj)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (!s)
            return -1;
        *out = s;
        *len = (size_t)n;
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        PyErr_SetString(PyExc_TypeError, "token must be bytes, str or None");
        return -1;
    }
    *out = view->buf;
    *len = (size_t)view->len;
    return 0;
}

static int optional_str(PyObject *obj, const char *what, const char **out)
{
    *out = NULL;
    if (obj == Py_None)
        return 0;
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be str or None", what);
        return -1;
    }
    *out = PyUnicode_AsUTF8(obj);
    return *out ? 0 : -1;
}

static PyObject *context_new(PyTypeObject *type, PyObject *args,
                             PyObject *kwargs)
{
    static char *kwlist[] = {"transport", "tcp_host", "tcp_port", "token", NULL};
    PyObject *transport = Py_None, *tcp_host = Py_None, *token = Py_None;
    int tcp_port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOiO:Context", kwlist,
                                     &transport, &tcp_host, &tcp_port, &token))
        return NULL;
    if (tcp_port < 0 || tcp_port > 65535) {
        PyErr_SetString(PyExc_ValueError, "tcp_port must be in [0, 65535]");
        return NULL;
    }
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    Py_buffer token_view = {0};
    if (optional_str(transport, "transport", &opts.transport) < 0
        || optional_str(tcp_host, "tcp_host", &opts.tcp_host) < 0
        || token_get(token, &token_view, &opts.token, &opts.token_len) < 0)
        return NULL;
    opts.tcp_port = (uint16_t)tcp_port;

    SlimeContextObject *self = (SlimeContextObject *)type->tp_alloc(type, 0);
    if (self) {
        self->state = SLIME_PY_CLOSED;   /* until the C context exists */
        self->endpoints = PyDict_New();
    }
    if (!self || !self->endpoints) {
        Py_XDECREF(self);
        if (token_view.obj)
            PyBuffer_Release(&token_view);
        return NULL;
    }
    slime_status_t st;
    slime_ctx_t *ctx = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = slime_ctx_create(&opts, &ctx);
    Py_END_ALLOW_THREADS
    if (token_view.obj)
        PyBuffer_Release(&token_view);
    if (st != SLIME_OK) {
        Py_DECREF(self);
        return slime_py_raise_last(st);
    }
    self->ctx = ctx;
    self->state = SLIME_PY_OPEN;
    return (PyObject *)self;
}

static void context_dealloc(SlimeContextObject *self)
{
    /* Everything that used the context held a reference to it, so no
     * call can be in flight here. */
    context_destroy(self);
    release_graveyard(self);
    Py_XDECREF(self->endpoints);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *context_close(SlimeContextObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->blocking_users > 0)
        return slime_py_raise(SLIME_ERR_BUSY,
                              "another thread is in connect() or accept() on "
                              "this Context; close it when that call has "
                              "returned");
    context_destroy(self);
    Py_RETURN_NONE;
}

static PyObject *context_enter_with(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self);
}

static PyObject *context_exit_with(SlimeContextObject *self, PyObject *args)
{
    (void)args;
    return context_close(self, NULL);
}

static PyObject *context_address(SlimeContextObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->ctx)
        return slime_py_raise_closed();
    char buf[SLIME_ADDRESS_MAX];
    size_t len = sizeof(buf);
    slime_status_t st = slime_ctx_address(self->ctx, buf, &len);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    return PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
}

static PyObject *context_counter(SlimeContextObject *self, PyObject *arg)
{
    if (!self->ctx)
        return slime_py_raise_closed();
    long which = PyLong_AsLong(arg);
    if (which == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(slime_ctx_counter(self->ctx, (slime_counter_t)which));
}

static PyObject *context_connect(SlimeContextObject *self, PyObject *args,
                                 PyObject *kwargs)
{
    static char *kwlist[] = {"addr", "timeout_ms", NULL};
    Py_buffer addr;
    int64_t timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|O&:connect", kwlist,
                                     &addr, slime_py_conv_timeout, &timeout_ms))
        return NULL;
    if (slime_py_context_begin_call(self, 1) < 0) {
        PyBuffer_Release(&addr);
        return NULL;
    }
    slime_ctx_t *ctx = self->ctx;
    slime_ep_t *ep = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_ep_connect(ctx, addr.buf, (size_t)addr.len, timeout_ms, &ep);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self, 1);
    PyBuffer_Release(&addr);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    return slime_py_context_endpoint(self, ep, 1);
}

static PyObject *context_accept(SlimeContextObject *self, PyObject *args,
                                PyObject *kwargs)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    int64_t timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:accept", kwlist,
                                     slime_py_conv_timeout, &timeout_ms))
        return NULL;
    if (slime_py_context_begin_call(self, 1) < 0)
        return NULL;
    slime_ctx_t *ctx = self->ctx;
    slime_ep_t *ep = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_ep_accept(ctx, timeout_ms, &ep);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self, 1);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    return slime_py_context_endpoint(self, ep, 1);
}

static PyObject *context_reg_mr(SlimeContextObject *self, PyObject *args,
                                PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "access", NULL};
    PyObject *buf_obj;
    uint32_t access = SLIME_ACCESS_ALL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O&:reg_mr", kwlist,
                                     &buf_obj, slime_py_conv_u32, &access))
        return NULL;
    if (!self->ctx)
        return slime_py_raise_closed();
    SlimeMemoryRegionObject *mr = (SlimeMemoryRegionObject *)
        SlimeMemoryRegion_Type.tp_alloc(&SlimeMemoryRegion_Type, 0);
    if (!mr)
        return NULL;
    mr->context = (SlimeContextObject *)Py_NewRef(self);
    /* Writable: a region is the destination of local reads and of the
     * peer's writes. */
    if (slime_py_buf_get(buf_obj, 1, &mr->buf) < 0) {
        Py_DECREF(mr);
        return NULL;
    }
    mr->addr = mr->buf.ptr;
    mr->len = mr->buf.len;
    if (slime_py_context_begin_call(self, 0) < 0) {
        Py_DECREF(mr);
        return NULL;
    }
    slime_ctx_t *ctx = self->ctx;
    slime_mr_t *out = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_mr_reg(ctx, mr->addr, mr->len, access, &out);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self, 0);
    if (st != SLIME_OK) {
        Py_DECREF(mr);
        return slime_py_raise_last(st);
    }
    mr->mr = out;
    return (PyObject *)mr;
}

static PyObject *context_recv_any(SlimeContextObject *self, PyObject *args,
                                  PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "tag", NULL};
    PyObject *buf_obj;
    uint64_t tag = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O&:recv_any", kwlist,
                                     &buf_obj, slime_py_conv_u64, &tag))
        return NULL;
    slime_py_hold_t *hold = slime_py_hold_new(1);
    if (!hold)
        return NULL;
    slime_py_buf_t *buf = slime_py_hold_next_buf(hold);
    if (slime_py_buf_get(buf_obj, 1, buf) < 0
        || slime_py_context_begin_call(self, 0) < 0) {
        slime_py_hold_release(hold);
        return NULL;
    }
    slime_ctx_t *ctx = self->ctx;
    slime_req_t *req = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_recv_any(ctx, buf->ptr, buf->len, tag, &req);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self, 0);
    return slime_py_request_new(self, st, req, hold);
}

static PyObject *context_batch(SlimeContextObject *self, PyObject *ops)
{
    return slime_py_batch(self, ops);
}

static PyObject *context_get_id(SlimeContextObject *self, void *Py_UNUSED(closure))
{
    if (!self->ctx)
        return slime_py_raise_closed();
    return PyLong_FromUnsignedLongLong(slime_ctx_id(self->ctx));
}

/* The C pointer as an int, so that other extensions in this process (the
 * torch shim) use this very context rather than a second core. */
static PyObject *context_get_handle(SlimeContextObject *self, void *Py_UNUSED(closure))
{
    if (!self->ctx)
        return slime_py_raise_closed();
    return PyLong_FromVoidPtr(self->ctx);
}

static PyObject *context_get_closed(SlimeContextObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->ctx == NULL);
}

static PyObject *context_repr(SlimeContextObject *self)
{
    if (!self->ctx)
        return PyUnicode_FromString("<dlslime_torch._C.Context closed>");
    /* PyUnicode_FromFormat has no %llx. */
    char id[24];
    PyOS_snprintf(id, sizeof(id), "%016llx",
                  (unsigned long long)slime_ctx_id(self->ctx));
    return PyUnicode_FromFormat("<dlslime_torch._C.Context id=0x%s>", id);
}

static PyMethodDef context_methods[] = {
    {"address", (PyCFunction)context_address, METH_NOARGS,
     "address() -> bytes: the blob peers pass to connect()."},
    {"counter", (PyCFunction)context_counter, METH_O,
     "counter(which) -> the context's count (COUNTER_*: registrations of "
     "send/recv buffers, and those reused; pings to silent peers; tcp "
     "rendezvous fetched by CMA; eager messages copied because they came "
     "before their receive)"},
    {"connect", (PyCFunction)(void (*)(void))context_connect,
     METH_VARARGS | METH_KEYWORDS,
     "connect(addr, timeout_ms=30000) -> Endpoint to the peer of that "
     "address (the existing one if already connected)."},
    {"accept", (PyCFunction)(void (*)(void))context_accept,
     METH_VARARGS | METH_KEYWORDS,
     "accept(timeout_ms=30000) -> the next Endpoint a peer dialed in."},
    {"reg_mr", (PyCFunction)(void (*)(void))context_reg_mr,
     METH_VARARGS | METH_KEYWORDS,
     "reg_mr(buf, access=ACCESS_ALL) -> MemoryRegion.  buf: a writable "
     "buffer or a (ptr, length) tuple."},
    {"recv_any", (PyCFunction)(void (*)(void))context_recv_any,
     METH_VARARGS | METH_KEYWORDS,
     "recv_any(buf, tag=0) -> Request receiving from any endpoint; "
     "Request.ep tells which."},
    {"batch", (PyCFunction)context_batch, METH_O,
     "batch(ops) -> one Request for many operations.  Each op is a tuple "
     "(OP_SEND|OP_RECV, ep, buf[, tag]), (OP_READ|OP_WRITE, ep, local_mr, "
     "local_off, remote_desc, remote_off, length), (OP_WRITE_IMM, ..., imm) "
     "or a dict with keys op, ep, buf, tag, local, local_off, remote, "
     "remote_off, length, imm."},
    {"rdma_post", (PyCFunction)(void (*)(void))slime_py_rdma_post, METH_FASTCALL,
     "rdma_post(op, local, remote, offset, imm, env, ranges) -> Request, or "
     "None (nothing posted) for an op dlslime_torch.rdma checks in Python: "
     "its read, write and write_with_imm on a tensor in a Region (csrc/python/rdma.c)."},
    {"rdma_batch", (PyCFunction)(void (*)(void))slime_py_rdma_batch, METH_FASTCALL,
     "rdma_batch(op, items, env, ranges) -> Request, or None (nothing posted): "
     "the same for batch_read / batch_write of (local, remote, offset) items."},
    {"close", (PyCFunction)context_close, METH_NOARGS,
     "close(): destroys the context; pending requests fail with "
     "SlimeClosedError.  Idempotent."},
    {"__enter__", context_enter_with, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)context_exit_with, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef context_getset[] = {
    {"id", (getter)context_get_id, NULL, "the context's random 64-bit id", NULL},
    {"closed", (getter)context_get_closed, NULL, "True after close()", NULL},
    {"handle", (getter)context_get_handle, NULL,
     "the slime_ctx_t pointer as an int, for extensions in this process; "
     "valid until close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeContext_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.Context",
    .tp_doc = "Context(transport=None, tcp_host=None, tcp_port=0, token=None)\n"
              "\nA libdlslime engine: listeners, progress thread, memory "
              "regions.\ntransport: 'auto', 'shm' or 'tcp' (None: "
              "$DLSLIME_TRANSPORT or auto).",
    .tp_basicsize = sizeof(SlimeContextObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = context_new,
    .tp_dealloc = (destructor)context_dealloc,
    .tp_repr = (reprfunc)context_repr,
    .tp_methods = context_methods,
    .tp_getset = context_getset,
};
