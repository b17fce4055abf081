#include "transfer/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"

namespace strata::transfer::wire {
namespace {

constexpr uint32_t kHelloMagic = 0x49485453;  // "STHI"
constexpr uint8_t kWireVersion = 1;

absl::Status SplitHostPort(std::string_view address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(StrCat("address '", address, "' is not host:port"));
  }
  *host = std::string(address.substr(0, colon));
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = std::string(address.substr(colon + 1));
  return absl::OkStatus();
}

// Connects a non-blocking socket with a timeout, then makes it blocking again.
absl::Status ConnectWithTimeout(int fd, const sockaddr* addr, socklen_t len, absl::Duration timeout,
                                std::string_view what) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, addr, len);
  // EINTR: the connection goes on being set up in the background, as with EINPROGRESS.
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
    return absl::UnavailableError(StrCat("connecting to ", what, ": ", strerror(errno)));
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    const absl::Time deadline = absl::Now() + timeout;
    do {
      const int ms =
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      rc = poll(&p, 1, ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) return absl::UnavailableError(StrCat("connecting to ", what, ": timed out"));
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (rc < 0 || err != 0) {
      return absl::UnavailableError(
          StrCat("connecting to ", what, ": ", strerror(rc < 0 ? errno : err)));
    }
  }
  fcntl(fd, F_SETFL, flags);
  return absl::OkStatus();
}

std::string HandshakeData(char side, const uint8_t* cn, const uint8_t* sn, Purpose purpose) {
  std::string d(1, side);
  d.append(reinterpret_cast<const char*>(cn), 16);
  d.append(reinterpret_cast<const char*>(sn), 16);
  d.push_back(static_cast<char>(purpose));
  return d;
}

}  // namespace

absl::StatusOr<int> DialTcp(std::string_view address, absl::Duration timeout) {
  std::string host, port;
  RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(StrCat("resolving ", address, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(StrCat("no address for ", address));
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    last = ConnectWithTimeout(fd, ai->ai_addr, ai->ai_addrlen, timeout, address);
    if (last.ok()) {
      freeaddrinfo(res);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return last;
}

absl::StatusOr<int> ListenTcp(std::string_view address, std::string* bound) {
  std::string host, port;
  RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(StrCat("resolving ", address, ": ", gai_strerror(rc)));
  }
  const int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return ErrnoToStatus(errno, "socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    const int err = errno;
    freeaddrinfo(res);
    close(fd);
    return ErrnoToStatus(err, StrCat("listening on ", address));
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char name[INET6_ADDRSTRLEN] = {0};
  int bound_port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, name, sizeof(name));
    bound_port = ntohs(a->sin6_port);
    *bound = StrCat("[", name, "]:", bound_port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, name, sizeof(name));
    bound_port = ntohs(a->sin_port);
    *bound = StrCat(name, ":", bound_port);
  }
  return fd;
}

absl::StatusOr<int> DialUnix(const std::string& path, absl::Duration timeout) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(StrCat("unix socket path too long: ", path));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  auto st = ConnectWithTimeout(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr), timeout, path);
  if (!st.ok()) {
    close(fd);
    return st;
  }
  return fd;
}

absl::StatusOr<int> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(StrCat("unix socket path too long: ", path));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, StrCat("listening on ", path));
  }
  return fd;
}

