// OpenAiClient (scheduler/client/) against the real gateway, with the scripted test backend:
// non-streaming and streaming replies, error statuses, keep-alive reuse and reconnects, abandoned
// streams, timeouts, and a server that is gone.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "scheduler/client/openai_client.h"
#include "scheduler/http/gateway_server.h"
#include "tests/scheduler/scripted_test_backend.h"

namespace strata::scheduler {
namespace {

using Json = nlohmann::json;
using testing_backend::ScriptedTestBackend;

Json Completion(const std::string& prompt, int max_tokens = 4) {
  return Json{{"model", "strata-test"}, {"prompt", prompt}, {"max_tokens", max_tokens}};
}

Json Chat(const std::string& content, bool stream) {
  return Json{{"model", "strata-test"},
              {"messages", Json::array({Json{{"role", "user"}, {"content", content}}})},
              {"max_tokens", 3},
              {"stream", stream},
              {"stream_options", Json{{"include_usage", true}}}};
}

class OpenAiClientLibTest : public testing::Test {
 protected:
  void StartGateway(GatewayOptions options = {}) {
    server_ = std::make_unique<GatewayServer>(options, &backend_);
    ASSERT_TRUE(server_->Start().ok());
  }
  OpenAiEndpoint Endpoint() const {
    OpenAiEndpoint e;
    e.port = server_->port();
    e.timeout = absl::Seconds(60);
    return e;
  }

  ScriptedTestBackend backend_;
  std::unique_ptr<GatewayServer> server_;
};

TEST(ParseOpenAiUrlTest, AcceptsHostPortAndIgnoresThePath) {
  auto e = ParseOpenAiUrl("http://127.0.0.1:8080/v1");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 8080);
  e = ParseOpenAiUrl("http://gateway.local");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "gateway.local");
  EXPECT_EQ(e->port, 80);
  e = ParseOpenAiUrl("http://[::1]:9000");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 9000);
  e = ParseOpenAiUrl("localhost:7000");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->port, 7000);
}

TEST(ParseOpenAiUrlTest, RejectsBadUrls) {
  for (const char* bad : {"https://host:1", "http://host:0", "http://host:70000", "http://:80",
                          "http://host:abc", "ftp://host:1", "http://[::1", ""}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseOpenAiUrl(bad).status())) << bad;
  }
}

TEST(StatusFromHttpTest, MapsCodesAndKeepsTheMessage) {
  const std::string body = R"({"error": {"message": "cluster is saturated", "type": "x"}})";
  absl::Status s = StatusFromHttp({429, body, "7"});
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("cluster is saturated"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("retry after 7"), absl::string_view::npos) << s;
  EXPECT_TRUE(StatusFromHttp({200, "{}", ""}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(StatusFromHttp({400, body, ""})));
  EXPECT_TRUE(absl::IsUnauthenticated(StatusFromHttp({401, body, ""})));
  EXPECT_TRUE(absl::IsNotFound(StatusFromHttp({404, body, ""})));
  EXPECT_TRUE(absl::IsUnavailable(StatusFromHttp({503, body, ""})));
  EXPECT_TRUE(absl::IsInternal(StatusFromHttp({500, body, ""})));
  // A body that is not OpenAI's error shape still gives a message.
  s = StatusFromHttp({502, "<html>bad gateway</html>", ""});
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_NE(s.message().find("bad gateway"), absl::string_view::npos) << s;
}

TEST_F(OpenAiClientLibTest, NonStreamingCompletionAndModels) {
  StartGateway();
  OpenAiClient client(Endpoint());
  auto reply = client.Post("/v1/completions", Completion("Hello there", 4));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200) << reply->body;
  const Json j = Json::parse(reply->body);
  EXPECT_EQ(j["choices"][0]["text"], "tok0 tok1 tok2 tok3 ");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["usage"]["prompt_tokens"], std::string("Hello there").size());
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(Json::parse(models->body)["data"][0]["id"], "strata-test");
}

