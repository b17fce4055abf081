// One routed token whose expert kernels route it themselves (MoeExpertsParams::route) against the
// router launch followed by the same expert kernels over its alignment: every output, the
// router's (experts, weights, the alignment arrays, the error flag) and the experts' (act, out),
// must be bit-identical, poison included where neither path writes. The logits come from a skinny
// GEMM launched just ahead on the same stream with no host sync, as in a decode step, so a
// kernel that read them before they were complete (the down kernel routes before its
// programmatic-launch wait) would see the poisoned buffer. Routers of V2-Lite (softmax, greedy)
// and V3 (sigmoid, noaux_tc, groups, bias), both expert-kernel forms of the down projection, NaN
// logits for some experts and for all of them (label gpu: SKIPPED without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_router/moe_router.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/moe_align_buffers.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ToBf16;

struct Case {
  const char* name;
  int experts, top_k, hidden, inter;
  MoeScoring scoring;
  MoeTopkMethod method;
  int n_group, topk_group;
  bool normalize, bias;
  float scale;
  int nan_experts;  // router rows of NaN weights (NaN logits): -1 all of them
};

class MoeRouteInExpertsTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  std::vector<uint16_t> RandomBf16(size_t n, float stddev) {
    std::normal_distribution<float> d(0.f, stddev);
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = ToBf16(d(rng_));
    return v;
  }

  std::mt19937 rng_{std::random_device{}()};
  cudaStream_t stream_ = nullptr;
};

// What one path writes: the router's outputs and alignment, the experts' act and out rows.
struct Outputs {
  Outputs(int experts, int top_k, int hidden, int inter)
      : logits(experts * 4),
        choices(top_k * 4),
        weights(top_k * 4),
        align(std::vector<int32_t>(top_k, 0), 1, top_k, experts),
        act(static_cast<size_t>(top_k) * inter * 2),
        out(static_cast<size_t>(top_k) * hidden * 2) {}
  DeviceBuffer logits, choices, weights;
  testing::MoeAlignBuffers align;  // its `ids` buffer is unused
  DeviceBuffer act, out;
};

void ExpectSameBytes(const DeviceBuffer& want, const DeviceBuffer& got, const char* what) {
  const auto a = want.Download<uint8_t>(), b = got.Download<uint8_t>();
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      ++differ;
      first = std::min(first, i);
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " bytes differ, the first at " << first;
}

