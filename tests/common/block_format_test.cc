#include "common/block_format.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/checksum.h"

namespace strata {
namespace {

Namespace TestNamespace() {
  ModelFingerprint model;
  for (size_t i = 0; i < model.bytes.size(); ++i) model.bytes[i] = static_cast<uint8_t>(i * 7);
  return MakeNamespace(model, KvFormat{}, "tenant-a");
}

std::vector<uint32_t> TestTokens(uint32_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = seed * 1000003u + i * 31u;
  return t;
}

std::vector<uint8_t> TestPayload(uint64_t n) {
  std::vector<uint8_t> p(n);
  std::mt19937 rng(42);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

// A valid small block: 2 layers, 16 tokens, with a key that really is its tokens' key.
struct Fixture {
  BlockLayout layout{.codec = KvCodec::kBf16, .n_layers = 2, .block_tokens = 16};
  Namespace ns = TestNamespace();
  BlockKey parent{};
  std::vector<uint32_t> tokens = TestTokens(16, 1);
  BlockKey key = ChainBlockKey(ns, parent, tokens);
  std::vector<uint8_t> payload = TestPayload(layout.PayloadBytes());
  std::vector<uint8_t> block;
  Fixture() { block = *EncodeBlock(layout, key, parent, ns, tokens, payload); }
};

TEST(BlockFormat, SizesMatchArchitecture) {
  BlockLayout bf16{.codec = KvCodec::kBf16, .n_layers = 61, .block_tokens = 64};
  BlockLayout fp8{.codec = KvCodec::kFp8E4M3, .n_layers = 61, .block_tokens = 64};
  EXPECT_EQ(bf16.BytesPerTokenPerLayer(), 1152u);
  EXPECT_EQ(fp8.BytesPerTokenPerLayer(), 656u);
  EXPECT_EQ(bf16.LayerBytes(), 1152u * 64);
  EXPECT_EQ(fp8.LayerBytes(), 656u * 64);
  EXPECT_EQ(bf16.PayloadBytes(), 1152u * 64 * 61);
  EXPECT_EQ(fp8.PayloadBytes(), 656u * 64 * 61);

  const KvFormat bf16_format{.codec = KvCodec::kBf16, .block_tokens = 64};
  const KvFormat fp8_format{.codec = KvCodec::kFp8E4M3, .block_tokens = 64};
  EXPECT_EQ(PayloadBytes(bf16_format, 61), 1152u * 64 * 61);
  EXPECT_EQ(PayloadBytes(fp8_format, 27), 656u * 64 * 27);
  EXPECT_EQ(LayerOffset(bf16_format, 0), 0u);
  EXPECT_EQ(LayerOffset(bf16_format, 3), 3u * 1152 * 64);
  EXPECT_EQ(LayerOffset(fp8_format, 5), 5u * 656 * 64);
  EXPECT_EQ(bf16.LayerOffset(61), bf16.PayloadBytes());

  // Within a layer: latent, (scales), k_pe, back to back, ending at LayerBytes().
  EXPECT_EQ(bf16.KpeOffset(), 64u * 512 * 2);
  EXPECT_EQ(bf16.KpeOffset() + 64u * 64 * 2, bf16.LayerBytes());
  EXPECT_EQ(fp8.ScalesOffset(), 64u * 512);
  EXPECT_EQ(fp8.KpeOffset(), 64u * 512 + 64u * 4 * 4);
  EXPECT_EQ(fp8.KpeOffset() + 64u * 64 * 2, fp8.LayerBytes());
  EXPECT_EQ(bf16.TotalBytes(), kBlockHeaderBytes + 4u * 64 + bf16.PayloadBytes());
}

TEST(BlockFormat, LayoutValidation) {
  BlockLayout ok{.codec = KvCodec::kFp8E4M3, .n_layers = 2, .block_tokens = 16};
  EXPECT_TRUE(ValidateBlockLayout(ok).ok());
  BlockLayout bad = ok;
  bad.kv_lora_rank = 100;  // not a multiple of 128 for fp8
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateBlockLayout(bad)));
  bad = ok;
  bad.n_layers = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateBlockLayout(bad)));
  bad = ok;
  bad.codec = static_cast<KvCodec>(9);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateBlockLayout(bad)));
}

