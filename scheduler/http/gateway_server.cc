#include "scheduler/http/gateway_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "common/metrics.h"
#include "common/strings.h"

namespace strata::scheduler {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Shared with sinks, which the backend may keep after the server is gone: sinks post to
// sessions only while `stopped` is false.
namespace {
class Sink;
}  // namespace
// std::mutex rather than absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, which
// then cannot see absl::Mutex's ordering; the gateway must stay TSan-clean.
struct StopState {
  std::mutex mu;
  bool stopped = false;  // guarded by mu
  // Sinks whose request is in flight: Stop() makes them let go of their sessions while the
  // io_context still exists.
  absl::flat_hash_map<Sink*, std::weak_ptr<Sink>> sinks;  // guarded by mu
};

// Member order matters: the io_context is destroyed before the counters its pending handlers'
// sessions touch.
struct GatewayServer::Impl {
  Impl(GatewayOptions o, CompletionBackend* b)
      : options(std::move(o)), backend(b), models(b->Models()), acceptor(ioc) {}

  void Accept();

  GatewayOptions options;
  CompletionBackend* backend;
  std::vector<std::string> models;
  std::atomic<size_t> connections{0};
  std::atomic<uint64_t> next_id{1};
  std::shared_ptr<StopState> stop_state = std::make_shared<StopState>();
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
};

namespace {

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
  }
  return "Unknown";
}

std::string Chunk(std::string_view data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return StrCat(size, data, "\r\n");
}

int HttpStatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

const char* ErrorTypeFor(int status) {
  switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 429:
      return "rate_limit_error";
    default:
      return "server_error";
  }
}

class Session;

class Sink : public CompletionSink {
 public:
  // Holds the session alive until OnDone (a connection waiting for its backend has no pending
  // I/O that would keep it).
  Sink(std::shared_ptr<Session> session, std::shared_ptr<StopState> stop)
      : stop_(std::move(stop)), session_(std::move(session)) {}
  ~Sink() override {
    std::lock_guard<std::mutex> lock(stop_->mu);
    stop_->sinks.erase(this);
  }
  static std::shared_ptr<Sink> Create(std::shared_ptr<Session> session,
                                      std::shared_ptr<StopState> stop) {
    auto sink = std::make_shared<Sink>(std::move(session), stop);
    std::lock_guard<std::mutex> lock(stop->mu);
    stop->sinks.emplace(sink.get(), sink);
    return sink;
  }
  void DropSession() {
    std::shared_ptr<Session> session;
    std::lock_guard<std::mutex> lock(session_mu_);
    session = std::move(session_);
  }
  void OnText(std::string text) override;
  void OnDone(absl::Status status, FinishReason finish, CompletionUsage usage) override;
  bool Cancelled() const override { return cancelled_.load(std::memory_order_relaxed); }
  void Cancel() { cancelled_ = true; }

 private:
  template <typename F>
  void PostToSession(F&& f, bool last);

  std::shared_ptr<StopState> stop_;
  std::mutex session_mu_;
  std::shared_ptr<Session> session_;  // guarded by session_mu_
  std::atomic<bool> cancelled_{false};
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, GatewayServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {
    ++server_->connections;
  }
  ~Session() {
    if (sink_) sink_->Cancel();
    --server_->connections;
  }