TEST_F(MoeRouteInExpertsTest, MatchesRouterThenExperts) {
  const int router_k = 512;  // the router GEMM's reduction (its input row's width)
  const std::vector<Case> cases = {
      // V2-Lite's router and intermediate size (the deep gate|up, the down at depth 1 on two row
      // tiles; a narrower hidden size than the model's keeps the test's weights small).
      {"v2-lite", 64, 6, 256, 1408, MoeScoring::kSoftmax, MoeTopkMethod::kGreedy, 1, 1, false,
       false, 1.f, 0},
      // V3's router on 64 experts; inter 2048 takes the deep form of the down kernel too.
      {"v3-router", 64, 8, 128, 2048, MoeScoring::kSigmoid, MoeTopkMethod::kNoauxTc, 8, 4, true,
       true, 2.5f, 0},
      // NaN logits for 5 experts (sigmoid: only those are never chosen), then for all (softmax:
      // no valid choice, every CTA exits, the error flag is set).
      {"some-nan", 64, 6, 136, 88, MoeScoring::kSigmoid, MoeTopkMethod::kNoauxTc, 1, 1, true, true,
       1.f, 5},
      {"all-nan", 64, 6, 136, 88, MoeScoring::kSoftmax, MoeTopkMethod::kGreedy, 1, 1, false, false,
       1.f, -1},
  };
  for (const Case& c : cases) {
    for (int rep = 0; rep < 3; ++rep) {  // fresh inputs each time
      SCOPED_TRACE(::testing::Message() << c.name << " rep " << rep);
      const int64_t stride = 3 * static_cast<int64_t>(c.inter) * c.hidden;
      DeviceBuffer x(RandomBf16(c.hidden, 1.f)), w(RandomBf16(stride * c.experts, 0.05f));
      DeviceBuffer router_x(RandomBf16(router_k, 1.f));
      std::vector<uint16_t> router_w_host =
          RandomBf16(static_cast<size_t>(c.experts) * router_k, 1.f / std::sqrt(1.f * router_k));
      const int nan_rows = c.nan_experts < 0 ? c.experts : c.nan_experts;
      for (int i = 0; i < nan_rows; ++i) {
        const int e = c.nan_experts < 0 ? i : static_cast<int>(rng_() % c.experts);
        router_w_host[static_cast<size_t>(e) * router_k] = 0x7fc0;
      }
      DeviceBuffer router_w(router_w_host);
      std::vector<float> bias_host(c.experts);
      for (float& b : bias_host) b = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng_);
      DeviceBuffer bias(bias_host);

      auto run = [&](Outputs& o, bool in_experts) {
        SkinnyGemmParams g;
        g.tokens = 1;
        g.n_out = c.experts;
        g.k = router_k;
        g.x = router_x.get<__nv_bfloat16>();
        g.w = router_w.get<__nv_bfloat16>();
        g.out_f32 = o.logits.get<float>();
        g.weights_static = true;
        ASSERT_TRUE(LaunchSkinnyGemm(g, stream_).ok());
        MoeRouterParams r;
        r.num_tokens = 1;
        r.num_experts = c.experts;
        r.top_k = c.top_k;
        r.scoring = c.scoring;
        r.topk_method = c.method;
        r.n_group = c.n_group;
        r.topk_group = c.topk_group;
        r.normalize = c.normalize;
        r.routed_scaling_factor = c.scale;
        r.logits = o.logits.get<float>();
        r.ld_logits = c.experts;
        r.bias = c.bias ? bias.get<float>() : nullptr;
        r.experts = o.choices.get<int32_t>();
        r.weights = o.weights.get<float>();
        r.align = o.align.params.out;
        if (!in_experts) {
          ASSERT_TRUE(LaunchMoeRouter(r, stream_).ok());
        }
        MoeExpertsParams p;
        p.num_tokens = 1;
        p.num_experts = c.experts;
        p.max_active = c.top_k;
        p.hidden = c.hidden;
        p.inter = c.inter;
        p.token_tiles = 1;
        p.x = x.get<__nv_bfloat16>();
        p.ld_x = c.hidden;
        p.weights = w.get<__nv_bfloat16>();
        p.expert_stride = stride;
        if (in_experts) {
          p.route = r;
        } else {
          p.expert_count = r.align.expert_count;
          p.expert_offset = r.align.expert_offset;
          p.active = r.align.active;
          p.num_active = r.align.num_active;
          p.slot_token = r.align.slot_token;
        }
        p.act = o.act.get<__nv_bfloat16>();
        p.out = o.out.get<__nv_bfloat16>();
        p.weights_static = true;
        const absl::Status st = LaunchMoeExperts(p, stream_);
        ASSERT_TRUE(st.ok()) << st;
      };
      Outputs want(c.experts, c.top_k, c.hidden, c.inter),
          got(c.experts, c.top_k, c.hidden, c.inter);
      run(want, false);
      run(got, true);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);

      // The reference path did real work: every valid choice's rows are finite.
      const int valid = want.align.num_active.Download<int32_t>()[0];
      EXPECT_EQ(valid, c.nan_experts < 0 ? 0 : c.top_k);
      EXPECT_EQ(want.align.error.Download<int32_t>()[0], c.nan_experts < 0 ? 1 : 0);
      const auto out = want.out.Download<uint16_t>();
      int64_t finite = 0;
      for (uint16_t v : out) finite += std::isfinite(testing::FromBf16(v)) ? 1 : 0;
      EXPECT_EQ(finite, static_cast<int64_t>(valid) * c.hidden);

      ExpectSameBytes(want.logits, got.logits, "logits");
      ExpectSameBytes(want.choices, got.choices, "experts");
      ExpectSameBytes(want.weights, got.weights, "weights");
      const testing::MoeAlignBuffers &a = want.align, &b = got.align;
      ExpectSameBytes(a.count, b.count, "expert_count");
      ExpectSameBytes(a.offset, b.offset, "expert_offset");
      ExpectSameBytes(a.active, b.active, "active");
      ExpectSameBytes(a.num_active, b.num_active, "num_active");
      ExpectSameBytes(a.slot_token, b.slot_token, "slot_token");
      ExpectSameBytes(a.token_slot, b.token_slot, "token_slot");
      ExpectSameBytes(a.error, b.error, "error");
      ExpectSameBytes(want.act, got.act, "act");
      ExpectSameBytes(want.out, got.out, "out");
    }
  }
}

// Argument checks touch no device: they run without a GPU too.
TEST(MoeRouteInExpertsParamsTest, RejectsBadRoute) {
  alignas(16) static __nv_bfloat16 buf[64];
  static float logits[8], weights[2];
  static int32_t ints[64];
  static int64_t slots[2];
  MoeExpertsParams p;
  p.num_tokens = 1;
  p.num_experts = 8;
  p.max_active = 2;
  p.hidden = 8;
  p.inter = 8;
  p.token_tiles = 1;
  p.x = p.weights = buf;
  p.ld_x = 8;
  p.expert_stride = 3 * 8 * 8;
  p.act = p.out = buf;
  p.route.num_tokens = 1;
  p.route.num_experts = 8;
  p.route.top_k = 2;
  p.route.logits = logits;
  p.route.ld_logits = 8;
  p.route.experts = ints;
  p.route.weights = weights;
  p.route.align = {.expert_count = ints,
                   .expert_offset = ints + 8,
                   .active = ints + 17,
                   .num_active = ints + 25,
                   .slot_token = ints + 26,
                   .token_slot = slots,
                   .error = ints + 28};
  EXPECT_TRUE(ValidateMoeExpertsParams(p).ok()) << "no alignment arrays needed when routing";
  MoeExpertsParams q = p;
  q.max_active = 1;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "fewer slots than choices";
  q = p;
  q.num_tokens = 2;
  q.route.num_tokens = 2;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "two tokens";
  q = p;
  q.route.align.error = nullptr;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "an alignment array missing";
  q = p;
  q.route.num_experts = 16;
  q.route.ld_logits = 16;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "expert counts differ";
  q = p;
  q.route.top_k = 9;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "a router the router would reject";
}

}  // namespace
}  // namespace strata::kernels
