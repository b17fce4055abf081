// SchedulerServer: the `strata scheduler` daemon as an object — the cluster's front door.
//
//   gRPC (listen):       Scheduler (workers register, heartbeat, publish KV events) and
//                        SchedulerAdmin (operators; bearer token)
//   HTTP (http_listen):  the OpenAI-compatible gateway (scheduler/http/gateway_server.h), whose
//                        requests run on the workers through WorkerBackend
//   background:          a liveness thread (CheckLiveness every heartbeat interval) and one KV
//                        event stream per cache server the workers use (CacheEventSubscriber)
//
//   SchedulerServer server(options);
//   RETURN_IF_ERROR(server.Start());   // grpc_port()/http_port() are then valid
//   server.Wait();                     // until Shutdown() from another thread
//
// The model directory provides the tokenizer and chat template (the workers' model: the block
// keys the scheduler computes must match theirs, which the workers' reported fingerprint and
// block size guarantee); the model id served is the directory's name.
// Thread safety: Start/Wait/Shutdown as above; Shutdown is idempotent.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "compute_nodes/tokenizer/tokenizer.h"
#include "scheduler/http/gateway_server.h"
#include "scheduler/kv_events.h"
#include "scheduler/scheduler.h"
#include "scheduler/server/cache_event_subscriber.h"
#include "scheduler/server/channel_pool.h"
#include "scheduler/server/node_directory.h"
#include "scheduler/server/scheduler_admin_service.h"
#include "scheduler/server/scheduler_service.h"
#include "scheduler/server/worker_backend.h"

namespace strata::scheduler {

struct SchedulerServerOptions {
  std::string listen = "127.0.0.1:0";       // gRPC (Scheduler)
  std::string http_listen = "127.0.0.1:0";  // OpenAI gateway; empty: off
  std::string model_dir;                    // tokenizer.json (+ tokenizer_config.json)
  std::string model_id;                     // empty: the model directory's name
  SchedulerOptions scheduler;               // policy, heartbeat interval, objectives, ...
  int http_threads = 2;
  std::vector<std::string> api_keys;  // gateway bearer keys; empty: no authentication
  std::string admin_token;            // SchedulerAdmin bearer token; empty: admin refused
  absl::Duration request_timeout = absl::Minutes(10);
};

class SchedulerServer {
 public:
  explicit SchedulerServer(SchedulerServerOptions options);
  ~SchedulerServer();

  absl::Status Start();
  void Wait();
  void Shutdown();

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return gateway_ ? gateway_->port() : 0; }
  Scheduler& scheduler() { return *scheduler_; }
  NodeDirectory& directory() { return directory_; }
  WorkerBackend* backend() { return backend_.get(); }

 private:
  void LivenessLoop();

  SchedulerServerOptions options_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<Scheduler> scheduler_;
  NodeDirectory directory_;
  ChannelPool channels_;
  std::unique_ptr<KvEventSink> sink_;
  std::unique_ptr<CacheEventSubscriber> subscriber_;
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<SchedulerAdminService> admin_;
  std::unique_ptr<WorkerBackend> backend_;
  std::unique_ptr<GatewayServer> gateway_;
  std::unique_ptr<grpc::Server> server_;
  int grpc_port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread liveness_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace strata::scheduler
