#include "cache_service/event_bus.h"

namespace strata::cache {

uint64_t EventBus::Publish(v1::KvEvent event) {
  absl::MutexLock lock(&mu_);
  const uint64_t seq = next_++;
  event.set_sequence(seq);
  event.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  event.set_source(source_);
  ring_.push_back(std::move(event));
  while (ring_.size() > capacity_) ring_.pop_front();
  return seq;
}

std::vector<v1::KvEvent> EventBus::Read(uint64_t from, absl::Duration timeout, size_t max) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || next_ > from; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  std::vector<v1::KvEvent> out;
  if (ring_.empty()) return out;
  const uint64_t first = ring_.front().sequence();
  size_t i = from > first ? from - first : 0;
  for (; i < ring_.size() && out.size() < max; ++i) out.push_back(ring_[i]);
  return out;
}

uint64_t EventBus::next_sequence() const {
  absl::MutexLock lock(&mu_);
  return next_;
}

void EventBus::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace strata::cache
