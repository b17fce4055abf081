// A worker's link to the global scheduler: Register, then a Heartbeat with the worker's load every
// interval the scheduler asked for. A scheduler that is down or restarted is retried (with
// backoff) and re-registered with; the worker keeps serving meanwhile. The heartbeat's `draining`
// answer is kept for the worker to report.
//
// Thread-safe; one background thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::worker {

struct SchedulerLinkOptions {
  std::string address;  // the scheduler's gRPC "host:port"
  v1::NodeInfo node;
  std::function<v1::WorkerLoad()> load;
  absl::Duration rpc_timeout = absl::Seconds(2);
  absl::Duration max_backoff = absl::Seconds(5);
};

class SchedulerLink {
 public:
  explicit SchedulerLink(SchedulerLinkOptions options);
  ~SchedulerLink();  // Stop()

  void Start();
  void Stop();

  bool registered() const { return registered_.load(); }
  bool draining() const { return draining_.load(); }
  int64_t heartbeats_sent() const { return heartbeats_.load(); }

 private:
  void Run();
  bool Register(v1::Scheduler::Stub& stub, absl::Duration* interval);

  SchedulerLinkOptions options_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> heartbeats_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace strata::worker
