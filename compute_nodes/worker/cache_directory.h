// The cache servers a worker talks to: its own (the one on its host) and, lazily, any other one a
// cache plan names. Connections that fail are retried at most every `retry_interval`, so a dead
// server costs one quick failure per interval, not one timeout per request.
//
// Thread-safe. Clients live as long as the directory.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/time/time.h"
#include "compute_nodes/cache_client/cache_client.h"

namespace strata::worker {

class CacheDirectory {
 public:
  // `local` describes this worker's own cache server; an empty address means none (the worker
  // then computes everything and swaps by recomputation).
  explicit CacheDirectory(cache_client::CacheClientOptions local,
                          absl::Duration retry_interval = absl::Seconds(2));

  const std::string& local_address() const { return local_.address; }
  bool has_local() const { return !local_.address.empty(); }

  // The client for `address` (empty: the local server); null when it cannot be reached now.
  cache_client::CacheClient* Get(const std::string& address);

  // Waits for every write-behind save of every connected client (their callbacks have run).
  void FlushSaves();

 private:
  struct Entry {
    std::unique_ptr<cache_client::CacheClient> client;
    absl::Time last_attempt = absl::InfinitePast();
  };
  cache_client::CacheClientOptions local_;
  absl::Duration retry_interval_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace strata::worker