  void Start(bool over_limit) {
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), over_limit] {
      if (over_limit) {
        self->keep_alive_ = false;
        self->SendError(503, "the server is at its connection limit", "server_overloaded");
        return;
      }
      self->DoRead();
    });
  }

  void OnText(std::string text) {
    if (closed_) return;
    if (!streaming_) {
      text_ += text;
      return;
    }
    SendStreamHeaders();
    Queue(Chunk(StreamTextEvent(meta_, text, first_text_)));
    first_text_ = false;
  }

  void OnDone(absl::Status status, FinishReason finish, CompletionUsage usage) {
    if (closed_) return;
    if (!status.ok()) {
      if (headers_sent_) {
        // The stream already started: report in-band, then end it.
        Queue(Chunk(StrCat(
            "data: ", ErrorBody(ToStd(status.message()), ErrorTypeFor(HttpStatusFor(status)), ""),
            "\n\ndata: [DONE]\n\n")));
        Queue("0\r\n\r\n");
        Complete();
        return;
      }
      const int code = HttpStatusFor(status);
      std::string extra;
      if (code == 429) {
        const double retry = std::max(1.0, std::ceil(RetryAfterSeconds(status)));
        extra = StrCat("Retry-After: ", int64_t(retry), "\r\n");
      }
      SendError(code, ToStd(status.message()), code == 429 ? "rate_limit_exceeded" : "", extra);
      return;
    }
    if (streaming_) {
      SendStreamHeaders();
      Queue(Chunk(StreamFinalEvents(meta_, finish, include_usage_ ? &usage : nullptr)));
      Queue("0\r\n\r\n");
      Complete();
      return;
    }
    SendResponse(200, "application/json", CompletionResponse(meta_, text_, finish, usage));
  }

 private:
  void DoRead() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(uint32_t(server_->options.max_header_bytes));
    stream_.expires_after(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(server_->options.idle_timeout)));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      SendError(413, StrCat("the request body exceeds ", server_->options.max_body_bytes, " bytes"),
                "request_too_large");
      return;
    }
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      SendError(431, "the request headers are too large", "");
      return;
    }
    if (ec && ec.category() == beast::error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      keep_alive_ = false;
      SendError(400, StrCat("malformed HTTP request: ", ec.message()), "");
      return;
    }
    if (ec) {
      Close();
      return;
    }
    Handle(parser_->release());
  }

  void Handle(http::request<http::string_body> req) {
    keep_alive_ = req.keep_alive();
    std::string_view target(req.target().data(), req.target().size());
    const std::string path(target.substr(0, target.find('?')));
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    if (path == "/healthz") {
      if (!get) return SendError(405, "use GET", "method_not_allowed");
      return SendResponse(200, "text/plain; charset=utf-8", "ok\n");
    }
    if (path == "/metrics") {  // Prometheus, unauthenticated like every daemon's /metrics
      if (!get) return SendError(405, "use GET", "method_not_allowed");
      return SendResponse(200, std::string(kPrometheusContentType),
                          MetricsRegistry::Default().RenderPrometheus());
    }
    const bool known =
        path == "/v1/models" || path == "/v1/chat/completions" || path == "/v1/completions";
    if (!known) return SendError(404, StrCat("unknown path ", path), "unknown_url");
    if (!server_->options.api_keys.empty()) {
      auto auth = req.find(http::field::authorization);
      std::string_view header;
      if (auth != req.end()) header = std::string_view(auth->value().data(), auth->value().size());
      constexpr std::string_view kBearer = "Bearer ";
      bool ok = false;
      if (header.size() > kBearer.size() && EqualsIgnoreCase(header.substr(0, 7), kBearer)) {
        const std::string_view key = header.substr(kBearer.size());
        for (const std::string& k : server_->options.api_keys) ok = ok || k == key;
      }
      if (!ok) {
        return SendError(401,
                         header.empty() ? "missing bearer API key (Authorization: Bearer ...)"
                                        : "incorrect API key provided",
                         "invalid_api_key");
      }
    }
    if (path == "/v1/models") {
      if (!get) return SendError(405, "use GET", "method_not_allowed");
      return SendResponse(200, "application/json",
                          ModelsResponse(server_->models, int64_t(std::time(nullptr))));
    }
    if (!post) return SendError(405, "use POST", "method_not_allowed");
    StartCompletion(req.body(), path == "/v1/chat/completions");
  }

  void StartCompletion(const std::string& body, bool chat) {
    absl::StatusOr<CompletionRequest> request =
        ParseCompletionRequest(body, chat, server_->options.limits);
    if (!request.ok()) return SendError(400, ToStd(request.status().message()), "");
    const auto& models = server_->models;
    if (std::find(models.begin(), models.end(), request->model) == models.end()) {
      return SendError(404, StrCat("the model '", request->model, "' does not exist"),
                       "model_not_found", "", "model");
    }
    meta_.chat = chat;
    meta_.model = request->model;
    meta_.created = int64_t(std::time(nullptr));
    meta_.id = StrCat(chat ? "chatcmpl-" : "cmpl-", server_->next_id.fetch_add(1));
    streaming_ = request->stream;
    include_usage_ = request->include_usage;
    first_text_ = true;
    headers_sent_ = false;
    text_.clear();
    // Generation may take long; the idle timeout applies to reading requests only.
    stream_.expires_never();
    sink_ = Sink::Create(shared_from_this(), server_->stop_state);
    server_->backend->Generate(*request, sink_);
  }

  void SendStreamHeaders() {
    if (headers_sent_) return;
    headers_sent_ = true;
    Queue(
        StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
               "Transfer-Encoding: chunked\r\nConnection: ",
               keep_alive_ ? "keep-alive" : "close", "\r\n\r\n"));
  }

  void SendError(int code, std::string_view message, std::string_view error_code,
                 std::string_view extra_headers = "", std::string_view param = "") {
    SendResponse(code, "application/json",
                 ErrorBody(message, ErrorTypeFor(code), error_code, param), extra_headers);
  }

  void SendResponse(int code, std::string_view content_type, std::string_view body,
                    std::string_view extra_headers = "") {
    Queue(StrCat("HTTP/1.1 ", code, " ", Reason(code), "\r\nContent-Type: ", content_type,
                 "\r\nContent-Length: ", body.size(), "\r\nConnection: ",
                 keep_alive_ ? "keep-alive" : "close", "\r\n", extra_headers, "\r\n", body));
    Complete();
  }

  // The current response is fully queued: once written, read the next request or close.
  void Complete() {
    response_complete_ = true;
    sink_.reset();
    if (!writing_) AfterWrites();
  }

  void Queue(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()),
                     beast::bind_front_handler(&Session::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, size_t) {
    writing_ = false;
    if (ec) {
      Close();
      return;
    }
    out_.pop_front();
    if (!out_.empty()) {
      DoWrite();
      return;
    }
    AfterWrites();
  }

  void AfterWrites() {
    if (!response_complete_ || writing_ || !out_.empty()) return;
    response_complete_ = false;
    if (!keep_alive_) {
      Close();
      return;
    }
    DoRead();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    if (sink_) sink_->Cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  GatewayServer::Impl* server_;
  std::shared_ptr<Sink> sink_;
  std::deque<std::string> out_;
  bool writing_ = false;
  bool response_complete_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  // The completion in progress.
  ResponseMeta meta_;
  bool streaming_ = false;
  bool include_usage_ = false;
  bool first_text_ = true;
  bool headers_sent_ = false;
  std::string text_;

  friend class Sink;
  beast::tcp_stream::executor_type executor() { return stream_.get_executor(); }
};

