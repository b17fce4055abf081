#include "common/block_key.h"

#include <bit>
#include <cstring>

#include "common/hex.h"
#include "common/sha256.h"
#include "common/strings.h"

namespace strata {
namespace {

void AppendU32(Sha256& h, uint32_t v) {
  const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                         static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
  h.Update(le, sizeof(le));
}

template <size_t N>
absl::StatusOr<HashBytes<N>> ParseHashBytes(std::string_view hex, std::string_view what) {
  if (hex.size() != 2 * N) {
    return absl::InvalidArgumentError(
        StrCat(what, " must be ", 2 * N, " hex digits, got ", hex.size()));
  }
  auto decoded = HexDecode(hex);
  if (!decoded.ok()) {
    return absl::InvalidArgumentError(StrCat(what, ": ", decoded.status().message()));
  }
  HashBytes<N> out;
  std::memcpy(out.bytes.data(), decoded->data(), N);
  return out;
}

// Each thread keeps one hashing context: key computation sits on the scheduler's hot path.
Sha256& ThreadHasher() {
  thread_local Sha256 hasher;
  return hasher;
}

}  // namespace

template <size_t N>
std::string HashBytes<N>::Hex() const {
  return HexEncode(bytes);
}
template struct HashBytes<16>;
template struct HashBytes<32>;

std::string_view KvCodecName(KvCodec codec) {
  switch (codec) {
    case KvCodec::kBf16:
      return "bf16";
    case KvCodec::kFp8E4M3:
      return "fp8";
  }
  return "unknown";
}

absl::StatusOr<KvCodec> ParseKvCodec(std::string_view name) {
  if (name == "bf16") return KvCodec::kBf16;
  if (name == "fp8") return KvCodec::kFp8E4M3;
  return absl::InvalidArgumentError(StrCat("unknown KV codec '", name, "' (expected bf16 or fp8)"));
}

std::string KvFormat::Canonical() const {
  return StrCat("codec=", KvCodecName(codec), ";block=", block_tokens, ";layout=", layout_version);
}

absl::Status ValidateKvFormat(const KvFormat& format) {
  if (format.block_tokens < 16 || !std::has_single_bit(format.block_tokens)) {
    return absl::InvalidArgumentError(
        StrCat("block size must be a power of two >= 16 tokens, got ", format.block_tokens));
  }
  if (format.layout_version != kBlockFormatVersion) {
    return absl::InvalidArgumentError(
        StrCat("unsupported block layout version ", format.layout_version));
  }
  if (KvCodecName(format.codec) == "unknown") {
    return absl::InvalidArgumentError("unknown KV codec");
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockKey> ParseBlockKey(std::string_view hex) {
  return ParseHashBytes<16>(hex, "block key");
}

absl::StatusOr<Namespace> ParseNamespace(std::string_view hex) {
  return ParseHashBytes<32>(hex, "namespace");
}

Namespace MakeNamespace(const ModelFingerprint& model, const KvFormat& format,
                        std::string_view tenant_salt) {
  static constexpr std::string_view kDomain = "strata-ns-v1";
  const std::string fmt = format.Canonical();
  Sha256& h = ThreadHasher();
  h.Reset();
  h.Update(kDomain);
  h.Update(model.bytes.data(), model.bytes.size());
  AppendU32(h, static_cast<uint32_t>(fmt.size()));
  h.Update(fmt);
  AppendU32(h, static_cast<uint32_t>(tenant_salt.size()));
  h.Update(tenant_salt);
  Namespace ns;
  ns.bytes = h.Final();
  return ns;
}

BlockKey ChainBlockKey(const Namespace& ns, const BlockKey& parent,
                       std::span<const uint32_t> tokens) {
  Sha256& h = ThreadHasher();
  h.Reset();
  h.Update(ns.bytes.data(), ns.bytes.size());
  h.Update(parent.bytes.data(), parent.bytes.size());
  if constexpr (std::endian::native == std::endian::little) {
    h.Update(tokens.data(), tokens.size_bytes());
  } else {
    for (uint32_t t : tokens) AppendU32(h, t);
  }
  const Sha256Digest digest = h.Final();
  BlockKey key;
  std::memcpy(key.bytes.data(), digest.data(), key.bytes.size());
  return key;
}

std::vector<BlockKey> ComputeBlockKeys(const Namespace& ns, std::span<const uint32_t> tokens,
                                       uint32_t block_tokens) {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  const size_t num_blocks = tokens.size() / block_tokens;
  keys.reserve(num_blocks);
  BlockKey parent;  // all zero
  for (size_t i = 0; i < num_blocks; ++i) {
    parent = ChainBlockKey(ns, parent, tokens.subspan(i * block_tokens, block_tokens));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace strata
