// Baseline placement policies, for comparison with `strata` (ARCHITECTURE.md §7). None of them
// moves blocks between nodes; each reuses whatever prefix the chosen prefill node holds locally.
//
//   random            uniform over prefill candidates (decode: uniform too)
//   round_robin       cycles over candidates (decode: its own cycle)
//   least_loaded      fewest outstanding uncached prefill tokens (decode: fewest context tokens)
//   cache_aware_local SGLang-router-like: the node with the best local prefix match when its
//                     match ratio reaches `match_threshold`, else the least loaded; if the load
//                     is imbalanced (max − min outstanding requests > abs_threshold and
//                     max > rel_threshold × min) it always picks the least loaded.
#pragma once

#include <random>

#include "scheduler/placement/policy.h"

namespace strata::scheduler {

class RandomPolicy : public PlacementPolicy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed) {}
  std::string_view name() const override { return "random"; }
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const PlacementContext& context) override;

 private:
  std::mt19937_64 rng_;
};

class RoundRobinPolicy : public PlacementPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const PlacementContext& context) override;

 private:
  uint64_t prefill_cursor_ = 0;
  uint64_t decode_cursor_ = 0;
};

class LeastLoadedPolicy : public PlacementPolicy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const PlacementContext& context) override;
};

class CacheAwareLocalPolicy : public PlacementPolicy {
 public:
  struct Options {
    double match_threshold = 0.3;  // minimum matched fraction of the prompt's blocks
    uint32_t balance_abs_threshold = 4;
    double balance_rel_threshold = 1.5;
  };
  CacheAwareLocalPolicy() : CacheAwareLocalPolicy(Options{}) {}
  explicit CacheAwareLocalPolicy(Options options) : options_(options) {}
  std::string_view name() const override { return "cache_aware_local"; }
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const PlacementContext& context) override;

 private:
  Options options_;
};

// The prefill candidate with the fewest outstanding uncached tokens; kNoNode if none.
NodeIndex LeastLoadedPrefill(std::span<const NodeView> nodes);

}  // namespace strata::scheduler
