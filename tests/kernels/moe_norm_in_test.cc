// A one-row projection that forms its input row from a norm (MoeNormIn) gives bit-identically
// what LaunchRmsNorm followed by the same projection gives: the skinny GEMM (the q|kv_a
// projection, the router logits; early weight loads or not, deep and shallow forms) and the
// identity MLP (a dense or shared-experts block), for a norm over x + residual, over a MoE
// block's output (top-6 rows + shared experts) + residual, and over x alone; the writing launch
// also stores the norm's residual_out and out as the norm kernel does, the others store nothing
// (label gpu: SKIPPED without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/moe_experts/moe_experts.h"
#include "kernels/norm_rope/rms_norm.h"
#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::RoundBf16;
using testing::ToBf16;

enum class Input { kResidual, kMoeSum, kAlone };

class MoeNormInTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  std::vector<uint16_t> Random(size_t n, float stddev) {
    std::normal_distribution<float> d(0.f, stddev);
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = ToBf16(RoundBf16(d(rng_)));
    return v;
  }
};

// The device inputs of one norm over a dim-wide row, and its outputs twice: written by the norm
// kernel (`ref_*`) and by the forming launch (`*`).
struct NormRow {
  NormRow(MoeNormInTest& t, Input input, int dim)
      : x(t.Random(dim, 1.f)),
        residual(t.Random(dim, 1.f)),
        weight(t.Random(dim, 1.f)),
        experts(t.Random(8 * static_cast<size_t>(dim), 1.f)),
        shared(t.Random(dim, 1.f)),
        slots(std::vector<int64_t>{5, 0, -1, 7, 2, 3}),
        choice_weights(std::vector<float>{0.31f, 0.22f, 0.9f, 0.17f, 0.05f, 0.25f}),
        ref_out(dim * 2),
        ref_residual_out(dim * 2),
        out(dim * 2),
        residual_out(dim * 2) {
    params.rows = 1;
    params.dim = dim;
    params.eps = 1e-6f;
    if (input != Input::kMoeSum) {
      params.x = x.get<__nv_bfloat16>();
      params.ld_x = dim;
    } else {
      params.moe.top_k = 6;
      params.moe.expert_out = experts.get<__nv_bfloat16>();
      params.moe.ld_expert_out = dim;
      params.moe.slot = slots.get<int64_t>();
      params.moe.weight = choice_weights.get<float>();
      params.moe.shared = shared.get<__nv_bfloat16>();
      params.moe.ld_shared = dim;
    }
    if (input != Input::kAlone) {
      params.residual = residual.get<__nv_bfloat16>();
      params.ld_residual = dim;
      params.ld_residual_out = dim;
    }
    params.weight = weight.get<__nv_bfloat16>();
    params.ld_out = dim;
  }
  // The norm kernel's outputs in ref_*.
  RmsNormParams Reference() const {
    RmsNormParams p = params;
    p.out = ref_out.get<__nv_bfloat16>();
    if (p.residual != nullptr) p.residual_out = ref_residual_out.get<__nv_bfloat16>();
    return p;
  }
  // The forming launch's norm; `writes`: into out and residual_out.
  MoeNormIn Formed(bool writes) const {
    MoeNormIn n{params, writes};
    n.params.out = out.get<__nv_bfloat16>();
    if (n.params.residual != nullptr) n.params.residual_out = residual_out.get<__nv_bfloat16>();
    return n;
  }

  RmsNormParams params;
  DeviceBuffer x, residual, weight, experts, shared, slots, choice_weights;
  DeviceBuffer ref_out, ref_residual_out, out, residual_out;
};

constexpr Input kInputs[] = {Input::kResidual, Input::kMoeSum, Input::kAlone};
constexpr uint16_t kPoison = 0xffff;  // DeviceBuffer's fill

