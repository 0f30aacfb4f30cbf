// bindings.cpp - dlslime_torch._shim, the extension module: the Backend
// class as a subclass of torch.distributed's Backend, and the process-wide
// comm-id registry.  dlslime_torch.backend makes the objects; users never
// call this module directly.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"

namespace py = pybind11;

namespace dlslime_shim {

// The Python object's reference to the backend; dropping it releases the
// GIL first, because destroying a communicator waits for its worker,
// whose completions may run Python callbacks (DDP comm hooks).  One
// pointer, like torch's own holder for Backends, so torch can read it as
// a c10::intrusive_ptr<c10d::Backend>.
template <typename T>
class NoGilPtr {
 public:
  NoGilPtr() = default;
  explicit NoGilPtr(T* p) : impl_(c10::intrusive_ptr<T>::reclaim_copy(p)) {}
  NoGilPtr(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  NoGilPtr(const NoGilPtr&) = default;
  NoGilPtr(NoGilPtr&&) noexcept = default;
  NoGilPtr& operator=(const NoGilPtr&) = default;
  NoGilPtr& operator=(NoGilPtr&&) noexcept = default;
  ~NoGilPtr() {
    if (impl_ && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      impl_.reset();
    }
  }
  T* get() const noexcept { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};

static_assert(sizeof(NoGilPtr<BackendDlslime>) ==
                  sizeof(c10::intrusive_ptr<c10d::Backend>),
              "torch reads the holder as an intrusive_ptr");

} // namespace dlslime_shim

PYBIND11_DECLARE_HOLDER_TYPE(T, dlslime_shim::NoGilPtr<T>, true)

namespace {

using dlslime_shim::BackendDlslime;

dlslime_shim::NoGilPtr<BackendDlslime> make_backend(
    int rank, int size, uintptr_t ctx, const std::vector<uintptr_t>& peers,
    uint32_t comm_id, uint64_t epoch, int64_t timeout_ms,
    const std::string& group_name) {
  std::vector<slime_ep_t*> eps;
  for (uintptr_t p : peers)
    eps.push_back(reinterpret_cast<slime_ep_t*>(p));
  return c10::make_intrusive<BackendDlslime>(
      rank, size, reinterpret_cast<slime_ctx_t*>(ctx), std::move(eps),
      comm_id, epoch, std::chrono::milliseconds(timeout_ms), group_name);
}

} // namespace

namespace dlslime_shim {
PyObject* tensor_api_capsule();  // tensor_api.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch.distributed backend 'dlslime' over libdlslime "
            "(internal: use dlslime_torch)";
  py::object backend_base =
      py::module_::import("torch.distributed").attr("Backend");
  (void)backend_base; // torch's Backend class must be registered first
  py::class_<BackendDlslime, c10d::Backend, dlslime_shim::NoGilPtr<BackendDlslime>>(
      m, "BackendDlslime")
      .def(py::init(&make_backend), py::arg("rank"), py::arg("size"),
           py::arg("ctx"), py::arg("peers"), py::arg("comm_id"),
           py::arg("epoch"), py::arg("timeout_ms"), py::arg("group_name"),
           py::call_guard<py::gil_scoped_release>(),
           "BackendDlslime(rank, size, ctx, peers, comm_id, epoch, "
           "timeout_ms, group_name): ctx and peers are the slime_ctx_t / "
           "slime_ep_t "
           "pointers of dlslime_torch._C objects (Context.handle, "
           "Endpoint.handle); peers[rank] is ignored.")
      .def_property_readonly("comm_id", &BackendDlslime::comm_id)
      .def_property_readonly("group_name", &BackendDlslime::group_name)
      .def_property_readonly("is_shut_down", &BackendDlslime::is_shut_down);
  m.def("comm_id_owner", &BackendDlslime::comm_id_owner, py::arg("comm_id"),
        "The group name of the live dlslime process group that uses "
        "comm_id in this process, or '' if none.");
  m.def("comm_id_last_epoch", &BackendDlslime::comm_id_last_epoch,
        py::arg("comm_id"),
        "The epoch of the last dlslime process group made with comm_id in "
        "this process (0 if none was).");
  m.def("shutdown_all", &BackendDlslime::shutdown_all,
        py::call_guard<py::gil_scoped_release>(),
        "Shuts down every live dlslime process group of this process.");
  m.attr("tensor_api") =
      py::reinterpret_steal<py::object>(dlslime_shim::tensor_api_capsule());
}
