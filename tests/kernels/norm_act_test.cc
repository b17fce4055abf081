// RMSNorm (+ residual, + a MoE block's combine) and SiLU x mul kernels against their CPU
// references, fresh random inputs, poisoned outputs, strided and in-place forms (label gpu:
// SKIPPED without a GPU; the argument checks are in small_kernels_params_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/activation/silu_mul.h"
#include "kernels/norm_rope/rms_norm.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/small_kernels_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::RoundBf16;
using testing::ToBf16;

class NormActTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};
  std::vector<float> Random(size_t n, float mean, float stddev) {
    std::normal_distribution<float> d(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = RoundBf16(d(rng_));
    return v;
  }
};

// Dense [rows][dim] values placed at row stride ld into a bf16 buffer (padding stays poison).
std::vector<uint16_t> Strided(const std::vector<float>& dense, int rows, int dim, int ld) {
  std::vector<uint16_t> out(static_cast<size_t>(rows) * ld, 0xffff);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) out[static_cast<size_t>(r) * ld + i] = ToBf16(dense[r * dim + i]);
  }
  return out;
}

struct NormCase {
  int rows, dim, ld;
  bool residual, in_place;
};

TEST_F(NormActTest, RmsNormMatchesReference) {
  const std::vector<NormCase> cases = {{1, 8, 8, false, false},        {3, 512, 576, false, false},
                                       {257, 7168, 7168, true, false}, {33, 2048, 2048, true, true},
                                       {5, 1536, 1536, false, true},   {130, 512, 576, true, false},
                                       {64, 4096, 4104, true, true}};
  for (const NormCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim << " ld=" << c.ld
                                      << " residual=" << c.residual << " in_place=" << c.in_place);
    const float eps = 1e-6f;
    const auto x = Random(static_cast<size_t>(c.rows) * c.dim, 0.f, 1.f);
    const auto res = Random(x.size(), 0.f, 2.f);
    const auto w = Random(c.dim, 1.f, 0.2f);
    std::vector<float> want_h, want;
    RmsNormReference(x, c.residual ? &res : nullptr, w, c.rows, c.dim, eps, want_h, want);

    const auto x16 = Strided(x, c.rows, c.dim, c.ld);
    DeviceBuffer dx(x16), dres(Strided(res, c.rows, c.dim, c.ld)), dw(Strided(w, 1, c.dim, c.dim));
    DeviceBuffer dout(x16.size() * 2), dres_out(x16.size() * 2);
    RmsNormParams p;
    p.rows = c.rows;
    p.dim = c.dim;
    p.eps = eps;
    p.x = dx.get<__nv_bfloat16>();
    p.ld_x = c.ld;
    p.weight = dw.get<__nv_bfloat16>();
    p.out = c.in_place ? dx.get<__nv_bfloat16>() : dout.get<__nv_bfloat16>();
    p.ld_out = c.ld;
    if (c.residual) {
      p.residual = dres.get<__nv_bfloat16>();
      p.ld_residual = c.ld;
      p.residual_out = c.in_place ? dres.get<__nv_bfloat16>() : dres_out.get<__nv_bfloat16>();
      p.ld_residual_out = c.ld;
    }
    const absl::Status st = LaunchRmsNorm(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got = (c.in_place ? dx : dout).Download<uint16_t>();
    const auto got_h = (c.in_place ? dres : dres_out).Download<uint16_t>();
    ErrorSummary err;
    int64_t over = 0, h_mismatch = 0;
    for (int r = 0; r < c.rows; ++r) {
      for (int i = 0; i < c.dim; ++i) {
        const size_t di = static_cast<size_t>(r) * c.dim + i,
                     si = static_cast<size_t>(r) * c.ld + i;
        const float g = FromBf16(got[si]);
        err.Add(g, want[di]);
        // The bf16 roundings of h / rms and of w * n may each flip: allow 2 ulps (bf16 has 7
        // explicit mantissa bits, so 2 ulps are up to 2^-6 relative).
        if (!(std::abs(g - want[di]) <= std::abs(want[di]) * 0x1p-6f + 1e-30f)) ++over;
        if (c.residual && FromBf16(got_h[si]) != want_h[di]) ++h_mismatch;
      }
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_EQ(over, 0);
    EXPECT_EQ(h_mismatch, 0) << "residual_out must be exactly bf16(x + residual)";
    EXPECT_LT(err.Rel(), 2e-3);
    std::printf("rms_norm rows=%d dim=%d ld=%d residual=%d in_place=%d rel_err=%.2e max_abs=%.2e\n",
                c.rows, c.dim, c.ld, c.residual, c.in_place, err.Rel(), err.max_abs);
  }
}

// The norm that sums a MoE block's output itself: x formed from expert rows (some choices
// dropped: slot -1), routing weights and the shared experts' rows, in the combine's order of
// operations (a chain of fp32 fmas, then the shared add: std::fma on the host is the same
// correctly rounded operation), so the residual stream must match bit for bit.
TEST_F(NormActTest, RmsNormSumsMoeOutput) {
  struct Case {
    int rows, dim, top_k;
    bool shared;
  };
  for (const Case& c : std::vector<Case>{
           {1, 2048, 6, true}, {16, 2048, 6, true}, {7, 7168, 8, false}, {64, 512, 2, true}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim
                                      << " top_k=" << c.top_k << " shared=" << c.shared);
    const float eps = 1e-6f;
    const int slots = c.rows * c.top_k, ld = c.dim + 8;
    const auto experts = Random(static_cast<size_t>(slots) * c.dim, 0.f, 0.5f);
    const auto shared = Random(static_cast<size_t>(c.rows) * c.dim, 0.f, 0.5f);
    const auto res = Random(static_cast<size_t>(c.rows) * c.dim, 0.f, 2.f);
    const auto w = Random(c.dim, 1.f, 0.2f);
    std::vector<int64_t> slot(slots);
    std::vector<float> weight(slots);
    std::vector<int64_t> perm(slots);
    for (int i = 0; i < slots; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng_);
    std::uniform_real_distribution<float> uw(0.f, 1.f);
    for (int i = 0; i < slots; ++i) {
      slot[i] = i % 5 == 3 ? -1 : perm[i];  // some choices dropped
      weight[i] = uw(rng_);
    }
    std::vector<float> x(static_cast<size_t>(c.rows) * c.dim);
    for (int r = 0; r < c.rows; ++r) {
      for (int i = 0; i < c.dim; ++i) {
        float acc = 0.f;
        for (int k = 0; k < c.top_k; ++k) {
          const int64_t sl = slot[r * c.top_k + k];
          if (sl >= 0) acc = std::fma(weight[r * c.top_k + k], experts[sl * c.dim + i], acc);
        }
        if (c.shared) acc += shared[static_cast<size_t>(r) * c.dim + i];
        x[static_cast<size_t>(r) * c.dim + i] = RoundBf16(acc);
      }
    }
    std::vector<float> want_h, want;
    RmsNormReference(x, &res, w, c.rows, c.dim, eps, want_h, want);

    DeviceBuffer dexp(Strided(experts, slots, c.dim, ld)),
        dshared(Strided(shared, c.rows, c.dim, ld));
    DeviceBuffer dslot(slot), dweight(weight), dw(Strided(w, 1, c.dim, c.dim));
    DeviceBuffer dres(Strided(res, c.rows, c.dim, c.dim));
    DeviceBuffer dout(static_cast<size_t>(c.rows) * c.dim * 2);
    RmsNormParams p;
    p.rows = c.rows;
    p.dim = c.dim;
    p.eps = eps;
    p.moe.top_k = c.top_k;
    p.moe.expert_out = dexp.get<__nv_bfloat16>();
    p.moe.ld_expert_out = ld;
    p.moe.slot = dslot.get<int64_t>();
    p.moe.weight = dweight.get<float>();
    if (c.shared) {
      p.moe.shared = dshared.get<__nv_bfloat16>();
      p.moe.ld_shared = ld;
    }
    p.residual = dres.get<__nv_bfloat16>();  // in place, as the engine's residual stream
    p.ld_residual = c.dim;
    p.residual_out = dres.get<__nv_bfloat16>();
    p.ld_residual_out = c.dim;
    p.weight = dw.get<__nv_bfloat16>();
    p.out = dout.get<__nv_bfloat16>();
    p.ld_out = c.dim;
    const absl::Status st = LaunchRmsNorm(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got = dout.Download<uint16_t>();
    const auto got_h = dres.Download<uint16_t>();
    ErrorSummary err;
    int64_t over = 0, h_mismatch = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float g = FromBf16(got[i]);
      err.Add(g, want[i]);
      if (!(std::abs(g - want[i]) <= std::abs(want[i]) * 0x1p-6f + 1e-30f)) ++over;
      if (FromBf16(got_h[i]) != want_h[i]) ++h_mismatch;
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_EQ(over, 0);
    EXPECT_EQ(h_mismatch, 0) << "residual_out must be exactly bf16(combine + residual)";
    EXPECT_LT(err.Rel(), 2e-3);
    std::printf("rms_norm moe rows=%d dim=%d top_k=%d rel_err=%.2e\n", c.rows, c.dim, c.top_k,
                err.Rel());
  }
}

TEST_F(NormActTest, SiluMulMatchesReference) {
  struct Case {
    int rows, dim;
    bool fused;
  };
  for (const Case& c :
       std::vector<Case>{{1, 8, false}, {7, 1408, true}, {300, 2048, true}, {65, 18432, false}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim);
    const auto gate = Random(static_cast<size_t>(c.rows) * c.dim, 0.f, 3.f);
    const auto up = Random(gate.size(), 0.f, 1.f);
    std::vector<float> want;
    SiluMulReference(gate, up, want);
    // Fused: one [rows][2 dim] buffer (gate | up), output written over the gate half.
    std::vector<uint16_t> in16;
    if (c.fused) {
      in16.assign(static_cast<size_t>(c.rows) * 2 * c.dim, 0);
      for (int r = 0; r < c.rows; ++r) {
        for (int i = 0; i < c.dim; ++i) {
          in16[static_cast<size_t>(r) * 2 * c.dim + i] = ToBf16(gate[r * c.dim + i]);
          in16[static_cast<size_t>(r) * 2 * c.dim + c.dim + i] = ToBf16(up[r * c.dim + i]);
        }
      }
    }
    DeviceBuffer dfused(in16), dgate(Strided(gate, c.rows, c.dim, c.dim)),
        dup(Strided(up, c.rows, c.dim, c.dim)), dout(gate.size() * 2);
    SiluMulParams p;
    p.rows = c.rows;
    p.dim = c.dim;
    if (c.fused) {
      p.gate = dfused.get<__nv_bfloat16>();
      p.up = dfused.get<__nv_bfloat16>() + c.dim;
      p.ld_gate = p.ld_up = 2 * c.dim;
      p.out = dfused.get<__nv_bfloat16>();
      p.ld_out = 2 * c.dim;
    } else {
      p.gate = dgate.get<__nv_bfloat16>();
      p.up = dup.get<__nv_bfloat16>();
      p.ld_gate = p.ld_up = c.dim;
      p.out = dout.get<__nv_bfloat16>();
      p.ld_out = c.dim;
    }
    const absl::Status st = LaunchSiluMul(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got = (c.fused ? dfused : dout).Download<uint16_t>();
    ErrorSummary err;
    for (int r = 0; r < c.rows; ++r) {
      for (int i = 0; i < c.dim; ++i) {
        err.Add(FromBf16(got[static_cast<size_t>(r) * p.ld_out + i]), want[r * c.dim + i]);
      }
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_LT(err.Rel(), 2e-3);
    std::printf("silu_mul rows=%d dim=%d fused=%d rel_err=%.2e\n", c.rows, c.dim, c.fused,
                err.Rel());
  }
}

}  // namespace
}  // namespace strata::kernels
