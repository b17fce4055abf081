// 1,000 concurrent streaming (SSE) connections on loopback: every stream stays open until all
// 1,000 are in flight (the test backend holds tokens until then), then all complete.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "scheduler/http/gateway_server.h"
#include "tests/scheduler/scripted_test_backend.h"

namespace strata::scheduler {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

constexpr int kStreams = 1000;

struct Stream : std::enable_shared_from_this<Stream> {
  Stream(net::io_context& ioc, uint16_t port, std::atomic<int>& ok, std::atomic<int>& failed)
      : stream(ioc), port(port), ok(ok), failed(failed) {}

  void Run() {
    stream.expires_after(std::chrono::seconds(90));
    stream.async_connect({net::ip::make_address("127.0.0.1"), port},
                         [self = shared_from_this()](beast::error_code ec) {
                           if (ec) return self->Fail();
                           self->Write();
                         });
  }
  void Write() {
    req = {http::verb::post, "/v1/chat/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.body() =
        R"({"model": "strata-test", "stream": true, "messages": [{"role": "user", "content": "hi"}]})";
    req.prepare_payload();
    http::async_write(stream, req, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Fail();
      self->parser.body_limit(1 << 20);
      http::async_read(self->stream, self->buffer, self->parser,
                       [self](beast::error_code ec, size_t) {
                         if (ec) return self->Fail();
                         const std::string& body = self->parser.get().body();
                         const bool good = self->parser.get().result_int() == 200 &&
                                           body.find("tok7 ") != std::string::npos &&
                                           body.find("data: [DONE]") != std::string::npos;
                         good ? ++self->ok : ++self->failed;
                       });
    });
  }
  void Fail() { ++failed; }

  beast::tcp_stream stream;
  uint16_t port;
  std::atomic<int>& ok;
  std::atomic<int>& failed;
  http::request<http::string_body> req;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
};

TEST(GatewayConcurrencyTest, ThousandConcurrentStreams) {
  testing_backend::ScriptedTestBackend::Options backend_options;
  backend_options.hold_until = kStreams;
  backend_options.token_interval = std::chrono::milliseconds(5);
  testing_backend::ScriptedTestBackend backend(backend_options);
  GatewayOptions options;
  options.num_threads = 2;
  GatewayServer server(options, &backend);
  ASSERT_TRUE(server.Start().ok());

  net::io_context ioc;
  std::atomic<int> ok{0}, failed{0};
  for (int i = 0; i < kStreams; ++i) {
    std::make_shared<Stream>(ioc, server.port(), ok, failed)->Run();
  }
  ioc.run();  // returns when every stream has finished or failed (bounded by the 90 s expiry)
  EXPECT_EQ(ok.load(), kStreams);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(backend.max_active(), size_t(kStreams));  // all were open at once
}

}  // namespace
}  // namespace strata::scheduler
