// kernels/moe_experts/moe_grouped.h (the prefill path of the routed experts: schedule, gather and
// two grouped wgmma GEMMs) against the CPU reference on fresh random inputs, after LaunchMoeAlign
// as the engine runs it: ragged experts of one to several 128-slot tiles, empty experts, one
// expert holding every token, sizes that are not multiples of the tiles (K tails, partial column
// tiles), invalid expert ids, the V3 expert shape (7168 x 2048, sampled slots), no tokens; outputs
// poisoned beforehand, so a slot the kernels skip fails (label gpu: SKIPPED without a GPU).
#include "kernels/moe_experts/moe_grouped.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe_experts/moe_experts.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/moe_align_buffers.h"
#include "tests/kernels/small_kernels_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::RoundBf16;
using testing::ToBf16;

struct Case {
  int tokens, experts, top_k, hidden, inter;
  bool skewed;   // every token also chooses expert 3
  bool invalid;  // two choices outside [0, E)
  int checked;   // slots compared with the reference (0: all)
};

class MoeGroupedTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
    if (!MoeGroupedApplies()) GTEST_SKIP() << "needs an sm_90 device";
  }
  std::mt19937 rng_{std::random_device{}()};

  std::vector<uint16_t> RandomBf16(size_t n, float stddev, std::vector<float>* values) {
    std::normal_distribution<float> d(0.f, stddev);
    std::vector<uint16_t> bits(n);
    values->resize(n);
    for (size_t i = 0; i < n; ++i) {
      (*values)[i] = RoundBf16(d(rng_));
      bits[i] = ToBf16((*values)[i]);
    }
    return bits;
  }
  std::vector<int32_t> Route(const Case& c) {
    std::vector<int32_t> ids(static_cast<size_t>(c.tokens) * c.top_k);
    std::vector<int32_t> all(c.experts);
    for (int t = 0; t < c.tokens; ++t) {
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng_);
      if (c.skewed) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 3));
      for (int k = 0; k < c.top_k; ++k) ids[t * c.top_k + k] = all[k];
    }
    if (c.invalid && c.tokens >= 2) {
      ids[c.top_k - 1] = c.experts;
      ids[c.top_k] = -1;
    }
    return ids;
  }

  void Run(const Case& c) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " E=" << c.experts
                                      << " k=" << c.top_k << " H=" << c.hidden << " I=" << c.inter);
    const int64_t stride = 3 * static_cast<int64_t>(c.inter) * c.hidden + 8;  // padded on purpose
    const int64_t slots = static_cast<int64_t>(c.tokens) * c.top_k;
    const int64_t ld_x = c.hidden + 8;
    std::vector<float> w, x;
    DeviceBuffer d_w(RandomBf16(stride * c.experts, 1.f / std::sqrt(float(c.hidden)), &w));
    DeviceBuffer d_x(RandomBf16(std::max<int64_t>(c.tokens, 1) * ld_x, 1.f, &x));
    const std::vector<int32_t> ids = Route(c);
    const size_t s1 = std::max<int64_t>(slots, 1);
    DeviceBuffer d_schedule(MoeGroupedScheduleBytes(slots, c.experts)), d_xs(s1 * c.hidden * 2),
        d_act(s1 * c.inter * 2), d_out(s1 * c.hidden * 2);
    testing::MoeAlignBuffers align(ids, c.tokens, c.top_k, c.experts);
    const MoeAlignParams& a = align.params;
    ASSERT_TRUE(LaunchMoeAlign(a, nullptr).ok());

    MoeGroupedParams p;
    p.num_tokens = c.tokens;
    p.top_k = c.top_k;
    p.num_experts = c.experts;
    p.hidden = c.hidden;
    p.inter = c.inter;
    p.x = d_x.get<__nv_bfloat16>();
    p.ld_x = ld_x;
    p.weights = d_w.get<__nv_bfloat16>();
    p.expert_stride = stride;
    p.expert_offset = a.out.expert_offset;
    p.slot_token = a.out.slot_token;
    p.schedule = d_schedule.get();
    p.xs = d_xs.get<__nv_bfloat16>();
    p.act = d_act.get<__nv_bfloat16>();
    p.out = d_out.get<__nv_bfloat16>();
    const absl::Status st = LaunchMoeGrouped(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());

    // The schedule: every expert's slots covered by ceil(count / 128) tiles, in expert order.
    const auto offset = align.offset.Download<int32_t>();
    const auto token_slot = align.token_slot.Download<int64_t>();
    if (slots > 0) {
      const auto sched = d_schedule.Download<int32_t>();
      int want_tiles = 0;
      for (int e = 0; e < c.experts; ++e) {
        const int tiles =
            (offset[e + 1] - offset[e] + kMoeGroupedTileRows - 1) / kMoeGroupedTileRows;
        for (int i = 0; i < tiles; ++i) {
          const int at = 4 * (1 + want_tiles + i);
          ASSERT_EQ(sched[at], e);
          ASSERT_EQ(sched[at + 1], want_tiles);
          ASSERT_EQ(sched[at + 2], tiles);
        }
        want_tiles += tiles;
      }
      ASSERT_EQ(sched[0], want_tiles);
      ASSERT_LE(want_tiles, MoeGroupedMaxTiles(slots, c.experts));
    }

    // Outputs of the checked choices (all, or an even sample) against the reference.
    const auto act = d_act.Download<uint16_t>(), out = d_out.Download<uint16_t>();
    std::vector<int64_t> choices;
    for (int64_t i = 0; i < slots; ++i) {
      if (ids[i] >= 0 && ids[i] < c.experts) choices.push_back(i);
    }
    if (c.checked > 0 && static_cast<int>(choices.size()) > c.checked) {
      std::shuffle(choices.begin(), choices.end(), rng_);
      choices.resize(c.checked);
    }
    ErrorSummary err_act, err_out;
    std::vector<float> ref_act, ref_out;
    for (const int64_t i : choices) {
      const int64_t s = token_slot[i];
      ASSERT_GE(s, 0);
      MoeExpertReference(w, stride, ids[i], c.hidden, c.inter, x.data() + (i / c.top_k) * ld_x,
                         ref_act, ref_out);
      for (int j = 0; j < c.inter; ++j) err_act.Add(FromBf16(act[s * c.inter + j]), ref_act[j]);
      for (int j = 0; j < c.hidden; ++j) err_out.Add(FromBf16(out[s * c.hidden + j]), ref_out[j]);
    }
    EXPECT_EQ(err_act.non_finite, 0);
    EXPECT_EQ(err_out.non_finite, 0);
    EXPECT_LT(err_act.Rel(), 1e-2);
    EXPECT_LT(err_out.Rel(), 1e-2);
    std::printf(
        "grouped tokens %4d E %3d k %d H %5d I %5d: act rel %.2e  out rel %.2e  (%zu of "
        "%lld slots)\n",
        c.tokens, c.experts, c.top_k, c.hidden, c.inter, err_act.Rel(), err_out.Rel(),
        choices.size(), static_cast<long long>(slots));
  }
};

