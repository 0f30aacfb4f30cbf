/*
 * codec.c - what the RPC codec's encoder and decoder share: torch looked
 * up lazily (the codec works without torch until a tensor appears), the
 * dtype table and the pinned buffer a tail is sent from.
 */
#include "codec.h"

codec_state_t codec_state;

/* The wire codes are the indices: append only. */
codec_dtype_t codec_dtypes[] = {
    {.name = "float32", .itemsize = 4},       {.name = "float64", .itemsize = 8},
    {.name = "float16", .itemsize = 2},       {.name = "bfloat16", .itemsize = 2},
    {.name = "uint8", .itemsize = 1},         {.name = "int8", .itemsize = 1},
    {.name = "int16", .itemsize = 2},         {.name = "int32", .itemsize = 4},
    {.name = "int64", .itemsize = 8},         {.name = "bool", .itemsize = 1},
    {.name = "complex64", .itemsize = 8},     {.name = "complex128", .itemsize = 16},
    {.name = "uint16", .itemsize = 2},        {.name = "uint32", .itemsize = 4},
    {.name = "uint64", .itemsize = 8},        {.name = "float8_e4m3fn", .itemsize = 1},
    {.name = "float8_e5m2", .itemsize = 1},
};
const int codec_ndtypes = (int)(sizeof(codec_dtypes) / sizeof(codec_dtypes[0]));

static int load_dtypes(PyObject *torch)
{
    PyObject *dtype_type = PyObject_GetAttrString(torch, "dtype");
    if (!dtype_type)
        return -1;
    PyObject *empty = PyObject_GetAttrString(torch, "empty");
    int rc = empty ? 0 : -1;
    for (int i = 0; rc == 0 && i < codec_ndtypes; i++) {
        PyObject *d = PyObject_GetAttrString(torch, codec_dtypes[i].name);
        if (!d || !PyObject_TypeCheck(d, (PyTypeObject *)dtype_type)) {
            PyErr_Clear();   /* an older torch: that code is unknown here */
            Py_XDECREF(d);
            continue;
        }
        PyObject *like = PyObject_CallFunction(empty, "(i)", 0);
        PyObject *typed = like ? PyObject_CallMethod(like, "to", "(O)", d) : NULL;
        Py_XDECREF(like);
        if (!typed) {
            Py_DECREF(d);
            rc = -1;
            break;
        }
        codec_dtypes[i].dtype = d;
        codec_dtypes[i].like = typed;
    }
    Py_XDECREF(empty);
    Py_DECREF(dtype_type);
    return rc;
}

/* The shim's table, or NULL (no error) where the shim is not there: the
 * codec then makes tensors through torch's Python API. */
static const slime_tensor_api_t *load_tensor_api(void)
{
    const slime_tensor_api_t *api = PyCapsule_Import(SLIME_TENSOR_API_CAPSULE, 0);
    if (!api || api->version != SLIME_TENSOR_API_VERSION) {
        PyErr_Clear();
        return NULL;
    }
    return api;
}

static int load_torch(PyObject *torch)
{
    codec_state_t *s = &codec_state;
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    if (!tensor)
        return -1;
    if (!PyType_Check(tensor)) {
        Py_DECREF(tensor);
        PyErr_SetString(PyExc_TypeError, "torch.Tensor is not a type");
        return -1;
    }
    s->frombuffer = PyObject_GetAttrString(torch, "frombuffer");
    if (!s->frombuffer || load_dtypes(torch) < 0) {
        Py_CLEAR(s->frombuffer);
        Py_DECREF(tensor);
        return -1;
    }
    s->tensor_api = load_tensor_api();
    s->tensor_type = tensor;   /* set last: it says the rest is there */
    return 0;
}

int codec_tensor_type(PyObject **out)
{
    *out = codec_state.tensor_type;
    if (*out)
        return 0;
    PyObject *torch = PyImport_GetModule(codec_state.s_torch);
    if (!torch || torch == Py_None) {   /* None: a process that blocks torch's import */
        Py_XDECREF(torch);
        return PyErr_Occurred() ? -1 : 0;
    }
    int rc = load_torch(torch);
    Py_DECREF(torch);
    *out = codec_state.tensor_type;
    return rc;
}

int codec_need_torch(void)
{
    if (codec_state.tensor_type)
        return 0;
    PyObject *torch = PyImport_Import(codec_state.s_torch);
    if (!torch)
        return -1;
    int rc = load_torch(torch);
    Py_DECREF(torch);
    return rc;
}

int codec_dtype_code(PyObject *dtype)
{
    for (int i = 0; i < codec_ndtypes; i++)
        if (codec_dtypes[i].dtype == dtype)
            return i;
    return -1;
}

/* ---- the pinned buffer ---- */

static PyTypeObject CodecPin_Type;

