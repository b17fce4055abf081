// Small vocabulary shared by the scheduler's index, load view, policies and simulator.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::scheduler {

// Dense index of a node in the scheduler's registry (stable for the node's lifetime).
using NodeIndex = uint32_t;
inline constexpr NodeIndex kNoNode = ~NodeIndex{0};

// Cache tiers, fastest first. Values are proto Tier minus one (TIER_GPU = 1 → kGpu = 0).
enum class CacheTier : uint8_t { kGpu = 0, kDram = 1, kSsd = 2 };
inline constexpr int kNumTiers = 3;

std::string_view CacheTierName(CacheTier tier);

// proto strata.v1.Tier value → CacheTier; nullopt for TIER_UNSPECIFIED or unknown values.
std::optional<CacheTier> TierFromProto(int proto_tier);
int TierToProto(CacheTier tier);

using TierCounts = std::array<uint32_t, kNumTiers>;

}  // namespace strata::scheduler
