#include <gtest/gtest.h>

#include "common/metrics.h"
#include "nlohmann/json.hpp"
#include "scheduler/http/gateway_server.h"
#include "tests/scheduler/http_test_client.h"
#include "tests/scheduler/scripted_test_backend.h"

namespace strata::scheduler {
namespace {

using nlohmann::json;
using testing_backend::ScriptedTestBackend;
using testing_http::Client;
using testing_http::Reply;

std::string ChatBody(const std::string& content, bool stream = false,
                     const std::string& extra = "") {
  return "{\"model\": \"strata-test\", \"messages\": [{\"role\": \"user\", \"content\": " +
         json(content).dump() + "}], \"stream\": " + (stream ? "true" : "false") + extra + "}";
}

class GatewayTest : public ::testing::Test {
 protected:
  void StartServer(GatewayOptions options = {}) {
    server_ = std::make_unique<GatewayServer>(options, &backend_);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_NE(server_->port(), 0);
  }
  uint16_t port() const { return server_->port(); }
  void ExpectError(const Reply& r, int status, const std::string& type, const std::string& code) {
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["type"], type) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (!code.empty()) {
      EXPECT_EQ(j["error"]["code"], code) << r.body;
    }
  }
  // The gateway still answers a fresh, valid request.
  void ExpectStillServing() {
    Client c(port());
    EXPECT_EQ(c.Send("POST", "/v1/chat/completions", ChatBody("still there?")).status, 200);
  }

