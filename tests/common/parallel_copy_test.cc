// ForEachCopy visits every index exactly once, inline or on its helper threads, from one caller,
// from many at once, and from inside another ForEachCopy.
#include "common/parallel_copy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace strata {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(ForEachCopyTest, EveryIndexOnce) {
  for (const int64_t count : {0, 1, 3, 8, 17, 100}) {
    for (const int64_t bytes : {int64_t{0}, kMiB, 64 * kMiB}) {
      std::vector<std::atomic<int>> seen(count);
      std::mutex mu;
      std::set<std::thread::id> ids;
      ForEachCopy(count, bytes, [&](int64_t i) {
        seen[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_EQ(seen[i].load(), 1) << "count " << count << " bytes " << bytes << " i " << i;
      }
      // Under 2 MiB per thread the copies stay on the calling thread.
      if (bytes < 4 * kMiB && count > 0) {
        EXPECT_EQ(ids.size(), 1u);
        EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
      }
    }
  }
}

// With megabytes to copy a helper takes part: item 0 waits (up to 10 s) for another thread to
// show up; the caller never waits for a helper otherwise, so this is the one way to see one.
TEST(ForEachCopyTest, HelpersTakePart) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: no helpers";
  for (const int64_t count : {2, 8, 40}) {
    std::mutex mu;
    std::set<std::thread::id> ids;
    ForEachCopy(count, 64 * kMiB, [&](int64_t i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (i == 0 && std::chrono::steady_clock::now() < until) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (ids.size() >= 2) break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    EXPECT_GE(ids.size(), 2u) << "count " << count;
  }
}

// Eight callers at once, each item's copy itself a ForEachCopy: every (caller, item, sub-item)
// is visited once, and nothing waits forever on helpers busy with another caller's parts.
TEST(ForEachCopyTest, ConcurrentAndNestedCallers) {
  constexpr int kCallers = 8, kItems = 24, kSub = 6;
  std::vector<std::atomic<int>> seen(kCallers * kItems * kSub);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 20; ++round) {
        ForEachCopy(kItems, kItems * 8 * kMiB, [&](int64_t i) {
          ForEachCopy(kSub, kSub * 4 * kMiB, [&](int64_t j) {
            seen[(c * kItems + i) * kSub + j].fetch_add(1, std::memory_order_relaxed);
          });
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k].load(), 20) << "at " << k;
}

}  // namespace
}  // namespace strata