TEST(BlockFormat, HeaderRoundTripAndExactBytes) {
  Fixture f;
  const BlockHeader h = MakeBlockHeader(f.layout, f.key, f.parent, f.ns, f.payload);
  const auto bytes = EncodeBlockHeader(h);
  ASSERT_EQ(bytes.size(), 112u);
  // Spot-check the documented layout (docs/block-format.md).
  EXPECT_EQ(std::memcmp(bytes.data(), "STKV", 4), 0);
  EXPECT_EQ(bytes[4], 1);  // version u16 LE
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[6], 1);  // codec bf16
  EXPECT_EQ(bytes[7], 0);
  EXPECT_EQ(bytes[8], 2);    // n_layers
  EXPECT_EQ(bytes[12], 16);  // block tokens
  EXPECT_EQ(bytes[16], 0x00);
  EXPECT_EQ(bytes[17], 0x02);  // 512 LE
  EXPECT_EQ(bytes[20], 64);
  EXPECT_EQ(std::memcmp(bytes.data() + 24, f.key.bytes.data(), 16), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 56, f.ns.bytes.data(), 32), 0);
  uint64_t payload_bytes = 0;
  for (int i = 7; i >= 0; --i) payload_bytes = (payload_bytes << 8) | bytes[88 + i];
  EXPECT_EQ(payload_bytes, f.payload.size());
  uint64_t header_sum = 0;
  for (int i = 7; i >= 0; --i) header_sum = (header_sum << 8) | bytes[104 + i];
  EXPECT_EQ(header_sum, Checksum64(bytes.data(), 104));

  auto parsed = ParseBlockHeader(std::span<const uint8_t>(bytes));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->version, 1);
  EXPECT_EQ(parsed->layout.codec, KvCodec::kBf16);
  EXPECT_EQ(parsed->layout.n_layers, 2u);
  EXPECT_EQ(parsed->layout.block_tokens, 16u);
  EXPECT_EQ(parsed->layout.kv_lora_rank, 512u);
  EXPECT_EQ(parsed->layout.rope_dim, 64u);
  EXPECT_EQ(parsed->key, f.key);
  EXPECT_EQ(parsed->parent, f.parent);
  EXPECT_EQ(parsed->ns, f.ns);
  EXPECT_EQ(parsed->payload_bytes, f.payload.size());
  EXPECT_EQ(parsed->payload_checksum, Checksum64(f.payload.data(), f.payload.size()));

  // The string_view overload reads the same bytes.
  auto from_string =
      ParseBlockHeader(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  ASSERT_TRUE(from_string.ok());
  EXPECT_EQ(from_string->key, f.key);
}

TEST(BlockFormat, EveryHeaderByteFlipIsDetected) {
  Fixture f;
  const auto good = EncodeBlockHeader(MakeBlockHeader(f.layout, f.key, f.parent, f.ns, f.payload));
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x10;
    const auto parsed = ParseBlockHeader(std::span<const uint8_t>(bad));
    EXPECT_FALSE(parsed.ok()) << "flip at byte " << i << " went unnoticed";
    // The version field names an unknown version; everything else is data loss.
    if (i == 4 || i == 5) {
      EXPECT_TRUE(absl::IsUnimplemented(parsed.status())) << parsed.status();
    } else {
      EXPECT_TRUE(absl::IsDataLoss(parsed.status())) << i << ": " << parsed.status();
    }
  }
}

