#include "common/http_listener.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace strata {
namespace {

// Sends `raw` to 127.0.0.1:port and returns everything read until the peer closes or
// `responses` responses' worth of headers+body arrived (by Content-Length).
std::string Exchange(uint16_t port, const std::string& raw, int responses = 1) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  size_t sent = 0;
  while (sent < raw.size()) {
    const ssize_t n = send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  std::string out;
  char buf[4096];
  auto complete = [&] {
    int seen = 0;
    size_t pos = 0;
    while (seen < responses) {
      const size_t hdr_end = out.find("\r\n\r\n", pos);
      if (hdr_end == std::string::npos) return false;
      const size_t cl = out.find("Content-Length: ", pos);
      size_t len = 0;
      if (cl != std::string::npos && cl < hdr_end) len = std::stoul(out.substr(cl + 16));
      if (out.size() < hdr_end + 4 + len) return false;
      pos = hdr_end + 4 + len;
      ++seen;
    }
    return true;
  };
  while (!complete()) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  close(fd);
  return out;
}

class HttpListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("strata_test_requests_total", "Requests").Labels({}).Increment(3);
    listener_ = std::make_unique<HttpListener>(HttpListener::Options{.max_body_bytes = 1024});
    AddDiagnosticsRoutes(*listener_, registry_, [this] { return health_; });
    listener_->Route("POST", "/echo", [](const HttpRequest& req) {
      HttpResponse r;
      r.body = req.body + "|" + std::string(req.Header("x-tag")) + "|" + req.query;
      return r;
    });
    listener_->Route("GET", "/throw",
                     [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("boom"); });
    ASSERT_TRUE(listener_->Start().ok());
    ASSERT_NE(listener_->port(), 0);
  }

  MetricsRegistry registry_;
  absl::Status health_ = absl::OkStatus();
  std::unique_ptr<HttpListener> listener_;
};

TEST_F(HttpListenerTest, ServesMetricsAndHealth) {
  const std::string metrics =
      Exchange(listener_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(metrics.find("HTTP/1.1 200"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("text/plain; version=0.0.4"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("strata_test_requests_total 3"), std::string::npos) << metrics;

  EXPECT_NE(Exchange(listener_->port(), "GET /healthz HTTP/1.1\r\n\r\n").find("200 OK"),
            std::string::npos);
  health_ = absl::UnavailableError("ssd tier offline");
  const std::string sick = Exchange(listener_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_NE(sick.find("503"), std::string::npos) << sick;
  EXPECT_NE(sick.find("ssd tier offline"), std::string::npos) << sick;
}

TEST_F(HttpListenerTest, RoutesBodiesHeadersQuery) {
  const std::string r = Exchange(listener_->port(),
                                 "POST /echo?a=1 HTTP/1.1\r\nX-Tag: t7\r\nContent-Length: 5\r\n"
                                 "\r\nhello");
  EXPECT_NE(r.find("hello|t7|a=1"), std::string::npos) << r;
}

TEST_F(HttpListenerTest, ErrorsAreHttpErrorsAndServerKeepsServing) {
  EXPECT_NE(Exchange(listener_->port(), "GET /nope HTTP/1.1\r\n\r\n").find("404"),
            std::string::npos);
  const std::string wrong_method = Exchange(listener_->port(), "DELETE /metrics HTTP/1.1\r\n\r\n");
  EXPECT_NE(wrong_method.find("405"), std::string::npos) << wrong_method;
  EXPECT_NE(wrong_method.find("Allow: GET"), std::string::npos) << wrong_method;
  const std::string big =
      Exchange(listener_->port(),
               "POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, 'x'));
  EXPECT_NE(big.find("413"), std::string::npos) << big;
  EXPECT_NE(Exchange(listener_->port(), "this is not http\r\n\r\n").find("400"), std::string::npos);
  EXPECT_NE(Exchange(listener_->port(), "GET /throw HTTP/1.1\r\n\r\n").find("500"),
            std::string::npos);
  EXPECT_NE(Exchange(listener_->port(), "GET /healthz HTTP/1.1\r\n\r\n").find("200"),
            std::string::npos);
}

TEST_F(HttpListenerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  const std::string r =
      Exchange(listener_->port(), "GET /healthz HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n", 2);
  EXPECT_NE(r.find("ok\n"), std::string::npos) << r;
  EXPECT_NE(r.find("strata_test_requests_total"), std::string::npos) << r;
}

TEST_F(HttpListenerTest, ManyConcurrentClients) {
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        if (Exchange(listener_->port(), "GET /healthz HTTP/1.1\r\n\r\n").find("200") !=
            std::string::npos) {
          ++ok;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST(HttpListenerStandaloneTest, BindFailureIsAStatus) {
  HttpListener a({});
  ASSERT_TRUE(a.Start().ok());
  HttpListener b({.port = a.port()});
  // SO_REUSEADDR does not allow two listeners on one port.
  EXPECT_EQ(b.Start().code(), absl::StatusCode::kUnavailable);
  HttpListener c({.address = "not-an-ip"});
  EXPECT_EQ(c.Start().code(), absl::StatusCode::kInvalidArgument);
  a.Stop();
  a.Stop();  // idempotent
}

TEST(ParseHostPortTest, Forms) {
  EXPECT_EQ(*ParseHostPort("127.0.0.1:9100"),
            std::make_pair(std::string("127.0.0.1"), uint16_t{9100}));
  EXPECT_EQ(ParseHostPort("[::1]:80")->first, "::1");
  EXPECT_FALSE(ParseHostPort("localhost").ok());
  EXPECT_FALSE(ParseHostPort("h:99999").ok());
  EXPECT_FALSE(ParseHostPort("h:x").ok());
}

}  // namespace
}  // namespace strata
