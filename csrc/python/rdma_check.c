/*
 * rdma_check.c - the checks of a one-sided op (see rdma_check.h), and
 * _C.rdma_check, rdma_check_tensor, rdma_check_count and RdmaRefusal,
 * through which the checked path of dlslime_torch.rdma runs them.
 */
#include "rdma_check.h"

#include <stdarg.h>
#include <string.h>

/* Attribute and method names, interned once; 0 and 2**32 for the
 * comparisons made the Python way. */
static PyObject *s_desc, *s_owner, *s_dtype, *s_numel, *s_itemsize, *s_job,
    *s_context_id, *s_is_cpu, *s_is_contiguous, *s_zero, *s_imm_limit;
static PyObject *refusal_type;

static int intern_names(void)
{
#define INTERN(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return -1;
    INTERN(s_desc, "desc")
    INTERN(s_owner, "owner")
    INTERN(s_dtype, "dtype")
    INTERN(s_numel, "numel")
    INTERN(s_itemsize, "itemsize")
    INTERN(s_job, "job")
    INTERN(s_context_id, "context_id")
    INTERN(s_is_cpu, "is_cpu")
    INTERN(s_is_contiguous, "is_contiguous")
#undef INTERN
    s_zero = PyLong_FromLong(0);
    s_imm_limit = PyLong_FromUnsignedLongLong((unsigned long long)UINT32_MAX + 1);
    return s_zero && s_imm_limit ? 0 : -1;
}

/* Raises RdmaRefusal(*Py_BuildValue(format, ...)): the check's name
 * first, then the values it judged. */
static int refuse(const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *args = Py_VaBuildValue(format, va);
    va_end(va);
    if (!args)
        return SLIME_PY_CHECK_ERROR;
    PyErr_SetObject(refusal_type, args);
    Py_DECREF(args);
    return SLIME_PY_CHECK_REFUSED;
}

int slime_py_rdma_size_of(PyObject *obj, size_t *out)
{
    if (!PyLong_CheckExact(obj))
        return 0;
    size_t v = PyLong_AsSize_t(obj);
    if (v == (size_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

/* What ops.py asked of a count: an int and not a bool. */
static int is_int(PyObject *v)
{
    if (PyLong_CheckExact(v))
        return 1;
    if (PyBool_Check(v))
        return 0;
    return PyObject_IsInstance(v, (PyObject *)&PyLong_Type);
}

/* An offset or length in elements: an int, not a bool, not negative.
 * *plain: it is an exact int that fits a size_t, in *out. */
static int check_count(PyObject *v, size_t *out, int *plain)
{
    *plain = slime_py_rdma_size_of(v, out);
    if (*plain)
        return SLIME_PY_CHECK_PASS;
    int in = is_int(v);
    if (in <= 0)
        return in < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "count", v);
    int negative = PyObject_RichCompareBool(v, s_zero, Py_LT);
    if (negative)
        return negative < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "negative", v);
    return SLIME_PY_CHECK_PASS;
}

/* obj.name, or obj.name() when call, taken as a condition as `if` does. */
static int truth_of(PyObject *obj, PyObject *name, int call)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    int truth = v == Py_True ? 1 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* A torch.Tensor, on the CPU, contiguous. */
static int check_tensor(PyTypeObject *tensor_type, PyObject *t)
{
    if (!PyObject_TypeCheck(t, tensor_type)) {
        int is = PyObject_IsInstance(t, (PyObject *)tensor_type);
        if (is <= 0)
            return is < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "tensor", t);
    }
    int ok = truth_of(t, s_is_cpu, 0);
    if (ok <= 0)
        return ok < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "device", t);
    ok = truth_of(t, s_is_contiguous, 1);
    if (ok <= 0)
        return ok < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "contiguous", t);
    return SLIME_PY_CHECK_PASS;
}

