// Placement: where a request's prefill and decode run. Every policy — the baselines and the
// `strata` cost model — sits behind PlacementPolicy, so the gateway and the simulator run the
// same code.
//
// A policy sees a consistent snapshot (PlacementContext): the nodes with their load, the prefix
// match of the request against the index, and the cost models. It returns a Placement with the
// chosen nodes, the cached blocks the prefill will reuse (locally and, for `strata`, fetched from
// another node), and its predictions; or a rejection (→ HTTP 429 + Retry-After) when the
// objectives cannot be met. No candidate at all is absl::Unavailable.
//
// Thread safety: a policy instance may keep state (round-robin cursor, RNG) and is not
// thread-safe; the caller serializes Place() calls (Scheduler does).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/block_key.h"
#include "scheduler/cost_model.h"
#include "scheduler/load_view.h"
#include "scheduler/prefix_index.h"

namespace strata::scheduler {

struct PlacementRequest {
  std::span<const BlockKey> keys;  // full blocks of the prompt, in order
  uint32_t block_tokens = kDefaultBlockTokens;
  uint64_t prompt_tokens = 0;
  uint32_t max_output_tokens = 0;
  int priority = 0;  // higher runs first; < 0 is background (batch)
  // KV bytes per token of the blocks (the model's layers and the cache codec), which prices a
  // block load; 0: the tier model's default (DeepSeek-V3, bf16).
  double kv_bytes_per_token = 0;
};

struct Objectives {
  double ttft_s = 5.0;  // time to first token
  double tbt_s = 0.1;   // time between tokens
  // `strata` rejects when its best predicted TTFT exceeds ttft_s × reject_factor (0: never).
  double reject_factor = 0;
};

struct CostModels {
  PrefillModel prefill;
  DecodeModel decode;
  TierModel tiers;
};

struct PlacementContext {
  std::span<const NodeView> nodes;
  const PrefixMatch* match = nullptr;  // never null when passed to a policy
  CostModels models;
  Objectives objectives;
};

// Blocks [first_block, first_block + num_blocks) copied from `source` before the prefill.
struct BlockMove {
  NodeIndex source = kNoNode;
  uint32_t first_block = 0;
  uint32_t num_blocks = 0;
  TierCounts source_tiers{};
};

struct Placement {
  NodeIndex prefill = kNoNode;
  NodeIndex decode = kNoNode;
  uint32_t local_blocks = 0;  // reused from the prefill node's own tiers
  TierCounts local_tiers{};
  std::optional<BlockMove> move;
  uint64_t cached_tokens = 0;  // local + moved
  uint64_t new_tokens = 0;     // to compute
  double predicted_queue_s = 0;
  double predicted_load_s = 0;
  double predicted_prefill_s = 0;
  double predicted_ttft_s = 0;
  double predicted_tbt_s = 0;

  bool rejected = false;
  double retry_after_s = 0;
  std::string reject_reason;
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                          const PlacementContext& context) = 0;
};

// random | round_robin | least_loaded | cache_aware_local | strata. InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePolicy(std::string_view name,
                                                            uint64_t seed = 1);
std::vector<std::string> PolicyNames();

// Shared by policies: fills the cached/new tokens and the predictions for prefill on `node`
// reusing its local prefix (no move).
void FillLocalPrefill(const PlacementRequest& request, const PlacementContext& context,
                      const NodeView& node, Placement& placement);
// Predicted queue wait on `node`: the larger of the scheduler's outstanding prediction and the
// node's own report.
double QueueSeconds(const NodeView& node);
// Decode node with the fewest running decode tokens (ties: lowest index); kNoNode if none.
NodeIndex LeastLoadedDecode(std::span<const NodeView> nodes);

}  // namespace strata::scheduler
