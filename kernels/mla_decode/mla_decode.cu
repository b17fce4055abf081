// Launcher of the MLA decode kernels: argument checks, split choice, dispatch by head block.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/common/sm90_device.h"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels {
namespace {

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMlaDecode: " + what);
}

}  // namespace

MlaDecodeImpl MlaDecodeAutoImpl(int batch, int num_heads_q, int64_t max_pages, int num_sms,
                                MlaKvDtype kv_dtype) {
  if (!MlaDecodeSm90Applies(kv_dtype)) return MlaDecodeImpl::kMmaSync;
  if (num_heads_q == 16) {
    // A few-row call (the whole KV one tile per SM or less): its blocks' fixed costs (prologue,
    // pipeline fill, epilogue) are the call's time, and the mma.sync kernel's are the smallest
    // (batch 1 / 4 at 1K-4K tokens: 10-13 vs 14-16 us for the transposed kernel; from batch x
    // pages 256 on the transposed one is faster again; kernels/mla_decode/NOTES.md, "few-row
    // decode"). Else the transposed kernel (1.02-1.17x the 64-row one at 4K-32K, b = 128); at
    // h_q 32, with one consumer warpgroup, it measured 0.60-0.67x the 64-row one (NOTES.md v6),
    // so it is taken there by name only.
    if (static_cast<int64_t>(batch) * max_pages <= num_sms) return MlaDecodeImpl::kMmaSync;
    return MlaDecodeImpl::kSm90Transposed;
  }
  // The seesaw kernel from 64 heads on: 1.05-1.09x the kernel before it at h_q 128 and
  // 0.98-1.10x the both-warpgroups kernel at h_q 64 (b = 128, 4K-32K; kernels/mla_decode/NOTES.md
  // v8). Not for a few-row call: its tiles go in pairs (an odd split is padded with a masked
  // tile) and its fixed costs are larger (batch 1, h_q 128, 1K / 4K tokens: 0.017 / 0.023 ms
  // against 0.013 / 0.019 for the both-warpgroups kernel). Between 16 and 64 heads (not timed
  // against each other) the both-warpgroups kernel too.
  const bool few_rows = static_cast<int64_t>(batch) * max_pages <= num_sms;
  return num_heads_q >= 64 && !few_rows ? MlaDecodeImpl::kSm90Seesaw : MlaDecodeImpl::kSm90;
}

