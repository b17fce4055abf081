// ResidentBlocks over a host KV pool: references, sharing, duplicates, discards, tail-first
// reclaim, and the change log the scheduler is fed from.
#include "compute_nodes/worker/resident_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace strata::worker {
namespace {

runtime::KvLayout Layout() {
  return {.num_layers = 1, .block_tokens = 4, .latent_dim = 8, .rope_dim = 4};
}

// Distinct keys: key(i) has byte 0 = i + 1.
BlockKey Key(int i) {
  BlockKey k;
  k.bytes[0] = static_cast<uint8_t>(i + 1);
  return k;
}

std::vector<BlockKey> Keys(int first, int n) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(Key(first + i));
  return keys;
}

TEST(ResidentBlocksTest, ReleasedBlocksAreFoundAgainAndShared) {
  runtime::HostKvPool pool(Layout(), 8);
  ResidentBlocks resident(pool);
  resident.TrackTouches();
  runtime::PageTable a;
  ASSERT_TRUE(resident.EnsureCapacity(a, 14).ok());  // 4 pages: 3 full blocks + a partial one
  const std::vector<int32_t> pages = a.pages;
  const std::vector<BlockKey> keys = Keys(0, 3);
  resident.Release(keys, /*saved=*/2, a);
  EXPECT_TRUE(a.pages.empty());
  EXPECT_EQ(resident.resident_blocks(), 3);
  EXPECT_EQ(resident.idle_blocks(), 3);
  EXPECT_EQ(pool.free_pages(), 5);  // the partial page went back
  EXPECT_EQ(resident.available_pages(), 8);

  // Two sequences take the same leading blocks; a key that is not resident ends the run.
  runtime::PageTable b, c;
  int64_t saved = -1;
  std::vector<BlockKey> asked = {Key(0), Key(1), Key(7), Key(2)};
  EXPECT_EQ(resident.Acquire(asked, &b, &saved), 2);
  EXPECT_EQ(saved, 2);
  EXPECT_EQ(b.pages, std::vector<int32_t>(pages.begin(), pages.begin() + 2));
  EXPECT_EQ(resident.Acquire(keys, &c, &saved), 3);
  EXPECT_EQ(saved, 2) << "the third block was not known to be saved";
  // Every block handed out, once, for the cache server's LRU.
  std::vector<BlockKey> touched = resident.TakeTouched();
  std::sort(touched.begin(), touched.end());
  EXPECT_EQ(touched, keys);
  EXPECT_TRUE(resident.TakeTouched().empty());
  EXPECT_EQ(resident.idle_blocks(), 0);
  EXPECT_EQ(resident.available_pages(), 5);
  EXPECT_EQ(resident.hit_blocks(), 5);

  // Held pages are never reclaimed: asking for more than the free pages fails and keeps nothing.
  runtime::PageTable d;
  EXPECT_EQ(resident.EnsureCapacity(d, 6 * 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(d.pages.empty());
  EXPECT_EQ(pool.free_pages(), 5);

  // One holder lets go: the blocks stay held by the other.
  resident.Release(std::span<const BlockKey>(keys).first(2), 2, b);
  EXPECT_EQ(resident.idle_blocks(), 0);
  // c grows by one private page and finishes with four full blocks, marking the third saved.
  ASSERT_TRUE(resident.EnsureCapacity(c, 16).ok());
  const std::vector<BlockKey> four = Keys(0, 4);
  resident.Release(four, 4, c);
  EXPECT_EQ(resident.resident_blocks(), 4);
  EXPECT_EQ(resident.idle_blocks(), 4);
  runtime::PageTable e;
  EXPECT_EQ(resident.Acquire(four, &e, &saved), 4);
  EXPECT_EQ(saved, 4);
  resident.Release(four, 4, e);
  EXPECT_EQ(resident.DropIdle(), 4);
  EXPECT_EQ(pool.free_pages(), 8);
  EXPECT_EQ(resident.resident_blocks(), 0);
}

TEST(ResidentBlocksTest, ADuplicateBlockAndADiscardedTableFreeTheirPages) {
  runtime::HostKvPool pool(Layout(), 8);
  ResidentBlocks resident(pool);
  runtime::PageTable a, b;
  ASSERT_TRUE(resident.EnsureCapacity(a, 8).ok());
  ASSERT_TRUE(resident.EnsureCapacity(b, 8).ok());
  const std::vector<BlockKey> keys = Keys(0, 2);
  const std::vector<int32_t> kept = a.pages;
  resident.Release(keys, 0, a);
  resident.Release(keys, 0, b);  // the same blocks computed twice: b's pages are not needed
  EXPECT_EQ(resident.resident_blocks(), 2);
  EXPECT_EQ(pool.free_pages(), 6);
  runtime::PageTable c;
  int64_t saved = 0;
  ASSERT_EQ(resident.Acquire(keys, &c, &saved), 2);
  EXPECT_EQ(c.pages, kept);

  // A failed sequence: its own page is freed, the shared blocks only lose its reference.
  ASSERT_TRUE(resident.EnsureCapacity(c, 12).ok());
  resident.Discard(c);
  EXPECT_EQ(resident.resident_blocks(), 2);
  EXPECT_EQ(resident.idle_blocks(), 2);
  EXPECT_EQ(pool.free_pages(), 6);

  // Disabled: nothing is kept.
  ResidentBlocks off(pool, /*enabled=*/false);
  runtime::PageTable d;
  ASSERT_TRUE(off.EnsureCapacity(d, 8).ok());
  off.Release(Keys(5, 2), 2, d);
  EXPECT_EQ(off.resident_blocks(), 0);
  EXPECT_EQ(pool.free_pages(), 6);
}

TEST(ResidentBlocksTest, PagesAreReclaimedLeastRecentlyUsedAndTailFirst) {
  runtime::HostKvPool pool(Layout(), 6);
  ResidentBlocks resident(pool);
  runtime::PageTable a, b;
  ASSERT_TRUE(resident.EnsureCapacity(a, 12).ok());
  resident.Release(Keys(0, 3), 0, a);  // chain A: blocks 0, 1, 2
  ASSERT_TRUE(resident.EnsureCapacity(b, 12).ok());
  resident.Release(Keys(10, 3), 0, b);  // chain B, released later
  EXPECT_EQ(pool.free_pages(), 0);
  (void)resident.TakeChanges();

  // Two pages: A is older, and its tail goes first.
  runtime::PageTable c;
  ASSERT_TRUE(resident.EnsureCapacity(c, 8).ok());
  auto removed = [](const ResidentBlocks::Changes& changes) {
    std::vector<BlockKey> keys;
    for (const ResidentBlocks::Change& c : changes.list) {
      EXPECT_FALSE(c.added);
      keys.push_back(c.key);
    }
    return keys;
  };
  EXPECT_EQ(removed(resident.TakeChanges()), (std::vector<BlockKey>{Key(2), Key(1)}));
  int64_t saved = 0;
  runtime::PageTable probe;
  EXPECT_EQ(resident.Acquire(Keys(0, 3), &probe, &saved), 1) << "A's head is still there";
  resident.Release(Keys(0, 1), 0, probe);  // and is now the most recently used block
  runtime::PageTable more;
  ASSERT_TRUE(resident.EnsureCapacity(more, 12).ok());  // three more: all of B, not A's head
  EXPECT_EQ(removed(resident.TakeChanges()), (std::vector<BlockKey>{Key(12), Key(11), Key(10)}));
  std::vector<BlockKey> left = resident.Keys();
  EXPECT_EQ(left, std::vector<BlockKey>{Key(0)});
  resident.Discard(c);
  resident.Discard(more);
}

// An operator evicted blocks from the cache server: an idle copy goes at once, a held one is no
// longer handed out and goes when its holder lets go.
TEST(ResidentBlocksTest, ForgottenBlocksAreNotHandedOutAgain) {
  runtime::HostKvPool pool(Layout(), 8);
  ResidentBlocks resident(pool);
  runtime::PageTable a;
  ASSERT_TRUE(resident.EnsureCapacity(a, 12).ok());
  resident.Release(Keys(0, 3), 3, a);
  runtime::PageTable held;
  int64_t saved = 0;
  ASSERT_EQ(resident.Acquire(Keys(0, 1), &held, &saved), 1);  // block 0 is in use
  (void)resident.TakeChanges();

  const std::vector<BlockKey> evicted = {Key(0), Key(2), Key(9)};
  EXPECT_EQ(resident.Forget(evicted), 2) << "key 9 was never resident";
  EXPECT_EQ(resident.Forget(evicted), 0) << "nothing left to forget";
  EXPECT_EQ(pool.free_pages(), 6);  // block 2's page; block 0's is still held
  EXPECT_EQ(resident.idle_blocks(), 1);
  runtime::PageTable probe;
  EXPECT_EQ(resident.Acquire(Keys(0, 2), &probe, &saved), 0);
  const ResidentBlocks::Changes changes = resident.TakeChanges();
  ASSERT_EQ(changes.list.size(), 2u);
  EXPECT_FALSE(changes.list[0].added || changes.list[1].added);

  resident.Release(Keys(0, 1), 1, held);
  EXPECT_EQ(pool.free_pages(), 7);
  EXPECT_EQ(resident.resident_blocks(), 1);  // block 1 only
  EXPECT_TRUE(resident.TakeChanges().list.empty()) << "block 0's removal was noted once";
}

// A running sequence's filled blocks: resident and held by it; another table finds them; a block
// already resident elsewhere stays private; the owner's release leaves them idle.
TEST(ResidentBlocksTest, PublishedBlocksAreSharedWhileTheirSequenceRuns) {
  runtime::HostKvPool pool(Layout(), 8);
  ResidentBlocks resident(pool);
  runtime::PageTable owner, twin;
  ASSERT_TRUE(resident.EnsureCapacity(owner, 10).ok());  // 2 full blocks + 2 tokens
  ASSERT_TRUE(resident.EnsureCapacity(twin, 4).ok());
  resident.Publish(Keys(0, 1), 1, owner, 0);
  resident.Publish(Keys(0, 2), 1, owner, 1);  // the next block filled
  resident.Publish(Keys(0, 1), 0, twin, 0);   // the same block computed in another table
  EXPECT_EQ(resident.resident_blocks(), 2);
  EXPECT_EQ(resident.idle_blocks(), 0);
  runtime::PageTable reader;
  int64_t saved = 0;
  ASSERT_EQ(resident.Acquire(Keys(0, 2), &reader, &saved), 2);
  EXPECT_EQ(saved, 1);
  EXPECT_EQ(reader.pages, std::vector<int32_t>(owner.pages.begin(), owner.pages.begin() + 2));
  resident.Release(Keys(0, 2), 2, owner);  // held by the reader still
  EXPECT_EQ(resident.idle_blocks(), 0);
  EXPECT_EQ(pool.free_pages(), 5);        // the owner's partial page
  resident.Release(Keys(0, 1), 0, twin);  // a duplicate: freed
  resident.Release(Keys(0, 2), 2, reader);
  EXPECT_EQ(resident.idle_blocks(), 2);
  EXPECT_EQ(pool.free_pages(), 6);
  ASSERT_EQ(resident.Acquire(Keys(0, 2), &reader, &saved), 2);
  EXPECT_EQ(saved, 2) << "the owner's release marked both saved";
  resident.Release(Keys(0, 2), 2, reader);
}

TEST(ResidentBlocksTest, TheChangeLogNamesParentsAndOverflowsIntoADigest) {
  runtime::HostKvPool pool(Layout(), 4);
  ResidentBlocks resident(pool);
  runtime::PageTable a;
  ASSERT_TRUE(resident.EnsureCapacity(a, 8).ok());
  resident.Release(Keys(0, 2), 0, a);
  ResidentBlocks::Changes changes = resident.TakeChanges();
  ASSERT_EQ(changes.list.size(), 2u);
  // Released tail first.
  EXPECT_EQ(changes.list[0].key, Key(1));
  EXPECT_EQ(changes.list[0].parent, Key(0));
  EXPECT_EQ(changes.list[1].key, Key(0));
  EXPECT_EQ(changes.list[1].parent, BlockKey{});
  EXPECT_TRUE(changes.list[0].added && changes.list[1].added);
  EXPECT_FALSE(changes.overflowed);
  EXPECT_TRUE(resident.TakeChanges().list.empty());
  // Forgotten and kept again within one period: the order says which came last.
  runtime::PageTable b;
  ASSERT_TRUE(resident.EnsureCapacity(b, 16).ok());  // takes both idle blocks' pages
  resident.Release(Keys(0, 1), 0, b);
  changes = resident.TakeChanges();
  ASSERT_EQ(changes.list.size(), 3u);
  EXPECT_FALSE(changes.list[0].added);
  EXPECT_FALSE(changes.list[1].added);
  EXPECT_TRUE(changes.list[2].added);
  EXPECT_EQ(changes.list[2].key, Key(0));

  // Nobody reads the log: it stops growing and says so.
  for (size_t i = 0; i < ResidentBlocks::kMaxChanges; ++i) {
    runtime::PageTable t;
    ASSERT_TRUE(resident.EnsureCapacity(t, 16).ok());
    BlockKey k;
    k.bytes[1] = static_cast<uint8_t>(i);
    k.bytes[2] = static_cast<uint8_t>(i >> 8);
    k.bytes[3] = 0xee;
    resident.Release(std::span<const BlockKey>(&k, 1), 0, t);
  }
  changes = resident.TakeChanges();
  EXPECT_TRUE(changes.overflowed);
  EXPECT_TRUE(changes.list.empty());
  EXPECT_LE(resident.resident_blocks(), 4);
}

// SavedKeys lists what is known to be in the cache server; MarkUnsaved takes that back (the server
// restarted without them), so the next holder saves them again.
TEST(ResidentBlocksTest, BlocksMarkedUnsavedAreReportedUnsaved) {
  runtime::HostKvPool pool(Layout(), 8);
  ResidentBlocks resident(pool);
  runtime::PageTable a;
  ASSERT_TRUE(resident.EnsureCapacity(a, 12).ok());
  const std::vector<BlockKey> keys = Keys(0, 3);
  resident.Release(keys, /*saved=*/2, a);
  std::vector<BlockKey> saved_keys = resident.SavedKeys();
  std::sort(saved_keys.begin(), saved_keys.end());
  EXPECT_EQ(saved_keys, Keys(0, 2));

  const std::vector<BlockKey> first = {Key(0), Key(2), Key(7)};
  EXPECT_EQ(resident.MarkUnsaved(first), 1) << "Key(2) was not saved, Key(7) is not resident";
  EXPECT_EQ(resident.SavedKeys(), std::vector<BlockKey>{Key(1)});
  runtime::PageTable b;
  int64_t saved = -1;
  EXPECT_EQ(resident.Acquire(keys, &b, &saved), 3);
  EXPECT_EQ(saved, 0) << "the run of saved blocks now ends at the first";
  resident.Release(keys, 0, b);
  EXPECT_EQ(resident.DropIdle(), 3);
  EXPECT_EQ(pool.free_pages(), 8);
}

}  // namespace
}  // namespace strata::worker
