#include "compute_nodes/worker/eviction_watcher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <vector>

#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::worker {

EvictionWatcher::EvictionWatcher(std::string cache_address, std::string subscriber_id,
                                 ResidentBlocks* resident)
    : address_(std::move(cache_address)),
      subscriber_id_(std::move(subscriber_id)),
      resident_(resident) {}

EvictionWatcher::~EvictionWatcher() { Stop(); }

void EvictionWatcher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EvictionWatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EvictionWatcher::Run() {
  auto stub =
      v1::CacheControl::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      context_ = &context;
    }
    v1::SubscribeEventsRequest request;
    request.set_subscriber_id(subscriber_id_);
    request.set_digest_interval_ms(24 * 3600 * 1000);  // only the first one, on connecting
    std::unique_ptr<grpc::ClientReader<v1::KvEventBatch>> reader =
        stub->SubscribeEvents(&context, request);
    v1::KvEventBatch batch;
    std::vector<BlockKey> keys;
    while (reader->Read(&batch)) {
      following_ = true;
      backoff = absl::Milliseconds(100);
      for (const v1::KvEvent& event : batch.events()) {
        if (!event.has_evicted() || !event.evicted().by_operator() ||
            event.evicted().tier() != v1::TIER_UNSPECIFIED) {
          continue;
        }
        keys.clear();
        for (const std::string& bytes : event.evicted().keys()) {
          BlockKey key;
          if (bytes.size() != key.bytes.size()) continue;
          std::copy(bytes.begin(), bytes.end(), key.bytes.begin());
          keys.push_back(key);
        }
        const int64_t n = resident_->Forget(keys);
        if (n > 0) {
          forgotten_ += n;
          spdlog::info("worker: forgot {} resident blocks evicted by an operator from {}", n,
                       address_);
        }
      }
    }
    const grpc::Status status = reader->Finish();
    following_ = false;
    std::unique_lock<std::mutex> lock(mu_);
    context_ = nullptr;
    if (stop_) return;
    spdlog::debug("worker: KV event stream of {} ended: {}", address_, status.error_message());
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff), [this] { return stop_; })) return;
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace strata::worker
