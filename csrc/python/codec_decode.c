/*
 * codec_decode.c - an rpc message into its object (layout in codec.h).
 *
 * The message comes from a peer that may be hostile: each read is
 * checked against the bytes left, a container's count must fit in what
 * is left (each item takes at least one byte), so no allocation is
 * larger than the message, and nesting stops at CODEC_DEPTH_MAX.
 * A tensor of CODEC_TAIL_MIN bytes or more (the tail among them) aliases
 * the message's memory through torch.frombuffer (and keeps the message
 * alive); smaller ones are copies.
 */
#include "codec.h"

#include <string.h>

typedef struct {
    const unsigned char *p, *end;   /* the body not read yet */
    const unsigned char *base;      /* the message */
    const unsigned char *segs;      /* the segment table */
    size_t nseg;
    PyObject *msg;                  /* the message (a buffer object) */
    PyObject *view;                 /* a memoryview of msg, made for the first tensor */
} dec_t;

static PyObject *bad(const char *why)
{
    PyErr_Format(PyExc_ValueError, "malformed rpc message: %s", why);
    return NULL;
}

static int take(dec_t *d, size_t n, const unsigned char **at)
{
    *at = d->p;   /* set on failure too: callers' reads stay initialised to the compiler */
    if ((size_t)(d->end - d->p) < n) {
        bad("a value runs past the end of the body");
        return -1;
    }
    *at = d->p;
    d->p += n;
    return 0;
}

static PyObject *decode(dec_t *d, int depth);

/* A count read from the message: at most what the rest of the body can
 * hold at min_item bytes an item. */
static int count(dec_t *d, size_t min_item, Py_ssize_t *n)
{
    const unsigned char *at;
    if (take(d, 4, &at) < 0)
        return -1;
    uint32_t v = codec_get_u32(at);
    if (v > (size_t)(d->end - d->p) / min_item) {
        bad("a container counts more items than the body holds");
        return -1;
    }
    *n = (Py_ssize_t)v;
    return 0;
}

static PyObject *decode_seq(dec_t *d, int tuple, int depth)
{
    Py_ssize_t n;
    if (count(d, 1, &n) < 0)
        return NULL;
    PyObject *seq = tuple ? PyTuple_New(n) : PyList_New(n);
    for (Py_ssize_t i = 0; seq && i < n; i++) {
        PyObject *item = decode(d, depth + 1);
        if (!item)
            Py_CLEAR(seq);   /* the unfilled slots are NULL: fine to free */
        else if (tuple)
            PyTuple_SET_ITEM(seq, i, item);
        else
            PyList_SET_ITEM(seq, i, item);
    }
    return seq;
}

static PyObject *decode_dict(dec_t *d, int depth)
{
    Py_ssize_t n;
    if (count(d, 2, &n) < 0)
        return NULL;
    PyObject *dict = PyDict_New();
    for (Py_ssize_t i = 0; dict && i < n; i++) {
        PyObject *k = decode(d, depth + 1);
        PyObject *v = k ? decode(d, depth + 1) : NULL;
        if (!v || PyDict_SetItem(dict, k, v) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return dict;
}

static PyObject *decode_str(dec_t *d, int is_bytes)
{
    const unsigned char *at;
    if (take(d, 4, &at) < 0)
        return NULL;
    size_t n = codec_get_u32(at);
    if (take(d, n, &at) < 0)
        return NULL;
    if (is_bytes)
        return PyBytes_FromStringAndSize((const char *)at, (Py_ssize_t)n);
    return PyUnicode_DecodeUTF8((const char *)at, (Py_ssize_t)n, "strict");
}

/* The shape's element count, or -1 where it overflows. */
static int64_t numel(PyObject *shape)
{
    int64_t n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        int64_t dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (dim == 0)
            return 0;
        if (__builtin_mul_overflow(n, dim, &n))
            n = -1;
    }
    return n;
}

/* A new tensor of shape, of like's dtype, holding a copy of the nbytes
 * at src.  The dims go as separate arguments: torch parses a tuple, or
 * a dtype= keyword, much slower. */
/* shape's dims (read_shape made them: in range). */
static void shape_dims(PyObject *shape, int64_t *dims)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++)
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
}

/* A copy through the shim's ATen call: half the time of new_empty. */
static PyObject *copied_by_shim(PyObject *dtype, PyObject *shape, const unsigned char *src, size_t nbytes)
{
    int64_t dims[CODEC_NDIM_MAX];
    shape_dims(shape, dims);
    return codec_state.tensor_api->new_copy(dtype, (int)PyTuple_GET_SIZE(shape), dims, src, nbytes);
}

