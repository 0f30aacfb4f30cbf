/*
 * rdma.c - Context.rdma_post / Context.rdma_batch: the common case of
 * dlslime_torch.rdma's read, write, write_with_imm and batch items
 * (a plain CPU tensor inside a registered Region, a peer's RemoteTensor,
 * an int offset in elements), checked and posted without Python code.
 *
 * Why: in Python the checks and the op tuples cost about 2.5 us an op,
 * more than the core's post of a small op.  Here they cost a few
 * attribute reads of the tensor.
 *
 * These are a fast path, not a second reference: when an op fails a
 * check, or is a case left to Python (a Region or an unregistered tensor
 * as the local side, a region of this process, zero elements, the long
 * batch item), or the core refuses the post, they return None having
 * posted nothing, and dlslime_torch/rdma/ops.py runs its own checks,
 * which raise the error that names the tensor and the offsets.  So every
 * check here must be at least as strict as the Python one.
 *
 * env (made once per context by ops.py) is a tuple
 *   (job: bytes, context id: int, RemoteTensor, torch.Tensor, endpoints,
 *    endpoint_of)
 * where endpoints maps a peer's context id to its Endpoint, and
 * endpoint_of(peer), for a peer not there or whose endpoint is down,
 * returns the Endpoint to a Peer (connecting) or raises: that error is
 * the caller's, since the Python path would only connect again.
 * ranges is the Region registry's snapshot: a tuple of (start, end,
 * weakref to Region) that local tensors are looked up in.
 */
#include "slime_py.h"

#include <string.h>

/* Attribute and method names, interned once. */
static PyObject *s_desc, *s_owner, *s_dtype, *s_numel, *s_itemsize, *s_job,
    *s_context_id, *s_is_cpu, *s_is_contiguous, *s_data_ptr, *s_mr;

static int intern_names(void)
{
    if (s_mr)
        return 0;
#define INTERN(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return -1;
    INTERN(s_desc, "desc")
    INTERN(s_owner, "owner")
    INTERN(s_dtype, "dtype")
    INTERN(s_numel, "numel")
    INTERN(s_itemsize, "itemsize")
    INTERN(s_job, "job")
    INTERN(s_context_id, "context_id")
    INTERN(s_is_cpu, "is_cpu")
    INTERN(s_is_contiguous, "is_contiguous")
    INTERN(s_data_ptr, "data_ptr")
    INTERN(s_mr, "mr")
#undef INTERN
    return 0;
}

typedef struct {
    PyObject *job;
    uint64_t ctx_id;
    PyTypeObject *remote_type;
    PyTypeObject *tensor_type;
    PyObject *endpoints;
    PyObject *endpoint_of;
} env_t;

/* A remote tensor, decoded once per call however many ops name it. */
typedef struct {
    PyObject *remote;          /* borrowed: identity only */
    PyObject *owner;           /* owned, for endpoint_of */
    PyObject *owner_id;        /* owned: the key in endpoints */
    PyObject *dtype;           /* owned */
    size_t numel;
    size_t itemsize;
    slime_mr_desc_t desc;
    slime_ep_t *ep;            /* NULL until resolved */
} remote_t;

/* A registered range that local tensors may lie in. */
typedef struct {
    uintptr_t start, end;
    PyObject *ref;             /* borrowed from ranges: weakref to Region */
} range_t;

typedef struct {
    SlimeContextObject *context;
    env_t env;
    remote_t *remotes;
    size_t nremotes, cap;
    range_t *ranges;
    Py_ssize_t nranges;        /* -1 until ranges is read */
    PyObject *ranges_obj;
    SlimeMemoryRegionObject *last_mr;   /* the last range hit ... */
    uintptr_t last_start, last_end;     /* ... and its bounds */
} call_t;

