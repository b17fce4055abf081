// RoPE kernel against the CPU backend's cpu::Rope (same inv_freq, same lane layouts), YaRN and
// default, all three lane layouts, q (many heads, strided) and k_pe (one head inside a 576-row),
// random positions up to 160K (label gpu: SKIPPED without a GPU). Lanes outside the rotated part
// must come back bit-identical.
#include "kernels/norm_rope/rope.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/model/model_config.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/rope_test_config.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::RoundBf16;
using testing::ToBf16;

using testing::RopeTestConfig;

class RopeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  // tokens x heads vectors at (token_stride, head_stride, offset) inside a random bf16 buffer,
  // rotated in place, or (out_of_place) into the vectors at lane 512 of [tokens][heads + 3][576]
  // rows of another random buffer (the absorbed decode path's query rows), x left as it was.
  void RunCase(bool yarn, model::RopeLayout layout, int tokens, int heads, int token_stride,
               int head_stride, int offset, bool out_of_place = false) {
    SCOPED_TRACE(::testing::Message()
                 << "yarn=" << yarn << " layout=" << static_cast<int>(layout)
                 << " tokens=" << tokens << " heads=" << heads << " out_of_place=" << out_of_place);
    const model::ModelConfig config = RopeTestConfig(yarn, layout);
    const cpu::Rope rope(config);
    const int dim = 64;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> buf(static_cast<size_t>(tokens) * token_stride);
    for (uint16_t& h : buf) h = ToBf16(normal(rng_));
    std::vector<int32_t> pos(tokens);
    std::uniform_int_distribution<int32_t> any_pos(0, 163839);
    const int32_t special[] = {0, 1, 4095, 4096, 163839};
    for (int t = 0; t < tokens; ++t) pos[t] = t < 5 ? special[t] : any_pos(rng_);

    // The destination: the same vectors, or those of the query rows.
    const int out_head_stride = out_of_place ? 576 : head_stride;
    const int out_token_stride = out_of_place ? (heads + 3) * 576 : token_stride;
    const int out_offset = out_of_place ? 512 : offset;
    std::vector<uint16_t> dst = buf;
    if (out_of_place) {
      dst.resize(static_cast<size_t>(tokens) * out_token_stride);
      for (uint16_t& h : dst) h = ToBf16(normal(rng_));
    }
    std::vector<uint16_t> want = dst;
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const size_t base = static_cast<size_t>(t) * token_stride + h * head_stride + offset;
        const size_t to =
            static_cast<size_t>(t) * out_token_stride + h * out_head_stride + out_offset;
        float v[64];
        for (int i = 0; i < dim; ++i) v[i] = FromBf16(buf[base + i]);
        rope.Apply(v, pos[t]);
        for (int i = 0; i < dim; ++i) want[to + i] = ToBf16(v[i]);
      }
    }
    DeviceBuffer dbuf(buf), ddst(dst), dpos(pos), dfreq(rope.inv_freq());
    RopeParams p;
    p.num_tokens = tokens;
    p.num_heads = heads;
    p.rope_dim = dim;
    p.layout = static_cast<RopeLanes>(static_cast<int>(layout));
    p.attention_factor = static_cast<float>(config.RopeAttentionFactor());
    p.x = dbuf.get<__nv_bfloat16>() + offset;
    p.token_stride = token_stride;
    p.head_stride = head_stride;
    p.positions = dpos.get<int32_t>();
    p.inv_freq = dfreq.get<float>();
    if (out_of_place) {
      p.out = ddst.get<__nv_bfloat16>() + out_offset;
      p.out_token_stride = out_token_stride;
      p.out_head_stride = out_head_stride;
    }
    const absl::Status st = LaunchRope(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    if (out_of_place) {
      EXPECT_EQ(dbuf.Download<uint16_t>(), buf) << "x must only be read";
    }
    const auto got = (out_of_place ? ddst : dbuf).Download<uint16_t>();
    ErrorSummary err;
    int64_t untouched_changed = 0, over = 0;
    for (size_t i = 0; i < dst.size(); ++i) {
      const size_t in_token = i % out_token_stride;
      const bool rotated = in_token >= static_cast<size_t>(out_offset) &&
                           (in_token - out_offset) / out_head_stride < static_cast<size_t>(heads) &&
                           (in_token - out_offset) % out_head_stride < static_cast<size_t>(dim);
      if (!rotated) {
        if (got[i] != dst[i]) ++untouched_changed;
        continue;
      }
      const float g = FromBf16(got[i]), w = FromBf16(want[i]);
      err.Add(g, w);
      // fp32 sincos vs the CPU's double cos/sin: allow a flipped bf16 rounding.
      if (!(std::abs(g - w) <= std::abs(w) * 0x1p-7f + 1e-4f)) ++over;
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_EQ(untouched_changed, 0);
    EXPECT_EQ(over, 0);
    EXPECT_LT(err.Rel(), 1e-3);
    std::printf("rope yarn=%d layout=%d tokens=%d heads=%d rel_err=%.2e max_abs=%.2e\n", yarn,
                static_cast<int>(layout), tokens, heads, err.Rel(), err.max_abs);
  }
};

TEST_F(RopeTest, MatchesCpuRopeAllLayouts) {
  for (bool yarn : {true, false}) {
    for (auto layout : {model::RopeLayout::kInterleaved, model::RopeLayout::kDeinterleaved,
                        model::RopeLayout::kHalves}) {
      // q: 16 heads of 192 (rope lanes at 128), tokens ragged.
      RunCase(yarn, layout, 37, 16, 16 * 192, 192, 128);
      // k_pe: one 64-lane vector at lane 512 of each 576-row.
      RunCase(yarn, layout, 301, 1, 576, 64, 512);
    }
  }
  RunCase(true, model::RopeLayout::kDeinterleaved, 1, 128, 128 * 192, 192, 128);
}

// q_pe of decode rows roped straight into the MLA query rows (576 lanes per head, k_pe at 512).
TEST_F(RopeTest, WritesIntoAnotherBuffer) {
  for (auto layout : {model::RopeLayout::kInterleaved, model::RopeLayout::kDeinterleaved,
                      model::RopeLayout::kHalves}) {
    RunCase(true, layout, 7, 16, 16 * 192, 192, 128, /*out_of_place=*/true);
  }
  RunCase(false, model::RopeLayout::kDeinterleaved, 1, 128, 128 * 192, 192, 128, true);
}

}  // namespace
}  // namespace strata::kernels
