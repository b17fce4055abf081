#include "scheduler/scheduler.h"

#include "common/status.h"

namespace strata::scheduler {

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(options),
      index_(options.index_capacity_blocks),
      load_(options.heartbeat_interval, options.missed_heartbeats_limit),
      calibrator_(options.models.prefill) {}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options) {
  ASSIGN_OR_RETURN(auto policy, MakePolicy(options.policy, options.seed));
  std::unique_ptr<Scheduler> scheduler(new Scheduler(options));
  scheduler->policy_ = std::move(policy);
  return scheduler;
}

absl::StatusOr<Placement> Scheduler::Decide(const PlacementRequest& request) {
  PrefixMatch match = index_.Match(request.keys);
  std::lock_guard<std::mutex> lock(mu_);
  load_.SnapshotInto(snapshot_);
  PlacementContext context;
  context.nodes = snapshot_;
  context.match = &match;
  context.models = options_.models;
  context.models.prefill = calibrator_.Model();
  if (request.kv_bytes_per_token > 0) {
    context.models.tiers.kv_bytes_per_token = request.kv_bytes_per_token;
  }
  context.objectives = options_.objectives;
  ASSIGN_OR_RETURN(Placement placement, policy_->Place(request, context));
  if (!placement.rejected) {
    load_.AddPrefill(placement.prefill, placement.new_tokens,
                     placement.predicted_load_s + placement.predicted_prefill_s);
    load_.AddDecode(placement.decode, request.prompt_tokens + request.max_output_tokens);
  }
  return placement;
}

void Scheduler::ReportPrefillDone(const Placement& placement, uint64_t new_tokens,
                                  uint64_t cached_tokens, double compute_s) {
  load_.FinishPrefill(placement.prefill, placement.new_tokens,
                      placement.predicted_load_s + placement.predicted_prefill_s);
  if (!options_.calibrate_prefill) return;
  std::lock_guard<std::mutex> lock(mu_);
  calibrator_.Observe(double(new_tokens), double(cached_tokens), compute_s);
}

void Scheduler::ReportDecodeDone(const Placement& placement, uint64_t context_tokens) {
  load_.FinishDecode(placement.decode, context_tokens);
}

absl::Status Scheduler::SetPolicy(const std::string& name) {
  ASSIGN_OR_RETURN(auto policy, MakePolicy(name, options_.seed));
  std::lock_guard<std::mutex> lock(mu_);
  policy_ = std::move(policy);
  return absl::OkStatus();
}

std::string Scheduler::policy_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::string(policy_->name());
}

PrefillModel Scheduler::prefill_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calibrator_.Model();
}

}  // namespace strata::scheduler
