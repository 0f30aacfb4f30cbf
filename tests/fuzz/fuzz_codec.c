/* The RPC codec's decoder (csrc/python/codec_decode.c), in an embedded
 * CPython: the input is a message from a peer.  A malformed one must
 * raise ValueError (TypeError for an unhashable dict key), never crash,
 * leak or read outside the input; a well-formed one must encode again
 * to a message that decodes to an object encoding to the same bytes.
 *
 * torch is kept out (sys.modules["torch"] = None), so a tensor tag that
 * passes every check ends in ImportError: the checks are this target's
 * business, tensor construction is torch's.  A pickled body is handed to
 * a callback that only checks the bounds the decoder passes it.
 *
 * Leak checking is off in this process: the interpreter keeps caches and
 * interned objects for its whole life, which LeakSanitizer would report
 * after every input.  A reference the codec drops too often still shows
 * as a use after free. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "codec.h"

static PyObject *decode, *encode, *unpickle, *pickle_body;

int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return 1; }

static const char SETUP[] =
    "import sys\n"
    "sys.modules['torch'] = None\n"
    "def unpickle(message, start, end, segments):\n"
    "    n = len(memoryview(message))\n"
    "    assert 0 <= start <= end <= n, (start, end, n)\n"
    "    assert all(0 <= o <= n and 0 <= k <= n - o for o, k in segments)\n"
    "    return None\n"
    "def pickle_body(obj, tensors):\n"
    "    raise AssertionError('a decoded object needed the pickle fallback')\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    Py_InitializeEx(0);
    PyObject *codec = PyModule_New("codec");
    PyObject *main = PyImport_AddModule("__main__");
    if (!codec || !main || slime_py_codec_init(codec) < 0 || PyRun_SimpleString(SETUP) < 0) {
        PyErr_Print();
        __builtin_trap();
    }
    decode = PyObject_GetAttrString(codec, "codec_decode");
    encode = PyObject_GetAttrString(codec, "codec_encode");
    unpickle = PyObject_GetAttrString(main, "unpickle");
    pickle_body = PyObject_GetAttrString(main, "pickle_body");
    if (!decode || !encode || !unpickle || !pickle_body) __builtin_trap();
    return 0;
}

/* The head of encode(obj) (a new reference); traps where encoding a
 * decoded object fails or makes a tail. */
static PyObject *head_of(PyObject *obj) {
    PyObject *pair = PyObject_CallFunctionObjArgs(encode, obj, pickle_body, NULL);
    if (!pair) {
        PyErr_Print();
        __builtin_trap();
    }
    if (PyTuple_GET_ITEM(pair, 1) != Py_None) __builtin_trap();
    PyObject *head = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
    Py_DECREF(pair);
    return head;
}

static void check_round_trip(PyObject *obj) {
    PyObject *head = head_of(obj);
    PyObject *copy = PyByteArray_FromObject(head);
    PyObject *again = copy ? PyObject_CallFunctionObjArgs(decode, copy, unpickle, NULL) : NULL;
    if (!again) {
        PyErr_Print();
        __builtin_trap();
    }
    PyObject *head2 = head_of(again);
    if (PyObject_RichCompareBool(head, head2, Py_EQ) != 1) __builtin_trap();
    Py_DECREF(head2);
    Py_DECREF(again);
    Py_DECREF(copy);
    Py_DECREF(head);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PyObject *msg = PyByteArray_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    if (!msg) __builtin_trap();
    PyObject *obj = PyObject_CallFunctionObjArgs(decode, msg, unpickle, NULL);
    if (obj) {
        uint32_t flags = size >= 8 ? codec_get_u32(data + 4) : 0;
        if (!(flags & CODEC_F_PICKLE)) check_round_trip(obj);
        Py_DECREF(obj);
    } else if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)
               || PyErr_ExceptionMatches(PyExc_ImportError)) {
        PyErr_Clear();
    } else {
        PyErr_Print();   /* an assertion of the callbacks, or an error of another kind */
        __builtin_trap();
    }
    Py_DECREF(msg);
    return 0;
}