TEST_F(MoeGroupedTest, MatchesReference) {
  for (const Case& c : std::vector<Case>{
           {300, 16, 4, 256, 192, false, false, 0},    // ~75 slots per expert; I past a 128 tile
           {200, 8, 2, 136, 88, true, false, 0},       // 200 slots on expert 3 (2 tiles); K tail
           {40, 64, 6, 64, 32, false, true, 0},        // empty experts, bad ids, K below a step
           {3, 4, 1, 520, 264, false, false, 0},       // fewer slots than a tile
           {512, 8, 2, 7168, 2048, false, false, 24},  // the V3 expert, ~128 slots per expert
           {0, 8, 2, 64, 32, false, false, 0},         // no tokens
       }) {
    Run(c);
  }
}

// Argument checks touch no device: they run without a GPU too.
TEST(MoeGroupedParamsTest, RejectsBadParams) {
  alignas(16) static __nv_bfloat16 buf[64];
  alignas(16) static int32_t ints[64];
  MoeGroupedParams p;
  EXPECT_FALSE(ValidateMoeGroupedParams(p).ok());
  p.num_tokens = 1;
  p.top_k = 1;
  p.num_experts = 1;
  p.hidden = 8;
  p.inter = 8;
  p.x = p.weights = buf;
  p.ld_x = 8;
  p.expert_stride = 3 * 8 * 8;
  p.expert_offset = p.slot_token = ints;
  p.schedule = ints;
  p.xs = p.act = p.out = buf;
  EXPECT_TRUE(ValidateMoeGroupedParams(p).ok());
  MoeGroupedParams q = p;
  q.hidden = 12;
  EXPECT_FALSE(ValidateMoeGroupedParams(q).ok()) << "hidden not a multiple of 8";
  q = p;
  q.expert_stride = 3 * 8 * 8 - 8;
  EXPECT_FALSE(ValidateMoeGroupedParams(q).ok()) << "experts overlap";
  q = p;
  q.num_experts = kMoeAlignMaxExperts + 1;
  EXPECT_FALSE(ValidateMoeGroupedParams(q).ok());
  q = p;
  q.xs = buf + 1;
  EXPECT_FALSE(ValidateMoeGroupedParams(q).ok()) << "misaligned workspace";
  q = p;
  q.slot_token = nullptr;
  EXPECT_FALSE(ValidateMoeGroupedParams(q).ok()) << "no alignment arrays";
}

}  // namespace
}  // namespace strata::kernels
