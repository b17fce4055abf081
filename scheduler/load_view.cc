#include "scheduler/load_view.h"

#include <algorithm>

#include "common/strings.h"

namespace strata::scheduler {

LoadView::LoadView(absl::Duration heartbeat_interval, int missed_heartbeats_limit)
    : heartbeat_interval_(heartbeat_interval),
      missed_heartbeats_limit_(std::max(missed_heartbeats_limit, 1)) {}

NodeIndex LoadView::Register(const std::string& id, const std::string& host, NodeRoleKind role,
                             absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  NodeIndex index;
  if (it != by_id_.end()) {
    index = it->second;
  } else {
    index = static_cast<NodeIndex>(nodes_.size());
    nodes_.emplace_back();
    by_id_.emplace(id, index);
  }
  NodeView& n = nodes_[index];
  n.index = index;
  n.id = id;
  n.host = host;
  n.role = role;
  n.alive = true;
  n.last_heartbeat = now;
  n.outstanding = Outstanding{};
  return index;
}

absl::Status LoadView::Heartbeat(const std::string& id, const NodeLoad& load, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return absl::NotFoundError(StrCat("heartbeat from unknown node ", id));
  NodeView& n = nodes_[it->second];
  n.load = load;
  n.last_heartbeat = now;
  n.alive = true;
  return absl::OkStatus();
}

absl::Status LoadView::SetDraining(const std::string& id, bool draining) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return absl::NotFoundError(StrCat("unknown node ", id));
  nodes_[it->second].draining = draining;
  return absl::OkStatus();
}

absl::Status LoadView::MarkDead(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return absl::NotFoundError(StrCat("unknown node ", id));
  NodeView& n = nodes_[it->second];
  n.alive = false;
  n.outstanding = Outstanding{};
  return absl::OkStatus();
}

std::vector<NodeIndex> LoadView::CheckLiveness(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeIndex> dead;
  const absl::Duration limit = heartbeat_interval_ * missed_heartbeats_limit_;
  for (NodeView& n : nodes_) {
    if (n.alive && now - n.last_heartbeat > limit) {
      n.alive = false;
      n.outstanding = Outstanding{};
      dead.push_back(n.index);
    }
  }
  return dead;
}

void LoadView::AddPrefill(NodeIndex node, uint64_t tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size()) return;
  Outstanding& o = nodes_[node].outstanding;
  ++o.prefill_requests;
  o.prefill_tokens += tokens;
  o.prefill_seconds += seconds;
}

void LoadView::FinishPrefill(NodeIndex node, uint64_t tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size()) return;
  Outstanding& o = nodes_[node].outstanding;
  o.prefill_requests -= std::min<uint32_t>(o.prefill_requests, 1);
  o.prefill_tokens -= std::min(o.prefill_tokens, tokens);
  o.prefill_seconds = std::max(0.0, o.prefill_seconds - seconds);
  if (o.prefill_requests == 0) {
    o.prefill_tokens = 0;
    o.prefill_seconds = 0;
  }
}

void LoadView::AddDecode(NodeIndex node, uint64_t context_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size()) return;
  Outstanding& o = nodes_[node].outstanding;
  ++o.decode_requests;
  o.decode_tokens += context_tokens;
}

void LoadView::FinishDecode(NodeIndex node, uint64_t context_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= nodes_.size()) return;
  Outstanding& o = nodes_[node].outstanding;
  o.decode_requests -= std::min<uint32_t>(o.decode_requests, 1);
  o.decode_tokens -= std::min(o.decode_tokens, context_tokens);
}

absl::StatusOr<NodeIndex> LoadView::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return absl::NotFoundError(StrCat("unknown node ", id));
  return it->second;
}

std::vector<NodeView> LoadView::Snapshot() const {
  std::vector<NodeView> out;
  SnapshotInto(out);
  return out;
}

void LoadView::SnapshotInto(std::vector<NodeView>& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out.resize(nodes_.size());
  std::copy(nodes_.begin(), nodes_.end(), out.begin());
}

size_t LoadView::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_.size();
}

}  // namespace strata::scheduler