TEST_F(MoeNormInTest, SkinnyGemmEqualsNormThenGemm) {
  struct Shape {
    int n_out, k;
    bool fp32, weights_static;
  };
  // q|kv_a (deep form, early loads), router logits (fp32 out), a reduction under 32 steps (the
  // shallow form), V3's width.
  for (const Shape& c : std::vector<Shape>{{3648, 2048, false, true},
                                           {64, 2048, true, true},
                                           {3648, 2048, false, false},
                                           {200, 1536, false, true},
                                           {96, 7168, false, true}}) {
    for (const Input input : kInputs) {
      for (const bool writes : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "n_out=" << c.n_out << " k=" << c.k << " input="
                                          << static_cast<int>(input) << " writes=" << writes);
        NormRow row(*this, input, c.k);
        DeviceBuffer w(Random(static_cast<size_t>(c.n_out) * c.k, 0.03f)), xn(c.k * 2);
        const size_t out_bytes = static_cast<size_t>(c.n_out) * (c.fp32 ? 4 : 2);
        DeviceBuffer ref(out_bytes), got(out_bytes);
        RmsNormParams norm = row.Reference();
        norm.out = xn.get<__nv_bfloat16>();
        ASSERT_TRUE(LaunchRmsNorm(norm, nullptr).ok());
        ASSERT_TRUE(LaunchRmsNorm(row.Reference(), nullptr).ok());
        SkinnyGemmParams g;
        g.tokens = 1;
        g.n_out = c.n_out;
        g.k = c.k;
        g.w = w.get<__nv_bfloat16>();
        g.weights_static = c.weights_static;
        g.x = xn.get<__nv_bfloat16>();
        const auto output_to = [&](const DeviceBuffer& b) {
          g.out = c.fp32 ? nullptr : b.get<__nv_bfloat16>();
          g.out_f32 = c.fp32 ? b.get<float>() : nullptr;
        };
        output_to(ref);
        ASSERT_TRUE(LaunchSkinnyGemm(g, nullptr).ok());
        g.x = nullptr;  // not read
        g.norm_in = row.Formed(writes);
        output_to(got);
        const absl::Status st = LaunchSkinnyGemm(g, nullptr);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(got.Download<uint16_t>(), ref.Download<uint16_t>());
        const auto out = row.out.Download<uint16_t>();
        const auto residual_out = row.residual_out.Download<uint16_t>();
        if (writes) {
          EXPECT_EQ(out, row.ref_out.Download<uint16_t>());
          EXPECT_EQ(residual_out, row.ref_residual_out.Download<uint16_t>());
        } else {
          EXPECT_EQ(out, std::vector<uint16_t>(c.k, kPoison)) << "written without writes";
          EXPECT_EQ(residual_out, std::vector<uint16_t>(c.k, kPoison));
        }
      }
    }
  }
}

TEST_F(MoeNormInTest, IdentityMlpEqualsNormThenMlp) {
  struct Shape {
    int hidden, inter;
  };
  // v2-lite's shared experts (2 x 1408) and dense MLP, V3's shared expert.
  for (const Shape& c : std::vector<Shape>{{2048, 2816}, {2048, 10944}, {7168, 2048}}) {
    for (const Input input : kInputs) {
      SCOPED_TRACE(::testing::Message()
                   << "H=" << c.hidden << " I=" << c.inter << " input=" << static_cast<int>(input));
      NormRow row(*this, input, c.hidden);
      const float scale = 1.f / std::sqrt(static_cast<float>(c.hidden));
      DeviceBuffer gate_up(Random(2 * static_cast<size_t>(c.inter) * c.hidden, scale)),
          down(Random(static_cast<size_t>(c.hidden) * c.inter, scale)), xn(c.hidden * 2),
          act(c.inter * 2), ref(c.hidden * 2), got(c.hidden * 2);
      RmsNormParams norm = row.Reference();
      norm.out = xn.get<__nv_bfloat16>();
      ASSERT_TRUE(LaunchRmsNorm(norm, nullptr).ok());
      ASSERT_TRUE(LaunchRmsNorm(row.Reference(), nullptr).ok());
      MoeExpertsParams p;
      p.num_tokens = 1;
      p.num_experts = 1;
      p.max_active = 1;
      p.hidden = c.hidden;
      p.inter = c.inter;
      p.token_tiles = 1;
      p.identity = true;
      p.x = xn.get<__nv_bfloat16>();
      p.ld_x = c.hidden;
      p.weights = gate_up.get<__nv_bfloat16>();
      p.down = down.get<__nv_bfloat16>();
      p.act = act.get<__nv_bfloat16>();
      p.out = ref.get<__nv_bfloat16>();
      p.weights_static = true;
      ASSERT_TRUE(LaunchMoeExperts(p, nullptr).ok());
      p.x = nullptr;
      p.norm_in = row.Formed(/*writes=*/true);
      p.out = got.get<__nv_bfloat16>();
      const absl::Status st = LaunchMoeExperts(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(got.Download<uint16_t>(), ref.Download<uint16_t>());
      EXPECT_EQ(row.out.Download<uint16_t>(), row.ref_out.Download<uint16_t>());
      EXPECT_EQ(row.residual_out.Download<uint16_t>(), row.ref_residual_out.Download<uint16_t>());
    }
  }
}

}  // namespace
}  // namespace strata::kernels
