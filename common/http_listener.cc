#include "common/http_listener.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/status.h"
#include "common/strings.h"

namespace strata {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (EqualsIgnoreCase(k, name)) return v;
  }
  return {};
}

absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(StrCat("expected host:port, got '", address, "'"));
  }
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::optional<uint64_t> port = ParseUint64(address.substr(colon + 1));
  if (!port || *port > 65535) {
    return absl::InvalidArgumentError(StrCat("bad port in '", address, "'"));
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(*port));
}

class HttpListener::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)), acceptor_(io_) {}

  struct Routes {
    std::map<std::string, std::map<std::string, HttpHandler>> by_path;  // path → method → h
  };

  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* owner, tcp::socket socket) : owner_(owner), stream_(std::move(socket)) {}

    void Start() { Read(); }
    void Close() {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      stream_.close();
    }

   private:
    void Read() {
      parser_.emplace();
      parser_->body_limit(owner_->options_.max_body_bytes);
      stream_.expires_after(absl::ToChronoSeconds(owner_->options_.idle_timeout));
      http::async_read(stream_, buffer_, *parser_,
                       beast::bind_front_handler(&Session::OnRead, shared_from_this()));
    }

    void OnRead(beast::error_code ec, size_t) {
      if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
          ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
          ec == asio::error::eof) {
        return Finish();
      }
      if (ec) {
        HttpResponse r;
        r.status = ec == http::error::body_limit ? 413 : 400;
        r.body = StrCat(r.status == 413 ? "request body too large" : "bad request", ": ",
                        ec.message(), "\n");
        return Write(r, /*keep_alive=*/false);
      }
      const auto& msg = parser_->get();
      HttpRequest req;
      req.method = std::string(msg.method_string());
      const std::string_view target(msg.target().data(), msg.target().size());
      const size_t q = target.find('?');
      req.path = std::string(target.substr(0, q));
      if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
      for (const auto& field : msg) {
        req.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
      }
      req.body = msg.body();
      Write(owner_->Dispatch(req), msg.keep_alive());
    }

    void Write(const HttpResponse& r, bool keep_alive) {
      auto res = std::make_shared<http::response<http::string_body>>();
      res->version(11);
      res->result(static_cast<unsigned>(r.status));
      res->set(http::field::server, "strata");
      res->set(http::field::content_type, r.content_type);
      for (const auto& [k, v] : r.headers) res->set(k, v);
      res->body() = r.body;
      res->keep_alive(keep_alive);
      res->prepare_payload();
      http::async_write(stream_, *res,
                        [self = shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
                          if (ec || !keep_alive) return self->Finish();
                          self->Read();
                        });
    }

    void Finish() {
      Close();
      owner_->Forget(this);
    }

    Impl* owner_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
  };

  HttpResponse Dispatch(const HttpRequest& req) {
    auto path = routes_.by_path.find(req.path);
    HttpResponse r;
    if (path == routes_.by_path.end()) {
      r.status = 404;
      r.body = StrCat("no route for ", req.path, "\n");
      return r;
    }
    auto handler = path->second.find(req.method);
    if (handler == path->second.end()) {
      r.status = 405;
      std::string allowed;
      for (const auto& [method, h] : path->second) {
        StrAppend(&allowed, allowed.empty() ? "" : ", ", method);
      }
      r.headers.emplace_back("Allow", allowed);
      r.body = StrCat(req.method, " not allowed on ", req.path, "\n");
      return r;
    }
    try {
      return handler->second(req);
    } catch (const std::exception& e) {
      spdlog::error("http handler for {} {} threw: {}", req.method, req.path, e.what());
      r.status = 500;
      r.body = "internal error\n";
      return r;
    }
  }

  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_),
                           [this](beast::error_code ec, tcp::socket socket) {
                             if (ec) {
                               if (ec != asio::error::operation_aborted) {
                                 spdlog::warn("http accept failed: {}", ec.message());
                                 Accept();
                               }
                               return;
                             }
                             auto session = std::make_shared<Session>(this, std::move(socket));
                             {
                               std::lock_guard lock(mu_);
                               live_[session.get()] = session;
                             }
                             session->Start();
                             Accept();
                           });
  }

  void Forget(Session* s) {
    std::lock_guard lock(mu_);
    live_.erase(s);
  }

  absl::Status Start() {
    beast::error_code ec;
    const auto addr = asio::ip::make_address(options_.address, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          StrCat("bad listen address '", options_.address, "': ", ec.message()));
    }
    const tcp::endpoint endpoint(addr, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          StrCat("cannot listen on ", options_.address, ":", options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
    return absl::OkStatus();
  }

  void Stop() {
    if (threads_.empty()) return;
    asio::post(io_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
      std::map<Session*, std::shared_ptr<Session>> live;
      {
        std::lock_guard lock(mu_);
        live = live_;
      }
      for (auto& [raw, s] : live) s->Close();
    });
    io_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::lock_guard lock(mu_);
    live_.clear();
  }

  Options options_;
  Routes routes_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::map<Session*, std::shared_ptr<Session>> live_;
};

HttpListener::HttpListener(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HttpListener::~HttpListener() { Stop(); }

void HttpListener::Route(std::string method, std::string path, HttpHandler handler) {
  impl_->routes_.by_path[std::move(path)][std::move(method)] = std::move(handler);
}

absl::Status HttpListener::Start() { return impl_->Start(); }
uint16_t HttpListener::port() const { return impl_->port_; }
void HttpListener::Stop() { impl_->Stop(); }

void AddDiagnosticsRoutes(HttpListener& listener, MetricsRegistry& registry,
                          std::function<absl::Status()> health) {
  listener.Route("GET", "/metrics", [&registry](const HttpRequest&) {
    HttpResponse r;
    r.content_type = std::string(kPrometheusContentType);
    r.body = registry.RenderPrometheus();
    return r;
  });
  listener.Route("GET", "/healthz", [health = std::move(health)](const HttpRequest&) {
    HttpResponse r;
    const absl::Status st = health ? health() : absl::OkStatus();
    if (st.ok()) {
      r.body = "ok\n";
    } else {
      r.status = 503;
      r.body = StrCat(st.ToString(), "\n");
    }
    return r;
  });
}

absl::StatusOr<std::unique_ptr<HttpListener>> StartDiagnosticsListener(std::string_view address) {
  ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
  auto http =
      std::make_unique<HttpListener>(HttpListener::Options{.address = hp.first, .port = hp.second});
  AddDiagnosticsRoutes(*http, MetricsRegistry::Default(), /*health=*/nullptr);
  RETURN_IF_ERROR(http->Start());
  return http;
}

}  // namespace strata