TEST(BlockFormat, HeaderErrorsAreSpecific) {
  Fixture f;
  BlockHeader h = MakeBlockHeader(f.layout, f.key, f.parent, f.ns, f.payload);

  auto bytes = EncodeBlockHeader(h);
  bytes[0] = 'X';
  auto s = ParseBlockHeader(std::span<const uint8_t>(bytes)).status();
  EXPECT_TRUE(absl::IsDataLoss(s));
  EXPECT_NE(s.message().find("magic"), absl::string_view::npos) << s;

  BlockHeader v2 = h;
  v2.version = 2;
  s = ParseBlockHeader(std::span<const uint8_t>(EncodeBlockHeader(v2))).status();
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_NE(s.message().find("version 2"), absl::string_view::npos) << s;

  // A well-formed header (valid checksum) with an unknown codec.
  BlockHeader codec = h;
  codec.layout.codec = static_cast<KvCodec>(7);
  s = ParseBlockHeader(std::span<const uint8_t>(EncodeBlockHeader(codec))).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("codec"), absl::string_view::npos) << s;

  // Payload size that disagrees with the geometry.
  BlockHeader size = h;
  size.payload_bytes += 1;
  s = ParseBlockHeader(std::span<const uint8_t>(EncodeBlockHeader(size))).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
}

TEST(BlockFormat, TruncatedBuffersAreRefused) {
  Fixture f;
  for (size_t n : {size_t{0}, size_t{4}, size_t{111}}) {
    EXPECT_TRUE(
        absl::IsDataLoss(ParseBlockHeader(std::span<const uint8_t>(f.block.data(), n)).status()))
        << n;
  }
  // Header intact, block cut anywhere after it (in the tokens, in the payload, one byte short).
  for (size_t n : {size_t{112}, size_t{130}, size_t{112 + 64 + 100}, f.block.size() - 1}) {
    auto view = ParseBlock(std::span<const uint8_t>(f.block.data(), n));
    EXPECT_TRUE(absl::IsDataLoss(view.status())) << n << ": " << view.status();
  }
  // Trailing garbage is refused too.
  std::vector<uint8_t> longer = f.block;
  longer.push_back(0);
  EXPECT_TRUE(absl::IsDataLoss(ParseBlock(longer).status()));
  EXPECT_TRUE(absl::IsDataLoss(
      DecodeBlockTokens(std::span<const uint8_t>(f.block.data(), 63), 16).status()));
}

TEST(BlockFormat, WholeBlockRoundTripVerifies) {
  Fixture f;
  ASSERT_EQ(f.block.size(), f.layout.TotalBytes());
  auto view = ParseBlock(f.block);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->tokens, f.tokens);
  ASSERT_EQ(view->payload.size(), f.payload.size());
  EXPECT_TRUE(std::equal(view->payload.begin(), view->payload.end(), f.payload.begin()));
  EXPECT_TRUE(VerifyBlock(view->header, view->tokens, view->payload, f.key, f.tokens).ok());
  // Layer 1 starts where the layout says.
  EXPECT_EQ(view->payload[f.layout.LayerOffset(1)], f.payload[f.layout.LayerOffset(1)]);
}

TEST(BlockFormat, CorruptPayloadIsDataLoss) {
  Fixture f;
  for (size_t at : {size_t{0}, f.payload.size() / 2, f.payload.size() - 1}) {
    std::vector<uint8_t> block = f.block;
    block[f.layout.PayloadOffsetInBlock() + at] ^= 0x01;
    auto view = ParseBlock(block);
    ASSERT_TRUE(view.ok());  // the header does not cover the payload bytes
    const absl::Status s = VerifyBlock(view->header, view->tokens, view->payload, f.key, f.tokens);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_FALSE(IsBlockIdentityMismatch(s));
  }
  auto view = ParseBlock(f.block);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(absl::IsDataLoss(
      VerifyBlock(view->header, view->tokens, view->payload.first(10), f.key, f.tokens)));
}

TEST(BlockFormat, CorruptTokensAreAMiss) {
  Fixture f;
  std::vector<uint8_t> block = f.block;
  block[kBlockHeaderBytes + 4 * 3] ^= 0x01;  // token 3
  auto view = ParseBlock(block);
  ASSERT_TRUE(view.ok());
  const absl::Status s = VerifyBlock(view->header, view->tokens, view->payload, f.key, f.tokens);
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;
}

