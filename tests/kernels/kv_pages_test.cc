// KV page gather/scatter against the block-format layout (PoolLayerToPayloadBf16 and the CPU fp8
// codec strata::QuantizeFp8E4M3 / Fp8E4M3ToFp32): bf16 and fp8, per-layer and page-major pools,
// layer ranges, payloads in device memory and in mapped pinned host memory, several block sizes
// (label gpu: SKIPPED without a GPU). Every compare is exact: the kernels move bits or apply the
// same IEEE operations as the CPU codec. Pages and layers not named must stay untouched.
#include "kernels/kv_pages/kv_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "common/block_format.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/small_kernels_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::ToBf16;

struct Geo {
  int block_tokens, num_layers, num_pages, num_blocks;
  bool page_major;
};

class KvPagesTest : public ::testing::TestWithParam<bool> {  // param: payload in host memory
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  // Payload buffers: device (poisoned) or mapped pinned host; returns the device-visible pointers.
  std::vector<uint8_t*> MakePayloads(int n, int64_t bytes) {
    std::vector<uint8_t*> ptrs(n);
    for (int i = 0; i < n; ++i) {
      void* p = nullptr;
      if (GetParam()) {
        EXPECT_EQ(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), cudaSuccess);
        std::memset(p, 0xff, bytes);
        host_.push_back(p);
        void* dev = nullptr;
        EXPECT_EQ(cudaHostGetDevicePointer(&dev, p, 0), cudaSuccess);
        ptrs[i] = static_cast<uint8_t*>(dev);
      } else {
        EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
        EXPECT_EQ(cudaMemset(p, 0xff, bytes), cudaSuccess);
        device_.push_back(p);
        ptrs[i] = static_cast<uint8_t*>(p);
      }
    }
    return ptrs;
  }
  void TearDown() override {
    for (void* p : host_) (void)cudaFreeHost(p);
    for (void* p : device_) (void)cudaFree(p);
  }
  std::vector<uint8_t> ReadPayload(uint8_t* ptr, int64_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDefault), cudaSuccess);
    return out;
  }
  void WritePayload(uint8_t* ptr, const std::vector<uint8_t>& bytes) {
    EXPECT_EQ(cudaMemcpy(ptr, bytes.data(), bytes.size(), cudaMemcpyDefault), cudaSuccess);
  }

  void RunCase(const Geo& g, KvPayloadCodec codec, int layer_begin, int layer_end);

  std::vector<void*> host_, device_;
};

