/*
 * endpoint.c - _C.Endpoint: a connection to one peer (slime_ep_t).
 *
 * Endpoints are made by Context.connect / accept only.  The C endpoint
 * belongs to the C context, so every call first checks that the Context
 * is still open.  Each operation returns a Request that keeps the memory
 * it uses acquired until it completes.
 */
#include "slime_py.h"

PyObject *slime_py_endpoint_new(SlimeContextObject *context, slime_ep_t *ep)
{
    SlimeEndpointObject *self = (SlimeEndpointObject *)
        SlimeEndpoint_Type.tp_alloc(&SlimeEndpoint_Type, 0);
    if (!self)
        return NULL;
    self->context = (SlimeContextObject *)Py_NewRef(context);
    self->ep = ep;
    self->peer_id = slime_ep_peer_id(ep);
    self->transport = PyUnicode_FromString(slime_ep_transport(ep));
    if (!self->transport) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

slime_ep_t *slime_py_endpoint_of(SlimeContextObject *context, PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &SlimeEndpoint_Type)) {
        PyErr_Format(PyExc_TypeError, "expected an Endpoint, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    SlimeEndpointObject *ep = (SlimeEndpointObject *)obj;
    if (ep->context != context) {
        PyErr_SetString(PyExc_ValueError,
                        "the Endpoint belongs to another Context");
        return NULL;
    }
    if (!context->ctx) {
        slime_py_raise_closed();
        return NULL;
    }
    return ep->ep;
}

/* Forgets this object in the Context's cache, unless a newer object for
 * the same C endpoint took its place. */
static void forget_in_context(SlimeEndpointObject *self)
{
    PyObject *key = PyLong_FromVoidPtr(self->ep);
    PyObject *ref = key ? PyDict_GetItemWithError(self->context->endpoints, key)
                        : NULL;
    if (ref) {
        PyObject *alive = PyObject_CallNoArgs(ref);
        if (alive == Py_None)
            PyDict_DelItem(self->context->endpoints, key);
        Py_XDECREF(alive);
    }
    Py_XDECREF(key);
    PyErr_Clear();
}

static void endpoint_dealloc(SlimeEndpointObject *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->context) {
        forget_in_context(self);
        /* the hold this object owned; with the context closed, the
         * endpoint went with it */
        if (self->context->ctx && self->ep && !self->lent)
            slime_ep_release(self->ep);
        Py_DECREF(self->context);
    }
    Py_XDECREF(self->transport);
    PyErr_Restore(type, value, tb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Posts a two-sided op: send (writable 0) or recv (writable 1). */
static PyObject *post_message(SlimeEndpointObject *self, PyObject *args,
                              PyObject *kwargs, int is_recv)
{
    static char *kwlist[] = {"buf", "tag", NULL};
    PyObject *buf_obj;
    uint64_t tag = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs,
                                     is_recv ? "O|O&:recv" : "O|O&:send",
                                     kwlist, &buf_obj, slime_py_conv_u64, &tag))
        return NULL;
    slime_py_hold_t *hold = slime_py_hold_new(1);
    if (!hold)
        return NULL;
    slime_py_buf_t *buf = slime_py_hold_next_buf(hold);
    if (slime_py_buf_get(buf_obj, is_recv, buf) < 0
        || slime_py_context_begin_call(self->context, 0) < 0) {
        slime_py_hold_release(hold);
        return NULL;
    }
    slime_req_t *req = NULL;
    slime_status_t st;
    slime_ep_t *ep = self->ep;
    Py_BEGIN_ALLOW_THREADS
    st = is_recv ? slime_recv(ep, buf->ptr, buf->len, tag, &req)
                 : slime_send(ep, buf->ptr, buf->len, tag, &req);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self->context, 0);
    return slime_py_request_new(self->context, st, req, hold);
}

static PyObject *endpoint_send(SlimeEndpointObject *self, PyObject *args,
                               PyObject *kwargs)
{
    return post_message(self, args, kwargs, 0);
}

static PyObject *endpoint_recv(SlimeEndpointObject *self, PyObject *args,
                               PyObject *kwargs)
{
    return post_message(self, args, kwargs, 1);
}

typedef enum { ONE_SIDED_READ, ONE_SIDED_WRITE, ONE_SIDED_WRITE_IMM } one_sided_t;

