#include "scheduler/cost_model.h"

#include <gtest/gtest.h>

#include <random>

namespace strata::scheduler {
namespace {

TEST(CostModelTest, PrefillGrowsWithContext) {
  PrefillModel m;
  EXPECT_EQ(m.Predict(0, 1000), 0);
  // The same number of new tokens costs more after a longer cached context (attention).
  EXPECT_GT(m.Predict(1000, 30000), m.Predict(1000, 0));
  // Reusing half the prompt is cheaper than computing all of it.
  EXPECT_LT(m.Predict(8000, 8000), m.Predict(16000, 0));
}

TEST(CostModelTest, LoadTimeFollowsTierBandwidth) {
  TierModel t;
  t.local_bandwidth = {1e12, 50e9, 10e9};
  t.network_bandwidth = 25e9;
  t.fixed_latency_s = 0;
  t.kv_bytes_per_token = 1000;
  EXPECT_EQ(t.LoadSeconds({0, 0, 0}, 64, false), 0);
  // Local GPU blocks need no copy.
  EXPECT_EQ(t.LoadSeconds({10, 0, 0}, 64, false), 0);
  const double dram = t.LoadSeconds({0, 10, 0}, 64, false);
  const double ssd = t.LoadSeconds({0, 0, 10}, 64, false);
  EXPECT_DOUBLE_EQ(dram, 10 * 64 * 1000 / 50e9);
  EXPECT_DOUBLE_EQ(ssd, 10 * 64 * 1000 / 10e9);
  // Remote: limited by the network even from GPU or DRAM.
  EXPECT_DOUBLE_EQ(t.LoadSeconds({0, 10, 0}, 64, true), 10 * 64 * 1000 / 25e9);
  EXPECT_DOUBLE_EQ(t.LoadSeconds({0, 0, 10}, 64, true), ssd);
}

TEST(CostModelTest, CalibratorRecoversTheTrueModel) {
  PrefillModel truth{0.03, 40e-6, 2.5e-9};
  PrefillCalibrator calibrator(PrefillModel{0.01, 10e-6, 0.5e-9}, 1.0);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> fresh(100, 20000), cached(0, 40000);
  for (int i = 0; i < 500; ++i) {
    const double n = fresh(rng), c = cached(rng);
    calibrator.Observe(n, c, truth.Predict(n, c));
  }
  const PrefillModel fit = calibrator.Model();
  EXPECT_NEAR(fit.per_token_s, truth.per_token_s, truth.per_token_s * 0.02);
  EXPECT_NEAR(fit.per_pair_s, truth.per_pair_s, truth.per_pair_s * 0.02);
  EXPECT_NEAR(fit.base_s, truth.base_s, 0.005);
  EXPECT_NEAR(fit.Predict(10000, 10000), truth.Predict(10000, 10000),
              truth.Predict(10000, 10000) * 0.02);
}

TEST(CostModelTest, CalibratorIgnoresGarbageAndKeepsPriorUntilEnoughData) {
  PrefillModel prior;
  PrefillCalibrator calibrator(prior);
  calibrator.Observe(-5, 0, 1);
  calibrator.Observe(100, 0, std::numeric_limits<double>::infinity());
  calibrator.Observe(100, 0, 0);
  EXPECT_EQ(calibrator.observations(), 0u);
  calibrator.Observe(1000, 0, 0.1);
  EXPECT_EQ(calibrator.Model().per_token_s, prior.per_token_s);
}

TEST(CostModelTest, DecodeStepGrowsWithBatchAndContext) {
  DecodeModel d;
  EXPECT_GT(d.StepSeconds(10, 0), d.StepSeconds(1, 0));
  EXPECT_GT(d.StepSeconds(1, 1e6), d.StepSeconds(1, 0));
}

}  // namespace
}  // namespace strata::scheduler
