/*
 * rpc.c - _C.RpcServer, RpcCall, RpcClient, RpcRequest, RpcBuffer: the
 * binding of rpc.h.
 *
 * Lifetimes, on top of slime_py.h's rules:
 *   - RpcCall exports the request payload (buffer protocol, no copy).  If
 *     a view is still exported when the call is finished, the payload's
 *     memory is detached from the server and lives until the RpcCall
 *     object goes, so a view never dangles.
 *   - RpcRequest keeps the payload it sends acquired until it has left
 *     (or, abandoned before that, in the context's graveyard), and
 *     exports the reply (buffer protocol) for as long as it lives.
 *   - RpcBuffer is the in-place reply buffer: commit refuses while a
 *     view of it is exported, so the C memory is never freed under one.
 * Waits run with the GIL released, in slices (Ctrl-C, and close()).
 */
#include "slime_py.h"
#include "codec.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RPC_DEFAULT_TIMEOUT_MS 30000

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int parse_opts(PyObject *slot_size, PyObject *credits, PyObject *max_slots, slime_rpc_opts_t *o)
{
    slime_rpc_opts_init(o);
    if (slot_size && slot_size != Py_None && !slime_py_conv_size(slot_size, &o->slot_size))
        return -1;
    if (credits && credits != Py_None && !slime_py_conv_u32(credits, &o->credits))
        return -1;
    if (max_slots && max_slots != Py_None && !slime_py_conv_u32(max_slots, &o->max_slots))
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* RpcBuffer: memory a call owns, written in place                     */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    void *ptr;                 /* NULL once given back */
    size_t len;
    Py_ssize_t exports;
} RpcBufferObject;

static int rpcbuf_getbuffer(RpcBufferObject *self, Py_buffer *view, int flags)
{
    if (!self->ptr) {
        PyErr_SetString(PyExc_BufferError, "the reply buffer was committed already");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, (Py_ssize_t)self->len, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void rpcbuf_releasebuffer(RpcBufferObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs rpcbuf_as_buffer = {
    .bf_getbuffer = (getbufferproc)rpcbuf_getbuffer,
    .bf_releasebuffer = (releasebufferproc)rpcbuf_releasebuffer,
};

static Py_ssize_t rpcbuf_length(RpcBufferObject *self) { return self->ptr ? (Py_ssize_t)self->len : 0; }

static PySequenceMethods rpcbuf_as_sequence = {.sq_length = (lenfunc)rpcbuf_length};

PyTypeObject SlimeRpcBuffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.RpcBuffer",
    .tp_doc = "Writable memory to build an RPC reply in (RpcCall.reply_buffer).",
    .tp_basicsize = sizeof(RpcBufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &rpcbuf_as_buffer,
    .tp_as_sequence = &rpcbuf_as_sequence,
};

/* ------------------------------------------------------------------ */
/* RpcServer and RpcCall                                               */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    SlimeContextObject *context;
    slime_rpc_server_t *srv;   /* NULL once closed */
    int nexts;                 /* threads inside next() */
} RpcServerObject;

typedef struct {
    PyObject_HEAD
    RpcServerObject *server;
    slime_rpc_call_t *call;    /* NULL once finished */
    uint64_t method;
    void *data;
    size_t len;
    void *mem;                 /* detached payload memory, freed with us */
    Py_ssize_t exports;
    RpcBufferObject *rbuf;     /* the in-place reply buffer, if any */
} RpcCallObject;

extern PyTypeObject SlimeRpcServer_Type;
extern PyTypeObject SlimeRpcCall_Type;

static PyObject *server_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"context", "port", "digest", "methods", "slot_size", "credits", "max_slots", NULL};
    PyObject *context, *methods, *slot_size = NULL, *credits = NULL, *max_slots = NULL;
    unsigned int port;
    uint64_t digest;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!IO&O|OOO:RpcServer", kwlist, &SlimeContext_Type, &context,
                                     &port, slime_py_conv_u64, &digest, &methods, &slot_size, &credits, &max_slots))
        return NULL;
    if (port > 0xffff)
        return PyErr_Format(PyExc_ValueError, "port %u does not fit in 16 bits", port);
    slime_rpc_opts_t o;
    if (parse_opts(slot_size, credits, max_slots, &o) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(methods, "methods must be a sequence of ints");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *ids = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ids);
    if (!ids) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!slime_py_conv_u64(PySequence_Fast_GET_ITEM(seq, i), &ids[i])) {
            PyMem_Free(ids);
            Py_DECREF(seq);
            return NULL;
        }
    Py_DECREF(seq);
    SlimeContextObject *ctx = (SlimeContextObject *)context;
    if (slime_py_context_begin_call(ctx, 0) < 0) {
        PyMem_Free(ids);
        return NULL;
    }
    slime_rpc_server_t *srv = NULL;
    slime_status_t st = slime_rpc_server_create(ctx->ctx, (uint16_t)port, digest, ids, (size_t)n, &o, &srv);
    slime_py_context_end_call(ctx, 0);
    PyMem_Free(ids);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    RpcServerObject *self = (RpcServerObject *)type->tp_alloc(type, 0);
    if (!self) {
        slime_rpc_server_destroy(srv);
        return NULL;
    }
    self->context = (SlimeContextObject *)Py_NewRef(context);
    self->srv = srv;
    return (PyObject *)self;
}

