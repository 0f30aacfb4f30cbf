// watched_allocator.cpp - see watched_allocator.h.
//
// Every allocation gets our deleter (raw_allocate/raw_deallocate need one
// deleter for all): it ends the watch if there is one, then hands the
// pointer to the wrapped allocator's deleter.  Memory that existed before
// the wrapper keeps its old deleter and is never watched, so nothing is
// kept for it.
#include "watched_allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include <c10/core/CPUAllocator.h>
#include <dlslime/dlslime.h>

namespace dlslime_shim {

namespace {

// Smaller buffers never get a registration of their own (they go through
// the transport's bounce buffers), so watching them would only cost.
constexpr size_t kWatchMin = 256 * 1024;

c10::DeleterFnPtr wrapped_delete = nullptr;

void delete_watched(void* p) {
  if (p && slime_mem_watched(p, 1)) (void)slime_mem_unwatch(p);
  wrapped_delete(p);
}

struct WatchedAllocator final : c10::Allocator {
  explicit WatchedAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* p = inner.get();
    if (!p) return inner;
    // ours from here on: the inner deleter runs in delete_watched
    inner.release_context();
    if (n >= kWatchMin) (void)slime_mem_watch(p, n);
    return {p, p, &delete_watched, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_watched; }

  void copy_data(void* dst, const void* src, size_t n) const override {
    default_copy_data(dst, src, n);
  }

 private:
  c10::Allocator* inner_;
};

} // namespace

void watch_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("DLSLIME_WATCH_CPU_ALLOCATOR");
    if (env && std::strcmp(env, "0") == 0) return;
    c10::Allocator* inner = c10::GetCPUAllocator();
    if (!inner || !inner->raw_deleter()) return;
    // A probe: the wrapper needs data == context to take a DataPtr over.
    c10::DataPtr probe = inner->allocate(1);
    if (probe.get() != probe.get_context()) return;
    wrapped_delete = inner->raw_deleter();
    // torch owns the allocator from here; it lives as long as the process
    c10::SetCPUAllocator(new WatchedAllocator(inner), /*priority=*/0);
  });
}

} // namespace dlslime_shim
