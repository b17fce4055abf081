// Device buffers of LaunchMoeAlign for one routing (the MoE kernel tests run it first, as the
// engine does), poisoned like every DeviceBuffer except the error flag (0).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/moe_experts/moe_experts.h"
#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels::testing {

struct MoeAlignBuffers {
  // ids: [tokens][top_k] expert choices.
  MoeAlignBuffers(const std::vector<int32_t>& ids, int tokens, int top_k, int experts)
      : ids(ids),
        count(experts * 4),
        offset((experts + 1) * 4),
        active(experts * 4),
        num_active(4),
        slot_token(std::max(tokens * top_k, 1) * 4),
        token_slot(std::max(tokens * top_k, 1) * 8),
        error(std::vector<int32_t>{0}) {
    params.num_tokens = tokens;
    params.top_k = top_k;
    params.num_experts = experts;
    params.experts = this->ids.get<int32_t>();
    params.out = {.expert_count = count.get<int32_t>(),
                  .expert_offset = offset.get<int32_t>(),
                  .active = active.get<int32_t>(),
                  .num_active = num_active.get<int32_t>(),
                  .slot_token = slot_token.get<int32_t>(),
                  .token_slot = token_slot.get<int64_t>(),
                  .error = error.get<int32_t>()};
  }

  DeviceBuffer ids, count, offset, active, num_active, slot_token, token_slot, error;
  MoeAlignParams params;
};

}  // namespace strata::kernels::testing