static void server_close_impl(RpcServerObject *self)
{
    slime_rpc_server_t *srv = self->srv;
    if (!srv)
        return;
    self->srv = NULL; /* new next() calls see it closed */
    /* shutdown wakes the threads in next(); a thread that took srv just
     * before is counted in nexts: destroy waits until none is left */
    int counted = slime_py_context_enter_child(self->context);
    Py_BEGIN_ALLOW_THREADS
    slime_rpc_server_shutdown(srv);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(self->context, counted);
    while (self->nexts > 0) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_BEGIN_ALLOW_THREADS
    slime_rpc_server_destroy(srv);
    Py_END_ALLOW_THREADS
}

static void server_dealloc(RpcServerObject *self)
{
    server_close_impl(self);
    Py_XDECREF(self->context);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *server_close(RpcServerObject *self, PyObject *Py_UNUSED(ignored))
{
    server_close_impl(self);
    Py_RETURN_NONE;
}

static PyObject *server_next(RpcServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:next", kwlist, slime_py_conv_timeout, &timeout_ms))
        return NULL;
    int64_t deadline = now_ms() + timeout_ms;
    slime_rpc_call_t *call = NULL;
    slime_status_t st;
    for (;;) {
        slime_rpc_server_t *srv = self->srv;
        if (!srv)
            return slime_py_raise(SLIME_ERR_CLOSED, "the rpc server is closed");
        if (slime_py_context_begin_call(self->context, 0) < 0)
            return NULL;
        int64_t left = deadline - now_ms();
        int64_t slice = left < 0 ? 0 : left < SLIME_PY_WAIT_SLICE_MS ? left : SLIME_PY_WAIT_SLICE_MS;
        self->nexts++;
        Py_BEGIN_ALLOW_THREADS
        st = slime_rpc_server_next(srv, slice, &call);
        Py_END_ALLOW_THREADS
        self->nexts--;
        slime_py_context_end_call(self->context, 0);
        if (st != SLIME_ERR_TIMEOUT || left <= slice)
            break;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (st == SLIME_ERR_TIMEOUT)
        Py_RETURN_NONE;
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    RpcCallObject *c = PyObject_New(RpcCallObject, &SlimeRpcCall_Type);
    if (!c) {
        const char text[] = "RpcError\0the server is out of memory\0";
        slime_rpc_call_fail(call, text, sizeof text, 1000);
        return NULL;
    }
    c->server = (RpcServerObject *)Py_NewRef(self);
    c->call = call;
    c->method = slime_rpc_call_method(call);
    c->data = (void *)slime_rpc_call_data(call, &c->len);
    c->mem = NULL;
    c->exports = 0;
    c->rbuf = NULL;
    return (PyObject *)c;
}

static PyMethodDef server_methods[] = {
    {"next", (PyCFunction)(void (*)(void))server_next, METH_VARARGS | METH_KEYWORDS,
     "next(timeout_ms=30000) -> RpcCall, or None on timeout.  Raises SlimeClosedError once closed."},
    {"close", (PyCFunction)server_close, METH_NOARGS,
     "close(): stops serving; threads in next() raise SlimeClosedError."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SlimeRpcServer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.RpcServer",
    .tp_doc = "RpcServer(context, port, digest, methods, slot_size=None, credits=None, max_slots=None)",
    .tp_basicsize = sizeof(RpcServerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = server_new,
    .tp_dealloc = (destructor)server_dealloc,
    .tp_methods = server_methods,
};

/* The payload must outlive the call while a view of it is exported. */
static int call_keep_payload(RpcCallObject *self)
{
    if (self->exports == 0 || self->mem)
        return 0;
    void *mem = NULL;
    if (slime_rpc_call_detach(self->call, &mem) != SLIME_OK) {
        slime_py_raise_last(SLIME_ERR_NOMEM);
        return -1;
    }
    self->mem = mem;
    return 0;
}

static int call_check_open(RpcCallObject *self)
{
    if (!self->call) {
        PyErr_SetString(PyExc_RuntimeError, "the rpc call was answered already");
        return -1;
    }
    return 0;
}

/* Acquires each non-NULL object's memory (read-only; writable for the
 * last when last_writable) into a new hold, bufs[i] empty for a NULL one.
 * NULL with a Python error set on failure. */
static slime_py_hold_t *hold_bufs(PyObject *const *objs, size_t n, int last_writable, slime_py_buf_t **bufs)
{
    slime_py_hold_t *hold = slime_py_hold_new(n);
    if (!hold)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        bufs[i] = slime_py_hold_next_buf(hold);
        if (objs[i] && objs[i] != Py_None &&
            slime_py_buf_get(objs[i], last_writable && i == n - 1, bufs[i]) < 0) {
            slime_py_hold_release(hold);
            return NULL;
        }
    }
    return hold;
}

/* Whether buf lies whole in the call's own payload. */
static int in_payload(const RpcCallObject *self, const slime_py_buf_t *buf)
{
    const uint8_t *p = buf->ptr, *d = self->data;
    return self->len && buf->len && p >= d && p <= d + self->len && buf->len <= (size_t)(d + self->len - p);
}

/* A reply whose one part, or whose tail, is a range of the call's own
 * payload (an echo, a slice, a tensor of the arguments returned): the
 * view of it the handler returned (or the codec's pin of the tensor) is
 * let go, as the payload is valid during the call only, so that unless a
 * view of it lives on the range goes back with no copy (a lent payload:
 * in place) and nothing is detached.  Fills p and n with the parts to
 * send; returns the hold that keeps them (the head, and the call when a
 * view lives on: the payload is kept), NULL with an error set when *ok
 * is 0. */
static slime_py_hold_t *hold_payload_range(RpcCallObject *self, PyObject *obj, PyObject *tail, slime_py_hold_t *hold,
                                           slime_py_buf_t **b, const void **p, size_t *n, int *ok)
{
    int part = b[1]->len ? 1 : 0;
    PyObject *in = part ? tail : obj;
    size_t off = (size_t)((const uint8_t *)b[part]->ptr - (const uint8_t *)self->data);
    n[0] = b[0]->len;
    n[1] = b[1]->len;
    slime_py_hold_release(hold);
    if (PyMemoryView_Check(in)) {
        PyObject *r = PyObject_CallMethod(in, "release", NULL);
        if (r)
            Py_DECREF(r);
        else
            PyErr_Clear(); /* a view of it is exported: the payload is kept */
    }
    codec_pin_let_go(in);
    *ok = 0;
    if (self->exports && call_keep_payload(self) < 0)
        return NULL;
    PyObject *objs[2] = {part ? obj : NULL, self->exports ? (PyObject *)self : NULL};
    slime_py_buf_t *bb[2];
    if (!(hold = hold_bufs(objs, 2, 0, bb)))
        return NULL;
    const uint8_t *payload = self->exports ? bb[1]->ptr : self->data;
    p[0] = part ? bb[0]->ptr : payload + off;
    p[1] = part ? payload + off : NULL;
    *ok = 1;
    return hold;
}

/* Sends the answer (kind: 0 reply, 1 fail, 2 commit) and finishes the
 * call; the payload (obj, then tail) is held for the send, and buried if
 * it may still be read. */
static PyObject *call_finish(RpcCallObject *self, int kind, PyObject *obj, PyObject *tail, size_t commit_len,
                             int64_t timeout_ms)
{
    if (call_check_open(self) < 0)
        return NULL;
    slime_py_hold_t *hold = NULL;
    slime_py_buf_t *b[2] = {NULL, NULL};
    if (obj) {
        PyObject *objs[2] = {obj, tail};
        hold = hold_bufs(objs, 2, 0, b);
        if (!hold)
            return NULL;
    }
    const void *p[2] = {obj ? b[0]->ptr : NULL, obj ? b[1]->ptr : NULL};
    size_t n[2] = {obj ? b[0]->len : 0, obj ? b[1]->len : 0};
    if (kind == 0 && obj && in_payload(self, b[n[1] ? 1 : 0])) {
        int ok;
        hold = hold_payload_range(self, obj, tail, hold, b, p, n, &ok);
        if (!ok)
            return NULL;
    }
    if (kind == 2 && self->rbuf && self->rbuf->exports > 0) {
        slime_py_hold_release(hold);
        PyErr_SetString(PyExc_BufferError,
                        "the reply buffer is still exported (release every memoryview of it before commit)");
        return NULL;
    }
    if (call_keep_payload(self) < 0) {
        slime_py_hold_release(hold);
        return NULL;
    }
    slime_rpc_call_t *call = self->call;
    self->call = NULL;
    if (self->rbuf)
        self->rbuf->ptr = NULL; /* the call frees it */
    SlimeContextObject *ctx = self->server->context;
    int counted = slime_py_context_enter_child(ctx);
    if (!counted) {
        slime_rpc_call_drop(call);
        slime_py_hold_release(hold);
        return slime_py_raise_closed();
    }
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 2)
        st = slime_rpc_call_reply_commit(call, commit_len, timeout_ms);
    else if (kind == 1)
        st = slime_rpc_call_fail(call, p[0], n[0], timeout_ms);
    else
        st = slime_rpc_call_reply_parts(call, p[0], n[0], p[1], n[1], timeout_ms);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(ctx, counted);
    if (st == SLIME_ERR_TIMEOUT && hold)
        slime_py_context_bury(ctx, hold);
    else
        slime_py_hold_release(hold);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *call_reply(RpcCallObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"data", "timeout_ms", "tail", NULL};
    PyObject *data, *tail = NULL;
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O&O:reply", kwlist, &data, slime_py_conv_timeout, &timeout_ms,
                                     &tail))
        return NULL;
    return call_finish(self, 0, data, tail, 0, timeout_ms);
}

