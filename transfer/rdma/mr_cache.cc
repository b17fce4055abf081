#include "transfer/rdma/mr_cache.h"

#include <algorithm>

#include "common/strings.h"

namespace strata::transfer::rdma {

std::shared_ptr<MemoryRegion> MrCache::FindLocked(uint64_t start, uint64_t length,
                                                  uint32_t access) {
  for (Entry& e : entries_) {
    if (e.mr->addr() <= start && start + length <= e.mr->addr() + e.mr->length() &&
        (e.access & access) == access) {
      e.last_use = ++tick_;
      ++stats_.hits;
      return e.mr;
    }
  }
  return nullptr;
}

std::shared_ptr<MemoryRegion> MrCache::Find(const void* addr, uint64_t length, uint32_t access) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(reinterpret_cast<uint64_t>(addr), length, access);
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> MrCache::Get(void* addr, uint64_t length,
                                                           uint32_t access) {
  if (addr == nullptr || length == 0) {
    return absl::InvalidArgumentError("rdma: cannot register an empty buffer");
  }
  const uint64_t start = reinterpret_cast<uint64_t>(addr);
  if (start + length < start) return absl::InvalidArgumentError("rdma: buffer range overflows");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto hit = FindLocked(start, length, access)) return hit;
    ++stats_.misses;
  }
  uint64_t lo = start, hi = start + length;
  bool cacheable = !widen_;
  if (widen_) {
    auto [wa, wl] = widen_(addr, length);
    const uint64_t wlo = reinterpret_cast<uint64_t>(wa);
    if (wa != nullptr && wlo <= lo && wlo + wl >= hi) {
      lo = wlo;
      hi = wlo + wl;
      cacheable = true;
    }
  }
  const uint64_t page = options_.page_size;
  lo = lo / page * page;
  hi = (hi + page - 1) / page * page;
  auto mr = register_(reinterpret_cast<void*>(lo), hi - lo, access);
  if (!mr.ok()) return mr.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (!cacheable) {
    ++stats_.uncached;
    return *mr;
  }
  entries_.push_back({*mr, access, ++tick_});
  bytes_ += (*mr)->length();
  EvictLocked();
  return *mr;
}

void MrCache::EvictLocked() {
  // Never evict the entry just added (the highest tick) unless it alone breaks the bounds.
  while (entries_.size() > 1 &&
         (entries_.size() > options_.max_entries || bytes_ > options_.max_bytes)) {
    auto lru =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    bytes_ -= lru->mr->length();
    entries_.erase(lru);
    ++stats_.evictions;
  }
}

size_t MrCache::Invalidate(const void* addr, uint64_t length) {
  const uint64_t lo = reinterpret_cast<uint64_t>(addr);
  const uint64_t hi = lo + length;
  std::vector<std::shared_ptr<MemoryRegion>> dropped;  // deregistered outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::remove_if(entries_.begin(), entries_.end(), [&](Entry& e) {
    const bool overlap = e.mr->addr() < hi && lo < e.mr->addr() + e.mr->length();
    if (overlap) {
      bytes_ -= e.mr->length();
      dropped.push_back(std::move(e.mr));
    }
    return overlap;
  });
  entries_.erase(it, entries_.end());
  stats_.invalidations += static_cast<int64_t>(dropped.size());
  return dropped.size();
}

void MrCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  bytes_ = 0;
}

MrCacheStats MrCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MrCacheStats s = stats_;
  s.entries = entries_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace strata::transfer::rdma
