/*
 * buffer.h - the memory argument of an operation: a buffer-protocol
 * object (kept acquired) or a raw (ptr, length) pair of ints.
 */
#ifndef SLIME_PY_BUFFER_H
#define SLIME_PY_BUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

typedef struct {
    Py_buffer view;
    int has_view;              /* view must be released */
    void *ptr;
    size_t len;
} slime_py_buf_t;

/* Fills out from obj.  writable: the operation writes into the memory
 * (refuses read-only buffers).  A (ptr, length) tuple is trusted as is:
 * the caller vouches for that memory, as in C.  Returns 0, or -1 with a
 * Python error set. */
int slime_py_buf_get(PyObject *obj, int writable, slime_py_buf_t *out);
void slime_py_buf_release(slime_py_buf_t *buf);

#endif /* SLIME_PY_BUFFER_H */
