// The `strata cache` daemon as an object: the block store, the CacheControl and CacheAdmin gRPC
// services (with server reflection), and the HTTP listener for /metrics and /healthz.
//
//   CacheServer server(options);
//   RETURN_IF_ERROR(server.Start());   // binds; grpc_port()/http_port() are then valid
//   server.Wait();                     // until Shutdown() from another thread
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cache_service/block_store.h"
#include "cache_service/cache_admin_service.h"
#include "cache_service/cache_control_service.h"
#include "common/http_listener.h"
#include "transfer/segment.h"
#include "transfer/transfer_server.h"

namespace strata::cache {

struct CacheServerOptions {
  StoreOptions store;
  std::string listen = "127.0.0.1:0";       // gRPC
  std::string http_listen = "127.0.0.1:0";  // /metrics, /healthz; empty: off
  std::string host_id;                      // empty: the host name
  std::string admin_token;                  // empty: admin calls refused
  absl::Duration digest_interval = absl::Seconds(30);
  // Data plane: the DRAM arena is served as transfer segment "dram" by a TransferServer
  // (transfer/transfer_server.h) on these listeners; capabilities are signed with the secret.
  std::string cluster_secret;                   // empty: MACs with the empty key (dev only)
  std::string transfer_listen = "127.0.0.1:0";  // tcp (and rdma side channel); empty: off
  std::string shm_socket_path;                  // unix socket for shm mapping; empty: off
  bool enable_rdma = true;  // serve rdma when this host has an active RDMA port (transfer.rdma.*)
  uint32_t rdma_qp_count = 4;
};

class CacheServer {
 public:
  explicit CacheServer(CacheServerOptions options);
  ~CacheServer();

  absl::Status Start();
  void Wait();
  // Stops serving (event streams end, in-flight calls finish). Idempotent.
  void Shutdown();

  int grpc_port() const { return grpc_port_; }
  int http_port() const;
  BlockStore& store() { return *store_; }

 private:
  CacheServerOptions options_;
  transfer::SegmentRegistry segments_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<transfer::TransferServer> transfer_;
  std::unique_ptr<CacheControlService> control_;
  std::unique_ptr<CacheAdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpListener> http_;
  int grpc_port_ = 0;
};

}  // namespace strata::cache
