// `strata bench store` as a user runs it, at a size CI affords: every case runs, the raw O_DIRECT
// baseline reads the SSD tier's own slots, the ratios are the medians of the rounds, and the Redis
// server the bench starts is gone when it exits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/util/subprocess.h"

namespace strata {
namespace {

using testing_util::RunCommand;
using testing_util::StrataBinaryPath;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

TEST(BenchStoreTest, EveryCaseRunsAndRatiosAreTheMediansOfTheRounds) {
  const std::string json =
      ::testing::TempDir() + "/bench-store-" + std::to_string(getpid()) + ".json";
  const auto r = RunCommand(StrataBinaryPath() +
                            " bench store --sizes 64KiB,128KiB --clients 2 --ops 8 --batch 4"
                            " --rounds 3 --json " +
                            json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no JSON written\n" << r.output;
  const nlohmann::json j = nlohmann::json::parse(in);

  // Every system, operation, transport and tier, for both sizes, in each of the 3 rounds.
  std::map<std::string, int> seen;
  for (const auto& res : j["results"]) {
    EXPECT_GT(res["gb_per_s"].get<double>(), 0) << res.dump();
    seen[res["system"].get<std::string>() + "/" + res["op"].get<std::string>() + "/" +
         res["transport"].get<std::string>() + "/" + res["tier"].get<std::string>()]++;
  }
  const std::map<std::string, int> want = {
      {"strata/put/shm/dram", 6},    {"strata/get/shm/dram", 6}, {"strata/get/shm/ssd", 6},
      {"strata/put/tcp/dram", 6},    {"strata/get/tcp/dram", 6}, {"strata/get/tcp/ssd", 6},
      {"redis/put/tcp/dram", 12},    {"redis/get/tcp/dram", 12},  // unbatched and pipelined
      {"raw_odirect/read/-/ssd", 12}};                            // beside each SSD case
  EXPECT_EQ(seen, want);

  // The reported ratios are the medians of the per-round ones.
  ASSERT_EQ(j["rounds"].get<int>(), 3);
  ASSERT_EQ(j["ratio_rounds"].size(), 3u);
  for (const char* name : {"get_shm_vs_redis_1MiB", "get_tcp_vs_redis_1MiB",
                           "put_tcp_vs_redis_1MiB", "ssd_read_vs_raw"}) {
    std::vector<double> rounds;
    for (const auto& round : j["ratio_rounds"]) rounds.push_back(round[name].get<double>());
    EXPECT_GT(Median(rounds), 0) << name;
    EXPECT_DOUBLE_EQ(j["ratios"][name].get<double>(), Median(rounds)) << name;
  }
  // The Redis server it started is gone.
  EXPECT_NE(RunCommand("pgrep -f 'redis-serve[r] 127[.]0[.]0[.]1'").exit_code, 0)
      << "a redis-server is still running after the bench";
}

TEST(BenchStoreTest, TransportsAndRedisCanBeLeftOutAndTheirRatiosWithThem) {
  const std::string json =
      ::testing::TempDir() + "/bench-store-tcp-" + std::to_string(getpid()) + ".json";
  const auto r = RunCommand(StrataBinaryPath() +
                            " bench store --sizes 64KiB --clients 2 --ops 8 --batch 4 --rounds 1"
                            " --transports tcp --redis false --tcp-connections 3"
                            " --tcp-threads 2 --json " +
                            json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no JSON written\n" << r.output;
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<std::string> systems, transports;
  for (const auto& res : j["results"]) {
    systems.insert(res["system"].get<std::string>());
    transports.insert(res["transport"].get<std::string>());
  }
  EXPECT_EQ(systems, (std::set<std::string>{"strata", "raw_odirect"}));
  EXPECT_EQ(transports, (std::set<std::string>{"tcp", "-"}));
  // Only what was measured has a ratio: no Redis, and the SSD ratio is taken over shm.
  EXPECT_TRUE(j["ratios"].empty()) << j["ratios"].dump();
  // A transport the bench does not know is refused before anything runs.
  EXPECT_NE(RunCommand(StrataBinaryPath() + " bench store --transports udp").exit_code, 0);
}

}  // namespace
}  // namespace strata
