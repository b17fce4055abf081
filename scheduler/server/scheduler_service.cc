#include "scheduler/server/scheduler_service.h"

#include <cstring>

#include "common/block_format.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata::scheduler {

NodeLoad FromProto(const v1::WorkerLoad& load) {
  NodeLoad n;
  n.queued_requests = load.queued_requests();
  n.running_requests = load.running_requests();
  n.queued_prefill_tokens = load.queued_prefill_tokens();
  n.running_tokens = load.running_tokens();
  n.free_kv_pages = load.free_kv_pages();
  n.total_kv_pages = load.total_kv_pages();
  n.prefill_ms_per_token = load.prefill_ms_per_token();
  n.decode_step_ms = load.decode_step_ms();
  n.decode_batch_size = load.decode_batch_size();
  return n;
}

v1::WorkerLoad ToProto(const NodeLoad& n) {
  v1::WorkerLoad load;
  load.set_queued_requests(n.queued_requests);
  load.set_running_requests(n.running_requests);
  load.set_queued_prefill_tokens(n.queued_prefill_tokens);
  load.set_running_tokens(n.running_tokens);
  load.set_free_kv_pages(n.free_kv_pages);
  load.set_total_kv_pages(n.total_kv_pages);
  load.set_prefill_ms_per_token(n.prefill_ms_per_token);
  load.set_decode_step_ms(n.decode_step_ms);
  load.set_decode_batch_size(n.decode_batch_size);
  return load;
}

SchedulerService::SchedulerService(Scheduler* scheduler, NodeDirectory* directory,
                                   KvEventSink* sink, absl::Duration heartbeat_interval,
                                   std::function<void(const WorkerNode&)> on_register)
    : scheduler_(scheduler),
      directory_(directory),
      sink_(sink),
      heartbeat_interval_(heartbeat_interval),
      on_register_(std::move(on_register)) {}

grpc::Status SchedulerService::Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                                        v1::RegisterResponse* response) {
  const v1::NodeInfo& info = request->node();
  NodeRoleKind role;
  switch (info.role()) {
    case v1::ROLE_PREFILL:
      role = NodeRoleKind::kPrefill;
      break;
    case v1::ROLE_DECODE:
      role = NodeRoleKind::kDecode;
      break;
    case v1::ROLE_BOTH:
      role = NodeRoleKind::kBoth;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "only workers (prefill, decode, both) register with the scheduler");
  }
  if (info.grpc_address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node.grpc_address is empty");
  }
  WorkerNode node;
  if (!info.model_fingerprint().empty()) {
    if (info.model_fingerprint().size() != node.fingerprint.bytes.size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "node.model_fingerprint must have 32 bytes");
    }
    std::memcpy(node.fingerprint.bytes.data(), info.model_fingerprint().data(),
                node.fingerprint.bytes.size());
    node.has_fingerprint = true;
  }
  const uint32_t block_tokens = info.kv_format().block_tokens();
  if (block_tokens != 0 && (block_tokens < 16 || (block_tokens & (block_tokens - 1)) != 0)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "node.kv_format.block_tokens must be a power of two >= 16");
  }
  node.block_tokens = block_tokens != 0 ? block_tokens : kDefaultBlockTokens;
  const v1::KvFormat& f = info.kv_format();
  switch (info.kv_format().codec()) {
    case v1::CODEC_UNSPECIFIED:
    case v1::CODEC_BF16:
      node.codec = KvCodec::kBf16;
      break;
    case v1::CODEC_FP8_E4M3:
      node.codec = KvCodec::kFp8E4M3;
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node.kv_format.codec is unknown");
  }
  if (f.num_layers() > 0 && f.kv_lora_rank() > 0 && f.rope_dim() > 0) {
    const BlockLayout layout{.codec = node.codec,
                             .n_layers = f.num_layers(),
                             .block_tokens = node.block_tokens,
                             .kv_lora_rank = f.kv_lora_rank(),
                             .rope_dim = f.rope_dim()};
    if (ValidateBlockLayout(layout).ok()) {
      node.kv_bytes_per_token = double(layout.BytesPerTokenPerLayer()) * f.num_layers();
    }
  }
  if (node.has_fingerprint) {
    // One cluster, one way of naming blocks: a worker that disagrees would never hit the cache.
    std::optional<WorkerNode> ref = directory_->Reference();
    if (ref.has_value() && ref->id != info.node_id() &&
        (ref->fingerprint != node.fingerprint || ref->block_tokens != node.block_tokens ||
         ref->codec != node.codec)) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          StrCat("node ", info.node_id(),
                 " serves another model, block size or cache codec than node ", ref->id));
    }
  }
  node.id = info.node_id().empty() ? StrCat("node-", next_anonymous_.fetch_add(1)) : info.node_id();
  node.host = info.host_id();
  node.grpc_address = info.grpc_address();
  node.cache_address = info.cache_address();
  node.model = info.model();
  node.role = info.role();
  node.index = scheduler_->load().Register(node.id, node.host, role, absl::Now());
  directory_->Upsert(node);
  spdlog::info("scheduler: node {} ({}) registered at {}, cache {}", node.id,
               v1::NodeRole_Name(node.role), node.grpc_address,
               node.cache_address.empty() ? "none" : node.cache_address);
  if (on_register_) on_register_(node);
  response->set_node_id(node.id);
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(heartbeat_interval_)));
  return grpc::Status::OK;
}

grpc::Status SchedulerService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* response) {
  LoadView& load = scheduler_->load();
  absl::Status st = load.Heartbeat(request->node_id(), FromProto(request->load()), absl::Now());
  if (absl::IsNotFound(st)) {
    response->set_reregister(true);
    return grpc::Status::OK;
  }
  if (auto index = load.Find(request->node_id()); index.ok()) {
    for (const NodeView& n : load.Snapshot()) {
      if (n.index == *index) response->set_draining(n.draining);
    }
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::PublishKvEvents(grpc::ServerContext*,
                                               grpc::ServerReader<v1::KvEventBatch>* reader,
                                               v1::PublishKvEventsResponse* response) {
  v1::KvEventBatch batch;
  uint64_t accepted = 0;
  while (reader->Read(&batch)) {
    for (const v1::KvEvent& event : batch.events()) {
      auto node = scheduler_->load().Find(event.source());
      if (!node.ok()) continue;  // not (yet) registered: the next digest brings it in
      if (sink_->Apply(*node, event).ok()) ++accepted;
    }
  }
  response->set_accepted(accepted);
  return grpc::Status::OK;
}

}  // namespace strata::scheduler
