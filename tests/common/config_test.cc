#include "common/config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

namespace strata {
namespace {

struct TestConfig {
  std::string level = "info";
  std::string format = "text";
  bool pinned = false;
  int64_t threads = 4;
  double ratio = 0.9;
  uint64_t dram = 64ull << 20;
  absl::Duration lease = absl::Seconds(10);
  std::vector<std::string> peers;

  void Register(ConfigSchema& s) {
    s.AddString("log.level", &level, "level");
    s.AddEnum("log.format", &format, {"text", "json"}, "format");
    s.AddBool("cache.dram.pinned", &pinned, "pin the arena");
    s.AddInt("cache.threads", &threads, "threads", 1, 64);
    s.AddDouble("cache.dram.high_watermark", &ratio, "watermark");
    s.AddBytes("cache.dram.capacity", &dram, "capacity");
    s.AddDuration("cache.lease_ttl", &lease, "lease ttl");
    s.AddStringList("cluster.peers", &peers, "peers");
  }
};

class ConfigTest : public ::testing::Test {
 protected:
  std::string WriteYaml(const std::string& text) {
    const std::string path = testing::TempDir() + "/strata_config_test_" +
                             testing::UnitTest::GetInstance()->current_test_info()->name() +
                             ".yaml";
    std::ofstream(path) << text;
    return path;
  }
  std::map<std::string, std::string> env_;
  ConfigSources Sources(std::string file = "", std::vector<std::string> overrides = {}) {
    ConfigSources s{.file = std::move(file), .overrides = std::move(overrides)};
    s.getenv = [this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    };
    return s;
  }
  TestConfig config_;
  ConfigSchema schema_;
  void SetUp() override { config_.Register(schema_); }
};

TEST_F(ConfigTest, DefaultsWhenNoSource) {
  ASSERT_TRUE(schema_.Load(Sources()).ok());
  EXPECT_EQ(config_.dram, 64ull << 20);
  EXPECT_EQ(*schema_.SourceOf("cache.dram.capacity"), ConfigSource::kDefault);
}

TEST_F(ConfigTest, PrecedenceFileThenEnvThenFlags) {
  const std::string path = WriteYaml(R"(
log:
  level: debug
  format: json
cache:
  threads: 8
  dram:
    capacity: 2GiB
    pinned: yes
  lease_ttl: 500ms
cluster:
  peers: [a:1, b:2]
)");
  env_["STRATA_CACHE_THREADS"] = "12";
  env_["STRATA_LOG_LEVEL"] = "warn";
  ASSERT_TRUE(schema_.Load(Sources(path, {"cache.threads=16"})).ok());
  EXPECT_EQ(config_.level, "warn");   // env over file
  EXPECT_EQ(config_.format, "json");  // file
  EXPECT_EQ(config_.threads, 16);     // flag over env over file
  EXPECT_EQ(config_.dram, 2ull << 30);
  EXPECT_TRUE(config_.pinned);
  EXPECT_EQ(config_.lease, absl::Milliseconds(500));
  EXPECT_EQ(config_.peers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(*schema_.SourceOf("log.level"), ConfigSource::kEnv);
  EXPECT_EQ(*schema_.SourceOf("log.format"), ConfigSource::kFile);
  EXPECT_EQ(*schema_.SourceOf("cache.threads"), ConfigSource::kFlag);
}

TEST_F(ConfigTest, UnknownFileKeyIsAnErrorWithSuggestion) {
  const std::string path = WriteYaml("cache:\n  dram:\n    capacty: 1GiB\n");
  const absl::Status st = schema_.Load(Sources(path));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unknown config key 'cache.dram.capacty'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("did you mean 'cache.dram.capacity'"), std::string::npos) << st;
  EXPECT_NE(st.message().find(":3:"), std::string::npos) << "line number missing: " << st;
}

TEST_F(ConfigTest, UnknownFlagKeyIsAnError) {
  const absl::Status st = schema_.Load(Sources("", {"cache.thread=3"}));
  EXPECT_NE(st.message().find("did you mean 'cache.threads'"), std::string::npos) << st;
  EXPECT_FALSE(schema_.Load(Sources("", {"no_equals_sign"})).ok());
}

TEST_F(ConfigTest, BadValuesAreErrorsNamingTheKey) {
  EXPECT_FALSE(schema_.Load(Sources("", {"cache.threads=lots"})).ok());
  EXPECT_FALSE(schema_.Load(Sources("", {"cache.threads=0"})).ok());  // below min
  EXPECT_FALSE(schema_.Load(Sources("", {"log.format=xml"})).ok());
  EXPECT_FALSE(schema_.Load(Sources("", {"cache.dram.capacity=12 parsecs"})).ok());
  EXPECT_FALSE(schema_.Load(Sources("", {"cache.lease_ttl=soon"})).ok());
  EXPECT_FALSE(schema_.Load(Sources("", {"cache.dram.pinned=maybe"})).ok());
  env_["STRATA_CACHE_DRAM_HIGH_WATERMARK"] = "high";
  const absl::Status st = schema_.Load(Sources());
  EXPECT_NE(st.message().find("STRATA_CACHE_DRAM_HIGH_WATERMARK"), std::string::npos) << st;
}

TEST_F(ConfigTest, StructuralErrorsInFile) {
  EXPECT_FALSE(schema_.Load(Sources(WriteYaml("cache: 5\n"))).ok());  // section scalar
  EXPECT_FALSE(schema_.Load(Sources(WriteYaml("cache:\n  threads: [1]\n"))).ok());
  EXPECT_FALSE(schema_.Load(Sources(WriteYaml("- a\n- b\n"))).ok());  // not a map
  const absl::Status st = schema_.Load(Sources(WriteYaml("log: {level: [\n")));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(schema_.Load(Sources("/nonexistent/strata.yaml")).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(schema_.Load(Sources(WriteYaml(""))).ok());  // empty file: all defaults
}

TEST_F(ConfigTest, RenderRoundTrips) {
  ASSERT_TRUE(schema_
                  .Load(Sources("", {"cache.dram.capacity=3GiB", "cluster.peers=x:1,y:2",
                                     "log.level=has: colon"}))
                  .ok());
  const std::string rendered = schema_.Render(/*annotate=*/true);
  EXPECT_NE(rendered.find("(flag)"), std::string::npos);
  EXPECT_NE(rendered.find("capacity: 3GiB"), std::string::npos) << rendered;

  TestConfig copy;
  ConfigSchema other;
  copy.Register(other);
  ASSERT_TRUE(other.Load(Sources(WriteYaml(rendered))).ok()) << rendered;
  EXPECT_EQ(copy.dram, 3ull << 30);
  EXPECT_EQ(copy.peers, config_.peers);
  EXPECT_EQ(copy.level, "has: colon");
  EXPECT_EQ(copy.lease, config_.lease);
  EXPECT_EQ(other.Render(false), schema_.Render(false));
}

TEST(ConfigBytesTest, ParsesUnits) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseBytes("2 G"), 2ull << 30);
  EXPECT_EQ(*ParseBytes("1GB"), 1000000000u);
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("MiB").ok());
  EXPECT_FALSE(ParseBytes("1.5").ok());  // not whole bytes
  EXPECT_EQ(FormatBytes(64ull << 20), "64MiB");
  EXPECT_EQ(FormatBytes(1000), "1000");
  EXPECT_EQ(ConfigSchema::EnvName("cache.dram.high-watermark"), "STRATA_CACHE_DRAM_HIGH_WATERMARK");
}

}  // namespace
}  // namespace strata
