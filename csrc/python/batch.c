/*
 * batch.c - Context.batch(ops): many operations, one slime_batch call,
 * one Request.
 *
 * An op is a tuple whose fields follow the matching Endpoint method,
 *   (OP_SEND | OP_RECV, ep, buf[, tag])
 *   (OP_READ | OP_WRITE, ep, local_mr, local_off, remote_desc, remote_off, length)
 *   (OP_WRITE_IMM, ep, local_mr, local_off, remote_desc, remote_off, length, imm)
 * or a dict with the same fields by name ("op", "ep", "buf", "tag",
 * "local", "local_off", "remote", "remote_off", "length", "imm"); "op" may
 * also be the name "send", "recv", "read", "write" or "write_imm".
 */
#include "slime_py.h"

#include <string.h>

enum field {
    F_EP, F_BUF, F_TAG, F_LOCAL, F_LOCAL_OFF, F_REMOTE, F_REMOTE_OFF,
    F_LENGTH, F_IMM, F_COUNT
};

static const char *const field_names[F_COUNT] = {
    "ep", "buf", "tag", "local", "local_off", "remote", "remote_off",
    "length", "imm",
};

typedef struct {
    slime_op_kind_t kind;
    const char *name;
    int nfields;               /* fields after the op, in tuple order */
    int nrequired;
    enum field fields[8];
} op_layout_t;

static const op_layout_t layouts[] = {
    {SLIME_OP_SEND, "send", 3, 2, {F_EP, F_BUF, F_TAG}},
    {SLIME_OP_RECV, "recv", 3, 2, {F_EP, F_BUF, F_TAG}},
    {SLIME_OP_READ, "read", 6, 6,
     {F_EP, F_LOCAL, F_LOCAL_OFF, F_REMOTE, F_REMOTE_OFF, F_LENGTH}},
    {SLIME_OP_WRITE, "write", 6, 6,
     {F_EP, F_LOCAL, F_LOCAL_OFF, F_REMOTE, F_REMOTE_OFF, F_LENGTH}},
    {SLIME_OP_WRITE_IMM, "write_imm", 7, 7,
     {F_EP, F_LOCAL, F_LOCAL_OFF, F_REMOTE, F_REMOTE_OFF, F_LENGTH, F_IMM}},
};

#define N_LAYOUTS (sizeof(layouts) / sizeof(layouts[0]))

static const op_layout_t *layout_of(PyObject *op, Py_ssize_t index)
{
    if (PyUnicode_Check(op)) {
        const char *name = PyUnicode_AsUTF8(op);
        if (!name)
            return NULL;
        for (size_t i = 0; i < N_LAYOUTS; i++)
            if (strcmp(layouts[i].name, name) == 0)
                return &layouts[i];
    } else if (PyLong_Check(op)) {
        long kind = PyLong_AsLong(op);
        if (kind == -1 && PyErr_Occurred())
            PyErr_Clear();
        for (size_t i = 0; i < N_LAYOUTS; i++)
            if ((long)layouts[i].kind == kind)
                return &layouts[i];
    }
    PyErr_Format(PyExc_ValueError, "batch op %zd: unknown op %R (use OP_SEND, "
                 "OP_RECV, OP_READ, OP_WRITE, OP_WRITE_IMM)", index, op);
    return NULL;
}

