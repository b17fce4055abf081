#include "scheduler/simulator/cluster_model.h"

#include "common/strings.h"

namespace strata::scheduler::sim {

ClusterModel DefaultH200Cluster() {
  ClusterModel m;
  // Prefill: 2 × 37e9 FLOP per token for the dense/MoE matmuls, 5.0e6 FLOP per
  // (query, key) pair for MLA attention (128 heads × (192 + 128) × 2 × 61 layers), at an
  // effective 3.2 PFLOP/s per 8-GPU node (~40 % of dense BF16 peak); 20 ms fixed per prefill.
  m.prefill.base_s = 0.020;
  m.prefill.per_token_s = 74e9 / 3.2e15;
  m.prefill.per_pair_s = 5.0e6 / 3.2e15;
  // Decode: ~15 ms per step of weights/expert reads, 0.1 ms per sequence, and reading
  // 70 KB of KV per context token at ~4.8 TB/s·8 → ~2 ns per context token.
  m.decode.base_s = 0.015;
  m.decode.per_seq_s = 0.0001;
  m.decode.per_ctx_token_s = 70272.0 / (8 * 4.8e12);
  m.tiers.kv_bytes_per_token = 70272;
  m.tiers.local_bandwidth = {4e12, 50e9, 12e9};
  m.tiers.network_bandwidth = 100e9;
  m.tiers.fixed_latency_s = 0.001;
  return m;
}

std::string ClusterModel::Describe() const {
  return StrCat(
      prefill_nodes, " prefill + ", decode_nodes, " decode nodes; cache per prefill node ",
      cache_tokens[0], " GPU / ", cache_tokens[1], " DRAM / ", cache_tokens[2],
      " SSD tokens; prefill = ", prefill.base_s, " s + ", prefill.per_token_s, " s/token + ",
      prefill.per_pair_s, " s/pair; tier bandwidth GB/s ", tiers.local_bandwidth[0] / 1e9, "/",
      tiers.local_bandwidth[1] / 1e9, "/", tiers.local_bandwidth[2] / 1e9, ", network ",
      tiers.network_bandwidth / 1e9, " GB/s; ", tiers.kv_bytes_per_token, " B KV per token");
}

}  // namespace strata::scheduler::sim
