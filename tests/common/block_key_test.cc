#include "common/block_key.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/checksum.h"
#include "common/hex.h"
#include "common/sha256.h"

namespace strata {
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("STRATA_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// The ```json block of docs/block-keys.md.
nlohmann::json LoadPublishedVectors() {
  const std::string path = SourceDir() + "/docs/block-keys.md";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const size_t start = doc.find("```json\n");
  EXPECT_NE(start, std::string::npos) << "no ```json block in " << path;
  const size_t end = doc.find("\n```", start + 8);
  return nlohmann::json::parse(doc.substr(start + 8, end - start - 8));
}

std::vector<uint32_t> GenerateTokens(const nlohmann::json& spec) {
  const uint64_t count = spec.at("count");
  const uint64_t mul = spec.value("mul", uint64_t{1});
  const uint64_t mod = spec.value("mod", uint64_t{1} << 32);
  std::vector<uint32_t> tokens(count);
  for (uint64_t i = 0; i < count; ++i) tokens[i] = static_cast<uint32_t>((i * mul) % mod);
  if (spec.contains("set")) {
    for (const auto& [index, value] : spec["set"].items()) {
      tokens.at(std::stoul(index)) = value.get<uint32_t>();
    }
  }
  return tokens;
}

TEST(Sha256Test, MatchesFips180Vectors) {
  EXPECT_EQ(HexEncode(Sha256::Hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexEncode(Sha256::Hash("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.Update("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
  EXPECT_EQ(HexEncode(h.Final()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(BlockKeyTest, PublishedVectors) {
  const nlohmann::json vectors = LoadPublishedVectors();
  ASSERT_GE(vectors.size(), 5u);
  for (const auto& v : vectors) {
    SCOPED_TRACE(v.at("name").get<std::string>());
    auto fingerprint = ParseNamespace(v.at("model_fingerprint").get<std::string>());
    ASSERT_TRUE(fingerprint.ok()) << fingerprint.status();
    auto codec = ParseKvCodec(v.at("codec").get<std::string>());
    ASSERT_TRUE(codec.ok());
    KvFormat format{.codec = *codec, .block_tokens = v.at("block_tokens").get<uint32_t>()};
    ASSERT_TRUE(ValidateKvFormat(format).ok());
    ModelFingerprint model{fingerprint->bytes};
    const Namespace ns = MakeNamespace(model, format, v.at("tenant_salt").get<std::string>());
    EXPECT_EQ(ns.Hex(), v.at("namespace").get<std::string>());

    const std::vector<uint32_t> tokens = GenerateTokens(v.at("tokens"));
    const std::vector<BlockKey> keys = ComputeBlockKeys(ns, tokens, format.block_tokens);
    const auto& expected = v.at("keys");
    ASSERT_EQ(keys.size(), expected.size());
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(keys[i].Hex(), expected[i]) << "key " << i;
  }
}

TEST(BlockKeyTest, KeyCoversWholePrefix) {
  const Namespace ns = MakeNamespace({}, {}, "");
  std::vector<uint32_t> a(256), b(256);
  for (uint32_t i = 0; i < 256; ++i) a[i] = b[i] = i;
  b[3] = 99999;  // differs in the first block only
  const auto ka = ComputeBlockKeys(ns, a), kb = ComputeBlockKeys(ns, b);
  ASSERT_EQ(ka.size(), 4u);
  for (size_t i = 0; i < ka.size(); ++i) EXPECT_NE(ka[i], kb[i]) << "block " << i;
  // Same tokens in block 3 but a different history: different key.
  EXPECT_NE(ChainBlockKey(ns, ka[2], std::span(a).subspan(192, 64)),
            ChainBlockKey(ns, kb[2], std::span(a).subspan(192, 64)));
  EXPECT_EQ(ChainBlockKey(ns, ka[2], std::span(a).subspan(192, 64)), ka[3]);
}

TEST(BlockKeyTest, PartialBlockHasNoKey) {
  const Namespace ns = MakeNamespace({}, {}, "");
  std::vector<uint32_t> tokens(63, 7);
  EXPECT_TRUE(ComputeBlockKeys(ns, tokens).empty());
  tokens.resize(130, 7);
  EXPECT_EQ(ComputeBlockKeys(ns, tokens).size(), 2u);
}

TEST(BlockKeyTest, NamespaceSeparatesTenantsFormatsAndModels) {
  ModelFingerprint m1{}, m2{};
  m2.bytes[31] = 1;
  const KvFormat bf16{}, fp8{.codec = KvCodec::kFp8E4M3}, b128{.block_tokens = 128};
  const Namespace base = MakeNamespace(m1, bf16, "");
  EXPECT_NE(base, MakeNamespace(m1, bf16, "tenant-a"));
  EXPECT_NE(MakeNamespace(m1, bf16, "tenant-a"), MakeNamespace(m1, bf16, "tenant-b"));
  EXPECT_NE(base, MakeNamespace(m1, fp8, ""));
  EXPECT_NE(base, MakeNamespace(m1, b128, ""));
  EXPECT_NE(base, MakeNamespace(m2, bf16, ""));
  EXPECT_EQ(base, MakeNamespace(m1, bf16, ""));
}

TEST(BlockKeyTest, ValidatesFormatAndParsesHex) {
  EXPECT_FALSE(ValidateKvFormat({.block_tokens = 8}).ok());
  EXPECT_FALSE(ValidateKvFormat({.block_tokens = 48}).ok());
  EXPECT_TRUE(ValidateKvFormat({.block_tokens = 16}).ok());
  EXPECT_FALSE(ValidateKvFormat({.layout_version = 2}).ok());
  EXPECT_FALSE(ParseKvCodec("int4").ok());
  EXPECT_EQ(ParseBlockKey("00").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseBlockKey(std::string(31, '0') + "g").ok());
  auto key = ParseBlockKey("09A397DE55797467B802C14C9B6BC724");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->Hex(), "09a397de55797467b802c14c9b6bc724");
  // Raw bytes (a proto `bytes` field) round-trip through View(); any other length is refused.
  EXPECT_EQ(BlockKey::FromBytes(key->View()), *key);
  EXPECT_FALSE(BlockKey::FromBytes(key->View().substr(1)).has_value());
  EXPECT_FALSE(BlockKey::FromBytes(std::string(17, 'x')).has_value());
  EXPECT_FALSE(Namespace::FromBytes(key->View()).has_value());
}

TEST(ChecksumTest, StreamingEqualsOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  Checksum64Stream stream;
  for (size_t off = 0; off < data.size(); off += 4096) {
    stream.Update(data.data() + off, std::min<size_t>(4096, data.size() - off));
  }
  EXPECT_EQ(stream.Digest(), Checksum64(data));
  data[500] ^= 1;
  EXPECT_NE(stream.Digest(), Checksum64(data));
}

TEST(ChecksumTest, CopyAndChecksumCopiesAndEqualsOneShot) {
  std::string src((1 << 20) + 4097, '\0');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + (i >> 12));
  // Below, at and around the copy piece (64 KiB), and many pieces with a ragged tail.
  for (size_t size :
       {size_t{0}, size_t{1}, size_t{65535}, size_t{65536}, size_t{65537}, src.size()}) {
    std::string dst(size, '\x5a');
    EXPECT_EQ(CopyAndChecksum64(dst.data(), src.data(), size), Checksum64(src.data(), size))
        << size;
    EXPECT_EQ(dst, src.substr(0, size)) << size;
  }
}

}  // namespace
}  // namespace strata
