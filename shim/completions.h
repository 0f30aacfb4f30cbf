// completions.h - the thread that runs Future completions.
//
// Marking a Work's Future complete runs the callbacks chained on it, and
// a Python one takes the GIL.  The thread the core completes a request on
// (its progress thread, or a collective's worker) must never wait for
// the GIL: a main thread holding it for longer than the peer silence
// limit would leave the progress thread unable to answer pings, and
// peers would declare this live rank dead.  So the core's completion
// callback only queues; this one process-wide thread runs the queue in
// order (callbacks see the completion order).  A Work nobody asked a
// Future of never comes here: wait() finishes it on the waiter's thread.
#pragma once

#include <chrono>
#include <functional>

namespace dlslime_shim {

// Queues fn to run on the completion thread (started on first use).  fn
// must not throw.  Never blocks for long: callable from the core's
// threads.
void post_completion(std::function<void()> fn);

// Waits (at most timeout) until what was queued before the call has run,
// without holding the GIL meanwhile; false if it ran out.  From the
// completion thread itself (a callback shutting down), true at once:
// it cannot wait for itself.
bool drain_completions(std::chrono::milliseconds timeout);

} // namespace dlslime_shim