TEST(BlockFormat, WrongKeyOrTokensOrForgedKeyIsAMiss) {
  Fixture f;
  auto view = ParseBlock(f.block);
  ASSERT_TRUE(view.ok());

  // Asked for another key (e.g. a collision in the index).
  BlockKey other = f.key;
  other.bytes[0] ^= 1;
  absl::Status s = VerifyBlock(view->header, view->tokens, view->payload, other, f.tokens);
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;

  // Same key, but the caller's tokens differ (a 128-bit key collision).
  std::vector<uint32_t> other_tokens = f.tokens;
  other_tokens.back() += 1;
  s = VerifyBlock(view->header, view->tokens, view->payload, f.key, other_tokens);
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;
  s = VerifyBlock(view->header, view->tokens, view->payload, f.key,
                  std::span<const uint32_t>(f.tokens).first(15));
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;

  // A forged block: consistent checksums, claims key k for tokens whose real key is not k.
  const std::vector<uint32_t> forged_tokens = TestTokens(16, 2);
  auto forged = EncodeBlock(f.layout, f.key, f.parent, f.ns, forged_tokens, f.payload);
  ASSERT_TRUE(forged.ok());
  auto fview = ParseBlock(*forged);
  ASSERT_TRUE(fview.ok());
  // Even a caller that expects exactly those tokens does not accept it.
  s = VerifyBlock(fview->header, fview->tokens, fview->payload, f.key, forged_tokens);
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;
  // Nor a block whose parent was swapped.
  BlockKey parent = f.parent;
  parent.bytes[5] = 9;
  auto reparented = EncodeBlock(f.layout, f.key, parent, f.ns, f.tokens, f.payload);
  ASSERT_TRUE(reparented.ok());
  auto rview = ParseBlock(*reparented);
  ASSERT_TRUE(rview.ok());
  s = VerifyBlock(rview->header, rview->tokens, rview->payload, f.key, f.tokens);
  EXPECT_TRUE(IsBlockIdentityMismatch(s)) << s;
}

// VerifyBlockIdentity is VerifyBlock less the payload's hash (for bytes checked in transit).
TEST(BlockFormat, TheIdentityCheckSkipsOnlyThePayloadHash) {
  Fixture f;
  std::vector<uint8_t> flipped = f.block;
  flipped[f.layout.PayloadOffsetInBlock() + 7] ^= 0x10;
  auto view = ParseBlock(flipped);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(VerifyBlockIdentity(view->header, view->tokens, view->payload, f.key, f.tokens).ok());
  EXPECT_TRUE(
      absl::IsDataLoss(VerifyBlock(view->header, view->tokens, view->payload, f.key, f.tokens)));
  EXPECT_TRUE(absl::IsDataLoss(
      VerifyBlockIdentity(view->header, view->tokens, view->payload.first(10), f.key, f.tokens)));

  std::vector<uint8_t> bad_token = f.block;
  bad_token[kBlockHeaderBytes + 4 * 5] ^= 0x01;
  auto tview = ParseBlock(bad_token);
  ASSERT_TRUE(tview.ok());
  EXPECT_TRUE(IsBlockIdentityMismatch(
      VerifyBlockIdentity(tview->header, tview->tokens, tview->payload, f.key, f.tokens)));
  BlockKey other = f.key;
  other.bytes[3] ^= 1;
  auto good = ParseBlock(f.block);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(IsBlockIdentityMismatch(
      VerifyBlockIdentity(good->header, good->tokens, good->payload, other, f.tokens)));
  const std::vector<uint32_t> forged_tokens = TestTokens(16, 3);
  auto forged = EncodeBlock(f.layout, f.key, f.parent, f.ns, forged_tokens, f.payload);
  ASSERT_TRUE(forged.ok());
  auto fview = ParseBlock(*forged);
  ASSERT_TRUE(fview.ok());
  EXPECT_TRUE(IsBlockIdentityMismatch(
      VerifyBlockIdentity(fview->header, fview->tokens, fview->payload, f.key, forged_tokens)));
}

