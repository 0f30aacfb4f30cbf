// watched_allocator.h - torch's CPU allocator, wrapped so that large
// tensors' memory is watched (slime_mem_watch) from allocation to free:
// transports that must register send/recv buffers (verbs) may then keep
// those registrations instead of registering every message again.
#pragma once

namespace dlslime_shim {

// Installs the wrapper once per process (later calls do nothing).  Left
// out when $DLSLIME_WATCH_CPU_ALLOCATOR is 0, or when the allocator in
// place has no raw deleter to hand frees to.
void watch_cpu_allocator();

} // namespace dlslime_shim
