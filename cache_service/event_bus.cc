#include "cache_service/event_bus.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace strata::cache {

EventBus::EventBus(std::string source, size_t capacity)
    : source_(std::move(source)),
      capacity_(std::max<size_t>(1, capacity)),
      epoch_(static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()))) {}

uint64_t EventBus::Publish(v1::KvEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = next_++;
  cv_.notify_all();
  event.set_sequence(seq);
  event.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  event.set_source(source_);
  ring_.push_back(std::move(event));
  while (ring_.size() > capacity_) ring_.pop_front();
  return seq;
}

std::vector<v1::KvEvent> EventBus::Read(uint64_t from, absl::Duration timeout, size_t max) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return closed_ || next_ > from; });
  std::vector<v1::KvEvent> out;
  if (ring_.empty()) return out;
  const uint64_t first = ring_.front().sequence();
  size_t i = from > first ? from - first : 0;
  for (; i < ring_.size() && out.size() < max; ++i) out.push_back(ring_[i]);
  return out;
}

uint64_t EventBus::next_sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

void EventBus::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace strata::cache
