#include "scheduler/server/cache_event_subscriber.h"

#include <algorithm>
#include <vector>

#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::scheduler {

CacheEventSubscriber::CacheEventSubscriber(NodeDirectory* directory, KvEventSink* sink,
                                           ChannelPool* channels, std::string subscriber_id)
    : directory_(directory),
      sink_(sink),
      channels_(channels),
      subscriber_id_(std::move(subscriber_id)) {}

CacheEventSubscriber::~CacheEventSubscriber() { Stop(); }

void CacheEventSubscriber::Ensure(const std::string& cache_address) {
  if (cache_address.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return;
  auto it = streams_.find(cache_address);
  if (it != streams_.end()) {
    Stream* s = it->second.get();
    std::lock_guard<std::mutex> slock(s->mu);
    s->restart = true;
    if (s->context != nullptr) s->context->TryCancel();
    return;
  }
  auto stream = std::make_unique<Stream>();
  stream->address = cache_address;
  Stream* raw = stream.get();
  streams_.emplace(cache_address, std::move(stream));
  raw->thread = std::thread([this, raw] { Run(raw); });
}

void CacheEventSubscriber::Stop() {
  std::vector<Stream*> streams;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [address, s] : streams_) streams.push_back(s.get());
  }
  cv_.notify_all();
  for (Stream* s : streams) {
    std::lock_guard<std::mutex> slock(s->mu);
    if (s->context != nullptr) s->context->TryCancel();
  }
  for (Stream* s : streams) {
    if (s->thread.joinable()) s->thread.join();
  }
}

void CacheEventSubscriber::Run(Stream* stream) {
  auto stub = v1::CacheControl::NewStub(channels_->Get(stream->address));
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext context;
    {
      // Checked and registered under one lock, so Stop() either sees the context or we see stop_.
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      std::lock_guard<std::mutex> slock(stream->mu);
      stream->context = &context;
      stream->restart = false;
    }
    v1::SubscribeEventsRequest request;
    request.set_subscriber_id(subscriber_id_);
    std::unique_ptr<grpc::ClientReader<v1::KvEventBatch>> reader =
        stub->SubscribeEvents(&context, request);
    v1::KvEventBatch batch;
    bool received = false;
    while (reader->Read(&batch)) {
      if (!received) {
        spdlog::info("scheduler: following KV events of cache server {}", stream->address);
      }
      received = true;
      backoff = absl::Milliseconds(100);
      const std::vector<NodeIndex> nodes = directory_->OnCache(stream->address);
      for (const v1::KvEvent& event : batch.events()) {
        for (NodeIndex node : nodes) {
          if (absl::Status st = sink_->Apply(node, event); st.ok()) {
            events_applied_.fetch_add(1);
          } else {
            events_rejected_.fetch_add(1);
            spdlog::warn("scheduler: KV event from {} rejected: {}", stream->address,
                         ToStd(st.message()));
          }
        }
      }
    }
    const grpc::Status status = reader->Finish();
    bool restart = false;
    {
      std::lock_guard<std::mutex> slock(stream->mu);
      stream->context = nullptr;
      restart = stream->restart;
    }
    if (restart) continue;
    spdlog::debug("scheduler: KV event stream of {} ended: {}", stream->address,
                  status.error_message());
    // Wait out the backoff, waking early on Stop().
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(backoff)),
                     [this] { return stop_; })) {
      return;
    }
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace strata::scheduler
