#include "compute_nodes/worker/resident_sync.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::worker {
namespace {

constexpr int kTouchKeysPerCall = 4096;

}  // namespace

ResidentSync::ResidentSync(ResidentSyncOptions options, ResidentBlocks* resident)
    : options_(std::move(options)), resident_(resident) {}

ResidentSync::~ResidentSync() { Stop(); }

void ResidentSync::Start() {
  resident_->TrackTouches();
  events_ = std::thread([this] { FollowEvictions(); });
  touches_ = std::thread([this] { SendTouches(); });
}

void ResidentSync::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  cv_.notify_all();
  if (events_.joinable()) events_.join();
  if (touches_.joinable()) touches_.join();
}

bool ResidentSync::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

void ResidentSync::FollowEvictions() {
  auto stub = v1::CacheControl::NewStub(
      grpc::CreateChannel(options_.cache_address, grpc::InsecureChannelCredentials()));
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      context_ = &context;
    }
    v1::SubscribeEventsRequest request;
    request.set_subscriber_id(options_.client_id);
    request.set_digest_interval_ms(24 * 3600 * 1000);  // only the first one, on connecting
    std::unique_ptr<grpc::ClientReader<v1::KvEventBatch>> reader =
        stub->SubscribeEvents(&context, request);
    v1::KvEventBatch batch;
    std::vector<BlockKey> keys;
    while (reader->Read(&batch)) {
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
                       options_.cache_address);
        }
      }
    }
    const grpc::Status status = reader->Finish();
    std::unique_lock<std::mutex> lock(mu_);
    context_ = nullptr;
    if (stop_) return;
    spdlog::debug("worker: KV event stream of {} ended: {}", options_.cache_address,
                  status.error_message());
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff), [this] { return stop_; })) return;
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

void ResidentSync::SendTouches() {
  auto stub = v1::CacheControl::NewStub(
      grpc::CreateChannel(options_.cache_address, grpc::InsecureChannelCredentials()));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.touch_interval),
                       [this] { return stop_; })) {
        return;
      }
    }
    const std::vector<BlockKey> keys = resident_->TakeTouched();
    for (size_t i = 0; i < keys.size() && !Stopping(); i += kTouchKeysPerCall) {
      v1::TouchRequest request;
      request.set_client_id(options_.client_id);
      for (size_t j = i; j < std::min(keys.size(), i + kTouchKeysPerCall); ++j) {
        request.add_keys(std::string(keys[j].View()));
      }
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::TouchResponse response;
      const grpc::Status st = stub->Touch(&context, request, &response);
      if (!st.ok()) {
        spdlog::debug("worker: touching {} blocks on {} failed: {}", request.keys_size(),
                      options_.cache_address, st.error_message());
        break;  // best effort: these hits are dropped
      }
      touched_ += response.touched();
    }
  }
}

}  // namespace strata::worker
