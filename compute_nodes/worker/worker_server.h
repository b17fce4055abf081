// The `strata worker` daemon as an object: loads the model on its backend, connects to its cache
// server, runs the WorkerCore, serves the Worker gRPC API (with reflection) and /metrics +
// /healthz, and registers with the scheduler when one is configured.
//
//   WorkerServer server(options);
//   RETURN_IF_ERROR(server.Start());   // grpc_port()/http_port() are then valid
//   server.Wait();                     // until Shutdown() from another thread
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/http_listener.h"
#include "compute_nodes/runtime/engine.h"
#include "compute_nodes/tokenizer/tokenizer.h"
#include "compute_nodes/worker/cache_directory.h"
#include "compute_nodes/worker/resident_sync.h"
#include "compute_nodes/worker/scheduler_link.h"
#include "compute_nodes/worker/worker_core.h"
#include "compute_nodes/worker/worker_service.h"
#include "transfer/fault/fault_transport.h"

namespace strata::worker {

struct WorkerServerOptions {
  std::string node_id = "worker-0";
  v1::NodeRole role = v1::ROLE_BOTH;
  std::string model_dir;
  std::string backend = "cpu";
  std::string listen = "127.0.0.1:0";       // gRPC
  std::string http_listen = "127.0.0.1:0";  // /metrics, /healthz; empty: off
  std::string host_id;                      // empty: the host name
  std::string cache_address;      // this host's cache server; empty: no cache (recompute all)
  std::string scheduler_address;  // empty: run standalone
  std::string cluster_secret;
  int64_t kv_pages = 256;
  int64_t block_tokens = 64;
  bool kv_bf16 = true;  // round the KV pool to bf16, so cached blocks restore exactly
  // cuda: the KV pool reads cached blocks in place from this host's cache server's shm arena.
  bool cache_read_in_place = true;
  WorkerCoreOptions core;
  // Config `transfer.*` for the cache client's transfer engine (unset: its defaults).
  std::optional<transfer::EngineOptions> transfer;
  absl::Duration transfer_timeout = absl::Seconds(10);  // each batch of block reads or writes
  // Tests: fault injection on the cache data plane (probabilities of transfer/fault).
  std::optional<transfer::FaultPolicy> cache_faults;
};

class WorkerServer {
 public:
  explicit WorkerServer(WorkerServerOptions options);
  ~WorkerServer();

  absl::Status Start();
  void Wait();
  void Shutdown();  // idempotent

  int grpc_port() const { return grpc_port_; }
  int http_port() const;
  WorkerCore& core() { return *core_; }

 private:
  WorkerServerOptions options_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<CacheDirectory> caches_;
  std::unique_ptr<WorkerCore> core_;
  std::unique_ptr<ResidentSync> resident_sync_;  // with resident blocks and a cache server
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpListener> http_;
  std::unique_ptr<SchedulerLink> scheduler_;
  int grpc_port_ = 0;
};

}  // namespace strata::worker
