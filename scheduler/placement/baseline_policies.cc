#include "scheduler/placement/baseline_policies.h"

#include <algorithm>

#include "common/status.h"

namespace strata::scheduler {

namespace {

absl::Status NoCandidate(std::string_view what) {
  return absl::UnavailableError(StrCat("no live, undrained ", what, " node"));
}

// The live prefill and decode candidates, as indices into `nodes`; Unavailable if a role has
// none. Random and round-robin choose among them.
struct RoleCandidates {
  std::vector<NodeIndex> prefill;
  std::vector<NodeIndex> decode;
};

absl::StatusOr<RoleCandidates> CandidatesByRole(std::span<const NodeView> nodes) {
  RoleCandidates c;
  for (const NodeView& n : nodes) {
    if (n.CanPrefill()) c.prefill.push_back(n.index);
    if (n.CanDecode()) c.decode.push_back(n.index);
  }
  if (c.prefill.empty()) return NoCandidate("prefill");
  if (c.decode.empty()) return NoCandidate("decode");
  return c;
}

absl::StatusOr<Placement> Finish(const PlacementRequest& request, const PlacementContext& context,
                                 NodeIndex prefill, NodeIndex decode) {
  if (prefill == kNoNode) return NoCandidate("prefill");
  if (decode == kNoNode) return NoCandidate("decode");
  Placement placement;
  FillLocalPrefill(request, context, context.nodes[prefill], placement);
  placement.decode = decode;
  return placement;
}

}  // namespace

NodeIndex LeastLoadedPrefill(std::span<const NodeView> nodes) {
  NodeIndex best = kNoNode;
  uint64_t best_tokens = 0;
  for (const NodeView& n : nodes) {
    if (!n.CanPrefill()) continue;
    const uint64_t tokens =
        std::max<uint64_t>(n.outstanding.prefill_tokens, n.load.queued_prefill_tokens);
    if (best == kNoNode || tokens < best_tokens) {
      best = n.index;
      best_tokens = tokens;
    }
  }
  return best;
}

absl::StatusOr<Placement> RandomPolicy::Place(const PlacementRequest& request,
                                              const PlacementContext& context) {
  ASSIGN_OR_RETURN(const RoleCandidates c, CandidatesByRole(context.nodes));
  const NodeIndex p = c.prefill[rng_() % c.prefill.size()];
  const NodeIndex d = c.decode[rng_() % c.decode.size()];
  return Finish(request, context, p, d);
}

absl::StatusOr<Placement> RoundRobinPolicy::Place(const PlacementRequest& request,
                                                  const PlacementContext& context) {
  ASSIGN_OR_RETURN(const RoleCandidates c, CandidatesByRole(context.nodes));
  const NodeIndex p = c.prefill[prefill_cursor_++ % c.prefill.size()];
  const NodeIndex d = c.decode[decode_cursor_++ % c.decode.size()];
  return Finish(request, context, p, d);
}

absl::StatusOr<Placement> LeastLoadedPolicy::Place(const PlacementRequest& request,
                                                   const PlacementContext& context) {
  return Finish(request, context, LeastLoadedPrefill(context.nodes),
                LeastLoadedDecode(context.nodes));
}

absl::StatusOr<Placement> CacheAwareLocalPolicy::Place(const PlacementRequest& request,
                                                       const PlacementContext& context) {
  uint32_t min_requests = ~0u, max_requests = 0;
  for (const NodeView& n : context.nodes) {
    if (!n.CanPrefill()) continue;
    min_requests = std::min(min_requests, n.outstanding.prefill_requests);
    max_requests = std::max(max_requests, n.outstanding.prefill_requests);
  }
  const NodeIndex least = LeastLoadedPrefill(context.nodes);
  const bool imbalanced = max_requests > min_requests &&
                          max_requests - min_requests > options_.balance_abs_threshold &&
                          double(max_requests) > options_.balance_rel_threshold * min_requests;
  NodeIndex choice = least;
  if (!imbalanced && !request.keys.empty()) {
    NodeIndex best = kNoNode;
    uint32_t best_blocks = 0;
    for (const NodePrefix& p : context.match->nodes) {
      if (p.node >= context.nodes.size() || !context.nodes[p.node].CanPrefill()) continue;
      if (p.blocks > best_blocks) {
        best = p.node;
        best_blocks = p.blocks;
      }
    }
    if (best != kNoNode &&
        double(best_blocks) >= options_.match_threshold * double(request.keys.size())) {
      choice = best;
    }
  }
  return Finish(request, context, choice, LeastLoadedDecode(context.nodes));
}

}  // namespace strata::scheduler
