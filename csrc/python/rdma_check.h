/*
 * rdma_check.h - the checks of a one-sided op of dlslime_torch.rdma, in
 * one place.
 *
 * Both paths of dlslime_torch/rdma/ops.py run these and no others: the
 * fast path (rdma.c), which posts nothing when a check refuses, and the
 * checked path, through _C.rdma_check, rdma_check_tensor and
 * rdma_check_count.  A check that refuses raises _C.RdmaRefusal(check,
 * *values): its name and the values it judged, which
 * dlslime_torch/rdma/checks.py words into the error naming the tensor and
 * the offsets.  So the two paths cannot disagree on what is allowed, and
 * the words are written once, in Python.
 *
 * The checks run in the order the Python path always ran them, so the
 * first that fails is the one reported, and they mean what the Python
 * expressions meant (an int subclass is an int, a bool is not), falling
 * back to Python arithmetic where a value is not a plain machine integer.
 */
#ifndef SLIME_PY_RDMA_CHECK_H
#define SLIME_PY_RDMA_CHECK_H

#include "slime_py.h"

/* What a check found: the op passes, a check refused it (RdmaRefusal is
 * raised), or a Python error came up (it is raised as it is). */
enum {
    SLIME_PY_CHECK_PASS = 1,
    SLIME_PY_CHECK_REFUSED = 0,
    SLIME_PY_CHECK_ERROR = -1,
};

/* env, made once per context by ops.py: the tuple
 *   (job: bytes, context id: int, RemoteTensor, torch.Tensor, endpoints,
 *    endpoint_of)
 * The checks use the first four; endpoints (a peer's context id -> its
 * Endpoint) and endpoint_of (a peer -> an Endpoint, connecting) are the
 * fast path's.  All borrowed from the tuple. */
typedef struct {
    PyObject *job;
    PyObject *ctx_id_obj;
    uint64_t ctx_id;
    PyTypeObject *remote_type;
    PyTypeObject *tensor_type;
    PyObject *endpoints;
    PyObject *endpoint_of;
} slime_py_rdma_env_t;

/* A RemoteTensor, decoded once per call however many ops name it, with
 * what the checks found of it alone. */
typedef struct {
    PyObject *remote;          /* borrowed: identity only */
    PyObject *owner;           /* owned, as the three below */
    PyObject *owner_id;        /* the key in endpoints */
    PyObject *dtype;
    PyObject *numel;
    Py_ssize_t desc_len;
    int job_ok;                /* its job is this process's */
    int own;                   /* it is a region of this process */
    int counted;               /* numel is a plain int, in elements */
    int postable;              /* counted, a bytes descriptor, an itemsize */
    size_t elements;
    size_t itemsize;
    slime_mr_desc_t desc;      /* when postable */
    slime_ep_t *ep;            /* the fast path's: NULL until resolved */
} slime_py_rdma_remote_t;

/* The state of one call's checks: env and the remotes decoded so far. */
typedef struct {
    slime_py_rdma_env_t env;
    slime_py_rdma_remote_t *remotes;
    size_t nremotes, cap;
} slime_py_rdma_checker_t;

/* What the checks found of one op that passed. */
typedef struct {
    size_t remote;             /* index of its remote in checker->remotes */
    size_t numel;              /* local elements */
    size_t offset;             /* in remote elements */
    uint32_t imm;
    int has_imm;               /* imm is not None */
    int plain;                 /* numel, offset and imm are plain ints */
} slime_py_rdma_checked_t;

/* An exact int >= 0 that fits a size_t: 1, its value in *out; else 0
 * (no error set: bools, int subclasses and the rest are left to Python). */
int slime_py_rdma_size_of(PyObject *obj, size_t *out);

/* Parses env; SLIME_PY_CHECK_PASS, or ERROR with TypeError.  Clear the
 * checker either way (it may be cleared twice). */
int slime_py_rdma_checker_init(slime_py_rdma_checker_t *chk, PyObject *env);
void slime_py_rdma_checker_clear(slime_py_rdma_checker_t *chk);

/* Checks one op: local (a tensor), remote, offset in remote elements, imm
 * (None but for write_with_imm), as ops._Op always did. */
int slime_py_rdma_check_op(slime_py_rdma_checker_t *chk, PyObject *local,
                           PyObject *remote, PyObject *offset, PyObject *imm,
                           slime_py_rdma_checked_t *out);

#endif /* SLIME_PY_RDMA_CHECK_H */
