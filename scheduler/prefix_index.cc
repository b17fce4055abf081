#include "scheduler/prefix_index.h"

#include <algorithm>

namespace strata::scheduler {

const NodePrefix* PrefixMatch::Longest() const {
  const NodePrefix* best = nullptr;
  for (const NodePrefix& n : nodes) {
    if (best == nullptr || n.blocks > best->blocks) best = &n;
  }
  return best;
}

NodePrefix PrefixMatch::For(NodeIndex node) const {
  for (const NodePrefix& n : nodes) {
    if (n.node == node) return n;
  }
  NodePrefix none;
  none.node = node;
  return none;
}

PrefixIndex::PrefixIndex(uint64_t capacity_blocks)
    : capacity_blocks_(std::max<uint64_t>(capacity_blocks, 1)) {}

void PrefixIndex::AddHolderLocked(const BlockKey& key, Holder holder) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    while (entries_.size() >= capacity_blocks_ && !lru_.empty()) {
      auto victim = entries_.find(lru_.back());
      if (victim->second.referenced) {
        // Second chance: used since it last moved to the front.
        victim->second.referenced = false;
        lru_.splice(lru_.begin(), lru_, victim->second.lru);
        continue;
      }
      EraseLocked(victim);
      ++evicted_entries_;
    }
    lru_.push_front(key);
    it = entries_.emplace(key, Entry{{}, lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  auto& holders = it->second.holders;
  if (std::find(holders.begin(), holders.end(), holder) != holders.end()) return;
  const NodeIndex node = HolderNode(holder);
  const bool node_new =
      std::none_of(holders.begin(), holders.end(), [&](Holder h) { return HolderNode(h) == node; });
  // Holders stay sorted by tier (fastest first) so Match counts each block at its fastest copy.
  holders.insert(std::upper_bound(holders.begin(), holders.end(), holder,
                                  [](Holder a, Holder b) { return HolderTier(a) < HolderTier(b); }),
                 holder);
  ++holders_;
  if (node_new) ++blocks_per_node_[node];
}

void PrefixIndex::RemoveHolderLocked(const BlockKey& key, NodeIndex node,
                                     std::optional<CacheTier> tier) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  auto& holders = it->second.holders;
  const size_t before = holders.size();
  holders.erase(std::remove_if(holders.begin(), holders.end(),
                               [&](Holder h) {
                                 return HolderNode(h) == node &&
                                        (!tier.has_value() || HolderTier(h) == *tier);
                               }),
                holders.end());
  if (holders.size() == before) return;
  holders_ -= before - holders.size();
  const bool node_gone =
      std::none_of(holders.begin(), holders.end(), [&](Holder h) { return HolderNode(h) == node; });
  if (node_gone) {
    auto count = blocks_per_node_.find(node);
    if (count != blocks_per_node_.end() && --count->second == 0) blocks_per_node_.erase(count);
  }
  if (holders.empty()) EraseLocked(it);
}

void PrefixIndex::EraseLocked(absl::flat_hash_map<BlockKey, Entry>::iterator it) {
  for (Holder h : it->second.holders) {
    --holders_;
    // Count each node once per key.
    const NodeIndex node = HolderNode(h);
    bool first = true;
    for (Holder other : it->second.holders) {
      if (other == h) break;
      if (HolderNode(other) == node) first = false;
    }
    if (!first) continue;
    auto count = blocks_per_node_.find(node);
    if (count != blocks_per_node_.end() && --count->second == 0) blocks_per_node_.erase(count);
  }
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void PrefixIndex::Stored(NodeIndex node, CacheTier tier, std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  ++events_applied_;
  for (const BlockKey& key : keys) AddHolderLocked(key, MakeHolder(node, tier));
}

void PrefixIndex::Moved(NodeIndex node, CacheTier from, CacheTier to,
                        std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  ++events_applied_;
  for (const BlockKey& key : keys) {
    // Add first so the entry (and its LRU position) survives the removal.
    AddHolderLocked(key, MakeHolder(node, to));
    if (from != to) RemoveHolderLocked(key, node, from);
  }
}

void PrefixIndex::Evicted(NodeIndex node, std::optional<CacheTier> tier,
                          std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  ++events_applied_;
  for (const BlockKey& key : keys) RemoveHolderLocked(key, node, tier);
}

void PrefixIndex::Quarantined(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  ++events_applied_;
  auto it = entries_.find(key);
  if (it != entries_.end()) EraseLocked(it);
}

void PrefixIndex::RemoveNodeLocked(NodeIndex node, uint32_t tiers) {
  if (!blocks_per_node_.contains(node)) return;
  std::vector<std::pair<BlockKey, CacheTier>> copies;
  for (const auto& [key, entry] : entries_) {
    for (Holder h : entry.holders) {
      if (HolderNode(h) == node && (tiers >> static_cast<uint32_t>(HolderTier(h)) & 1)) {
        copies.emplace_back(key, HolderTier(h));
      }
    }
  }
  for (const auto& [key, tier] : copies) RemoveHolderLocked(key, node, tier);
}

void PrefixIndex::RemoveNode(NodeIndex node) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::erase_if(digests_, [&](const auto& d) { return d.first.first == node; });
  RemoveNodeLocked(node);
}

void PrefixIndex::DigestPage(NodeIndex node, std::string_view source, uint64_t digest_id,
                             CacheTier tier, std::span<const BlockKey> keys, bool last_page) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::pair<NodeIndex, std::string> id(node, std::string(source));
  PendingDigest& pending = digests_[id];
  if (pending.digest_id != digest_id) {
    pending.digest_id = digest_id;
    pending.tiers = 0;
    pending.keys.clear();
  }
  pending.tiers |= 1u << static_cast<uint32_t>(tier);
  for (const BlockKey& key : keys) pending.keys.emplace_back(key, tier);
  if (!last_page) return;
  const PendingDigest done = std::move(pending);
  digests_.erase(id);
  RemoveNodeLocked(node, done.tiers);
  for (const auto& [key, key_tier] : done.keys) AddHolderLocked(key, MakeHolder(node, key_tier));
  ++digests_applied_;
}

