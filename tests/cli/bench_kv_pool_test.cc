// `strata bench kv-pool` on the CPU backend's pool at CI size: every move it times (per page,
// batched, the pool's host buffer, and loads through an in-process cache server over shm) runs and
// round-trips (the bench exits non-zero when a page comes back different), the JSON carries each
// figure, and a bad --pool is refused clearly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/util/subprocess.h"

namespace strata {
namespace {

using testing_util::RunCommand;
using testing_util::StrataBinaryPath;

TEST(BenchKvPoolTest, HostPoolRunsEveryMoveAndReportsIt) {
  const std::string json =
      ::testing::TempDir() + "/bench-kv-pool-" + std::to_string(getpid()) + ".json";
  const auto r = RunCommand(StrataBinaryPath() + " bench kv-pool --pool host --preset tiny" +
                            " --pages 11 --repeats 2 --run-mib 1 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no JSON written\n" << r.output;
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["pool"], "host");
  EXPECT_EQ(j["pages"], 11);
  for (const char* k :
       {"import_per_page", "import_batched", "import_pinned", "export_per_page", "export_batched",
        "export_pinned", "load_through_cache_heap", "load_through_cache_pinned",
        "load_through_cache_runs", "load_through_cache_in_place", "fetch_heap", "fetch_pinned"}) {
    ASSERT_TRUE(j["gbps"].contains(k)) << k;
    EXPECT_GT(j["gbps"][k].get<double>(), 0) << k;
  }
  const double heap = j["gbps"]["load_through_cache_heap"].get<double>();
  const double pinned = j["gbps"]["load_through_cache_pinned"].get<double>();
  EXPECT_NEAR(j["ratios"]["kv_load_through_cache_pinned_vs_heap"].get<double>(), pinned / heap,
              1e-9 * pinned / heap);
  // A load through the cache does more than the import alone (lookup, read, verify).
  EXPECT_LT(pinned, j["gbps"]["fetch_pinned"].get<double>() * 1.0001);
  const double runs = j["gbps"]["load_through_cache_runs"].get<double>();
  EXPECT_NEAR(j["ratios"]["kv_load_through_cache_runs_vs_whole"].get<double>(), runs / pinned,
              1e-9 * runs / pinned);
  EXPECT_NE(r.output.find("1 MiB runs imported as they arrive"), std::string::npos) << r.output;
  // The host pool takes blocks from the server's arena (and the pages it loaded are checked).
  EXPECT_NE(r.output.find("read in place from the arena"), std::string::npos) << r.output;
  EXPECT_GT(j["ratios"]["kv_load_through_cache_in_place_vs_runs"].get<double>(), 0);
}

TEST(BenchKvPoolTest, Fp8PayloadsRunEveryMoveToo) {
  const std::string json = ::testing::TempDir() + "/bench-kv-pool-fp8.json";
  const auto r = RunCommand(StrataBinaryPath() + " bench kv-pool --pool host --preset tiny" +
                            " --pages 5 --repeats 1 --codec fp8 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(fp8 payloads)"), std::string::npos) << r.output;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["codec"], "fp8");
  EXPECT_GT(j["gbps"]["load_through_cache_in_place"].get<double>(), 0);
  const auto bad = RunCommand(StrataBinaryPath() + " bench kv-pool --pool host --codec fp4");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
}

TEST(BenchKvPoolTest, AnUnknownPoolIsRefused) {
  const auto r = RunCommand(StrataBinaryPath() + " bench kv-pool --pool tpu --preset tiny");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--pool is cuda or host"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace strata
