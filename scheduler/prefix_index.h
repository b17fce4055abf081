// PrefixIndex: which nodes hold which KV blocks, and at which tier (ARCHITECTURE.md §7).
//
// Fed by KV events (stored / moved / evicted / quarantined, and paged digests that replace
// everything believed about one source). Answers one question fast: for a request's chain of
// block keys, how long a prefix does each node hold contiguously from block 0, and in which
// tiers. A block key names its whole prefix (common/block_key.h), so a node holding block i of a
// chain can serve blocks 0..i only if it holds each of them; the match stops at the first gap.
//
// Memory is bounded: at most `capacity_blocks` keys are indexed; when full, a key not stored or
// matched recently is forgotten (CLOCK, i.e. LRU with second chance: a match only sets a bit in
// the entry, so the hot path writes no list pointers) (the scheduler then under-estimates a hit,
// never invents one). Soft state: a restart rebuilds it from events and digests.
//
// Thread safety: all methods are safe to call concurrently (one internal mutex).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "common/block_key.h"
#include "scheduler/types.h"

namespace strata::scheduler {

// The prefix one node holds: `blocks` contiguous blocks from the chain's start, `tiers[t]` of
// them at their fastest copy in tier t (sum(tiers) == blocks).
struct NodePrefix {
  NodeIndex node = kNoNode;
  uint32_t blocks = 0;
  TierCounts tiers{};
};

struct PrefixMatch {
  std::vector<NodePrefix> nodes;  // only nodes holding >= 1 block, in no particular order

  // The node holding the longest prefix (kNoNode / 0 blocks when none).
  const NodePrefix* Longest() const;
  // The prefix of `node` (blocks == 0 when it holds none).
  NodePrefix For(NodeIndex node) const;
};

struct PrefixIndexStats {
  uint64_t indexed_blocks = 0;
  uint64_t holders = 0;
  uint64_t memory_bytes = 0;  // estimate
  uint64_t capacity_blocks = 0;
  uint64_t evicted_entries = 0;  // forgotten because the index was full
  uint64_t events_applied = 0;
  uint64_t digests_applied = 0;
};

class PrefixIndex {
 public:
  explicit PrefixIndex(uint64_t capacity_blocks = 1 << 22);

  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // `node` now holds `keys` in `tier` (other tiers it holds them in are kept).
  void Stored(NodeIndex node, CacheTier tier, std::span<const BlockKey> keys);
  // `node` moved `keys` from one tier to another (a missing key is treated as stored at `to`).
  void Moved(NodeIndex node, CacheTier from, CacheTier to, std::span<const BlockKey> keys);
  // `node` dropped `keys` from `tier`, or from every tier when `tier` is nullopt.
  void Evicted(NodeIndex node, std::optional<CacheTier> tier, std::span<const BlockKey> keys);
  // A corrupt copy was found: nobody is trusted to hold `key` until it is stored again.
  void Quarantined(const BlockKey& key);
  // Forget everything about `node` (dead or deregistered).
  void RemoveNode(NodeIndex node);

  // Digest re-sync. Pages of one digest (same `source` and `digest_id`) accumulate; on the last
  // page the node's state in the tiers the pages named (an empty page names its tier too) is
  // replaced by the union of the pages; its other tiers are kept. So a worker's cache server
  // (DRAM, SSD) and the worker itself (GPU: its resident blocks) each re-sync their own part of
  // the node. A page of another digest id from the same source discards the pages collected.
  void DigestPage(NodeIndex node, std::string_view source, uint64_t digest_id, CacheTier tier,
                  std::span<const BlockKey> keys, bool last_page);

  // Longest contiguous prefix of `keys` held by each node. Matched entries count as recently
  // used for the LRU bound.
  PrefixMatch Match(std::span<const BlockKey> keys);

  // True when `node` holds `key` in any tier.
  bool Holds(NodeIndex node, const BlockKey& key) const;
  PrefixIndexStats Stats() const;
  uint64_t BlocksHeldBy(NodeIndex node) const;

 private:
  // (node << 2) | tier: one copy of a block.
  using Holder = uint32_t;
  static Holder MakeHolder(NodeIndex node, CacheTier tier) {
    return (node << 2) | static_cast<uint32_t>(tier);
  }
  static NodeIndex HolderNode(Holder h) { return h >> 2; }
  static CacheTier HolderTier(Holder h) { return static_cast<CacheTier>(h & 3); }

  struct Entry {
    absl::InlinedVector<Holder, 3> holders;
    std::list<BlockKey>::iterator lru;
    bool referenced = false;  // matched since it was last moved to the front
  };
  struct PendingDigest {
    uint64_t digest_id = 0;
    uint32_t tiers = 0;  // bit t: a page named CacheTier t
    std::vector<std::pair<BlockKey, CacheTier>> keys;
  };

  void AddHolderLocked(const BlockKey& key, Holder holder) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveHolderLocked(const BlockKey& key, NodeIndex node, std::optional<CacheTier> tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(absl::flat_hash_map<BlockKey, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `node`'s holders in the tiers of `tiers` (bit t: CacheTier t).
  void RemoveNodeLocked(NodeIndex node, uint32_t tiers = 7) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_blocks_;
  mutable std::mutex mu_;
  absl::flat_hash_map<BlockKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<std::pair<NodeIndex, std::string>, PendingDigest> digests_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeIndex, uint64_t> blocks_per_node_ ABSL_GUARDED_BY(mu_);
  uint64_t holders_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evicted_entries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t digests_applied_ ABSL_GUARDED_BY(mu_) = 0;
  // Scratch for Match: per-node progress, indexed by node, reset after each call.
  std::vector<NodePrefix> scratch_ ABSL_GUARDED_BY(mu_);
  std::vector<NodeIndex> touched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::scheduler
