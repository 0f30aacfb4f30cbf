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
 * The checks are rdma_check.c's, the very ones the checked Python path
 * calls, so the two cannot disagree.  When a check refuses an op, or it
 * is a case left to Python (a Region or an unregistered tensor as the
 * local side, a region of this process, zero elements, the long batch
 * item, an int subclass), or the core refuses the post, these return
 * None having posted nothing, and dlslime_torch/rdma/ops.py takes the
 * checked path, which raises the refusal in words that name the tensor
 * and the offsets, or serves the case.  A Python error met while checking
 * is raised as it is: the checked path would meet the same.
 *
 * env (made once per context by ops.py): see rdma_check.h.  ranges is
 * the Region registry's snapshot: a tuple of (start, end, weakref to
 * Region) that local tensors are looked up in.
 */
#include "rdma_check.h"

#include <string.h>

/* Attribute and method names, interned once. */
static PyObject *s_data_ptr, *s_mr;

static int intern_names(void)
{
    if (s_mr)
        return 0;
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_mr = s_data_ptr ? PyUnicode_InternFromString("mr") : NULL;
    return s_mr ? 0 : -1;
}

/* A registered range that local tensors may lie in. */
typedef struct {
    uintptr_t start, end;
    PyObject *ref;             /* borrowed from ranges: weakref to Region */
} range_t;

typedef struct {
    SlimeContextObject *context;
    slime_py_rdma_checker_t chk;        /* env, and the remotes named */
    range_t *ranges;
    Py_ssize_t nranges;        /* -1 until ranges is read */
    PyObject *ranges_obj;
    SlimeMemoryRegionObject *last_mr;   /* the last range hit ... */
    uintptr_t last_start, last_end;     /* ... and its bounds */
} call_t;

static void call_clear(call_t *c)
{
    slime_py_rdma_checker_clear(&c->chk);
    PyMem_Free(c->ranges);
}

/* The outcomes here: an op the fast path posts, one it leaves to Python,
 * and a Python error to raise as it is. */
enum { ACCEPT = 1, DECLINE = 0, RAISE = -1 };

/* A Python error met while looking up what the checks leave to this
 * file means "not the common case": the Python path will meet it too and
 * say what is wrong. */
static int decline(void)
{
    PyErr_Clear();
    return DECLINE;
}