static PyObject *call_fail(RpcCallObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"data", "timeout_ms", NULL};
    PyObject *data;
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O&:fail", kwlist, &data, slime_py_conv_timeout, &timeout_ms))
        return NULL;
    return call_finish(self, 1, data, NULL, 0, timeout_ms);
}

static PyObject *call_commit(RpcCallObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"length", "timeout_ms", NULL};
    size_t len;
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O&:commit", kwlist, slime_py_conv_size, &len,
                                     slime_py_conv_timeout, &timeout_ms))
        return NULL;
    if (call_check_open(self) < 0)
        return NULL;
    if (!self->rbuf)
        return PyErr_Format(PyExc_RuntimeError, "commit() without reply_buffer()");
    if (len > self->rbuf->len)
        return PyErr_Format(PyExc_ValueError, "commit(%zu) of a %zu-byte reply buffer", len, self->rbuf->len);
    return call_finish(self, 2, NULL, NULL, len, timeout_ms);
}

/* handler(*args, **kwargs) where msg is a default method's request,
 * the tuple (args, kwargs). */
static PyObject *call_handler(PyObject *handler, PyObject *msg)
{
    if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) != 2)
        return PyErr_Format(PyExc_ValueError, "a default method's message holds (args, kwargs), not a %.80s",
                            Py_TYPE(msg)->tp_name);
    PyObject *a = PyTuple_GET_ITEM(msg, 0), *kw = PyTuple_GET_ITEM(msg, 1);
    if (!PyDict_Check(kw))
        return PyErr_Format(PyExc_ValueError, "a default method's message holds its keyword arguments as a dict, "
                            "not a %.80s", Py_TYPE(kw)->tp_name);
    PyObject *t = PyTuple_Check(a) ? Py_NewRef(a) : PySequence_Tuple(a);
    if (!t)
        return NULL;
    PyObject *r = PyObject_Call(handler, t, PyDict_GET_SIZE(kw) ? kw : NULL);
    Py_DECREF(t);
    return r;
}

