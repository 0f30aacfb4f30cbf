// tensor_api.cpp - the table of csrc/python/tensor_api.h: CPU tensors made
// through ATen for the RPC codec of dlslime_torch._C, which is C and
// would otherwise make and read each through torch's Python API (about
// twice the time for a small tensor).
#include "tensor_api.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ATen.h>

#include <cstring>
#include <exception>

namespace dlslime_shim {
namespace {

// A CPU tensor of dtype's options; false (a TypeError set) where dtype
// is not a torch.dtype.
bool options_of(PyObject* dtype, const char* who, at::TensorOptions* out) {
  if (!THPDtype_Check(dtype)) {
    PyErr_Format(PyExc_TypeError, "tensor_api.%s: not a torch.dtype", who);
    return false;
  }
  *out = at::TensorOptions().dtype(reinterpret_cast<THPDtype*>(dtype)->scalar_type);
  return true;
}

PyObject* new_copy(PyObject* dtype, int ndim, const int64_t* dims, const void* src, size_t nbytes) {
  at::TensorOptions options;
  if (!options_of(dtype, "new_copy", &options))
    return nullptr;
  try {
    at::Tensor t = at::empty(c10::IntArrayRef(dims, static_cast<size_t>(ndim)), options);
    if (t.nbytes() != nbytes) {
      PyErr_SetString(PyExc_ValueError, "tensor_api.new_copy: the bytes do not match the shape");
      return nullptr;
    }
    if (nbytes) std::memcpy(t.data_ptr(), src, nbytes);
    return THPVariable_Wrap(std::move(t));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* alias(PyObject* dtype, int ndim, const int64_t* dims, void* data, PyObject* owner) {
  at::TensorOptions options;
  if (!options_of(dtype, "alias", &options))
    return nullptr;
  try {
    Py_INCREF(owner);
    // the storage may be freed in any thread, with or without the GIL
    auto release = [owner](void*) {
      PyGILState_STATE gil = PyGILState_Ensure();
      Py_DECREF(owner);
      PyGILState_Release(gil);
    };
    // (should from_blob throw, owner keeps one reference too many: a
    // leak, where dropping it could free owner twice once the deleter is
    // taken; the dims were checked against the bytes already)
    at::Tensor t = at::from_blob(data, c10::IntArrayRef(dims, static_cast<size_t>(ndim)), release, options);
    return THPVariable_Wrap(std::move(t));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

int describe(PyObject* obj, slime_tensor_desc_t* out) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "tensor_api.describe: not a torch.Tensor");
    return -1;
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.device().is_cpu() || !t.is_contiguous() || t.is_conj() || t.is_neg() ||
        t.dim() > SLIME_TENSOR_API_NDIM_MAX)
      return 0;
    out->dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    out->ndim = static_cast<int>(t.dim());
    for (int i = 0; i < out->ndim; i++) out->dims[i] = t.size(i);
    out->data = t.data_ptr();
    out->nbytes = t.nbytes();
    return 1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

const slime_tensor_api_t api = {SLIME_TENSOR_API_VERSION, describe, new_copy, alias};

}  // namespace

PyObject* tensor_api_capsule() {
  return PyCapsule_New(const_cast<slime_tensor_api_t*>(&api), SLIME_TENSOR_API_CAPSULE, nullptr);
}

}  // namespace dlslime_shim
