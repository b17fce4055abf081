// GatewayServer: the OpenAI-compatible HTTP front door of `strata scheduler` (ARCHITECTURE.md §8).
//
// Asynchronous (Boost.Beast on a small pool of io_context threads; one strand per connection,
// no thread per connection), so thousands of concurrent streaming responses cost only memory.
//   GET  /v1/models
//   POST /v1/chat/completions, /v1/completions   (stream: server-sent events, chunked)
//   GET  /healthz
// Errors use OpenAI's body ({"error": {"message", "type", "param", "code"}}): 400 malformed
// request, 401 missing/bad bearer key (when keys are configured), 404 unknown model or path,
// 405 wrong method, 413 body over the limit, 429 + Retry-After when the backend rejects
// (ResourceExhausted with WithRetryAfter), 503 when over the connection limit.
//
// Lifecycle: construct, Start() (binds; port() tells the port when 0 was asked), Stop() or
// destroy. The backend must outlive the server; sink calls arriving after Stop() are dropped.
// Thread safety: Start/Stop from one thread; everything else runs on the server's threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/http/completion_backend.h"
#include "scheduler/http/openai_protocol.h"

namespace strata::scheduler {

struct GatewayOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;
  int num_threads = 2;
  size_t max_body_bytes = 4 << 20;
  size_t max_header_bytes = 16 << 10;
  size_t max_connections = 8192;
  std::vector<std::string> api_keys;  // empty: no authentication
  absl::Duration idle_timeout = absl::Seconds(60);
  RequestLimits limits;
};

class GatewayServer {
 public:
  GatewayServer(GatewayOptions options, CompletionBackend* backend);
  ~GatewayServer();
  GatewayServer(const GatewayServer&) = delete;
  GatewayServer& operator=(const GatewayServer&) = delete;

  absl::Status Start();
  void Stop();
  uint16_t port() const;
  size_t active_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::scheduler