void SetSocketTimeouts(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void SetSocketBuffers(int fd, int bytes) {
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

namespace {
absl::Status IoError(int err, std::string_view what) {
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return absl::DeadlineExceededError(StrCat(what, ": timed out"));
  }
  return absl::UnavailableError(StrCat(what, ": ", strerror(err)));
}
}  // namespace

absl::Status SendAll(int fd, const void* data, size_t size) {
  iovec iov{const_cast<void*>(data), size};
  return SendIov(fd, &iov, 1);
}

absl::Status SendIov(int fd, struct iovec* iov, int n) {
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(n, IOV_MAX));
    const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "send");
    }
    size_t left = static_cast<size_t>(sent);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t got = recv(fd, p, size, MSG_WAITALL);
    if (got == 0) return absl::UnavailableError("connection closed by peer");
    if (got < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "recv");
    }
    p += got;
    size -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status ClientHandshake(int fd, const ClusterSecret& secret, Purpose purpose) {
  uint8_t hello[4 + 1 + 1 + 16];
  std::memcpy(hello, &kHelloMagic, 4);
  hello[4] = kWireVersion;
  hello[5] = static_cast<uint8_t>(purpose);
  uint8_t* cn = hello + 6;
  RAND_bytes(cn, 16);
  RETURN_IF_ERROR_WITH(SendAll(fd, hello, sizeof(hello)), "handshake");
  uint8_t challenge[16 + 32];
  RETURN_IF_ERROR_WITH(RecvAll(fd, challenge, sizeof(challenge)), "handshake");
  const std::string server_mac = secret.Mac(HandshakeData('S', cn, challenge, purpose));
  if (CRYPTO_memcmp(server_mac.data(), challenge + 16, 32) != 0) {
    return absl::UnavailableError("handshake: the peer does not hold our cluster secret");
  }
  const std::string proof = secret.Mac(HandshakeData('C', cn, challenge, purpose));
  RETURN_IF_ERROR_WITH(SendAll(fd, proof.data(), proof.size()), "handshake");
  uint8_t ok = 0;
  auto st = RecvAll(fd, &ok, 1);
  if (!st.ok() || ok != 1) {
    return absl::UnavailableError("handshake: the peer refused our cluster secret");
  }
  return absl::OkStatus();
}

absl::StatusOr<Purpose> ServerHandshake(int fd, const ClusterSecret& secret) {
  uint8_t hello[4 + 1 + 1 + 16];
  RETURN_IF_ERROR_WITH(RecvAll(fd, hello, sizeof(hello)), "handshake");
  uint32_t magic;
  std::memcpy(&magic, hello, 4);
  if (magic != kHelloMagic || hello[4] != kWireVersion || hello[5] < 1 || hello[5] > 3) {
    return absl::PermissionDeniedError("handshake: not a Strata transfer client");
  }
  const Purpose purpose = static_cast<Purpose>(hello[5]);
  const uint8_t* cn = hello + 6;
  uint8_t challenge[16 + 32];
  RAND_bytes(challenge, 16);
  const std::string mac = secret.Mac(HandshakeData('S', cn, challenge, purpose));
  std::memcpy(challenge + 16, mac.data(), 32);
  RETURN_IF_ERROR_WITH(SendAll(fd, challenge, sizeof(challenge)), "handshake");
  uint8_t proof[32];
  RETURN_IF_ERROR_WITH(RecvAll(fd, proof, sizeof(proof)), "handshake");
  const std::string expected = secret.Mac(HandshakeData('C', cn, challenge, purpose));
  if (CRYPTO_memcmp(expected.data(), proof, 32) != 0) {
    return absl::PermissionDeniedError("handshake: client proof does not match the cluster secret");
  }
  const uint8_t ok = 1;
  RETURN_IF_ERROR_WITH(SendAll(fd, &ok, 1), "handshake");
  return purpose;
}

absl::Status SendFd(int fd, int fd_to_send, const void* data, size_t size) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd_to_send >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_send, sizeof(int));
  }
  ssize_t sent;
  do {
    sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);  // a signal before anything was sent: nothing consumed
  if (sent < 0) return IoError(errno, "sendmsg(SCM_RIGHTS)");
  if (static_cast<size_t>(sent) != size) return absl::UnavailableError("short sendmsg(SCM_RIGHTS)");
  return absl::OkStatus();
}

absl::StatusOr<int> RecvFd(int fd, void* data, size_t size) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);  // a signal before anything arrived: nothing consumed
  if (got == 0) return absl::UnavailableError("connection closed by peer");
  if (got < 0) return IoError(errno, "recvmsg(SCM_RIGHTS)");
  if (static_cast<size_t>(got) != size) return absl::UnavailableError("short recvmsg");
  int received = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&received, CMSG_DATA(c), sizeof(int));
    }
  }
  return received;
}

}  // namespace strata::transfer::wire
