// MoE router kernel against the CPU backend's cpu::RouteToken on fresh random logits and biases:
// the DeepSeek-V3 (sigmoid, noaux_tc, 8 groups), V2 (softmax, group_limited_greedy) and V2-Lite
// (softmax, greedy) routers plus an odd small one (label gpu: SKIPPED without a GPU). Both sides
// compute the scores in double and round to fp32, so the chosen experts must be identical, in
// order; weights agree to fp32 rounding. Outputs are poisoned before the launch. Calls of up to
// 16 tokens also write their alignment (MoeAlignment): one token's checked against the chosen
// experts, more tokens' against LaunchMoeAlign's over the same choices.
#include "kernels/moe_router/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/model/model_config.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/moe_align_buffers.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;

struct RouterCase {
  const char* name;
  model::ModelType type;
  int experts, top_k;
  model::ScoringFunc scoring;
  model::TopkMethod method;
  int n_group, topk_group;
  bool norm_topk_prob;
  double scale;
};

// The alignment the router wrote against its choices (experts[0][0:top_k], every one valid).
void CheckAlignment(const testing::MoeAlignBuffers& b, const std::vector<int32_t>& choices,
                    int experts, int top_k) {
  const auto c = b.count.Download<int32_t>(), o = b.offset.Download<int32_t>(),
             a = b.active.Download<int32_t>(), st = b.slot_token.Download<int32_t>();
  const auto ts = b.token_slot.Download<int64_t>();
  EXPECT_EQ(b.num_active.Download<int32_t>()[0], top_k);
  EXPECT_EQ(b.error.Download<int32_t>()[0], 0);
  EXPECT_EQ(o[experts], top_k);
  std::vector<int> chosen(experts, 0), slot_used(top_k, 0);
  for (int k = 0; k < top_k; ++k) {
    const int e = choices[k];
    ASSERT_TRUE(e >= 0 && e < experts) << e;
    ++chosen[e];
    const int64_t slot = ts[k];
    ASSERT_TRUE(slot >= 0 && slot < top_k) << "choice " << k << " slot " << slot;
    ++slot_used[slot];
    EXPECT_EQ(a[slot], e) << "slot " << slot;
    EXPECT_EQ(o[e], slot) << "expert " << e;
    EXPECT_EQ(st[slot], 0) << "slot " << slot;
  }
  for (int k = 0; k < top_k; ++k) EXPECT_EQ(slot_used[k], 1) << "slot " << k;
  for (int e = 0; e < experts; ++e) EXPECT_EQ(c[e], chosen[e]) << "expert " << e;
  for (int i = top_k; i < experts; ++i) EXPECT_EQ(a[i], -1) << "active " << i;
}

