/*
 * module.c - dlslime_torch._C: types, constants and module functions.
 *
 * The binding mirrors dlslime.h one to one; see slime_py.h for what it
 * adds on top (lifetimes, GIL, exceptions).
 */
#include "codec.h"
#include "slime_py.h"

static PyObject *module_desc_length(PyObject *module, PyObject *arg)
{
    (void)module;
    slime_mr_desc_t desc;
    if (!slime_py_conv_desc(arg, &desc))
        return NULL;
    return PyLong_FromUnsignedLongLong(slime_mr_desc_len(&desc));
}

static int status_arg(PyObject *arg, slime_status_t *out)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (slime_status_t)v;
    return 0;
}

static PyObject *module_strerror(PyObject *module, PyObject *arg)
{
    (void)module;
    slime_status_t st;
    if (status_arg(arg, &st) < 0)
        return NULL;
    return PyUnicode_FromString(slime_strerror(st));
}

static PyObject *module_status_name(PyObject *module, PyObject *arg)
{
    (void)module;
    slime_status_t st;
    if (status_arg(arg, &st) < 0)
        return NULL;
    return PyUnicode_FromString(slime_status_name(st));
}

/* Addresses are plain integers here (tensor.data_ptr()), as in the
 * allocator hooks that call these. */
static PyObject *module_mem_watch(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "KK:mem_watch", &addr, &len))
        return NULL;
    slime_status_t st = slime_mem_watch((void *)(uintptr_t)addr, (size_t)len);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *module_mem_unwatch(PyObject *module, PyObject *arg)
{
    (void)module;
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    slime_status_t st = slime_mem_unwatch((void *)(uintptr_t)addr);
    if (st != SLIME_OK)
        return slime_py_raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *module_mem_watched(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "KK:mem_watched", &addr, &len))
        return NULL;
    return PyBool_FromLong(slime_mem_watched((const void *)(uintptr_t)addr, (size_t)len));
}

static PyMethodDef module_methods[] = {
    {"wait_all", (PyCFunction)(void (*)(void))slime_py_wait_all,
     METH_VARARGS | METH_KEYWORDS,
     "wait_all(requests, timeout_ms=30000): waits for every request; raises "
     "the first failure in list order, or SlimeTimeoutError."},
    {"desc_length", module_desc_length, METH_O,
     "desc_length(desc) -> length of the region a 64-byte descriptor names "
     "(0 if malformed)."},
    {"strerror", module_strerror, METH_O, "strerror(status) -> short text"},
    {"status_name", module_status_name, METH_O,
     "status_name(status) -> enum name ('SLIME_ERR_PEER_LOST')"},
    {"mem_watch", module_mem_watch, METH_VARARGS,
     "mem_watch(addr, len): promises mem_unwatch(addr) before that memory "
     "is freed or remapped, so registrations inside it may be kept "
     "(slime_mem_watch)."},
    {"mem_unwatch", module_mem_unwatch, METH_O,
     "mem_unwatch(addr): ends the watch starting at addr."},
    {"mem_watched", module_mem_watched, METH_VARARGS,
     "mem_watched(addr, len) -> whether [addr, addr+len) is inside one "
     "watched range."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dlslime_torch._C",
    .m_doc = "CPython binding of libdlslime (csrc/include/dlslime/dlslime.h).",
    .m_size = -1,
    .m_methods = module_methods,
};

typedef struct {
    const char *name;
    long long value;
} int_constant_t;

#define STATUS(name) {#name, SLIME_##name}

static const int_constant_t int_constants[] = {
    STATUS(OK), STATUS(INPROGRESS), STATUS(ERR_INVAL), STATUS(ERR_NOMEM),
    STATUS(ERR_TIMEOUT), STATUS(ERR_PEER_LOST), STATUS(ERR_REFUSED),
    STATUS(ERR_ACCESS), STATUS(ERR_TRUNCATED), STATUS(ERR_CANCELED),
    STATUS(ERR_UNSUPPORTED), STATUS(ERR_PROTOCOL), STATUS(ERR_SYSTEM),
    STATUS(ERR_CLOSED), STATUS(ERR_BUSY),
    {"ACCESS_REMOTE_READ", SLIME_ACCESS_REMOTE_READ},
    {"ACCESS_REMOTE_WRITE", SLIME_ACCESS_REMOTE_WRITE},
    {"ACCESS_ALL", SLIME_ACCESS_ALL},
    {"OP_SEND", SLIME_OP_SEND},
    {"OP_RECV", SLIME_OP_RECV},
    {"OP_READ", SLIME_OP_READ},
    {"OP_WRITE", SLIME_OP_WRITE},
    {"OP_WRITE_IMM", SLIME_OP_WRITE_IMM},
    {"VERSION_MAJOR", SLIME_VERSION_MAJOR},
    {"VERSION_MINOR", SLIME_VERSION_MINOR},
    {"WIRE_VERSION", SLIME_WIRE_VERSION},
    {"ADDRESS_MAX", SLIME_ADDRESS_MAX},
    {"DESC_SIZE", sizeof(((slime_mr_desc_t *)0)->bytes)},
    {"COUNTER_BUF_REGISTRATIONS", SLIME_COUNTER_BUF_REGISTRATIONS},
    {"COUNTER_BUF_REG_REUSED", SLIME_COUNTER_BUF_REG_REUSED},
    {"COUNTER_PEER_PINGS", SLIME_COUNTER_PEER_PINGS},
    {"COUNTER_TCP_CMA_FETCHES", SLIME_COUNTER_TCP_CMA_FETCHES},
    {"COUNTER_UNEXPECTED_COPIES", SLIME_COUNTER_UNEXPECTED_COPIES},
    {"COUNTER_PARKED", SLIME_COUNTER_PARKED},
    {"COUNTER_BOX_OPS", SLIME_COUNTER_BOX_OPS},
    {"COUNTER_DOORBELLS", SLIME_COUNTER_DOORBELLS},
    {"COUNTER_SHM_FETCHES", SLIME_COUNTER_SHM_FETCHES},
    {"COUNTER_RENDEZVOUS", SLIME_COUNTER_RENDEZVOUS},
    {"COUNTER_DEAD_PEER_PINS", SLIME_COUNTER_DEAD_PEER_PINS},
};

static int add_types(PyObject *module)
{
    PyTypeObject *types[] = {&SlimeContext_Type, &SlimeEndpoint_Type,
                             &SlimeMemoryRegion_Type, &SlimeRequest_Type,
                             &SlimeSharedMemory_Type};
    const char *names[] = {"Context", "Endpoint", "MemoryRegion", "Request",
                           "SharedMemory"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0
            || PyModule_AddObjectRef(module, names[i], (PyObject *)types[i]) < 0)
            return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (!module)
        return NULL;
    if (add_types(module) < 0 || slime_py_errors_init(module) < 0
        || slime_py_rpc_init(module) < 0 || slime_py_codec_init(module) < 0
        || slime_py_rdma_init(module) < 0)
        goto fail;
    for (size_t i = 0; i < sizeof(int_constants) / sizeof(int_constants[0]); i++)
        if (PyModule_AddIntConstant(module, int_constants[i].name,
                                    (long)int_constants[i].value) < 0)
            goto fail;
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}