TEST_F(OpenAiClientLibTest, StreamsEventsUntilDone) {
  StartGateway();
  OpenAiClient client(Endpoint());
  std::string text;
  Json usage;
  int events = 0;
  auto reply = client.PostStream("/v1/chat/completions", Chat("Stream please", true),
                                 [&](const Json& event) {
                                   ++events;
                                   if (event.contains("usage") && !event["usage"].is_null()) {
                                     usage = event["usage"];
                                   }
                                   for (const Json& c : event.value("choices", Json::array())) {
                                     if (c.contains("delta") && c["delta"].contains("content")) {
                                       text += c["delta"]["content"].get<std::string>();
                                     }
                                   }
                                   return true;
                                 });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(text, "tok0 tok1 tok2 ");
  EXPECT_GE(events, 4);  // three tokens, the finish chunk, the usage chunk
  EXPECT_EQ(usage["completion_tokens"], 3);
  // The connection is reused for the next request.
  auto again = client.Post("/v1/chat/completions", Chat("Again", false));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 200);
  EXPECT_EQ(client.connections_opened(), 1u);
}

// Sends one token, then finishes only when the test says so (or after 10 s): a client that holds
// events back until the stream ends would see the first one only after that timeout.
class GatedBackend : public CompletionBackend {
 public:
  ~GatedBackend() override {
    Release();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> Models() const override { return {"strata-test"}; }
  void Generate(const CompletionRequest&, std::shared_ptr<CompletionSink> sink) override {
    thread_ = std::thread([this, sink] {
      sink->OnText("first ");
      std::unique_lock<std::mutex> lock(mu_);
      released_in_time_ = cv_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; });
      lock.unlock();
      CompletionUsage usage;
      usage.completion_tokens = 1;
      sink->OnDone(absl::OkStatus(), FinishReason::kStop, usage);
    });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool released_in_time() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_in_time_;
  }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  bool released_in_time_ = false;
};

TEST(OpenAiClientStreamTest, EventsArriveWhileTheStreamIsStillOpen) {
  GatedBackend backend;
  GatewayServer server(GatewayOptions{}, &backend);
  ASSERT_TRUE(server.Start().ok());
  OpenAiEndpoint endpoint;
  endpoint.port = server.port();
  OpenAiClient client(endpoint);
  int events = 0;
  auto reply = client.PostStream("/v1/chat/completions", Chat("hold", true), [&](const Json&) {
    if (++events == 1) backend.Release();  // the first token let the stream go on
    return true;
  });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_GE(events, 2);
  EXPECT_TRUE(backend.released_in_time()) << "the first event was held until the stream ended";
}

