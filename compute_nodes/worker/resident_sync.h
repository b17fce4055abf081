// Keeps the worker's resident blocks (ResidentBlocks) and this host's cache server in step, both
// ways:
//
//   - Evictions: it follows the server's KV events and makes the pool forget the blocks an
//     operator evicted from the server (CacheAdmin.Evict: the block left every tier,
//     `Evicted.by_operator`), so "evict this tenant" also stops the worker's own pool from serving
//     them. Evictions that only made room are ignored: the worker's copy is as good as before.
//     One SubscribeEvents stream (periodic digests off), re-opened with backoff (100 ms doubling
//     to 5 s) when it breaks, from the sequence after the last event seen, so the server replays
//     what happened meanwhile. Where it cannot (its event ring moved past that sequence), the
//     digest the stream starts with stands in: the saved resident blocks it does not list are
//     forgotten (a resync; this may also drop blocks evicted only to make room, or saved while
//     the digest was taken: they are computed or fetched again). A restarted server (a new epoch
//     in its digest) is followed from its digest on, and the saved resident blocks it no longer
//     has are marked unsaved, so they are saved to it again when next used; an eviction between
//     its start and the worker's reconnection is not seen.
//   - Touches: every `touch_interval` it sends the server the keys the pool handed out since the
//     last time (CacheControl.Touch), so the server's LRU sees those hits too. Otherwise the
//     blocks the workers serve most, whose hits never reach the server, would look coldest there
//     and be evicted first. Best effort: a failed touch is dropped.
//
// Thread-safe; two background threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "compute_nodes/worker/resident_blocks.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::worker {

struct ResidentSyncOptions {
  std::string cache_address;  // this host's cache server (gRPC)
  std::string client_id;      // for the server's logs (subscriber and Touch client id)
  absl::Duration touch_interval = absl::Seconds(1);
};

class ResidentSync {
 public:
  // `resident` must outlive this.
  ResidentSync(ResidentSyncOptions options, ResidentBlocks* resident);
  ~ResidentSync();  // Stop()

  void Start();
  void Stop();

  // Resident blocks forgotten because an operator evicted them, or in a resync.
  int64_t forgotten() const { return forgotten_.load(); }
  // Resyncs: reconnections after the server's event ring had moved past the resume point.
  int64_t resyncs() const { return resyncs_.load(); }
  // Saved resident blocks marked unsaved because a restarted server had lost them.
  int64_t unsaved() const { return unsaved_.load(); }
  // Event streams opened whose first digest arrived whole.
  int64_t subscriptions() const { return subscriptions_.load(); }
  // Keys the server confirmed touched.
  int64_t touched() const { return touched_.load(); }

 private:
  void FollowEvictions();
  // Reads one event stream to its end (see the header comment). Returns true to re-open it at
  // once, without backoff (the server restarted: follow it from its digest).
  bool FollowStream(grpc::ClientContext& context, v1::CacheControl::StubInterface& stub);
  // Forgets `keys` (an operator evicted them, or a resync found them gone), counted by `why`.
  void ForgetBlocks(const std::vector<BlockKey>& keys, const char* why);
  void SendTouches();
  bool Stopping();

  const ResidentSyncOptions options_;
  ResidentBlocks* const resident_;
  std::atomic<int64_t> forgotten_{0};
  std::atomic<int64_t> resyncs_{0};
  std::atomic<int64_t> unsaved_{0};
  std::atomic<int64_t> subscriptions_{0};
  // The events thread's place in the server's log: the sequence to resume from (0: from now)
  // and the epoch that sequence belongs to (0: none yet).
  uint64_t next_sequence_ = 0;
  uint64_t epoch_ = 0;
  std::atomic<int64_t> touched_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                       // guarded by mu_
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_: the open event stream, to cancel
  std::thread events_;
  std::thread touches_;
};

}  // namespace strata::worker