/* A default method's whole answer in one C call, the common call's path:
 * the request decoded, the handler called, its result encoded and sent
 * (no Python frame per step).  A failure of any step raises here, for
 * the caller to answer with call.fail. */
static PyObject *call_answer(RpcCallObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t timeout_ms;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "answer(handler, pickle_body, unpickle_body, timeout_ms)");
        return NULL;
    }
    if (!slime_py_conv_timeout(args[3], &timeout_ms) || call_check_open(self) < 0)
        return NULL;
    PyObject *dec[2] = {(PyObject *)self, args[2]};
    PyObject *msg = slime_py_codec_decode(NULL, dec, 2);
    if (!msg)
        return NULL;
    PyObject *result = call_handler(args[0], msg);
    /* the arguments' tensors alias the request: gone before the reply,
     * the request's slot need not be replaced (detached) */
    Py_DECREF(msg);
    if (!result)
        return NULL;
    PyObject *enc[2] = {result, args[1]};
    PyObject *parts = slime_py_codec_encode(NULL, enc, 2);
    Py_DECREF(result);
    if (!parts)
        return NULL;
    PyObject *out = call_finish(self, 0, PyTuple_GET_ITEM(parts, 0), PyTuple_GET_ITEM(parts, 1), 0, timeout_ms);
    Py_DECREF(parts);
    return out;
}

static PyObject *call_reply_buffer(RpcCallObject *self, PyObject *args)
{
    size_t cap;
    if (!PyArg_ParseTuple(args, "O&:reply_buffer", slime_py_conv_size, &cap))
        return NULL;
    if (call_check_open(self) < 0)
        return NULL;
    if (self->rbuf)
        return Py_NewRef(self->rbuf);
    void *ptr = NULL;
    slime_status_t st = slime_rpc_call_reply_buffer(self->call, cap, &ptr);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    RpcBufferObject *b = PyObject_New(RpcBufferObject, &SlimeRpcBuffer_Type);
    if (!b)
        return NULL;
    b->ptr = ptr;
    b->len = cap;
    b->exports = 0;
    self->rbuf = b;
    return Py_NewRef(b);
}

