/*
 * codec_encode.c - an object into an rpc message (layout in codec.h).
 *
 * One walk writes the tagged body into a growing buffer and collects the
 * tensors; a second step lays the segments out and builds the head in
 * one bytes object.  What the walk has no tag for makes it give up, and
 * the whole object is pickled instead (pickle_body), its tensors still
 * out of band: mixing the two would need pickle's memo across tags.
 */
#include "codec.h"

#include <string.h>

enum { WALK_OK = 0, WALK_FALLBACK = 1, WALK_ERROR = -1 };

typedef struct {
    PyObject *tensor;          /* owned: CPU and contiguous */
    const unsigned char *ptr;
    size_t nbytes;
    size_t offset;
} enc_seg_t;

typedef struct {
    unsigned char *buf;
    size_t len, cap;
    enc_seg_t *segs;
    size_t nseg, segcap;
    PyObject *tensor_type;     /* borrowed; NULL without torch */
} enc_t;

static int grow(enc_t *e, size_t need)
{
    if (e->len + need <= e->cap)
        return 0;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->len + need)
        cap *= 2;
    unsigned char *buf = PyMem_Realloc(e->buf, cap);
    if (!buf) {
        PyErr_NoMemory();
        return -1;
    }
    e->buf = buf;
    e->cap = cap;
    return 0;
}

static int put_tag_u32(enc_t *e, char tag, uint32_t v)
{
    if (grow(e, 5) < 0)
        return -1;
    e->buf[e->len] = (unsigned char)tag;
    codec_put_u32(e->buf + e->len + 1, v);
    e->len += 5;
    return 0;
}

static int put_tag_u64(enc_t *e, char tag, uint64_t v)
{
    if (grow(e, 9) < 0)
        return -1;
    e->buf[e->len] = (unsigned char)tag;
    codec_put_u64(e->buf + e->len + 1, v);
    e->len += 9;
    return 0;
}

static int put_bytes(enc_t *e, char tag, const char *p, Py_ssize_t n)
{
    if ((uint64_t)n > UINT32_MAX)
        return WALK_FALLBACK;
    if (put_tag_u32(e, tag, (uint32_t)n) < 0 || grow(e, (size_t)n) < 0)
        return WALK_ERROR;
    memcpy(e->buf + e->len, p, (size_t)n);
    e->len += (size_t)n;
    return WALK_OK;
}

static void enc_release(enc_t *e)
{
    for (size_t i = 0; i < e->nseg; i++)
        Py_DECREF(e->segs[i].tensor);
    PyMem_Free(e->segs);
    PyMem_Free(e->buf);
    memset(e, 0, sizeof *e);
}

/* 1 if t.name (called: t.name()) is True, 0 if not, -1 on error. */
static int truth(PyObject *t, PyObject *name, int call)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(t, name) : PyObject_GetAttr(t, name);
    if (!v)
        return -1;
    int r = v == Py_True;
    Py_DECREF(v);
    return r;
}

/* Whether t's bytes are its values as they lie: on the CPU, contiguous,
 * and (complex only, the one kind that has them) no lazy conjugation or
 * negation.  -1 on error. */
static int is_plain(PyObject *t, int code)
{
    int ok = truth(t, codec_state.s_is_cpu, 0);
    if (ok == 1)
        ok = truth(t, codec_state.s_is_contiguous, 1);
    if (ok == 1 && (code < 0 || codec_dtypes[code].name[0] == 'c'))
        ok = truth(t, codec_state.s_is_conj, 1) == 0 && truth(t, codec_state.s_is_neg, 1) == 0 ? 1
             : PyErr_Occurred() ? -1 : 0;
    return ok;
}

/* t as a plain tensor (is_plain; a new reference): itself if it is one,
 * else a copy; its dtype's wire code (-1: none) in *code. */
static PyObject *plain_tensor(PyObject *t, int *code)
{
    PyObject *dtype = PyObject_GetAttr(t, codec_state.s_dtype);
    if (!dtype)
        return NULL;
    *code = codec_dtype_code(dtype);
    Py_DECREF(dtype);
    int ok = is_plain(t, *code);
    if (ok != 0)
        return ok < 0 ? NULL : Py_NewRef(t);
    static const char *const steps[] = {"detach", "cpu", "resolve_conj", "resolve_neg", "contiguous"};
    PyObject *cur = Py_NewRef(t);
    for (size_t i = 0; cur && i < sizeof(steps) / sizeof(steps[0]); i++) {
        PyObject *next = PyObject_CallMethod(cur, steps[i], NULL);
        Py_DECREF(cur);
        cur = next;
    }
    return cur;
}

