// CacheControl gRPC service (proto/strata/v1/cache.proto): a thin adapter over BlockStore that
// maps statuses, records latencies and streams KV events with periodic digests.
//
// Thread safety: gRPC calls handlers concurrently; the store is thread-safe. Shutdown() ends
// every event stream so the server can stop.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "cache_service/block_store.h"
#include "common/metrics.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::cache {

class CacheControlService final : public v1::CacheControl::Service {
 public:
  struct Options {
    std::string server_id;
    std::string host_id;
    absl::Duration digest_interval = absl::Seconds(30);
    uint32_t digest_page_keys = 4096;
    // Data-plane endpoints of the DRAM segment (the TransferServer's); empty: only the raw
    // memfd path for same-host mapping.
    std::vector<v1::TransportEndpoint> endpoints;
  };
  CacheControlService(BlockStore& store, Options options);

  grpc::Status Connect(grpc::ServerContext* ctx, const v1::ConnectRequest* req,
                       v1::ConnectResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                      v1::LookupResponse* resp) override;
  grpc::Status Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* req,
                       v1::ReserveResponse* resp) override;
  grpc::Status Commit(grpc::ServerContext* ctx, const v1::CommitRequest* req,
                      v1::CommitResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override;
  grpc::Status KeepAlive(grpc::ServerContext* ctx, const v1::KeepAliveRequest* req,
                         v1::KeepAliveResponse* resp) override;
  grpc::Status Touch(grpc::ServerContext* ctx, const v1::TouchRequest* req,
                     v1::TouchResponse* resp) override;
  grpc::Status SubscribeEvents(grpc::ServerContext* ctx, const v1::SubscribeEventsRequest* req,
                               grpc::ServerWriter<v1::KvEventBatch>* writer) override;

  void Shutdown() { shutdown_.store(true); }

 private:
  // Sends one digest (all pages, every tier) to `writer`. False when the stream broke.
  bool SendDigest(grpc::ServerWriter<v1::KvEventBatch>* writer, uint64_t digest_id);

  BlockStore& store_;
  const Options options_;
  std::atomic<bool> shutdown_{false};
  std::atomic<uint64_t> next_digest_{1};
  MetricFamily<Histogram>& latency_;
  // Payload bytes handed to / taken from clients per transport: the one Connect chose for the
  // client id (a client that never connected counts as "unknown"). shm bytes never pass through
  // this process (clients copy into and out of the arena themselves): they are counted when the
  // slots or read leases are granted.
  MetricFamily<Counter>& transport_bytes_;
  std::string TransportOf(const std::string& client_id);
  std::mutex clients_mu_;
  absl::flat_hash_map<std::string, std::string> client_transport_ ABSL_GUARDED_BY(clients_mu_);
};

}  // namespace strata::cache