static PyObject *copied_tensor(const codec_dtype_t *dt, PyObject *shape, const unsigned char *src, size_t nbytes)
{
    if (codec_state.tensor_api)
        return copied_by_shim(dt->dtype, shape, src, nbytes);
    PyObject *like = dt->like;
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    PyObject *args[CODEC_NDIM_MAX + 1] = {like, shape};   /* a scalar: like.new_empty(()) */
    for (Py_ssize_t i = 0; i < ndim; i++)
        args[i + 1] = PyTuple_GET_ITEM(shape, i);
    size_t nargs = ndim ? (size_t)ndim + 1 : 2;
    PyObject *t = PyObject_VectorcallMethod(codec_state.s_new_empty, args, nargs, NULL);
    if (!t || !nbytes)
        return t;
    PyObject *ptr = PyObject_CallMethodNoArgs(t, codec_state.s_data_ptr);
    void *dst = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    if (!dst) {
        Py_DECREF(t);
        return NULL;
    }
    memcpy(dst, src, nbytes);
    return t;
}

/* The same through the shim's ATen call (a third of the time); the
 * tensor keeps view, and so the message's memory, alive. */
static PyObject *aliased_by_shim(PyObject *view, PyObject *dtype, PyObject *shape, uint64_t offset)
{
    int64_t dims[CODEC_NDIM_MAX];
    shape_dims(shape, dims);
    char *base = PyMemoryView_GET_BUFFER(view)->buf;
    return codec_state.tensor_api->alias(dtype, (int)PyTuple_GET_SIZE(shape), dims, base + offset, view);
}

/* A tensor over the message's bytes at offset (torch.frombuffer: it
 * keeps the message alive), viewed as shape. */
static PyObject *aliased_tensor(dec_t *d, PyObject *dtype, PyObject *shape, uint64_t offset, int64_t n)
{
    codec_state_t *s = &codec_state;
    if (!d->view && !(d->view = PyMemoryView_FromObject(d->msg)))
        return NULL;
    if (s->tensor_api)
        return aliased_by_shim(d->view, dtype, shape, offset);
    PyObject *cnt = PyLong_FromLongLong(n);
    PyObject *off = cnt ? PyLong_FromUnsignedLongLong(offset) : NULL;
    PyObject *flat = NULL;
    if (off) {
        PyObject *args[4] = {d->view, dtype, cnt, off};
        flat = PyObject_Vectorcall(s->frombuffer, args, 1, s->kw_frombuffer);
    }
    Py_XDECREF(cnt);
    Py_XDECREF(off);
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (!flat || ndim == 1)
        return flat;
    PyObject *args[CODEC_NDIM_MAX + 1] = {flat};
    for (Py_ssize_t i = 0; i < ndim; i++)
        args[i + 1] = PyTuple_GET_ITEM(shape, i);
    PyObject *t = ndim ? PyObject_VectorcallMethod(s->s_view, args, (size_t)ndim + 1, NULL)
                       : PyObject_CallMethodOneArg(flat, s->s_view, shape);
    Py_DECREF(flat);
    return t;
}

/* A tensor of n elements from the segment at offset: one of TAIL_MIN
 * bytes or more is used where it lies (no copy of a large tensor); a
 * smaller one is copied, which costs fewer torch calls than a view of
 * the message and does not keep the whole message alive. */
static PyObject *make_tensor(dec_t *d, const codec_dtype_t *dt, PyObject *shape, uint64_t offset, int64_t n,
                             size_t nbytes)
{
    if (nbytes < CODEC_TAIL_MIN)
        return copied_tensor(dt, shape, d->base + offset, nbytes);
    return aliased_tensor(d, dt->dtype, shape, offset, n);
}

static PyObject *read_shape(dec_t *d, size_t ndim)
{
    const unsigned char *at;
    if (take(d, 8 * ndim, &at) < 0)
        return NULL;
    PyObject *shape = PyTuple_New((Py_ssize_t)ndim);
    for (size_t i = 0; shape && i < ndim; i++) {
        int64_t dim = (int64_t)codec_get_u64(at + 8 * i);
        PyObject *v = dim >= 0 ? PyLong_FromLongLong(dim) : bad("a negative tensor dimension");
        if (!v)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, (Py_ssize_t)i, v);
    }
    return shape;
}

/* Everything is checked before torch is imported: a malformed message
 * costs no import. */
static PyObject *decode_tensor(dec_t *d)
{
    const unsigned char *at;
    if (take(d, 6, &at) < 0)
        return NULL;
    unsigned code = at[0], ndim = at[1];
    uint32_t seg = codec_get_u32(at + 2);
    if (code >= (unsigned)codec_ndtypes)
        return bad("a tensor of an unknown dtype");
    if (ndim > CODEC_NDIM_MAX || seg >= d->nseg)
        return bad(ndim > CODEC_NDIM_MAX ? "a tensor of too many dimensions" : "a tensor names no segment");
    PyObject *shape = read_shape(d, ndim);
    if (!shape)
        return NULL;
    uint64_t offset = codec_get_u64(d->segs + CODEC_SEG_LEN * seg);
    uint64_t nbytes = codec_get_u64(d->segs + CODEC_SEG_LEN * seg + 8);
    int64_t n = numel(shape), total;
    PyObject *t;
    if (n < 0 || __builtin_mul_overflow(n, (int64_t)codec_dtypes[code].itemsize, &total)
        || (uint64_t)total != nbytes)
        t = bad("a tensor's shape does not match its segment");
    else if (codec_need_torch() < 0)
        t = NULL;
    else if (!codec_dtypes[code].dtype)
        t = bad("a tensor of a dtype this torch lacks");
    else
        t = make_tensor(d, &codec_dtypes[code], shape, offset, n, (size_t)nbytes);
    Py_DECREF(shape);
    return t;
}