/* What walk_tensor writes of a segment's tensor. */
typedef struct {
    int code;                       /* its dtype's wire code, -1: none */
    int ndim;                       /* -1: more than CODEC_NDIM_MAX */
    int64_t dims[CODEC_NDIM_MAX];
} enc_shape_t;

_Static_assert(CODEC_NDIM_MAX == SLIME_TENSOR_API_NDIM_MAX, "one limit on dims");

/* t's shape, through Python. */
static int read_shape(PyObject *t, enc_shape_t *sh)
{
    PyObject *shape = PyObject_GetAttr(t, codec_state.s_shape);
    if (!shape)
        return -1;
    Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    sh->ndim = ndim <= CODEC_NDIM_MAX ? (int)ndim : -1;
    for (int i = 0; i < sh->ndim; i++)
        sh->dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    Py_DECREF(shape);
    return PyErr_Occurred() ? -1 : 0;
}

/* The segment of a tensor that is not plain, or of any tensor without the
 * shim: its plain copy, found through torch's Python API.  sh: NULL
 * where nobody writes the shape (the pickle path). */
static int segment_by_python(PyObject *obj, enc_seg_t *seg, enc_shape_t *sh)
{
    int code;
    PyObject *t = plain_tensor(obj, &code);
    if (!t)
        return -1;
    PyObject *ptr = PyObject_CallMethodNoArgs(t, codec_state.s_data_ptr);
    PyObject *nbytes = ptr ? PyObject_GetAttr(t, codec_state.s_nbytes) : NULL;
    size_t n = nbytes ? PyLong_AsSize_t(nbytes) : (size_t)-1;
    void *p = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    Py_XDECREF(nbytes);
    if (PyErr_Occurred() || (sh && read_shape(t, sh) < 0)) {
        Py_DECREF(t);
        return -1;
    }
    if (sh)
        sh->code = code;
    *seg = (enc_seg_t){.tensor = t, .ptr = p, .nbytes = n};
    return 0;
}

/* Adds tensor obj as the next segment (it keeps the plain tensor); its
 * shape in *sh unless sh is NULL. */
static int add_segment(enc_t *e, PyObject *obj, enc_shape_t *sh)
{
    if (e->nseg == e->segcap) {
        size_t cap = e->segcap ? 2 * e->segcap : 4;
        enc_seg_t *segs = PyMem_Realloc(e->segs, cap * sizeof *segs);
        if (!segs) {
            PyErr_NoMemory();
            return -1;
        }
        e->segs = segs;
        e->segcap = cap;
    }
    const slime_tensor_api_t *api = codec_state.tensor_api;
    slime_tensor_desc_t d;
    int plain = api ? api->describe(obj, &d) : 0;
    if (plain < 0)
        return -1;
    if (!plain) {
        if (segment_by_python(obj, &e->segs[e->nseg], sh) < 0)
            return -1;
        e->nseg++;
        return 0;
    }
    if (sh) {
        sh->code = codec_dtype_code(d.dtype);
        sh->ndim = d.ndim;
        memcpy(sh->dims, d.dims, sizeof(int64_t) * (size_t)d.ndim);
    }
    e->segs[e->nseg++] = (enc_seg_t){.tensor = Py_NewRef(obj), .ptr = d.data, .nbytes = d.nbytes};
    return 0;
}

static int walk_tensor(enc_t *e, PyObject *obj)
{
    enc_shape_t sh;
    if (add_segment(e, obj, &sh) < 0)
        return WALK_ERROR;
    if (sh.code < 0 || sh.ndim < 0)
        return WALK_FALLBACK;
    if (grow(e, 7 + 8 * (size_t)sh.ndim) < 0)
        return WALK_ERROR;
    unsigned char *p = e->buf + e->len;
    p[0] = TAG_TENSOR;
    p[1] = (unsigned char)sh.code;
    p[2] = (unsigned char)sh.ndim;
    codec_put_u32(p + 3, (uint32_t)(e->nseg - 1));
    for (int i = 0; i < sh.ndim; i++)
        codec_put_u64(p + 7 + 8 * i, (uint64_t)sh.dims[i]);
    e->len += 7 + 8 * (size_t)sh.ndim;
    return WALK_OK;
}

