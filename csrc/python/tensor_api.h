/*
 * tensor_api.h - what the C++ shim (dlslime_torch._shim) lends the C
 * module: making CPU tensors through ATen directly, without the Python
 * calls (argument parsing, the dispatcher's Python layer) that a
 * torch.empty from C costs.  The shim publishes this table as the
 * capsule dlslime_torch._shim.tensor_api; without the shim (a build with
 * no torch, or an ABI it cannot load) the codec uses torch's Python API.
 *
 * Both functions need the GIL and return a new reference, or NULL with
 * a Python error set.
 */
#ifndef SLIME_PY_TENSOR_API_H
#define SLIME_PY_TENSOR_API_H

#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#define SLIME_TENSOR_API_CAPSULE "dlslime_torch._shim.tensor_api"
#define SLIME_TENSOR_API_VERSION 1

#define SLIME_TENSOR_API_NDIM_MAX 32

/* What the encoder needs of a tensor whose bytes can be sent as they lie. */
typedef struct slime_tensor_desc {
    PyObject *dtype;            /* borrowed: the torch.dtype */
    int ndim;                   /* <= SLIME_TENSOR_API_NDIM_MAX */
    int64_t dims[SLIME_TENSOR_API_NDIM_MAX];
    const void *data;
    size_t nbytes;
} slime_tensor_desc_t;

typedef struct slime_tensor_api {
    uint32_t version;
    /* 1 and *out filled if t (a torch.Tensor, subclasses too) is on the
     * CPU, contiguous, of at most NDIM_MAX dims and (complex) with no lazy
     * conjugation or negation; 0 if not (the caller makes it so through
     * Python); -1 with an error set. */
    int (*describe)(PyObject *t, slime_tensor_desc_t *out);
    /* A new contiguous CPU tensor of dtype (a torch.dtype) and dims,
     * holding a copy of the nbytes at src (its size in bytes). */
    PyObject *(*new_copy)(PyObject *dtype, int ndim, const int64_t *dims, const void *src, size_t nbytes);
    /* A CPU tensor of dtype and dims over the memory at data, which
     * owner keeps valid: the tensor holds a reference to owner until its
     * storage is freed. */
    PyObject *(*alias)(PyObject *dtype, int ndim, const int64_t *dims, void *data, PyObject *owner);
} slime_tensor_api_t;

#endif /* SLIME_PY_TENSOR_API_H */
