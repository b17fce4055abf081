#include "compute_nodes/worker/worker_server.h"

#include <filesystem>

#include "common/block_format.h"
#include "common/grpc_server.h"
#include "common/host.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/engine_factory.h"
#include "compute_nodes/model/weights.h"
#include "spdlog/spdlog.h"

namespace strata::worker {

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {
  if (options_.host_id.empty()) options_.host_id = HostName();
}

WorkerServer::~WorkerServer() { Shutdown(); }

absl::Status WorkerServer::Start() {
  if (options_.role != v1::ROLE_PREFILL && options_.role != v1::ROLE_DECODE &&
      options_.role != v1::ROLE_BOTH) {
    return absl::InvalidArgumentError("worker role must be prefill, decode or both");
  }
  backend::EngineOptions engine_options;
  engine_options.backend = options_.backend;
  engine_options.model_dir = options_.model_dir;
  engine_options.num_pages = options_.kv_pages;
  engine_options.block_tokens = options_.block_tokens;
  engine_options.kv_precision =
      options_.kv_bf16 ? runtime::KvPrecision::kBf16 : runtime::KvPrecision::kF32;
  engine_options.want_fingerprint = true;
  engine_options.read_cache_in_place = options_.cache_read_in_place;
  ASSIGN_OR_RETURN(backend::OpenedEngine opened, backend::OpenEngine(engine_options));
  const ModelFingerprint fingerprint = opened.fingerprint;
  engine_ = std::move(opened.engine);
  if (options_.core.cache_codec == KvCodec::kFp8E4M3 &&
      engine_->kv_pool().layout().latent_dim % kFp8GroupSize != 0) {
    return absl::InvalidArgumentError(
        StrCat("worker.cache_codec fp8 needs a kv_lora_rank that is a multiple of ", kFp8GroupSize,
               "; this model's is ", engine_->kv_pool().layout().latent_dim));
  }
  if (std::filesystem::exists(std::filesystem::path(options_.model_dir) / "tokenizer.json")) {
    ASSIGN_OR_RETURN_WITH(tokenizer_, tokenizer::Tokenizer::Load(options_.model_dir),
                          "loading the tokenizer");
  }
  cache_client::CacheClientOptions cache{.address = options_.cache_address,
                                         .client_id = options_.node_id,
                                         .host_id = options_.host_id,
                                         .cluster_secret = options_.cluster_secret,
                                         .transfer = options_.transfer,
                                         .transfer_timeout = options_.transfer_timeout};
  if (options_.cache_faults) {
    const transfer::FaultPolicy policy = *options_.cache_faults;
    cache.wrap_transport = [policy](std::unique_ptr<transfer::Transport> t) {
      return std::make_unique<transfer::FaultInjectingTransport>(std::move(t), policy);
    };
  }
  caches_ = std::make_unique<CacheDirectory>(std::move(cache));
  if (caches_->has_local() && caches_->Get("") == nullptr) {
    // Not fatal: the worker serves by recomputation and reconnects when the server is back.
    spdlog::warn("cache server {} is not reachable yet", options_.cache_address);
  }
  core_ = std::make_unique<WorkerCore>(*engine_, *caches_, options_.core);
  core_->Start();
  if (caches_->has_local() && options_.core.resident_blocks) {
    // Operators' evictions on the cache server reach this worker's pool; the pool's hits reach
    // the server's LRU.
    resident_sync_ = std::make_unique<ResidentSync>(
        ResidentSyncOptions{.cache_address = options_.cache_address,
                            .client_id = options_.node_id + "-resident"},
        &core_->resident());
    resident_sync_->Start();
  }

  KvFormat format;
  format.codec = options_.core.cache_codec;
  format.block_tokens = static_cast<uint32_t>(options_.block_tokens);
  service_ = std::make_unique<WorkerService>(
      *core_, WorkerServiceOptions{.node_id = options_.node_id,
                                   .role = options_.role,
                                   .model = std::filesystem::path(options_.model_dir).filename(),
                                   .backend = options_.backend,
                                   .fingerprint = fingerprint,
                                   .format = format,
                                   .tokenizer = tokenizer_.get()});
  ASSIGN_OR_RETURN(server_, StartGrpcServer(options_.listen, {service_.get()}, &grpc_port_));
  if (!options_.http_listen.empty()) {
    ASSIGN_OR_RETURN(http_, StartDiagnosticsListener(options_.http_listen));
  }
  if (!options_.scheduler_address.empty()) {
    v1::NodeInfo node;
    node.set_node_id(options_.node_id);
    node.set_role(options_.role);
    node.set_host_id(options_.host_id);
    const std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
    node.set_grpc_address(StrCat(host, ":", grpc_port_));
    node.set_cache_address(options_.cache_address);
    node.set_model(std::filesystem::path(options_.model_dir).filename());
    node.mutable_kv_format()->set_codec(static_cast<v1::Codec>(options_.core.cache_codec));
    node.mutable_kv_format()->set_block_tokens(static_cast<uint32_t>(options_.block_tokens));
    node.mutable_kv_format()->set_layout_version(1);
    node.mutable_kv_format()->set_num_layers(
        static_cast<uint32_t>(engine_->config().num_hidden_layers));
    node.mutable_kv_format()->set_kv_lora_rank(
        static_cast<uint32_t>(engine_->config().kv_lora_rank));
    node.mutable_kv_format()->set_rope_dim(
        static_cast<uint32_t>(engine_->config().qk_rope_head_dim));
    node.set_total_kv_pages(static_cast<uint32_t>(options_.kv_pages));
    node.set_model_fingerprint(std::string(fingerprint.View()));
    scheduler_ = std::make_unique<SchedulerLink>(SchedulerLinkOptions{
        .address = options_.scheduler_address,
        .node = std::move(node),
        .load = [core = core_.get()] { return core->Load(); },
        .resident = options_.core.resident_blocks ? &core_->resident() : nullptr});
    scheduler_->Start();
  }
  spdlog::info("worker {} ({}) serving gRPC on port {}, HTTP on port {}, {} KV pages of {} tokens",
               options_.node_id, v1::NodeRole_Name(options_.role), grpc_port_, http_port(),
               options_.kv_pages, options_.block_tokens);
  return absl::OkStatus();
}

int WorkerServer::http_port() const { return http_ ? http_->port() : 0; }

void WorkerServer::Wait() {
  if (server_) server_->Wait();
}

void WorkerServer::Shutdown() {
  if (scheduler_) scheduler_->Stop();
  if (resident_sync_) resident_sync_->Stop();
  // Requests in flight end (Unavailable) before the RPCs waiting on them are torn down.
  if (core_) core_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (http_) http_->Stop();
}

}  // namespace strata::worker
