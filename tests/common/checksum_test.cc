// Every compiled xxh3 variant this CPU runs gives the digest of the xxhash library itself (the
// reference), one-shot and streamed in ragged pieces, for sizes around every internal boundary.
#include "common/checksum.h"

#include <xxhash.h>  // the library's own XXH3_64bits: the reference

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

using checksum_internal::Kernels;

std::vector<const Kernels*> RunnableVariants() {
  __builtin_cpu_init();
  std::vector<const Kernels*> v = {&checksum_internal::Sse2Variant()};
  if (__builtin_cpu_supports("avx2")) v.push_back(&checksum_internal::Avx2Variant());
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    v.push_back(&checksum_internal::Avx512Variant());
  }
  return v;
}

std::string Pattern(size_t size) {
  std::string s(size, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (char& c : s) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

TEST(ChecksumVariantsTest, EveryVariantMatchesTheLibrary) {
  // 0-240 (short paths), the 1 KiB stripe and 16 KiB block edges, and payload sizes.
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 260; ++n) sizes.push_back(n);
  for (size_t edge : {1024u, 16384u, 65536u, 1u << 20}) {
    for (size_t d : {edge - 1, size_t{edge}, edge + 1, edge + 63}) sizes.push_back(d);
  }
  sizes.push_back((4u << 20) + 4097);
  const std::string data = Pattern(sizes.back());
  const auto variants = RunnableVariants();
  ASSERT_FALSE(variants.empty());
  for (const Kernels* k : variants) {
    SCOPED_TRACE(k->name);
    for (size_t n : sizes) {
      ASSERT_EQ(k->oneshot(data.data(), n), XXH3_64bits(data.data(), n)) << "size " << n;
    }
  }
}

TEST(ChecksumVariantsTest, StreamingInRaggedPiecesMatchesOneShot) {
  const std::string data = Pattern((3u << 20) + 12345);
  const uint64_t want = XXH3_64bits(data.data(), data.size());
  alignas(64) static char state[1024];
  ASSERT_LE(checksum_internal::StateBytes(), sizeof(state));
  for (const Kernels* k : RunnableVariants()) {
    SCOPED_TRACE(k->name);
    for (size_t piece : {size_t{1}, size_t{7}, size_t{1000}, size_t{65536}, size_t{262144}}) {
      k->reset(state);
      for (size_t off = 0; off < data.size(); off += piece) {
        k->update(state, data.data() + off, std::min(piece, data.size() - off));
        if (piece == 1 && off > 70000) {  // byte by byte is slow: finish in one piece
          k->update(state, data.data() + off + 1, data.size() - off - 1);
          break;
        }
      }
      EXPECT_EQ(k->digest(state), want) << "piece " << piece;
    }
  }
}

TEST(ChecksumVariantsTest, TheActiveVariantIsTheWidestTheCpuRuns) {
  if (std::getenv("STRATA_CHECKSUM_ISA") != nullptr) GTEST_SKIP() << "ISA capped by the env";
  EXPECT_STREQ(Checksum64Isa(), RunnableVariants().back()->name);
  const std::string data = Pattern(100000);
  EXPECT_EQ(Checksum64(data), XXH3_64bits(data.data(), data.size()));
}

}  // namespace
}  // namespace strata