int slime_py_rdma_checker_init(slime_py_rdma_checker_t *chk, PyObject *env)
{
    memset(chk, 0, sizeof(*chk));
    if (!PyTuple_Check(env) || PyTuple_GET_SIZE(env) != 6
        || !PyBytes_Check(PyTuple_GET_ITEM(env, 0))
        || !PyType_Check(PyTuple_GET_ITEM(env, 2))
        || !PyType_Check(PyTuple_GET_ITEM(env, 3))
        || !PyDict_Check(PyTuple_GET_ITEM(env, 4))
        || !PyCallable_Check(PyTuple_GET_ITEM(env, 5))) {
        PyErr_SetString(PyExc_TypeError, "env must be (job: bytes, context id, "
                        "RemoteTensor type, Tensor type, endpoints: dict, "
                        "endpoint_of)");
        return SLIME_PY_CHECK_ERROR;
    }
    slime_py_rdma_env_t *e = &chk->env;
    e->job = PyTuple_GET_ITEM(env, 0);
    e->ctx_id_obj = PyTuple_GET_ITEM(env, 1);
    e->ctx_id = PyLong_AsUnsignedLongLong(e->ctx_id_obj);
    if (e->ctx_id == (uint64_t)-1 && PyErr_Occurred())
        return SLIME_PY_CHECK_ERROR;
    e->remote_type = (PyTypeObject *)PyTuple_GET_ITEM(env, 2);
    e->tensor_type = (PyTypeObject *)PyTuple_GET_ITEM(env, 3);
    e->endpoints = PyTuple_GET_ITEM(env, 4);
    e->endpoint_of = PyTuple_GET_ITEM(env, 5);
    return SLIME_PY_CHECK_PASS;
}

static void remote_incref(const slime_py_rdma_remote_t *r)
{
    Py_INCREF(r->owner);
    Py_INCREF(r->owner_id);
    Py_INCREF(r->dtype);
    Py_INCREF(r->numel);
}

static void remote_decref(slime_py_rdma_remote_t *r)
{
    Py_CLEAR(r->owner);
    Py_CLEAR(r->owner_id);
    Py_CLEAR(r->dtype);
    Py_CLEAR(r->numel);
}

void slime_py_rdma_checker_clear(slime_py_rdma_checker_t *chk)
{
    for (size_t i = 0; i < chk->nremotes; i++)
        remote_decref(&chk->remotes[i]);
    PyMem_Free(chk->remotes);
    chk->remotes = NULL;
    chk->nremotes = chk->cap = 0;
}

/* The last remote decoded, kept across calls with what it was checked
 * against (the job, the context id, the RemoteTensor type, not the env,
 * which would keep a context alive): a program names the same
 * RemoteTensor (a frozen dataclass) over and over, and decoding it is a
 * third of a small op's checks. */
static struct {
    PyObject *remote, *job, *remote_type;   /* owned */
    uint64_t ctx_id;
    slime_py_rdma_remote_t r;                /* its references owned */
} last;

/* Appends r to chk->remotes, with new references; its index in *out. */
static int remotes_push(slime_py_rdma_checker_t *chk, const slime_py_rdma_remote_t *r,
                        size_t *out)
{
    if (chk->nremotes == chk->cap) {
        /* at first as many as fit one of Python's small blocks (512
         * bytes): past it, an allocation is malloc's, a cost per call */
        size_t cap = chk->cap ? 2 * chk->cap : 512 / sizeof(*chk->remotes);
        slime_py_rdma_remote_t *grown = PyMem_Realloc(chk->remotes, cap * sizeof(*grown));
        if (!grown) {
            PyErr_NoMemory();
            return SLIME_PY_CHECK_ERROR;
        }
        chk->remotes = grown;
        chk->cap = cap;
    }
    slime_py_rdma_remote_t *slot = &chk->remotes[chk->nremotes];
    *slot = *r;
    slot->ep = NULL;
    remote_incref(slot);
    *out = chk->nremotes++;
    return SLIME_PY_CHECK_PASS;
}