static int call_getbuffer(RpcCallObject *self, Py_buffer *view, int flags)
{
    if (!self->call && !self->mem) {
        PyErr_SetString(PyExc_BufferError, "the rpc call was answered: its payload is gone");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, (Py_ssize_t)self->len, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void call_releasebuffer(RpcCallObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs call_as_buffer = {
    .bf_getbuffer = (getbufferproc)call_getbuffer,
    .bf_releasebuffer = (releasebufferproc)call_releasebuffer,
};

static void call_dealloc(RpcCallObject *self)
{
    if (self->call) {
        /* dropped unanswered: the client learns it instead of timing out */
        const char text[] = "RpcError\0the server dropped the call without an answer\0";
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        slime_rpc_call_t *call = self->call;
        self->call = NULL;
        int counted = slime_py_context_enter_child(self->server->context);
        Py_BEGIN_ALLOW_THREADS
        if (counted)
            slime_rpc_call_fail(call, text, sizeof text, 1000);
        else
            slime_rpc_call_drop(call);
        Py_END_ALLOW_THREADS
        slime_py_context_leave_child(self->server->context, counted);
        PyErr_Restore(type, value, tb);
    }
    if (self->rbuf)
        self->rbuf->ptr = NULL;
    Py_XDECREF(self->rbuf);
    slime_rpc_mem_free(self->mem);
    Py_XDECREF(self->server);
    PyObject_Free(self);
}

static PyObject *call_get_method(RpcCallObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->method);
}

static Py_ssize_t call_length(RpcCallObject *self) { return (Py_ssize_t)self->len; }

static PySequenceMethods call_as_sequence = {.sq_length = (lenfunc)call_length};

static PyMethodDef call_methods[] = {
    {"reply", (PyCFunction)(void (*)(void))call_reply, METH_VARARGS | METH_KEYWORDS,
     "reply(data, timeout_ms=30000, tail=None): answers with the bytes of data, then those of tail (sent "
     "from its memory when the reply goes by bulk)."},
    {"answer", (PyCFunction)(void (*)(void))call_answer, METH_FASTCALL,
     "answer(handler, pickle_body, unpickle_body, timeout_ms): a default method's call: decodes the request "
     "(args, kwargs) with the codec, replies with the encoded handler(*args, **kwargs).  Raises what a step "
     "raised (then answer with fail)."},
    {"fail", (PyCFunction)(void (*)(void))call_fail, METH_VARARGS | METH_KEYWORDS,
     "fail(data, timeout_ms=30000): answers with an error payload."},
    {"reply_buffer", (PyCFunction)call_reply_buffer, METH_VARARGS,
     "reply_buffer(cap) -> RpcBuffer to write the reply into; then commit(length)."},
    {"commit", (PyCFunction)(void (*)(void))call_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(length, timeout_ms=30000): sends the first length bytes of the reply buffer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef call_getset[] = {
    {"method", (getter)call_get_method, NULL, "the method id", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeRpcCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.RpcCall",
    .tp_doc = "One request handed out by RpcServer.next(); its payload is its buffer.",
    .tp_basicsize = sizeof(RpcCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)call_dealloc,
    .tp_as_buffer = &call_as_buffer,
    .tp_as_sequence = &call_as_sequence,
    .tp_methods = call_methods,
    .tp_getset = call_getset,
};

/* ------------------------------------------------------------------ */
/* RpcClient and RpcRequest                                            */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    SlimeContextObject *context;
    PyObject *endpoint;
    slime_rpc_client_t *cli;   /* NULL once closed */
} RpcClientObject;

typedef struct {
    PyObject_HEAD
    RpcClientObject *client;
    slime_rpc_req_t *req;
    slime_status_t final;      /* SLIME_INPROGRESS until seen */
    slime_py_hold_t *hold;     /* the payload (and out buffer), until done */
    int has_out;               /* a late reply may still land in the hold's out buffer */
    Py_ssize_t exports;
} RpcRequestObject;

extern PyTypeObject SlimeRpcClient_Type;
extern PyTypeObject SlimeRpcRequest_Type;

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"context", "endpoint", "port", "digest", "timeout_ms", "slot_size", "credits", NULL};
    PyObject *context, *endpoint, *slot_size = NULL, *credits = NULL;
    unsigned int port;
    uint64_t digest;
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OIO&|O&OO:RpcClient", kwlist, &SlimeContext_Type, &context,
                                     &endpoint, &port, slime_py_conv_u64, &digest, slime_py_conv_timeout,
                                     &timeout_ms, &slot_size, &credits))
        return NULL;
    if (port > 0xffff)
        return PyErr_Format(PyExc_ValueError, "port %u does not fit in 16 bits", port);
    slime_rpc_opts_t o;
    if (parse_opts(slot_size, credits, NULL, &o) < 0)
        return NULL;
    SlimeContextObject *ctx = (SlimeContextObject *)context;
    slime_ep_t *ep = slime_py_endpoint_of(ctx, endpoint);
    if (!ep)
        return NULL;
    if (slime_py_context_begin_call(ctx, 1) < 0)
        return NULL;
    slime_rpc_client_t *cli = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_rpc_client_create(ctx->ctx, ep, (uint16_t)port, digest, &o, timeout_ms, &cli);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(ctx, 1);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    RpcClientObject *self = (RpcClientObject *)type->tp_alloc(type, 0);
    if (!self) {
        slime_rpc_client_destroy(cli);
        return NULL;
    }
    self->context = (SlimeContextObject *)Py_NewRef(context);
    self->endpoint = Py_NewRef(endpoint);
    self->cli = cli;
    return (PyObject *)self;
}

