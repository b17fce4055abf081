#include "scheduler/types.h"

namespace strata::scheduler {

std::string_view CacheTierName(CacheTier tier) {
  switch (tier) {
    case CacheTier::kGpu:
      return "gpu";
    case CacheTier::kDram:
      return "dram";
    case CacheTier::kSsd:
      return "ssd";
  }
  return "unknown";
}

std::optional<CacheTier> TierFromProto(int proto_tier) {
  if (proto_tier < 1 || proto_tier > kNumTiers) return std::nullopt;
  return static_cast<CacheTier>(proto_tier - 1);
}

int TierToProto(CacheTier tier) { return static_cast<int>(tier) + 1; }

}  // namespace strata::scheduler
