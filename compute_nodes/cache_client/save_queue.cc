#include "compute_nodes/cache_client/save_queue.h"

#include <utility>

namespace strata::cache_client {

SaveQueue::SaveQueue(uint64_t max_pending_bytes)
    : max_pending_bytes_(max_pending_bytes), thread_([this] { Loop(); }) {}

SaveQueue::~SaveQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SaveQueue::Push(uint64_t bytes, std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (std::this_thread::get_id() != thread_.get_id()) {
    cv_.wait(lock,
             [&] { return pending_bytes_ == 0 || pending_bytes_ + bytes <= max_pending_bytes_; });
  }
  pending_bytes_ += bytes;
  ++pushed_;
  jobs_.push_back({bytes, std::move(job)});
  lock.unlock();
  cv_.notify_all();
}

void SaveQueue::Flush() {
  if (std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = pushed_;
  cv_.wait(lock, [&] { return finished_ >= target; });
}

uint64_t SaveQueue::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
}

void SaveQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and drained
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job.run();
    job.run = nullptr;  // whatever the job captured goes before it counts as finished
    lock.lock();
    pending_bytes_ -= job.bytes;
    ++finished_;
    cv_.notify_all();
  }
}

}  // namespace strata::cache_client
