#include "compute_nodes/worker/scheduler_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "spdlog/spdlog.h"

namespace strata::worker {

SchedulerLink::SchedulerLink(SchedulerLinkOptions options) : options_(std::move(options)) {}

SchedulerLink::~SchedulerLink() { Stop(); }

void SchedulerLink::Start() {
  thread_ = std::thread([this] { Run(); });
}

void SchedulerLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool SchedulerLink::Register(v1::Scheduler::Stub& stub, absl::Duration* interval) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.rpc_timeout));
  v1::RegisterRequest req;
  *req.mutable_node() = options_.node;
  v1::RegisterResponse resp;
  const grpc::Status st = stub.Register(&ctx, req, &resp);
  if (!st.ok()) {
    spdlog::warn("scheduler {}: register failed: {}", options_.address, st.error_message());
    return false;
  }
  if (!resp.node_id().empty()) options_.node.set_node_id(resp.node_id());
  if (resp.heartbeat_interval_ms() > 0)
    *interval = absl::Milliseconds(resp.heartbeat_interval_ms());
  spdlog::info("registered with scheduler {} as {}", options_.address, options_.node.node_id());
  return true;
}

void SchedulerLink::Run() {
  auto channel = grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials());
  auto stub = v1::Scheduler::NewStub(channel);
  absl::Duration interval = absl::Seconds(1);
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::Duration wait = interval;
    if (!registered_) {
      if (Register(*stub, &interval)) {
        registered_ = true;
        backoff = absl::Milliseconds(100);
        wait = absl::ZeroDuration();  // first heartbeat at once
      } else {
        wait = backoff;
        backoff = std::min(backoff * 2, options_.max_backoff);
      }
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.rpc_timeout));
      v1::HeartbeatRequest req;
      req.set_node_id(options_.node.node_id());
      if (options_.load) *req.mutable_load() = options_.load();
      v1::HeartbeatResponse resp;
      const grpc::Status st = stub->Heartbeat(&ctx, req, &resp);
      if (st.ok()) {
        ++heartbeats_;
        draining_ = resp.draining();
        if (resp.reregister()) registered_ = false;
      } else {
        spdlog::warn("scheduler {}: heartbeat failed: {}", options_.address, st.error_message());
        registered_ = false;  // it may have restarted: register again
        wait = backoff;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [&] { return stop_; })) return;
  }
}

}  // namespace strata::worker
