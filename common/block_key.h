// Block identity (ARCHITECTURE.md §2; test vectors in docs/block-keys.md).
//
// A block is `block_tokens` consecutive tokens of one sequence; only full blocks are cached.
//
//   namespace  N   = SHA-256("strata-ns-v1" ‖ fingerprint[32] ‖ u32le(|fmt|) ‖ fmt
//                             ‖ u32le(|salt|) ‖ salt)
//                    where fmt is KvFormat::Canonical(), e.g. "codec=bf16;block=64;layout=1"
//   block key  k_i = SHA-256(N ‖ k_{i-1} ‖ tokens_i as u32le)[0:16],  k_{-1} = 16 zero bytes
//
// A key names the block and its whole prefix. The scheduler, the workers and the trace tools all
// compute keys through this file; nothing else may.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

inline constexpr uint32_t kDefaultBlockTokens = 64;
inline constexpr uint32_t kBlockFormatVersion = 1;

// How a block's KV payload is encoded.
enum class KvCodec : uint8_t {
  kBf16 = 1,     // latent and k_pe in bf16: 1,152 B per token per layer
  kFp8E4M3 = 2,  // latent e4m3 + fp32 scale per 128 values, k_pe bf16: 656 B per token per layer
};

std::string_view KvCodecName(KvCodec codec);
absl::StatusOr<KvCodec> ParseKvCodec(std::string_view name);

struct KvFormat {
  KvCodec codec = KvCodec::kBf16;
  uint32_t block_tokens = kDefaultBlockTokens;  // a power of two >= 16
  uint32_t layout_version = kBlockFormatVersion;

  // "codec=bf16;block=64;layout=1": the bytes that enter the namespace hash.
  std::string Canonical() const;
};

// InvalidArgument unless block_tokens is a power of two >= 16 and the layout version is known.
absl::Status ValidateKvFormat(const KvFormat& format);

template <size_t N>
struct HashBytes {
  std::array<uint8_t, N> bytes{};

  std::string Hex() const;
  std::string_view View() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  // The value whose bytes are exactly `raw` (what View() gives, e.g. a proto `bytes` field);
  // nullopt for any other length.
  static std::optional<HashBytes> FromBytes(std::string_view raw) {
    if (raw.size() != N) return std::nullopt;
    HashBytes h;
    std::memcpy(h.bytes.data(), raw.data(), N);
    return h;
  }
  auto operator<=>(const HashBytes&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const HashBytes& b) {
    return H::combine_contiguous(std::move(h), b.bytes.data(), b.bytes.size());
  }
};

// SHA-256 of the model's config and weights (computed by the model loader).
using ModelFingerprint = HashBytes<32>;
using Namespace = HashBytes<32>;
using BlockKey = HashBytes<16>;

// Parses exactly 2·N hex digits.
absl::StatusOr<BlockKey> ParseBlockKey(std::string_view hex);
absl::StatusOr<Namespace> ParseNamespace(std::string_view hex);

Namespace MakeNamespace(const ModelFingerprint& model, const KvFormat& format,
                        std::string_view tenant_salt);

// The key of the block holding `tokens`, whose prefix ends in block `parent` (or the all-zero key
// for the first block). `tokens` is one whole block.
BlockKey ChainBlockKey(const Namespace& ns, const BlockKey& parent,
                       std::span<const uint32_t> tokens);

// Keys of every full block of `tokens` (a trailing partial block has no key).
std::vector<BlockKey> ComputeBlockKeys(const Namespace& ns, std::span<const uint32_t> tokens,
                                       uint32_t block_tokens = kDefaultBlockTokens);

}  // namespace strata