static void remember(const slime_py_rdma_env_t *env, PyObject *remote,
                     const slime_py_rdma_remote_t *r)
{
    PyObject *old_remote = last.remote, *old_job = last.job, *old_type = last.remote_type;
    slime_py_rdma_remote_t old = last.r;
    last.remote = Py_NewRef(remote);
    last.job = Py_NewRef(env->job);
    last.remote_type = Py_NewRef((PyObject *)env->remote_type);
    last.ctx_id = env->ctx_id;
    last.r = *r;
    remote_incref(r);
    if (old_remote) {   /* last, whole, before code a decref may run */
        remote_decref(&old);
        Py_DECREF(old_remote);
        Py_DECREF(old_job);
        Py_DECREF(old_type);
    }
}

/* What the fast path needs beyond the checks to post on r: the core's
 * descriptor as bytes, and the size of an element. */
static void remote_postable(slime_py_rdma_remote_t *r, PyObject *desc)
{
    PyObject *itemsize = PyObject_GetAttr(r->dtype, s_itemsize);
    if (!itemsize)
        PyErr_Clear();   /* not a torch.dtype: the dtype check decides */
    r->postable = r->counted && PyBytes_CheckExact(desc)
                  && r->desc_len == (Py_ssize_t)sizeof(r->desc.bytes)
                  && itemsize && slime_py_rdma_size_of(itemsize, &r->itemsize) && r->itemsize > 0;
    Py_XDECREF(itemsize);
    if (r->postable)
        memcpy(r->desc.bytes, PyBytes_AS_STRING(desc), sizeof(r->desc.bytes));
}

/* Reads what the checks need of a RemoteTensor, in the order ops.py read
 * it, and judges what depends on it alone; new references in *r. */
static int remote_decode(const slime_py_rdma_env_t *env, PyObject *remote,
                         slime_py_rdma_remote_t *r)
{
    memset(r, 0, sizeof(*r));
    r->remote = remote;
    PyObject *job = NULL, *desc = NULL;
    int ok = -1, differs = 0, own = 0;
    if (!(r->owner = PyObject_GetAttr(remote, s_owner))
        || !(job = PyObject_GetAttr(r->owner, s_job))
        || !(desc = PyObject_GetAttr(remote, s_desc))
        || (r->desc_len = PyObject_Length(desc)) < 0
        || !(r->dtype = PyObject_GetAttr(remote, s_dtype))
        || !(r->numel = PyObject_GetAttr(remote, s_numel))
        || !(r->owner_id = PyObject_GetAttr(r->owner, s_context_id))
        || (differs = PyObject_RichCompareBool(job, env->job, Py_NE)) < 0
        || (own = PyObject_RichCompareBool(r->owner_id, env->ctx_id_obj, Py_EQ)) < 0)
        goto out;
    r->job_ok = !differs;
    r->own = own;
    r->counted = slime_py_rdma_size_of(r->numel, &r->elements);
    remote_postable(r, desc);
    ok = 0;
out:
    Py_XDECREF(job);
    Py_XDECREF(desc);
    if (ok < 0)
        remote_decref(r);
    return ok;
}

/* The index in chk->remotes of remote, a RemoteTensor, decoded once per
 * call, or not at all when it is the last one. */
static int remote_of(slime_py_rdma_checker_t *chk, PyObject *remote, size_t *out)
{
    for (size_t i = chk->nremotes; i-- > 0;)
        if (chk->remotes[i].remote == remote) {
            *out = i;
            return SLIME_PY_CHECK_PASS;
        }
    const slime_py_rdma_env_t *env = &chk->env;
    if (remote == last.remote && env->job == last.job && env->ctx_id == last.ctx_id
        && (PyObject *)env->remote_type == last.remote_type)
        return remotes_push(chk, &last.r, out);
    slime_py_rdma_remote_t r;
    if (remote_decode(env, remote, &r) < 0)
        return SLIME_PY_CHECK_ERROR;
    int ok = remotes_push(chk, &r, out);
    if (ok == SLIME_PY_CHECK_PASS)
        remember(env, remote, &r);
    remote_decref(&r);
    return ok;
}