static void client_close_impl(RpcClientObject *self)
{
    slime_rpc_client_t *cli = self->cli;
    if (!cli)
        return;
    self->cli = NULL;
    int counted = slime_py_context_enter_child(self->context);
    Py_BEGIN_ALLOW_THREADS
    slime_rpc_client_destroy(cli);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(self->context, counted);
}

static void client_dealloc(RpcClientObject *self)
{
    client_close_impl(self);
    Py_XDECREF(self->endpoint);
    Py_XDECREF(self->context);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_close(RpcClientObject *self, PyObject *Py_UNUSED(ignored))
{
    client_close_impl(self);
    Py_RETURN_NONE;
}

/* Sends objs (data, tail, out: NULL or None for none) as a call of
 * method (flags: SLIME_RPC_CALL_*); the new RpcRequest. */
static PyObject *client_send(RpcClientObject *self, uint64_t method, PyObject *const *objs, uint32_t flags)
{
    if (!self->cli)
        return slime_py_raise(SLIME_ERR_CLOSED, "the rpc client is closed");
    slime_py_buf_t *b[3];
    slime_py_hold_t *hold = hold_bufs(objs, 3, 1, b);
    if (!hold)
        return NULL;
    RpcRequestObject *r = PyObject_New(RpcRequestObject, &SlimeRpcRequest_Type);
    if (!r) {
        slime_py_hold_release(hold);
        return NULL;
    }
    r->client = (RpcClientObject *)Py_NewRef(self);
    r->req = NULL;
    r->final = SLIME_INPROGRESS;
    r->hold = hold;
    r->has_out = b[2]->ptr != NULL;
    r->exports = 0;
    if (slime_py_context_begin_call(self->context, 0) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    slime_rpc_call_args_t a = {.size = sizeof a, .buf = b[0]->ptr, .len = b[0]->len, .tail = b[1]->ptr,
                               .tail_len = b[1]->len, .reply_buf = b[2]->ptr, .reply_cap = b[2]->len,
                               .flags = flags};
    /* short, never blocks: the GIL stays */
    slime_status_t st = slime_rpc_call_args(self->cli, method, &a, &r->req);
    slime_py_context_end_call(self->context, 0);
    if (st != SLIME_OK) {
        PyObject *err = slime_py_raise_last(st);
        Py_DECREF(r);
        return err;
    }
    return (PyObject *)r;
}

static PyObject *client_call(RpcClientObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"method_id", "data", "tail", "out", "lend", NULL};
    uint64_t method;
    PyObject *objs[3] = {NULL, NULL, NULL}; /* data, tail, out */
    int lend = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|OOp:call", kwlist, slime_py_conv_u64, &method, &objs[0],
                                     &objs[1], &objs[2], &lend))
        return NULL;
    return client_send(self, method, objs, lend ? SLIME_RPC_CALL_LEND : 0);
}

/* A default method's call in one C call: (args, kwargs) encoded by the
 * codec and sent, its tail from the tensor's memory. */
static PyObject *client_call_obj(RpcClientObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t method;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "call_obj(method_id, args, kwargs, pickle_body)");
        return NULL;
    }
    if (!slime_py_conv_u64(args[0], &method))
        return NULL;
    PyObject *msg = PyTuple_Pack(2, args[1], args[2]);
    if (!msg)
        return NULL;
    PyObject *enc[2] = {msg, args[3]};
    PyObject *parts = slime_py_codec_encode(NULL, enc, 2);
    Py_DECREF(msg);
    if (!parts)
        return NULL;
    PyObject *objs[3] = {PyTuple_GET_ITEM(parts, 0), PyTuple_GET_ITEM(parts, 1), NULL};
    PyObject *r = client_send(self, method, objs, SLIME_RPC_CALL_LEND);
    Py_DECREF(parts);
    return r;
}

static PyObject *client_lend_stats(RpcClientObject *self, PyObject *Py_UNUSED(ignored))
{
    slime_rpc_lend_stats_t st = {0};
    bool on = self->cli && slime_rpc_client_lend_stats(self->cli, &st);
    return Py_BuildValue("{s:O,s:K,s:K,s:K,s:K}", "on", on ? Py_True : Py_False, "lent",
                         (unsigned long long)st.lent, "in_place", (unsigned long long)st.in_place, "kept",
                         (unsigned long long)st.kept, "blocks", (unsigned long long)st.blocks);
}