static void call_clear(call_t *c)
{
    for (size_t i = 0; i < c->nremotes; i++) {
        Py_DECREF(c->remotes[i].owner);
        Py_DECREF(c->remotes[i].owner_id);
        Py_DECREF(c->remotes[i].dtype);
    }
    PyMem_Free(c->remotes);
    PyMem_Free(c->ranges);
}

/* The check outcomes: an op the fast path posts, one it leaves to
 * Python, and a Python error to raise as it is. */
enum { ACCEPT = 1, DECLINE = 0, RAISE = -1 };

static int call_init(call_t *c, SlimeContextObject *context, PyObject *env,
                     PyObject *ranges)
{
    memset(c, 0, sizeof(*c));
    c->context = context;
    c->nranges = -1;
    c->ranges_obj = ranges;
    if (intern_names() < 0)
        return RAISE;
    if (!PyTuple_Check(env) || PyTuple_GET_SIZE(env) != 6
        || !PyBytes_Check(PyTuple_GET_ITEM(env, 0))
        || !PyType_Check(PyTuple_GET_ITEM(env, 2))
        || !PyType_Check(PyTuple_GET_ITEM(env, 3))
        || !PyDict_Check(PyTuple_GET_ITEM(env, 4))
        || !PyCallable_Check(PyTuple_GET_ITEM(env, 5))) {
        PyErr_SetString(PyExc_TypeError, "env must be (job: bytes, context id, "
                        "RemoteTensor type, Tensor type, endpoints: dict, "
                        "endpoint_of)");
        return RAISE;
    }
    if (!PyTuple_Check(ranges)) {
        PyErr_SetString(PyExc_TypeError, "ranges must be a tuple of "
                        "(start, end, weakref to Region)");
        return RAISE;
    }
    c->env.job = PyTuple_GET_ITEM(env, 0);
    c->env.ctx_id = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(env, 1));
    if (c->env.ctx_id == (uint64_t)-1 && PyErr_Occurred())
        return RAISE;
    c->env.remote_type = (PyTypeObject *)PyTuple_GET_ITEM(env, 2);
    c->env.tensor_type = (PyTypeObject *)PyTuple_GET_ITEM(env, 3);
    c->env.endpoints = PyTuple_GET_ITEM(env, 4);
    c->env.endpoint_of = PyTuple_GET_ITEM(env, 5);
    return ACCEPT;
}

/* A Python error met while checking means "not the common case": the
 * Python path will meet it too and say what is wrong. */
static int decline(void)
{
    PyErr_Clear();
    return DECLINE;
}

/* An exact int >= 0 that fits a size_t (bool and int subclasses are left
 * to Python, which refuses bool). */
static int as_count(PyObject *obj, size_t *out)
{
    if (!PyLong_CheckExact(obj))
        return DECLINE;
    size_t v = PyLong_AsSize_t(obj);
    if (v == (size_t)-1 && PyErr_Occurred())
        return decline();
    *out = v;
    return ACCEPT;
}

static int attr_count(PyObject *obj, PyObject *name, int call, size_t *out)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(obj, name)
                       : PyObject_GetAttr(obj, name);
    if (!v)
        return decline();
    int ok = as_count(v, out);
    Py_DECREF(v);
    return ok;
}

/* The last remote decoded, kept across calls with what it was checked
 * against (the job, the context id, the RemoteTensor type, not the env,
 * which would keep a context alive): a program names the same
 * RemoteTensor (a frozen dataclass) over and over, and decoding it is a
 * third of a small op's checks. */
static struct {
    PyObject *remote, *job, *remote_type;   /* owned */
    uint64_t ctx_id;
    remote_t r;                              /* its references owned */
} last;

