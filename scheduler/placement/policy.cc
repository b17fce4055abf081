#include "scheduler/placement/policy.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "scheduler/placement/baseline_policies.h"
#include "scheduler/placement/strata_policy.h"

namespace strata::scheduler {

std::vector<std::string> PolicyNames() {
  return {"random", "round_robin", "least_loaded", "cache_aware_local", "strata"};
}

absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePolicy(std::string_view name, uint64_t seed) {
  if (name == "random") return std::make_unique<RandomPolicy>(seed);
  if (name == "round_robin") return std::make_unique<RoundRobinPolicy>();
  if (name == "least_loaded") return std::make_unique<LeastLoadedPolicy>();
  if (name == "cache_aware_local") return std::make_unique<CacheAwareLocalPolicy>();
  if (name == "strata") return std::make_unique<StrataPolicy>();
  return absl::InvalidArgumentError(StrCat("unknown placement policy '", name, "' (expected ",
                                           StrJoin(PolicyNames(), " | "), ")"));
}

double QueueSeconds(const NodeView& node) {
  const double reported =
      double(node.load.queued_prefill_tokens) * node.load.prefill_ms_per_token / 1000.0;
  return std::max(node.outstanding.prefill_seconds, reported);
}

void FillLocalPrefill(const PlacementRequest& request, const PlacementContext& context,
                      const NodeView& node, Placement& placement) {
  const NodePrefix local = context.match->For(node.index);
  placement.prefill = node.index;
  placement.local_blocks = local.blocks;
  placement.local_tiers = local.tiers;
  placement.move.reset();
  placement.cached_tokens =
      std::min<uint64_t>(uint64_t(local.blocks) * request.block_tokens, request.prompt_tokens);
  placement.new_tokens = request.prompt_tokens - placement.cached_tokens;
  placement.predicted_queue_s = QueueSeconds(node);
  placement.predicted_load_s =
      context.models.tiers.LoadSeconds(local.tiers, request.block_tokens, /*remote=*/false);
  placement.predicted_prefill_s =
      context.models.prefill.Predict(double(placement.new_tokens), double(placement.cached_tokens));
  placement.predicted_ttft_s =
      placement.predicted_queue_s + placement.predicted_load_s + placement.predicted_prefill_s;
}

NodeIndex LeastLoadedDecode(std::span<const NodeView> nodes) {
  NodeIndex best = kNoNode;
  uint64_t best_tokens = 0;
  for (const NodeView& n : nodes) {
    if (!n.CanDecode()) continue;
    const uint64_t tokens = std::max<uint64_t>(n.outstanding.decode_tokens, n.load.running_tokens);
    if (best == kNoNode || tokens < best_tokens) {
      best = n.index;
      best_tokens = tokens;
    }
  }
  return best;
}

}  // namespace strata::scheduler