static PyMethodDef client_methods[] = {
    {"call", (PyCFunction)(void (*)(void))client_call, METH_VARARGS | METH_KEYWORDS,
     "call(method_id, data, tail=None, out=None, lend=True) -> RpcRequest.  Sends the bytes of data, then those "
     "of tail (sent from its memory when the payload goes by bulk), held until they have left.  out: writable "
     "memory the reply lands in when it fits (RpcRequest.in_out), held until the request is done.  lend: a large "
     "payload may be lent to a server on this host (read in place there; a reply that is a range of it read in "
     "place here)."},
    {"lend_stats", (PyCFunction)client_lend_stats, METH_NOARGS,
     "lend_stats() -> dict: whether this channel lends (on), and requests lent, replies read in place, blocks "
     "the server kept, blocks made."},
    {"call_obj", (PyCFunction)(void (*)(void))client_call_obj, METH_FASTCALL,
     "call_obj(method_id, args, kwargs, pickle_body) -> RpcRequest: a default method's call, (args, kwargs) "
     "encoded by the codec (dlslime_torch.rpc.codec) and sent as call() sends (head, tail)."},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close(): pending requests fail with SlimeClosedError."},
    {NULL, NULL, 0, NULL},
};

static PyObject *client_get_credits(RpcClientObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLong(self->cli ? slime_rpc_client_credits(self->cli) : 0);
}

