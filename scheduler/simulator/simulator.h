// Discrete-event replay of a request trace through the real placement code (Scheduler +
// PlacementPolicy + PrefixIndex) against a modelled cluster (cluster_model.h).
//
// Per request: arrival → Scheduler::Decide → FIFO queue of the chosen prefill node → at the
// start of its prefill, the blocks the node actually holds then (and, for a planned move, those
// the source still holds) are loaded at their tier's bandwidth, the rest computed with the
// cluster's true prefill model → first token (TTFT) → KV shipped to the decode node → continuous
// batching there until the last token. Node caches publish KV events into the scheduler's index;
// nodes heartbeat their load every ClusterModel::heartbeat_interval_s.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/scheduler.h"
#include "scheduler/simulator/cluster_model.h"
#include "scheduler/simulator/trace.h"

namespace strata::scheduler::sim {

struct RequestOutcome {
  double arrival_s = 0;
  bool rejected = false;
  double ttft_s = 0;
  double tbt_s = 0;  // mean time between tokens after the first (0 for one-token outputs)
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;  // reused (local + moved) at execution time
  uint64_t output_tokens = 0;
};

struct SimulationResult {
  std::string policy;
  std::vector<RequestOutcome> requests;  // in trace order
  uint64_t moved_blocks = 0;
  double makespan_s = 0;
  std::vector<double> decision_us;  // wall time of each Scheduler::Decide call
  PrefillModel calibrated_prefill;
};

struct SimulationOptions {
  ClusterModel cluster = DefaultH200Cluster();
  std::string policy = "strata";
  Objectives objectives;
  // The scheduler's starting belief about prefill speed (calibrated online from there).
  PrefillModel prefill_prior;
  uint64_t seed = 1;
};

absl::StatusOr<SimulationResult> Simulate(const std::vector<TraceRequest>& trace,
                                          const SimulationOptions& options);

}  // namespace strata::scheduler::sim
