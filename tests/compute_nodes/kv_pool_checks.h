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

#include "common/block_format.h"
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

// fp8 payloads (block format v1's fp8 codec) against a reference built with the block format's
// own quantizer from bf16 pages: exports are those bytes exactly, per page and batched, from
// vectors and from the pool's host buffer; imports write bf16(e4m3 x scale) and k_pe as it was.
// The layout's latent dim must be a multiple of kFp8GroupSize.
inline void CheckFp8PageMoves(runtime::KvPool& pool, int n, uint32_t seed) {
  using runtime::PayloadDtype;
  const runtime::KvLayout& l = pool.layout();
  const int64_t codes = l.block_tokens * l.latent_dim, groups = codes / kFp8GroupSize;
  const int64_t kpe = l.block_tokens * l.rope_dim;
  const size_t bf16_layer = 2 * (codes + kpe), fp8_layer = codes + 4 * groups + 2 * kpe;
  ASSERT_EQ(pool.PayloadBytes(PayloadDtype::kFp8E4M3), l.num_layers * fp8_layer);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<int32_t> pages, back;
  for (int i = 0; i < 2 * n; ++i) {
    auto page = pool.Allocate();
    ASSERT_TRUE(page.ok()) << page.status();
    (i < n ? pages : back).push_back(*page);
  }
  // bf16 pages (one token row of layer 0 all zero: a zero scale), their fp8 reference, and what
  // importing that reference must give back.
  std::vector<std::vector<uint8_t>> bf16(n), fp8(n), restored(n);
  for (int i = 0; i < n; ++i) {
    bf16[i].resize(l.num_layers * bf16_layer);
    fp8[i].resize(l.num_layers * fp8_layer);
    restored[i].resize(bf16[i].size());
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      uint8_t* b = bf16[i].data() + layer * bf16_layer;
      uint8_t* f = fp8[i].data() + layer * fp8_layer;
      uint8_t* r = restored[i].data() + layer * bf16_layer;
      std::vector<float> latent(codes), scales(groups), back_latent(codes);
      for (int64_t k = 0; k < codes; ++k) {
        const float x = layer == 0 && k < l.latent_dim ? 0.f : dist(rng) * (1 + k % 7);
        const uint16_t h = model::FloatToBf16(x);
        std::memcpy(b + 2 * k, &h, 2);
        latent[k] = model::Bf16ToFloat(h);
      }
      for (int64_t k = 0; k < kpe; ++k) {
        const uint16_t h = model::FloatToBf16(dist(rng));
        std::memcpy(b + 2 * (codes + k), &h, 2);
      }
      ASSERT_TRUE(QuantizeFp8E4M3(latent, std::span<uint8_t>(f, codes), scales).ok());
      std::memcpy(f + codes, scales.data(), 4 * groups);
      std::memcpy(f + codes + 4 * groups, b + 2 * codes, 2 * kpe);
      DequantizeFp8E4M3(std::span<const uint8_t>(f, codes), scales, back_latent);
      for (int64_t k = 0; k < codes; ++k) {
        const uint16_t h = model::FloatToBf16(back_latent[k]);
        std::memcpy(r + 2 * k, &h, 2);
      }
      std::memcpy(r + 2 * codes, b + 2 * codes, 2 * kpe);
    }
  }
  std::vector<std::span<const uint8_t>> bf16_in(bf16.begin(), bf16.end());
  int64_t done = 0;
  ASSERT_TRUE(pool.ImportPages(pages, PayloadDtype::kBf16, bf16_in, &done).ok());

  std::vector<std::vector<uint8_t>> out;
  ASSERT_TRUE(pool.ExportPages(pages, PayloadDtype::kFp8E4M3, &out, &done).ok());
  EXPECT_EQ(done, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], fp8[i]) << "fp8 export, page " << i;
  std::vector<uint8_t> one;
  ASSERT_TRUE(pool.ExportPage(pages[n - 1], PayloadDtype::kFp8E4M3, &one).ok());
  EXPECT_EQ(one, fp8[n - 1]) << "fp8 export of one page";

  // Into and out of the pool's host buffer (in place on a device pool).
  const size_t bytes = pool.PayloadBytes(PayloadDtype::kFp8E4M3);
  absl::StatusOr<std::shared_ptr<HostBuffer>> buf = pool.AllocateHostBuffer(n * bytes);
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::memset((*buf)->data(), 0xee, n * bytes);
  std::vector<std::span<uint8_t>> outs;
  std::vector<std::span<const uint8_t>> ins;
  for (int i = 0; i < n; ++i) {
    outs.emplace_back((*buf)->data() + i * bytes, bytes);
    ins.emplace_back((*buf)->data() + i * bytes, bytes);
  }
  ASSERT_TRUE(pool.ExportPagesInto(pages, PayloadDtype::kFp8E4M3, outs, &done).ok());
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(std::equal(fp8[i].begin(), fp8[i].end(), outs[i].begin()))
        << "fp8 export into the buffer, page " << i;
  }
  ASSERT_TRUE(pool.ImportPages(back, PayloadDtype::kFp8E4M3, ins, &done).ok());
  EXPECT_EQ(done, n);
  ASSERT_TRUE(pool.ExportPages(back, PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], restored[i]) << "fp8 import, page " << i;
  // From ordinary vectors too, and a payload of the wrong size is refused.
  std::vector<std::span<const uint8_t>> fp8_in(fp8.begin(), fp8.end());
  ASSERT_TRUE(pool.ImportPages(back, PayloadDtype::kFp8E4M3, fp8_in, &done).ok());
  ASSERT_TRUE(pool.ExportPages(back, PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], restored[i]) << "fp8 import (vector), page " << i;
  EXPECT_FALSE(pool.ImportPage(back[0], PayloadDtype::kFp8E4M3, bf16[0]).ok());
  for (int32_t p : pages) pool.Free(p);
  for (int32_t p : back) pool.Free(p);
}

}  // namespace strata::testutil