static PyObject *post_one_sided(SlimeEndpointObject *self, PyObject *args,
                                PyObject *kwargs, one_sided_t kind)
{
    /* PyArg wants exactly one keyword per format unit. */
    static char *kwlist[] = {"local_mr", "local_off", "remote_desc",
                             "remote_off", "length", NULL};
    static char *kwlist_imm[] = {"local_mr", "local_off", "remote_desc",
                                 "remote_off", "length", "imm", NULL};
    static const char *formats[] = {
        "OO&O&O&O&:read", "OO&O&O&O&:write", "OO&O&O&O&O&:write_imm"};
    PyObject *local_obj;
    size_t local_off, remote_off, len;
    slime_mr_desc_t desc;
    uint32_t imm = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, formats[kind],
                                     kind == ONE_SIDED_WRITE_IMM ? kwlist_imm
                                                                 : kwlist,
                                     &local_obj, slime_py_conv_size, &local_off,
                                     slime_py_conv_desc, &desc,
                                     slime_py_conv_size, &remote_off,
                                     slime_py_conv_size, &len,
                                     slime_py_conv_u32, &imm))
        return NULL;
    SlimeMemoryRegionObject *local = slime_py_mr_of(self->context, local_obj);
    if (!local)
        return NULL;
    slime_py_hold_t *hold = slime_py_hold_new(1);
    if (!hold)
        return NULL;
    slime_py_hold_add_mr(hold, (PyObject *)local);
    const slime_mr_desc_t *remote = slime_py_hold_add_desc(hold, &desc);
    if (slime_py_context_begin_call(self->context, 0) < 0) {
        slime_py_hold_release(hold);
        return NULL;
    }
    slime_ep_t *ep = self->ep;
    slime_mr_t *mr = local->mr;
    slime_req_t *req = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    switch (kind) {
    case ONE_SIDED_READ:
        st = slime_read(ep, mr, local_off, remote, remote_off, len, &req);
        break;
    case ONE_SIDED_WRITE:
        st = slime_write(ep, mr, local_off, remote, remote_off, len, &req);
        break;
    default:
        st = slime_write_imm(ep, mr, local_off, remote, remote_off, len, imm,
                             &req);
        break;
    }
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self->context, 0);
    return slime_py_request_new(self->context, st, req, hold);
}

static PyObject *endpoint_read(SlimeEndpointObject *self, PyObject *args,
                               PyObject *kwargs)
{
    return post_one_sided(self, args, kwargs, ONE_SIDED_READ);
}

static PyObject *endpoint_write(SlimeEndpointObject *self, PyObject *args,
                                PyObject *kwargs)
{
    return post_one_sided(self, args, kwargs, ONE_SIDED_WRITE);
}

static PyObject *endpoint_write_imm(SlimeEndpointObject *self, PyObject *args,
                                    PyObject *kwargs)
{
    return post_one_sided(self, args, kwargs, ONE_SIDED_WRITE_IMM);
}

static PyObject *endpoint_imm_recv(SlimeEndpointObject *self,
                                   PyObject *Py_UNUSED(ignored))
{
    if (slime_py_context_begin_call(self->context, 0) < 0)
        return NULL;
    slime_ep_t *ep = self->ep;
    slime_req_t *req = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_imm_recv(ep, &req);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self->context, 0);
    return slime_py_request_new(self->context, st, req, NULL);
}

static PyObject *endpoint_close(SlimeEndpointObject *self,
                                PyObject *Py_UNUSED(ignored))
{
    if (!self->context->ctx)
        Py_RETURN_NONE;   /* the context closed it already */
    if (slime_py_context_begin_call(self->context, 0) < 0)
        return NULL;
    slime_ep_t *ep = self->ep;
    Py_BEGIN_ALLOW_THREADS
    slime_ep_close(ep);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(self->context, 0);
    Py_RETURN_NONE;
}

static PyObject *endpoint_get_transport(SlimeEndpointObject *self,
                                        void *Py_UNUSED(closure))
{
    return Py_NewRef(self->transport);
}

static PyObject *endpoint_get_peer_id(SlimeEndpointObject *self,
                                      void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->peer_id);
}

