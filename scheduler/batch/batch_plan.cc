#include "scheduler/batch/batch_plan.h"

#include <algorithm>

namespace strata::scheduler::batch {

size_t CommonPrefixLength(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

std::vector<BatchGroup> PlanGroups(const std::vector<BatchRequest>& requests,
                                   const std::vector<size_t>& todo, size_t min_shared_prefix) {
  std::vector<size_t> order = todo;
  // Stable on ties: identical prompts keep their input order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].prompt_key < requests[b].prompt_key;
  });
  std::vector<BatchGroup> groups;
  for (size_t index : order) {
    if (!groups.empty()) {
      const std::string& leader = requests[groups.back().leader].prompt_key;
      // Sorted order: the common prefix with the leader only shrinks down the list, so the
      // group ends at the first request that shares too little with it.
      if (CommonPrefixLength(leader, requests[index].prompt_key) >= min_shared_prefix) {
        groups.back().followers.push_back(index);
        continue;
      }
    }
    groups.push_back(BatchGroup{index, {}});
  }
  return groups;
}

BatchQueue::BatchQueue(std::vector<BatchGroup> groups) : groups_(std::move(groups)) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    ready_.push_back(groups_[g].leader);
    if (!groups_[g].followers.empty()) leader_group_.emplace_back(groups_[g].leader, g);
  }
  std::sort(leader_group_.begin(), leader_group_.end());
}

std::optional<size_t> BatchQueue::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !ready_.empty() || waiting_leaders_ == 0; });
  if (closed_ || ready_.empty()) return std::nullopt;
  const size_t index = ready_.front();
  ready_.pop_front();
  auto it = std::lower_bound(leader_group_.begin(), leader_group_.end(),
                             std::make_pair(index, size_t{0}));
  if (it != leader_group_.end() && it->first == index) ++waiting_leaders_;
  return index;
}

void BatchQueue::Done(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::lower_bound(leader_group_.begin(), leader_group_.end(),
                             std::make_pair(index, size_t{0}));
  if (it == leader_group_.end() || it->first != index) return;
  const std::vector<size_t>& followers = groups_[it->second].followers;
  ready_.insert(ready_.begin(), followers.begin(), followers.end());
  --waiting_leaders_;
  cv_.notify_all();
}

void BatchQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace strata::scheduler::batch
