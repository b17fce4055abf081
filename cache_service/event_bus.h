// KV events of one cache server: a sequence-numbered log of `stored`, `moved`, `evicted` and
// `quarantined` events, kept in a bounded ring so a subscriber can resume from a recent sequence
// number; older gaps are healed by the periodic digest (cache_control_service.cc).
//
// Thread-safe. Publish() never blocks on subscribers: a slow subscriber that falls behind the
// ring sees a gap in the sequence numbers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "strata/v1/events.pb.h"

namespace strata::cache {

class EventBus {
 public:
  explicit EventBus(std::string source, size_t capacity = 65536);

  // Stamps sequence, time and source on `event` and appends it. Returns the sequence.
  uint64_t Publish(v1::KvEvent event);

  // Events with sequence >= `from` (the oldest kept when `from` is older), waiting up to
  // `timeout` for at least one. At most `max` events.
  std::vector<v1::KvEvent> Read(uint64_t from, absl::Duration timeout, size_t max = 1024);

  // The sequence the next event will get.
  uint64_t next_sequence() const;
  const std::string& source() const { return source_; }
  // This log's incarnation (set at construction; digests carry it): sequences of another epoch
  // do not continue this one's.
  uint64_t epoch() const { return epoch_; }
  // Wakes every Read() (shutdown).
  void Close();

 private:
  const std::string source_;
  const size_t capacity_;
  const uint64_t epoch_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::KvEvent> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace strata::cache