/* Appends r to c->remotes, with new references; its index in *out. */
static int remotes_push(call_t *c, const remote_t *r, size_t *out)
{
    if (c->nremotes == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        remote_t *grown = PyMem_Realloc(c->remotes, cap * sizeof(*grown));
        if (!grown) {
            PyErr_NoMemory();
            return RAISE;
        }
        c->remotes = grown;
        c->cap = cap;
    }
    remote_t *slot = &c->remotes[c->nremotes];
    *slot = *r;
    slot->ep = NULL;
    Py_INCREF(slot->owner);
    Py_INCREF(slot->owner_id);
    Py_INCREF(slot->dtype);
    *out = c->nremotes++;
    return ACCEPT;
}

static void remember(call_t *c, PyObject *remote, const remote_t *r)
{
    PyObject *old_remote = last.remote, *old_job = last.job, *old_type = last.remote_type;
    remote_t old = last.r;
    last.remote = Py_NewRef(remote);
    last.job = Py_NewRef(c->env.job);
    last.remote_type = Py_NewRef((PyObject *)c->env.remote_type);
    last.ctx_id = c->env.ctx_id;
    last.r = *r;
    Py_INCREF(r->owner);
    Py_INCREF(r->owner_id);
    Py_INCREF(r->dtype);
    if (old_remote) {   /* last, whole, before code a decref may run */
        Py_DECREF(old.owner);
        Py_DECREF(old.owner_id);
        Py_DECREF(old.dtype);
        Py_DECREF(old_remote);
        Py_DECREF(old_job);
        Py_DECREF(old_type);
    }
}

/* Decodes remote (once per call, or not at all when it is the last one)
 * and checks what the Python path checks of a descriptor alone: its
 * type, its job, its length, and that it is a peer's (this process's
 * regions are served by a copy in Python). */
static int remote_of(call_t *c, PyObject *remote, size_t *out)
{
    for (size_t i = c->nremotes; i-- > 0;)
        if (c->remotes[i].remote == remote) {
            *out = i;
            return ACCEPT;
        }
    if (remote == last.remote && c->env.job == last.job && c->env.ctx_id == last.ctx_id
        && (PyObject *)c->env.remote_type == last.remote_type)
        return remotes_push(c, &last.r, out);
    if (!PyObject_TypeCheck(remote, c->env.remote_type))
        return DECLINE;
    remote_t r = {.remote = remote};
    int ok = DECLINE;
    PyObject *desc = PyObject_GetAttr(remote, s_desc);
    PyObject *owner = desc ? PyObject_GetAttr(remote, s_owner) : NULL;
    PyObject *job = owner ? PyObject_GetAttr(owner, s_job) : NULL;
    PyObject *owner_id = job ? PyObject_GetAttr(owner, s_context_id) : NULL;
    PyObject *dtype = owner_id ? PyObject_GetAttr(remote, s_dtype) : NULL;
    size_t id;
    if (!dtype) {
        ok = decline();
    } else if (PyBytes_CheckExact(desc)
               && PyBytes_GET_SIZE(desc) == (Py_ssize_t)sizeof(r.desc.bytes)
               && PyBytes_CheckExact(job)
               && PyObject_RichCompareBool(job, c->env.job, Py_EQ) == 1
               && as_count(owner_id, &id) == ACCEPT
               && (uint64_t)id != c->env.ctx_id
               && attr_count(remote, s_numel, 0, &r.numel) == ACCEPT
               && attr_count(dtype, s_itemsize, 0, &r.itemsize) == ACCEPT
               && r.itemsize > 0) {
        memcpy(r.desc.bytes, PyBytes_AS_STRING(desc), sizeof(r.desc.bytes));
        r.owner = owner;
        r.owner_id = owner_id;
        r.dtype = dtype;
        ok = remotes_push(c, &r, out);
        if (ok == ACCEPT)
            remember(c, remote, &r);
    } else if (PyErr_Occurred()) {   /* from the comparison of the jobs */
        ok = decline();
    }
    Py_XDECREF(desc);
    Py_XDECREF(owner);
    Py_XDECREF(job);
    Py_XDECREF(owner_id);
    Py_XDECREF(dtype);
    return ok;
}