TEST(BlockFormat, EncodeBlockRefusesMismatchedInputs) {
  Fixture f;
  EXPECT_TRUE(absl::IsInvalidArgument(
      EncodeBlock(f.layout, f.key, f.parent, f.ns, TestTokens(15, 1), f.payload).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      EncodeBlock(f.layout, f.key, f.parent, f.ns, f.tokens,
                  std::span<const uint8_t>(f.payload).first(f.payload.size() - 1))
          .status()));
}

// ---- numerics ----

TEST(Bf16, RoundTripIsExactForRepresentableValues) {
  // Every bf16 bit pattern that is not NaN survives bf16 -> fp32 -> bf16 unchanged.
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = Bf16ToFp32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(f))));
      continue;
    }
    ASSERT_EQ(Fp32ToBf16(f), b) << std::hex << b;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f), Fp32ToBf16(1.0f));
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above the halfway point rounds up.
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isinf(Bf16ToFp32(Fp32ToBf16(3.4e38f))));  // rounds past the largest bf16
  // Relative error bound 2^-8 on random values.
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> in(4096), out(4096);
  std::vector<uint16_t> packed(4096);
  for (auto& x : in) x = dist(rng);
  Fp32ToBf16(in, packed);
  Bf16ToFp32(packed, out);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_LE(std::fabs(out[i] - in[i]), std::fabs(in[i]) * 0x1p-8f) << in[i];
  }
}

