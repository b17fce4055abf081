// The `strata` placement policy: the cost model of ARCHITECTURE.md §7.
//
// For every prefill candidate p it predicts
//   TTFT(p) = queue wait(p) + load time of the cached blocks (from their tier) + prefill time of
//             the uncached tokens given the cached ones
// twice: reusing p's own prefix only, and — when another node r holds at least
// `min_move_blocks` more blocks of the chain — also copying blocks [local(p), longest(r)) from r
// over the network first (which replicates hot prefixes onto p). It keeps the cheaper plan and
// picks the p with the smallest prediction.
// Decode goes to the node with the smallest predicted time between tokens among those with free
// KV pages for the whole sequence and within the TBT objective; among the nodes within
// `decode_tbt_slack` of that best TBT, to the one whose own pool (GPU tier: its resident blocks)
// already holds most of the prompt's prefix, since it then loads nothing of it (the next turn of
// a chat returns to the decode node of the last one).
// When Objectives::reject_factor > 0 and the best TTFT exceeds ttft_s × reject_factor, or no
// decode node meets the TBT objective, the request is rejected with a Retry-After estimate.
#pragma once

#include "scheduler/placement/policy.h"

namespace strata::scheduler {

class StrataPolicy : public PlacementPolicy {
 public:
  struct Options {
    uint32_t min_move_blocks = 2;
    double decode_tbt_slack = 0.05;  // a resident prefix may cost this much more TBT
  };
  StrataPolicy() : StrataPolicy(Options{}) {}
  explicit StrataPolicy(Options options) : options_(options) {}
  std::string_view name() const override { return "strata"; }
  absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                  const PlacementContext& context) override;

 private:
  Options options_;
};

}  // namespace strata::scheduler