static int read_ranges(call_t *c)
{
    Py_ssize_t n = PyTuple_GET_SIZE(c->ranges_obj);
    c->ranges = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*c->ranges));
    if (!c->ranges) {
        PyErr_NoMemory();
        return RAISE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(c->ranges_obj, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3)
            return DECLINE;
        range_t *r = &c->ranges[i];
        size_t start, end;
        if (as_count(PyTuple_GET_ITEM(t, 0), &start) != ACCEPT
            || as_count(PyTuple_GET_ITEM(t, 1), &end) != ACCEPT
            || !PyWeakref_Check(PyTuple_GET_ITEM(t, 2)))
            return decline();
        r->start = start;
        r->end = end;
        r->ref = PyTuple_GET_ITEM(t, 2);
    }
    c->nranges = n;
    return ACCEPT;
}

/* The registered MemoryRegion of this context holding [ptr, ptr + len),
 * first in ranges' order as in region.containing(), added to hold (which
 * keeps it alive whatever code runs later); DECLINE if none (Python
 * registers such a tensor for the call). */
static int local_mr(call_t *c, uintptr_t ptr, size_t len, slime_py_hold_t *hold,
                    SlimeMemoryRegionObject **out)
{
    if (c->last_mr && c->last_start <= ptr && ptr + len <= c->last_end) {
        slime_py_hold_add_mr(hold, (PyObject *)c->last_mr);
        *out = c->last_mr;
        return ACCEPT;
    }
    if (c->nranges < 0) {
        int ok = read_ranges(c);
        if (ok != ACCEPT)
            return ok;
    }
    for (Py_ssize_t i = 0; i < c->nranges; i++) {
        range_t *r = &c->ranges[i];
        if (!(r->start <= ptr && ptr + len <= r->end))
            continue;
        PyObject *region = PyWeakref_GetObject(r->ref);   /* borrowed */
        if (region == Py_None)
            continue;
        PyObject *mr = PyObject_GetAttr(region, s_mr);
        if (!mr)
            return decline();
        SlimeMemoryRegionObject *m = (SlimeMemoryRegionObject *)mr;
        if (PyObject_TypeCheck(mr, &SlimeMemoryRegion_Type)
            && m->context == c->context && m->mr) {
            slime_py_hold_add_mr(hold, mr);
            Py_DECREF(mr);
            c->last_mr = m;
            c->last_start = r->start;
            c->last_end = r->end;
            *out = m;
            return ACCEPT;
        }
        Py_DECREF(mr);
    }
    return DECLINE;
}

/* Checks one op (local tensor, remote, offset in remote elements) as
 * _Op in ops.py does and fills out but its endpoint and descriptor;
 * *remote_out is the index of the decoded remote in c->remotes.  The
 * local MemoryRegion goes into hold. */
static int op_check(call_t *c, slime_op_kind_t kind, PyObject *local,
                    PyObject *remote, PyObject *offset_obj, slime_py_hold_t *hold,
                    size_t *remote_out, slime_op_t *out)
{
    if (!PyObject_TypeCheck(local, c->env.tensor_type))
        return DECLINE;
    size_t index, offset, numel, ptr;
    int ok = remote_of(c, remote, &index);
    if (ok != ACCEPT)
        return ok;
    remote_t *r = &c->remotes[index];
    if (as_count(offset_obj, &offset) != ACCEPT)
        return DECLINE;
    PyObject *v = PyObject_GetAttr(local, s_is_cpu);
    if (v != Py_True) {
        Py_XDECREF(v);
        return decline();
    }
    Py_DECREF(v);
    v = PyObject_GetAttr(local, s_dtype);
    if (v != r->dtype) {   /* torch dtypes are singletons */
        Py_XDECREF(v);
        return decline();
    }
    Py_DECREF(v);
    v = PyObject_CallMethodNoArgs(local, s_is_contiguous);
    if (v != Py_True) {
        Py_XDECREF(v);
        return decline();
    }
    Py_DECREF(v);
    if (attr_count(local, s_numel, 1, &numel) != ACCEPT
        || attr_count(local, s_data_ptr, 1, &ptr) != ACCEPT)
        return DECLINE;
    if (numel == 0 || offset > r->numel || numel > r->numel - offset)
        return DECLINE;
    SlimeMemoryRegionObject *mr;
    size_t len = numel * r->itemsize;
    if ((ok = local_mr(c, (uintptr_t)ptr, len, hold, &mr)) != ACCEPT)
        return ok;
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->local = mr->mr;
    out->local_off = (uintptr_t)ptr - (uintptr_t)mr->addr;
    out->remote_off = offset * r->itemsize;
    out->len = len;
    *remote_out = index;
    return ACCEPT;
}

