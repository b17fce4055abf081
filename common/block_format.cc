#include "common/block_format.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/checksum.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata {
namespace {

static_assert(std::endian::native == std::endian::little,
              "payload arrays are stored in host order, which must be little-endian");

// Header field offsets (docs/block-format.md).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffCodec = 6;
constexpr size_t kOffReserved = 7;
constexpr size_t kOffLayers = 8;
constexpr size_t kOffBlockTokens = 12;
constexpr size_t kOffRank = 16;
constexpr size_t kOffRope = 20;
constexpr size_t kOffKey = 24;
constexpr size_t kOffParent = 40;
constexpr size_t kOffNamespace = 56;
constexpr size_t kOffPayloadBytes = 88;
constexpr size_t kOffPayloadChecksum = 96;
constexpr size_t kOffHeaderChecksum = 104;
static_assert(kOffHeaderChecksum + 8 == kBlockHeaderBytes);

constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxDim = 65536;

template <typename T>
void PutLe(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T GetLe(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

}  // namespace

uint64_t BlockLayout::BytesPerTokenPerLayer() const {
  const uint64_t kpe = uint64_t{2} * rope_dim;
  if (codec == KvCodec::kFp8E4M3) {
    return uint64_t{kv_lora_rank} + uint64_t{4} * (kv_lora_rank / kFp8GroupSize) + kpe;
  }
  return uint64_t{2} * kv_lora_rank + kpe;
}

uint64_t BlockLayout::ScalesOffset() const { return uint64_t{kv_lora_rank} * block_tokens; }

uint64_t BlockLayout::KpeOffset() const {
  if (codec == KvCodec::kFp8E4M3) {
    return ScalesOffset() + uint64_t{4} * (kv_lora_rank / kFp8GroupSize) * block_tokens;
  }
  return uint64_t{2} * kv_lora_rank * block_tokens;
}

absl::Status ValidateBlockLayout(const BlockLayout& layout) {
  if (layout.codec != KvCodec::kBf16 && layout.codec != KvCodec::kFp8E4M3) {
    return absl::InvalidArgumentError(
        StrCat("unknown KV codec ", static_cast<int>(layout.codec), " (known: 1=bf16, 2=fp8)"));
  }
  auto in_range = [](uint32_t v, uint32_t max) { return v > 0 && v <= max; };
  if (!in_range(layout.n_layers, kMaxLayers)) {
    return absl::InvalidArgumentError(
        StrCat("block n_layers ", layout.n_layers, " outside [1, ", kMaxLayers, "]"));
  }
  if (!in_range(layout.block_tokens, kMaxDim) || !in_range(layout.kv_lora_rank, kMaxDim) ||
      !in_range(layout.rope_dim, kMaxDim)) {
    return absl::InvalidArgumentError(StrCat("block geometry out of range: block_tokens ",
                                             layout.block_tokens, ", kv_lora_rank ",
                                             layout.kv_lora_rank, ", rope_dim ", layout.rope_dim,
                                             " (each must be in [1, ", kMaxDim, "])"));
  }
  if (layout.codec == KvCodec::kFp8E4M3 && layout.kv_lora_rank % kFp8GroupSize != 0) {
    return absl::InvalidArgumentError(StrCat("fp8 codec needs kv_lora_rank a multiple of ",
                                             kFp8GroupSize, ", got ", layout.kv_lora_rank));
  }
  return absl::OkStatus();
}

BlockLayout MakeBlockLayout(const KvFormat& format, uint32_t n_layers, uint32_t kv_lora_rank,
                            uint32_t rope_dim) {
  return BlockLayout{.codec = format.codec,
                     .n_layers = n_layers,
                     .block_tokens = format.block_tokens,
                     .kv_lora_rank = kv_lora_rank,
                     .rope_dim = rope_dim};
}

uint64_t PayloadBytes(const KvFormat& format, uint32_t n_layers) {
  return MakeBlockLayout(format, n_layers).PayloadBytes();
}

uint64_t LayerOffset(const KvFormat& format, uint32_t layer) {
  return MakeBlockLayout(format, layer).LayerOffset(layer);
}

BlockHeader MakeBlockHeader(const BlockLayout& layout, const BlockKey& key, const BlockKey& parent,
                            const Namespace& ns, std::span<const uint8_t> payload) {
  BlockHeader h;
  h.layout = layout;
  h.key = key;
  h.parent = parent;
  h.ns = ns;
  h.payload_bytes = payload.size();
  h.payload_checksum = Checksum64(payload.data(), payload.size());
  return h;
}

std::array<uint8_t, kBlockHeaderBytes> EncodeBlockHeader(const BlockHeader& header) {
  std::array<uint8_t, kBlockHeaderBytes> out{};
  uint8_t* p = out.data();
  std::memcpy(p + kOffMagic, kBlockMagic.data(), kBlockMagic.size());
  PutLe<uint16_t>(p + kOffVersion, header.version);
  p[kOffCodec] = static_cast<uint8_t>(header.layout.codec);
  p[kOffReserved] = 0;
  PutLe<uint32_t>(p + kOffLayers, header.layout.n_layers);
  PutLe<uint32_t>(p + kOffBlockTokens, header.layout.block_tokens);
  PutLe<uint32_t>(p + kOffRank, header.layout.kv_lora_rank);
  PutLe<uint32_t>(p + kOffRope, header.layout.rope_dim);
  std::memcpy(p + kOffKey, header.key.bytes.data(), header.key.bytes.size());
  std::memcpy(p + kOffParent, header.parent.bytes.data(), header.parent.bytes.size());
  std::memcpy(p + kOffNamespace, header.ns.bytes.data(), header.ns.bytes.size());
  PutLe<uint64_t>(p + kOffPayloadBytes, header.payload_bytes);
  PutLe<uint64_t>(p + kOffPayloadChecksum, header.payload_checksum);
  PutLe<uint64_t>(p + kOffHeaderChecksum, Checksum64(p, kOffHeaderChecksum));
  return out;
}

absl::StatusOr<BlockHeader> ParseBlockHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kBlockHeaderBytes) {
    return absl::DataLossError(
        StrCat("truncated KV block header: ", bytes.size(), " of ", kBlockHeaderBytes, " bytes"));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p + kOffMagic, kBlockMagic.data(), kBlockMagic.size()) != 0) {
    return absl::DataLossError("not a KV block: bad magic (want \"STKV\")");
  }
  const uint64_t stored = GetLe<uint64_t>(p + kOffHeaderChecksum);
  const uint64_t computed = Checksum64(p, kOffHeaderChecksum);
  // The version is read before the checksum is trusted only to name it in the message: a future
  // version may checksum a different layout, so its mismatch is Unimplemented, not DataLoss.
  const uint16_t version = GetLe<uint16_t>(p + kOffVersion);
  if (version != kBlockFormatVersion) {
    return absl::UnimplementedError(StrCat("KV block format version ", version,
                                           " is not supported (this build reads version ",
                                           kBlockFormatVersion, ")"));
  }
  if (stored != computed) {
    return absl::DataLossError(
        StrCat("KV block header checksum mismatch (stored ", stored, ", computed ", computed, ")"));
  }
  BlockHeader h;
  h.version = version;
  h.layout.codec = static_cast<KvCodec>(p[kOffCodec]);
  if (p[kOffReserved] != 0) {
    return absl::InvalidArgumentError("KV block header: reserved byte 7 is not zero");
  }
  h.layout.n_layers = GetLe<uint32_t>(p + kOffLayers);
  h.layout.block_tokens = GetLe<uint32_t>(p + kOffBlockTokens);
  h.layout.kv_lora_rank = GetLe<uint32_t>(p + kOffRank);
  h.layout.rope_dim = GetLe<uint32_t>(p + kOffRope);
  RETURN_IF_ERROR_WITH(ValidateBlockLayout(h.layout), "KV block header");
  std::memcpy(h.key.bytes.data(), p + kOffKey, h.key.bytes.size());
  std::memcpy(h.parent.bytes.data(), p + kOffParent, h.parent.bytes.size());
  std::memcpy(h.ns.bytes.data(), p + kOffNamespace, h.ns.bytes.size());
  h.payload_bytes = GetLe<uint64_t>(p + kOffPayloadBytes);
  h.payload_checksum = GetLe<uint64_t>(p + kOffPayloadChecksum);
  if (h.payload_bytes != h.layout.PayloadBytes()) {
    return absl::DataLossError(StrCat("KV block header: payload bytes ", h.payload_bytes,
                                      " disagree with the geometry (", h.layout.PayloadBytes(),
                                      ")"));
  }
  return h;
}

