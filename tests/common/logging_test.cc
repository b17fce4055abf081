#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace strata {
namespace {

std::vector<std::string> ReadLines(const std::string& path) {
  spdlog::default_logger()->flush();
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string TempLog(const std::string& name) {
  const std::string path = testing::TempDir() + "/strata_logging_" + name + ".log";
  std::remove(path.c_str());
  return path;
}

TEST(LoggingTest, JsonLinesCarryRequestIdAndEscapedMessage) {
  const std::string path = TempLog("json");
  ASSERT_TRUE(
      InitLogging(
          {.level = "debug", .format = LogFormat::kJson, .file = path, .component = "cache"})
          .ok());
  spdlog::info("no request");
  {
    ScopedRequestId rid("req-42");
    spdlog::warn("quote \" backslash \\ newline \n tab \t ctl \x01 done");
    {
      ScopedRequestId inner("inner");
      spdlog::debug("nested");
    }
    spdlog::error("restored");
  }
  spdlog::trace("below level");
  const auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 4u);
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["level"], "info");
  EXPECT_EQ(first["component"], "cache");
  EXPECT_EQ(first["rid"], "");
  EXPECT_EQ(first["msg"], "no request");
  EXPECT_TRUE(first["ts"].get<std::string>().ends_with("Z"));
  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["rid"], "req-42");
  EXPECT_EQ(second["msg"], "quote \" backslash \\ newline \n tab \t ctl \x01 done");
  EXPECT_EQ(nlohmann::json::parse(lines[2])["rid"], "inner");
  EXPECT_EQ(nlohmann::json::parse(lines[3])["rid"], "req-42");
}

TEST(LoggingTest, TextFormatShowsComponentAndRequestId) {
  const std::string path = TempLog("text");
  ASSERT_TRUE(InitLogging({.file = path, .component = "worker"}).ok());
  {
    ScopedRequestId rid("abc123");
    spdlog::info("prefill done");
  }
  spdlog::info("idle");
  const auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find(" I worker [abc123] prefill done"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find(" I worker [-] idle"), std::string::npos) << lines[1];
}

TEST(LoggingTest, RequestIdIsPerThread) {
  ScopedRequestId rid("main-thread");
  std::string seen_in_thread = "unset";
  std::thread([&] { seen_in_thread = std::string(CurrentRequestId()); }).join();
  EXPECT_EQ(seen_in_thread, "");
  EXPECT_EQ(CurrentRequestId(), "main-thread");
}

TEST(LoggingTest, BadOptionsAreErrors) {
  EXPECT_EQ(InitLogging({.level = "verbose"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(InitLogging({.file = "/proc/strata-no-such-dir/y.log"}).ok());
  EXPECT_TRUE(InitLogging({.level = "off"}).ok());
  LogFormat f;
  EXPECT_FALSE(ParseLogFormat("xml", &f).ok());
  EXPECT_TRUE(ParseLogFormat("json", &f).ok());
  EXPECT_EQ(f, LogFormat::kJson);
}

TEST(LoggingTest, NewRequestIdsAreHexAndDistinct) {
  const std::string a = NewRequestId(), b = NewRequestId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace strata
