// Checks shared by the host and device KV pool tests: ImportPages / ExportPages move what the
// per-page calls move, across batch boundaries, and bad input moves nothing; payloads in the
// pool's own host buffers (AllocateHostBuffer: pinned memory the device pool's kernels read and
// write in place) move exactly like payloads in ordinary memory, alone or mixed with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/runtime/kv_pool.h"

namespace strata::testutil {

inline void CheckBatchedPageMoves(runtime::KvPool& pool, int n, uint32_t seed) {
  using runtime::PayloadDtype;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<int32_t> pages;
  for (int i = 0; i < n; ++i) {
    auto page = pool.Allocate();
    ASSERT_TRUE(page.ok()) << page.status();
    pages.push_back(*page);
  }
  std::shuffle(pages.begin(), pages.end(), rng);  // not in allocation order
  const size_t bytes = pool.PayloadBytes(PayloadDtype::kBf16);
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bytes));
  std::vector<std::span<const uint8_t>> spans;
  for (auto& p : in) {
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint16_t b = model::FloatToBf16(dist(rng));
      std::memcpy(p.data() + 2 * i, &b, 2);
    }
    spans.emplace_back(p);
  }
  int64_t done = -1;
  ASSERT_TRUE(pool.ImportPages(pages, PayloadDtype::kBf16, spans, &done).ok());
  EXPECT_EQ(done, n);
  std::vector<std::vector<uint8_t>> out;
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kBf16, &out, &done).ok());
  EXPECT_EQ(done, n);
  ASSERT_EQ(out.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], in[i]) << "page " << i << " of " << n;
    std::vector<uint8_t> one;
    ASSERT_TRUE(pool.ExportPage(pages[i], PayloadDtype::kBf16, &one).ok());
    EXPECT_EQ(one, in[i]) << "page " << i;
  }
  // fp32 payloads: the per-page widening, and back in through ImportPages.
  std::vector<std::vector<uint8_t>> wide;
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kF32, &wide, &done).ok());
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> one;
    ASSERT_TRUE(pool.ExportPage(pages[i], PayloadDtype::kF32, &one).ok());
    EXPECT_EQ(wide[i], one) << "page " << i;
  }
  std::vector<std::span<const uint8_t>> wide_spans(wide.begin(), wide.end());
  std::reverse(wide_spans.begin(), wide_spans.end());  // page i gets page n - 1 - i's values
  ASSERT_TRUE(pool.ImportPages(pages, PayloadDtype::kF32, wide_spans, &done).ok());
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], in[n - 1 - i]) << "page " << i;
  // Bad input is refused before anything moves.
  std::vector<std::span<const uint8_t>> bad = spans;
  bad.back() = bad.back().first(bytes - 2);
  EXPECT_FALSE(pool.ImportPages(pages, PayloadDtype::kBf16, bad, &done).ok());
  EXPECT_EQ(done, 0);
  std::vector<int32_t> bad_pages = pages;
  bad_pages.back() = static_cast<int32_t>(pool.num_pages());
  EXPECT_FALSE(pool.ImportPages(bad_pages, PayloadDtype::kBf16, spans, &done).ok());
  EXPECT_FALSE(pool.ExportPages(bad_pages, PayloadDtype::kBf16, &out, &done).ok());
  EXPECT_FALSE(
      pool.ImportPages(pages, PayloadDtype::kBf16, std::span(spans).first(n - 1), &done).ok());
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], in[n - 1 - i]) << "page " << i << " changed";
  ASSERT_TRUE(pool.ImportPages({}, PayloadDtype::kBf16, {}, &done).ok());
  EXPECT_EQ(done, 0);
  for (int32_t p : pages) pool.Free(p);
}

