// The cache client's internals, shared by its source files (cache_client.cc: connecting and
// saving; fetch.cc: fetching): its metrics, the helpers for block transfers, the data path, and
// CacheClient::Impl. Not for use outside compute_nodes/cache_client/.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/strings.h"
#include "compute_nodes/cache_client/cache_client.h"
#include "compute_nodes/cache_client/save_queue.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"
#include "transfer/transfer_engine.h"

namespace strata::cache_client {
namespace internal {

// Process-wide metric families, registered once.
struct ClientMetrics {
  MetricFamily<Counter>& fetched;
  MetricFamily<Counter>& fetch_failures;
  MetricFamily<Counter>& saved;
  MetricFamily<Counter>& bytes;
  Counter& in_place;

  static ClientMetrics& Get() {
    static ClientMetrics* m = [] {
      MetricsRegistry& r = MetricsRegistry::Default();
      return new ClientMetrics{
          r.AddCounter("strata_cache_client_fetched_blocks_total",
                       "Blocks fetched from a cache server and verified, per tier", {"tier"}),
          r.AddCounter("strata_cache_client_fetch_failures_total",
                       "Fetches whose verified prefix ended early, per reason", {"reason"}),
          r.AddCounter("strata_cache_client_saved_blocks_total",
                       "Blocks offered to a cache server, per outcome", {"outcome"}),
          r.AddCounter("strata_cache_client_bytes_total",
                       "Block bytes moved to or from cache servers", {"direction", "transport"}),
          r.AddCounter("strata_cache_client_in_place_blocks_total",
                       "Fetched blocks the caller took from the server's shared memory, uncopied",
                       {})
              .Labels({}),
      };
    }();
    return *m;
  }
};

inline std::string KeyBytes(const BlockKey& key) { return std::string(key.View()); }

// The peer's transfer endpoints as the engine wants them.
inline transfer::PeerSpec PeerSpecOf(const std::string& name, const std::string& host_id,
                                     const v1::SegmentDescriptor& segment) {
  transfer::PeerSpec spec;
  spec.name = name;
  spec.host_id = host_id;
  for (const auto& ep : segment.endpoints()) {
    spec.endpoints.push_back({.kind = static_cast<transfer::TransportKind>(ep.kind()),
                              .address = ep.address(),
                              .host_id = ep.host_id(),
                              .rdma_gid = ep.rdma_gid(),
                              .rdma_qp_count = ep.rdma_qp_count()});
  }
  return spec;
}

// One transfer of a whole block between `local` and the slot `loc` names.
inline transfer::TransferOp BlockOp(transfer::OpKind kind, uint8_t* local,
                                    const v1::BlockLocation& loc, uint64_t length,
                                    uint64_t checksum) {
  transfer::TransferOp op;
  op.op = kind;
  op.local = local;
  op.segment = loc.segment();
  op.offset = loc.offset();
  op.length = length;
  op.capability = loc.capability();
  op.checksum = checksum;
  return op;
}

// Submits `ops` and waits for all of them. `keep_alive` owns the local buffers: the batch holds
// it until its last request completed, so buffers stay valid even if the wait gives up first.
inline std::shared_ptr<transfer::Batch> RunBatch(transfer::TransferEngine& engine,
                                                 transfer::Peer& peer,
                                                 std::vector<transfer::TransferOp> ops,
                                                 absl::Duration timeout,
                                                 std::shared_ptr<const void> keep_alive) {
  auto batch =
      engine.Submit(peer, std::move(ops),
                    {.timeout = timeout, .on_done = [keep_alive](const transfer::Batch&) {}});
  // The engine ends every request shortly after its deadline; the slack covers a loaded host.
  batch->Wait(timeout + absl::Seconds(2));
  return batch;
}

struct DataPath {
  std::shared_ptr<transfer::Peer> peer;
  std::string label;  // the transport: "shm" | "tcp" | "rdma"
};

}  // namespace internal

struct CacheClient::Impl {
  CacheClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CacheControl::Stub> stub;
  std::string server_id;                             // as of Connect
  std::unique_ptr<transfer::TransferEngine> engine;  // outlives every DataPath
  internal::ClientMetrics& metrics = internal::ClientMetrics::Get();

  // The data path, replaced when it goes stale: a restarted server listens for transfers on new
  // ports (and a new shm arena), so a failed transfer or an unreachable server marks the path
  // stale and the next Fetch or Save re-runs CacheControl.Connect and opens a new peer. Each
  // call keeps its own reference to the path it started with.
  mutable std::mutex path_mu;
  std::shared_ptr<const internal::DataPath> path ABSL_GUARDED_BY(path_mu);
  bool path_stale ABSL_GUARDED_BY(path_mu) = false;
  absl::Time path_opened ABSL_GUARDED_BY(path_mu);
  std::mutex reopen_mu;  // one re-open at a time

