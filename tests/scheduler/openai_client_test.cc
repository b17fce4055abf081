// The official OpenAI Node client against the gateway (streaming chat, non-streaming
// completion, error cases). Needs node and the npm `openai` package (scripts/fetch-npm.sh).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/paths.h"
#include "scheduler/http/gateway_server.h"
#include "tests/scheduler/scripted_test_backend.h"

namespace strata::scheduler {
namespace {

TEST(OpenAiClientTest, OfficialClientTalksToTheGateway) {
  const std::string npm = NpmDir();
  ASSERT_TRUE(std::filesystem::exists(npm + "/node_modules/openai/package.json"))
      << "npm package 'openai' missing under " << npm << " (run scripts/fetch-npm.sh)";
  ASSERT_EQ(std::system("node --version > /dev/null 2>&1"), 0) << "node is not installed";
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "STRATA_SOURCE_DIR is not set (run through ctest)";

  testing_backend::ScriptedTestBackend backend;
  GatewayOptions options;
  options.api_keys = {"sk-test"};
  GatewayServer server(options, &backend);
  ASSERT_TRUE(server.Start().ok());
  const std::string command =
      std::string("node ") + source + "/tests/scheduler/openai_client_check.cjs '" + npm +
      "' http://127.0.0.1:" + std::to_string(server.port()) + "/v1 sk-test 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) output += buf.data();
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("openai client checks passed"), std::string::npos) << output;
}

}  // namespace
}  // namespace strata::scheduler