static int check_remote_type(const slime_py_rdma_env_t *env, PyObject *remote)
{
    if (PyObject_TypeCheck(remote, env->remote_type))
        return SLIME_PY_CHECK_PASS;
    int is = PyObject_IsInstance(remote, (PyObject *)env->remote_type);
    return is <= 0 ? (is < 0 ? SLIME_PY_CHECK_ERROR : refuse("(sO)", "remote", remote))
                   : SLIME_PY_CHECK_PASS;
}

/* offset + numel elements within the remote tensor; plain machine
 * arithmetic where every value is a plain int, else Python's (which also
 * makes the values of a refusal). */
static int check_bounds(const slime_py_rdma_remote_t *r, PyObject *offset,
                        PyObject *numel, const slime_py_rdma_checked_t *k)
{
    if (k->plain && r->counted && k->offset <= r->elements
        && k->numel <= r->elements - k->offset)
        return SLIME_PY_CHECK_PASS;
    PyObject *end = PyNumber_Add(offset, numel);
    int past = end ? PyObject_RichCompareBool(end, r->numel, Py_GT) : -1;
    int ok = past < 0 ? SLIME_PY_CHECK_ERROR
             : past ? refuse("(sOOO)", "bounds", offset, end, r->numel)
                    : SLIME_PY_CHECK_PASS;
    Py_XDECREF(end);
    return ok;
}

/* What holds between the local tensor and the remote one: the job, the
 * descriptor, the dtype, the bounds. */
static int check_fit(const slime_py_rdma_remote_t *r, PyObject *local, PyObject *offset,
                     PyObject *numel, const slime_py_rdma_checked_t *k)
{
    if (!r->job_ok)
        return refuse("(s)", "job");
    if (r->desc_len != (Py_ssize_t)sizeof(r->desc.bytes))
        return refuse("(sn)", "desc", r->desc_len);
    PyObject *dtype = PyObject_GetAttr(local, s_dtype);
    if (!dtype)
        return SLIME_PY_CHECK_ERROR;
    int differ = PyObject_RichCompareBool(dtype, r->dtype, Py_NE);
    int ok = differ < 0 ? SLIME_PY_CHECK_ERROR
             : differ ? refuse("(sOO)", "dtype", dtype, r->dtype)
                      : SLIME_PY_CHECK_PASS;
    Py_DECREF(dtype);
    return ok == SLIME_PY_CHECK_PASS ? check_bounds(r, offset, numel, k) : ok;
}

/* An immediate in [0, 2**32); *plain cleared unless it is an exact int. */
static int check_imm_value(PyObject *imm, uint32_t *out, int *plain)
{
    if (PyLong_CheckExact(imm)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(imm);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            PyErr_Clear();   /* negative, or past 64 bits */
        else if (v <= UINT32_MAX) {
            *out = (uint32_t)v;
            return SLIME_PY_CHECK_PASS;
        }
        return refuse("(sO)", "imm", imm);
    }
    *plain = 0;
    int ok = is_int(imm);   /* then 0 <= imm < 2**32, as Python chains it */
    if (ok > 0)
        ok = PyObject_RichCompareBool(s_zero, imm, Py_LE);
    if (ok > 0)
        ok = PyObject_RichCompareBool(imm, s_imm_limit, Py_LT);
    return ok < 0 ? SLIME_PY_CHECK_ERROR : ok ? SLIME_PY_CHECK_PASS : refuse("(sO)", "imm", imm);
}

/* The immediate of write_with_imm (imm not None): in range, carried by at
 * least one element, to a peer (this process cannot send itself one). */
static int check_imm(PyObject *imm, PyObject *numel, int own, slime_py_rdma_checked_t *k)
{
    if (imm == Py_None)
        return SLIME_PY_CHECK_PASS;
    k->has_imm = 1;
    int ok = check_imm_value(imm, &k->imm, &k->plain);
    if (ok != SLIME_PY_CHECK_PASS)
        return ok;
    int empty = k->plain ? k->numel == 0 : PyObject_RichCompareBool(numel, s_zero, Py_EQ);
    if (empty)
        return empty < 0 ? SLIME_PY_CHECK_ERROR : refuse("(s)", "imm_empty");
    return own ? refuse("(s)", "imm_self") : SLIME_PY_CHECK_PASS;
}

