// A check shared by the host and device KV pool tests: ImportPages / ExportPages move what the
// per-page calls move, across batch boundaries, and bad input moves nothing.
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

}  // namespace strata::testutil
