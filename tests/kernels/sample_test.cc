// The sampling kernel against the CPU sampler's rule (runtime::PickToken): fresh random logits
// with planted ties, equal rows and signed zeros, ragged row strides, and per row its own
// temperature, top-k, top-p and uniform draw, over vocab sizes up to DeepSeek's 129280 (label
// gpu: SKIPPED without a GPU). Every pick must be the CPU's.
#include "kernels/sampling/sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "compute_nodes/runtime/sampler.h"
#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;

TEST(SampleTest, EveryPickIsTheCpuSamplers) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.6f};
  const float top_ps[] = {1.0f, 0.95f, 0.6f, 1e-4f};
  int total = 0, sampled = 0, mismatches = 0;
  for (int vocab : {1, 7, 1000, 102400, 129280}) {
    const int top_ks[] = {0, 1, 2, 40, vocab, vocab + 3};
    for (int rows : {1, 13, 64}) {
      const int ld = vocab + 3;
      std::vector<float> logits(static_cast<size_t>(rows) * ld);
      for (float& x : logits) x = normal(rng);
      std::uniform_int_distribution<int> any(0, vocab - 1);
      std::vector<runtime::TokenDraw> want(rows);
      std::vector<SampleRowDraw> draws(rows);
      for (int r = 0; r < rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * ld;
        switch (r % 4) {
          case 1: {  // ties: the maximum and another value copied to other places
            const int at = static_cast<int>(std::max_element(row, row + vocab) - row);
            row[any(rng)] = row[at];
            row[any(rng)] = row[at];
            const float other = row[any(rng)];
            for (int t = 0; t < 5; ++t) row[any(rng)] = other;
            break;
          }
          case 2:  // a row of equal values
            std::fill(row, row + vocab, 1.25f);
            break;
          case 3:  // signed zeros compare equal, as on the CPU
            for (int t = 0; t < 4; ++t) row[any(rng)] = t % 2 ? 0.0f : -0.0f;
            break;
        }
        for (int j = vocab; j < ld; ++j) row[j] = 1e30f;  // padding must not be read
        runtime::TokenDraw d{.temperature = temps[rng() % 5],
                             .top_k = top_ks[rng() % 6],
                             .top_p = top_ps[rng() % 4],
                             .uniform = unit(rng)};
        want[r] = d;
        draws[r] = {.temperature = d.temperature,
                    .top_p = d.top_p,
                    .top_k = static_cast<int32_t>(d.top_k),
                    .uniform = d.uniform};
      }
      DeviceBuffer dlogits(logits), ddraws(draws), dtokens(static_cast<size_t>(rows) * 4);
      SampleParams p;
      p.rows = rows;
      p.vocab = vocab;
      p.logits = dlogits.get<float>();
      p.ld_logits = ld;
      p.draws = ddraws.get<SampleRowDraw>();
      p.tokens = dtokens.get<int32_t>();
      const absl::Status st = LaunchSample(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const auto got = dtokens.Download<int32_t>();
      for (int r = 0; r < rows; ++r) {
        const float* row = logits.data() + static_cast<size_t>(r) * ld;
        const int32_t cpu = runtime::PickToken(want[r], {row, static_cast<size_t>(vocab)});
        ++total;
        sampled += !want[r].greedy();
        if (got[r] != cpu) {
          ++mismatches;
          ADD_FAILURE() << "vocab " << vocab << " row " << r << ": gpu " << got[r] << " cpu " << cpu
                        << " (T " << want[r].temperature << ", k " << want[r].top_k << ", p "
                        << want[r].top_p << ", u " << want[r].uniform << ")";
        }
      }
    }
  }
  std::printf("sample: %d rows (%d sampled, the rest greedy), %d mismatches\n", total, sampled,
              mismatches);
  EXPECT_GT(sampled, total / 2);
}

// The same logits sampled many times at temperature 1: the picks follow the softmax (a check of
// the whole distribution, not only of the CPU rule's corner cases).
TEST(SampleTest, FrequenciesFollowTheSoftmax) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int kVocab = 6, kRows = 4096;
  const float row[kVocab] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  std::vector<float> logits;
  for (int r = 0; r < kRows; ++r) logits.insert(logits.end(), row, row + kVocab);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<SampleRowDraw> draws(kRows);
  for (auto& d : draws) d = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .uniform = unit(rng)};
  DeviceBuffer dlogits(logits), ddraws(draws), dtokens(kRows * 4);
  SampleParams p{.rows = kRows,
                 .vocab = kVocab,
                 .logits = dlogits.get<float>(),
                 .ld_logits = kVocab,
                 .draws = ddraws.get<SampleRowDraw>(),
                 .tokens = dtokens.get<int32_t>()};
  ASSERT_TRUE(LaunchSample(p, nullptr).ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const auto got = dtokens.Download<int32_t>();
  double z = 0;
  for (float x : row) z += std::exp(x);
  std::vector<int> count(kVocab, 0);
  for (int32_t t : got) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kVocab);
    ++count[t];
  }
  for (int i = 0; i < kVocab; ++i) {
    const double expect = kRows * std::exp(row[i]) / z;
    EXPECT_NEAR(count[i], expect, 5 * std::sqrt(expect) + 2) << "token " << i;
  }
}

}  // namespace
}  // namespace strata::kernels