int slime_py_rdma_check_op(slime_py_rdma_checker_t *chk, PyObject *local,
                           PyObject *remote, PyObject *offset, PyObject *imm,
                           slime_py_rdma_checked_t *out)
{
    memset(out, 0, sizeof(*out));
    int ok = check_tensor(chk->env.tensor_type, local);
    if (ok == SLIME_PY_CHECK_PASS)
        ok = check_remote_type(&chk->env, remote);
    if (ok == SLIME_PY_CHECK_PASS)
        ok = check_count(offset, &out->offset, &out->plain);
    if (ok != SLIME_PY_CHECK_PASS)
        return ok;
    PyObject *numel = PyObject_CallMethodNoArgs(local, s_numel);
    if (!numel)
        return SLIME_PY_CHECK_ERROR;
    out->plain = out->plain && slime_py_rdma_size_of(numel, &out->numel);
    ok = remote_of(chk, remote, &out->remote);
    if (ok == SLIME_PY_CHECK_PASS) {
        const slime_py_rdma_remote_t *r = &chk->remotes[out->remote];
        ok = check_fit(r, local, offset, numel, out);
        if (ok == SLIME_PY_CHECK_PASS)
            ok = check_imm(imm, numel, r->own, out);
    }
    Py_DECREF(numel);
    return ok;
}

/* rdma_check(local, remote, offset, imm, env) -> whether the remote
 * region is this process's own */
static PyObject *rdma_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rdma_check(local, remote, offset, imm, env) "
                        "takes 5 arguments");
        return NULL;
    }
    slime_py_rdma_checker_t chk;
    slime_py_rdma_checked_t k;
    PyObject *result = NULL;
    if (slime_py_rdma_checker_init(&chk, args[4]) == SLIME_PY_CHECK_PASS
        && slime_py_rdma_check_op(&chk, args[0], args[1], args[2], args[3], &k)
               == SLIME_PY_CHECK_PASS)
        result = PyBool_FromLong(chk.remotes[k.remote].own);
    slime_py_rdma_checker_clear(&chk);
    return result;
}

/* rdma_check_tensor(tensor, Tensor type) -> None */
static PyObject *rdma_check_tensor(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "rdma_check_tensor(tensor, Tensor type)");
        return NULL;
    }
    if (check_tensor((PyTypeObject *)args[1], args[0]) != SLIME_PY_CHECK_PASS)
        return NULL;
    Py_RETURN_NONE;
}

/* rdma_check_count(value) -> None */
static PyObject *rdma_check_count(PyObject *module, PyObject *value)
{
    (void)module;
    size_t v;
    int plain;
    if (check_count(value, &v, &plain) != SLIME_PY_CHECK_PASS)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef rdma_check_methods[] = {
    {"rdma_check", (PyCFunction)(void (*)(void))rdma_check, METH_FASTCALL,
     "rdma_check(local, remote, offset, imm, env) -> whether remote is a region "
     "of this process; raises RdmaRefusal for an op dlslime_torch.rdma refuses "
     "(csrc/python/rdma_check.h)."},
    {"rdma_check_tensor", (PyCFunction)(void (*)(void))rdma_check_tensor, METH_FASTCALL,
     "rdma_check_tensor(tensor, Tensor type): RdmaRefusal unless a CPU, "
     "contiguous Tensor."},
    {"rdma_check_count", rdma_check_count, METH_O,
     "rdma_check_count(value): RdmaRefusal unless an int (not a bool) >= 0."},
    {NULL, NULL, 0, NULL},
};

int slime_py_rdma_init(PyObject *module)
{
    if (intern_names() < 0)
        return -1;
    refusal_type = PyErr_NewExceptionWithDoc(
        "dlslime_torch._C.RdmaRefusal",
        "A check of dlslime_torch.rdma refused an op: args are the check's "
        "name and the values it judged (dlslime_torch/rdma/checks.py words it).",
        NULL, NULL);
    if (!refusal_type || PyModule_AddObjectRef(module, "RdmaRefusal", refusal_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, rdma_check_methods);
}
