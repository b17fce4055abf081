// SchedulerAdminService: operators inspect and steer placement (proto SchedulerAdmin):
// ListNodes (registration, load, liveness, indexed blocks), DrainNode (no new placements; the
// node hears it in its next heartbeat answer), SetPolicy, GetIndexStats.
//
// Every call must carry "authorization: Bearer <token>" (cluster.admin_token_file); with no token
// configured, admin calls are refused (PERMISSION_DENIED), as on the cache server.
// Thread safety: gRPC calls these concurrently; everything they touch is thread-safe.
#pragma once

#include <string>

#include "scheduler/scheduler.h"
#include "scheduler/server/node_directory.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::scheduler {

class SchedulerAdminService final : public v1::SchedulerAdmin::Service {
 public:
  SchedulerAdminService(Scheduler* scheduler, NodeDirectory* directory, std::string admin_token);

  grpc::Status ListNodes(grpc::ServerContext* ctx, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override;
  grpc::Status DrainNode(grpc::ServerContext* ctx, const v1::DrainNodeRequest* request,
                         v1::DrainNodeResponse* response) override;
  grpc::Status SetPolicy(grpc::ServerContext* ctx, const v1::SetPolicyRequest* request,
                         v1::SetPolicyResponse* response) override;
  grpc::Status GetIndexStats(grpc::ServerContext* ctx, const v1::GetIndexStatsRequest* request,
                             v1::GetIndexStatsResponse* response) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* ctx) const;
  void FillState(const NodeView& view, v1::NodeState* state) const;

  Scheduler* const scheduler_;
  NodeDirectory* const directory_;
  const std::string token_;
};

}  // namespace strata::scheduler