void KvPagesTest::RunCase(const Geo& g, KvPayloadCodec codec, int layer_begin, int layer_end) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << g.block_tokens << " layers=" << g.num_layers
               << " codec=" << static_cast<int>(codec) << " range=[" << layer_begin << ","
               << layer_end << ") page_major=" << g.page_major << " host=" << GetParam());
  constexpr int R = 512, P = 64, kRow = R + P;
  KvPagesParams p;
  p.codec = codec;
  p.num_blocks = g.num_blocks;
  p.block_tokens = g.block_tokens;
  p.latent_dim = R;
  p.rope_dim = P;
  p.num_layers = g.num_layers;
  p.layer_begin = layer_begin;
  p.layer_end = layer_end;
  const int64_t page_elems = static_cast<int64_t>(g.block_tokens) * kRow;
  if (g.page_major) {
    p.page_stride = page_elems * g.num_layers;
    p.layer_stride = page_elems;
  } else {
    p.page_stride = page_elems;
    p.layer_stride = page_elems * g.num_pages;
  }
  const size_t pool_elems = static_cast<size_t>(page_elems) * g.num_layers * g.num_pages;
  const int64_t layer_bytes = KvPayloadLayerBytes(p), payload_bytes = KvPayloadBytes(p);

  std::vector<int32_t> perm(g.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  const std::vector<int32_t> pages(perm.begin(), perm.begin() + g.num_blocks);
  auto at = [&](int page, int layer) {
    return static_cast<size_t>(page) * p.page_stride + static_cast<size_t>(layer) * p.layer_stride;
  };

  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> pool(pool_elems);
  for (uint16_t& h : pool) h = ToBf16(normal(rng_) * 3.f);
  DeviceBuffer dpool(pool), dpages(pages);
  std::vector<uint8_t*> save_ptrs = MakePayloads(g.num_blocks, payload_bytes);
  DeviceBuffer dsave(save_ptrs);
  p.pool = dpool.get<__nv_bfloat16>();
  p.pages = dpages.get<int32_t>();
  p.payloads = dsave.get<uint8_t* const>();

  // ---- save: pages -> payload ----
  absl::Status st = LaunchKvPagesToPayload(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  int64_t mismatches = 0, poison_changed = 0;
  for (int b = 0; b < g.num_blocks; ++b) {
    const std::vector<uint8_t> got = ReadPayload(save_ptrs[b], payload_bytes);
    for (int l = 0; l < g.num_layers; ++l) {
      const uint8_t* lg = got.data() + l * layer_bytes;
      if (l < layer_begin || l >= layer_end) {
        for (int64_t i = 0; i < layer_bytes; ++i) poison_changed += lg[i] != 0xff;
        continue;
      }
      const uint16_t* rows = pool.data() + at(pages[b], l);
      std::vector<uint8_t> want(layer_bytes);
      if (codec == KvPayloadCodec::kBf16) {
        PoolLayerToPayloadBf16(rows, g.block_tokens, R, P,
                               reinterpret_cast<uint16_t*>(want.data()));
      } else {
        for (int t = 0; t < g.block_tokens; ++t) {
          std::vector<float> lat(R);
          for (int i = 0; i < R; ++i) lat[i] = FromBf16(rows[t * kRow + i]);
          std::vector<float> scales(R / 128);
          ASSERT_TRUE(
              QuantizeFp8E4M3(lat, std::span<uint8_t>(want.data() + t * R, R), scales).ok());
          std::memcpy(want.data() + g.block_tokens * R + t * (R / 128) * 4, scales.data(),
                      scales.size() * 4);
          std::memcpy(want.data() + g.block_tokens * (R + 4 * (R / 128)) + t * P * 2,
                      rows + t * kRow + R, P * 2);
        }
      }
      for (int64_t i = 0; i < layer_bytes; ++i) mismatches += lg[i] != want[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << "saved payload bytes differ from the block format";
  EXPECT_EQ(poison_changed, 0) << "layers outside the range were written";

  // ---- load: payload -> pages (fresh random payloads, valid codes for fp8) ----
  std::vector<std::vector<uint8_t>> payloads(g.num_blocks);
  std::vector<uint8_t*> load_ptrs = MakePayloads(g.num_blocks, payload_bytes);
  for (int b = 0; b < g.num_blocks; ++b) {
    payloads[b].resize(payload_bytes);
    for (int l = 0; l < g.num_layers; ++l) {
      uint8_t* lp = payloads[b].data() + l * layer_bytes;
      if (codec == KvPayloadCodec::kBf16) {
        auto* h = reinterpret_cast<uint16_t*>(lp);
        for (int64_t i = 0; i < layer_bytes / 2; ++i) h[i] = ToBf16(normal(rng_));
      } else {
        for (int t = 0; t < g.block_tokens; ++t) {
          std::vector<float> lat(R), scales(R / 128);
          for (float& x : lat) x = normal(rng_) * 5.f;
          ASSERT_TRUE(QuantizeFp8E4M3(lat, std::span<uint8_t>(lp + t * R, R), scales).ok());
          std::memcpy(lp + g.block_tokens * R + t * (R / 128) * 4, scales.data(),
                      scales.size() * 4);
          auto* pe =
              reinterpret_cast<uint16_t*>(lp + g.block_tokens * (R + 4 * (R / 128)) + t * P * 2);
          for (int i = 0; i < P; ++i) pe[i] = ToBf16(normal(rng_));
        }
      }
    }
    WritePayload(load_ptrs[b], payloads[b]);
  }
  DeviceBuffer dload(load_ptrs);
  p.payloads = dload.get<uint8_t* const>();
  st = LaunchKvPayloadToPages(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const auto got_pool = dpool.Download<uint16_t>();
  std::vector<uint16_t> want_pool = pool;
  for (int b = 0; b < g.num_blocks; ++b) {
    for (int l = layer_begin; l < layer_end; ++l) {
      const uint8_t* lp = payloads[b].data() + l * layer_bytes;
      uint16_t* rows = want_pool.data() + at(pages[b], l);
      for (int t = 0; t < g.block_tokens; ++t) {
        if (codec == KvPayloadCodec::kBf16) {
          std::memcpy(rows + t * kRow, lp + t * R * 2, R * 2);
          std::memcpy(rows + t * kRow + R, lp + g.block_tokens * R * 2 + t * P * 2, P * 2);
        } else {
          for (int i = 0; i < R; ++i) {
            float scale;
            std::memcpy(&scale, lp + g.block_tokens * R + (t * (R / 128) + i / 128) * 4, 4);
            rows[t * kRow + i] = ToBf16(Fp8E4M3ToFp32(lp[t * R + i]) * scale);
          }
          std::memcpy(rows + t * kRow + R, lp + g.block_tokens * (R + 4 * (R / 128)) + t * P * 2,
                      P * 2);
        }
      }
    }
  }
  int64_t pool_mismatch = 0;
  for (size_t i = 0; i < pool_elems; ++i) pool_mismatch += got_pool[i] != want_pool[i];
  EXPECT_EQ(pool_mismatch, 0) << "loaded pool differs (or untouched pages/layers changed)";
  std::printf(
      "kv_pages codec=%s B=%d layers=%d [%d,%d) blocks=%d page_major=%d host=%d: "
      "save mismatches=%lld load mismatches=%lld\n",
      codec == KvPayloadCodec::kBf16 ? "bf16" : "fp8", g.block_tokens, g.num_layers, layer_begin,
      layer_end, g.num_blocks, g.page_major, GetParam(), static_cast<long long>(mismatches),
      static_cast<long long>(pool_mismatch));
}

TEST_P(KvPagesTest, Bf16) {
  RunCase({64, 3, 11, 5, false}, KvPayloadCodec::kBf16, 0, 3);
  RunCase({64, 3, 11, 5, true}, KvPayloadCodec::kBf16, 1, 2);
  RunCase({16, 2, 7, 7, false}, KvPayloadCodec::kBf16, 0, 2);
  RunCase({1, 4, 5, 2, true}, KvPayloadCodec::kBf16, 2, 4);
}

TEST_P(KvPagesTest, Fp8) {
  RunCase({64, 3, 11, 5, false}, KvPayloadCodec::kFp8E4M3, 0, 3);
  RunCase({64, 2, 9, 3, true}, KvPayloadCodec::kFp8E4M3, 1, 2);
  RunCase({3, 2, 4, 4, false}, KvPayloadCodec::kFp8E4M3, 0, 2);
}

INSTANTIATE_TEST_SUITE_P(Payload, KvPagesTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "PinnedHost" : "Device"; });

}  // namespace
}  // namespace strata::kernels
