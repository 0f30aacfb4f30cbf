// errors.h - turning libdlslime statuses into torch exceptions.
//
// Failures of the transport (a lost peer, a timeout, a closed
// communicator) become c10::DistBackendError, which Python sees as
// torch.distributed.DistBackendError; misuse (a wrong dtype, a bad rank)
// becomes c10::Error (RuntimeError) through TORCH_CHECK.  Every message
// starts with "dlslime: <op>", says what failed in torch's words where
// torch has them (time-outs "Timed out", lost peers and aborted groups
// "closed", as torch's own tests match them) and carries the C library's
// status and detail text after them.
#pragma once

#include <exception>
#include <string>

#include <dlslime/dlslime.h>

namespace dlslime_shim {

// How torch words a failure of this kind (what its tests and tools match:
// "Timed out", "closed"), or nullptr for a status torch has no words for.
const char* torch_words(slime_status_t status);

// "dlslime: <what> failed: <torch's words> (SLIME_ERR_X, <short text>):
// <detail>", or without torch's words "... failed: SLIME_ERR_X (<short
// text>): <detail>".
std::string status_message(const std::string& what, slime_status_t status,
                           const std::string& detail);

// The exception for a failed request or call: DistBackendError for
// transport failures, c10::Error for argument errors.
std::exception_ptr status_exception(const std::string& what,
                                    slime_status_t status,
                                    const std::string& detail);

// Throws status_exception with slime_last_error() of this thread as the
// detail; call right after the failing C call, in the same thread.
[[noreturn]] void throw_last_error(const std::string& what,
                                   slime_status_t status);

// A DistBackendError with this message.
std::exception_ptr backend_error(const std::string& message);

} // namespace dlslime_shim
