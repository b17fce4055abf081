// SchedulerService: the Scheduler gRPC API workers talk to (proto/strata/v1/scheduler.proto).
//
//   Register        → LoadView::Register + NodeDirectory (how to reach the worker, its cache
//   server,
//                     model fingerprint, block size); answers the heartbeat interval. Then
//                     `on_register` runs (the server subscribes to the worker's cache server).
//   Heartbeat       → LoadView::Heartbeat; an unknown node is told to re-register (the scheduler
//                     restarted); answers whether the node is draining.
//   PublishKvEvents → KV events a node pushes itself, applied to the index under that node
//                     (event.source must name a registered node).
//
// Thread safety: gRPC calls these concurrently; everything they touch is thread-safe.
#pragma once

#include <functional>

#include "scheduler/kv_events.h"
#include "scheduler/scheduler.h"
#include "scheduler/server/node_directory.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::scheduler {

class SchedulerService final : public v1::Scheduler::Service {
 public:
  SchedulerService(Scheduler* scheduler, NodeDirectory* directory, KvEventSink* sink,
                   absl::Duration heartbeat_interval,
                   std::function<void(const WorkerNode&)> on_register);

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status PublishKvEvents(grpc::ServerContext* context,
                               grpc::ServerReader<v1::KvEventBatch>* reader,
                               v1::PublishKvEventsResponse* response) override;

 private:
  Scheduler* const scheduler_;
  NodeDirectory* const directory_;
  KvEventSink* const sink_;
  const absl::Duration heartbeat_interval_;
  const std::function<void(const WorkerNode&)> on_register_;
  std::atomic<uint64_t> next_anonymous_{1};
};

NodeLoad FromProto(const v1::WorkerLoad& load);
v1::WorkerLoad ToProto(const NodeLoad& load);

}  // namespace strata::scheduler
