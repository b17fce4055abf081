// Greedy sampling kernel against std::max_element (the CPU sampler's greedy rule: the first
// maximum), on fresh random logits with planted ties before and after the maximum, several vocab
// sizes incl. DeepSeek's 102400 / 129280, strided rows (label gpu: SKIPPED without a GPU).
#include "kernels/sampling/greedy_sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;

TEST(GreedySampleTest, FirstMaximumLikeTheCpuSampler) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int vocab : {1, 100, 4097, 102400, 129280}) {
    for (int rows : {1, 7, 64}) {
      const int ld = vocab + 5;
      std::vector<float> logits(static_cast<size_t>(rows) * ld);
      for (float& x : logits) x = normal(rng);
      std::uniform_int_distribution<int> any(0, vocab - 1);
      for (int r = 0; r < rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * ld;
        if (r % 3 == 1) {  // ties: the maximum copied to two other places
          const int at = static_cast<int>(std::max_element(row, row + vocab) - row);
          row[any(rng)] = row[at];
          row[any(rng)] = row[at];
        } else if (r % 3 == 2) {  // a row of equal values: index 0
          std::fill(row, row + vocab, 1.25f);
        }
        for (int j = vocab; j < ld; ++j) row[j] = 1e30f;  // padding must not be read
      }
      DeviceBuffer dlogits(logits), dtokens(static_cast<size_t>(rows) * 4);
      GreedySampleParams p;
      p.rows = rows;
      p.vocab = vocab;
      p.logits = dlogits.get<float>();
      p.ld_logits = ld;
      p.tokens = dtokens.get<int32_t>();
      const absl::Status st = LaunchGreedySample(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const auto got = dtokens.Download<int32_t>();
      int mismatches = 0;
      for (int r = 0; r < rows; ++r) {
        const float* row = logits.data() + static_cast<size_t>(r) * ld;
        const int want = static_cast<int>(std::max_element(row, row + vocab) - row);
        if (got[r] != want) ++mismatches;
      }
      EXPECT_EQ(mismatches, 0) << "vocab=" << vocab << " rows=" << rows;
      std::printf("greedy_sample vocab=%d rows=%d mismatches=%d\n", vocab, rows, mismatches);
    }
  }
}

}  // namespace
}  // namespace strata::kernels
