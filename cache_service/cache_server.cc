#include "cache_service/cache_server.h"

#include "common/grpc_server.h"
#include "common/host.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

CacheServer::CacheServer(CacheServerOptions options) : options_(std::move(options)) {
  if (options_.host_id.empty()) options_.host_id = HostName();
}

CacheServer::~CacheServer() { Shutdown(); }

absl::Status CacheServer::Start() {
  const transfer::ClusterSecret secret(options_.cluster_secret);
  options_.store.issue_capability = [secret](uint64_t offset, uint64_t length, bool write,
                                             int64_t expires_ms) {
    absl::StatusOr<std::string> token = transfer::IssueCapability(
        secret, {.segment = BlockStore::kDramSegment,
                 .offset = offset,
                 .length = length,
                 .access = write ? transfer::Access::kWrite : transfer::Access::kRead,
                 .expires = absl::FromUnixMillis(expires_ms)});
    return token.ok() ? *token : std::string();
  };
  ASSIGN_OR_RETURN(store_, BlockStore::Open(options_.store));
  // The DRAM arena is the transfer segment clients write into and read from.
  transfer::Segment dram = transfer::Segment::Host(BlockStore::kDramSegment, store_->dram().base(),
                                                   store_->dram().arena_bytes());
  dram.memfd = store_->dram().memfd();
  RETURN_IF_ERROR(segments_.Register(std::move(dram)));
  if (!options_.transfer_listen.empty() || !options_.shm_socket_path.empty()) {
    ASSIGN_OR_RETURN(transfer_, transfer::TransferServer::Start(
                                    &segments_, {.host_id = options_.host_id,
                                                 .secret = secret,
                                                 .tcp_listen = options_.transfer_listen,
                                                 .shm_socket_path = options_.shm_socket_path,
                                                 .enable_rdma = options_.enable_rdma,
                                                 .rdma_qp_count = options_.rdma_qp_count}));
  }
  CacheControlService::Options control{.server_id = options_.store.server_id,
                                       .host_id = options_.host_id,
                                       .digest_interval = options_.digest_interval};
  if (transfer_) {
    for (const transfer::Endpoint& e : transfer_->endpoints()) {
      v1::TransportEndpoint ep;
      ep.set_kind(static_cast<v1::TransportKind>(e.kind));
      ep.set_address(e.address);
      ep.set_host_id(e.host_id);
      ep.set_rdma_gid(e.rdma_gid);
      ep.set_rdma_qp_count(e.rdma_qp_count);
      control.endpoints.push_back(std::move(ep));
    }
  }
  control_ = std::make_unique<CacheControlService>(*store_, std::move(control));
  admin_ = std::make_unique<CacheAdminService>(
      *store_, options_.admin_token,
      RemoteDrainOptions{.host_id = options_.host_id,
                         .cluster_secret = options_.cluster_secret,
                         .admin_token = options_.admin_token,
                         .client_id = StrCat(options_.store.server_id, "-drain")});
  ASSIGN_OR_RETURN(server_,
                   StartGrpcServer(options_.listen, {control_.get(), admin_.get()}, &grpc_port_));
  if (!options_.http_listen.empty()) {
    ASSIGN_OR_RETURN(http_, StartDiagnosticsListener(options_.http_listen));
  }
  spdlog::info("cache server {} serving gRPC on port {}, http on port {}", options_.store.server_id,
               grpc_port_, http_port());
  return absl::OkStatus();
}

int CacheServer::http_port() const { return http_ ? http_->port() : 0; }

void CacheServer::Wait() {
  if (server_) server_->Wait();
}

void CacheServer::Shutdown() {
  if (control_) control_->Shutdown();
  if (store_) store_->events().Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (http_) http_->Stop();
  // After gRPC stopped: no new leases; in-flight transfers finish before the arena goes.
  if (transfer_) transfer_->Stop();
}

}  // namespace strata::cache
