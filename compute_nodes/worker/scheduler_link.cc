#include "compute_nodes/worker/scheduler_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "spdlog/spdlog.h"

namespace strata::worker {
namespace {

v1::KvEvent NewEvent(const std::string& source, uint64_t sequence) {
  v1::KvEvent ev;
  ev.set_sequence(sequence);
  ev.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  ev.set_source(source);
  return ev;
}

// `changes` as stored / evicted events (GPU tier), consecutive changes of one kind in one event.
void AppendChanges(const ResidentBlocks::Changes& changes, const std::string& source,
                   uint64_t* sequence, v1::KvEventBatch* batch) {
  v1::KvEvent* ev = nullptr;
  bool adding = false;
  for (const ResidentBlocks::Change& c : changes.list) {
    if (ev == nullptr || c.added != adding) {
      ev = batch->add_events();
      *ev = NewEvent(source, ++*sequence);
      adding = c.added;
      if (adding) {
        ev->mutable_stored()->set_tier(v1::TIER_GPU);
      } else {
        ev->mutable_evicted()->set_tier(v1::TIER_GPU);
      }
    }
    if (adding) {
      ev->mutable_stored()->add_keys(std::string(c.key.View()));
      ev->mutable_stored()->add_parent_keys(c.parent == BlockKey{} ? std::string()
                                                                   : std::string(c.parent.View()));
    } else {
      ev->mutable_evicted()->add_keys(std::string(c.key.View()));
    }
  }
}

// Every resident key as digest pages of the GPU tier, one batch each (a pool of 10^5 blocks is
// megabytes of keys: one message each page keeps them under gRPC's size limit); at least one
// page, so that an empty pool clears what the scheduler believed. Stamped with the current
// sequence.
std::vector<v1::KvEventBatch> DigestBatches(const std::vector<BlockKey>& keys,
                                            const std::string& source, uint64_t sequence,
                                            uint64_t digest_id, size_t page_keys) {
  std::vector<v1::KvEventBatch> batches;
  size_t i = 0;
  uint32_t page = 0;
  do {
    v1::KvEvent* ev = batches.emplace_back().add_events();
    *ev = NewEvent(source, sequence);
    v1::KvEvent::Digest* d = ev->mutable_digest();
    d->set_digest_id(digest_id);
    d->set_page(page++);
    d->set_tier(v1::TIER_GPU);
    for (size_t n = 0; i < keys.size() && n < page_keys; ++i, ++n) {
      d->add_keys(std::string(keys[i].View()));
    }
    d->set_last_page(i >= keys.size());
  } while (i < keys.size());
  return batches;
}

}  // namespace

SchedulerLink::SchedulerLink(SchedulerLinkOptions options) : options_(std::move(options)) {}

SchedulerLink::~SchedulerLink() { Stop(); }

void SchedulerLink::Start() {
  thread_ = std::thread([this] { Run(); });
  if (options_.resident != nullptr) publisher_ = std::thread([this] { PublishLoop(); });
}

void SchedulerLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (publish_ctx_ != nullptr) publish_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (publisher_.joinable()) publisher_.join();
}

bool SchedulerLink::Register(v1::Scheduler::Stub& stub, absl::Duration* interval) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.rpc_timeout));
  v1::RegisterRequest req;
  *req.mutable_node() = options_.node;
  v1::RegisterResponse resp;
  const grpc::Status st = stub.Register(&ctx, req, &resp);
  if (!st.ok()) {
    spdlog::warn("scheduler {}: register failed: {}", options_.address, st.error_message());
    return false;
  }
  if (!resp.node_id().empty()) options_.node.set_node_id(resp.node_id());
  if (resp.heartbeat_interval_ms() > 0)
    *interval = absl::Milliseconds(resp.heartbeat_interval_ms());
  {
    std::lock_guard<std::mutex> lock(mu_);
    node_id_ = options_.node.node_id();
    ++registrations_;
  }
  spdlog::info("registered with scheduler {} as {}", options_.address, options_.node.node_id());
  return true;
}

void SchedulerLink::Run() {
  auto channel = grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials());
  auto stub = v1::Scheduler::NewStub(channel);
  absl::Duration interval = absl::Seconds(1);
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::Duration wait = interval;
    if (!registered_) {
      if (Register(*stub, &interval)) {
        registered_ = true;
        backoff = absl::Milliseconds(100);
        wait = absl::ZeroDuration();  // first heartbeat at once
      } else {
        wait = backoff;
        backoff = std::min(backoff * 2, options_.max_backoff);
      }
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.rpc_timeout));
      v1::HeartbeatRequest req;
      req.set_node_id(options_.node.node_id());
      if (options_.load) *req.mutable_load() = options_.load();
      v1::HeartbeatResponse resp;
      const grpc::Status st = stub->Heartbeat(&ctx, req, &resp);
      if (st.ok()) {
        ++heartbeats_;
        draining_ = resp.draining();
        if (resp.reregister()) registered_ = false;
      } else {
        spdlog::warn("scheduler {}: heartbeat failed: {}", options_.address, st.error_message());
        registered_ = false;  // it may have restarted: register again
        wait = backoff;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [&] { return stop_; })) return;
  }
}

void SchedulerLink::PublishLoop() {
  auto channel = grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials());
  auto stub = v1::Scheduler::NewStub(channel);
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientWriter<v1::KvEventBatch>> writer;
  v1::PublishKvEventsResponse response;
  uint64_t sequence = 0, digest_id = 0, published_for = 0;
  auto close = [&] {
    if (writer == nullptr) return;
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) {
      spdlog::warn("scheduler {}: resident-block events stream ended: {}", options_.address,
                   st.error_message());
    }
    std::lock_guard<std::mutex> lock(mu_);
    publish_ctx_ = nullptr;
    writer.reset();
    ctx.reset();
  };
  while (true) {
    std::string node_id;
    uint64_t registrations = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.publish_interval),
                       [&] { return stop_; })) {
        break;
      }
      node_id = node_id_;
      registrations = registrations_;
    }
    // Taken even while unregistered, so the log does not overflow meanwhile; a digest follows.
    ResidentBlocks::Changes changes = options_.resident->TakeChanges();
    if (!registered_) {
      close();
      continue;
    }
    bool digest = changes.overflowed || registrations != published_for;
    if (writer == nullptr) {
      ctx = std::make_unique<grpc::ClientContext>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
        publish_ctx_ = ctx.get();
      }
      writer = stub->PublishKvEvents(ctx.get(), &response);
      digest = true;
    }
    std::vector<v1::KvEventBatch> batches;
    if (digest) {
      batches = DigestBatches(options_.resident->Keys(), node_id, sequence, ++digest_id,
                              std::max<size_t>(options_.digest_page_keys, 1));
    } else {
      AppendChanges(changes, node_id, &sequence, &batches.emplace_back());
      if (batches.back().events_size() == 0) continue;
    }
    const bool written = std::all_of(batches.begin(), batches.end(),
                                     [&](const v1::KvEventBatch& b) { return writer->Write(b); });
    if (!written) {
      close();  // re-opened (with a digest) at the next interval
      continue;
    }
    if (digest) {
      ++digests_;
      published_for = registrations;
    }
  }
  close();
}

}  // namespace strata::worker
