// op_spec.h - the WorkSpec of a collective whose buffers were staged.
#pragma once

#include <functional>
#include <vector>

#include "staging.h"
#include "work.h"

namespace dlslime_shim {

// The Work's success action: the staging copies back to the caller's
// tensors (nullptr when there are none).
inline std::function<void(slime_req_t*)> copy_back_of(const Staging& staging) {
  auto copy_back = staging.copy_back();
  if (!copy_back)
    return nullptr;
  return [copy_back](slime_req_t*) { copy_back(); };
}

// async_op: the op's opts.asyncOp, where the op passes it on (false: the
// poster waits at once, WorkSpec::poster_waits).
inline WorkSpec collective_spec(c10d::OpType type, const char* title,
                                const char* what,
                                std::vector<at::Tensor> outputs,
                                Staging& staging, bool async_op = true) {
  WorkSpec spec;
  spec.poster_waits = !async_op;
  spec.type = type;
  spec.profiling_title = title;
  spec.what = what;
  spec.outputs = std::move(outputs);
  spec.on_success = copy_back_of(staging);
  spec.keep_alive = staging.take_keep_alive();
  return spec;
}

} // namespace dlslime_shim
