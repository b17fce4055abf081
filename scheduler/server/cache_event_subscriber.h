// CacheEventSubscriber: feeds the prefix index from the cache servers' KV event streams.
//
// Attribution (the one decision here): the index records blocks per *worker*, because placement
// asks "how long a prefix can this worker load without a transfer". A worker's local prefix is
// what its own cache server holds, so every event from the cache server at address A is applied
// once to each registered worker whose cache_address is A (its holders in the index are those
// workers, never the cache server itself). Workers sharing a cache server therefore see the same
// prefixes, and a worker without a cache server holds nothing.
//
// One stream (CacheControl.SubscribeEvents) and one thread per distinct cache address. A broken
// stream reconnects with backoff (100 ms doubling to 5 s); each new stream starts with a full
// digest, which replaces what the index believed (so missed events heal). When a worker joins a
// cache server that is already subscribed, the stream is restarted so the newcomer gets the
// digest too.
//
// Thread safety: Ensure/Stop may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "scheduler/kv_events.h"
#include "scheduler/server/channel_pool.h"
#include "scheduler/server/node_directory.h"

namespace strata::scheduler {

class CacheEventSubscriber {
 public:
  CacheEventSubscriber(NodeDirectory* directory, KvEventSink* sink, ChannelPool* channels,
                       std::string subscriber_id);
  ~CacheEventSubscriber();  // Stop()

  // Subscribes to `cache_address` (no-op for ""), or restarts its stream if already subscribed.
  void Ensure(const std::string& cache_address);
  void Stop();

  uint64_t events_applied() const { return events_applied_.load(); }
  uint64_t events_rejected() const { return events_rejected_.load(); }

 private:
  struct Stream {
    std::string address;
    std::thread thread;
    std::mutex mu;                           // after mu_ when both are held
    grpc::ClientContext* context = nullptr;  // guarded by mu
    bool restart = false;                    // guarded by mu
  };

  void Run(Stream* stream);

  NodeDirectory* const directory_;
  KvEventSink* const sink_;
  ChannelPool* const channels_;
  const std::string subscriber_id_;
  std::atomic<uint64_t> events_applied_{0};
  std::atomic<uint64_t> events_rejected_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                                                  // guarded by mu_
  absl::flat_hash_map<std::string, std::unique_ptr<Stream>> streams_;  // guarded by mu_
};

}  // namespace strata::scheduler
