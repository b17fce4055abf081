// Follows this host's cache server's KV events and makes the worker forget its resident blocks
// (ResidentBlocks) that an operator evicted from the server (CacheAdmin.Evict: the block left
// every tier, `Evicted.by_operator`), so "evict this tenant" also stops the worker's own pool from
// serving those blocks. Evictions that only made room are ignored: the worker's copy is as good
// as before, and a block hot in the worker is cold on the server by design (its hits never reach
// the server).
//
// One SubscribeEvents stream (periodic digests off: their contents are not needed), re-opened
// with backoff (100 ms doubling to 5 s) when it breaks. An eviction made while the stream is
// down is not seen; the blocks then stay until their pages are needed or the worker restarts.
//
// Thread-safe; one background thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "compute_nodes/worker/resident_blocks.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace strata::worker {

class EvictionWatcher {
 public:
  // `resident` must outlive the watcher.
  EvictionWatcher(std::string cache_address, std::string subscriber_id, ResidentBlocks* resident);
  ~EvictionWatcher();  // Stop()

  void Start();
  void Stop();

  // Resident blocks forgotten because an operator evicted them.
  int64_t forgotten() const { return forgotten_.load(); }
  // True while the stream is open (it has delivered its first batch).
  bool following() const { return following_.load(); }

 private:
  void Run();

  const std::string address_;
  const std::string subscriber_id_;
  ResidentBlocks* const resident_;
  std::atomic<int64_t> forgotten_{0};
  std::atomic<bool> following_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                       // guarded by mu_
  grpc::ClientContext* context_ = nullptr;  // guarded by mu_: the open stream, to cancel
  std::thread thread_;
};

}  // namespace strata::worker
