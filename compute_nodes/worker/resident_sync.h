// Keeps the worker's resident blocks (ResidentBlocks) and this host's cache server in step, both
// ways:
//
//   - Evictions: it follows the server's KV events and makes the pool forget the blocks an
//     operator evicted from the server (CacheAdmin.Evict: the block left every tier,
//     `Evicted.by_operator`), so "evict this tenant" also stops the worker's own pool from serving
//     them. Evictions that only made room are ignored: the worker's copy is as good as before.
//     One SubscribeEvents stream (periodic digests off), re-opened with backoff (100 ms doubling
//     to 5 s) when it breaks; an eviction made while it is down is not seen, and those blocks
//     stay until their pages are needed or the worker restarts.
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

namespace grpc {
class ClientContext;
}  // namespace grpc

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

  // Resident blocks forgotten because an operator evicted them.
  int64_t forgotten() const { return forgotten_.load(); }
  // Keys the server confirmed touched.
  int64_t touched() const { return touched_.load(); }

 private:
  void FollowEvictions();
  void SendTouches();
  bool Stopping();

  const ResidentSyncOptions options_;
  ResidentBlocks* const resident_;
  std::atomic<int64_t> forgotten_{0};
  std::atomic<int64_t> touched_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                       // guarded by mu_
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_: the open event stream, to cancel
  std::thread events_;
  std::thread touches_;
};

}  // namespace strata::worker