template <typename F>
void Sink::PostToSession(F&& f, bool last) {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(session_mu_);
    session = last ? std::move(session_) : session_;
  }
  if (!session) return;
  std::lock_guard<std::mutex> lock(stop_->mu);
  // After Stop() the io_context no longer runs; the session goes with the server.
  if (stop_->stopped) return;
  auto executor = session->executor();  // before `session` is moved into the handler
  net::post(executor,
            [session = std::move(session), f = std::forward<F>(f)]() mutable { f(*session); });
}

void Sink::OnText(std::string text) {
  PostToSession([text = std::move(text)](Session& s) mutable { s.OnText(std::move(text)); }, false);
}

void Sink::OnDone(absl::Status status, FinishReason finish, CompletionUsage usage) {
  PostToSession([status = std::move(status), finish,
                 usage](Session& s) mutable { s.OnDone(std::move(status), finish, usage); },
                true);
}

}  // namespace

void GatewayServer::Impl::Accept() {
  acceptor.async_accept(
      net::make_strand(ioc), [self = this](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted) return;
        if (!ec) {
          const bool over = self->connections.load() >= self->options.max_connections;
          std::make_shared<Session>(std::move(socket), self)->Start(over);
        }
        self->Accept();
      });
}

GatewayServer::GatewayServer(GatewayOptions options, CompletionBackend* backend)
    : impl_(std::make_unique<Impl>(std::move(options), backend)) {}

GatewayServer::~GatewayServer() { Stop(); }

absl::Status GatewayServer::Start() {
  beast::error_code ec;
  const auto address = net::ip::make_address(impl_->options.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        StrCat("gateway: bad listen address '", impl_->options.address, "': ", ec.message()));
  }
  const tcp::endpoint endpoint(address, impl_->options.port);
  auto& acceptor = impl_->acceptor;
  if (acceptor.open(endpoint.protocol(), ec); ec) {
    return absl::UnavailableError(StrCat("gateway: open: ", ec.message()));
  }
  acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec) {
    return absl::UnavailableError(StrCat("gateway: bind ", impl_->options.address, ":",
                                         impl_->options.port, ": ", ec.message()));
  }
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec) {
    return absl::UnavailableError(StrCat("gateway: listen: ", ec.message()));
  }
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  impl_->Accept();
  for (int i = 0; i < std::max(1, impl_->options.num_threads); ++i) {
    impl_->threads.emplace_back([impl = impl_.get()] { impl->ioc.run(); });
  }
  return absl::OkStatus();
}

void GatewayServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->stop_state->mu);
    if (impl_->stop_state->stopped) return;
    impl_->stop_state->stopped = true;
  }
  impl_->work.reset();
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
  std::vector<std::shared_ptr<Sink>> sinks;
  {
    std::lock_guard<std::mutex> lock(impl_->stop_state->mu);
    for (auto& [raw, weak] : impl_->stop_state->sinks) {
      if (auto sink = weak.lock()) sinks.push_back(std::move(sink));
    }
  }
  for (auto& sink : sinks) sink->DropSession();
  sinks.clear();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

uint16_t GatewayServer::port() const {
  beast::error_code ec;
  const auto endpoint = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

size_t GatewayServer::active_connections() const { return impl_->connections.load(); }

}  // namespace strata::scheduler
