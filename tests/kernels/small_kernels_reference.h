// CPU references of the small CUDA kernels that have no CPU-backend counterpart with the same
// bf16 roundings: RMSNorm (+ residual) and SiLU x mul, and the KV pool <-> payload layout moves.
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

// One layer of one page, pool rows [B][R + P] -> payload latent [B][R] then k_pe [B][P].
void PoolLayerToPayloadBf16(const uint16_t* pool_rows, int block_tokens, int latent_dim,
                            int rope_dim, uint16_t* payload_layer);

}  // namespace strata::kernels
