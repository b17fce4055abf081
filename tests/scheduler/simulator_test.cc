#include "scheduler/simulator/simulator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "scheduler/simulator/replay_command.h"
#include "scheduler/simulator/report.h"
#include "scheduler/simulator/trace.h"

namespace strata::scheduler::sim {
namespace {

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

TEST(TraceTest, ParsesMooncakeLinesAndSortsByArrival) {
  const std::string path = WriteTemp(
      "trace_ok.jsonl",
      "{\"timestamp\": 2000, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [0, 1, "
      "2]}\n"
      "\n"
      "{\"timestamp\": 500, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [7]}\n");
  auto trace = LoadMooncakeTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 2u);
  EXPECT_DOUBLE_EQ((*trace)[0].arrival_s, 0.5);
  EXPECT_EQ((*trace)[1].input_tokens, 1100u);
  // 1100 tokens: two full 512-token blocks; the partial third is not cacheable.
  EXPECT_EQ(FullBlockKeys((*trace)[1], 512).size(), 2u);
}

TEST(TraceTest, ErrorsNameTheFileAndLine) {
  EXPECT_TRUE(absl::IsNotFound(LoadMooncakeTrace(::testing::TempDir() + "/absent.jsonl").status()));
  const std::string path =
      WriteTemp("trace_bad.jsonl",
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n"
                "{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [0]}\n");
  const absl::Status s = LoadMooncakeTrace(path).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(std::string(s.message()).find(":2: missing output_length"), std::string::npos) << s;
  const std::string junk = WriteTemp("trace_junk.jsonl", "{not json\n");
  EXPECT_TRUE(absl::IsInvalidArgument(LoadMooncakeTrace(junk).status()));
}

TEST(TraceTest, UnlimitedCacheBoundCountsRepeatedPrefixes) {
  std::vector<TraceRequest> trace(2);
  trace[0] = {0, 1024, 1, {1, 2}};
  trace[1] = {1, 1536, 1, {1, 2, 3}};
  // Second request reuses 1024 of its 1536 tokens: 1024 / (1024 + 1536).
  EXPECT_DOUBLE_EQ(UnlimitedCacheHitRatio(trace, 512), 1024.0 / 2560.0);
}

// A small synthetic trace: 8 "documents" of 16 blocks, each queried 12 times with a fresh
// 2-block suffix, arriving faster than one node can serve.
std::vector<TraceRequest> SyntheticTrace() {
  std::vector<TraceRequest> trace;
  uint64_t next_suffix = 1000;
  for (int round = 0; round < 12; ++round) {
    for (int doc = 0; doc < 8; ++doc) {
      TraceRequest r;
      r.arrival_s = (round * 8 + doc) * 0.15;
      r.input_tokens = 18 * 512;
      r.output_tokens = 20;
      for (int b = 0; b < 16; ++b) r.hash_ids.push_back(doc * 100 + b);
      r.hash_ids.push_back(next_suffix++);
      r.hash_ids.push_back(next_suffix++);
      trace.push_back(r);
    }
  }
  return trace;
}

SimulationOptions SmallCluster() {
  SimulationOptions options;
  options.cluster.prefill_nodes = 4;
  options.cluster.decode_nodes = 2;
  return options;
}

TEST(SimulatorTest, EveryRequestCompletesUnderEveryPolicy) {
  const auto trace = SyntheticTrace();
  for (const std::string& policy : PolicyNames()) {
    SimulationOptions options = SmallCluster();
    options.policy = policy;
    auto result = Simulate(trace, options);
    ASSERT_TRUE(result.ok()) << policy << ": " << result.status();
    ASSERT_EQ(result->requests.size(), trace.size());
    for (const RequestOutcome& r : result->requests) {
      EXPECT_FALSE(r.rejected) << policy;
      EXPECT_GT(r.ttft_s, 0) << policy;
      EXPECT_GT(r.tbt_s, 0) << policy;
      EXPECT_LE(r.cached_tokens, r.prompt_tokens);
    }
  }
}

TEST(SimulatorTest, StrataReachesTheCacheBoundOnTheSyntheticTrace) {
  const auto trace = SyntheticTrace();
  SimulationOptions options = SmallCluster();
  options.policy = "strata";
  auto strata = Simulate(trace, options);
  options.policy = "random";
  auto random = Simulate(trace, options);
  ASSERT_TRUE(strata.ok() && random.ok());
  const PolicySummary s = Summarize(*strata, options.objectives);
  const PolicySummary r = Summarize(*random, options.objectives);
  const double bound = UnlimitedCacheHitRatio(trace, 512);
  EXPECT_GE(s.token_hit_ratio, 0.9 * bound);
  EXPECT_GT(s.token_hit_ratio, r.token_hit_ratio);
  EXPECT_LT(s.ttft_s.mean, r.ttft_s.mean);
}

TEST(SimulatorTest, RejectionIsReportedNotDropped) {
  auto trace = SyntheticTrace();
  for (TraceRequest& r : trace) r.arrival_s = 0;  // everything at once
  SimulationOptions options = SmallCluster();
  options.cluster.prefill_nodes = 1;
  options.policy = "strata";
  options.objectives.ttft_s = 1;
  options.objectives.reject_factor = 2;
  auto result = Simulate(trace, options);
  ASSERT_TRUE(result.ok());
  const PolicySummary s = Summarize(*result, options.objectives);
  EXPECT_GT(s.rejected, 0u);
  EXPECT_GT(s.completed, 0u);
  EXPECT_EQ(s.rejected + s.completed, trace.size());
}

TEST(SimulatorTest, ReportsRenderJsonAndSvg) {
  ReplayReport report;
  report.trace = "synthetic <test>";
  const auto trace = SyntheticTrace();
  for (const std::string policy : {"least_loaded", "strata"}) {
    SimulationOptions options = SmallCluster();
    options.policy = policy;
    report.policies.push_back(Summarize(*Simulate(trace, options), options.objectives));
  }
  const std::string json = ReportJson(report);
  EXPECT_NE(json.find("\"token_hit_ratio\""), std::string::npos);
  EXPECT_NE(json.find("\"strata\""), std::string::npos);
  const std::string svg = ReportSvg(report);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;test&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<') - std::count(svg.begin(), svg.end(), '>'), 0);
}

// The targets, on the real Mooncake trace and the default modelled cluster.
TEST(SimulatorTest, RealTraceMeetsTheTargets) {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "STRATA_SOURCE_DIR is not set (run through ctest)";
  const std::string path = std::string(source) + "/../shared/data/traces/synthetic_trace.jsonl";
  ASSERT_TRUE(std::filesystem::exists(path))
      << "the Mooncake trace is missing: expected " << path
      << " (CI copies shared/ next to the clone as ../shared)";
  ReplayOptions options;
  options.trace_path = path;
  auto report = RunReplay(options);
  ASSERT_TRUE(report.ok()) << report.status();
  std::map<std::string, PolicySummary> by_name;
  for (const PolicySummary& s : report->policies) by_name[s.policy] = s;
  const PolicySummary& strata = by_name.at("strata");
  const PolicySummary& least = by_name.at("least_loaded");
  const PolicySummary& random = by_name.at("random");
  EXPECT_EQ(strata.requests, 3993u);
  EXPECT_GE(strata.token_hit_ratio, 0.9 * report->unlimited_hit_ratio);
  EXPECT_LE(strata.ttft_s.mean, 0.55 * least.ttft_s.mean);
  EXPECT_LE(strata.ttft_s.mean, 0.2 * random.ttft_s.mean);
  EXPECT_LT(strata.ttft_s.p90, least.ttft_s.p90);
  EXPECT_LT(strata.ttft_s.p90, random.ttft_s.p90);
  EXPECT_EQ(strata.rejected, 0u);
  std::cout << ReportTable(*report);
}

}  // namespace
}  // namespace strata::scheduler::sim
