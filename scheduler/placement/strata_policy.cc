#include "scheduler/placement/strata_policy.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace strata::scheduler {

namespace {

// The share of `source.tiers` that falls in blocks [first, source.blocks): the index keeps only
// per-tier totals, so the moved range is assumed to have the prefix's tier mix.
TierCounts ProportionalTiers(const NodePrefix& source, uint32_t moved) {
  TierCounts out{};
  if (source.blocks == 0) return out;
  uint32_t assigned = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    out[t] = uint32_t(uint64_t(source.tiers[t]) * moved / source.blocks);
    assigned += out[t];
  }
  // Rounding remainder goes to the slowest tier present (pessimistic).
  for (int t = kNumTiers - 1; t >= 0 && assigned < moved; --t) {
    if (source.tiers[t] > 0) {
      out[t] += moved - assigned;
      assigned = moved;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Placement> StrataPolicy::Place(const PlacementRequest& request,
                                              const PlacementContext& context) {
  const CostModels& models = context.models;
  const NodePrefix* longest = context.match->Longest();
  // The longest holder must itself be usable as a source: alive.
  if (longest != nullptr &&
      (longest->node >= context.nodes.size() || !context.nodes[longest->node].alive)) {
    longest = nullptr;
    for (const NodePrefix& p : context.match->nodes) {
      if (p.node < context.nodes.size() && context.nodes[p.node].alive &&
          (longest == nullptr || p.blocks > longest->blocks)) {
        longest = &p;
      }
    }
  }

  Placement best;
  bool have_best = false;
  for (const NodeView& node : context.nodes) {
    if (!node.CanPrefill()) continue;
    Placement plan;
    FillLocalPrefill(request, context, node, plan);
    if (longest != nullptr && longest->node != node.index &&
        longest->blocks >= plan.local_blocks + options_.min_move_blocks) {
      BlockMove move;
      move.source = longest->node;
      move.first_block = plan.local_blocks;
      move.num_blocks = longest->blocks - plan.local_blocks;
      move.source_tiers = ProportionalTiers(*longest, move.num_blocks);
      const uint64_t cached = std::min<uint64_t>(uint64_t(longest->blocks) * request.block_tokens,
                                                 request.prompt_tokens);
      const uint64_t fresh = request.prompt_tokens - cached;
      const double load =
          plan.predicted_load_s +
          models.tiers.LoadSeconds(move.source_tiers, request.block_tokens, /*remote=*/true);
      const double prefill = models.prefill.Predict(double(fresh), double(cached));
      const double ttft = plan.predicted_queue_s + load + prefill;
      if (ttft < plan.predicted_ttft_s) {
        plan.move = move;
        plan.cached_tokens = cached;
        plan.new_tokens = fresh;
        plan.predicted_load_s = load;
        plan.predicted_prefill_s = prefill;
        plan.predicted_ttft_s = ttft;
      }
    }
    if (!have_best || plan.predicted_ttft_s < best.predicted_ttft_s) {
      best = std::move(plan);
      have_best = true;
    }
  }
  if (!have_best) return absl::UnavailableError("no live, undrained prefill node");

  // Decode: smallest predicted TBT among nodes with room for the whole sequence; then, within
  // the slack of that TBT, the node whose own pool holds most of the prompt's prefix.
  const uint64_t sequence_tokens = request.prompt_tokens + request.max_output_tokens;
  struct DecodeCandidate {
    NodeIndex node = kNoNode;
    double tbt = 0;
    bool fits = false;
    uint32_t resident = 0;  // leading blocks of the prompt in the node's GPU tier
  };
  std::vector<DecodeCandidate> candidates;
  for (const NodeView& node : context.nodes) {
    if (!node.CanDecode()) continue;
    DecodeCandidate c{.node = node.index};
    const double batch =
        double(std::max<uint64_t>(node.outstanding.decode_requests, node.load.decode_batch_size));
    const double context_tokens =
        double(std::max<uint64_t>(node.outstanding.decode_tokens, node.load.running_tokens));
    c.tbt = models.decode.StepSeconds(batch + 1, context_tokens + double(request.prompt_tokens) +
                                                     request.max_output_tokens / 2.0);
    c.fits = c.tbt <= context.objectives.tbt_s;
    if (node.load.total_kv_pages > 0) {
      const uint64_t pages_needed = (sequence_tokens + node.page_tokens - 1) / node.page_tokens;
      c.fits = c.fits && node.load.free_kv_pages >= pages_needed;
    }
    c.resident = context.match->For(node.index).tiers[static_cast<int>(CacheTier::kGpu)];
    candidates.push_back(c);
  }
  if (candidates.empty()) return absl::UnavailableError("no live, undrained decode node");
  const DecodeCandidate* fastest = &candidates[0];
  for (const DecodeCandidate& c : candidates) {
    if ((c.fits && !fastest->fits) || (c.fits == fastest->fits && c.tbt < fastest->tbt)) {
      fastest = &c;
    }
  }
  const DecodeCandidate* chosen = fastest;
  for (const DecodeCandidate& c : candidates) {
    if (c.fits == fastest->fits && c.resident > chosen->resident &&
        c.tbt <= fastest->tbt * (1 + options_.decode_tbt_slack)) {
      chosen = &c;
    }
  }
  const NodeIndex decode = chosen->node;
  const double decode_tbt = chosen->tbt;
  const bool decode_fits = chosen->fits;
  best.decode = decode;
  best.predicted_tbt_s = decode_tbt;

  const Objectives& obj = context.objectives;
  if (obj.reject_factor > 0) {
    if (best.predicted_ttft_s > obj.ttft_s * obj.reject_factor) {
      best.rejected = true;
      best.reject_reason = StrCat("predicted time to first token ", best.predicted_ttft_s,
                                  " s exceeds the objective ", obj.ttft_s, " s");
      // Retry when the queue in front of the best node has drained enough.
      best.retry_after_s =
          std::max(1.0, std::ceil(best.predicted_ttft_s - obj.ttft_s * obj.reject_factor));
    } else if (!decode_fits) {
      best.rejected = true;
      best.reject_reason = StrCat("no decode node can meet the time-between-tokens objective ",
                                  obj.tbt_s, " s with free KV pages");
      best.retry_after_s = 1.0;
    }
  }
  return best;
}

}  // namespace strata::scheduler
