#include "scheduler/client/openai_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>
#include <optional>

#include "common/strings.h"

namespace strata::scheduler {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

namespace {

// Error replies are read whole; more than this is not an error body worth keeping.
constexpr size_t kMaxBodyBytes = size_t{256} << 20;

}  // namespace

absl::StatusOr<OpenAiEndpoint> ParseOpenAiUrl(std::string_view url) {
  std::string_view rest = StripWhitespace(url);
  const std::string lower = AsciiToLower(rest.substr(0, 8));
  if (lower.rfind("https://", 0) == 0) {
    return absl::InvalidArgumentError(
        StrCat("'", url, "': https is not supported (use http://host:port)"));
  }
  if (lower.rfind("http://", 0) == 0) rest.remove_prefix(7);
  if (rest.find("://") != std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat("'", url, "': only http:// URLs are supported"));
  }
  rest = rest.substr(0, rest.find('/'));  // the path ("/v1") is ignored
  OpenAiEndpoint endpoint;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {  // [::1]:8000
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat("'", url, "': unterminated IPv6 address"));
    }
    endpoint.host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (!rest.empty() && rest.front() != ':') {
      return absl::InvalidArgumentError(StrCat("'", url, "': junk after the IPv6 address"));
    }
    if (!rest.empty()) port_text = rest.substr(1);
  } else {
    const size_t colon = rest.rfind(':');
    endpoint.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port_text = rest.substr(colon + 1);
  }
  if (endpoint.host.empty()) {
    return absl::InvalidArgumentError(StrCat("'", url, "': no host (want http://host:port)"));
  }
  endpoint.port = 80;
  if (!port_text.empty() || rest.find(':') != std::string_view::npos) {
    const std::optional<int64_t> port = ParseInt64(port_text);
    if (!port.has_value() || *port < 1 || *port > 65535) {
      return absl::InvalidArgumentError(StrCat("'", url, "': bad port '", port_text, "'"));
    }
    endpoint.port = static_cast<uint16_t>(*port);
  }
  return endpoint;
}

// The connection and its io_context. Every operation is asynchronous on the tcp_stream, whose
// expiry enforces the request deadline, and is driven to completion by running the io_context
// (blocking I/O on Beast streams has no timeouts).
struct OpenAiClient::Conn {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  bool open = false;

  template <typename Start>
  beast::error_code Run(Start&& start) {
    beast::error_code result = net::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  void Close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
    buffer.clear();
    open = false;
  }
};

namespace {

absl::Status TransportError(const beast::error_code& ec, std::string_view what,
                            const OpenAiEndpoint& endpoint) {
  const std::string message =
      StrCat(what, " http://", endpoint.host, ":", endpoint.port, ": ", ec.message());
  if (ec == beast::error::timeout) {
    return absl::DeadlineExceededError(
        StrCat(message, " (timeout ", absl::FormatDuration(endpoint.timeout), ")"));
  }
  return absl::UnavailableError(message);
}

// Splits a server-sent-event byte stream into `data:` payloads (joined per event).
class SseParser {
 public:
  // Calls on_data(payload) per complete event that carries data; stops early when it returns
  // false.
  template <typename OnData>
  bool Feed(std::string_view bytes, OnData&& on_data) {
    pending_.append(bytes);
    size_t start = 0;
    while (true) {
      const size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos) break;
      std::string_view line(pending_.data() + start, nl - start);
      start = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {  // the end of an event
        if (has_data_) {
          has_data_ = false;
          std::string payload = std::move(data_);
          data_.clear();
          if (!on_data(payload)) {
            pending_.erase(0, start);
            return false;
          }
        }
        continue;
      }
      if (line.rfind("data:", 0) != 0) continue;  // comments, event:, id:, retry:
      std::string_view value = line.substr(5);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    }
    pending_.erase(0, start);
    return true;
  }

 private:
  std::string pending_;
  std::string data_;
  bool has_data_ = false;
};

}  // namespace

OpenAiClient::OpenAiClient(OpenAiEndpoint endpoint)
    : endpoint_(std::move(endpoint)), conn_(std::make_unique<Conn>()) {}

OpenAiClient::~OpenAiClient() {
  if (conn_->open) conn_->Close();
}

absl::StatusOr<HttpReply> OpenAiClient::Post(std::string_view path, const json& body) {
  const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return Exchange(/*post=*/true, path, &text, nullptr);
}

absl::StatusOr<HttpReply> OpenAiClient::Get(std::string_view path) {
  return Exchange(/*post=*/false, path, nullptr, nullptr);
}

absl::StatusOr<HttpReply> OpenAiClient::PostStream(
    std::string_view path, const json& body, const std::function<bool(const json&)>& on_event) {
  const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return Exchange(/*post=*/true, path, &text, &on_event);
}

