// LoadView: the scheduler's registry of nodes and what it knows of their load.
//
// Two sources: heartbeats (the worker's own WorkerLoad report) and the scheduler's own
// bookkeeping of work it has placed but not yet seen finish ("outstanding"). Outstanding work is
// what makes back-to-back placements see each other before the next heartbeat arrives.
// A node whose heartbeats stop for `missed_heartbeats_limit` intervals is marked dead; dead and
// draining nodes are never candidates.
//
// Time is passed in (absl::Time) so the simulator and tests drive it.
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/types.h"

namespace strata::scheduler {

enum class NodeRoleKind : uint8_t { kPrefill, kDecode, kBoth };

// What a worker reports (mirrors proto strata.v1.WorkerLoad).
struct NodeLoad {
  uint32_t queued_requests = 0;
  uint32_t running_requests = 0;
  uint64_t queued_prefill_tokens = 0;
  uint64_t running_tokens = 0;
  uint32_t free_kv_pages = 0;
  uint32_t total_kv_pages = 0;
  double prefill_ms_per_token = 0;
  double decode_step_ms = 0;
  uint32_t decode_batch_size = 0;
};

// Work placed on a node and not yet reported done.
struct Outstanding {
  uint32_t prefill_requests = 0;
  uint64_t prefill_tokens = 0;  // uncached tokens to compute
  double prefill_seconds = 0;   // predicted compute + load time
  uint32_t decode_requests = 0;
  uint64_t decode_tokens = 0;  // context tokens of running decodes
};

struct NodeView {
  NodeIndex index = kNoNode;
  std::string id;
  std::string host;
  NodeRoleKind role = NodeRoleKind::kBoth;
  bool alive = true;
  bool draining = false;
  absl::Time last_heartbeat;
  NodeLoad load;
  Outstanding outstanding;
  uint32_t page_tokens = 64;  // tokens per KV page

  bool CanPrefill() const { return alive && !draining && role != NodeRoleKind::kDecode; }
  bool CanDecode() const { return alive && !draining && role != NodeRoleKind::kPrefill; }
};

class LoadView {
 public:
  explicit LoadView(absl::Duration heartbeat_interval = absl::Seconds(1),
                    int missed_heartbeats_limit = 3);

  // Adds a node, or refreshes an existing one with the same id (a restarted node keeps its
  // index, comes back alive and its outstanding work is forgotten). Returns its index.
  NodeIndex Register(const std::string& id, const std::string& host, NodeRoleKind role,
                     absl::Time now);
  // NotFound for an unknown id (the node must re-register).
  absl::Status Heartbeat(const std::string& id, const NodeLoad& load, absl::Time now);
  absl::Status SetDraining(const std::string& id, bool draining);
  // Marks nodes dead whose last heartbeat is older than the limit; returns the newly dead.
  std::vector<NodeIndex> CheckLiveness(absl::Time now);
  // Marks `id` dead now (a call to it failed as if it were down); its next heartbeat or
  // registration brings it back. NotFound for an unknown id.
  absl::Status MarkDead(const std::string& id);

  // Bookkeeping of placed work (`seconds` is the prediction made at placement).
  void AddPrefill(NodeIndex node, uint64_t tokens, double seconds);
  void FinishPrefill(NodeIndex node, uint64_t tokens, double seconds);
  void AddDecode(NodeIndex node, uint64_t context_tokens);
  void FinishDecode(NodeIndex node, uint64_t context_tokens);

  absl::StatusOr<NodeIndex> Find(const std::string& id) const;
  std::vector<NodeView> Snapshot() const;
  // Fills `out` (reusing its storage): the allocation-free form for the decision hot path.
  void SnapshotInto(std::vector<NodeView>& out) const;
  size_t size() const;

 private:
  const absl::Duration heartbeat_interval_;
  const int missed_heartbeats_limit_;
  mutable std::mutex mu_;
  std::vector<NodeView> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, NodeIndex> by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::scheduler
