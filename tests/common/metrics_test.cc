#include "common/metrics.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace strata {
namespace {

TEST(MetricsTest, CountersGaugesHistogramsRender) {
  MetricsRegistry r;
  auto& hits = r.AddCounter("strata_test_hits_total", "Hits by tier", {"tier"});
  hits.Labels({"dram"}).Increment();
  hits.Labels({"dram"}).Increment(2);
  hits.Labels({"ssd"}).Increment(-5);  // ignored
  r.AddGauge("strata_test_used_bytes", "Used bytes").Labels({}).Set(1.5e9);
  auto& lat = r.AddHistogram("strata_test_latency_seconds", "Latency", {"op"}, {0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.005, 0.005, 0.05, 5.0}) lat.Labels({"get"}).Observe(v);

  const std::string text = r.RenderPrometheus();
  EXPECT_NE(text.find("# TYPE strata_test_hits_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_test_hits_total{tier=\"dram\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_test_hits_total{tier=\"ssd\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_test_used_bytes 1500000000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_test_latency_seconds_bucket{op=\"get\",le=\"0.001\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_test_latency_seconds_bucket{op=\"get\",le=\"0.01\"} 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_test_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 5\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_test_latency_seconds_count{op=\"get\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("strata_test_latency_seconds_sum{op=\"get\"} 5.0605\n"), std::string::npos)
      << text;
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  MetricsRegistry r;
  r.AddCounter("strata_test_escape_total", "Help with \\ and\nnewline", {"path"})
      .Labels({"a\"b\\c\nd"})
      .Increment();
  const std::string text = r.RenderPrometheus();
  EXPECT_NE(text.find(R"(strata_test_escape_total{path="a\"b\\c\nd"} 1)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("# HELP strata_test_escape_total Help with \\\\ and\\nnewline\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, SameFamilyTwiceIsTheSameFamily) {
  MetricsRegistry r;
  auto& a = r.AddCounter("strata_test_same_total", "x", {"k"});
  auto& b = r.AddCounter("strata_test_same_total", "x", {"k"});
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(&a.Labels({"v"}), &b.Labels({"v"}));
}

TEST(MetricsDeathTest, ShapeClashAborts) {
  MetricsRegistry r;
  r.AddCounter("strata_test_clash", "x", {"k"});
  EXPECT_DEATH(r.AddGauge("strata_test_clash", "x", {"k"}), "different shapes");
  EXPECT_DEATH(r.AddCounter("bad name", "x"), "check failed");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  Counter& c = r.AddCounter("strata_test_concurrent_total", "x").Labels({});
  Histogram& h = r.AddHistogram("strata_test_concurrent_seconds", "x", {}, {1.0}).Labels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c.Increment();
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Value(), 400000);
  EXPECT_EQ(h.Count(), 400000u);
  EXPECT_EQ(h.BucketCounts()[0], 400000u);
}

// The output must satisfy Prometheus' own linter. promtool ships in Debian's `prometheus`
// package, which scripts/install-deps.sh installs; its absence is a failure, not a skip.
TEST(MetricsTest, PromtoolAcceptsOutput) {
  MetricsRegistry r;
  r.AddCounter("strata_cache_hits_total", "Blocks served from a tier", {"tier"})
      .Labels({"dram"})
      .Increment(7);
  r.AddGauge("strata_cache_used_bytes", "Bytes used in a tier", {"tier"}).Labels({"ssd"}).Set(42);
  r.AddHistogram("strata_cache_lookup_seconds", "Lookup latency", {},
                 ExponentialBuckets(1e-6, 4, 8))
      .Labels({})
      .Observe(3e-5);
  const std::string path = testing::TempDir() + "/strata_metrics_test.prom";
  std::ofstream(path) << r.RenderPrometheus();

  ASSERT_EQ(std::system("command -v promtool >/dev/null 2>&1"), 0)
      << "promtool not found: run scripts/install-deps.sh (Debian package 'prometheus')";
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << "promtool complained:\n" << output;
}

}  // namespace
}  // namespace strata