  ScriptedTestBackend backend_;
  std::unique_ptr<GatewayServer> server_;
};

TEST_F(GatewayTest, ModelsAndHealth) {
  StartServer();
  Client c(port());
  Reply r = c.Send("GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "strata-test");
  EXPECT_EQ(c.Send("GET", "/healthz").status, 200);  // same keep-alive connection
}

TEST_F(GatewayTest, NonStreamingChatAndCompletion) {
  StartServer();
  Client c(port());
  Reply r = c.Send("POST", "/v1/chat/completions", ChatBody("hello", false, ", \"max_tokens\": 3"));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
  EXPECT_TRUE(j["usage"]["strata"]["cached_tokens_by_tier"]["dram"].is_number());

  r = c.Send("POST", "/v1/completions",
             R"({"model": "strata-test", "prompt": "Once upon", "max_tokens": 20})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(GatewayTest, StreamingChatSendsSseChunksUsageAndDone) {
  StartServer();
  Client c(port());
  Reply r = c.Send("POST", "/v1/chat/completions",
                   ChatBody("stream me", true, R"(, "stream_options": {"include_usage": true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/event-stream");
  std::string text;
  int events = 0;
  bool done = false, usage = false;
  size_t pos = 0;
  while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r.body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string data = r.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json j = json::parse(data);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    ++events;
    if (j.contains("usage")) {
      usage = true;
      EXPECT_EQ(j["usage"]["completion_tokens"], 8);
    } else if (j["choices"][0]["delta"].contains("content")) {
      text += j["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(text, "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ");
  EXPECT_EQ(events, 8 + 2);  // tokens, the finish chunk, the usage chunk
}

TEST_F(GatewayTest, MalformedRequestsGet400AndTheGatewayKeepsServing) {
  StartServer();
  Client c(port());
  ExpectError(c.Send("POST", "/v1/chat/completions", "{not json"), 400, "invalid_request_error",
              "");
  ExpectError(c.Send("POST", "/v1/chat/completions", R"({"model": "strata-test"})"), 400,
              "invalid_request_error", "");
  ExpectError(c.Send("POST", "/v1/chat/completions",
                     R"({"model": "strata-test", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": -4})"),
              400, "invalid_request_error", "");
  ExpectError(c.Send("POST", "/v1/completions", R"({"model": "strata-test", "prompt": 7})"), 400,
              "invalid_request_error", "");
  ExpectError(c.Send("GET", "/v1/chat/completions"), 405, "invalid_request_error", "");
  ExpectError(c.Send("GET", "/v2/whatever"), 404, "invalid_request_error", "unknown_url");
  // The same connection still works after all of these.
  EXPECT_EQ(c.Send("POST", "/v1/chat/completions", ChatBody("ok")).status, 200);
  ExpectStillServing();
}

TEST_F(GatewayTest, OversizeBodyGets413) {
  GatewayOptions options;
  options.max_body_bytes = 1024;
  StartServer(options);
  Client c(port());
  ExpectError(c.Send("POST", "/v1/chat/completions", ChatBody(std::string(4096, 'x'))), 413,
              "invalid_request_error", "request_too_large");
  ExpectStillServing();
}

TEST_F(GatewayTest, UnknownModelGets404) {
  StartServer();
  Client c(port());
  ExpectError(c.Send("POST", "/v1/completions", R"({"model": "gpt-7", "prompt": "hi"})"), 404,
              "invalid_request_error", "model_not_found");
  ExpectStillServing();
}

TEST_F(GatewayTest, ApiKeysAreEnforced) {
  GatewayOptions options;
  options.api_keys = {"sk-good", "sk-other"};
  StartServer(options);
  Client c(port());
  ExpectError(c.Send("GET", "/v1/models"), 401, "authentication_error", "invalid_api_key");
  ExpectError(c.Send("POST", "/v1/chat/completions", ChatBody("hi"), "sk-bad"), 401,
              "authentication_error", "invalid_api_key");
  EXPECT_EQ(c.Send("POST", "/v1/chat/completions", ChatBody("hi"), "sk-good").status, 200);
  EXPECT_EQ(c.Send("GET", "/v1/models", "", "sk-other").status, 200);
  EXPECT_EQ(c.Send("GET", "/healthz").status, 200);  // health needs no key
  // Prometheus scrapes without a key too.
  strata::MetricsRegistry::Default()
      .AddCounter("strata_gateway_test_total", "A counter only this test registers")
      .Labels({})
      .Increment(3);
  const Reply metrics = c.Send("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type.rfind("text/plain", 0), 0u) << metrics.content_type;
  EXPECT_NE(metrics.body.find("strata_gateway_test_total 3"), std::string::npos) << metrics.body;
  EXPECT_EQ(c.Send("POST", "/metrics").status, 405);
}

TEST_F(GatewayTest, RejectionIs429WithRetryAfter) {
  StartServer();
  Client c(port());
  Reply r = c.Send("POST", "/v1/chat/completions", ChatBody("please REJECT this"));
  ExpectError(r, 429, "rate_limit_error", "rate_limit_exceeded");
  EXPECT_EQ(r.retry_after, "7");
  // Streaming requests are rejected the same way, before any event is sent.
  r = c.Send("POST", "/v1/chat/completions", ChatBody("REJECT", true));
  EXPECT_EQ(r.status, 429);
  ExpectStillServing();
}

TEST_F(GatewayTest, FailureMidStreamIsReportedInBand) {
  StartServer();
  Client c(port());
  Reply r = c.Send("POST", "/v1/chat/completions", ChatBody("FAIL_MIDWAY", true));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("tok1 "), std::string::npos);
  EXPECT_NE(r.body.find("\"error\""), std::string::npos);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  ExpectStillServing();
}

TEST_F(GatewayTest, TenantsWithDifferentCacheSaltsNeverShareCachedTokens) {
  StartServer();
  Client c(port());
  const std::string prompt(200, 'p');
  auto cached = [&](const std::string& salt) {
    Reply r = c.Send("POST", "/v1/completions",
                     R"({"model": "strata-test", "prompt": ")" + prompt + R"(", "cache_salt": ")" +
                         salt + "\"}");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  EXPECT_EQ(cached("tenant-a"), 0);
  EXPECT_EQ(cached("tenant-a"), 192);  // 12 full 16-token blocks reused
  EXPECT_EQ(cached("tenant-b"), 0);    // same prompt, other tenant: nothing shared
  EXPECT_EQ(cached("tenant-b"), 192);
}

TEST_F(GatewayTest, ClientDisconnectMidStreamDoesNotBreakTheServer) {
  ScriptedTestBackend::Options slow;
  StartServer();
  {
    // Send a streaming request and hang up without reading.
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket s(ioc);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), port()});
    const std::string body = ChatBody("bye", true);
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    boost::asio::write(s, boost::asio::buffer(req));
  }
  ExpectStillServing();
}

}  // namespace
}  // namespace strata::scheduler
