// The merge + W_UV projection kernel of few-row MLA decode (kernels/mla_decode/combine_project.h)
// against a double-precision CPU reference, on fresh random partials (label gpu: SKIPPED without
// a GPU). The output is poisoned with NaN before the launch; partial rows the kernel must not read
// (splits of weight 0, heads past num_heads) hold NaN; one row has no tokens at all (every split
// empty) and must come out as zeros.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/mla_decode/combine_project.h"
#include "kernels/mla_decode/mla_decode.h"
#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels {
namespace {

using testing::FromBf16;
using testing::HaveGpu;
using testing::RoundBf16;
using testing::ToBf16;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int kV = kMlaValueDim;

struct Case {
  int batch, num_heads, num_heads_q, num_splits, v_dim;
};

// A device copy of `v` (freed by the caller).
template <typename T>
T* ToDevice(const std::vector<T>& v) {
  void* d = nullptr;
  if (cudaMalloc(&d, v.size() * sizeof(T)) != cudaSuccess) return nullptr;
  if (cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) {
    return nullptr;
  }
  return static_cast<T*>(d);
}

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "batch=" << c.batch << " heads=" << c.num_heads << "/" << c.num_heads_q
               << " splits=" << c.num_splits << " v_dim=" << c.v_dim << " seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int ns = c.num_splits, hq = c.num_heads_q;
  // Partials: split s of (b, h) at row (b ns + s) hq + h. With one split the bf16 rows instead.
  const size_t rows = static_cast<size_t>(c.batch) * ns * hq;
  std::vector<float> o_accum(rows * kV, nan), lse_accum(rows, nan);
  std::vector<uint16_t> o_lat(static_cast<size_t>(c.batch) * hq * kV, ToBf16(nan));
  std::vector<float> merged(static_cast<size_t>(c.batch) * c.num_heads * kV, 0.f);  // reference
  const int empty_row = c.batch - 1;  // this batch row has no tokens
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.num_heads; ++h) {
      float* m = &merged[(static_cast<size_t>(b) * c.num_heads + h) * kV];
      if (ns == 1) {
        for (int d = 0; d < kV; ++d) {
          const uint16_t x = b == empty_row ? ToBf16(0.f) : ToBf16(normal(rng));
          o_lat[(static_cast<size_t>(b) * hq + h) * kV + d] = x;
          m[d] = FromBf16(x);
        }
        continue;
      }
      // Some splits empty (lse -inf, NaN partial: must not be read), the others weighted.
      std::vector<double> lse(ns, -INFINITY);
      double mx = -INFINITY;
      for (int s = 0; s < ns; ++s) {
        if (b == empty_row || (s % 5 == 3)) continue;
        lse[s] = 4.0 * normal(rng);
        mx = std::max(mx, lse[s]);
      }
      double total = 0;
      for (int s = 0; s < ns; ++s) total += lse[s] == -INFINITY ? 0.0 : std::exp(lse[s] - mx);
      const double lse_all = total > 0 ? mx + std::log(total) : -INFINITY;
      std::vector<double> acc(kV, 0.0);
      for (int s = 0; s < ns; ++s) {
        const size_t row = (static_cast<size_t>(b) * ns + s) * hq + h;
        lse_accum[row] = static_cast<float>(lse[s]);
        if (lse[s] == -INFINITY) continue;
        const double w = std::exp(static_cast<double>(lse_accum[row]) - lse_all);
        for (int d = 0; d < kV; ++d) {
          o_accum[row * kV + d] = normal(rng);
          acc[d] += w * o_accum[row * kV + d];
        }
      }
      for (int d = 0; d < kV; ++d) m[d] = RoundBf16(static_cast<float>(acc[d]));
    }
  }
  const int64_t head_stride = static_cast<int64_t>(c.v_dim + 64) * kV;  // W_UK rows between
  std::vector<uint16_t> w(static_cast<size_t>(c.num_heads) * head_stride, ToBf16(nan));
  for (int h = 0; h < c.num_heads; ++h) {
    for (int64_t i = 0; i < static_cast<int64_t>(c.v_dim) * kV; ++i) {
      w[h * head_stride + i] = ToBf16(normal(rng) * 0.05f);
    }
  }
  const int64_t ld_out = static_cast<int64_t>(c.num_heads) * c.v_dim + 8;
  std::vector<uint16_t> out(static_cast<size_t>(c.batch) * ld_out, ToBf16(nan));

  float* d_o = ToDevice(o_accum);
  float* d_lse = ToDevice(lse_accum);
  uint16_t* d_lat = ToDevice(o_lat);
  uint16_t* d_w = ToDevice(w);
  uint16_t* d_out = ToDevice(out);
  ASSERT_TRUE(d_o && d_lse && d_lat && d_w && d_out);
  MlaCombineProjectParams p;
  p.batch = c.batch;
  p.num_heads = c.num_heads;
  p.num_heads_q = hq;
  p.num_splits = ns;
  p.v_dim = c.v_dim;
  p.o_accum = ns > 1 ? d_o : nullptr;
  p.lse_accum = ns > 1 ? d_lse : nullptr;
  p.o_lat = ns == 1 ? reinterpret_cast<const __nv_bfloat16*>(d_lat) : nullptr;
  p.w_uv = reinterpret_cast<const __nv_bfloat16*>(d_w);
  p.w_head_stride = head_stride;
  p.out = reinterpret_cast<__nv_bfloat16*>(d_out);
  p.ld_out = ld_out;
  const absl::Status st = LaunchMlaCombineProject(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
  for (void* ptr : {static_cast<void*>(d_o), static_cast<void*>(d_lse), static_cast<void*>(d_lat),
                    static_cast<void*>(d_w), static_cast<void*>(d_out)}) {
    ASSERT_CUDA(cudaFree(ptr));
  }

  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.num_heads; ++h) {
      const float* m = &merged[(static_cast<size_t>(b) * c.num_heads + h) * kV];
      double err2 = 0, ref2 = 0;
      int non_finite = 0;
      for (int j = 0; j < c.v_dim; ++j) {
        double want = 0;
        for (int d = 0; d < kV; ++d) {
          want += static_cast<double>(FromBf16(w[h * head_stride + j * kV + d])) * m[d];
        }
        const float got = FromBf16(out[b * ld_out + static_cast<int64_t>(h) * c.v_dim + j]);
        if (!std::isfinite(got)) ++non_finite;
        err2 += (got - want) * (got - want);
        ref2 += want * want;
      }
      EXPECT_EQ(non_finite, 0) << "b=" << b << " h=" << h;
      if (b == empty_row) {
        EXPECT_EQ(err2, 0.0) << "a row of no tokens must project to zeros, h=" << h;
      } else {
        EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << "b=" << b << " h=" << h;
      }
    }
    // The padding past num_heads * v_dim of each output row is not written.
    for (int64_t j = static_cast<int64_t>(c.num_heads) * c.v_dim; j < ld_out; ++j) {
      EXPECT_TRUE(std::isnan(FromBf16(out[b * ld_out + j]))) << "b=" << b << " j=" << j;
    }
  }
}

class MlaCombineProjectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  uint32_t Seed() { return std::random_device{}(); }
};

TEST_F(MlaCombineProjectTest, MergesAndProjectsAtEverySplitCount) {
  for (int ns : {1, 2, 3, 17, 34, 63, 64}) RunCase({2, 16, 16, ns, 128}, Seed());
}

TEST_F(MlaCombineProjectTest, PaddedHeadsAndOtherShapes) {
  RunCase({1, 12, 16, 9, 128}, Seed());   // h_q padded past the heads
  RunCase({5, 16, 16, 34, 64}, Seed());   // v_dim 64
  RunCase({16, 16, 16, 6, 128}, Seed());  // a decode step of 16 rows
  RunCase({3, 128, 128, 4, 128}, Seed());
}

}  // namespace
}  // namespace strata::kernels
