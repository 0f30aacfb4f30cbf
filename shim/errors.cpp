// errors.cpp - see errors.h.
#include "errors.h"

#include <c10/util/Exception.h>

namespace dlslime_shim {

namespace {

// Statuses that mean the caller passed something wrong, as opposed to the
// network or a peer failing: these surface as RuntimeError.
bool is_argument_error(slime_status_t status) {
  return status == SLIME_ERR_INVAL || status == SLIME_ERR_UNSUPPORTED ||
      status == SLIME_ERR_TRUNCATED;
}

} // namespace

const char* torch_words(slime_status_t status) {
  switch (status) {
    case SLIME_ERR_TIMEOUT: return "Timed out";
    case SLIME_ERR_PEER_LOST: return "Connection closed by peer";
    case SLIME_ERR_CLOSED:
      return "Process group was aborted or shut down: communicator closed";
    default: return nullptr;
  }
}

std::string status_message(const std::string& what, slime_status_t status,
                           const std::string& detail) {
  const char* words = torch_words(status);
  std::string msg = "dlslime: " + what + " failed: ";
  if (words)
    msg += std::string(words) + " (" + slime_status_name(status) + ", " +
        slime_strerror(status) + ")";
  else
    msg += std::string(slime_status_name(status)) + " (" +
        slime_strerror(status) + ")";
  if (!detail.empty())
    msg += ": " + detail;
  return msg;
}

std::exception_ptr backend_error(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr status_exception(const std::string& what,
                                    slime_status_t status,
                                    const std::string& detail) {
  std::string msg = status_message(what, status, detail);
  if (!is_argument_error(status))
    return backend_error(msg);
  try {
    TORCH_CHECK(false, msg);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr; // not reached
}

void throw_last_error(const std::string& what, slime_status_t status) {
  std::rethrow_exception(status_exception(what, status, slime_last_error()));
}

} // namespace dlslime_shim
