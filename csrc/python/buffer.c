/* buffer.c - see buffer.h. */
#include "buffer.h"

#include <stdint.h>
#include <string.h>

static int raw_pair_get(PyObject *pair, slime_py_buf_t *out)
{
    if (PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "a raw buffer is a (ptr, length) tuple of two ints");
        return -1;
    }
    PyObject *ptr_obj = PyNumber_Index(PyTuple_GET_ITEM(pair, 0));
    if (!ptr_obj)
        return -1;
    unsigned long long ptr = PyLong_AsUnsignedLongLong(ptr_obj);
    Py_DECREF(ptr_obj);
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError,
                            "raw buffer ptr must be a non-negative address");
        }
        return -1;
    }
    Py_ssize_t len = PyNumber_AsSsize_t(PyTuple_GET_ITEM(pair, 1),
                                        PyExc_ValueError);
    if (len == -1 && PyErr_Occurred())
        return -1;
    if (len < 0) {
        PyErr_SetString(PyExc_ValueError, "raw buffer length must be >= 0");
        return -1;
    }
    if (ptr > UINTPTR_MAX) {
        PyErr_SetString(PyExc_ValueError, "raw buffer ptr does not fit a pointer");
        return -1;
    }
    out->ptr = (void *)(uintptr_t)ptr;
    out->len = (size_t)len;
    return 0;
}

int slime_py_buf_get(PyObject *obj, int writable, slime_py_buf_t *out)
{
    memset(out, 0, sizeof(*out));
    if (PyTuple_Check(obj))
        return raw_pair_get(obj, out);
    /* PyBUF_SIMPLE: one contiguous run of bytes, which is what the C API
     * takes; strided views are refused by their exporter. */
    int flags = PyBUF_SIMPLE | (writable ? PyBUF_WRITABLE : 0);
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "expected a buffer-protocol object or a (ptr, length) "
                     "tuple, got %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &out->view, flags) < 0) {
        /* BufferError says what is wrong (read-only, not contiguous); a
         * TypeError says it is the argument's fault. */
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_TypeError, "expected a %scontiguous buffer: %S",
                         writable ? "writable, " : "", value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        return -1;
    }
    out->has_view = 1;
    out->ptr = out->view.buf;
    out->len = (size_t)out->view.len;
    return 0;
}

void slime_py_buf_release(slime_py_buf_t *buf)
{
    if (buf->has_view) {
        PyBuffer_Release(&buf->view);
        buf->has_view = 0;
    }
    buf->ptr = NULL;
    buf->len = 0;
}