/* local.data_ptr(), the address of its first element. */
static int data_ptr_of(PyObject *local, size_t *out)
{
    PyObject *v = PyObject_CallMethodNoArgs(local, s_data_ptr);
    if (!v)
        return decline();
    int ok = slime_py_rdma_size_of(v, out) ? ACCEPT : DECLINE;
    Py_DECREF(v);
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
        if (!slime_py_rdma_size_of(PyTuple_GET_ITEM(t, 0), &start)
            || !slime_py_rdma_size_of(PyTuple_GET_ITEM(t, 1), &end)
            || !PyWeakref_Check(PyTuple_GET_ITEM(t, 2)))
            return DECLINE;
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

/* Checks one op (rdma_check.c) and fills out but its endpoint and
 * descriptor; *remote_out is the index of its remote in c->chk.remotes.
 * The local MemoryRegion goes into hold. */
static int op_check(call_t *c, slime_op_kind_t kind, PyObject *local,
                    PyObject *remote, PyObject *offset, PyObject *imm,
                    slime_py_hold_t *hold, size_t *remote_out, slime_op_t *out)
{
    if (!PyObject_TypeCheck(local, c->chk.env.tensor_type))
        return DECLINE;   /* a Region: Python takes its tensor */
    slime_py_rdma_checked_t k;
    int ok = slime_py_rdma_check_op(&c->chk, local, remote, offset, imm, &k);
    if (ok != SLIME_PY_CHECK_PASS)
        return ok == SLIME_PY_CHECK_REFUSED ? decline() : RAISE;
    const slime_py_rdma_remote_t *r = &c->chk.remotes[k.remote];
    size_t ptr;
    if (!k.plain || !r->postable || r->own || k.numel == 0
        || (kind == SLIME_OP_WRITE_IMM && !k.has_imm)
        || data_ptr_of(local, &ptr) != ACCEPT)
        return DECLINE;
    SlimeMemoryRegionObject *mr;
    size_t len = k.numel * r->itemsize;
    if ((ok = local_mr(c, (uintptr_t)ptr, len, hold, &mr)) != ACCEPT)
        return ok;
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->local = mr->mr;
    out->local_off = (uintptr_t)ptr - (uintptr_t)mr->addr;
    out->remote_off = k.offset * r->itemsize;
    out->len = len;
    out->imm = k.imm;
    *remote_out = k.remote;
    return ACCEPT;
}

/* The endpoint of r's owner: the one in endpoints while it is up, else
 * endpoint_of's (connecting), whose error is raised as it is: the checked
 * path would only connect again. */
static slime_ep_t *endpoint_of(call_t *c, slime_py_rdma_remote_t *r)
{
    if (r->ep)
        return r->ep;
    PyObject *known = PyDict_GetItemWithError(c->chk.env.endpoints, r->owner_id);
    if (known && PyObject_TypeCheck(known, &SlimeEndpoint_Type)
        && ((SlimeEndpointObject *)known)->context == c->context && c->context->ctx
        && slime_ep_status(((SlimeEndpointObject *)known)->ep) == SLIME_OK)
        return r->ep = ((SlimeEndpointObject *)known)->ep;
    if (PyErr_Occurred())
        return NULL;
    PyObject *ep = PyObject_CallOneArg(c->chk.env.endpoint_of, r->owner);
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

/* The shape of an entry point, for its prologue. */
typedef struct {
    const char *name, *params;
    Py_ssize_t nargs;          /* env and ranges are the last two */
    int imm;                   /* whether it takes OP_WRITE_IMM */
} entry_t;

static const entry_t POST = {"rdma_post", "(op, local, remote, offset, imm, env, ranges)", 7, 1};
static const entry_t BATCH = {"rdma_batch", "(op, items, env, ranges)", 4, 0};

/* The prologue both entry points share: the argument count, the opcode,
 * env and ranges.  Clear c whatever it returns. */
static int call_begin(call_t *c, SlimeContextObject *context, const entry_t *entry,
                      PyObject *const *args, Py_ssize_t nargs, slime_op_kind_t *kind)
{
    memset(c, 0, sizeof(*c));
    c->context = context;
    c->nranges = -1;
    if (nargs != entry->nargs) {
        PyErr_Format(PyExc_TypeError, "%s%s takes %zd arguments", entry->name,
                     entry->params, entry->nargs);
        return RAISE;
    }
    if (intern_names() < 0 || as_opcode(args[0], kind) != ACCEPT)
        return RAISE;
    if (*kind == SLIME_OP_WRITE_IMM && !entry->imm) {
        PyErr_Format(PyExc_ValueError, "%s takes OP_READ or OP_WRITE", entry->name);
        return RAISE;
    }
    if (slime_py_rdma_checker_init(&c->chk, args[nargs - 2]) != SLIME_PY_CHECK_PASS)
        return RAISE;
    c->ranges_obj = args[nargs - 1];
    if (!PyTuple_Check(c->ranges_obj)) {
        PyErr_SetString(PyExc_TypeError, "ranges must be a tuple of "
                        "(start, end, weakref to Region)");
        return RAISE;
    }
    return ACCEPT;
}

/* rdma_post(op, local, remote, offset, imm, env, ranges) */
PyObject *slime_py_rdma_post(SlimeContextObject *context, PyObject *const *args,
                             Py_ssize_t nargs)
{
    slime_op_kind_t kind;
    call_t c;
    PyObject *result = NULL;
    slime_op_t op;
    size_t r;
    slime_py_hold_t *hold = NULL;
    int ok = call_begin(&c, context, &POST, args, nargs, &kind);
    if (ok == ACCEPT) {
        hold = slime_py_hold_new(1);
        ok = hold ? op_check(&c, kind, args[1], args[2], args[3], args[4], hold, &r, &op)
                  : RAISE;
    }
    if (ok == DECLINE)
        result = Py_NewRef(Py_None);
    if (ok != ACCEPT || !(op.ep = endpoint_of(&c, &c.chk.remotes[r]))) {
        slime_py_hold_release(hold);
        goto out;
    }
    op.remote = slime_py_hold_add_desc(hold, &c.chk.remotes[r].desc);
    result = post(&c, &op, 1, hold);
out:
    call_clear(&c);
    return result;
}

/* Checks items[0..n) (local, remote, offset) into ops, remotes[i] being
 * the index of item i's remote in c->chk.remotes. */
static int batch_check(call_t *c, slime_op_kind_t kind, PyObject *items,
                       slime_py_hold_t *hold, size_t *remotes, slime_op_t *ops)
{
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int ok = n ? ACCEPT : DECLINE;   /* Python completes an empty batch */
    for (Py_ssize_t i = 0; i < n && ok == ACCEPT; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3)
            ok = DECLINE;   /* the long form (local offset, length) too */
        else
            ok = op_check(c, kind, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1),
                          PyTuple_GET_ITEM(item, 2), Py_None, hold, &remotes[i], &ops[i]);
    }
    return ok;
}

