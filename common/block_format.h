// KV block format version 1 (ARCHITECTURE.md §3; byte layout in docs/block-format.md).
//
//   header   112 bytes, little-endian, fixed size (kBlockHeaderBytes), see EncodeBlockHeader
//   tokens   block_tokens × u32 LE
//   payload  layer-major: for each layer l, LayerBytes() bytes at LayerOffset(l):
//              bf16: latent [B][kv_lora_rank] bf16, then k_pe [B][rope_dim] bf16
//              fp8:  latent [B][kv_lora_rank] e4m3, then scales [B][kv_lora_rank/128] f32,
//                    then k_pe [B][rope_dim] bf16
//
// Layer-major so a loader can start layer 0 before the rest of the block arrives.
//
// Everything here is a pure function of its arguments: thread-safe, no allocation beyond the
// returned values. Parsing never trusts the input: a short buffer, bad magic or a checksum mismatch
// is DataLoss; an unknown version is Unimplemented; an unknown codec or an impossible geometry is
// InvalidArgument. A block that is intact but is not the block asked for (a key collision or a
// forged block) is NotFound (see IsBlockIdentityMismatch): the caller treats it as a miss.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/block_key.h"

namespace strata {

inline constexpr std::array<uint8_t, 4> kBlockMagic = {'S', 'T', 'K', 'V'};
inline constexpr size_t kBlockHeaderBytes = 112;
inline constexpr uint32_t kDefaultKvLoraRank = 512;
inline constexpr uint32_t kDefaultRopeDim = 64;
// fp8 codec: one fp32 scale per this many consecutive latent values of one token.
inline constexpr uint32_t kFp8GroupSize = 128;
// Largest finite e4m3 value (OCP FP8 E4M3, "fn" variant: no infinities, 0x7F/0xFF are NaN).
inline constexpr float kFp8E4M3Max = 448.0f;

// Shape and codec of one block; all sizes and offsets derive from it.
struct BlockLayout {
  KvCodec codec = KvCodec::kBf16;
  uint32_t n_layers = 0;
  uint32_t block_tokens = kDefaultBlockTokens;
  uint32_t kv_lora_rank = kDefaultKvLoraRank;
  uint32_t rope_dim = kDefaultRopeDim;

