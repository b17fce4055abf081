// A worker's link to the global scheduler: Register, then a Heartbeat with the worker's load every
// interval the scheduler asked for. A scheduler that is down or restarted is retried (with
// backoff) and re-registered with; the worker keeps serving meanwhile. The heartbeat's `draining`
// answer is kept for the worker to report.
//
// With `resident` set, the worker's resident blocks (ResidentBlocks: full blocks kept in its KV
// pool) are published too, as GPU-tier KV events on one PublishKvEvents stream, so the scheduler
// places a prompt on the worker whose pool already holds its prefix: every `publish_interval`
// the blocks kept and forgotten since the last batch, in order; a full digest (tier GPU, which
// replaces only the node's GPU-tier state, not what its cache server reported) whenever the
// stream is opened, after a re-registration, and when the change log overflowed. A broken stream
// is re-opened at the next interval.
//
// Thread-safe; one background thread, two with `resident`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "compute_nodes/worker/resident_blocks.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::worker {

struct SchedulerLinkOptions {
  std::string address;  // the scheduler's gRPC "host:port"
  v1::NodeInfo node;
  std::function<v1::WorkerLoad()> load;
  absl::Duration rpc_timeout = absl::Seconds(2);
  absl::Duration max_backoff = absl::Seconds(5);
  ResidentBlocks* resident = nullptr;  // published when set (must outlive the link)
  absl::Duration publish_interval = absl::Milliseconds(200);
  size_t digest_page_keys = 4096;
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
  int64_t digests_sent() const { return digests_.load(); }

 private:
  void Run();
  bool Register(v1::Scheduler::Stub& stub, absl::Duration* interval);
  void PublishLoop();

  SchedulerLinkOptions options_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<int64_t> digests_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                           // guarded by mu_
  std::string node_id_;                         // guarded by mu_: as registered
  uint64_t registrations_ = 0;                  // guarded by mu_
  grpc::ClientContext* publish_ctx_ = nullptr;  // guarded by mu_: the open stream, to cancel
  std::thread thread_;
  std::thread publisher_;
};

}  // namespace strata::worker
