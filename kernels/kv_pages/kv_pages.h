// KV page gather/scatter between the paged latent KV pool on the GPU and block payloads (block
// format v1, common/block_format.h, docs/block-format.md), in bf16 or fp8 (e4m3 + per-128 scales).
//
// Pool layout (what the MLA decode kernel reads, one layer at a time): token t of page p in layer
// l is the row of latent_dim + rope_dim bf16 (latent, then k_pe) at
//   pool + l * layer_stride + p * page_stride + t * (latent_dim + rope_dim)
// so per-layer pools are layer_stride = num_pages * page_stride, page_stride = B * (R + P), and a
// page-major pool is page_stride = n_layers * B * (R + P), layer_stride = B * (R + P).
//
// Payload layout (block format v1, layer-major; layer l at l * LayerBytes()):
//   bf16: latent [B][R] bf16, k_pe [B][P] bf16
//   fp8:  latent [B][R] e4m3, scales [B][R/128] f32, k_pe [B][P] bf16
// Block i moves between page pages[i] and the payload at payloads[i]; only layers
// [layer_begin, layer_end) are touched, so a loader can move layer l as soon as its bytes arrived.
// payloads[i] may be device memory or pinned host memory mapped into the device (zero-copy load
// and save over PCIe/NVLink-C2C).
//
// Numerics: bf16 moves bits unchanged. fp8 save quantizes each group of 128 latent values of one
// token exactly as strata::QuantizeFp8E4M3 does (scale = max|x| / 448, code = e4m3(x / scale),
// round to nearest even, saturate; zero scale -> zero codes); fp8 load writes bf16(e4m3 * scale).
//
// Preconditions the launcher cannot check (device memory): pages[i] in [0, num_pages), payload
// pointers 16-byte aligned and each covering PayloadBytes; distinct blocks on load name distinct
// pages. Thread safety: stateless.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

enum class KvPayloadCodec { kBf16 = 1, kFp8E4M3 = 2 };  // values as strata::KvCodec

struct KvPagesParams {
  KvPayloadCodec codec = KvPayloadCodec::kBf16;
  int num_blocks = 0;
  int block_tokens = 64;  // B
  int latent_dim = 512;   // R; a multiple of 128 for fp8
  int rope_dim = 64;      // P
  int num_layers = 0;     // layers in each payload
  int layer_begin = 0;    // layers [layer_begin, layer_end) are moved
  int layer_end = 0;
  __nv_bfloat16* pool = nullptr;
  int64_t layer_stride = 0;            // elements
  int64_t page_stride = 0;             // elements
  const int32_t* pages = nullptr;      // [num_blocks], device
  uint8_t* const* payloads = nullptr;  // [num_blocks] payload starts, device array
};

// Bytes of one layer / of the whole payload for the params' geometry and codec.
int64_t KvPayloadLayerBytes(const KvPagesParams& params);
int64_t KvPayloadBytes(const KvPagesParams& params);

absl::Status ValidateKvPagesParams(const KvPagesParams& params);
// Block save: pages -> payloads (fp8: quantize).
absl::Status LaunchKvPagesToPayload(const KvPagesParams& params, cudaStream_t stream);
// Block load: payloads -> pages (fp8: dequantize to bf16).
absl::Status LaunchKvPayloadToPages(const KvPagesParams& params, cudaStream_t stream);

}  // namespace strata::kernels