/* The endpoint of r's owner: the one in endpoints while it is up, else
 * endpoint_of's. */
static slime_ep_t *endpoint_of(call_t *c, remote_t *r)
{
    if (r->ep)
        return r->ep;
    PyObject *known = PyDict_GetItemWithError(c->env.endpoints, r->owner_id);
    if (known && PyObject_TypeCheck(known, &SlimeEndpoint_Type)
        && ((SlimeEndpointObject *)known)->context == c->context && c->context->ctx
        && slime_ep_status(((SlimeEndpointObject *)known)->ep) == SLIME_OK)
        return r->ep = ((SlimeEndpointObject *)known)->ep;
    if (PyErr_Occurred())
        return NULL;
    PyObject *ep = PyObject_CallOneArg(c->env.endpoint_of, r->owner);
    if (!ep)
        return NULL;
    r->ep = slime_py_endpoint_of(c->context, ep);
    Py_DECREF(ep);
    return r->ep;
}

static int as_opcode(PyObject *obj, slime_op_kind_t *kind)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred())
        return RAISE;
    if (v != SLIME_OP_READ && v != SLIME_OP_WRITE && v != SLIME_OP_WRITE_IMM) {
        PyErr_Format(PyExc_ValueError, "op must be OP_READ, OP_WRITE or "
                     "OP_WRITE_IMM, got %ld", v);
        return RAISE;
    }
    *kind = (slime_op_kind_t)v;
    return ACCEPT;
}

/* Posts ops[0..n) (one op alone, or a batch) with the GIL released; on
 * success the Request, else None (nothing posted: the Python path will
 * report the core's refusal). */
static PyObject *post(call_t *c, slime_op_t *ops, size_t n, slime_py_hold_t *hold)
{
    if (slime_py_context_begin_call(c->context, 0) < 0) {
        slime_py_hold_release(hold);
        return NULL;
    }
    slime_req_t *req = NULL;
    slime_status_t st;
    slime_op_t *op = &ops[0];
    Py_BEGIN_ALLOW_THREADS
    if (n > 1)
        st = slime_batch(c->context->ctx, ops, n, &req);
    else if (op->kind == SLIME_OP_READ)
        st = slime_read(op->ep, op->local, op->local_off, op->remote,
                        op->remote_off, op->len, &req);
    else if (op->kind == SLIME_OP_WRITE)
        st = slime_write(op->ep, op->local, op->local_off, op->remote,
                         op->remote_off, op->len, &req);
    else
        st = slime_write_imm(op->ep, op->local, op->local_off, op->remote,
                             op->remote_off, op->len, op->imm, &req);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(c->context, 0);
    if (st != SLIME_OK) {
        slime_py_hold_release(hold);
        Py_RETURN_NONE;
    }
    return slime_py_request_new(c->context, SLIME_OK, req, hold);
}

