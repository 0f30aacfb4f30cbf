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

#include <stdbool.h>
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

/* A tensor's dims as the message gives them (checked: none negative). */
typedef struct {
    int ndim;
    int64_t dims[CODEC_NDIM_MAX];
} dec_shape_t;

/* The element count, or -1 where it overflows. */
static int64_t numel(const dec_shape_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < sh->ndim; i++) {
        if (sh->dims[i] == 0)
            return 0;
        if (__builtin_mul_overflow(n, sh->dims[i], &n))
            n = -1;
    }
    return n;
}

/* The dims as a tuple, for torch's Python API. */
static PyObject *shape_tuple(const dec_shape_t *sh)
{
    PyObject *shape = PyTuple_New(sh->ndim);
    for (int i = 0; shape && i < sh->ndim; i++) {
        PyObject *v = PyLong_FromLongLong(sh->dims[i]);
        if (!v)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, v);
    }
    return shape;
}

/* A new tensor of shape, of like's dtype, holding a copy of the nbytes
 * at src, through torch's Python API.  The dims go as separate
 * arguments: torch parses a tuple, or a dtype= keyword, much slower. */
static PyObject *copied_by_python(PyObject *like, PyObject *shape, const unsigned char *src, size_t nbytes)
{
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

/* A tensor over the message's bytes at offset (torch.frombuffer over
 * d->view: it keeps the message alive), viewed as shape. */
static PyObject *aliased_by_python(dec_t *d, PyObject *dtype, PyObject *shape, uint64_t offset, int64_t n)
{
    codec_state_t *s = &codec_state;
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
 * bytes or more is used where it lies (no copy of a large tensor; it
 * keeps a memoryview of the message); a smaller one is copied, which
 * costs fewer torch calls than a view of the message and does not keep
 * the whole message alive.  Through the shim's ATen calls where it
 * loaded (a half to a third of the time), else torch's Python API. */
static PyObject *make_tensor(dec_t *d, const codec_dtype_t *dt, const dec_shape_t *sh, uint64_t offset, int64_t n,
                             size_t nbytes)
{
    const slime_tensor_api_t *api = codec_state.tensor_api;
    bool copy = nbytes < CODEC_TAIL_MIN;
    if (!copy && !d->view && !(d->view = PyMemoryView_FromObject(d->msg)))
        return NULL;
    if (api && copy)
        return api->new_copy(dt->dtype, sh->ndim, sh->dims, d->base + offset, nbytes);
    if (api)
        return api->alias(dt->dtype, sh->ndim, sh->dims, (char *)PyMemoryView_GET_BUFFER(d->view)->buf + offset,
                          d->view);
    PyObject *shape = shape_tuple(sh);
    if (!shape)
        return NULL;
    PyObject *t = copy ? copied_by_python(dt->like, shape, d->base + offset, nbytes)
                       : aliased_by_python(d, dt->dtype, shape, offset, n);
    Py_DECREF(shape);
    return t;
}

/* The ndim dims at the cursor into *sh; -1 (an error set) where they
 * are not there or one is negative. */
static int read_dims(dec_t *d, unsigned ndim, dec_shape_t *sh)
{
    const unsigned char *at;
    if (take(d, 8 * (size_t)ndim, &at) < 0)
        return -1;
    sh->ndim = (int)ndim;
    for (unsigned i = 0; i < ndim; i++) {
        sh->dims[i] = (int64_t)codec_get_u64(at + 8 * i);
        if (sh->dims[i] < 0) {
            bad("a negative tensor dimension");
            return -1;
        }
    }
    return 0;
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
    dec_shape_t sh;
    if (read_dims(d, ndim, &sh) < 0)
        return NULL;
    uint64_t offset = codec_get_u64(d->segs + CODEC_SEG_LEN * seg);
    uint64_t nbytes = codec_get_u64(d->segs + CODEC_SEG_LEN * seg + 8);
    int64_t n = numel(&sh), total;
    if (n < 0 || __builtin_mul_overflow(n, (int64_t)codec_dtypes[code].itemsize, &total)
        || (uint64_t)total != nbytes)
        return bad("a tensor's shape does not match its segment");
    if (codec_need_torch() < 0)
        return NULL;
    if (!codec_dtypes[code].dtype)
        return bad("a tensor of a dtype this torch lacks");
    return make_tensor(d, &codec_dtypes[code], &sh, offset, n, (size_t)nbytes);
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
