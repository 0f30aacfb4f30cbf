/*
 * shared_memory.c - _C.SharedMemory: a block from slime_mem_alloc, which
 * shm peers map, so one-sided ops on regions registered in it are plain
 * memcpy (see csrc/core/shmem.c).
 *
 * It exports a writable 1-D byte buffer (torch.frombuffer, memoryview,
 * numpy).  Every export keeps the object alive, and a MemoryRegion keeps
 * its buffer exported while registered, so the block is freed only when
 * nothing can reach it any more, when the last reference goes.  There is
 * no close(): torch.frombuffer keeps a reference to the object but not
 * an export, so no count could tell that a tensor still points in.
 */
#include "slime_py.h"

typedef struct {
    PyObject_HEAD
    void *addr;                /* NULL once freed */
    size_t len;
} SlimeSharedMemoryObject;

static PyObject *shm_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"nbytes", NULL};
    Py_ssize_t nbytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:SharedMemory", kwlist, &nbytes))
        return NULL;
    if (nbytes <= 0)
        return PyErr_Format(PyExc_ValueError, "SharedMemory: nbytes must be positive, got %zd", nbytes);
    SlimeSharedMemoryObject *self = (SlimeSharedMemoryObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    slime_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = slime_mem_alloc((size_t)nbytes, &self->addr);
    Py_END_ALLOW_THREADS
    if (st != SLIME_OK) {
        Py_DECREF(self);
        return slime_py_raise_last(st);
    }
    self->len = (size_t)nbytes;
    return (PyObject *)self;
}

static void shm_dealloc(SlimeSharedMemoryObject *self)
{
    /* Nothing refers to the block any more: a registered MemoryRegion
     * keeps its buffer, and so this object, alive. */
    if (self->addr)
        (void)slime_mem_free(self->addr);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int shm_getbuffer(SlimeSharedMemoryObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr, (Py_ssize_t)self->len, 0, flags);
}

static PyBufferProcs shm_as_buffer = {
    .bf_getbuffer = (getbufferproc)shm_getbuffer,
};

static PyObject *shm_get_nbytes(SlimeSharedMemoryObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSize_t(self->len);
}

static PyObject *shm_get_address(SlimeSharedMemoryObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromVoidPtr(self->addr);
}

static PyMethodDef shm_methods[] = {
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef shm_getset[] = {
    {"nbytes", (getter)shm_get_nbytes, NULL, "size in bytes", NULL},
    {"address", (getter)shm_get_address, NULL, "start address", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SlimeSharedMemory_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.SharedMemory",
    .tp_basicsize = sizeof(SlimeSharedMemoryObject),
    .tp_dealloc = (destructor)shm_dealloc,
    .tp_as_buffer = &shm_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SharedMemory(nbytes): zeroed memory that shm peers map; one-sided ops "
              "on regions registered in it copy with memcpy instead of syscalls",
    .tp_methods = shm_methods,
    .tp_getset = shm_getset,
    .tp_new = shm_new,
};