/* rdma_post(op, local, remote, offset, imm, env, ranges) */
PyObject *slime_py_rdma_post(SlimeContextObject *context, PyObject *const *args,
                             Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "rdma_post(op, local, remote, offset, "
                        "imm, env, ranges) takes 7 arguments");
        return NULL;
    }
    slime_op_kind_t kind;
    call_t c;
    if (as_opcode(args[0], &kind) != ACCEPT
        || call_init(&c, context, args[5], args[6]) != ACCEPT)
        return NULL;
    PyObject *result = NULL;
    slime_op_t op;
    size_t r;
    slime_py_hold_t *hold = slime_py_hold_new(1);
    int ok = hold ? op_check(&c, kind, args[1], args[2], args[3], hold, &r, &op)
                  : RAISE;
    if (ok == ACCEPT && kind == SLIME_OP_WRITE_IMM) {
        size_t imm = 0;
        ok = as_count(args[4], &imm);
        if (ok == ACCEPT && imm > UINT32_MAX)
            ok = DECLINE;
        op.imm = (uint32_t)imm;
    }
    if (ok == DECLINE)
        result = Py_NewRef(Py_None);
    if (ok != ACCEPT || !(op.ep = endpoint_of(&c, &c.remotes[r]))) {
        slime_py_hold_release(hold);
        goto out;
    }
    op.remote = slime_py_hold_add_desc(hold, &c.remotes[r].desc);
    result = post(&c, &op, 1, hold);
out:
    call_clear(&c);
    return result;
}

/* rdma_batch(op, items, env, ranges): items are (local, remote, offset). */
PyObject *slime_py_rdma_batch(SlimeContextObject *context, PyObject *const *args,
                              Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "rdma_batch(op, items, env, ranges) "
                        "takes 4 arguments");
        return NULL;
    }
    slime_op_kind_t kind;
    call_t c;
    if (as_opcode(args[0], &kind) != ACCEPT || kind == SLIME_OP_WRITE_IMM) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rdma_batch takes OP_READ or OP_WRITE");
        return NULL;
    }
    if (call_init(&c, context, args[2], args[3]) != ACCEPT)
        return NULL;
    /* a tuple of the items: endpoint_of may run code that changes a list */
    PyObject *items = PySequence_Tuple(args[1]);
    if (!items) {
        call_clear(&c);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *result = NULL;
    slime_op_t *ops = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*ops));
    size_t *remotes = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*remotes));
    slime_py_hold_t *hold = slime_py_hold_new((size_t)n);
    if (!ops || !remotes || !hold) {
        if (!ops || !remotes)
            PyErr_NoMemory();
        goto fail;
    }
    int ok = n ? ACCEPT : DECLINE;   /* Python completes an empty batch */
    for (Py_ssize_t i = 0; i < n && ok == ACCEPT; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3)
            ok = DECLINE;   /* the long form (local offset, length) too */
        else
            ok = op_check(&c, kind, PyTuple_GET_ITEM(item, 0),
                          PyTuple_GET_ITEM(item, 1), PyTuple_GET_ITEM(item, 2),
                          hold, &remotes[i], &ops[i]);
    }
    if (ok == DECLINE)
        result = Py_NewRef(Py_None);
    if (ok != ACCEPT)
        goto fail;
    for (size_t i = 0; i < c.nremotes; i++)
        if (!endpoint_of(&c, &c.remotes[i]))
            goto fail;
    /* one private copy of each descriptor, in the order of c.remotes */
    for (size_t i = 0; i < c.nremotes; i++)
        slime_py_hold_add_desc(hold, &c.remotes[i].desc);
    for (Py_ssize_t i = 0; i < n; i++) {
        ops[i].ep = c.remotes[remotes[i]].ep;
        ops[i].remote = &hold->descs[remotes[i]];
    }
    result = post(&c, ops, (size_t)n, hold);
    hold = NULL;   /* post took it */
fail:
    slime_py_hold_release(hold);
    PyMem_Free(ops);
    PyMem_Free(remotes);
    Py_DECREF(items);
    call_clear(&c);
    return result;
}