inline void CheckHostBufferPageMoves(runtime::KvPool& pool, int n, uint32_t seed) {
  using runtime::PayloadDtype;
  std::mt19937 rng(seed);
  std::vector<int32_t> pages;
  for (int i = 0; i < n; ++i) {
    auto page = pool.Allocate();
    ASSERT_TRUE(page.ok()) << page.status();
    pages.push_back(*page);
  }
  std::shuffle(pages.begin(), pages.end(), rng);
  const size_t bytes = pool.PayloadBytes(PayloadDtype::kBf16);
  // Payload i at offset i * bytes + 64 of one buffer (not at the buffer's start).
  absl::StatusOr<std::shared_ptr<HostBuffer>> buf = pool.AllocateHostBuffer(n * bytes + 64);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_GE((*buf)->size(), n * bytes + 64);
  std::uniform_int_distribution<int> bits(0, 0x7f7f);  // finite bf16 values of both signs
  std::vector<std::vector<uint8_t>> ref(n, std::vector<uint8_t>(bytes));
  std::vector<std::span<const uint8_t>> in_buffer, mixed;
  for (int i = 0; i < n; ++i) {
    for (size_t k = 0; k < bytes / 2; ++k) {
      const uint16_t b = static_cast<uint16_t>(bits(rng) | ((k & 1) << 15));
      std::memcpy(ref[i].data() + 2 * k, &b, 2);
    }
    uint8_t* at = (*buf)->data() + 64 + i * bytes;
    std::memcpy(at, ref[i].data(), bytes);
    in_buffer.emplace_back(at, bytes);
    mixed.push_back(i % 3 == 1 ? std::span<const uint8_t>(ref[i]) : in_buffer.back());
  }
  int64_t done = -1;
  ASSERT_TRUE(pool.ImportPages(pages, PayloadDtype::kBf16, in_buffer, &done).ok());
  EXPECT_EQ(done, n);
  std::vector<std::vector<uint8_t>> out;
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], ref[i]) << "import from the buffer, page " << i;

  // Export into the buffer (poisoned first), and into a mix of it and vectors.
  std::memset((*buf)->data(), 0xff, (*buf)->size());
  std::vector<std::span<uint8_t>> outs;
  std::vector<std::vector<uint8_t>> vec_outs(n, std::vector<uint8_t>(bytes, 0xff));
  for (int i = 0; i < n; ++i) {
    uint8_t* at = (*buf)->data() + 64 + i * bytes;
    outs.push_back(i % 3 == 2 ? std::span<uint8_t>(vec_outs[i]) : std::span<uint8_t>(at, bytes));
  }
  ASSERT_TRUE(pool.ExportPagesInto(pages, PayloadDtype::kBf16, outs, &done).ok());
  EXPECT_EQ(done, n);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(std::equal(outs[i].begin(), outs[i].end(), ref[i].begin()))
        << "export into " << (i % 3 == 2 ? "a vector" : "the buffer") << ", page " << i;
  }
  for (int k = 0; k < 64; ++k) EXPECT_EQ((*buf)->data()[k], 0xff) << "byte " << k << " written";

  // A mixed import of other values (page i gets payload n - 1 - i), read back per page.
  std::vector<std::span<const uint8_t>> reversed(mixed.rbegin(), mixed.rend());
  for (int i = 0; i < n; ++i) {  // the buffer's copies of the payloads, for the mixed spans
    std::memcpy((*buf)->data() + 64 + i * bytes, ref[i].data(), bytes);
  }
  ASSERT_TRUE(pool.ImportPages(pages, PayloadDtype::kBf16, reversed, &done).ok());
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> one;
    ASSERT_TRUE(pool.ExportPage(pages[i], PayloadDtype::kBf16, &one).ok());
    EXPECT_EQ(one, ref[n - 1 - i]) << "mixed import, page " << i;
  }
  // fp32 payloads in the buffer take the widening path.
  const size_t wide = pool.PayloadBytes(PayloadDtype::kF32);
  absl::StatusOr<std::shared_ptr<HostBuffer>> wbuf = pool.AllocateHostBuffer(wide);
  ASSERT_TRUE(wbuf.ok()) << wbuf.status();
  const std::span<uint8_t> wide_out[1] = {(*wbuf)->span().first(wide)};
  ASSERT_TRUE(
      pool.ExportPagesInto(std::span(pages).first(1), PayloadDtype::kF32, wide_out, &done).ok());
  std::vector<uint8_t> one;
  ASSERT_TRUE(pool.ExportPage(pages[0], PayloadDtype::kF32, &one).ok());
  EXPECT_TRUE(std::equal(one.begin(), one.end(), (*wbuf)->data()));
  for (int32_t p : pages) pool.Free(p);
}

}  // namespace strata::testutil
