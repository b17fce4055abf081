// TransferServer: the owner side of the transfer engine. A process that owns segments (the cache
// server, a worker exposing its KV pool) runs one; remote peers reach its segments through it.
//
// It listens on
//   - TCP ("host:port", port 0 = chosen by the OS): the tcp transport's requests (framed, see
//     transfer/wire.h) and the rdma side channel (queue-pair set-up, rkeys: rdma_transport.h);
//   - a unix socket (when shm_socket_path is set): shm map requests, answered by passing the
//     segment's memfd with SCM_RIGHTS.
// Every connection starts with mutual authentication over the cluster secret. Every tcp request
// is checked against its capability (VerifyCapability) and the segment bounds; refusals are
// answered with PermissionDenied / OutOfRange / NotFound and logged with the peer address.
//
// Threads: one acceptor per listener, one thread per accepted connection (connections are few:
// a handful per peer). Stop() (or the destructor) closes the listeners and every connection and
// joins the threads; after it returns no thread touches a segment.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/capability.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace strata::transfer {

namespace rdma {
class VerbsContext;
}

struct TransferServerOptions {
  std::string host_id;
  ClusterSecret secret;
  std::string tcp_listen = "127.0.0.1:0";  // empty: no tcp listener
  std::string shm_socket_path;             // empty: no shm listener
  absl::Duration handshake_timeout = absl::Seconds(5);
  // rdma (needs the tcp listener, which carries the side channel): serve one-sided access with
  // `rdma_context`, or, when unset, with rdma::OpenIbvContext(); with no device the server
  // offers no rdma endpoint (peers use tcp). Tests pass a fake NIC.
  bool enable_rdma = true;
  std::shared_ptr<rdma::VerbsContext> rdma_context;
  uint32_t rdma_qp_count = 4;  // advertised in the rdma endpoint
};

class TransferServer {
 public:
  // `segments` must outlive the server.
  static absl::StatusOr<std::unique_ptr<TransferServer>> Start(const SegmentRegistry* segments,
                                                               TransferServerOptions options);
  ~TransferServer();

  // The endpoints peers use to reach this server (tcp with the bound port; shm and rdma when
  // enabled and available).
  std::vector<Endpoint> endpoints() const;
  PeerSpec spec(std::string name) const;

  void Stop();

  // Counters for tests and metrics.
  int64_t requests_served() const;
  int64_t requests_refused() const;
  bool has_rdma() const;

  struct Impl;

 private:
  explicit TransferServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::transfer
