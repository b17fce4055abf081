// CPU references of the small CUDA kernels that have no CPU-backend counterpart with the same
// bf16 roundings: RMSNorm (+ residual), SiLU x mul, a routed MoE expert, and the KV pool <->
// payload layout moves.
// Inputs are bf16 values held in floats. RoPE and the MoE router are checked against the CPU
// backend itself (cpu::Rope, cpu::RouteToken).
#pragma once

#include <cstdint>
#include <vector>

namespace strata::kernels {

// h = bf16(x + residual) (x alone without residual); out = bf16(w * bf16(h / rms(h))), dense rows.
void RmsNormReference(const std::vector<float>& x, const std::vector<float>* residual,
                      const std::vector<float>& weight, int rows, int dim, float eps,
                      std::vector<float>& h, std::vector<float>& out);

// out = bf16(silu(gate) * up), fp32 math.
void SiluMulReference(const std::vector<float>& gate, const std::vector<float>& up,
                      std::vector<float>& out);

// One routed expert on one token row, the roundings of the CUDA backend's bf16 path (bf16 gate
// and up, bf16 SiLU(gate) * up, bf16 out), double accumulation (kernels/moe_experts).
// weights: expert e at e * expert_stride: gate [inter][hidden], up [inter][hidden], down
// [hidden][inter]. Fills act [inter] and out [hidden] for token row x [hidden] and expert e.
void MoeExpertReference(const std::vector<float>& weights, int64_t expert_stride, int e,
                        int hidden, int inter, const float* x, std::vector<float>& act,
                        std::vector<float>& out);

// One layer of one page, pool rows [B][R + P] -> payload latent [B][R] then k_pe [B][P].
void PoolLayerToPayloadBf16(const uint16_t* pool_rows, int block_tokens, int latent_dim,
                            int rope_dim, uint16_t* payload_layer);

}  // namespace strata::kernels
