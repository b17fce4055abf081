#include "scheduler/prefix_index.h"

#include <gtest/gtest.h>

#include "tests/scheduler/test_keys.h"

namespace strata::scheduler {
namespace {

using testing_keys::Chain;
using testing_keys::Key;

std::span<const BlockKey> Head(const std::vector<BlockKey>& keys, size_t n) {
  return std::span<const BlockKey>(keys.data(), n);
}

TEST(PrefixIndexTest, LongestContiguousPrefixPerNode) {
  PrefixIndex index(1000);
  const auto chain = Chain(0, 10);
  index.Stored(0, CacheTier::kGpu, Head(chain, 6));
  index.Stored(1, CacheTier::kDram, Head(chain, 3));
  // Node 2 holds blocks 0, 1 and 4: the gap at 2 ends its prefix.
  index.Stored(2, CacheTier::kSsd, Head(chain, 2));
  index.Stored(2, CacheTier::kSsd, std::span<const BlockKey>(&chain[4], 1));

  const PrefixMatch match = index.Match(chain);
  EXPECT_EQ(match.For(0).blocks, 6u);
  EXPECT_EQ(match.For(0).tiers[0], 6u);
  EXPECT_EQ(match.For(1).blocks, 3u);
  EXPECT_EQ(match.For(1).tiers[1], 3u);
  EXPECT_EQ(match.For(2).blocks, 2u);
  EXPECT_EQ(match.For(3).blocks, 0u);
  ASSERT_NE(match.Longest(), nullptr);
  EXPECT_EQ(match.Longest()->node, 0u);
}

TEST(PrefixIndexTest, NoMatchForUnknownChainAndOtherChains) {
  PrefixIndex index(1000);
  index.Stored(0, CacheTier::kGpu, Chain(0, 4));
  EXPECT_TRUE(index.Match(Chain(100, 4)).nodes.empty());
  // A chain that starts differently shares nothing even if later keys collide in index.
  std::vector<BlockKey> other = {Key(100), Key(1), Key(2)};
  EXPECT_TRUE(index.Match(other).nodes.empty());
}

TEST(PrefixIndexTest, FastestTierCountsWhenANodeHoldsTwoCopies) {
  PrefixIndex index(1000);
  const auto chain = Chain(0, 2);
  index.Stored(0, CacheTier::kSsd, chain);
  index.Stored(0, CacheTier::kGpu, Head(chain, 1));
  const NodePrefix p = index.Match(chain).For(0);
  EXPECT_EQ(p.blocks, 2u);
  EXPECT_EQ(p.tiers[static_cast<int>(CacheTier::kGpu)], 1u);
  EXPECT_EQ(p.tiers[static_cast<int>(CacheTier::kSsd)], 1u);
  EXPECT_EQ(index.BlocksHeldBy(0), 2u);
}

TEST(PrefixIndexTest, MovedAndEvictedUpdateHolders) {
  PrefixIndex index(1000);
  const auto chain = Chain(0, 4);
  index.Stored(0, CacheTier::kGpu, chain);
  index.Moved(0, CacheTier::kGpu, CacheTier::kDram, Head(chain, 2));
  NodePrefix p = index.Match(chain).For(0);
  EXPECT_EQ(p.blocks, 4u);
  EXPECT_EQ(p.tiers[0], 2u);
  EXPECT_EQ(p.tiers[1], 2u);

  // Evicting block 1 from DRAM cuts the prefix to one block.
  index.Evicted(0, CacheTier::kDram, std::span<const BlockKey>(&chain[1], 1));
  EXPECT_EQ(index.Match(chain).For(0).blocks, 1u);
  // Eviction from a tier the node does not use for that key changes nothing.
  index.Evicted(0, CacheTier::kSsd, Head(chain, 1));
  EXPECT_EQ(index.Match(chain).For(0).blocks, 1u);
  // Unspecified tier: gone everywhere.
  index.Evicted(0, std::nullopt, chain);
  EXPECT_TRUE(index.Match(chain).nodes.empty());
  EXPECT_EQ(index.Stats().indexed_blocks, 0u);
  EXPECT_EQ(index.Stats().holders, 0u);
  EXPECT_EQ(index.BlocksHeldBy(0), 0u);
}

TEST(PrefixIndexTest, QuarantineRemovesEveryHolder) {
  PrefixIndex index(1000);
  const auto chain = Chain(0, 3);
  index.Stored(0, CacheTier::kGpu, chain);
  index.Stored(1, CacheTier::kDram, chain);
  index.Quarantined(chain[1]);
  const PrefixMatch match = index.Match(chain);
  EXPECT_EQ(match.For(0).blocks, 1u);
  EXPECT_EQ(match.For(1).blocks, 1u);
}

TEST(PrefixIndexTest, DigestReplacesTheSourceState) {
  PrefixIndex index(1000);
  index.Stored(0, CacheTier::kDram, Chain(0, 5));
  index.Stored(1, CacheTier::kDram, Chain(0, 5));
  // Node 0 really holds blocks 0..2 in DRAM and 0..1 of another chain; two pages.
  index.DigestPage(0, "cache", 7, CacheTier::kDram, Chain(0, 2), /*last_page=*/false);
  // Before the last page nothing changes.
  EXPECT_EQ(index.Match(Chain(0, 5)).For(0).blocks, 5u);
  index.DigestPage(0, "cache", 7, CacheTier::kDram, Chain(2, 1), false);
  index.DigestPage(0, "cache", 7, CacheTier::kSsd, Chain(50, 2), true);
  const PrefixMatch match = index.Match(Chain(0, 5));
  EXPECT_EQ(match.For(0).blocks, 3u);
  EXPECT_EQ(match.For(0).tiers[1], 3u);
  EXPECT_EQ(match.For(1).blocks, 5u);  // other sources untouched
  EXPECT_EQ(index.Match(Chain(50, 2)).For(0).blocks, 2u);
  EXPECT_EQ(index.Stats().digests_applied, 1u);
}

// A worker node is fed by its cache server (DRAM, SSD) and by itself (GPU: resident blocks). Each
// source's digest replaces only the tiers it names, and their pages may interleave.
TEST(PrefixIndexTest, DigestsOfTwoSourcesReplaceOnlyTheirOwnTiers) {
  PrefixIndex index(1000);
  index.Stored(0, CacheTier::kDram, Chain(0, 4));
  index.Stored(0, CacheTier::kGpu, Chain(0, 2));
  index.Stored(0, CacheTier::kGpu, Chain(20, 1));
  index.DigestPage(0, "cache", 5, CacheTier::kDram, Chain(0, 3), false);
  // The worker's digest, between the cache server's pages: its GPU blocks are now 0..2.
  index.DigestPage(0, "worker", 1, CacheTier::kGpu, Chain(0, 3), true);
  PrefixMatch match = index.Match(Chain(0, 4));
  EXPECT_EQ(match.For(0).blocks, 4u);
  EXPECT_EQ(match.For(0).tiers[0], 3u);  // GPU
  EXPECT_EQ(match.For(0).tiers[1], 1u);  // block 3 only in DRAM
  EXPECT_TRUE(index.Match(Chain(20, 1)).nodes.empty()) << "the worker no longer holds it";
  // The cache server's last page (an empty SSD page) replaces DRAM and SSD, not GPU.
  index.DigestPage(0, "cache", 5, CacheTier::kSsd, {}, true);
  match = index.Match(Chain(0, 4));
  EXPECT_EQ(match.For(0).blocks, 3u);
  EXPECT_EQ(match.For(0).tiers[0], 3u);
  EXPECT_EQ(index.Stats().digests_applied, 2u);
  // An empty GPU digest clears the GPU copies; DRAM stays.
  index.DigestPage(0, "worker", 2, CacheTier::kGpu, {}, true);
  match = index.Match(Chain(0, 4));
  EXPECT_EQ(match.For(0).blocks, 3u);
  EXPECT_EQ(match.For(0).tiers[1], 3u);
}

TEST(PrefixIndexTest, DigestWithNewIdDiscardsEarlierPages) {
  PrefixIndex index(1000);
  index.DigestPage(0, "w", 1, CacheTier::kGpu, Chain(0, 3), false);
  index.DigestPage(0, "w", 2, CacheTier::kGpu, Chain(10, 1), true);
  EXPECT_TRUE(index.Match(Chain(0, 3)).nodes.empty());
  EXPECT_EQ(index.Match(Chain(10, 1)).For(0).blocks, 1u);
}

TEST(PrefixIndexTest, RemoveNodeForgetsOnlyThatNode) {
  PrefixIndex index(1000);
  index.Stored(0, CacheTier::kGpu, Chain(0, 3));
  index.Stored(1, CacheTier::kGpu, Chain(0, 3));
  index.RemoveNode(0);
  const PrefixMatch match = index.Match(Chain(0, 3));
  EXPECT_EQ(match.For(0).blocks, 0u);
  EXPECT_EQ(match.For(1).blocks, 3u);
}

TEST(PrefixIndexTest, CapacityBoundForgetsLeastRecentlyUsed) {
  PrefixIndex index(4);
  index.Stored(0, CacheTier::kGpu, Chain(0, 2));   // keys 0, 1
  index.Stored(0, CacheTier::kGpu, Chain(10, 2));  // keys 10, 11
  // Matching chain 0 makes it recent; storing two more keys evicts 10 and 11.
  EXPECT_EQ(index.Match(Chain(0, 2)).For(0).blocks, 2u);
  index.Stored(1, CacheTier::kGpu, Chain(20, 2));
  const PrefixIndexStats stats = index.Stats();
  EXPECT_EQ(stats.indexed_blocks, 4u);
  EXPECT_EQ(stats.evicted_entries, 2u);
  EXPECT_EQ(index.Match(Chain(0, 2)).For(0).blocks, 2u);
  EXPECT_TRUE(index.Match(Chain(10, 2)).nodes.empty());
  EXPECT_EQ(index.BlocksHeldBy(0), 2u);
  EXPECT_EQ(index.BlocksHeldBy(1), 2u);
}

TEST(PrefixIndexTest, StatsCountEventsAndHolders) {
  PrefixIndex index(100);
  index.Stored(0, CacheTier::kGpu, Chain(0, 3));
  index.Stored(1, CacheTier::kDram, Chain(0, 2));
  const PrefixIndexStats s = index.Stats();
  EXPECT_EQ(s.indexed_blocks, 3u);
  EXPECT_EQ(s.holders, 5u);
  EXPECT_EQ(s.events_applied, 2u);
  EXPECT_EQ(s.capacity_blocks, 100u);
  EXPECT_GT(s.memory_bytes, 0u);
}

}  // namespace
}  // namespace strata::scheduler
