/*
 * request.c - _C.Request: one in-flight operation (slime_req_t), and
 * _C.wait_all.
 *
 * Waits run with the GIL released, in slices of SLIME_PY_WAIT_SLICE_MS so
 * that Ctrl-C interrupts a long wait.  Once the binding sees a request
 * complete it lets go of the memory the request used (its hold).
 *
 * A Request freed while still pending: a receive is canceled; any other
 * operation is detached by slime_req_free and may still copy into its
 * memory, so its hold moves to the Context's graveyard and is released
 * only after the C context is destroyed (close(), or the Context's last
 * reference going away).  That keeps memory alive longer than needed in a
 * rare case instead of letting the library write into freed memory.
 */
#include "slime_py.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TIMEOUT_MS 30000

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* SLIME_INPROGRESS if any request is pending, else the first failure in
 * array order, else SLIME_OK.  Called without the GIL. */
static slime_status_t poll_all(slime_req_t *const *reqs, size_t n)
{
    slime_status_t first = SLIME_OK;
    for (size_t i = 0; i < n; i++) {
        slime_status_t st = slime_req_test(reqs[i]);
        if (st == SLIME_INPROGRESS)
            return SLIME_INPROGRESS;
        if (st != SLIME_OK && first == SLIME_OK)
            first = st;
    }
    return first;
}

/* Counts a GIL-free call on each request's context (see
 * slime_py_context_enter_child); counted[i] remembers which were. */
static void enter_children(SlimeRequestObject *const *objs, size_t n,
                           int *counted)
{
    /* Settle every context first and count them all without letting go
     * of the GIL in between: counting one while waiting for another to
     * close could deadlock two threads closing two contexts. */
    int settled;
    do {
        settled = 1;
        for (size_t i = 0; i < n; i++)
            if (objs[i]->context->state == SLIME_PY_CLOSING) {
                slime_py_context_settle(objs[i]->context);
                settled = 0;
            }
    } while (!settled);
    for (size_t i = 0; i < n; i++)
        counted[i] = slime_py_context_enter_child(objs[i]->context);
}

static void leave_children(SlimeRequestObject *const *objs, size_t n,
                           const int *counted)
{
    for (size_t i = 0; i < n; i++)
        slime_py_context_leave_child(objs[i]->context, counted[i]);
}

/* Waits for all of objs (their C requests in reqs) up to timeout_ms.
 * Returns as poll_all; returns SLIME_INPROGRESS with *interrupted set if
 * a signal handler raised.  Between slices the contexts may close. */
static slime_status_t wait_slices(SlimeRequestObject *const *objs,
                                  slime_req_t *const *reqs, int *counted,
                                  size_t n, int64_t timeout_ms,
                                  int *interrupted)
{
    *interrupted = 0;
    int64_t deadline = monotonic_ms() + timeout_ms;
    for (;;) {
        int64_t remaining = deadline - monotonic_ms();
        if (remaining < 0)
            remaining = 0;
        int64_t slice = remaining < SLIME_PY_WAIT_SLICE_MS
                            ? remaining : SLIME_PY_WAIT_SLICE_MS;
        slime_status_t st;
        enter_children(objs, n, counted);
        Py_BEGIN_ALLOW_THREADS
        st = n == 1 ? slime_req_wait(reqs[0], slice)
                    : slime_req_wait_all(reqs, n, slice);
        /* TIMEOUT means still pending, unless a request itself ended with
         * that status: ask each. */
        if (st == SLIME_ERR_TIMEOUT)
            st = poll_all(reqs, n);
        Py_END_ALLOW_THREADS
        leave_children(objs, n, counted);
        if (st != SLIME_INPROGRESS || remaining <= slice)
            return st;
        if (PyErr_CheckSignals() < 0) {
            *interrupted = 1;
            return SLIME_INPROGRESS;
        }
    }
}

/* Records a final status the first time it is seen and lets go of the
 * request's memory. */
static void observe(SlimeRequestObject *self, slime_status_t st)
{
    slime_py_hold_observe(&self->final, &self->hold, st);
}

/* A malloc'd copy of the request's error text, or NULL.  Copied while
 * counted, and no Python object is made then: that may run arbitrary
 * code (GC, finalizers), which might close() the context and wait for
 * this very call. */
static char *error_copy(SlimeRequestObject *self)
{
    int counted = slime_py_context_enter_child(self->context);
    char *text = strdup(slime_req_error(self->req));
    slime_py_context_leave_child(self->context, counted);
    return text;
}

static PyObject *raise_final(SlimeRequestObject *self)
{
    char *text = error_copy(self);
    slime_py_raise(self->final, text ? text : "(no memory for the detail text)");
    free(text);
    return NULL;
}