PrefixMatch PrefixIndex::Match(std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixMatch match;
  touched_.clear();
  for (uint32_t i = 0; i < keys.size(); ++i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) break;
    it->second.referenced = true;
    bool any_extended = false;
    for (Holder h : it->second.holders) {
      const NodeIndex node = HolderNode(h);
      if (node >= scratch_.size()) scratch_.resize(node + 1);
      NodePrefix& p = scratch_[node];
      const auto tier = static_cast<size_t>(HolderTier(h));
      if (p.blocks == i) {
        if (i == 0) {
          p.node = node;
          touched_.push_back(node);
        }
        p.blocks = i + 1;
        ++p.tiers[tier];
        any_extended = true;
      }
      // p.blocks == i + 1: a slower copy of a block already counted at its fastest tier.
    }
    if (!any_extended) break;
  }
  match.nodes.reserve(touched_.size());
  for (NodeIndex node : touched_) {
    match.nodes.push_back(scratch_[node]);
    scratch_[node] = NodePrefix{};
  }
  return match;
}

bool PrefixIndex::Holds(NodeIndex node, const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  return std::any_of(it->second.holders.begin(), it->second.holders.end(),
                     [&](Holder h) { return HolderNode(h) == node; });
}

uint64_t PrefixIndex::BlocksHeldBy(NodeIndex node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_per_node_.find(node);
  return it == blocks_per_node_.end() ? 0 : it->second;
}

PrefixIndexStats PrefixIndex::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixIndexStats s;
  s.indexed_blocks = entries_.size();
  s.holders = holders_;
  // Hash slot (key + entry) plus one list node per entry, plus out-of-line holder vectors.
  s.memory_bytes = entries_.capacity() * (sizeof(BlockKey) + sizeof(Entry) + 1) +
                   lru_.size() * (sizeof(BlockKey) + 2 * sizeof(void*));
  s.capacity_blocks = capacity_blocks_;
  s.evicted_entries = evicted_entries_;
  s.events_applied = events_applied_;
  s.digests_applied = digests_applied_;
  return s;
}

}  // namespace strata::scheduler