/* Fills fields (borrowed) from a tuple or dict; returns the layout. */
static const op_layout_t *op_fields(PyObject *item, Py_ssize_t index,
                                    PyObject *fields[F_COUNT])
{
    memset(fields, 0, sizeof(PyObject *) * F_COUNT);
    const op_layout_t *layout;
    if (PyTuple_Check(item)) {
        Py_ssize_t n = PyTuple_GET_SIZE(item);
        if (n < 1) {
            PyErr_Format(PyExc_ValueError, "batch op %zd is an empty tuple", index);
            return NULL;
        }
        layout = layout_of(PyTuple_GET_ITEM(item, 0), index);
        if (!layout)
            return NULL;
        if (n - 1 < layout->nrequired || n - 1 > layout->nfields) {
            PyErr_Format(PyExc_ValueError, "batch op %zd (%s) takes %d to %d "
                         "fields after the op, got %zd", index, layout->name,
                         layout->nrequired, layout->nfields, n - 1);
            return NULL;
        }
        for (Py_ssize_t i = 1; i < n; i++)
            fields[layout->fields[i - 1]] = PyTuple_GET_ITEM(item, i);
        return layout;
    }
    if (!PyDict_Check(item)) {
        PyErr_Format(PyExc_TypeError, "batch op %zd must be a tuple or dict, "
                     "got %.200s", index, Py_TYPE(item)->tp_name);
        return NULL;
    }
    PyObject *op = PyDict_GetItemString(item, "op");
    if (!op) {
        PyErr_Format(PyExc_ValueError, "batch op %zd: the dict has no 'op'", index);
        return NULL;
    }
    layout = layout_of(op, index);
    if (!layout)
        return NULL;
    Py_ssize_t used = 1;
    for (int i = 0; i < layout->nfields; i++) {
        enum field f = layout->fields[i];
        fields[f] = PyDict_GetItemString(item, field_names[f]);
        if (fields[f])
            used++;
        else if (i < layout->nrequired) {
            PyErr_Format(PyExc_ValueError, "batch op %zd (%s) needs '%s'",
                         index, layout->name, field_names[f]);
            return NULL;
        }
    }
    if (used != PyDict_GET_SIZE(item)) {
        PyErr_Format(PyExc_ValueError, "batch op %zd (%s) has keys that are "
                     "not its fields", index, layout->name);
        return NULL;
    }
    return layout;
}

/* Converts one op into out, keeping what it uses in hold. */
static int op_convert(SlimeContextObject *context, PyObject *item,
                      Py_ssize_t index, slime_py_hold_t *hold, slime_op_t *out)
{
    PyObject *f[F_COUNT];
    const op_layout_t *layout = op_fields(item, index, f);
    if (!layout)
        return -1;
    memset(out, 0, sizeof(*out));
    out->kind = layout->kind;
    out->ep = slime_py_endpoint_of(context, f[F_EP]);
    if (!out->ep)
        return -1;
    if (layout->kind == SLIME_OP_SEND || layout->kind == SLIME_OP_RECV) {
        slime_py_buf_t *buf = slime_py_hold_next_buf(hold);
        if (slime_py_buf_get(f[F_BUF], layout->kind == SLIME_OP_RECV, buf) < 0)
            return -1;
        out->buf = buf->ptr;
        out->len = buf->len;
        if (f[F_TAG] && !slime_py_conv_u64(f[F_TAG], &out->tag))
            return -1;
        return 0;
    }
    SlimeMemoryRegionObject *local = slime_py_mr_of(context, f[F_LOCAL]);
    slime_mr_desc_t desc;
    if (!local || !slime_py_conv_size(f[F_LOCAL_OFF], &out->local_off)
        || !slime_py_conv_desc(f[F_REMOTE], &desc)
        || !slime_py_conv_size(f[F_REMOTE_OFF], &out->remote_off)
        || !slime_py_conv_size(f[F_LENGTH], &out->len)
        || (f[F_IMM] && !slime_py_conv_u32(f[F_IMM], &out->imm)))
        return -1;
    slime_py_hold_add_mr(hold, (PyObject *)local);
    out->local = local->mr;
    out->remote = slime_py_hold_add_desc(hold, &desc);
    return 0;
}

PyObject *slime_py_batch(SlimeContextObject *context, PyObject *ops_obj)
{
    PyObject *ops = PySequence_Fast(ops_obj, "batch() takes a list of ops");
    if (!ops)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    PyObject *result = NULL;
    slime_op_t *c_ops = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*c_ops));
    slime_py_hold_t *hold = slime_py_hold_new((size_t)n);
    if (!c_ops || !hold) {
        if (!c_ops)
            PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (op_convert(context, PySequence_Fast_GET_ITEM(ops, i), i, hold,
                       &c_ops[i]) < 0)
            goto fail;
    if (slime_py_context_begin_call(context, 0) < 0)
        goto fail;
    slime_ctx_t *ctx = context->ctx;
    slime_req_t *req = NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_batch(ctx, c_ops, (size_t)n, &req);
    Py_END_ALLOW_THREADS
    slime_py_context_end_call(context, 0);
    if (st != SLIME_OK) {
        slime_py_raise_last(st);
        goto fail;
    }
    result = slime_py_request_new(context, SLIME_OK, req, hold);
    hold = NULL;
fail:
    slime_py_hold_release(hold);
    PyMem_Free(c_ops);
    Py_DECREF(ops);
    return result;
}
