// The helper threads of ForEachCopy (parallel_copy.h).
#include "common/parallel_copy.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

namespace strata::internal {
namespace {

// One RunParts call. Parts are claimed through `next`, so each runs once, by whoever gets it.
struct Job {
  Job(int64_t n, absl::FunctionRef<void(int64_t)> fn) : parts(n), part(fn) {}

  // Runs parts until none are left unclaimed.
  void Work() {
    for (int64_t k; (k = next.fetch_add(1)) < parts;) {
      part(k);
      if (done.fetch_add(1) + 1 == parts) done.notify_all();
    }
  }

  const int64_t parts;
  // Called only for a claimed part, and the caller waits for every claimed part to finish, so
  // what it refers to (on the caller's stack) outlives every call.
  const absl::FunctionRef<void(int64_t)> part;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

class Helpers {
 public:
  // The process's helpers: min(cores, 8) - 1 threads, never stopped (they wait on a condition
  // variable that lives as long as the process; the object is never destroyed, so no static
  // destructor races a late copy).
  static Helpers& Get() {
    static Helpers* helpers = new Helpers(
        std::min(8, std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) - 1);
    return *helpers;
  }

  // Asks up to `count` helpers to join `job`; returns at once.
  void Offer(const std::shared_ptr<Job>& job, int64_t count) {
    if (started_ == 0 || ::getpid() != pid_) return;  // none, or a forked child's copy
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t i = 0; i < std::min<int64_t>(count, started_); ++i) queue_.push_back(job);
    }
    if (count == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  explicit Helpers(int n) : pid_(::getpid()) {
    for (int i = 0; i < n; ++i) {
      try {
        std::thread([this] { Loop(); }).detach();
        ++started_;
      } catch (const std::system_error&) {  // no more threads to be had: the callers do it all
        break;
      }
    }
  }

  void Loop() {
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job->Work();  // nothing left to claim when its caller got there first
    }
  }

  const pid_t pid_;
  int started_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
};

}  // namespace

void RunParts(int64_t parts, absl::FunctionRef<void(int64_t)> part) {
  if (parts <= 0) return;
  auto job = std::make_shared<Job>(parts, part);
  if (parts > 1) Helpers::Get().Offer(job, parts - 1);
  job->Work();
  for (int64_t d; (d = job->done.load()) < parts;) job->done.wait(d);
}

}  // namespace strata::internal
