// A blocking HTTP/1.1 client for gateway tests (Boost.Beast), keep-alive capable.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <string>

namespace strata::scheduler::testing_http {

struct Reply {
  int status = 0;
  std::string body;
  std::string retry_after;
  std::string content_type;
  bool ok = false;  // false: connection-level failure
};

class Client {
 public:
  explicit Client(uint16_t port) : socket_(ioc_) {
    boost::system::error_code ec;
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
    connected_ = !ec;
  }

  Reply Send(const std::string& method, const std::string& path, const std::string& body = "",
             const std::string& api_key = "", bool keep_alive = true) {
    namespace http = boost::beast::http;
    Reply reply;
    if (!connected_) return reply;
    http::request<http::string_body> req(http::string_to_verb(method), path, 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.keep_alive(keep_alive);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    http::write(socket_, req, ec);
    if (ec) return reply;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(socket_, buffer_, parser, ec);
    if (ec) return reply;
    auto res = parser.release();
    reply.ok = true;
    reply.status = res.result_int();
    reply.body = res.body();
    if (auto it = res.find(http::field::retry_after); it != res.end()) {
      reply.retry_after = std::string(it->value());
    }
    if (auto it = res.find(http::field::content_type); it != res.end()) {
      reply.content_type = std::string(it->value());
    }
    return reply;
  }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  bool connected_ = false;
};

}  // namespace strata::scheduler::testing_http