int MlaDecodeNumSplits(int batch, int num_heads_q, int max_seqlen, int num_sms, MlaKvDtype kv_dtype,
                       MlaDecodeImpl impl) {
  if (batch <= 0 || num_heads_q <= 0 || num_sms <= 0 || max_seqlen <= 0) return 1;
  if (impl == MlaDecodeImpl::kAuto) {
    impl = MlaDecodeAutoImpl(batch, num_heads_q, (max_seqlen + kMlaPageSize - 1) / kMlaPageSize,
                             num_sms, kv_dtype);
  }
  const bool sm90 = impl != MlaDecodeImpl::kMmaSync;
  // Blocks and their tiles: the Hopper kernels take 64 heads (the transposed one all of h_q <= 32;
  // 64-token tiles, one block per SM);
  // the mma.sync one 16, 32 or 64 (32-token tiles; blocks of 16 run two to an SM, see
  // mla_detail::Layout::kBlocksPerSm).
  int heads_per_block = 64, tile_tokens = 64;
  if (!sm90) {
    heads_per_block = num_heads_q % 64 == 0 ? 64 : (num_heads_q % 32 == 0 ? 32 : 16);
    tile_tokens = 32;
    if (heads_per_block == 16) num_sms *= 2;
  }
  const int64_t blocks =
      static_cast<int64_t>(batch) * ((num_heads_q + heads_per_block - 1) / heads_per_block);
  const int tiles = (max_seqlen + tile_tokens - 1) / tile_tokens;
  // Modelled time: waves of one block per SM, each as long as one split's tiles plus a fixed cost
  // (prologue, epilogue, combine traffic) worth about two tiles.
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= std::min(kMlaMaxSplits, tiles); ++s) {
    const int64_t waves = (blocks * s + num_sms - 1) / num_sms;
    int per_split = (tiles + s - 1) / s;
    if (impl == MlaDecodeImpl::kSm90Seesaw) per_split += per_split % 2;  // tiles in pairs
    const double cost = static_cast<double>(waves) * (per_split + 2);
    if (cost < best_cost * 0.97) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

size_t MlaDecodeWorkspaceBytes(int batch, int num_heads_q, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(batch) * num_splits * num_heads_q;
  const size_t o_bytes = (rows * kMlaValueDim * sizeof(float) + 255) / 256 * 256;
  return o_bytes + rows * sizeof(float);
}

void MlaDecodeSetWorkspace(MlaDecodeParams& params, void* workspace) {
  if (params.num_splits <= 1 || workspace == nullptr) return;
  const size_t rows = static_cast<size_t>(params.batch) * params.num_splits * params.num_heads_q;
  const size_t o_bytes = (rows * kMlaValueDim * sizeof(float) + 255) / 256 * 256;
  params.o_accum = static_cast<float*>(workspace);
  params.lse_accum = reinterpret_cast<float*>(static_cast<char*>(workspace) + o_bytes);
}

absl::Status ValidateMlaDecodeParams(const MlaDecodeParams& p) {
  if (p.batch <= 0 || p.batch > 65535) return Invalid("batch must be in [1, 65535]");
  if (p.num_heads_q < 16 || p.num_heads_q > 128 || p.num_heads_q % 16 != 0) {
    return Invalid("num_heads_q must be a multiple of 16 in [16, 128], got " +
                   std::to_string(p.num_heads_q));
  }
  if (p.impl == MlaDecodeImpl::kSm90Transposed && p.num_heads_q != 16 && p.num_heads_q != 32) {
    return Invalid("the transposed sm90 kernel takes num_heads_q 16 or 32, got " +
                   std::to_string(p.num_heads_q));
  }
  if (p.num_pages <= 0) return Invalid("num_pages must be positive");
  if (p.max_pages_per_seq <= 0) return Invalid("max_pages_per_seq must be positive");
  if (p.num_splits < 1 || p.num_splits > kMlaMaxSplits) {
    return Invalid("num_splits must be in [1, " + std::to_string(kMlaMaxSplits) + "]");
  }
  if (p.fresh_rows < 0) return Invalid("fresh_rows must not be negative");
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.f) {
    return Invalid("softmax_scale must be finite and positive");
  }
  const bool fp8 = p.kv_dtype == MlaKvDtype::kFp8E4M3;
  const void* cache = fp8 ? static_cast<const void*>(p.kv_cache_fp8) : p.kv_cache;
  if (p.q == nullptr || cache == nullptr || p.block_table == nullptr || p.seqlens == nullptr ||
      p.out == nullptr || p.lse == nullptr) {
    return Invalid(std::string("q, ") + (fp8 ? "kv_cache_fp8" : "kv_cache") +
                   ", block_table, seqlens, out and lse must be set");
  }
  if (p.num_splits > 1 && (p.o_accum == nullptr || p.lse_accum == nullptr)) {
    return Invalid("num_splits > 1 needs o_accum and lse_accum (MlaDecodeSetWorkspace)");
  }
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 != 0;
  };
  if (misaligned(p.q) || misaligned(cache) || misaligned(p.out) ||
      (p.num_splits > 1 && misaligned(p.o_accum))) {
    return Invalid("q, kv_cache, out and o_accum must be 16-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status LaunchMlaDecode(const MlaDecodeParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateMlaDecodeParams(params); !st.ok()) return st;
  const MlaDecodeImpl impl =
      params.impl != MlaDecodeImpl::kAuto
          ? params.impl
          : MlaDecodeAutoImpl(params.batch, params.num_heads_q, params.max_pages_per_seq,
                              CurrentDeviceSmCount(), params.kv_dtype);
  if (impl != MlaDecodeImpl::kMmaSync && !MlaDecodeSm90Applies(params.kv_dtype)) {
    return absl::FailedPreconditionError(
        "LaunchMlaDecode: the sm90 kernels need bf16 pages and a compute capability 9.x device");
  }
  const absl::Status split_kv = [&] {
    switch (impl) {
      case MlaDecodeImpl::kSm90Transposed:
        return LaunchMlaDecodeSm90Transposed(params, stream);
      case MlaDecodeImpl::kSm90Seesaw:
        return LaunchMlaDecodeSm90Seesaw(params, stream);
      case MlaDecodeImpl::kSm90:
        return LaunchMlaDecodeSm90(params, stream);
      default:  // kMmaSync (kAuto is resolved above)
        return params.num_heads_q % 64 == 0   ? LaunchMlaDecodeSplitKv<4>(params, stream)
               : params.num_heads_q % 32 == 0 ? LaunchMlaDecodeSplitKv<2>(params, stream)
                                              : LaunchMlaDecodeSplitKv<1>(params, stream);
    }
  }();
  if (!split_kv.ok() || params.num_splits == 1 || params.skip_combine) return split_kv;
  return LaunchMlaDecodeCombine(params, stream);
}

}  // namespace strata::kernels
