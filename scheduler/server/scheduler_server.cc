#include "scheduler/server/scheduler_server.h"

#include <filesystem>

#include "common/grpc_server.h"
#include "common/http_listener.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata::scheduler {

SchedulerServer::SchedulerServer(SchedulerServerOptions options) : options_(std::move(options)) {}

SchedulerServer::~SchedulerServer() { Shutdown(); }

absl::Status SchedulerServer::Start() {
  if (options_.model_dir.empty()) {
    return absl::InvalidArgumentError("scheduler.model names no model directory (tokenizer)");
  }
  ASSIGN_OR_RETURN_WITH(tokenizer_, tokenizer::Tokenizer::Load(options_.model_dir),
                        StrCat("loading the tokenizer from ", options_.model_dir));
  if (options_.model_id.empty()) {
    options_.model_id =
        std::filesystem::path(options_.model_dir).lexically_normal().filename().string();
    if (options_.model_id.empty()) {
      options_.model_id =
          std::filesystem::path(options_.model_dir).lexically_normal().parent_path().filename();
    }
  }
  ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(options_.scheduler));
  sink_ = std::make_unique<KvEventSink>(&scheduler_->index());
  subscriber_ =
      std::make_unique<CacheEventSubscriber>(&directory_, sink_.get(), &channels_, "scheduler");
  service_ = std::make_unique<SchedulerService>(
      scheduler_.get(), &directory_, sink_.get(), options_.scheduler.heartbeat_interval,
      [this](const WorkerNode& node) { subscriber_->Ensure(node.cache_address); });

  admin_ =
      std::make_unique<SchedulerAdminService>(scheduler_.get(), &directory_, options_.admin_token);
  ASSIGN_OR_RETURN(server_,
                   StartGrpcServer(options_.listen, {service_.get(), admin_.get()}, &grpc_port_));

  backend_ = std::make_unique<WorkerBackend>(
      scheduler_.get(), &directory_, &channels_,
      WorkerBackendOptions{.model_id = options_.model_id,
                           .tokenizer = tokenizer_.get(),
                           .request_timeout = options_.request_timeout});
  if (!options_.http_listen.empty()) {
    ASSIGN_OR_RETURN(auto hp, ParseHostPort(options_.http_listen));
    GatewayOptions g;
    g.address = hp.first;
    g.port = hp.second;
    g.num_threads = options_.http_threads;
    g.api_keys = options_.api_keys;
    gateway_ = std::make_unique<GatewayServer>(g, backend_.get());
    RETURN_IF_ERROR_WITH(gateway_->Start(), "starting the OpenAI gateway");
  }
  liveness_ = std::thread([this] { LivenessLoop(); });
  spdlog::info("scheduler serving gRPC on port {}, OpenAI HTTP on port {}, model '{}', policy {}",
               grpc_port_, http_port(), options_.model_id, scheduler_->policy_name());
  return absl::OkStatus();
}

void SchedulerServer::LivenessLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto interval =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.scheduler.heartbeat_interval));
  while (!cv_.wait_for(lock, interval, [this] { return stop_; })) {
    for (NodeIndex dead : scheduler_->load().CheckLiveness(absl::Now())) {
      auto node = directory_.Get(dead);
      spdlog::warn("scheduler: node {} missed its heartbeats; marked dead",
                   node ? node->id : StrCat(dead));
    }
  }
}

void SchedulerServer::Wait() {
  if (server_) server_->Wait();
}

void SchedulerServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  // New HTTP requests stop first, then the ones in flight are cancelled.
  if (gateway_) gateway_->Stop();
  if (backend_) backend_->Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (liveness_.joinable()) liveness_.join();
  if (subscriber_) subscriber_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace strata::scheduler
