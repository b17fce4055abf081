// Scheduler: the decision point shared by the gateway and the simulator.
//
// Owns the prefix index, the load view, the active placement policy and the online-calibrated
// prefill model. Decide() matches the request's block keys against the index, snapshots the
// nodes, asks the policy, and books the placed work as outstanding on the chosen nodes until
// ReportPrefillDone / ReportDecodeDone (which also feed the calibration).
//
// Thread safety: all methods are safe to call concurrently; decisions are serialized.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "scheduler/cost_model.h"
#include "scheduler/load_view.h"
#include "scheduler/placement/policy.h"
#include "scheduler/prefix_index.h"

namespace strata::scheduler {

struct SchedulerOptions {
  std::string policy = "strata";
  uint64_t seed = 1;
  uint64_t index_capacity_blocks = 1 << 22;
  CostModels models;  // priors; the prefill model is then calibrated online
  Objectives objectives;
  bool calibrate_prefill = true;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int missed_heartbeats_limit = 3;
};

class Scheduler {
 public:
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options);

  PrefixIndex& index() { return index_; }
  LoadView& load() { return load_; }

  // A rejection is an OK result with placement.rejected set; Unavailable when no node can serve.
  absl::StatusOr<Placement> Decide(const PlacementRequest& request);

  // A prefill placed as `placement` finished: it computed `new_tokens` given `cached_tokens`
  // reused (what the node really had) in `compute_s` seconds (no queueing or block loading).
  void ReportPrefillDone(const Placement& placement, uint64_t new_tokens, uint64_t cached_tokens,
                         double compute_s);
  void ReportDecodeDone(const Placement& placement, uint64_t context_tokens);

  absl::Status SetPolicy(const std::string& name);
  std::string policy_name() const;
  PrefillModel prefill_model() const;

 private:
  explicit Scheduler(const SchedulerOptions& options);

  SchedulerOptions options_;
  PrefixIndex index_;
  LoadView load_;
  mutable std::mutex mu_;
  std::unique_ptr<PlacementPolicy> policy_ ABSL_GUARDED_BY(mu_);
  PrefillCalibrator calibrator_ ABSL_GUARDED_BY(mu_);
  std::vector<NodeView> snapshot_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::scheduler
