// MrCache: registers memory regions once and reuses them (ibv_reg_mr pins pages and costs
// tens of microseconds per MiB; a KV block transfer must not pay it every time).
//
// Get(addr, len, access) returns a cached region that covers [addr, addr + len) with at least
// `access`, or registers a new one over the page-rounded range (or over the wider range
// `widen` suggests, e.g. the whole local segment that contains the buffer, so one registration
// serves every block of it).
//
// With a `widen` function, only ranges it places inside a known region (a registered segment,
// whose end Invalidate learns about) are cached; any other buffer is registered for the one
// request and deregistered when the request drops it. Caching arbitrary caller buffers would be
// unsafe: after free() and a new mmap at the same address a cached registration still points at
// the old physical pages (pinned), and the NIC/GPU would silently move the wrong bytes. The cache
// is bounded by entries and bytes: least recently used entries are dropped first. Dropping or
// invalidating an entry only drops the cache's reference: a request that still holds the
// std::shared_ptr keeps the region registered until it completes, so the NIC never loses a region
// under an in-flight work request.
//
// Invalidate(addr, len) drops every entry overlapping the range: call it when a segment is
// unregistered or a buffer freed, so a later buffer at the same address is registered afresh
// (a stale registration would pin the old pages and hand out a stale rkey).
//
// Thread safety: all methods are thread-safe. `register_fn` is called without the lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/rdma/verbs.h"

namespace strata::transfer::rdma {

struct MrCacheOptions {
  size_t max_entries = 256;
  uint64_t max_bytes = 64ull << 30;  // pinned bytes the cache may hold
  uint64_t page_size = 4096;
};

struct MrCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
  int64_t invalidations = 0;
  int64_t uncached = 0;  // one-request registrations (buffers outside every known region)
  size_t entries = 0;
  uint64_t bytes = 0;
};

class MrCache {
 public:
  using RegisterFn = std::function<absl::StatusOr<std::shared_ptr<MemoryRegion>>(
      void* addr, uint64_t length, uint32_t access)>;
  // Optional: the range to register instead of [addr, addr + len) (must contain it).
  using WidenFn = std::function<std::pair<void*, uint64_t>(void* addr, uint64_t length)>;

  MrCache(RegisterFn register_fn, MrCacheOptions options = {}, WidenFn widen = nullptr)
      : register_(std::move(register_fn)), widen_(std::move(widen)), options_(options) {}

  // InvalidArgument for a null address or zero length; the registration's error otherwise.
  absl::StatusOr<std::shared_ptr<MemoryRegion>> Get(void* addr, uint64_t length, uint32_t access);

  // A cached region covering the range with `access`, or null; never registers.
  std::shared_ptr<MemoryRegion> Find(const void* addr, uint64_t length, uint32_t access);

  // Drops every entry overlapping [addr, addr + length); returns how many.
  size_t Invalidate(const void* addr, uint64_t length);
  void Clear();

  MrCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<MemoryRegion> mr;
    uint32_t access = 0;
    uint64_t last_use = 0;
  };
  void EvictLocked();
  std::shared_ptr<MemoryRegion> FindLocked(uint64_t start, uint64_t length, uint32_t access);

  const RegisterFn register_;
  const WidenFn widen_;
  const MrCacheOptions options_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_; small (max_entries): linear scans are fine
  uint64_t tick_ = 0;           // guarded by mu_
  uint64_t bytes_ = 0;          // guarded by mu_
  MrCacheStats stats_;          // guarded by mu_ (entries/bytes filled in by stats())
};

}  // namespace strata::transfer::rdma
