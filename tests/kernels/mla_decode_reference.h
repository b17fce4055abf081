// fp32 CPU reference of MLA decode (kernels/mla_decode/mla_decode.h), on bf16 inputs given as
// floats (already rounded to bf16), so the only differences from the kernel are its roundings.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::kernels {

struct MlaDecodeReferenceInputs {
  int batch = 0, num_heads_q = 0, max_pages_per_seq = 0;
  float softmax_scale = 0.f;
  const std::vector<float>* q = nullptr;              // [batch][num_heads_q][576]
  const std::vector<float>* kv = nullptr;             // [num_pages][64][576]
  const std::vector<int32_t>* block_table = nullptr;  // [batch][max_pages_per_seq]
  const std::vector<int32_t>* seqlens = nullptr;      // [batch]
};

// Fills out [batch][num_heads_q][512] and lse [batch][num_heads_q] (natural log; -inf and a zero
// row for an empty sequence).
void MlaDecodeReference(const MlaDecodeReferenceInputs& in, std::vector<float>& out,
                        std::vector<float>& lse);

}  // namespace strata::kernels