/* Frees req; see the file comment for what happens to a pending one. */
static void discard(SlimeContextObject *context, slime_req_t *req,
                    slime_py_hold_t *hold, slime_status_t final)
{
    if (req) {
        int counted = slime_py_context_enter_child(context);
        Py_BEGIN_ALLOW_THREADS
        if (final == SLIME_INPROGRESS) {
            slime_req_cancel(req);   /* SLIME_ERR_BUSY for non-receives */
            final = slime_req_test(req);
        }
        slime_req_free(req);
        Py_END_ALLOW_THREADS
        slime_py_context_leave_child(context, counted);
    }
    if (req && final == SLIME_INPROGRESS)
        slime_py_context_bury(context, hold);
    else
        slime_py_hold_release(hold);
}

PyObject *slime_py_request_new(SlimeContextObject *context, slime_status_t posted,
                               slime_req_t *req, slime_py_hold_t *hold)
{
    if (posted != SLIME_OK) { /* nothing was posted: nothing to hold */
        if (hold)
            slime_py_hold_release(hold);
        return slime_py_raise_last(posted);
    }
    SlimeRequestObject *self = (SlimeRequestObject *)
        SlimeRequest_Type.tp_alloc(&SlimeRequest_Type, 0);
    if (!self) {
        discard(context, req, hold, SLIME_INPROGRESS);
        return NULL;
    }
    self->context = (SlimeContextObject *)Py_NewRef(context);
    self->req = req;
    self->final = SLIME_INPROGRESS;
    self->hold = hold;
    return (PyObject *)self;
}

static void request_dealloc(SlimeRequestObject *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (self->context)
        discard(self->context, self->req, self->hold, self->final);
    Py_XDECREF(self->context);
    PyErr_Restore(type, value, tb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *request_wait(SlimeRequestObject *self, PyObject *args,
                              PyObject *kwargs)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    int64_t timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:wait", kwlist,
                                     slime_py_conv_timeout, &timeout_ms))
        return NULL;
    if (self->final == SLIME_INPROGRESS) {
        int interrupted, counted;
        slime_status_t st = wait_slices(&self, &self->req, &counted, 1,
                                        timeout_ms, &interrupted);
        if (interrupted)
            return NULL;
        observe(self, st);
    }
    if (self->final == SLIME_INPROGRESS) {
        char detail[128];
        PyOS_snprintf(detail, sizeof(detail),
                      "the request is still pending after %lld ms; wait "
                      "again or cancel() it", (long long)timeout_ms);
        return slime_py_raise(SLIME_ERR_TIMEOUT, detail);
    }
    if (self->final != SLIME_OK)
        return raise_final(self);
    return Py_NewRef(self);
}

/* Drives progress once and records the completion if it happened. */
static void refresh(SlimeRequestObject *self)
{
    if (self->final != SLIME_INPROGRESS)
        return;
    slime_status_t st;
    slime_req_t *req = self->req;
    int counted = slime_py_context_enter_child(self->context);
    Py_BEGIN_ALLOW_THREADS
    st = slime_req_test(req);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(self->context, counted);
    observe(self, st);
}

static PyObject *request_test(SlimeRequestObject *self, PyObject *Py_UNUSED(ignored))
{
    refresh(self);
    if (self->final == SLIME_INPROGRESS)
        Py_RETURN_FALSE;
    if (self->final != SLIME_OK)
        return raise_final(self);
    Py_RETURN_TRUE;
}

static PyObject *request_cancel(SlimeRequestObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->final != SLIME_INPROGRESS)
        Py_RETURN_FALSE;
    slime_status_t st;
    slime_req_t *req = self->req;
    int counted = slime_py_context_enter_child(self->context);
    Py_BEGIN_ALLOW_THREADS
    st = slime_req_cancel(req);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(self->context, counted);
    if (st == SLIME_OK)
        Py_RETURN_TRUE;
    if (st == SLIME_ERR_BUSY)
        Py_RETURN_FALSE;
    return slime_py_raise_last(st);
}

static PyObject *request_get_status(SlimeRequestObject *self, void *Py_UNUSED(closure))
{
    refresh(self);
    return PyLong_FromLong((long)self->final);
}

static PyObject *request_get_bytes(SlimeRequestObject *self, void *Py_UNUSED(closure))
{
    int counted = slime_py_context_enter_child(self->context);
    size_t bytes = slime_req_bytes(self->req);
    slime_py_context_leave_child(self->context, counted);
    return PyLong_FromSize_t(bytes);
}

static PyObject *request_get_imm(SlimeRequestObject *self, void *Py_UNUSED(closure))
{
    int counted = slime_py_context_enter_child(self->context);
    uint32_t imm = slime_req_imm(self->req);
    slime_py_context_leave_child(self->context, counted);
    return PyLong_FromUnsignedLong(imm);
}