absl::StatusOr<BlockHeader> ParseBlockHeader(std::string_view bytes) {
  return ParseBlockHeader(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::vector<uint8_t> EncodeBlockTokens(std::span<const uint32_t> tokens) {
  std::vector<uint8_t> out(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) PutLe<uint32_t>(out.data() + 4 * i, tokens[i]);
  return out;
}

absl::StatusOr<std::vector<uint32_t>> DecodeBlockTokens(std::span<const uint8_t> bytes,
                                                        uint32_t block_tokens) {
  if (bytes.size() != uint64_t{4} * block_tokens) {
    return absl::DataLossError(
        StrCat("KV block tokens: ", bytes.size(), " bytes, want ", uint64_t{4} * block_tokens));
  }
  std::vector<uint32_t> tokens(block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = GetLe<uint32_t>(bytes.data() + 4 * i);
  return tokens;
}

absl::StatusOr<std::vector<uint8_t>> EncodeBlock(const BlockLayout& layout, const BlockKey& key,
                                                 const BlockKey& parent, const Namespace& ns,
                                                 std::span<const uint32_t> tokens,
                                                 std::span<const uint8_t> payload) {
  RETURN_IF_ERROR(ValidateBlockLayout(layout));
  if (tokens.size() != layout.block_tokens) {
    return absl::InvalidArgumentError(
        StrCat("EncodeBlock: ", tokens.size(), " tokens, layout wants ", layout.block_tokens));
  }
  if (payload.size() != layout.PayloadBytes()) {
    return absl::InvalidArgumentError(StrCat("EncodeBlock: payload of ", payload.size(),
                                             " bytes, layout wants ", layout.PayloadBytes()));
  }
  std::vector<uint8_t> out;
  out.reserve(layout.TotalBytes());
  const auto header = EncodeBlockHeader(MakeBlockHeader(layout, key, parent, ns, payload));
  out.insert(out.end(), header.begin(), header.end());
  const std::vector<uint8_t> token_bytes = EncodeBlockTokens(tokens);
  out.insert(out.end(), token_bytes.begin(), token_bytes.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

absl::StatusOr<BlockView> ParseBlock(std::span<const uint8_t> block) {
  BlockView view;
  ASSIGN_OR_RETURN(view.header, ParseBlockHeader(block));
  const BlockLayout& layout = view.header.layout;
  if (block.size() != layout.TotalBytes()) {
    return absl::DataLossError(
        StrCat("KV block is ", block.size(), " bytes, its header says ", layout.TotalBytes()));
  }
  ASSIGN_OR_RETURN(view.tokens,
                   DecodeBlockTokens(block.subspan(kBlockHeaderBytes, layout.TokensBytes()),
                                     layout.block_tokens));
  view.payload = block.subspan(layout.PayloadOffsetInBlock());
  return view;
}

namespace {

absl::Status CheckPayloadSize(const BlockHeader& header, std::span<const uint8_t> payload) {
  if (payload.size() == header.payload_bytes) return absl::OkStatus();
  return absl::DataLossError(
      StrCat("KV block payload is ", payload.size(), " bytes, header says ", header.payload_bytes));
}

}  // namespace

absl::Status VerifyBlock(const BlockHeader& header, std::span<const uint32_t> tokens,
                         std::span<const uint8_t> payload, const BlockKey& expected_key,
                         std::span<const uint32_t> expected_tokens) {
  RETURN_IF_ERROR(CheckPayloadSize(header, payload));
  const uint64_t sum = Checksum64(payload.data(), payload.size());
  if (sum != header.payload_checksum) {
    return absl::DataLossError(StrCat("KV block ", header.key.Hex(),
                                      ": payload checksum mismatch (stored ",
                                      header.payload_checksum, ", computed ", sum, ")"));
  }
  return VerifyBlockIdentity(header, tokens, payload, expected_key, expected_tokens);
}

absl::Status VerifyBlockIdentity(const BlockHeader& header, std::span<const uint32_t> tokens,
                                 std::span<const uint8_t> payload, const BlockKey& expected_key,
                                 std::span<const uint32_t> expected_tokens) {
  RETURN_IF_ERROR(CheckPayloadSize(header, payload));
  if (tokens.size() != header.layout.block_tokens) {
    return absl::DataLossError(StrCat("KV block carries ", tokens.size(), " tokens, header says ",
                                      header.layout.block_tokens));
  }
  if (header.key != expected_key) {
    return absl::NotFoundError(StrCat("KV block identity mismatch: block key ", header.key.Hex(),
                                      ", expected ", expected_key.Hex()));
  }
  if (!std::equal(tokens.begin(), tokens.end(), expected_tokens.begin(), expected_tokens.end())) {
    return absl::NotFoundError(StrCat("KV block identity mismatch: block ", header.key.Hex(),
                                      " carries other token ids than expected (key collision "
                                      "or forged block)"));
  }
  if (ChainBlockKey(header.ns, header.parent, tokens) != header.key) {
    return absl::NotFoundError(StrCat("KV block identity mismatch: key ", header.key.Hex(),
                                      " is not the key of its namespace, parent and tokens"));
  }
  return absl::OkStatus();
}

bool IsBlockIdentityMismatch(const absl::Status& status) { return absl::IsNotFound(status); }

// ---- bf16 ----

void Fp32ToBf16(std::span<const float> in, std::span<uint16_t> out) {
  STRATA_CHECK(in.size() == out.size(), "Fp32ToBf16: size mismatch");
  for (size_t i = 0; i < in.size(); ++i) out[i] = Fp32ToBf16(in[i]);
}

void Bf16ToFp32(std::span<const uint16_t> in, std::span<float> out) {
  STRATA_CHECK(in.size() == out.size(), "Bf16ToFp32: size mismatch");
  for (size_t i = 0; i < in.size(); ++i) out[i] = Bf16ToFp32(in[i]);
}

// ---- fp8 e4m3 ----

namespace {

// Fp32ToFp8E4M3, inlined into QuantizeFp8E4M3's loop.
[[gnu::always_inline]] inline uint8_t ToE4M3(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  bits &= 0x7FFFFFFFu;
  if (bits > 0x7F800000u) return 0x7F;          // NaN
  if (bits >= 0x43E00000u) return sign | 0x7E;  // |x| >= 448 (and infinity): saturate
  if (bits < 0x3C800000u) {                     // |x| < 2^-6: subnormal, m · 2^-9, m in [0, 8]
    // m == 8 is the smallest normal, whose encoding is 8. Adding and taking away 2^23 rounds
    // a · 2^9 (< 8) to the nearest integer, ties to even, without a libm call.
    const float m = (std::bit_cast<float>(bits) * 0x1p9f + 0x1p23f) - 0x1p23f;
    return sign | static_cast<uint8_t>(m);
  }
  // Normal: keep 3 of the 23 mantissa bits, to nearest even; a carry moves into the exponent.
  // (exponent << 3 | mantissa) then moves from fp32's bias (127) to e4m3's (7).
  const uint32_t rounded = (bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7E));  // < 448 stays below 0x7F
}

}  // namespace

uint8_t Fp32ToFp8E4M3(float x) { return ToE4M3(x); }

namespace {

// Every e4m3 code's value: 0x7F / 0xFF are NaN, biased exponent 0 is subnormal (m · 2^-9).
std::array<float, 256> MakeFp8E4M3Values() {
  std::array<float, 256> v{};
  for (int x = 0; x < 256; ++x) {
    const int biased = (x >> 3) & 0xF, m = x & 0x7;
    float a = biased == 0xF && m == 0x7 ? std::numeric_limits<float>::quiet_NaN()
              : biased == 0             ? std::ldexp(static_cast<float>(m), -9)
                            : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, biased - 7);
    v[x] = (x & 0x80) != 0 ? -a : a;
  }
  return v;
}

const std::array<float, 256> kFp8E4M3Values = MakeFp8E4M3Values();

}  // namespace

float Fp8E4M3ToFp32(uint8_t x) { return kFp8E4M3Values[x]; }

absl::Status QuantizeFp8E4M3(std::span<const float> in, std::span<uint8_t> out,
                             std::span<float> scales) {
  if (in.size() % kFp8GroupSize != 0) {
    return absl::InvalidArgumentError(
        StrCat("QuantizeFp8E4M3: ", in.size(), " values, not a multiple of ", kFp8GroupSize));
  }
  if (out.size() != in.size() || scales.size() != in.size() / kFp8GroupSize) {
    return absl::InvalidArgumentError(StrCat("QuantizeFp8E4M3: output sizes ", out.size(), "/",
                                             scales.size(), " do not fit ", in.size(), " values"));
  }
  for (size_t g = 0; g < scales.size(); ++g) {
    const std::span<const float> group = in.subspan(g * kFp8GroupSize, kFp8GroupSize);
    float max_abs = 0.0f;
    for (size_t i = 0; i < group.size(); ++i) {
      if (!std::isfinite(group[i])) {
        return absl::InvalidArgumentError(
            StrCat("QuantizeFp8E4M3: value ", g * kFp8GroupSize + i, " is not finite"));
      }
      max_abs = std::max(max_abs, std::fabs(group[i]));
    }
    const float scale = max_abs / kFp8E4M3Max;
    scales[g] = scale;
    for (size_t i = 0; i < group.size(); ++i) {
      // A zero scale (all-zero group, or values so small that max/448 underflows) encodes zeros.
      out[g * kFp8GroupSize + i] = scale > 0.0f ? ToE4M3(group[i] / scale) : 0;
    }
  }
  return absl::OkStatus();
}

void DequantizeFp8E4M3(std::span<const uint8_t> in, std::span<const float> scales,
                       std::span<float> out) {
  STRATA_CHECK(in.size() == out.size(), "DequantizeFp8E4M3: size mismatch");
  STRATA_CHECK(scales.size() * kFp8GroupSize == in.size(), "DequantizeFp8E4M3: scale count");
  for (size_t g = 0; g < scales.size(); ++g) {
    const float scale = scales[g];
    for (size_t i = g * kFp8GroupSize; i < (g + 1) * kFp8GroupSize; ++i) {
      out[i] = kFp8E4M3Values[in[i]] * scale;
    }
  }
}

}  // namespace strata
