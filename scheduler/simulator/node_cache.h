// NodeCache: the modelled KV store of one simulated node — GPU, DRAM and SSD tiers, each an LRU
// of whole blocks. A block lives in exactly one tier: using it promotes it to the GPU, overflow
// demotes the least recent block one tier down, and the SSD's overflow is dropped. Every change
// is published to the scheduler's PrefixIndex as the matching KV event (stored / moved /
// evicted), as a real node's cache server would.
//
// Not thread-safe (the simulator is single-threaded).
#pragma once

#include <list>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "scheduler/prefix_index.h"

namespace strata::scheduler::sim {

class NodeCache {
 public:
  // Capacities in blocks per tier (gpu, dram, ssd); 0 disables a tier.
  NodeCache(NodeIndex node, std::array<uint64_t, kNumTiers> capacity_blocks, PrefixIndex* index);

  // Length of the contiguous prefix of `keys` held (any tier), with the tier split.
  NodePrefix Prefix(std::span<const BlockKey> keys) const;
  // Tier split of those of `keys` held (any position).
  TierCounts Tiers(std::span<const BlockKey> keys) const;
  // Stores or promotes `keys` to the GPU tier (most recently used).
  void Use(std::span<const BlockKey> keys);
  // Marks `keys` recently used where they are (a read by another node).
  void Touch(std::span<const BlockKey> keys);

  uint64_t blocks() const { return where_.size(); }

 private:
  struct Slot {
    CacheTier tier;
    std::list<BlockKey>::iterator it;
  };
  void Place(const BlockKey& key, CacheTier tier);
  void Overflow(int tier);

  NodeIndex node_;
  std::array<uint64_t, kNumTiers> capacity_;
  PrefixIndex* index_;
  std::array<std::list<BlockKey>, kNumTiers> lru_;  // front = most recent
  absl::flat_hash_map<BlockKey, Slot> where_;
};

}  // namespace strata::scheduler::sim