static PyObject *decode_number(dec_t *d, int is_float)
{
    const unsigned char *at;
    if (take(d, 8, &at) < 0)
        return NULL;
    uint64_t bits = codec_get_u64(at);
    if (!is_float)
        return PyLong_FromLongLong((long long)bits);
    double v;
    memcpy(&v, &bits, sizeof v);
    return PyFloat_FromDouble(v);
}

static PyObject *decode(dec_t *d, int depth)
{
    const unsigned char *at;
    if (depth > CODEC_DEPTH_MAX)
        return bad("containers nest too deep");
    if (take(d, 1, &at) < 0)
        return NULL;
    switch (*at) {
    case TAG_NONE: return Py_NewRef(Py_None);
    case TAG_TRUE: return Py_NewRef(Py_True);
    case TAG_FALSE: return Py_NewRef(Py_False);
    case TAG_INT: return decode_number(d, 0);
    case TAG_FLOAT: return decode_number(d, 1);
    case TAG_STR: return decode_str(d, 0);
    case TAG_BYTES: return decode_str(d, 1);
    case TAG_TUPLE: return decode_seq(d, 1, depth);
    case TAG_LIST: return decode_seq(d, 0, depth);
    case TAG_DICT: return decode_dict(d, depth);
    case TAG_TENSOR: return decode_tensor(d);
    default: return bad("an unknown tag");
    }
}

/* Checks the head and the segment table against the message's length;
 * fills d's body and segments. */
static int check_head(dec_t *d, const unsigned char *m, size_t len, uint32_t *flags)
{
    if (len < CODEC_HEAD_LEN) {
        bad("shorter than its head");
        return -1;
    }
    if (memcmp(m, CODEC_MAGIC, 4) != 0) {
        PyObject *magic = PyBytes_FromStringAndSize((const char *)m, 4);
        if (magic)
            PyErr_Format(PyExc_ValueError, "not a SlimeRPC message (magic %R)", magic);
        Py_XDECREF(magic);
        return -1;
    }
    *flags = codec_get_u32(m + 4);
    uint64_t nseg = codec_get_u32(m + 8), body = codec_get_u64(m + 16);
    size_t room = len - CODEC_HEAD_LEN;
    if ((*flags & ~CODEC_F_PICKLE) || codec_get_u32(m + 12) != 0 || nseg > room / CODEC_SEG_LEN
        || body > room - CODEC_SEG_LEN * nseg) {
        bad("its head does not fit it");
        return -1;
    }
    d->segs = m + CODEC_HEAD_LEN;
    d->nseg = (size_t)nseg;
    d->p = d->segs + CODEC_SEG_LEN * nseg;
    d->end = d->p + body;
    for (size_t i = 0; i < d->nseg; i++) {
        uint64_t off = codec_get_u64(d->segs + CODEC_SEG_LEN * i), n = codec_get_u64(d->segs + CODEC_SEG_LEN * i + 8);
        if (off > len || n > len - off) {
            bad("a segment lies outside the message");
            return -1;
        }
    }
    return 0;
}

/* A pickled body: unpickle_body(message, start, end, segments). */
static PyObject *unpickle(dec_t *d, const unsigned char *m, PyObject *unpickle_body)
{
    PyObject *segs = PyTuple_New((Py_ssize_t)d->nseg);
    for (size_t i = 0; segs && i < d->nseg; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)codec_get_u64(d->segs + CODEC_SEG_LEN * i),
                                       (unsigned long long)codec_get_u64(d->segs + CODEC_SEG_LEN * i + 8));
        if (!pair)
            Py_CLEAR(segs);
        else
            PyTuple_SET_ITEM(segs, (Py_ssize_t)i, pair);
    }
    if (!segs)
        return NULL;
    PyObject *obj = PyObject_CallFunction(unpickle_body, "OnnO", d->msg, (Py_ssize_t)(d->p - m),
                                          (Py_ssize_t)(d->end - m), segs);
    Py_DECREF(segs);
    return obj;
}

PyObject *slime_py_codec_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "codec_decode(message, unpickle_body)");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *m = buf.buf;
    dec_t d = {.msg = args[0], .base = m};
    uint32_t flags;
    PyObject *obj = NULL;
    if (check_head(&d, m, (size_t)buf.len, &flags) == 0) {
        if (flags & CODEC_F_PICKLE)
            obj = unpickle(&d, m, args[1]);
        else if ((obj = decode(&d, 0)) && d.p != d.end)
            Py_SETREF(obj, bad("bytes left over after the object"));
    }
    Py_XDECREF(d.view);
    PyBuffer_Release(&buf);
    return obj;
}