typedef struct {
    PyObject_HEAD
    PyObject *owner;
    void *ptr;
    Py_ssize_t len;
    Py_ssize_t exports;
} CodecPinObject;

static int pin_getbuffer(CodecPinObject *self, Py_buffer *view, int flags)
{
    if (!self->owner) {
        PyErr_SetString(PyExc_BufferError, "the pinned tensor was let go");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void pin_releasebuffer(CodecPinObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

void codec_pin_let_go(PyObject *obj)
{
    if (Py_TYPE(obj) != &CodecPin_Type)
        return;
    CodecPinObject *pin = (CodecPinObject *)obj;
    if (pin->exports == 0)
        Py_CLEAR(pin->owner);
}

static void pin_dealloc(CodecPinObject *self)
{
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs pin_as_buffer = {.bf_getbuffer = (getbufferproc)pin_getbuffer,
                                      .bf_releasebuffer = (releasebufferproc)pin_releasebuffer};

static PyTypeObject CodecPin_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlslime_torch._C.CodecPin",
    .tp_doc = "The bytes of a tensor sent as a message's tail; keeps the tensor.",
    .tp_basicsize = sizeof(CodecPinObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)pin_dealloc,
    .tp_as_buffer = &pin_as_buffer,
};

PyObject *codec_pin_new(PyObject *owner, const void *ptr, size_t len)
{
    CodecPinObject *pin = PyObject_New(CodecPinObject, &CodecPin_Type);
    if (!pin)
        return NULL;
    pin->owner = Py_NewRef(owner);
    pin->ptr = (void *)ptr;
    pin->len = (Py_ssize_t)len;
    pin->exports = 0;
    return (PyObject *)pin;
}

/* ---- module set-up ---- */

static int intern(PyObject **slot, const char *name)
{
    *slot = PyUnicode_InternFromString(name);
    return *slot ? 0 : -1;
}

static const struct {
    size_t offset;
    const char *name;
} interned[] = {
    {offsetof(codec_state_t, s_torch), "torch"},
    {offsetof(codec_state_t, s_dtype), "dtype"},
    {offsetof(codec_state_t, s_shape), "shape"},
    {offsetof(codec_state_t, s_is_cpu), "is_cpu"},
    {offsetof(codec_state_t, s_is_contiguous), "is_contiguous"},
    {offsetof(codec_state_t, s_is_conj), "is_conj"},
    {offsetof(codec_state_t, s_is_neg), "is_neg"},
    {offsetof(codec_state_t, s_data_ptr), "data_ptr"},
    {offsetof(codec_state_t, s_new_empty), "new_empty"},
    {offsetof(codec_state_t, s_nbytes), "nbytes"},
    {offsetof(codec_state_t, s_view), "view"},
};

static PyObject *codec_tensor_path(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (codec_need_torch() < 0)
        return NULL;
    return PyUnicode_FromString(codec_state.tensor_api ? "aten" : "python");
}

static PyMethodDef codec_methods[] = {
    {"codec_tensor_path", codec_tensor_path, METH_NOARGS,
     "codec_tensor_path() -> 'aten' where the codec makes and reads tensors through the shim's ATen calls, "
     "'python' where through torch's Python API (no shim).  Imports torch."},
    {"codec_encode", (PyCFunction)(void (*)(void))slime_py_codec_encode, METH_FASTCALL,
     "codec_encode(obj, pickle_body) -> (head, tail): obj as an rpc message (dlslime_torch.rpc.codec); "
     "tail is None or a buffer over the largest tensor's bytes, sent after head.  pickle_body(obj, tensors) "
     "pickles what the codec has no tag for, appending its tensors to the list."},
    {"codec_decode", (PyCFunction)(void (*)(void))slime_py_codec_decode, METH_FASTCALL,
     "codec_decode(message, unpickle_body) -> obj: the object in an rpc message; its tensors alias the "
     "message's memory.  unpickle_body(message, start, end, segments) decodes a pickled body.  ValueError "
     "where the message is malformed."},
    {NULL, NULL, 0, NULL},
};

int slime_py_codec_init(PyObject *module)
{
    codec_state_t *s = &codec_state;
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++)
        if (intern((PyObject **)((char *)s + interned[i].offset), interned[i].name) < 0)
            return -1;
    s->kw_frombuffer = Py_BuildValue("(sss)", "dtype", "count", "offset");
    if (!s->kw_frombuffer || PyType_Ready(&CodecPin_Type) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "CODEC_TAIL_MIN", CODEC_TAIL_MIN) < 0
        || PyModule_AddIntConstant(module, "CODEC_DEPTH_MAX", CODEC_DEPTH_MAX) < 0
        || PyModule_AddIntConstant(module, "CODEC_ALIGN", CODEC_ALIGN) < 0)
        return -1;
    return PyModule_AddFunctions(module, codec_methods);
}
