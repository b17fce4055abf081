#include "transfer/transfer_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/shm/shm_transport.h"
#include "transfer/tcp/tcp_transport.h"
#include "transfer/wire.h"

namespace strata::transfer {

struct TransferServer::Impl {
  const SegmentRegistry* segments = nullptr;
  TransferServerOptions options;
  int tcp_fd = -1;
  int unix_fd = -1;
  std::string tcp_bound;
  std::thread tcp_acceptor;
  std::thread unix_acceptor;
  TcpServeCounters counters;
  std::unique_ptr<RdmaResponder> rdma;  // null: no rdma on this server
  std::atomic<int64_t> shm_refused{0};

  std::mutex mu;
  bool stopping = false;              // guarded by mu
  absl::flat_hash_set<int> conn_fds;  // guarded by mu
  std::vector<std::thread> workers;   // guarded by mu

  void AcceptLoop(int listen_fd, bool is_unix) {
    while (true) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // listener shut down by Stop()
      }
      std::string peer = is_unix ? StrCat("unix:", options.shm_socket_path) : PeerName(ss);
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) {
        close(fd);
        return;
      }
      conn_fds.insert(fd);
      workers.emplace_back(
          [this, fd, peer = std::move(peer), is_unix] { Serve(fd, peer, is_unix); });
    }
  }

  static std::string PeerName(const sockaddr_storage& ss) {
    char name[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &a->sin6_addr, name, sizeof(name));
      return StrCat("[", name, "]:", ntohs(a->sin6_port));
    }
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, name, sizeof(name));
    return StrCat(name, ":", ntohs(a->sin_port));
  }

  void Serve(int fd, const std::string& peer, bool is_unix) {
    wire::SetSocketTimeouts(fd, options.handshake_timeout);
    auto purpose = wire::ServerHandshake(fd, options.secret);
    if (!purpose.ok()) {
      counters.refused.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("transfer server: refused connection from {}: {}", peer,
                   purpose.status().ToString());
    } else if (*purpose == wire::Purpose::kTcpData && !is_unix) {
      wire::SetSocketTimeouts(fd, absl::ZeroDuration());
      wire::SetSocketBuffers(fd, 4 << 20);
      int one = 1;  // responses end in a partial segment: never hold it back for an ACK
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ServeTcpConnection(fd, *segments, options.secret, peer, &counters);
    } else if (*purpose == wire::Purpose::kRdmaSideChannel && !is_unix && rdma) {
      rdma->Serve(fd, peer, &counters);
    } else if (*purpose == wire::Purpose::kShmMap && is_unix) {
      ServeShmConnection(fd, *segments, peer, &shm_refused);
    } else {
      spdlog::warn("transfer server: {} asked for an unsupported service ({}) on this listener",
                   peer, static_cast<int>(*purpose));
    }
    std::lock_guard<std::mutex> lock(mu);
    conn_fds.erase(fd);
    close(fd);
  }
};

TransferServer::TransferServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TransferServer::~TransferServer() { Stop(); }

absl::StatusOr<std::unique_ptr<TransferServer>> TransferServer::Start(
    const SegmentRegistry* segments, TransferServerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->segments = segments;
  impl->options = std::move(options);
  if (!impl->options.tcp_listen.empty()) {
    ASSIGN_OR_RETURN(impl->tcp_fd, wire::ListenTcp(impl->options.tcp_listen, &impl->tcp_bound));
  }
  if (!impl->options.shm_socket_path.empty()) {
    auto fd = wire::ListenUnix(impl->options.shm_socket_path);
    if (!fd.ok()) {
      if (impl->tcp_fd >= 0) close(impl->tcp_fd);
      return fd.status();
    }
    impl->unix_fd = *fd;
  }
  if (impl->tcp_fd >= 0 && impl->options.enable_rdma) {
    auto ctx = impl->options.rdma_context
                   ? absl::StatusOr<std::shared_ptr<rdma::VerbsContext>>(impl->options.rdma_context)
                   : rdma::OpenIbvContext();
    if (ctx.ok()) {
      impl->rdma = std::make_unique<RdmaResponder>(*ctx, segments, impl->options.secret);
    } else {
      spdlog::debug("transfer server: no rdma: {}", ctx.status().ToString());
    }
  }
  Impl* raw = impl.get();
  if (raw->tcp_fd >= 0)
    raw->tcp_acceptor = std::thread([raw] { raw->AcceptLoop(raw->tcp_fd, false); });
  if (raw->unix_fd >= 0) {
    raw->unix_acceptor = std::thread([raw] { raw->AcceptLoop(raw->unix_fd, true); });
  }
  return std::unique_ptr<TransferServer>(new TransferServer(std::move(impl)));
}

std::vector<Endpoint> TransferServer::endpoints() const {
  std::vector<Endpoint> out;
  if (impl_->tcp_fd >= 0) {
    out.push_back({.kind = TransportKind::kTcp,
                   .address = impl_->tcp_bound,
                   .host_id = impl_->options.host_id});
  }
  if (impl_->tcp_fd >= 0 && impl_->rdma) {
    const auto& gid = impl_->rdma->port().gid;
    out.push_back({.kind = TransportKind::kRdma,
                   .address = impl_->tcp_bound,
                   .host_id = impl_->options.host_id,
                   .rdma_gid = std::string(gid.begin(), gid.end()),
                   .rdma_qp_count = impl_->options.rdma_qp_count});
  }
  if (impl_->unix_fd >= 0) {
    out.push_back({.kind = TransportKind::kShm,
                   .address = impl_->options.shm_socket_path,
                   .host_id = impl_->options.host_id});
  }
  return out;
}

PeerSpec TransferServer::spec(std::string name) const {
  return {.name = std::move(name), .host_id = impl_->options.host_id, .endpoints = endpoints()};
}

void TransferServer::Stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  if (impl_->tcp_fd >= 0) shutdown(impl_->tcp_fd, SHUT_RDWR);
  if (impl_->unix_fd >= 0) shutdown(impl_->unix_fd, SHUT_RDWR);
  if (impl_->tcp_acceptor.joinable()) impl_->tcp_acceptor.join();
  if (impl_->unix_acceptor.joinable()) impl_->unix_acceptor.join();
  if (impl_->tcp_fd >= 0) close(impl_->tcp_fd);
  if (impl_->unix_fd >= 0) {
    close(impl_->unix_fd);
    unlink(impl_->options.shm_socket_path.c_str());
  }
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (int fd : impl_->conn_fds) shutdown(fd, SHUT_RDWR);
    workers.swap(impl_->workers);
  }
  for (auto& t : workers) t.join();
}

bool TransferServer::has_rdma() const { return impl_->rdma != nullptr; }

int64_t TransferServer::requests_served() const { return impl_->counters.served.load(); }
int64_t TransferServer::requests_refused() const {
  return impl_->counters.refused.load() + impl_->shm_refused.load();
}

}  // namespace strata::transfer