static PyGetSetDef client_getset[] = {
    {"credits", (getter)client_get_credits, NULL, "credits the server granted", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeRpcClient_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.RpcClient",
    .tp_doc = "RpcClient(context, endpoint, port, digest, timeout_ms=30000, slot_size=None, credits=None)",
    .tp_basicsize = sizeof(RpcClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = client_new,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
};

static void rreq_observe(RpcRequestObject *self, slime_status_t st)
{
    slime_py_hold_observe(&self->final, &self->hold, st);
}

static PyObject *rreq_raise(RpcRequestObject *self)
{
    return slime_py_raise(self->final, slime_rpc_req_error(self->req));
}

/* Frees the C request: a pending one is abandoned (its late reply is
 * dropped); its payload is let go of, or buried if it may still be read
 * (or its out buffer written: a reply arriving by bulk). */
static void rreq_abandon(RpcRequestObject *self)
{
    slime_rpc_req_t *req = self->req;
    if (!req)
        return;
    self->req = NULL;
    SlimeContextObject *ctx = self->client->context;
    int counted = slime_py_context_enter_child(ctx);
    int sent;
    Py_BEGIN_ALLOW_THREADS
    sent = slime_rpc_req_sent(req);
    slime_rpc_req_free(req);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(ctx, counted);
    slime_py_hold_t *hold = self->hold;
    self->hold = NULL;
    if ((sent && !self->has_out) || !counted)
        slime_py_hold_release(hold);
    else
        slime_py_context_bury(ctx, hold);
}

static PyObject *rreq_wait(RpcRequestObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    int64_t timeout_ms = RPC_DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:wait", kwlist, slime_py_conv_timeout, &timeout_ms))
        return NULL;
    if (!self->req)
        return slime_py_raise(SLIME_ERR_CANCELED, "the rpc request was abandoned");
    int64_t deadline = now_ms() + timeout_ms;
    SlimeContextObject *ctx = self->client->context;
    while (self->final == SLIME_INPROGRESS) {
        int64_t left = deadline - now_ms();
        int64_t slice = left < 0 ? 0 : left < SLIME_PY_WAIT_SLICE_MS ? left : SLIME_PY_WAIT_SLICE_MS;
        int counted = slime_py_context_enter_child(ctx);
        if (!counted)
            return slime_py_raise_closed();
        slime_status_t st;
        slime_rpc_req_t *req = self->req;
        Py_BEGIN_ALLOW_THREADS
        st = slime_rpc_req_wait(req, slice);
        if (st == SLIME_ERR_TIMEOUT)
            st = slime_rpc_req_test(req);
        Py_END_ALLOW_THREADS
        slime_py_context_leave_child(ctx, counted);
        rreq_observe(self, st);
        if (self->final != SLIME_INPROGRESS || left <= slice)
            break;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (self->final == SLIME_INPROGRESS) {
        char detail[128];
        PyOS_snprintf(detail, sizeof detail, "rpc call still pending after %lld ms", (long long)timeout_ms);
        return slime_py_raise(SLIME_ERR_TIMEOUT, detail);
    }
    if (self->final != SLIME_OK)
        return rreq_raise(self);
    return PyBool_FromLong(slime_rpc_req_remote_error(self->req));
}

static PyObject *rreq_test(RpcRequestObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->req && self->final == SLIME_INPROGRESS) {
        SlimeContextObject *ctx = self->client->context;
        int counted = slime_py_context_enter_child(ctx);
        if (counted) {
            slime_status_t st = slime_rpc_req_test(self->req);
            rreq_observe(self, st);
        }
        slime_py_context_leave_child(ctx, counted);
    }
    return PyBool_FromLong(self->final != SLIME_INPROGRESS);
}

static PyObject *rreq_abandon_method(RpcRequestObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->exports > 0)
        return PyErr_Format(PyExc_BufferError, "the reply is still exported");
    if (self->final == SLIME_INPROGRESS)
        rreq_abandon(self);
    Py_RETURN_NONE;
}

static int rreq_getbuffer(RpcRequestObject *self, Py_buffer *view, int flags)
{
    if (!self->req || self->final != SLIME_OK) {
        PyErr_SetString(PyExc_BufferError, "the rpc request has no reply (pending, failed or abandoned)");
        view->obj = NULL;
        return -1;
    }
    size_t len = 0;
    void *data = (void *)slime_rpc_req_data(self->req, &len);
    static char empty[1];
    if (PyBuffer_FillInfo(view, (PyObject *)self, data ? data : empty, (Py_ssize_t)len, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void rreq_releasebuffer(RpcRequestObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs rreq_as_buffer = {
    .bf_getbuffer = (getbufferproc)rreq_getbuffer,
    .bf_releasebuffer = (releasebufferproc)rreq_releasebuffer,
};

static void rreq_dealloc(RpcRequestObject *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (self->req && self->client) {
        if (self->final == SLIME_INPROGRESS) {
            rreq_abandon(self);
        } else {
            slime_rpc_req_free(self->req); /* final: touches no context */
            self->req = NULL;
        }
    }
    slime_py_hold_release(self->hold);
    Py_XDECREF(self->client);
    PyErr_Restore(type, value, tb);
    PyObject_Free(self);
}

static PyObject *rreq_get_done(RpcRequestObject *self, void *Py_UNUSED(closure))
{
    return rreq_test(self, NULL);
}

static PyObject *rreq_get_remote_error(RpcRequestObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->req && self->final == SLIME_OK && slime_rpc_req_remote_error(self->req));
}

static PyObject *rreq_get_in_out(RpcRequestObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->req && self->final == SLIME_OK && slime_rpc_req_in_reply_buf(self->req));
}

static PyObject *rreq_get_status(RpcRequestObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong((long)self->final);
}

static PyObject *rreq_get_error(RpcRequestObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_DecodeUTF8(self->req ? slime_rpc_req_error(self->req) : "abandoned",
                                (Py_ssize_t)strlen(self->req ? slime_rpc_req_error(self->req) : "abandoned"),
                                "replace");
}

static PyMethodDef rreq_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))rreq_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=30000) -> bool remote_error.  Raises SlimeTimeoutError (still pending), "
     "SlimePeerLostError (the server is gone), SlimeClosedError."},
    {"test", (PyCFunction)rreq_test, METH_NOARGS, "test() -> bool: done (drives the channel once)."},
    {"abandon", (PyCFunction)rreq_abandon_method, METH_NOARGS,
     "abandon(): gives up on a pending call; its late reply is dropped."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rreq_getset[] = {
    {"done", (getter)rreq_get_done, NULL, "whether it completed", NULL},
    {"remote_error", (getter)rreq_get_remote_error, NULL, "the reply is an error payload", NULL},
    {"status", (getter)rreq_get_status, NULL, "INPROGRESS or the final status", NULL},
    {"in_out", (getter)rreq_get_in_out, NULL, "the reply landed in the call's out buffer", NULL},
    {"error", (getter)rreq_get_error, NULL, "detail of a failure", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeRpcRequest_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.RpcRequest",
    .tp_doc = "One call in flight (RpcClient.call); once done, its buffer is the reply.",
    .tp_basicsize = sizeof(RpcRequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)rreq_dealloc,
    .tp_as_buffer = &rreq_as_buffer,
    .tp_methods = rreq_methods,
    .tp_getset = rreq_getset,
};

int slime_py_rpc_init(PyObject *module)
{
    PyTypeObject *types[] = {&SlimeRpcServer_Type, &SlimeRpcCall_Type, &SlimeRpcClient_Type,
                             &SlimeRpcRequest_Type, &SlimeRpcBuffer_Type};
    const char *names[] = {"RpcServer", "RpcCall", "RpcClient", "RpcRequest", "RpcBuffer"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(module, names[i], (PyObject *)types[i]) < 0)
            return -1;
    if (PyModule_AddIntConstant(module, "RPC_VERSION", SLIME_RPC_VERSION) < 0 ||
        PyModule_AddIntConstant(module, "RPC_SLOT_MIN", SLIME_RPC_SLOT_MIN) < 0)
        return -1;
    return 0;
}
