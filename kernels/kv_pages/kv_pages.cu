// KV page gather/scatter. Grid: y = (block, layer) pairs, x = 16-byte chunks of one layer of one
// block. Chunk index space per (block, layer): first the latent chunks of all tokens (R/8 or, for
// fp8 save/load, R/8 bf16 values each), then the k_pe chunks. Latent groups of 128 values are 16
// consecutive chunks, hence 16 aligned lanes of one warp (fp8 scale reductions use shuffles).
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/common/sm80_ptx.cuh"
#include "kernels/kv_pages/kv_pages.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

using Vec8 = Bf16x8;

struct Geometry {
  int64_t pool_offset;  // element offset of (page, layer) in the pool
  uint8_t* payload;     // start of this layer in the payload
};

__device__ __forceinline__ Geometry Locate(const KvPagesParams& p, int64_t layer_bytes) {
  const int layers = p.layer_end - p.layer_begin;
  const int block = blockIdx.y / layers;
  const int layer = p.layer_begin + blockIdx.y % layers;
  Geometry g;
  g.pool_offset = layer * p.layer_stride + static_cast<int64_t>(p.pages[block]) * p.page_stride;
  g.payload = p.payloads[block] + layer * layer_bytes;
  return g;
}

// dir: true = pages -> payload (save), false = payload -> pages (load).
template <bool kSave>
__global__ void __launch_bounds__(kThreads) KvBf16Kernel(KvPagesParams p, int64_t layer_bytes) {
  const Geometry g = Locate(p, layer_bytes);
  const int row = p.latent_dim + p.rope_dim;
  const int lat_chunks = p.latent_dim / 8, pe_chunks = p.rope_dim / 8;
  const int total = p.block_tokens * (lat_chunks + pe_chunks);
  auto* payload = reinterpret_cast<__nv_bfloat16*>(g.payload);
  for (int c = blockIdx.x * kThreads + threadIdx.x; c < total; c += gridDim.x * kThreads) {
    int64_t pool_idx, payload_idx;
    if (c < p.block_tokens * lat_chunks) {
      const int t = c / lat_chunks, j = c % lat_chunks;
      pool_idx = static_cast<int64_t>(t) * row + j * 8;
      payload_idx = static_cast<int64_t>(t) * p.latent_dim + j * 8;
    } else {
      const int c2 = c - p.block_tokens * lat_chunks;
      const int t = c2 / pe_chunks, j = c2 % pe_chunks;
      pool_idx = static_cast<int64_t>(t) * row + p.latent_dim + j * 8;
      payload_idx = static_cast<int64_t>(p.block_tokens) * p.latent_dim +
                    static_cast<int64_t>(t) * p.rope_dim + j * 8;
    }
    __nv_bfloat16* pool = p.pool + g.pool_offset + pool_idx;
    if (kSave) {
      *reinterpret_cast<uint4*>(payload + payload_idx) = *reinterpret_cast<const uint4*>(pool);
    } else {
      *reinterpret_cast<uint4*>(pool) = *reinterpret_cast<const uint4*>(payload + payload_idx);
    }
  }
}

template <bool kSave>
__global__ void __launch_bounds__(kThreads) KvFp8Kernel(KvPagesParams p, int64_t layer_bytes) {
  const Geometry g = Locate(p, layer_bytes);
  const int row = p.latent_dim + p.rope_dim;
  const int lat_chunks = p.latent_dim / 8, pe_chunks = p.rope_dim / 8;
  const int groups = p.latent_dim / 128;
  const int lat_total = p.block_tokens * lat_chunks;
  const int total = lat_total + p.block_tokens * pe_chunks;
  uint8_t* codes = g.payload;
  float* scales =
      reinterpret_cast<float*>(g.payload + static_cast<int64_t>(p.block_tokens) * p.latent_dim);
  auto* kpe = reinterpret_cast<__nv_bfloat16*>(g.payload + static_cast<int64_t>(p.block_tokens) *
                                                               (p.latent_dim + 4 * groups));
  const int lane = threadIdx.x % 32;
  const unsigned half_mask = 0xffffu << (lane & 16);
  // Uniform trip count across the block, so the 16-lane groups of the shuffles stay together.
  for (int base = blockIdx.x * kThreads; base < total; base += gridDim.x * kThreads) {
    const int c = base + threadIdx.x;
    if (c >= total) continue;
    if (c < lat_total) {
      const int t = c / lat_chunks, j = c % lat_chunks;
      __nv_bfloat16* pool = p.pool + g.pool_offset + static_cast<int64_t>(t) * row + j * 8;
      uint8_t* code = codes + static_cast<int64_t>(t) * p.latent_dim + j * 8;
      float* scale = scales + t * groups + j / 16;
      if (kSave) {
        Vec8 v;
        v.u = *reinterpret_cast<const uint4*>(pool);
        float mx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) mx = fmaxf(mx, fabsf(__bfloat162float(v.h[i])));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(half_mask, mx, o));
        const float s = mx / 448.f;
        uint8_t out[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          out[i] = s > 0.f ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(
                                 __bfloat162float(v.h[i]) / s, __NV_SATFINITE, __NV_E4M3))
                           : 0;
        }
        *reinterpret_cast<uint2*>(code) = *reinterpret_cast<const uint2*>(out);
        if (j % 16 == 0) *scale = s;
      } else {
        const uint2 raw = *reinterpret_cast<const uint2*>(code);
        const uint8_t* in = reinterpret_cast<const uint8_t*>(&raw);
        const float s = *scale;
        Vec8 v;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const __half_raw hr = __nv_cvt_fp8_to_halfraw(in[i], __NV_E4M3);
          v.h[i] = __float2bfloat16_rn(__half2float(__half(hr)) * s);
        }
        *reinterpret_cast<uint4*>(pool) = v.u;
      }
    } else {
      const int c2 = c - lat_total;
      const int t = c2 / pe_chunks, j = c2 % pe_chunks;
      __nv_bfloat16* pool =
          p.pool + g.pool_offset + static_cast<int64_t>(t) * row + p.latent_dim + j * 8;
      __nv_bfloat16* pe = kpe + static_cast<int64_t>(t) * p.rope_dim + j * 8;
      if (kSave) {
        *reinterpret_cast<uint4*>(pe) = *reinterpret_cast<const uint4*>(pool);
      } else {
        *reinterpret_cast<uint4*>(pool) = *reinterpret_cast<const uint4*>(pe);
      }
    }
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("KvPages: " + what);
}