absl::StatusOr<HttpReply> OpenAiClient::Exchange(bool post, std::string_view path,
                                                 const std::string* body,
                                                 const std::function<bool(const json&)>* on_event) {
  Conn& conn = *conn_;
  const OpenAiEndpoint& endpoint = endpoint_;
  const http::verb verb = post ? http::verb::post : http::verb::get;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(endpoint.timeout));
  http::request<http::string_body> req(verb, std::string(path), 11);
  req.set(http::field::host, StrCat(endpoint.host, ":", endpoint.port));
  req.set(http::field::user_agent, "strata-openai-client");
  req.set(http::field::accept, on_event != nullptr ? "text/event-stream" : "application/json");
  if (!endpoint.api_key.empty()) {
    req.set(http::field::authorization, StrCat("Bearer ", endpoint.api_key));
  }
  if (body != nullptr) {
    req.set(http::field::content_type, "application/json");
    req.body() = *body;
  }
  req.keep_alive(true);
  req.prepare_payload();

  for (int attempt = 0;; ++attempt) {
    const bool fresh = !conn.open;
    if (!conn.open) {
      tcp::resolver resolver(conn.ioc);
      beast::error_code ec;
      tcp::resolver::results_type results;
      ec = conn.Run([&](auto handler) {
        resolver.async_resolve(
            endpoint.host, std::to_string(endpoint.port),
            [&results, handler](beast::error_code e, tcp::resolver::results_type r) mutable {
              results = std::move(r);
              handler(e);
            });
      });
      if (ec) return TransportError(ec, "resolving", endpoint);
      conn.stream.expires_at(deadline);
      ec = conn.Run([&](auto handler) { conn.stream.async_connect(results, handler); });
      if (ec) {
        conn.Close();
        return TransportError(ec, "connecting to", endpoint);
      }
      conn.open = true;
      ++connections_opened_;
    }
    // A reused connection may have been closed by the server while idle: that shows as a failed
    // write or a reply with no byte at all, and then (once) the request goes on a new connection.
    const bool may_retry = !fresh && attempt == 0;
    conn.stream.expires_at(deadline);
    beast::error_code ec =
        conn.Run([&](auto handler) { http::async_write(conn.stream, req, handler); });
    if (ec) {
      conn.Close();
      if (may_retry && ec != beast::error::timeout) continue;
      return TransportError(ec, "sending to", endpoint);
    }
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    ec = conn.Run(
        [&](auto handler) { http::async_read_header(conn.stream, conn.buffer, parser, handler); });
    if (ec) {
      const bool got_some = parser.got_some();
      conn.Close();
      if (may_retry && !got_some && ec != beast::error::timeout) continue;
      return TransportError(ec, "reading the reply from", endpoint);
    }
    HttpReply reply;
    reply.status = parser.get().result_int();
    if (auto it = parser.get().find(http::field::retry_after); it != parser.get().end()) {
      reply.retry_after = std::string(it->value());
    }
    const bool streaming = on_event != nullptr && reply.status == 200;
    SseParser sse;
    bool saw_done = false;
    bool abandoned = false;
    absl::Status event_error;
    auto on_data = [&](const std::string& payload) {
      if (saw_done) return true;  // nothing is expected after [DONE]
      if (payload == "[DONE]") {
        saw_done = true;
        return true;
      }
      json event = json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (event.is_discarded()) {
        event_error = absl::DataLossError(
            StrCat("a stream event is not JSON: ", std::string_view(payload).substr(0, 200)));
        return false;
      }
      if (!(*on_event)(event)) abandoned = true;
      return !abandoned;
    };
    std::array<char, 64 << 10> chunk;
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      // read_some hands over what has arrived (one SSE event at a time while a stream
      // trickles); a full read would hold every event until 64 KiB or the end of the stream.
      ec = conn.Run(
          [&](auto handler) { http::async_read_some(conn.stream, conn.buffer, parser, handler); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        conn.Close();
        return TransportError(ec, "reading the reply from", endpoint);
      }
      const size_t n = chunk.size() - parser.get().body().size;
      if (streaming) {
        if (!sse.Feed(std::string_view(chunk.data(), n), on_data)) {
          conn.Close();  // abandoned (or garbage): the rest of the stream is not wanted
          if (!event_error.ok()) return event_error;
          return reply;
        }
      } else {
        if (reply.body.size() + n > kMaxBodyBytes) {
          conn.Close();
          return absl::ResourceExhaustedError(StrCat("the reply from http://", endpoint.host, ":",
                                                     endpoint.port, " exceeds ", kMaxBodyBytes,
                                                     " bytes"));
        }
        reply.body.append(chunk.data(), n);
      }
    }
    if (!parser.keep_alive()) conn.Close();
    if (streaming && !saw_done) {
      return absl::UnavailableError(StrCat("the stream from http://", endpoint.host, ":",
                                           endpoint.port, " ended without [DONE]"));
    }
    return reply;
  }
}

absl::Status StatusFromHttp(const HttpReply& reply) {
  if (reply.status >= 200 && reply.status < 300) return absl::OkStatus();
  std::string message;
  const json body = json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("error")) {
    const json& error = body["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string()) {
      message = error["message"].get<std::string>();
    } else if (error.is_string()) {
      message = error.get<std::string>();
    }
  }
  if (message.empty()) message = std::string(StripWhitespace(reply.body.substr(0, 300)));
  message = StrCat("HTTP ", reply.status, ": ", message);
  if (!reply.retry_after.empty()) StrAppend(&message, " (retry after ", reply.retry_after, " s)");
  switch (reply.status) {
    case 400:
    case 405:
    case 413:
    case 422:
    case 431:
      return absl::InvalidArgumentError(message);
    case 401:
      return absl::UnauthenticatedError(message);
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 408:
    case 504:
      return absl::DeadlineExceededError(message);
    case 409:
      return absl::AbortedError(message);
    case 429:
      return absl::ResourceExhaustedError(message);
    case 502:
    case 503:
      return absl::UnavailableError(message);
    default:
      break;
  }
  if (reply.status >= 500) return absl::InternalError(message);
  return absl::UnknownError(message);
}

}  // namespace strata::scheduler
