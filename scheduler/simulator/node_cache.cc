#include "scheduler/simulator/node_cache.h"

namespace strata::scheduler::sim {

NodeCache::NodeCache(NodeIndex node, std::array<uint64_t, kNumTiers> capacity_blocks,
                     PrefixIndex* index)
    : node_(node), capacity_(capacity_blocks), index_(index) {}

NodePrefix NodeCache::Prefix(std::span<const BlockKey> keys) const {
  NodePrefix p;
  p.node = node_;
  for (const BlockKey& key : keys) {
    auto it = where_.find(key);
    if (it == where_.end()) break;
    ++p.blocks;
    ++p.tiers[static_cast<int>(it->second.tier)];
  }
  return p;
}

TierCounts NodeCache::Tiers(std::span<const BlockKey> keys) const {
  TierCounts t{};
  for (const BlockKey& key : keys) {
    auto it = where_.find(key);
    if (it != where_.end()) ++t[static_cast<int>(it->second.tier)];
  }
  return t;
}

void NodeCache::Place(const BlockKey& key, CacheTier tier) {
  auto& list = lru_[static_cast<int>(tier)];
  list.push_front(key);
  where_[key] = Slot{tier, list.begin()};
}

void NodeCache::Overflow(int tier) {
  while (lru_[tier].size() > capacity_[tier]) {
    const BlockKey victim = lru_[tier].back();
    lru_[tier].pop_back();
    where_.erase(victim);
    int next = tier + 1;
    while (next < kNumTiers && capacity_[next] == 0) ++next;
    if (next < kNumTiers) {
      Place(victim, static_cast<CacheTier>(next));
      index_->Moved(node_, static_cast<CacheTier>(tier), static_cast<CacheTier>(next),
                    std::span<const BlockKey>(&victim, 1));
      Overflow(next);
    } else {
      index_->Evicted(node_, static_cast<CacheTier>(tier), std::span<const BlockKey>(&victim, 1));
    }
  }
}

void NodeCache::Use(std::span<const BlockKey> keys) {
  int top = 0;
  while (top < kNumTiers && capacity_[top] == 0) ++top;
  if (top == kNumTiers) return;
  const auto top_tier = static_cast<CacheTier>(top);
  std::vector<BlockKey> stored;
  for (const BlockKey& key : keys) {
    auto it = where_.find(key);
    if (it != where_.end()) {
      const CacheTier from = it->second.tier;
      lru_[static_cast<int>(from)].erase(it->second.it);
      where_.erase(it);
      Place(key, top_tier);
      if (from != top_tier) {
        index_->Moved(node_, from, top_tier, std::span<const BlockKey>(&key, 1));
      }
    } else {
      Place(key, top_tier);
      stored.push_back(key);
    }
  }
  if (!stored.empty()) index_->Stored(node_, top_tier, stored);
  Overflow(top);
}

void NodeCache::Touch(std::span<const BlockKey> keys) {
  for (const BlockKey& key : keys) {
    auto it = where_.find(key);
    if (it == where_.end()) continue;
    auto& list = lru_[static_cast<int>(it->second.tier)];
    list.splice(list.begin(), list, it->second.it);
  }
}

}  // namespace strata::scheduler::sim