// The alignment a router block wrote for `tokens` tokens against LaunchMoeAlign's over the same
// choices: equal arrays, except that the order of the slots inside an expert's range is free.
void CheckBlockAlignment(const testing::MoeAlignBuffers& got, const std::vector<int32_t>& choices,
                         int tokens, int experts, int top_k) {
  testing::MoeAlignBuffers want(choices, tokens, top_k, experts);
  ASSERT_TRUE(LaunchMoeAlign(want.params, nullptr).ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(got.count.Download<int32_t>(), want.count.Download<int32_t>());
  const auto o = got.offset.Download<int32_t>();
  EXPECT_EQ(o, want.offset.Download<int32_t>());
  EXPECT_EQ(got.active.Download<int32_t>(), want.active.Download<int32_t>());
  EXPECT_EQ(got.num_active.Download<int32_t>(), want.num_active.Download<int32_t>());
  EXPECT_EQ(got.error.Download<int32_t>(), want.error.Download<int32_t>());
  const auto st = got.slot_token.Download<int32_t>();
  const auto ts = got.token_slot.Download<int64_t>();
  std::vector<int> used(tokens * top_k, 0);
  for (int i = 0; i < tokens * top_k; ++i) {
    const int e = choices[i];
    ASSERT_TRUE(e >= 0 && e < experts) << e;
    const int64_t slot = ts[i];
    ASSERT_TRUE(slot >= o[e] && slot < o[e + 1]) << "choice " << i << " slot " << slot;
    ++used[slot];
    EXPECT_EQ(st[slot], i / top_k) << "slot " << slot;
  }
  for (int s = 0; s < tokens * top_k; ++s) EXPECT_EQ(used[s], 1) << "slot " << s;
}

class MoeRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  // ties: logits and biases from a few values, so that many choices are equal and the order
  // rests on the index rule.
  void RunCase(const RouterCase& rc, int tokens, bool ties = false) {
    SCOPED_TRACE(::testing::Message() << rc.name << " tokens=" << tokens << " ties=" << ties);
    model::ModelConfig c;
    c.type = rc.type;
    c.n_routed_experts = rc.experts;
    c.num_experts_per_tok = rc.top_k;
    c.scoring_func = rc.scoring;
    c.topk_method = rc.method;
    c.n_group = rc.n_group;
    c.topk_group = rc.topk_group;
    c.norm_topk_prob = rc.norm_topk_prob;
    c.routed_scaling_factor = rc.scale;
    std::normal_distribution<float> normal(0.f, 2.f), small(0.f, 0.1f);
    const int ld = rc.experts + 3;  // strided rows
    std::vector<float> logits(static_cast<size_t>(tokens) * ld);
    std::uniform_int_distribution<int> level(0, 3);
    for (float& x : logits) x = ties ? 0.5f * static_cast<float>(level(rng_)) : normal(rng_);
    std::vector<float> bias(rc.experts);
    for (float& x : bias) x = ties ? 0.25f * static_cast<float>(level(rng_) % 2) : small(rng_);
    const bool use_bias = rc.method == model::TopkMethod::kNoauxTc;

    DeviceBuffer dlogits(logits), dbias(bias);
    DeviceBuffer dexperts(static_cast<size_t>(tokens) * rc.top_k * 4),
        dweights(static_cast<size_t>(tokens) * rc.top_k * 4);
    MoeRouterParams p;
    p.num_tokens = tokens;
    p.num_experts = rc.experts;
    p.top_k = rc.top_k;
    p.scoring =
        rc.scoring == model::ScoringFunc::kSoftmax ? MoeScoring::kSoftmax : MoeScoring::kSigmoid;
    p.topk_method = static_cast<MoeTopkMethod>(static_cast<int>(rc.method));
    p.n_group = rc.n_group;
    p.topk_group = rc.topk_group;
    p.normalize = rc.type == model::ModelType::kDeepseekV3 && rc.norm_topk_prob;
    p.routed_scaling_factor = static_cast<float>(rc.scale);
    p.logits = dlogits.get<float>();
    p.ld_logits = ld;
    p.bias = use_bias ? dbias.get<float>() : nullptr;
    p.experts = dexperts.get<int32_t>();
    p.weights = dweights.get<float>();
    // Up to kMoeRouterAlignMaxTokens tokens the router also aligns its choices.
    testing::MoeAlignBuffers align(std::vector<int32_t>(tokens * rc.top_k, 0), tokens, rc.top_k,
                                   rc.experts);
    const bool aligns = tokens <= kMoeRouterAlignMaxTokens;
    if (aligns) p.align = align.params.out;
    const absl::Status st = LaunchMoeRouter(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got_e = dexperts.Download<int32_t>();
    const auto got_w = dweights.Download<float>();
    if (tokens == 1) CheckAlignment(align, got_e, rc.experts, rc.top_k);
    if (tokens > 1 && aligns) CheckBlockAlignment(align, got_e, tokens, rc.experts, rc.top_k);

    int64_t expert_mismatch = 0, weight_bad = 0;
    double max_rel = 0;
    std::vector<int32_t> want_e;
    std::vector<float> want_w;
    for (int t = 0; t < tokens; ++t) {
      cpu::RouteToken(c, logits.data() + static_cast<size_t>(t) * ld,
                      use_bias ? bias.data() : nullptr, &want_e, &want_w);
      ASSERT_EQ(static_cast<int>(want_e.size()), rc.top_k);
      for (int k = 0; k < rc.top_k; ++k) {
        const size_t i = static_cast<size_t>(t) * rc.top_k + k;
        if (got_e[i] != want_e[k]) ++expert_mismatch;
        const double rel = std::abs(static_cast<double>(got_w[i]) - want_w[k]) /
                           std::max(1e-30, std::abs(static_cast<double>(want_w[k])));
        if (!(rel <= 1e-5)) ++weight_bad;
        if (std::isfinite(rel)) max_rel = std::max(max_rel, rel);
      }
    }
    EXPECT_EQ(expert_mismatch, 0);
    EXPECT_EQ(weight_bad, 0);
    std::printf("moe_router %s tokens=%d expert_mismatches=%lld max_weight_rel_err=%.2e\n", rc.name,
                tokens, static_cast<long long>(expert_mismatch), max_rel);
  }
};

const RouterCase kV3 = {"v3",
                        model::ModelType::kDeepseekV3,
                        256,
                        8,
                        model::ScoringFunc::kSigmoid,
                        model::TopkMethod::kNoauxTc,
                        8,
                        4,
                        true,
                        2.5};
const RouterCase kV2 = {"v2",
                        model::ModelType::kDeepseekV2,
                        160,
                        6,
                        model::ScoringFunc::kSoftmax,
                        model::TopkMethod::kGroupLimitedGreedy,
                        8,
                        3,
                        false,
                        16.0};
const RouterCase kV2Lite = {"v2-lite",
                            model::ModelType::kDeepseekV2,
                            64,
                            6,
                            model::ScoringFunc::kSoftmax,
                            model::TopkMethod::kGreedy,
                            1,
                            1,
                            false,
                            1.0};
const RouterCase kOdd = {"odd",
                         model::ModelType::kDeepseekV3,
                         40,
                         3,
                         model::ScoringFunc::kSigmoid,
                         model::TopkMethod::kNoauxTc,
                         4,
                         2,
                         true,
                         1.0};
const RouterCase kSoftmaxV3 = {"v3-softmax-nonorm",
                               model::ModelType::kDeepseekV3,
                               96,
                               4,
                               model::ScoringFunc::kSoftmax,
                               model::TopkMethod::kGreedy,
                               1,
                               1,
                               false,
                               1.5};

TEST_F(MoeRouterTest, MatchesCpuRouter) {
  for (const RouterCase& rc : {kV3, kV2, kV2Lite, kOdd, kSoftmaxV3}) {
    for (int tokens : {1, 2, 5, 16, 33, 2000}) RunCase(rc, tokens);
  }
}

// A greedy router without normalization over dense [tokens][experts] logits.
MoeRouterParams GreedyParams(int tokens, int experts, int top_k, MoeScoring scoring,
                             const DeviceBuffer& logits, const DeviceBuffer& out_experts,
                             const DeviceBuffer& out_weights) {
  MoeRouterParams p;
  p.num_tokens = tokens;
  p.num_experts = experts;
  p.top_k = top_k;
  p.scoring = scoring;
  p.topk_method = MoeTopkMethod::kGreedy;
  p.normalize = false;
  p.logits = logits.get<float>();
  p.ld_logits = experts;
  p.experts = out_experts.get<int32_t>();
  p.weights = out_weights.get<float>();
  return p;
}

// Equal choices go to the lower index, as the CPU's partial sort orders them; both top-k forms
// (from ranks up to 128 experts: v2-lite, odd, v3-softmax; by rounds beyond: v3, v2).
TEST_F(MoeRouterTest, MatchesCpuRouterOnTies) {
  for (const RouterCase& rc : {kV3, kV2, kV2Lite, kOdd, kSoftmaxV3}) {
    for (int tokens : {1, 7, 300}) RunCase(rc, tokens, /*ties=*/true);
  }
}

// A NaN choice is never picked; the best of the others are, in order; slots left without a
// candidate get expert 1 << 30 and weight 0. Sigmoid scores, so one NaN logit spoils one score
// only. Both top-k forms (40 and 96 experts: ranks; 160: rounds).
TEST_F(MoeRouterTest, NanChoicesAreNeverPicked) {
  constexpr int kTopK = 4, kTokens = 3;
  std::normal_distribution<float> normal(0.f, 2.f);
  for (int experts : {40, 96, 160}) {
    SCOPED_TRACE(::testing::Message() << "experts=" << experts);
    std::vector<float> logits(kTokens * experts);
    for (int t = 0; t < kTokens; ++t) {
      for (int e = 0; e < experts; ++e) {
        // Token 0: every third NaN; token 1: all but experts 5 and 17 (fewer than top_k);
        // token 2: none.
        const bool nan = (t == 0 && e % 3 == 1) || (t == 1 && e != 5 && e != 17);
        logits[t * experts + e] = nan ? std::nanf("") : normal(rng_);
      }
    }
    DeviceBuffer dlogits(logits), dexperts(kTokens * kTopK * 4), dweights(kTokens * kTopK * 4);
    const MoeRouterParams p =
        GreedyParams(kTokens, experts, kTopK, MoeScoring::kSigmoid, dlogits, dexperts, dweights);
    const absl::Status st = LaunchMoeRouter(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto got_e = dexperts.Download<int32_t>();
    const auto got_w = dweights.Download<float>();
    for (int t = 0; t < kTokens; ++t) {
      std::vector<std::pair<float, int>> ranked;  // (score, expert) of the non-NaN logits
      for (int e = 0; e < experts; ++e) {
        const float x = logits[t * experts + e];
        if (!std::isnan(x)) {
          ranked.emplace_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))),
                              e);
        }
      }
      std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      for (int k = 0; k < kTopK; ++k) {
        SCOPED_TRACE(::testing::Message() << "token " << t << " choice " << k);
        const int i = t * kTopK + k;
        if (k < static_cast<int>(ranked.size())) {
          EXPECT_EQ(got_e[i], ranked[k].second);
          EXPECT_NEAR(got_w[i], ranked[k].first, 1e-6f * ranked[k].first);
        } else {
          EXPECT_EQ(got_e[i], 1 << 30);
          EXPECT_EQ(got_w[i], 0.f);
        }
      }
    }
  }
}