static int walk(enc_t *e, PyObject *obj, int depth);

/* A list or tuple; the count is patched after the items, in case the
 * list changes while a tensor method runs Python code. */
static int walk_seq(enc_t *e, PyObject *obj, char tag, int depth)
{
    size_t at = e->len;
    if (put_tag_u32(e, tag, 0) < 0)
        return WALK_ERROR;
    Py_ssize_t i = 0;
    for (;; i++) {
        PyObject *item;
        if (tag == TAG_TUPLE)
            item = i < PyTuple_GET_SIZE(obj) ? PyTuple_GET_ITEM(obj, i) : NULL;
        else
            item = i < PyList_GET_SIZE(obj) ? PyList_GET_ITEM(obj, i) : NULL;
        if (!item)
            break;
        Py_INCREF(item);
        int rc = walk(e, item, depth + 1);
        Py_DECREF(item);
        if (rc != WALK_OK)
            return rc;
    }
    if ((uint64_t)i > UINT32_MAX)
        return WALK_FALLBACK;
    codec_put_u32(e->buf + at + 1, (uint32_t)i);
    return WALK_OK;
}

static int walk_dict(enc_t *e, PyObject *obj, int depth)
{
    size_t at = e->len;
    if (put_tag_u32(e, TAG_DICT, 0) < 0)
        return WALK_ERROR;
    Py_ssize_t pos = 0, n = 0;
    PyObject *k, *v;
    while (PyDict_Next(obj, &pos, &k, &v)) {
        Py_INCREF(k);
        Py_INCREF(v);
        int rc = walk(e, k, depth + 1);
        if (rc == WALK_OK)
            rc = walk(e, v, depth + 1);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc != WALK_OK)
            return rc;
        n++;
    }
    if ((uint64_t)n > UINT32_MAX)
        return WALK_FALLBACK;
    codec_put_u32(e->buf + at + 1, (uint32_t)n);
    return WALK_OK;
}

static int walk_scalar(enc_t *e, PyObject *obj)
{
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow)
            return WALK_FALLBACK;
        return put_tag_u64(e, TAG_INT, (uint64_t)v) < 0 ? WALK_ERROR : WALK_OK;
    }
    if (PyFloat_CheckExact(obj)) {
        double d = PyFloat_AS_DOUBLE(obj);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return put_tag_u64(e, TAG_FLOAT, bits) < 0 ? WALK_ERROR : WALK_OK;
    }
    if (PyUnicode_CheckExact(obj)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (!s) {   /* lone surrogates: pickle keeps them */
            PyErr_Clear();
            return WALK_FALLBACK;
        }
        return put_bytes(e, TAG_STR, s, n);
    }
    if (PyBytes_CheckExact(obj))
        return put_bytes(e, TAG_BYTES, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj));
    return WALK_FALLBACK;
}

static int walk(enc_t *e, PyObject *obj, int depth)
{
    if (depth > CODEC_DEPTH_MAX)
        return WALK_FALLBACK;
    if (obj == Py_None || obj == Py_True || obj == Py_False) {
        if (grow(e, 1) < 0)
            return WALK_ERROR;
        e->buf[e->len++] = obj == Py_None ? TAG_NONE : obj == Py_True ? TAG_TRUE : TAG_FALSE;
        return WALK_OK;
    }
    if (PyTuple_CheckExact(obj))
        return walk_seq(e, obj, TAG_TUPLE, depth);
    if (PyList_CheckExact(obj))
        return walk_seq(e, obj, TAG_LIST, depth);
    if (PyDict_CheckExact(obj))
        return walk_dict(e, obj, depth);
    /* a subclass (nn.Parameter) pickles, and so comes back as itself */
    if (e->tensor_type && PyObject_TypeCheck(obj, (PyTypeObject *)e->tensor_type))
        return Py_IS_TYPE(obj, (PyTypeObject *)e->tensor_type) ? walk_tensor(e, obj) : WALK_FALLBACK;
    return walk_scalar(e, obj);
}

/* The body as a pickle: pickle_body(obj, tensors) appends the tensors it
 * sends out of band to the list. */
