// The order `strata batch` runs requests in, so shared prefixes hit the KV cache.
//
// Requests are sorted by their prompt key (model, cache_salt, url, then the prompt text with the
// chat messages in order), which puts requests sharing a prefix next to each other. Adjacent
// requests whose prompt shares at least `min_shared_prefix` bytes with the group's first request
// form a group. The first request of a group (its leader) runs alone; only when it has finished
// (its prefix is now in the cache) do the rest of the group fan out, ahead of the leaders of later
// groups, so the group's prefix is computed once and stays hot while it is reused.
//
// Pure logic, no I/O. BatchQueue is thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "scheduler/batch/batch_input.h"

namespace strata::scheduler::batch {

struct BatchGroup {
  size_t leader = 0;              // index into the requests
  std::vector<size_t> followers;  // indices, in prompt-key order
};

// ~64 tokens: shorter common prefixes are not worth holding a group back for.
constexpr size_t kDefaultMinSharedPrefix = 256;

size_t CommonPrefixLength(std::string_view a, std::string_view b);

// Groups `requests[i]` for i in `todo` (indices; requests already done are left out by the
// caller). Groups come in prompt-key order.
std::vector<BatchGroup> PlanGroups(const std::vector<BatchRequest>& requests,
                                   const std::vector<size_t>& todo,
                                   size_t min_shared_prefix = kDefaultMinSharedPrefix);

// Hands out request indices to worker threads in plan order: every group's leader is ready at
// the start; a group's followers become ready (at the front of the queue) when its leader is
// Done(). Next() blocks while nothing is ready but leaders are still running; it returns nullopt
// when everything was handed out or Close() was called.
class BatchQueue {
 public:
  explicit BatchQueue(std::vector<BatchGroup> groups);

  std::optional<size_t> Next();
  // The request `index` (from Next()) has finished, successfully or not.
  void Done(size_t index);
  // No more requests are handed out (an interruption); blocked Next() calls return nullopt.
  void Close();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<BatchGroup> groups_;
  std::deque<size_t> ready_;                             // guarded by mu_
  std::vector<std::pair<size_t, size_t>> leader_group_;  // (leader index, group), sorted
  size_t waiting_leaders_ = 0;  // leaders handed out, not yet Done; guarded by mu_
  bool closed_ = false;         // guarded by mu_
};

}  // namespace strata::scheduler::batch