static PyObject *request_get_error(SlimeRequestObject *self, void *Py_UNUSED(closure))
{
    char *text = error_copy(self);
    if (!text)
        return PyErr_NoMemory();
    PyObject *str = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text);
    return str;
}

static PyObject *request_get_ep(SlimeRequestObject *self, void *Py_UNUSED(closure))
{
    /* Only while open: the endpoints go with the C context. */
    if (self->final == SLIME_INPROGRESS || !self->context->ctx)
        Py_RETURN_NONE;
    slime_ep_t *ep = slime_req_ep(self->req);
    if (!ep)
        Py_RETURN_NONE;
    return slime_py_context_endpoint(self->context, ep, 0);
}

static PyObject *request_repr(SlimeRequestObject *self)
{
    if (self->final == SLIME_INPROGRESS)
        return PyUnicode_FromString("<dlslime_torch._C.Request pending>");
    return PyUnicode_FromFormat("<dlslime_torch._C.Request %s>",
                                slime_status_name(self->final));
}

PyObject *slime_py_wait_all(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"requests", "timeout_ms", NULL};
    PyObject *seq_obj;
    int64_t timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O&:wait_all", kwlist,
                                     &seq_obj, slime_py_conv_timeout, &timeout_ms))
        return NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "wait_all() takes a list of Requests");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    slime_req_t **reqs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*reqs));
    slime_status_t *each = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*each));
    int *counted = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*counted));
    SlimeRequestObject **objs = (SlimeRequestObject **)items;
    PyObject *result = NULL;
    if (!reqs || !each || !counted) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(items[i], &SlimeRequest_Type)) {
            PyErr_Format(PyExc_TypeError, "wait_all(): item %zd is %.200s, "
                         "not a Request", i, Py_TYPE(items[i])->tp_name);
            goto out;
        }
        reqs[i] = ((SlimeRequestObject *)items[i])->req;
    }
    int interrupted = 0;
    slime_status_t st = n ? wait_slices(objs, reqs, counted, (size_t)n,
                                        timeout_ms, &interrupted)
                          : SLIME_OK;
    if (interrupted)
        goto out;
    /* Learn each request's own status, so that completed ones let go of
     * their memory and the first failure is reported with its text. */
    enter_children(objs, (size_t)n, counted);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        each[i] = slime_req_test(reqs[i]);
    Py_END_ALLOW_THREADS
    leave_children(objs, (size_t)n, counted);
    SlimeRequestObject *failed = NULL;
    Py_ssize_t pending = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        SlimeRequestObject *r = (SlimeRequestObject *)items[i];
        observe(r, each[i]);
        if (r->final == SLIME_INPROGRESS)
            pending++;
        else if (r->final != SLIME_OK && !failed)
            failed = r;
    }
    if (failed) {
        raise_final(failed);
    } else if (st == SLIME_INPROGRESS || pending) {
        char detail[128];
        PyOS_snprintf(detail, sizeof(detail),
                      "%zd of %zd requests still pending after %lld ms",
                      pending, n, (long long)timeout_ms);
        slime_py_raise(SLIME_ERR_TIMEOUT, detail);
    } else {
        result = Py_NewRef(Py_None);
    }
out:
    PyMem_Free(counted);
    PyMem_Free(each);
    PyMem_Free(reqs);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))request_wait,
     METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=30000) -> self.  Raises the request's SlimeError if it "
     "failed, SlimeTimeoutError (request still pending) on timeout."},
    {"test", (PyCFunction)request_test, METH_NOARGS,
     "test() -> bool: True when done, False while pending; raises if it "
     "failed."},
    {"cancel", (PyCFunction)request_cancel, METH_NOARGS,
     "cancel() -> bool: True if the (receive) request will complete as "
     "canceled, False if it cannot be canceled or is done."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"status", (getter)request_get_status, NULL,
     "INPROGRESS or the final status code", NULL},
    {"bytes", (getter)request_get_bytes, NULL, "bytes a receive got", NULL},
    {"imm", (getter)request_get_imm, NULL, "immediate value of an imm_recv", NULL},
    {"error", (getter)request_get_error, NULL,
     "detail text of a failure ('' otherwise)", NULL},
    {"ep", (getter)request_get_ep, NULL,
     "Endpoint a completed receive came from, else None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeRequest_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.Request",
    .tp_doc = "One in-flight operation; returned by every operation.",
    .tp_basicsize = sizeof(SlimeRequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)request_dealloc,
    .tp_repr = (reprfunc)request_repr,
    .tp_methods = request_methods,
    .tp_getset = request_getset,
};