static int pickle_into(enc_t *e, PyObject *obj, PyObject *pickle_body)
{
    PyObject *tensors = PyList_New(0);
    if (!tensors)
        return -1;
    PyObject *body = PyObject_CallFunctionObjArgs(pickle_body, obj, tensors, NULL);
    Py_buffer view;
    int rc = body ? PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) : -1;
    Py_XDECREF(body);
    if (rc < 0) {
        Py_DECREF(tensors);
        return -1;
    }
    e->len = 0;
    if (grow(e, (size_t)view.len) == 0) {
        memcpy(e->buf, view.buf, (size_t)view.len);
        e->len = (size_t)view.len;
    }
    PyBuffer_Release(&view);
    for (Py_ssize_t i = 0; !PyErr_Occurred() && i < PyList_GET_SIZE(tensors); i++)
        add_segment(e, PyList_GET_ITEM(tensors, i), NULL);
    Py_DECREF(tensors);
    return PyErr_Occurred() ? -1 : 0;
}

/* Places the segments; returns the tail's index or -1.  *end: where the
 * message ends. */
static Py_ssize_t layout(enc_t *e, size_t *end)
{
    Py_ssize_t tail = -1;
    for (size_t i = 0; i < e->nseg; i++)
        if (e->segs[i].nbytes >= CODEC_TAIL_MIN && (tail < 0 || e->segs[i].nbytes > e->segs[tail].nbytes))
            tail = (Py_ssize_t)i;
    size_t pos = CODEC_HEAD_LEN + CODEC_SEG_LEN * e->nseg + e->len;
    for (size_t k = 0; k <= e->nseg; k++) {
        /* every segment in order, and the tail once more at the end */
        size_t i = k < e->nseg ? k : (size_t)tail;
        if ((k < e->nseg && (Py_ssize_t)i == tail) || (k == e->nseg && tail < 0))
            continue;
        pos = (pos + CODEC_ALIGN - 1) / CODEC_ALIGN * CODEC_ALIGN;
        e->segs[i].offset = pos;
        pos += e->segs[i].nbytes;
    }
    *end = pos;
    return tail;
}

static PyObject *build(enc_t *e, uint32_t flags)
{
    size_t end;
    Py_ssize_t tail = layout(e, &end);
    size_t head_len = tail < 0 ? end : e->segs[tail].offset;
    PyObject *head = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)head_len);
    if (!head)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(head);
    memcpy(p, CODEC_MAGIC, 4);
    codec_put_u32(p + 4, flags);
    codec_put_u32(p + 8, (uint32_t)e->nseg);
    codec_put_u32(p + 12, 0);
    codec_put_u64(p + 16, e->len);
    size_t pos = CODEC_HEAD_LEN;
    for (size_t i = 0; i < e->nseg; i++, pos += CODEC_SEG_LEN) {
        codec_put_u64(p + pos, e->segs[i].offset);
        codec_put_u64(p + pos + 8, e->segs[i].nbytes);
    }
    memcpy(p + pos, e->buf, e->len);
    pos += e->len;
    memset(p + pos, 0, head_len - pos);   /* the alignment gaps */
    for (size_t i = 0; i < e->nseg; i++)
        if ((Py_ssize_t)i != tail && e->segs[i].nbytes)
            memcpy(p + e->segs[i].offset, e->segs[i].ptr, e->segs[i].nbytes);
    PyObject *pin = tail < 0 ? Py_NewRef(Py_None)
                             : codec_pin_new(e->segs[tail].tensor, e->segs[tail].ptr, e->segs[tail].nbytes);
    if (!pin) {
        Py_DECREF(head);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (!out) {
        Py_DECREF(head);
        Py_DECREF(pin);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, head);
    PyTuple_SET_ITEM(out, 1, pin);
    return out;
}

PyObject *slime_py_codec_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "codec_encode(obj, pickle_body)");
        return NULL;
    }
    enc_t e = {0};
    if (codec_tensor_type(&e.tensor_type) < 0)
        return NULL;
    int rc = walk(&e, args[0], 0);
    uint32_t flags = 0;
    if (rc == WALK_FALLBACK) {
        for (size_t i = 0; i < e.nseg; i++)
            Py_DECREF(e.segs[i].tensor);
        e.nseg = 0;
        rc = pickle_into(&e, args[0], args[1]);
        flags = CODEC_F_PICKLE;
    }
    PyObject *out = rc == WALK_OK ? build(&e, flags) : NULL;
    enc_release(&e);
    return out;
}
