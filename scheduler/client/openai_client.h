// OpenAiClient: a blocking HTTP/1.1 client for Strata's OpenAI-compatible gateway (and any
// server speaking the same protocol over plain HTTP), used by `strata batch` and the chat demo.
//
// One client holds one keep-alive connection, opened on first use. A request sent on a reused
// connection that turns out to be dropped (the server closed it while idle) is sent once more on
// a fresh connection; a request on a fresh connection is never repeated, so a POST runs at most
// twice and only when the first attempt never got a single response byte.
//
// Timeouts: `timeout` bounds each request as a whole (connect, write, the full reply, or the whole
// stream for PostStream). When it passes the connection is closed and the call returns
// DEADLINE_EXCEEDED.
//
// Thread safety: none; use one client per thread. Failure: any HTTP status is a reply (see
// StatusFromHttp); connection failures are UNAVAILABLE, timeouts DEADLINE_EXCEEDED.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler {

struct OpenAiEndpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string api_key;  // sent as "Authorization: Bearer <key>" when not empty
  absl::Duration timeout = absl::Seconds(300);
};

// Parses "http://host:port" (a trailing path such as "/v1" is ignored; no TLS) into an endpoint.
// "[::1]:8000" style IPv6 hosts are accepted; the port defaults to 80.
absl::StatusOr<OpenAiEndpoint> ParseOpenAiUrl(std::string_view url);

struct HttpReply {
  int status = 0;
  std::string body;
  std::string retry_after;  // the Retry-After header, verbatim ("" when absent)
};

class OpenAiClient {  // not thread-safe; one per thread
 public:
  explicit OpenAiClient(OpenAiEndpoint endpoint);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  // Any HTTP status is OK() here; transport failures are UNAVAILABLE / DEADLINE_EXCEEDED.
  absl::StatusOr<HttpReply> Post(std::string_view path, const nlohmann::json& body);
  absl::StatusOr<HttpReply> Get(std::string_view path);
  // Streams SSE: calls on_event for each `data:` JSON payload until `data: [DONE]`.
  // A non-200 reply is returned as HttpReply with its body, without events.
  // If on_event returns false the stream is abandoned (connection closed).
  // A 200 reply's body is empty (the events went to on_event). A failure after the stream
  // started arrives as an event holding an OpenAI "error" object (then [DONE]), as the gateway
  // sends it. A stream that ends without [DONE] is UNAVAILABLE; a payload that is not JSON is
  // DATA_LOSS.
  absl::StatusOr<HttpReply> PostStream(std::string_view path, const nlohmann::json& body,
                                       const std::function<bool(const nlohmann::json&)>& on_event);

  const OpenAiEndpoint& endpoint() const { return endpoint_; }
  // Connections opened so far (tests check keep-alive reuse with it).
  uint64_t connections_opened() const { return connections_opened_; }

 private:
  struct Conn;

  // One request and its reply; `on_event` set: a streaming request (see PostStream).
  absl::StatusOr<HttpReply> Exchange(bool post, std::string_view path, const std::string* body,
                                     const std::function<bool(const nlohmann::json&)>* on_event);

  OpenAiEndpoint endpoint_;
  std::unique_ptr<Conn> conn_;
  uint64_t connections_opened_ = 0;
};

// HTTP status + OpenAI error body -> absl::Status with the error message (429 ->
// RESOURCE_EXHAUSTED, 400 -> INVALID_ARGUMENT, 401 -> UNAUTHENTICATED, 404 -> NOT_FOUND,
// 5xx -> UNAVAILABLE/INTERNAL). 2xx is OK. The message is the body's error.message when there is
// one, else the start of the body.
absl::Status StatusFromHttp(const HttpReply& reply);

}  // namespace strata::scheduler