static PyObject *endpoint_get_status(SlimeEndpointObject *self,
                                     void *Py_UNUSED(closure))
{
    if (!self->context->ctx)
        return PyLong_FromLong(SLIME_ERR_CLOSED);
    return PyLong_FromLong(slime_ep_status(self->ep));
}

/* The C pointer as an int, for the torch shim (see Context.handle). */
static PyObject *endpoint_get_handle(SlimeEndpointObject *self,
                                     void *Py_UNUSED(closure))
{
    if (!self->context->ctx)
        return slime_py_raise_closed();
    /* C code keeps the pointer as long as it likes (the torch backend
     * does): the object's hold is never given back */
    self->lent = 1;
    return PyLong_FromVoidPtr(self->ep);
}

static PyObject *endpoint_get_context(SlimeEndpointObject *self,
                                      void *Py_UNUSED(closure))
{
    return Py_NewRef(self->context);
}

static PyObject *endpoint_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &SlimeEndpoint_Type) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    int same = ((SlimeEndpointObject *)a)->ep == ((SlimeEndpointObject *)b)->ep;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t endpoint_hash(SlimeEndpointObject *self)
{
    /* Low bits of a pointer are alignment zeros; -1 means error. */
    Py_hash_t h = (Py_hash_t)((uintptr_t)self->ep >> 4);
    return h == -1 ? -2 : h;
}

static PyObject *endpoint_repr(SlimeEndpointObject *self)
{
    char peer[24];   /* PyUnicode_FromFormat has no %llx */
    PyOS_snprintf(peer, sizeof(peer), "%016llx", (unsigned long long)self->peer_id);
    return PyUnicode_FromFormat("<dlslime_torch._C.Endpoint %U peer=0x%s>",
                                self->transport, peer);
}

static PyMethodDef endpoint_methods[] = {
    {"send", (PyCFunction)(void (*)(void))endpoint_send,
     METH_VARARGS | METH_KEYWORDS,
     "send(buf, tag=0) -> Request.  buf: a buffer or (ptr, length)."},
    {"recv", (PyCFunction)(void (*)(void))endpoint_recv,
     METH_VARARGS | METH_KEYWORDS,
     "recv(buf, tag=0) -> Request; Request.bytes is the message length."},
    {"read", (PyCFunction)(void (*)(void))endpoint_read,
     METH_VARARGS | METH_KEYWORDS,
     "read(local_mr, local_off, remote_desc, remote_off, length) -> Request"},
    {"write", (PyCFunction)(void (*)(void))endpoint_write,
     METH_VARARGS | METH_KEYWORDS,
     "write(local_mr, local_off, remote_desc, remote_off, length) -> Request"},
    {"write_imm", (PyCFunction)(void (*)(void))endpoint_write_imm,
     METH_VARARGS | METH_KEYWORDS,
     "write_imm(local_mr, local_off, remote_desc, remote_off, length, imm) "
     "-> Request; the peer gets imm from imm_recv()."},
    {"imm_recv", (PyCFunction)endpoint_imm_recv, METH_NOARGS,
     "imm_recv() -> Request; Request.imm is the next immediate value."},
    {"close", (PyCFunction)endpoint_close, METH_NOARGS,
     "close(): pending requests on it fail with SlimeClosedError."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef endpoint_getset[] = {
    {"transport", (getter)endpoint_get_transport, NULL, "'shm' or 'tcp'", NULL},
    {"peer_id", (getter)endpoint_get_peer_id, NULL, "the peer context's id", NULL},
    {"status", (getter)endpoint_get_status, NULL,
     "OK while connected, else the status that closed it", NULL},
    {"context", (getter)endpoint_get_context, NULL, "the owning Context", NULL},
    {"handle", (getter)endpoint_get_handle, NULL,
     "the slime_ep_t pointer as an int, for extensions in this process; "
     "valid until the Context is closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeEndpoint_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.Endpoint",
    .tp_doc = "A connection to one peer; made by Context.connect/accept.",
    .tp_basicsize = sizeof(SlimeEndpointObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)endpoint_dealloc,
    .tp_repr = (reprfunc)endpoint_repr,
    .tp_hash = (hashfunc)endpoint_hash,
    .tp_richcompare = endpoint_richcompare,
    .tp_weaklistoffset = offsetof(SlimeEndpointObject, weakrefs),
    .tp_methods = endpoint_methods,
    .tp_getset = endpoint_getset,
};