TEST_F(OpenAiClientLibTest, ErrorStatusesAreReplies) {
  GatewayOptions options;
  options.api_keys = {"sk-good"};
  StartGateway(options);
  OpenAiEndpoint endpoint = Endpoint();
  endpoint.api_key = "sk-good";
  OpenAiClient client(endpoint);

  auto reply = client.Post("/v1/completions", Completion("REJECT me"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 429);
  EXPECT_EQ(reply->retry_after, "7");
  EXPECT_TRUE(absl::IsResourceExhausted(StatusFromHttp(*reply))) << StatusFromHttp(*reply);

  reply = client.Post("/v1/completions", Json{{"prompt", "no model"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 400);
  EXPECT_TRUE(absl::IsInvalidArgument(StatusFromHttp(*reply)));

  Json unknown = Completion("x");
  unknown["model"] = "nope";
  reply = client.Post("/v1/completions", unknown);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 404);
  const absl::Status not_found = StatusFromHttp(*reply);
  EXPECT_TRUE(absl::IsNotFound(not_found));
  EXPECT_NE(not_found.message().find("'nope' does not exist"), absl::string_view::npos)
      << not_found;

  // A rejected stream: the error reply, and no event.
  int events = 0;
  reply = client.PostStream("/v1/chat/completions", Chat("REJECT stream", true),
                            [&](const Json&) { return ++events > 0; });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 429);
  EXPECT_EQ(events, 0);
  EXPECT_NE(reply->body.find("cluster is saturated"), std::string::npos) << reply->body;

  // A failure mid-stream arrives as an error event, then the stream ends normally.
  bool saw_error = false;
  reply =
      client.PostStream("/v1/chat/completions", Chat("FAIL_MIDWAY", true), [&](const Json& event) {
        saw_error = saw_error || event.contains("error");
        return true;
      });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(saw_error);
  EXPECT_EQ(client.connections_opened(), 1u);

  OpenAiEndpoint bad = endpoint;
  bad.api_key = "sk-bad";
  OpenAiClient bad_client(bad);
  reply = bad_client.Post("/v1/completions", Completion("x"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 401);
  EXPECT_TRUE(absl::IsUnauthenticated(StatusFromHttp(*reply)));
}

TEST_F(OpenAiClientLibTest, ReusesTheConnection) {
  StartGateway();  // idle timeout 60 s: the connection stays up between the requests
  OpenAiClient client(Endpoint());
  for (int i = 0; i < 5; ++i) {
    auto reply = client.Post("/v1/completions", Completion("keep alive " + std::to_string(i)));
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->status, 200);
  }
  EXPECT_EQ(client.connections_opened(), 1u);
}

TEST_F(OpenAiClientLibTest, ReconnectsAfterTheServerClosedAnIdleConnection) {
  GatewayOptions options;
  options.idle_timeout = absl::Milliseconds(200);  // the server drops idle connections
  StartGateway(options);
  OpenAiClient client(Endpoint());
  auto reply = client.Post("/v1/completions", Completion("before the idle close"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200);
  EXPECT_EQ(client.connections_opened(), 1u);
  // Wait until the server has closed the idle connection (bounded).
  for (int i = 0; i < 200 && server_->active_connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(server_->active_connections(), 0u);
  // The request first goes on the dead connection, then (once) on a new one.
  reply = client.Post("/v1/completions", Completion("after the idle close"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(client.connections_opened(), 2u);
}

TEST_F(OpenAiClientLibTest, AbandonedStreamClosesTheConnection) {
  StartGateway();
  OpenAiClient client(Endpoint());
  int events = 0;
  auto reply = client.PostStream("/v1/chat/completions", Chat("stop early", true),
                                 [&](const Json&) { return ++events < 1; });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(events, 1);
  auto next = client.Post("/v1/completions", Completion("next"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->status, 200);
  EXPECT_EQ(client.connections_opened(), 2u);
}

TEST(OpenAiClientTimeoutTest, SlowReplyIsDeadlineExceeded) {
  ScriptedTestBackend::Options slow;
  slow.token_interval = std::chrono::milliseconds(1000);
  ScriptedTestBackend backend(slow);
  GatewayServer server(GatewayOptions{}, &backend);
  ASSERT_TRUE(server.Start().ok());
  OpenAiEndpoint endpoint;
  endpoint.port = server.port();
  endpoint.timeout = absl::Milliseconds(300);
  OpenAiClient client(endpoint);
  auto reply = client.Post("/v1/completions", Completion("slow", 8));
  EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << reply.status();
}

TEST_F(OpenAiClientLibTest, ServerGoneIsUnavailable) {
  StartGateway();
  OpenAiClient client(Endpoint());
  auto reply = client.Post("/v1/completions", Completion("before"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  const uint16_t port = server_->port();
  server_->Stop();
  server_.reset();
  reply = client.Post("/v1/completions", Completion("after"));
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  auto stream = client.PostStream("/v1/chat/completions", Chat("after", true),
                                  [](const Json&) { return true; });
  EXPECT_TRUE(absl::IsUnavailable(stream.status())) << stream.status();
  OpenAiEndpoint nobody;
  nobody.port = port;
  OpenAiClient fresh(nobody);
  EXPECT_TRUE(absl::IsUnavailable(fresh.Get("/v1/models").status()));
}

}  // namespace
}  // namespace strata::scheduler