/* Resolves the endpoints of c's remotes and posts ops[0..n) on them; takes
 * hold. */
static PyObject *batch_post(call_t *c, slime_op_t *ops, size_t n, const size_t *remotes,
                            slime_py_hold_t *hold)
{
    for (size_t i = 0; i < c->chk.nremotes; i++)
        if (!endpoint_of(c, &c->chk.remotes[i])) {
            slime_py_hold_release(hold);
            return NULL;
        }
    /* one private copy of each descriptor, in the order of c->chk.remotes */
    for (size_t i = 0; i < c->chk.nremotes; i++)
        slime_py_hold_add_desc(hold, &c->chk.remotes[i].desc);
    for (size_t i = 0; i < n; i++) {
        ops[i].ep = c->chk.remotes[remotes[i]].ep;
        ops[i].remote = &hold->descs[remotes[i]];
    }
    return post(c, ops, n, hold);
}

/* rdma_batch(op, items, env, ranges): items are (local, remote, offset). */
PyObject *slime_py_rdma_batch(SlimeContextObject *context, PyObject *const *args,
                              Py_ssize_t nargs)
{
    slime_op_kind_t kind;
    call_t c;
    PyObject *result = NULL, *items = NULL;
    slime_op_t *ops = NULL;
    size_t *remotes = NULL;
    slime_py_hold_t *hold = NULL;
    if (call_begin(&c, context, &BATCH, args, nargs, &kind) != ACCEPT)
        goto out;
    /* a tuple of the items: endpoint_of may run code that changes a list */
    if (!(items = PySequence_Tuple(args[1])))
        goto out;
    size_t n = (size_t)PyTuple_GET_SIZE(items);
    ops = PyMem_Calloc(n ? n : 1, sizeof(*ops));
    remotes = PyMem_Calloc(n ? n : 1, sizeof(*remotes));
    hold = slime_py_hold_new(n);
    if (!ops || !remotes || !hold) {
        if (!ops || !remotes)
            PyErr_NoMemory();
        goto out;
    }
    int ok = batch_check(&c, kind, items, hold, remotes, ops);
    if (ok == DECLINE)
        result = Py_NewRef(Py_None);
    if (ok == ACCEPT) {
        result = batch_post(&c, ops, n, remotes, hold);
        hold = NULL;   /* batch_post took it */
    }
out:
    slime_py_hold_release(hold);
    PyMem_Free(remotes);
    PyMem_Free(ops);
    Py_XDECREF(items);
    call_clear(&c);
    return result;
}
