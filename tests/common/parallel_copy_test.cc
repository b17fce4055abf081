// ForEachCopy visits every index exactly once, inline or on threads.
#include "common/parallel_copy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(ForEachCopyTest, EveryIndexOnce) {
  for (const int64_t count : {0, 1, 3, 8, 17, 100}) {
    for (const int64_t bytes : {int64_t{0}, int64_t{1} << 20, int64_t{64} << 20}) {
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
      if (bytes < (int64_t{4} << 20) && count > 0) {
        EXPECT_EQ(ids.size(), 1u);
        EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
      }
      if (bytes == (int64_t{64} << 20) && count >= 2 && std::thread::hardware_concurrency() >= 2) {
        EXPECT_GE(ids.size(), 2u) << "count " << count;
      }
    }
  }
}

}  // namespace
}  // namespace strata