  // bf16: 2·(rank + rope) = 1,152; fp8: rank + 4·rank/128 + 2·rope = 656 (for 512/64).
  uint64_t BytesPerTokenPerLayer() const;
  uint64_t LayerBytes() const { return BytesPerTokenPerLayer() * block_tokens; }
  uint64_t PayloadBytes() const { return LayerBytes() * n_layers; }
  // Offset of layer `l` within the payload (l may equal n_layers: the end).
  uint64_t LayerOffset(uint32_t l) const { return LayerBytes() * l; }
  // Offsets within one layer's bytes.
  uint64_t LatentOffset() const { return 0; }
  uint64_t ScalesOffset() const;  // fp8 only: after the e4m3 latent
  uint64_t KpeOffset() const;
  uint64_t TokensBytes() const { return uint64_t{4} * block_tokens; }
  // Header + tokens + payload.
  uint64_t TotalBytes() const { return kBlockHeaderBytes + TokensBytes() + PayloadBytes(); }
  uint64_t PayloadOffsetInBlock() const { return kBlockHeaderBytes + TokensBytes(); }
};

// InvalidArgument unless every dimension is positive and bounded (layers <= 4096, block tokens,
// rank and rope dim <= 65,536) and, for fp8, kv_lora_rank is a multiple of kFp8GroupSize.
absl::Status ValidateBlockLayout(const BlockLayout& layout);

// Sizes for the model geometry of the architecture (kv_lora_rank 512, rope_dim 64).
uint64_t PayloadBytes(const KvFormat& format, uint32_t n_layers);
uint64_t LayerOffset(const KvFormat& format, uint32_t layer);
BlockLayout MakeBlockLayout(const KvFormat& format, uint32_t n_layers,
                            uint32_t kv_lora_rank = kDefaultKvLoraRank,
                            uint32_t rope_dim = kDefaultRopeDim);

struct BlockHeader {
  uint16_t version = kBlockFormatVersion;
  BlockLayout layout;
  BlockKey key;
  BlockKey parent;  // all zero for the first block of a sequence
  Namespace ns;
  uint64_t payload_bytes = 0;     // == layout.PayloadBytes()
  uint64_t payload_checksum = 0;  // Checksum64 (xxh3-64) of the payload bytes
};

// Fills payload_bytes and payload_checksum from `payload`.
BlockHeader MakeBlockHeader(const BlockLayout& layout, const BlockKey& key, const BlockKey& parent,
                            const Namespace& ns, std::span<const uint8_t> payload);

// The 112 header bytes, including the header checksum. Does not validate `header`.
std::array<uint8_t, kBlockHeaderBytes> EncodeBlockHeader(const BlockHeader& header);

// Parses the first kBlockHeaderBytes of `bytes` (more may follow).
absl::StatusOr<BlockHeader> ParseBlockHeader(std::span<const uint8_t> bytes);
absl::StatusOr<BlockHeader> ParseBlockHeader(std::string_view bytes);

// Tokens as B × u32 LE.
std::vector<uint8_t> EncodeBlockTokens(std::span<const uint32_t> tokens);
// DataLoss unless `bytes` is exactly 4·block_tokens bytes.
absl::StatusOr<std::vector<uint32_t>> DecodeBlockTokens(std::span<const uint8_t> bytes,
                                                        uint32_t block_tokens);

// Header + tokens + payload in one buffer. InvalidArgument if the token count or payload size
// disagree with the layout.
absl::StatusOr<std::vector<uint8_t>> EncodeBlock(const BlockLayout& layout, const BlockKey& key,
                                                 const BlockKey& parent, const Namespace& ns,
                                                 std::span<const uint32_t> tokens,
                                                 std::span<const uint8_t> payload);

// A parsed whole block; `payload` points into the buffer given to ParseBlock.
struct BlockView {
  BlockHeader header;
  std::vector<uint32_t> tokens;
  std::span<const uint8_t> payload;
};
// Parses the header and tokens and checks the buffer holds exactly the whole block. Does not
// verify the payload checksum or the identity: call VerifyBlock.
absl::StatusOr<BlockView> ParseBlock(std::span<const uint8_t> block);

// Checks, in order: the payload size and checksum (DataLoss), the token count (DataLoss), then the
// identity (NotFound): the header key equals `expected_key`, the carried tokens equal
// `expected_tokens`, and the key recomputed from the header's namespace, parent and tokens equals
// the header key. OK means the payload may be served for `expected_key`.
absl::Status VerifyBlock(const BlockHeader& header, std::span<const uint32_t> tokens,
                         std::span<const uint8_t> payload, const BlockKey& expected_key,
                         std::span<const uint32_t> expected_tokens);

// VerifyBlock without hashing the payload (its size is still checked): for bytes already checked
// against the checksum the cache server verified at commit (a read the transfer engine checks in
// transit), where a second pass over megabytes would only re-prove what the writer encoded.
absl::Status VerifyBlockIdentity(const BlockHeader& header, std::span<const uint32_t> tokens,
                                 std::span<const uint8_t> payload, const BlockKey& expected_key,
                                 std::span<const uint32_t> expected_tokens);

// True for the status VerifyBlock returns when an intact block is not the one asked for.
bool IsBlockIdentityMismatch(const absl::Status& status);

// ---- Numeric conversions for the payload ----

// bf16 is the top half of an fp32; rounding is to nearest, ties to even. NaN stays NaN (quiet).
// Inline and branch-free (a select), so the loops that call them vectorize.
inline uint16_t Fp32ToBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}
inline float Bf16ToFp32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }
// `out.size()` must equal `in.size()` (checked).
void Fp32ToBf16(std::span<const float> in, std::span<uint16_t> out);
void Bf16ToFp32(std::span<const uint16_t> in, std::span<float> out);

// OCP FP8 E4M3 (bias 7, max 448, subnormals, no infinities). Rounds to nearest even and saturates
// to ±448; NaN maps to 0x7F.
uint8_t Fp32ToFp8E4M3(float x);
float Fp8E4M3ToFp32(uint8_t x);

// Block-scaled e4m3: for each group g of kFp8GroupSize consecutive values,
// scales[g] = max|x| / 448 and out = e4m3(x / scales[g]) (all zero when the group is zero).
// InvalidArgument if in.size() is not a multiple of kFp8GroupSize, the output sizes disagree, or
// an input is not finite.
absl::Status QuantizeFp8E4M3(std::span<const float> in, std::span<uint8_t> out,
                             std::span<float> scales);
// out[i] = e4m3(in[i]) · scales[i / kFp8GroupSize]. Sizes are checked (STRATA_CHECK).
void DequantizeFp8E4M3(std::span<const uint8_t> in, std::span<const float> scales,
                       std::span<float> out);

}  // namespace strata
