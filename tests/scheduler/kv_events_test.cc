#include "scheduler/kv_events.h"

#include <gtest/gtest.h>

#include "tests/scheduler/test_keys.h"

namespace strata::scheduler {
namespace {

using testing_keys::Chain;

std::string Bytes(const BlockKey& key) { return std::string(key.View()); }

v1::KvEvent Stored(uint64_t seq, const std::vector<BlockKey>& keys, v1::Tier tier) {
  v1::KvEvent e;
  e.set_sequence(seq);
  e.set_source("w0");
  for (const BlockKey& k : keys) e.mutable_stored()->add_keys(Bytes(k));
  e.mutable_stored()->set_tier(tier);
  return e;
}

TEST(KvEventSinkTest, AppliesEveryEventKind) {
  PrefixIndex index(1000);
  KvEventSink sink(&index);
  const auto chain = Chain(0, 4);
  ASSERT_TRUE(sink.Apply(0, Stored(1, chain, v1::TIER_GPU)).ok());
  EXPECT_EQ(index.Match(chain).For(0).tiers[0], 4u);

  v1::KvEvent moved;
  moved.set_sequence(2);
  moved.mutable_moved()->add_keys(Bytes(chain[0]));
  moved.mutable_moved()->set_from_tier(v1::TIER_GPU);
  moved.mutable_moved()->set_to_tier(v1::TIER_SSD);
  ASSERT_TRUE(sink.Apply(0, moved).ok());
  EXPECT_EQ(index.Match(chain).For(0).tiers[2], 1u);

  v1::KvEvent evicted;
  evicted.set_sequence(3);
  evicted.mutable_evicted()->add_keys(Bytes(chain[3]));  // TIER_UNSPECIFIED: every tier
  ASSERT_TRUE(sink.Apply(0, evicted).ok());
  EXPECT_EQ(index.Match(chain).For(0).blocks, 3u);

  v1::KvEvent quarantined;
  quarantined.set_sequence(4);
  quarantined.mutable_quarantined()->set_key(Bytes(chain[1]));
  ASSERT_TRUE(sink.Apply(0, quarantined).ok());
  EXPECT_EQ(index.Match(chain).For(0).blocks, 1u);
  EXPECT_FALSE(sink.OutOfSync(0));
}

TEST(KvEventSinkTest, MalformedEventsChangeNothing) {
  PrefixIndex index(1000);
  KvEventSink sink(&index);
  v1::KvEvent bad_key = Stored(1, Chain(0, 1), v1::TIER_GPU);
  bad_key.mutable_stored()->add_keys("short");
  EXPECT_TRUE(absl::IsInvalidArgument(sink.Apply(0, bad_key)));
  EXPECT_TRUE(absl::IsInvalidArgument(sink.Apply(0, Stored(1, Chain(0, 1), v1::TIER_UNSPECIFIED))));
  EXPECT_TRUE(absl::IsInvalidArgument(sink.Apply(0, v1::KvEvent{})));
  EXPECT_EQ(index.Stats().indexed_blocks, 0u);
}

TEST(KvEventSinkTest, SequenceGapMarksOutOfSyncUntilADigest) {
  PrefixIndex index(1000);
  KvEventSink sink(&index);
  ASSERT_TRUE(sink.Apply(0, Stored(1, Chain(0, 2), v1::TIER_DRAM)).ok());
  ASSERT_TRUE(sink.Apply(0, Stored(5, Chain(10, 2), v1::TIER_DRAM)).ok());  // 2..4 lost
  EXPECT_TRUE(sink.OutOfSync(0));
  EXPECT_FALSE(sink.OutOfSync(1));

  v1::KvEvent page;
  page.set_sequence(9);
  page.set_source("w0");
  page.mutable_digest()->set_digest_id(3);
  page.mutable_digest()->set_tier(v1::TIER_DRAM);
  for (const BlockKey& k : Chain(0, 3)) page.mutable_digest()->add_keys(Bytes(k));
  page.mutable_digest()->set_last_page(true);
  ASSERT_TRUE(sink.Apply(0, page).ok());
  EXPECT_FALSE(sink.OutOfSync(0));
  EXPECT_EQ(index.Match(Chain(0, 3)).For(0).tiers[1], 3u);
  EXPECT_TRUE(index.Match(Chain(10, 2)).nodes.empty());  // replaced by the digest
}

// Two sources feeding one node (a worker's cache server and the worker) number their events
// independently: neither makes the other look out of sync.
TEST(KvEventSinkTest, EachSourceOfANodeHasItsOwnSequence) {
  PrefixIndex index(1000);
  KvEventSink sink(&index);
  v1::KvEvent from_cache = Stored(1, Chain(0, 2), v1::TIER_DRAM);
  from_cache.set_source("cache-0");
  v1::KvEvent from_worker = Stored(1, Chain(0, 1), v1::TIER_GPU);
  from_worker.set_source("worker-0");
  ASSERT_TRUE(sink.Apply(0, from_cache).ok());
  ASSERT_TRUE(sink.Apply(0, from_worker).ok());
  from_cache.set_sequence(2);
  from_worker.set_sequence(2);
  ASSERT_TRUE(sink.Apply(0, from_worker).ok());
  ASSERT_TRUE(sink.Apply(0, from_cache).ok());
  EXPECT_FALSE(sink.OutOfSync(0));
  EXPECT_EQ(index.Match(Chain(0, 2)).For(0).tiers[0], 1u);
  // The cache server drops both blocks from all of its tiers: the worker's GPU copy stays.
  v1::KvEvent gone;
  gone.set_sequence(3);
  gone.set_source("cache-0");
  for (const BlockKey& k : Chain(0, 2)) gone.mutable_evicted()->add_keys(Bytes(k));
  ASSERT_TRUE(sink.Apply(0, gone).ok());
  const PrefixMatch match = index.Match(Chain(0, 2));
  EXPECT_EQ(match.For(0).blocks, 1u);
  EXPECT_EQ(match.For(0).tiers[0], 1u);
  EXPECT_EQ(match.For(0).tiers[1], 0u);
  from_worker.set_sequence(7);
  ASSERT_TRUE(sink.Apply(0, from_worker).ok());
  EXPECT_TRUE(sink.OutOfSync(0));
}

}  // namespace
}  // namespace strata::scheduler
