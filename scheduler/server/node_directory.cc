#include "scheduler/server/node_directory.h"

#include <algorithm>

namespace strata::scheduler {

void NodeDirectory::Upsert(WorkerNode node) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_[node.index] = std::move(node);
}

std::optional<WorkerNode> NodeDirectory::Get(NodeIndex index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(index);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

std::vector<WorkerNode> NodeDirectory::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerNode> out;
  out.reserve(nodes_.size());
  for (const auto& [index, node] : nodes_) out.push_back(node);
  std::sort(out.begin(), out.end(),
            [](const WorkerNode& a, const WorkerNode& b) { return a.index < b.index; });
  return out;
}

std::vector<NodeIndex> NodeDirectory::OnCache(const std::string& cache_address) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeIndex> out;
  for (const auto& [index, node] : nodes_) {
    if (!cache_address.empty() && node.cache_address == cache_address) out.push_back(index);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<WorkerNode> NodeDirectory::Reference() const {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerNode* best = nullptr;
  for (const auto& [index, node] : nodes_) {
    if (node.has_fingerprint && (best == nullptr || node.index < best->index)) best = &node;
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

}  // namespace strata::scheduler
