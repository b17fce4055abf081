#include "cache_service/eviction_policy.h"

#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"

namespace strata::cache {

std::vector<BlockKey> SelectVictims(const std::vector<EvictionCandidate>& resident, size_t count) {
  std::vector<BlockKey> victims;
  if (count == 0) return victims;
  absl::flat_hash_map<BlockKey, size_t> index;
  index.reserve(resident.size());
  for (size_t i = 0; i < resident.size(); ++i) index.emplace(resident[i].key, i);
  std::vector<uint32_t> children(resident.size(), 0);
  for (const auto& c : resident) {
    if (auto it = index.find(c.parent); it != index.end() && c.parent != c.key) {
      ++children[it->second];
    }
  }
  // Min-heap of tails by (last access, key) so ties break deterministically.
  using Item = std::tuple<int64_t, BlockKey, size_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> tails;
  for (size_t i = 0; i < resident.size(); ++i) {
    if (children[i] == 0 && resident[i].evictable) {
      tails.emplace(resident[i].last_access_ms, resident[i].key, i);
    }
  }
  while (!tails.empty() && victims.size() < count) {
    const auto [at, key, i] = tails.top();
    tails.pop();
    victims.push_back(key);
    if (auto it = index.find(resident[i].parent);
        it != index.end() && resident[i].parent != resident[i].key) {
      const size_t p = it->second;
      if (--children[p] == 0 && resident[p].evictable) {
        tails.emplace(resident[p].last_access_ms, resident[p].key, p);
      }
    }
  }
  return victims;
}

}  // namespace strata::cache
