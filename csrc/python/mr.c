/*
 * mr.c - _C.MemoryRegion: a registered slime_mr_t and the memory under it.
 *
 * The region keeps its buffer acquired while registered, so the memory
 * cannot be freed or resized under the C library.  Requests that use the
 * region keep the region object alive and count themselves in
 * pending_uses; dereg() refuses while any is pending, because the C
 * library requires local requests on an MR to complete before it goes.
 */
#include "slime_py.h"

SlimeMemoryRegionObject *slime_py_mr_of(SlimeContextObject *context,
                                        PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &SlimeMemoryRegion_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a MemoryRegion, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    SlimeMemoryRegionObject *mr = (SlimeMemoryRegionObject *)obj;
    if (mr->context != context) {
        PyErr_SetString(PyExc_ValueError,
                        "the MemoryRegion belongs to another Context");
        return NULL;
    }
    if (!mr->mr) {
        slime_py_raise(SLIME_ERR_ACCESS, "the MemoryRegion was deregistered");
        return NULL;
    }
    return mr;
}

/* Deregisters (GIL released: it may wait for remote accesses to drain).
 * On failure the region stays registered and its memory acquired: a leak
 * is safer than memory the library may still touch. */
static slime_status_t mr_deregister(SlimeMemoryRegionObject *self)
{
    slime_mr_t *mr = self->mr;
    if (!mr)
        return SLIME_OK;
    slime_status_t st;
    int counted = slime_py_context_enter_child(self->context);
    Py_BEGIN_ALLOW_THREADS
    st = slime_mr_dereg(mr);
    Py_END_ALLOW_THREADS
    slime_py_context_leave_child(self->context, counted);
    if (st == SLIME_OK) {
        self->mr = NULL;
        slime_py_buf_release(&self->buf);
    }
    return st;
}

static void mr_dealloc(SlimeMemoryRegionObject *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    /* If deregistration fails the view is leaked on purpose: the export
     * stays, so the memory can neither be freed nor resized. */
    if (mr_deregister(self) == SLIME_OK)
        slime_py_buf_release(&self->buf);
    Py_XDECREF(self->context);
    PyErr_Restore(type, value, tb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *mr_dereg(SlimeMemoryRegionObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->pending_uses > 0)
        return slime_py_raise(SLIME_ERR_BUSY,
                              "requests that use this MemoryRegion have not "
                              "completed; wait() on them (or test() until "
                              "True) before dereg()");
    slime_status_t st = mr_deregister(self);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *mr_desc(SlimeMemoryRegionObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->mr)
        return slime_py_raise(SLIME_ERR_ACCESS, "the MemoryRegion was deregistered");
    slime_mr_desc_t desc;
    int counted = slime_py_context_enter_child(self->context);
    slime_status_t st = slime_mr_desc(self->mr, &desc);
    slime_py_context_leave_child(self->context, counted);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    return PyBytes_FromStringAndSize((const char *)desc.bytes, sizeof(desc.bytes));
}

static PyObject *mr_get_addr(SlimeMemoryRegionObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromVoidPtr(self->addr);
}

static PyObject *mr_get_length(SlimeMemoryRegionObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(self->len);
}

static PyObject *mr_get_registered(SlimeMemoryRegionObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->mr != NULL);
}

static PyObject *mr_get_context(SlimeMemoryRegionObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->context);
}

static PyObject *mr_repr(SlimeMemoryRegionObject *self)
{
    return PyUnicode_FromFormat("<dlslime_torch._C.MemoryRegion addr=%p "
                                "length=%zu%s>", self->addr, self->len,
                                self->mr ? "" : " deregistered");
}

static PyMethodDef mr_methods[] = {
    {"desc", (PyCFunction)mr_desc, METH_NOARGS,
     "desc() -> bytes: the 64-byte remote descriptor to give a peer."},
    {"dereg", (PyCFunction)mr_dereg, METH_NOARGS,
     "dereg(): deregisters and lets go of the memory.  Idempotent; also "
     "done when the object is freed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef mr_getset[] = {
    {"addr", (getter)mr_get_addr, NULL, "start address of the region", NULL},
    {"length", (getter)mr_get_length, NULL, "length in bytes", NULL},
    {"registered", (getter)mr_get_registered, NULL, "False after dereg()", NULL},
    {"context", (getter)mr_get_context, NULL, "the owning Context", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeMemoryRegion_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.MemoryRegion",
    .tp_doc = "A registered memory region; made by Context.reg_mr.",
    .tp_basicsize = sizeof(SlimeMemoryRegionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)mr_dealloc,
    .tp_repr = (reprfunc)mr_repr,
    .tp_methods = mr_methods,
    .tp_getset = mr_getset,
};
