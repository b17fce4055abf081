#include "compute_nodes/worker/resident_sync.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/metrics.h"
#include "spdlog/spdlog.h"

namespace strata::worker {
namespace {

constexpr int kTouchKeysPerCall = 4096;

// The resident blocks known to be in the cache server that its digest does not list.
std::vector<BlockKey> SavedNotListed(const ResidentBlocks& resident,
                                     const absl::flat_hash_set<BlockKey>& listed) {
  std::vector<BlockKey> out;
  for (const BlockKey& key : resident.SavedKeys()) {
    if (!listed.contains(key)) out.push_back(key);
  }
  return out;
}

Counter& ForgottenCounter(const std::string& why) {
  static MetricFamily<Counter>& family = MetricsRegistry::Default().AddCounter(
      "strata_worker_resident_forgotten_total",
      "Resident blocks the worker forgot to follow its cache server: evicted there by an "
      "operator, or missing from its digest after a gap in its events (resync)",
      {"reason"});
  return family.Labels({why});
}

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
    const int64_t before = subscriptions_.load();
    const bool again = FollowStream(context, *stub);
    if (subscriptions_.load() > before) backoff = absl::Milliseconds(100);
    std::unique_lock<std::mutex> lock(mu_);
    context_ = nullptr;
    if (stop_) return;
    if (again) continue;
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff), [this] { return stop_; })) return;
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

bool ResidentSync::FollowStream(grpc::ClientContext& context,
                                v1::CacheControl::StubInterface& stub) {
  v1::SubscribeEventsRequest request;
  request.set_subscriber_id(options_.client_id);
  request.set_from_sequence(next_sequence_);
  request.set_digest_interval_ms(24 * 3600 * 1000);  // only the first one, on connecting
  std::unique_ptr<grpc::ClientReaderInterface<v1::KvEventBatch>> reader =
      stub.SubscribeEvents(&context, request);
  // The keys the first digest lists, when they may be needed: resuming, until the first replayed
  // event shows whether the server still had every event since the resume point (if not, they
  // decide what is gone: a resync); after a restart, to tell which saved blocks it lost.
  bool digest_done = false, check_gap = false, restarted = false;
  absl::flat_hash_set<BlockKey> listed;
  v1::KvEventBatch batch;
  std::vector<BlockKey> keys;
  while (!restarted && reader->Read(&batch)) {
    for (const v1::KvEvent& event : batch.events()) {
      if (event.has_digest()) {
        if (digest_done) continue;  // periodic ones (off here)
        const v1::KvEvent::Digest& d = event.digest();
        const bool resuming = next_sequence_ > 0 && d.epoch() == epoch_;
        if (resuming || epoch_ != 0) {
          for (const std::string& bytes : d.keys()) {
            if (auto key = BlockKey::FromBytes(bytes)) listed.insert(*key);
          }
        }
        if (!d.last_page()) continue;
        digest_done = true;
        ++subscriptions_;
        if (!resuming) {
          restarted = epoch_ != 0;  // this stream was opened at a sequence of the old epoch
          epoch_ = d.epoch();
          next_sequence_ = event.sequence() + 1;
          if (restarted) {
            // What it lost is saved again by the next sequence that takes it.
            const int64_t unsaved = resident_->MarkUnsaved(SavedNotListed(*resident_, listed));
            unsaved_ += unsaved;
            spdlog::info(
                "worker: cache server {} restarted ({} resident blocks to save again); following "
                "its events from its digest",
                options_.cache_address, unsaved);
            context.TryCancel();
            break;
          }
          listed = {};
        } else {
          check_gap = event.sequence() >= next_sequence_;
          if (!check_gap) listed.clear();
        }
        continue;
      }
      if (check_gap) {  // the first event replayed: is it the one asked for?
        check_gap = false;
        if (event.sequence() > next_sequence_) {
          ++resyncs_;
          const std::vector<BlockKey> gone = SavedNotListed(*resident_, listed);
          spdlog::warn(
              "worker: events {}..{} of cache server {} are gone from its log; resynced from its "
              "digest",
              next_sequence_, event.sequence() - 1, options_.cache_address);
          ForgetBlocks(gone, "resync");
        }
        listed = {};
      }
      next_sequence_ = std::max(next_sequence_, event.sequence() + 1);
      if (!event.has_evicted() || !event.evicted().by_operator() ||
          event.evicted().tier() != v1::TIER_UNSPECIFIED) {
        continue;
      }
      keys.clear();
      for (const std::string& bytes : event.evicted().keys()) {
        if (auto key = BlockKey::FromBytes(bytes)) keys.push_back(*key);
      }
      ForgetBlocks(keys, "operator");
    }
  }
  if (restarted) {
    while (reader->Read(&batch)) {
    }
  }
  const grpc::Status status = reader->Finish();
  spdlog::debug("worker: KV event stream of {} ended: {}", options_.cache_address,
                status.error_message());
  return restarted;
}

void ResidentSync::ForgetBlocks(const std::vector<BlockKey>& keys, const char* why) {
  if (keys.empty()) return;
  const int64_t n = resident_->Forget(keys);
  if (n <= 0) return;
  forgotten_ += n;
  ForgottenCounter(why).Increment(static_cast<double>(n));
  spdlog::info("worker: forgot {} resident blocks ({}) of cache server {}", n, why,
               options_.cache_address);
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