template <bool kSave>
absl::Status Launch(const KvPagesParams& p, cudaStream_t stream) {
  if (absl::Status st = ValidateKvPagesParams(p); !st.ok()) return st;
  const int layers = p.layer_end - p.layer_begin;
  if (p.num_blocks == 0 || layers == 0) return absl::OkStatus();
  const int64_t grid_y = static_cast<int64_t>(p.num_blocks) * layers;
  if (grid_y > 65535) return Invalid("num_blocks * layers must be <= 65535 per launch");
  const int chunks = p.block_tokens * (p.latent_dim + p.rope_dim) / 8;
  const dim3 grid(std::min((chunks + kThreads - 1) / kThreads, 64), static_cast<unsigned>(grid_y));
  const int64_t layer_bytes = KvPayloadLayerBytes(p);
  if (p.codec == KvPayloadCodec::kBf16) {
    KvBf16Kernel<kSave><<<grid, kThreads, 0, stream>>>(p, layer_bytes);
  } else {
    KvFp8Kernel<kSave><<<grid, kThreads, 0, stream>>>(p, layer_bytes);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return absl::InternalError(std::string("KvPages: ") + cudaGetErrorString(err));
  return absl::OkStatus();
}

}  // namespace

int64_t KvPayloadLayerBytes(const KvPagesParams& p) {
  const int64_t per_token = p.codec == KvPayloadCodec::kBf16
                                ? 2 * (p.latent_dim + p.rope_dim)
                                : p.latent_dim + 4 * (p.latent_dim / 128) + 2 * p.rope_dim;
  return per_token * p.block_tokens;
}

int64_t KvPayloadBytes(const KvPagesParams& p) { return KvPayloadLayerBytes(p) * p.num_layers; }

absl::Status ValidateKvPagesParams(const KvPagesParams& p) {
  if (p.codec != KvPayloadCodec::kBf16 && p.codec != KvPayloadCodec::kFp8E4M3) {
    return Invalid("unknown codec");
  }
  if (p.num_blocks < 0) return Invalid("num_blocks must be >= 0");
  if (p.block_tokens <= 0 || p.block_tokens > 65536) return Invalid("block_tokens out of range");
  if (p.latent_dim <= 0 || p.latent_dim % 8 != 0 || p.rope_dim <= 0 || p.rope_dim % 8 != 0) {
    return Invalid("latent_dim and rope_dim must be positive multiples of 8");
  }
  if (p.codec == KvPayloadCodec::kFp8E4M3) {
    if (p.latent_dim % 128 != 0) return Invalid("fp8 needs latent_dim a multiple of 128");
    if ((static_cast<int64_t>(p.block_tokens) * (p.latent_dim / 128)) % 4 != 0) {
      return Invalid("fp8 needs block_tokens * latent_dim / 128 a multiple of 4 (k_pe alignment)");
    }
  }
  if (p.num_layers <= 0 || p.layer_begin < 0 || p.layer_begin > p.layer_end ||
      p.layer_end > p.num_layers) {
    return Invalid("need 0 <= layer_begin <= layer_end <= num_layers");
  }
  if (KvPayloadLayerBytes(p) % 16 != 0) return Invalid("layer bytes must be a multiple of 16");
  if (p.num_blocks > 0 && (p.pool == nullptr || p.pages == nullptr || p.payloads == nullptr)) {
    return Invalid("pool, pages and payloads must be set");
  }
  const int64_t page_elems = static_cast<int64_t>(p.block_tokens) * (p.latent_dim + p.rope_dim);
  if (p.page_stride < page_elems || p.page_stride % 8 != 0 || p.layer_stride % 8 != 0 ||
      (p.num_layers > 1 && p.layer_stride < page_elems)) {
    return Invalid("page_stride/layer_stride must be multiples of 8 and hold a page");
  }
  if (reinterpret_cast<uintptr_t>(p.pool) % 16 != 0) return Invalid("pool must be 16-byte aligned");
  return absl::OkStatus();
}

absl::Status LaunchKvPagesToPayload(const KvPagesParams& params, cudaStream_t stream) {
  return Launch<true>(params, stream);
}

absl::Status LaunchKvPayloadToPages(const KvPagesParams& params, cudaStream_t stream) {
  return Launch<false>(params, stream);
}

}  // namespace strata::kernels
