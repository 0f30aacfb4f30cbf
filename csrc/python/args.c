/*
 * args.c - argument converters for PyArg_Parse* "O&".
 *
 * Python-level mistakes (a negative size, a tag that does not fit, a
 * descriptor of the wrong length) raise ValueError / TypeError here,
 * before anything reaches the C library.
 */
#include "slime_py.h"

#include <string.h>

/* An int-like object as unsigned long long; ValueError naming what when
 * negative or larger than max. */
static int as_unsigned(PyObject *obj, unsigned long long max, const char *what,
                       unsigned long long *out)
{
    PyObject *index = PyNumber_Index(obj);
    if (!index)
        return 0;
    PyObject *zero = PyLong_FromLong(0);
    int negative = zero ? PyObject_RichCompareBool(index, zero, Py_LT) : -1;
    Py_XDECREF(zero);
    unsigned long long value = 0;
    if (negative == 0)
        value = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (negative < 0)
        return 0;
    if (negative || (value == (unsigned long long)-1 && PyErr_Occurred())
        || value > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be in [0, %llu]", what, max);
        return 0;
    }
    *out = value;
    return 1;
}

int slime_py_conv_size(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!as_unsigned(obj, (unsigned long long)PY_SSIZE_T_MAX, "a size or offset", &v))
        return 0;
    *(size_t *)out = (size_t)v;
    return 1;
}

int slime_py_conv_u64(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!as_unsigned(obj, UINT64_MAX, "a tag", &v))
        return 0;
    *(uint64_t *)out = (uint64_t)v;
    return 1;
}

int slime_py_conv_u32(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!as_unsigned(obj, UINT32_MAX, "an immediate value", &v))
        return 0;
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

int slime_py_conv_timeout(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!as_unsigned(obj, (unsigned long long)INT64_MAX, "timeout_ms", &v))
        return 0;
    *(int64_t *)out = (int64_t)v;
    return 1;
}

int slime_py_conv_desc(PyObject *obj, void *out)
{
    slime_mr_desc_t *desc = out;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "a remote descriptor is %zu bytes (MemoryRegion.desc()), "
                     "got %.200s", sizeof(desc->bytes), Py_TYPE(obj)->tp_name);
        return 0;
    }
    int ok = (size_t)view.len == sizeof(desc->bytes);
    if (ok)
        memcpy(desc->bytes, view.buf, sizeof(desc->bytes));
    else
        PyErr_Format(PyExc_ValueError,
                     "a remote descriptor is %zu bytes, got %zd",
                     sizeof(desc->bytes), view.len);
    PyBuffer_Release(&view);
    return ok;
}
