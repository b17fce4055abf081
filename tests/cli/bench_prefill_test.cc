// `strata bench prefill` on the CPU backend at CI size: the calls it times, the FLOPs it counts
// (against model::PrefillFlops of the checkpoint's own config, for its prompt and batch) and the
// figures derived from them; and the clear refusal of a preset on a backend that cannot draw one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "compute_nodes/model/flops.h"
#include "compute_nodes/model/model_config.h"
#include "tests/util/subprocess.h"

namespace strata {
namespace {

using testing_util::RunCommand;
using testing_util::StrataBinaryPath;

class BenchPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/bench-prefill-" + std::to_string(getpid());
    const auto made =
        RunCommand(StrataBinaryPath() + " model make-random --preset tiny --out " + dir_ + "/m");
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  void TearDown() override { (void)RunCommand("rm -rf " + dir_); }
  std::string dir_;
};

TEST_F(BenchPrefillTest, TimesTheCallsAndCountsTheModelsFlops) {
  const std::string json = dir_ + "/out.json";
  const auto r = RunCommand(StrataBinaryPath() + " bench prefill --backend cpu --model " + dir_ +
                            "/m --prompt 48 --batch 2 --repeats 3 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no JSON written\n" << r.output;
  const nlohmann::json j = nlohmann::json::parse(in);

  ASSERT_EQ(j["ms"].size(), 3u);  // the warm-up call is not among them
  for (const auto& ms : j["ms"]) EXPECT_GT(ms.get<double>(), 0);

  auto config = model::LoadModelConfig(dir_ + "/m/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const model::ForwardFlops f = model::PrefillFlops(*config, 48, 0, 1);
  const auto& flops = j["flops"];
  EXPECT_DOUBLE_EQ(flops["total"].get<double>(), 2 * f.total());
  EXPECT_DOUBLE_EQ(flops["attention"].get<double>(), 2 * f.attention);
  EXPECT_DOUBLE_EQ(flops["projections"].get<double>() + flops["attention"].get<double>() +
                       flops["mlp"].get<double>() + flops["lm_head"].get<double>(),
                   flops["total"].get<double>());

  const double med = j["ms_median"].get<double>();
  EXPECT_NEAR(j["tflops"].get<double>(), 2 * f.total() / (med * 1e-3) / 1e12,
              1e-9 * j["tflops"].get<double>());
  EXPECT_NEAR(j["ratios"]["prefill_48_mfu"].get<double>(), j["tflops"].get<double>() / 790, 1e-12);
  EXPECT_NEAR(j["tokens_per_second"].get<double>(), 96 / (med * 1e-3), 1e-6);
}

TEST_F(BenchPrefillTest, PresetWithoutTheGpuBackendIsAClearError) {
  const auto r = RunCommand(StrataBinaryPath() + " bench prefill --backend cpu --prompt 16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pass --model"), std::string::npos) << r.output;
  const auto bad = RunCommand(StrataBinaryPath() + " bench prefill --backend cpu --model " + dir_ +
                              "/m --prompt 0");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

}  // namespace
}  // namespace strata