  std::mutex queue_mu;
  std::unique_ptr<SaveQueue> queue;  // created by the first SaveAsync; drained before the rest

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  // `context` names the call in the message: "cache server 127.0.0.1:7400: Lookup: ...".
  absl::Status RpcError(const grpc::Status& status, std::string_view call) {
    const absl::Status s = FromGrpcStatus(status);
    if (absl::IsUnavailable(s)) MaybeStale(s);  // the server may come back elsewhere
    return absl::Status(s.code(),
                        StrCat("cache server ", options.address, ": ", call, ": ", s.message()));
  }

  // CacheControl.Connect, then a transfer peer to the server's "dram" segment.
  absl::StatusOr<std::shared_ptr<const internal::DataPath>> OpenDataPath(
      std::string* server_id_out) {
    v1::ConnectRequest req;
    req.set_client_id(options.client_id);
    req.set_host_id(options.host_id);
    if (options.force_transport) {
      req.add_transports(static_cast<v1::TransportKind>(*options.force_transport));
    } else {
      for (transfer::TransportKind k : engine->available_transports()) {
        req.add_transports(static_cast<v1::TransportKind>(k));
      }
    }
    v1::ConnectResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    if (const grpc::Status s = stub->Connect(&ctx, req, &resp); !s.ok()) {
      return absl::UnavailableError(StrCat("cannot reach cache server ", options.address,
                                           " within ", absl::FormatDuration(options.rpc_timeout),
                                           ": ", s.error_message()));
    }
    const v1::SegmentDescriptor* dram = nullptr;
    for (const auto& seg : resp.segments()) {
      if (seg.name() == "dram") dram = &seg;
    }
    if (dram == nullptr) {
      return absl::FailedPreconditionError(StrCat("cache server ", options.address, " (",
                                                  resp.server_id(), ") offers no 'dram' segment"));
    }
    absl::StatusOr<std::shared_ptr<transfer::Peer>> peer = engine->OpenPeer(
        internal::PeerSpecOf(StrCat("cache ", resp.server_id()), resp.host_id(), *dram));
    if (!peer.ok()) {
      return absl::Status(
          absl::IsFailedPrecondition(peer.status()) ? peer.status().code()
                                                    : absl::StatusCode::kUnavailable,
          StrCat("cache server ", options.address, ": no data path: ", peer.status().message()));
    }
    if (server_id_out != nullptr) *server_id_out = resp.server_id();
    auto path = std::make_shared<internal::DataPath>();
    path->label = std::string(transfer::TransportKindName((*peer)->transport()));
    path->peer = std::move(*peer);
    return std::shared_ptr<const internal::DataPath>(std::move(path));
  }

  // The current data path; re-opened first when it is stale (at most once a second, unless
  // `now`: a read that just failed on a path that answered a Lookup a moment ago).
  std::shared_ptr<const internal::DataPath> Path(bool now = false) {
    {
      std::lock_guard<std::mutex> lock(path_mu);
      if (!path_stale || (!now && absl::Now() - path_opened < absl::Seconds(1))) return path;
    }
    std::unique_lock<std::mutex> reopen(reopen_mu, std::try_to_lock);
    std::unique_lock<std::mutex> lock(path_mu);
    if (!reopen.owns_lock() || !path_stale) return path;  // another call is re-opening it
    path_opened = absl::Now();
    lock.unlock();
    absl::StatusOr<std::shared_ptr<const internal::DataPath>> fresh = OpenDataPath(nullptr);
    lock.lock();
    if (fresh.ok()) {
      spdlog::info("cache client {}: data path to {} re-opened over {}", options.client_id,
                   options.address, (*fresh)->label);
      path = std::move(*fresh);
      path_stale = false;
    } else {
      spdlog::debug("cache client {}: re-opening the data path: {}", options.client_id,
                    ToStd(fresh.status().message()));
    }
    return path;
  }

  // After a failure that a restarted or unreachable server would cause.
  void MaybeStale(const absl::Status& status) {
    if (absl::IsUnavailable(status) || absl::IsCancelled(status) || absl::IsDataLoss(status) ||
        absl::IsNotFound(status) || absl::IsPermissionDenied(status)) {
      std::lock_guard<std::mutex> lock(path_mu);
      path_stale = true;
    }
  }

  void ReleaseLease(uint64_t lease_id) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ReleaseRequest req;
    req.set_lease_id(lease_id);
    v1::ReleaseResponse resp;
    const grpc::Status s = stub->Release(&ctx, req, &resp);
    if (!s.ok()) {
      // The lease expires on the server anyway; only its blocks stay pinned until then.
      spdlog::debug("cache client: release of lease {} at {}: {}", lease_id, options.address,
                    s.error_message());
    }
  }
};

}  // namespace strata::cache_client
