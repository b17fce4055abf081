// The modelled cluster the simulator replays traces against (docs/benchmarks.md documents the
// default and where its numbers come from). Every policy runs against the same model.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "scheduler/cost_model.h"
#include "scheduler/placement/policy.h"

namespace strata::scheduler::sim {

struct ClusterModel {
  uint32_t prefill_nodes = 8;
  uint32_t decode_nodes = 4;
  uint32_t block_tokens = 512;  // the trace's block size

  // Per prefill node: KV cache capacity per tier, in tokens (gpu, dram, ssd).
  std::array<uint64_t, kNumTiers> cache_tokens{1'000'000, 14'000'000, 56'000'000};
  // Per decode node: KV capacity for running sequences, in tokens.
  uint64_t decode_kv_tokens = 4'000'000;

  // The ground truth of the simulated hardware. The scheduler starts from its own prior
  // (SchedulerOptions::models) and calibrates the prefill model online from observations.
  PrefillModel prefill;
  DecodeModel decode;
  TierModel tiers;

  double heartbeat_interval_s = 0.1;

  // One line describing the model, for reports.
  std::string Describe() const;
};

// DeepSeek-V3 (671B MoE, 37B active, MLA, 61 layers) on nodes of 8 × H200, one prefill instance
// per node. See docs/benchmarks.md for the derivation.
ClusterModel DefaultH200Cluster();

}  // namespace strata::scheduler::sim
