/*
 * codec.h - the message of a default RPC method (dlslime_torch.rpc.codec).
 *
 * Layout, little endian:
 *   head:  "SRP2" | u32 flags | u32 nseg | u32 zero | u64 body_len
 *   nseg x (u64 offset, u64 nbytes)       where each tensor's bytes lie
 *   body (body_len bytes)                 the object, tagged (below), or
 *                                         a pickle when flags has F_PICKLE
 *   segments, each at a 64-byte aligned offset; the largest of TAIL_MIN
 *   bytes or more (the tail) comes last and is sent from the tensor's own
 *   memory, so it is not part of the encoded head.
 *
 * Tagged body: 'N' None, 'T' True, 'F' False, 'i' i64, 'd' f64,
 * 's' u32 len + UTF-8, 'b' u32 len + bytes, '(' tuple / '[' list: u32 n
 * + n items, '{' dict: u32 n + n (key, value), 'X' tensor: u8 dtype,
 * u8 ndim, u32 segment, ndim x i64 dims.  Anything else (subclasses
 * included, so types come back as they went) sends the whole message as
 * a pickle whose tensors are segments all the same.
 *
 * The decoder trusts nothing in a message: every length is checked
 * against the bytes that are there, containers nest at most DEPTH_MAX
 * deep, and no allocation is larger than the message itself.
 */
#ifndef SLIME_PY_CODEC_H
#define SLIME_PY_CODEC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#include "tensor_api.h"

#define CODEC_MAGIC "SRP2"
#define CODEC_HEAD_LEN 24
#define CODEC_SEG_LEN 16
#define CODEC_ALIGN 64
#define CODEC_TAIL_MIN (64 << 10)
#define CODEC_DEPTH_MAX 64
#define CODEC_NDIM_MAX 32
#define CODEC_F_PICKLE 1u

/* The body's tags (ASCII, for a readable dump). */
enum {
    TAG_NONE = 'N', TAG_TRUE = 'T', TAG_FALSE = 'F', TAG_INT = 'i', TAG_FLOAT = 'd', TAG_STR = 's',
    TAG_BYTES = 'b', TAG_TUPLE = '(', TAG_LIST = '[', TAG_DICT = 0x7b, TAG_TENSOR = 'X',
};

/* torch's dtypes by their code on the wire; an entry is NULL where this
 * torch lacks that dtype. */
typedef struct {
    const char *name;
    int itemsize;
    PyObject *dtype;
    PyObject *like;   /* an empty tensor of it: like.new_empty(*dims) parses no dtype= */
} codec_dtype_t;

typedef struct {
    PyObject *tensor_type;      /* torch.Tensor, once torch is imported */
    PyObject *frombuffer;       /* torch.frombuffer */
    PyObject *kw_frombuffer;    /* ("dtype", "count", "offset") */
    const slime_tensor_api_t *tensor_api;   /* the shim's, or NULL */
    PyObject *s_torch, *s_dtype, *s_shape, *s_is_cpu, *s_is_contiguous, *s_is_conj, *s_is_neg,
        *s_data_ptr, *s_new_empty, *s_nbytes, *s_view;
} codec_state_t;

extern codec_state_t codec_state;
extern codec_dtype_t codec_dtypes[];
extern const int codec_ndtypes;

/* torch.Tensor if torch is imported (a borrowed reference), else NULL
 * with no error set; -1 with an error where torch looks broken. */
int codec_tensor_type(PyObject **out);
/* Imports torch and fills the state the decoder needs; 0 or -1. */
int codec_need_torch(void);
/* The wire code of a torch dtype, or -1 (no error) if it has none. */
int codec_dtype_code(PyObject *dtype);

/* A read-only buffer over ptr..ptr+len that keeps owner alive. */
PyObject *codec_pin_new(PyObject *owner, const void *ptr, size_t len);
/* If obj is such a buffer with no view of it left, it lets its owner go
 * (the reply no longer needs the tensor: its bytes go back by offset). */
void codec_pin_let_go(PyObject *obj);

PyObject *slime_py_codec_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *slime_py_codec_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int slime_py_codec_init(PyObject *module);

static inline void codec_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void codec_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t codec_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint64_t codec_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

#endif /* SLIME_PY_CODEC_H */
