// watched_allocator.cpp - see watched_allocator.h.
//
// Every allocation gets our deleter (raw_allocate/raw_deallocate need one
// deleter for all): it ends the watch if there is one, then hands the
// pointer to the wrapped allocator's deleter.  Memory that existed before
// the wrapper keeps its old deleter and is never watched, so nothing is
// kept for it.
//
// Tensors of kAlignMin bytes or more start on a huge-page boundary: the
// wrapper asks for kHuge bytes more and hands out the aligned address
// inside (the slack is address space, never touched).  Registering a
// region moves its whole huge pages onto huge pages (core/hugepages.c),
// which doubles the speed of a shm peer's copies of it; aligned, that is
// all of the tensor but its tail, instead of leaving its first megabytes
// on small pages.  Smaller watched tensors start on a page boundary, for
// the same over-allocation by a page: the wrapped allocator's large
// blocks (glibc maps them) start 64 bytes into a page, and receiving into
// such a buffer over tcp ran slower here (the kernel's copy into it:
// 2-rank all_reduce of 1 MiB, p50 400-440 us at page offset 64 against
// 280-330 at offset 0, while offsets 8, 56, 72, 512 and 2048 ran like 0;
// p2p_bench with its buffers shifted, and the same through torch).  A
// map from the aligned address to the wrapped allocator's finds what to
// free.
#include "watched_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>
#include <dlslime/dlslime.h>

namespace dlslime_shim {

namespace {

// Smaller buffers never get a registration of their own (they go through
// the transport's bounce buffers), so watching them would only cost.
constexpr size_t kWatchMin = 256 * 1024;

constexpr size_t kHuge = 2 << 20;
constexpr size_t kAlignMin = kHuge;
constexpr size_t kPage = 4096;

// The boundary a tensor of n bytes starts on; 1: wherever the wrapped
// allocator puts it.
size_t boundary_for(size_t n) {
  if (n >= kAlignMin) return kHuge;
  return n >= kWatchMin ? kPage : 1;
}

c10::DeleterFnPtr wrapped_delete = nullptr;

// aligned address handed out -> the wrapped allocator's; every entry is
// watched memory, so only frees of watched memory look here
std::mutex shifted_mu;
std::unordered_map<void*, void*> shifted;

void delete_watched(void* p) {
  if (p && slime_mem_watched(p, 1)) {
    (void)slime_mem_unwatch(p);
    std::lock_guard<std::mutex> hold(shifted_mu);
    auto it = shifted.find(p);
    if (it != shifted.end()) {
      p = it->second;
      shifted.erase(it);
    }
  }
  wrapped_delete(p);
}

struct WatchedAllocator final : c10::Allocator {
  explicit WatchedAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    size_t boundary = boundary_for(n);
    bool align = boundary > 1 && n <= SIZE_MAX - boundary;
    c10::DataPtr inner = inner_->allocate(align ? n + boundary : n);
    void* p = inner.get();
    if (!p) return inner;
    // ours from here on: the inner deleter runs in delete_watched
    inner.release_context();
    if (align) {
      auto at = (reinterpret_cast<uintptr_t>(p) + boundary - 1) & ~static_cast<uintptr_t>(boundary - 1);
      void* aligned = reinterpret_cast<void*>(at);
      // handed out shifted only when watched, so that its free looks here;
      // else p itself, unaligned (it has the bytes)
      if (aligned != p && slime_mem_watch(aligned, n) == SLIME_OK) {
        try {
          std::lock_guard<std::mutex> hold(shifted_mu);
          shifted.emplace(aligned, p);
        } catch (...) {
          (void)slime_mem_unwatch(aligned);
          wrapped_delete(p);
          throw;
        }
        return {aligned, aligned, &delete_watched, c10::Device(c10::DeviceType::CPU)};
      }
      if (aligned != p) return {p, p, &delete_watched, c10::Device(c10::DeviceType::CPU)};
    }
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
