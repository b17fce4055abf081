// A minimal HTTP/1.1 GET against 127.0.0.1 for tests (a daemon's /metrics or /healthz), without a
// curl dependency, and a reader of one metric. Header-only; include as "tests/util/http_get.h".
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <string>

namespace strata::testing_util {

// The whole response (status line, headers, body); empty if the connection failed.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
    }
  }
  close(fd);
  return response;
}

// A metric of a daemon's /metrics, summed over the series whose labels contain `labels`.
inline double MetricSum(int port, const std::string& name, const std::string& labels = "") {
  double sum = 0;
  std::istringstream in(HttpGet(port, "/metrics"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.find(labels) == std::string::npos) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

}  // namespace strata::testing_util