// NaN logits leave no candidate: the alignment drops every choice and flags it, as LaunchMoeAlign
// does for out-of-range experts (one token: the warp's alignment; four: the block's).
TEST_F(MoeRouterTest, AlignFlagsNanLogits) {
  constexpr int kExperts = 64, kTopK = 6;
  for (int tokens : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << tokens);
    DeviceBuffer logits(std::vector<float>(tokens * kExperts, std::nanf(""))),
        experts(tokens * kTopK * 4), weights(tokens * kTopK * 4);
    testing::MoeAlignBuffers align(std::vector<int32_t>(tokens * kTopK, 0), tokens, kTopK,
                                   kExperts);
    MoeRouterParams p =
        GreedyParams(tokens, kExperts, kTopK, MoeScoring::kSoftmax, logits, experts, weights);
    p.align = align.params.out;
    const absl::Status st = LaunchMoeRouter(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(align.error.Download<int32_t>()[0], 1);
    EXPECT_EQ(align.num_active.Download<int32_t>()[0], 0);
    for (int64_t slot : align.token_slot.Download<int64_t>()) EXPECT_EQ(slot, -1);
    for (int32_t a : align.active.Download<int32_t>()) EXPECT_EQ(a, -1);
    for (int32_t c : align.count.Download<int32_t>()) EXPECT_EQ(c, 0);
    for (float w : weights.Download<float>()) EXPECT_EQ(w, 0.f);
  }
}

}  // namespace
}  // namespace strata::kernels