TEST(Fp8E4M3, EncodingsMatchTheStandard) {
  EXPECT_EQ(Fp32ToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(Fp32ToFp8E4M3(-0.0f), 0x80);
  EXPECT_EQ(Fp32ToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(Fp32ToFp8E4M3(-2.0f), 0xC0);
  EXPECT_EQ(Fp32ToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(Fp32ToFp8E4M3(1e9f), 0x7E);  // saturates
  EXPECT_EQ(Fp32ToFp8E4M3(-1e9f), 0xFE);
  EXPECT_EQ(Fp32ToFp8E4M3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(Fp32ToFp8E4M3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(Fp32ToFp8E4M3(std::nanf("")), 0x7F);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFp32(0x7F)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFp32(0xFF)));
  EXPECT_EQ(Fp8E4M3ToFp32(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFp32(0x01), 0x1p-9f);
  // Ties to even: 1.0625 is halfway between 1 (m=0) and 1.125 (m=1).
  EXPECT_EQ(Fp32ToFp8E4M3(1.0625f), 0x38);
  EXPECT_EQ(Fp32ToFp8E4M3(1.1875f), 0x3A);  // halfway between m=1 and m=2: even is 2
  // Every finite code round-trips exactly.
  for (uint32_t c = 0; c <= 0xFF; ++c) {
    const float f = Fp8E4M3ToFp32(static_cast<uint8_t>(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(Fp32ToFp8E4M3(f), c) << std::hex << c;
  }
}

// The straightforward e4m3 codec (frexp / ldexp, nearbyint), against which the bit-level one in
// block_format.cc is checked.
uint8_t ReferenceToE4M3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  int e = 0;
  const float f = std::frexp(a, &e);
  int m = static_cast<int>(std::nearbyint((std::ldexp(f, 1) - 1.0f) * 8.0f));
  int biased = e - 1 + 7;
  if (m == 8) {
    m = 0;
    ++biased;
  }
  return sign | static_cast<uint8_t>(std::min((biased << 3) | m, 0x7E));
}

float ReferenceFromE4M3(uint8_t x) {
  const int biased = (x >> 3) & 0xF, m = x & 0x7;
  if (biased == 0xF && m == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float v = biased == 0 ? std::ldexp(static_cast<float>(m), -9)
                              : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, biased - 7);
  return (x & 0x80) != 0 ? -v : v;
}

TEST(Fp8E4M3, TheCodecIsTheStraightforwardOneBitForBit) {
  for (int x = 0; x < 256; ++x) {
    const float want = ReferenceFromE4M3(static_cast<uint8_t>(x)), got = Fp8E4M3ToFp32(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << x;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << x;
    }
  }
  auto check = [](uint32_t bits) {
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(Fp32ToFp8E4M3(x), ReferenceToE4M3(x)) << std::hex << "bits 0x" << bits;
  };
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {  // every bf16 value, and its neighbours
    check(hi << 16);
    check((hi << 16) | 0x8000);  // ties of the bf16 grid
    check((hi << 16) | 0x7FFF);
  }
  // Every rounding boundary of the normal range: the halfway points and either side of them.
  for (uint32_t code = 0x08; code < 0x7E; ++code) {
    const uint32_t mid = ((code + ((127u - 7u) << 3)) << 20) | 0x80000u;
    for (uint32_t d : {0u, 1u, 2u}) {
      check(mid + d);
      check(mid - d);
      check((mid + d) | 0x80000000u);
    }
  }
  std::mt19937 rng(9);
  for (int i = 0; i < 2000000; ++i) check(static_cast<uint32_t>(rng()));
}

TEST(Fp8E4M3, BlockScaledErrorIsBounded) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr size_t kN = 512 * 8;  // eight tokens of latent
  std::vector<float> in(kN), out(kN), scales(kN / kFp8GroupSize);
  std::vector<uint8_t> q(kN);
  for (size_t i = 0; i < kN; ++i) {
    // Groups of very different magnitudes, to exercise the per-group scale.
    in[i] = dist(rng) * std::ldexp(1.0f, static_cast<int>(i / kFp8GroupSize) % 9 - 4);
  }
  // One all-zero group.
  std::fill(in.begin() + 5 * kFp8GroupSize, in.begin() + 6 * kFp8GroupSize, 0.0f);
  ASSERT_TRUE(QuantizeFp8E4M3(in, q, scales).ok());
  DequantizeFp8E4M3(q, scales, out);
  EXPECT_EQ(scales[5], 0.0f);
  for (size_t g = 0; g < scales.size(); ++g) {
    float max_abs = 0.0f;
    for (size_t i = 0; i < kFp8GroupSize; ++i) {
      max_abs = std::max(max_abs, std::fabs(in[g * kFp8GroupSize + i]));
    }
    EXPECT_FLOAT_EQ(scales[g], max_abs / 448.0f);
    for (size_t i = g * kFp8GroupSize; i < (g + 1) * kFp8GroupSize; ++i) {
      // 3 mantissa bits: relative error <= 2^-4 for normals; subnormal spacing 2^-9 · scale.
      const float bound = std::max(std::fabs(in[i]) * 0x1p-4f, scales[g] * 0x1p-10f) * 1.001f;
      EXPECT_LE(std::fabs(out[i] - in[i]), bound) << "i=" << i << " x=" << in[i];
    }
    // The group maximum is represented exactly up to the fp32 rounding of the scale.
    size_t arg = g * kFp8GroupSize;
    for (size_t i = arg; i < (g + 1) * kFp8GroupSize; ++i) {
      if (std::fabs(in[i]) > std::fabs(in[arg])) arg = i;
    }
    EXPECT_NEAR(out[arg], in[arg], std::fabs(in[arg]) * 1e-6f);
  }
}

TEST(Fp8E4M3, QuantizeRefusesBadInput) {
  std::vector<float> in(kFp8GroupSize, 1.0f), scales(1);
  std::vector<uint8_t> q(kFp8GroupSize);
  EXPECT_TRUE(QuantizeFp8E4M3(in, q, scales).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(QuantizeFp8E4M3(std::span<const float>(in).first(100),
                                                      std::span<uint8_t>(q).first(100), scales)));
  std::vector<float> two_scales(2);
  EXPECT_TRUE(absl::IsInvalidArgument(QuantizeFp8E4M3(in, q, two_scales)));
  in[17] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(absl::IsInvalidArgument(QuantizeFp8E4M3(in, q, scales)));
  in[17] = std::nanf("");
  EXPECT_TRUE(absl::IsInvalidArgument(QuantizeFp8E4M3(in, q, scales)));
}

}  // namespace
}  // namespace strata
