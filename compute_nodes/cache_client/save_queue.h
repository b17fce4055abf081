// The cache client's write-behind queue: one background thread runs jobs in FIFO order, and the
// bytes of the jobs queued or running are bounded so a slow or full cache cannot make a worker
// hold an unbounded amount of KV in memory.
//
//   SaveQueue q(/*max_pending_bytes=*/256 << 20);
//   q.Push(batch_bytes, [=] { client.Save(...); done(...); });  // may block (backpressure)
//   q.Flush();                                                  // every job pushed so far ran
//
// Admission: Push blocks while the pending bytes plus the new job's would exceed the bound, but a
// job is always admitted when nothing is pending, so one job larger than the bound cannot
// deadlock. A job pushed from the queue's own thread (from inside a job) is admitted at once:
// waiting there would wait for itself.
//
// Lifecycle: the thread starts in the constructor. The destructor runs every job still queued
// (drains; jobs are bounded by their own RPC and transfer timeouts) and joins the thread. Push
// must not be called concurrently with or after destruction.
//
// Thread safety: Push, Flush and pending_bytes may be called from any thread, concurrently.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace strata::cache_client {

class SaveQueue {
 public:
  explicit SaveQueue(uint64_t max_pending_bytes);
  ~SaveQueue();
  SaveQueue(const SaveQueue&) = delete;
  SaveQueue& operator=(const SaveQueue&) = delete;

  // Queues `job` (accounted as `bytes` until it has run); blocks while over the bound.
  void Push(uint64_t bytes, std::function<void()> job);

  // Waits until every job pushed before this call has run. Returns at once when called from a
  // job (the queue's own thread), which cannot wait for itself.
  void Flush();

  uint64_t pending_bytes() const;

 private:
  struct Job {
    uint64_t bytes;
    std::function<void()> run;
  };
  void Loop();

  const uint64_t max_pending_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // any change of the state below
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queued + running
  uint64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;         // jobs ever pushed
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;       // jobs ever run (FIFO: the first ones)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started after the state above exists
};

}  // namespace strata::cache_client
