#include "scheduler/server/scheduler_admin_service.h"

#include "common/bearer_auth.h"
#include "common/grpc_status.h"
#include "scheduler/server/scheduler_service.h"
#include "spdlog/spdlog.h"

namespace strata::scheduler {

SchedulerAdminService::SchedulerAdminService(Scheduler* scheduler, NodeDirectory* directory,
                                             std::string admin_token)
    : scheduler_(scheduler), directory_(directory), token_(std::move(admin_token)) {}

grpc::Status SchedulerAdminService::Authorize(const grpc::ServerContext* ctx) const {
  return CheckBearerToken(*ctx, token_, "scheduler admin");
}

#define STRATA_ADMIN_AUTH()                             \
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) { \
    return auth;                                        \
  }

void SchedulerAdminService::FillState(const NodeView& view, v1::NodeState* state) const {
  v1::NodeInfo* info = state->mutable_node();
  info->set_node_id(view.id);
  info->set_host_id(view.host);
  if (auto node = directory_->Get(view.index); node.has_value()) {
    info->set_role(node->role);
    info->set_grpc_address(node->grpc_address);
    info->set_cache_address(node->cache_address);
    info->set_model(node->model);
    info->mutable_kv_format()->set_block_tokens(node->block_tokens);
    info->mutable_kv_format()->set_codec(static_cast<v1::Codec>(node->codec));
    if (node->has_fingerprint) info->set_model_fingerprint(std::string(node->fingerprint.View()));
  }
  *state->mutable_load() = ToProto(view.load);
  state->set_alive(view.alive);
  state->set_draining(view.draining);
  state->set_last_heartbeat_unix_ms(absl::ToUnixMillis(view.last_heartbeat));
  state->set_indexed_blocks(scheduler_->index().BlocksHeldBy(view.index));
}

grpc::Status SchedulerAdminService::ListNodes(grpc::ServerContext* ctx, const v1::ListNodesRequest*,
                                              v1::ListNodesResponse* response) {
  STRATA_ADMIN_AUTH();
  for (const NodeView& view : scheduler_->load().Snapshot()) FillState(view, response->add_nodes());
  response->set_policy(scheduler_->policy_name());
  return grpc::Status::OK;
}

grpc::Status SchedulerAdminService::DrainNode(grpc::ServerContext* ctx,
                                              const v1::DrainNodeRequest* request,
                                              v1::DrainNodeResponse* response) {
  STRATA_ADMIN_AUTH();
  LoadView& load = scheduler_->load();
  if (absl::Status st = load.SetDraining(request->node_id(), !request->undrain()); !st.ok()) {
    return ToGrpcStatus(st);
  }
  spdlog::info("scheduler admin: node {} {}", request->node_id(),
               request->undrain() ? "undrained" : "draining");
  auto index = load.Find(request->node_id());
  for (const NodeView& view : load.Snapshot()) {
    if (index.ok() && view.index == *index) FillState(view, response->mutable_node());
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerAdminService::SetPolicy(grpc::ServerContext* ctx,
                                              const v1::SetPolicyRequest* request,
                                              v1::SetPolicyResponse* response) {
  STRATA_ADMIN_AUTH();
  response->set_previous(scheduler_->policy_name());
  if (absl::Status st = scheduler_->SetPolicy(request->policy()); !st.ok()) {
    return ToGrpcStatus(st);
  }
  spdlog::info("scheduler admin: policy {} → {}", response->previous(), request->policy());
  return grpc::Status::OK;
}

grpc::Status SchedulerAdminService::GetIndexStats(grpc::ServerContext* ctx,
                                                  const v1::GetIndexStatsRequest*,
                                                  v1::GetIndexStatsResponse* response) {
  STRATA_ADMIN_AUTH();
  const PrefixIndexStats s = scheduler_->index().Stats();
  response->set_indexed_blocks(s.indexed_blocks);
  response->set_holders(s.holders);
  response->set_memory_bytes(s.memory_bytes);
  response->set_capacity_blocks(s.capacity_blocks);
  response->set_evicted_entries(s.evicted_entries);
  response->set_events_applied(s.events_applied);
  response->set_digests_applied(s.digests_applied);
  return grpc::Status::OK;
}

}  // namespace strata::scheduler
