#include "cache_service/eviction_policy.h"

#include <gtest/gtest.h>

namespace strata::cache {
namespace {

BlockKey K(uint8_t b) {
  BlockKey k;
  k.bytes[0] = b;
  return k;
}

TEST(EvictionPolicyTest, ChainsGoFromTheTailInLruOrder) {
  // Chain 1 -> 2 -> 3 (old), chain 10 -> 11 (new).
  std::vector<EvictionCandidate> c = {{K(1), {}, 10, true},
                                      {K(2), K(1), 11, true},
                                      {K(3), K(2), 12, true},
                                      {K(10), {}, 50, true},
                                      {K(11), K(10), 51, true}};
  EXPECT_EQ(SelectVictims(c, 3), (std::vector<BlockKey>{K(3), K(2), K(1)}));
  EXPECT_EQ(SelectVictims(c, 4), (std::vector<BlockKey>{K(3), K(2), K(1), K(11)}));
}

TEST(EvictionPolicyTest, AnUnevictableBlockShieldsItsPrefix) {
  std::vector<EvictionCandidate> c = {
      {K(1), {}, 10, true}, {K(2), K(1), 11, false}, {K(10), {}, 50, true}};
  EXPECT_EQ(SelectVictims(c, 5), (std::vector<BlockKey>{K(10)}));
}

TEST(EvictionPolicyTest, ABranchingPrefixWaitsForAllItsChildren) {
  std::vector<EvictionCandidate> c = {
      {K(1), {}, 1, true}, {K(2), K(1), 5, true}, {K(3), K(1), 9, true}};
  EXPECT_EQ(SelectVictims(c, 2), (std::vector<BlockKey>{K(2), K(3)}));
  EXPECT_EQ(SelectVictims(c, 0), std::vector<BlockKey>{});
}

}  // namespace
}  // namespace strata::cache
