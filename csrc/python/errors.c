/*
 * errors.c - the exception classes of _C and the mapping from
 * slime_status_t to them.
 *
 * SlimeError(RuntimeError) carries .status (int), .status_name and .detail
 * (the C library's detail text).  Subclasses also derive from the builtin
 * that Python code already catches for that condition: TimeoutError,
 * ConnectionError, ValueError.
 */
#include "slime_py.h"

typedef struct {
    const char *name;          /* attribute name in the module */
    slime_status_t status;     /* 0: no status maps to it (the base) */
    const char *doc;
    PyObject *type;
} slime_py_error_class_t;

static PyObject *slime_error;

static slime_py_error_class_t error_classes[] = {
    {"SlimeTimeoutError", SLIME_ERR_TIMEOUT,
     "A wait ran past its timeout; the request is still pending.", NULL},
    {"SlimePeerLostError", SLIME_ERR_PEER_LOST,
     "The peer died or the connection broke.", NULL},
    {"SlimeRefusedError", SLIME_ERR_REFUSED,
     "The handshake was refused (magic, wire version or token).", NULL},
    {"SlimeAccessError", SLIME_ERR_ACCESS,
     "Unregistered, deregistered, out-of-bounds or forbidden memory.", NULL},
    {"SlimeTruncatedError", SLIME_ERR_TRUNCATED,
     "A message was larger than the receive buffer.", NULL},
    {"SlimeCanceledError", SLIME_ERR_CANCELED,
     "The request was canceled before it matched.", NULL},
    {"SlimeInvalidError", SLIME_ERR_INVAL,
     "The C library rejected an argument.", NULL},
    {"SlimeClosedError", SLIME_ERR_CLOSED,
     "The endpoint or context was closed.", NULL},
};

#define N_ERROR_CLASSES (sizeof(error_classes) / sizeof(error_classes[0]))

/* The builtin a class also derives from, so that code that knows nothing
 * of dlslime still catches it as what it is. */
static PyObject *builtin_base(slime_status_t status)
{
    switch (status) {
    case SLIME_ERR_TIMEOUT:
        return PyExc_TimeoutError;
    case SLIME_ERR_PEER_LOST:
        return PyExc_ConnectionError;
    case SLIME_ERR_INVAL:
        return PyExc_ValueError;
    default:
        return NULL;
    }
}

static PyObject *new_class(PyObject *module, const char *name,
                           PyObject *bases, const char *doc)
{
    char qualified[128];
    PyOS_snprintf(qualified, sizeof(qualified), "dlslime_torch._C.%s", name);
    PyObject *type = PyErr_NewExceptionWithDoc(qualified, doc, bases, NULL);
    if (!type)
        return NULL;
    if (PyModule_AddObjectRef(module, name, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    return type;
}

int slime_py_errors_init(PyObject *module)
{
    slime_error = new_class(module, "SlimeError", PyExc_RuntimeError,
                            "An error reported by libdlslime.  Attributes: "
                            "status (int), status_name, detail.");
    if (!slime_error)
        return -1;
    for (size_t i = 0; i < N_ERROR_CLASSES; i++) {
        slime_py_error_class_t *c = &error_classes[i];
        PyObject *builtin = builtin_base(c->status);
        PyObject *bases = builtin ? PyTuple_Pack(2, slime_error, builtin)
                                  : PyTuple_Pack(1, slime_error);
        if (!bases)
            return -1;
        c->type = new_class(module, c->name, bases, c->doc);
        Py_DECREF(bases);
        if (!c->type)
            return -1;
    }
    return 0;
}

static PyObject *class_of(slime_status_t status)
{
    for (size_t i = 0; i < N_ERROR_CLASSES; i++)
        if (error_classes[i].status == status)
            return error_classes[i].type;
    return slime_error;
}

static int set_attr_steal(PyObject *obj, const char *name, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyObject_SetAttrString(obj, name, value);
    Py_DECREF(value);
    return rc;
}

PyObject *slime_py_raise(slime_status_t status, const char *detail)
{
    if (!detail)
        detail = "";
    PyObject *cls = class_of(status);
    PyObject *msg = detail[0]
        ? PyUnicode_FromFormat("%s (%s): %s", slime_strerror(status),
                               slime_status_name(status), detail)
        : PyUnicode_FromFormat("%s (%s)", slime_strerror(status),
                               slime_status_name(status));
    if (!msg)
        return NULL;
    /* One argument only: OSError-derived classes would read two as
     * (errno, strerror). */
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    if (set_attr_steal(exc, "status", PyLong_FromLong((long)status)) < 0
        || set_attr_steal(exc, "status_name",
                          PyUnicode_FromString(slime_status_name(status))) < 0
        || set_attr_steal(exc, "detail",
                          PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail),
                                               "replace")) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *slime_py_raise_last(slime_status_t status)
{
    return slime_py_raise(status, slime_last_error());
}

PyObject *slime_py_raise_closed(void)
{
    return slime_py_raise(SLIME_ERR_CLOSED, "the Context is closed");
}
