// A small HTTP/1.1 listener that every daemon embeds for /metrics and /healthz (and that tests
// and tools can give other routes). Built on Boost.Beast; keep-alive, bounded bodies, idle
// timeouts. Handlers run on the listener's threads and must not block for long.
//
//   HttpListener http({.address = "0.0.0.0", .port = 9100});
//   AddDiagnosticsRoutes(http, MetricsRegistry::Default(), [&] { return store.Health(); });
//   RETURN_IF_ERROR(http.Start());
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace strata {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::string query;   // after '?', undecoded
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // The first header with this name (case-insensitive), or "".
  std::string_view Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpListener {
 public:
  struct Options {
    std::string address = "127.0.0.1";
    uint16_t port = 0;  // 0: any free port; see port() after Start()
    size_t max_body_bytes = 1 << 20;
    int num_threads = 1;
    absl::Duration idle_timeout = absl::Seconds(30);
  };

  explicit HttpListener(Options options);
  ~HttpListener();  // Stop()s
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Registers `handler` for exact `path` and `method`. Call before Start(). Unknown paths get
  // 404, known paths with another method 405, bodies over the limit 413, garbage 400.
  void Route(std::string method, std::string path, HttpHandler handler);

  // Binds and starts serving. Unavailable if the address cannot be bound.
  absl::Status Start();
  // The bound port (valid after Start()).
  uint16_t port() const;
  // Stops accepting, closes connections, joins the threads. Idempotent.
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// GET /metrics → the registry in Prometheus text; GET /healthz → 200 "ok", or 503 with the
// status message when `health` reports an error.
void AddDiagnosticsRoutes(HttpListener& listener, MetricsRegistry& registry,
                          std::function<absl::Status()> health);

// A started listener on `address` ("host:port") with only the diagnostics routes over the default
// registry, /healthz always "ok": the cache and worker daemons' HTTP side.
absl::StatusOr<std::unique_ptr<HttpListener>> StartDiagnosticsListener(std::string_view address);

// Splits "host:port" ("[::1]:80" for IPv6). InvalidArgument when malformed.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address);

}  // namespace strata
