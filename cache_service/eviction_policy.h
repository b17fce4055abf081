// Which blocks leave a tier when it must make room: least recently used first, prefix-aware.
//
// A block whose chain continues in the same tier (a child of it is resident there) is not a
// candidate: chains are evicted from their tail, so a cached suffix is never left without its
// prefix. Evicting a tail makes its parent a tail, which then competes by its own last access.
// Blocks that may not go (pinned, being read, being written) are never selected, and they shield
// their ancestors in that tier.
//
// Pure logic, no locks: the store calls it under its own mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/block_key.h"

namespace strata::cache {

struct EvictionCandidate {
  BlockKey key;
  BlockKey parent;  // all zero for a chain's first block
  int64_t last_access_ms = 0;
  bool evictable = true;  // false: pinned, leased or busy
};

// Up to `count` keys from `resident` (every block resident in the tier), in eviction order.
std::vector<BlockKey> SelectVictims(const std::vector<EvictionCandidate>& resident, size_t count);

}  // namespace strata::cache
