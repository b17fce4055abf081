// The worker's own tier: full KV blocks left in the KV pool after their sequence ended (GPU
// memory with the cuda backend), found again by block key. A later request whose prompt starts
// with them — the next turn of a chat, a shared system prompt, a swapped-out sequence coming
// back — takes the pages as they are: no fetch, no import, no copy. Pages are shared read-only
// between the sequences that hold them (a full block is never written again), with a reference
// count each.
//
//   ResidentBlocks resident(pool);
//   int64_t saved = 0;
//   const int64_t hit = resident.Acquire(keys, &table, &saved);  // table.pages[0..hit) shared
//   RETURN_IF_ERROR(resident.EnsureCapacity(table, tokens));     // reclaims idle blocks if short
//   ...
//   resident.Release(full_block_keys, saved_blocks, table);      // pages stay, or go to the pool
//
// A running sequence publishes its blocks as each one fills (Publish), so a prompt admitted while
// it still runs shares them too. A block nobody holds is idle: it still owns its page, but the page
// is taken back (the block forgotten) as soon as a sequence needs one and the pool has none free,
// least recently used first, and within a chain from its tail, so a kept suffix always has its
// prefix. Idle pages therefore count as available: `available_pages()`.
//
// Each block remembers whether it is known to be in the cache server (saved, or being saved), so
// that a sequence that takes it does not save it again.
//
// Thread safety: every method locks; the ones that move a sequence's pages (Acquire,
// EnsureCapacity, Publish, Release, Discard) are meant for one thread, the worker's loop, which
// owns the tables. DropIdle, Forget, MarkUnsaved, the counters, TakeChanges, Keys and SavedKeys
// may be called from any.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/block_key.h"
#include "compute_nodes/runtime/kv_pool.h"

namespace strata::worker {

class ResidentBlocks {
 public:
  // `enabled` false: nothing is kept (Release frees every page), as a pool without this tier.
  explicit ResidentBlocks(runtime::KvPool& pool, bool enabled = true);
  ~ResidentBlocks();  // DropIdle(); blocks still held by sequences are a bug (logged)
  ResidentBlocks(const ResidentBlocks&) = delete;
  ResidentBlocks& operator=(const ResidentBlocks&) = delete;

  // Appends to `table` (which must be empty) the pages of the longest leading run of `keys` that
  // is resident, each with one more reference; returns how many. `*saved`: how many of those, from
  // the first, are known to be in the cache server.
  int64_t Acquire(std::span<const BlockKey> keys, runtime::PageTable* table, int64_t* saved);

  // Pool pages free now plus idle resident pages (what EnsureCapacity can still hand out).
  int64_t available_pages() const;

  // Allocates pages until `table` covers `tokens` tokens, taking idle blocks' pages when the pool
  // has none free. ResourceExhausted (nothing changed) when available_pages() is too few.
  absl::Status EnsureCapacity(runtime::PageTable& table, int64_t tokens);

  // Makes the table's full blocks [from, keys.size()) resident while their sequence still runs,
  // held by it (one reference each), so that a prompt admitted meanwhile shares them. A page
  // already resident is skipped, and so is a block resident in another page (computed twice:
  // this copy stays the sequence's own). `saved`: as for Release.
  void Publish(std::span<const BlockKey> keys, int64_t saved, const runtime::PageTable& table,
               size_t from);

  // Gives back every page of `table` and empties it. `keys` name the table's leading full
  // blocks (keys.size() <= table.pages.size(); each page's KV complete); the first `saved` are
  // known to be in the cache server. Those pages become (or stay) resident; a block already
  // resident in another page, and every page past the keys, goes back to the pool.
  void Release(std::span<const BlockKey> keys, int64_t saved, runtime::PageTable& table);
  // Frees every page and forgets every block: for a sequence whose pages cannot be trusted
  // (its engine step failed), nothing of it is kept.
  void Discard(runtime::PageTable& table);

  // Forgets every idle block, returning its page to the pool. Returns how many.
  int64_t DropIdle();
  // Forgets the blocks of `keys` that are resident (an operator evicted them from the cache
  // server): an idle one's page goes back now; a held one is found by no later Acquire and its
  // page goes back when its last holder releases it. Returns how many were resident.
  int64_t Forget(std::span<const BlockKey> keys);
  // Marks the resident blocks of `keys` as not in the cache server (it restarted without them),
  // so the next sequence that takes them saves them again. Returns how many were marked.
  int64_t MarkUnsaved(std::span<const BlockKey> keys);

  int64_t resident_blocks() const;  // held + idle
  int64_t idle_blocks() const;
  int64_t hit_blocks() const;  // blocks handed out by Acquire since start

  // What became resident and what was forgotten since the last call, in order (for the
  // scheduler's prefix index). At most kMaxChanges are kept: past that the list is dropped and
  // `overflowed` set (send Keys() instead).
  struct Change {
    BlockKey key;
    BlockKey parent;  // of an added block; zero for a chain's first block
    bool added = false;
  };
  struct Changes {
    std::vector<Change> list;
    bool overflowed = false;
  };
  static constexpr size_t kMaxChanges = size_t{1} << 16;
  Changes TakeChanges();
  // Every resident block's key (a digest for the scheduler).
  std::vector<BlockKey> Keys() const;
  // The keys of the resident blocks known to be in the cache server (saved), not forgotten.
  std::vector<BlockKey> SavedKeys() const;
  // The blocks handed out by Acquire since the last call (each once, at most kMaxChanges): hits
  // the cache server never saw, to mark used there too (CacheControl.Touch), so it does not
  // evict what the workers keep serving. Recorded only once TrackTouches() was called (by the
  // one who takes them).
  void TrackTouches();
  std::vector<BlockKey> TakeTouched();

 private:
  struct Block {
    BlockKey parent;
    int32_t page = -1;
    int32_t refs = 0;
    bool saved = false;
    bool forgotten = false;              // Forget() while held: freed at the last release
    std::list<BlockKey>::iterator idle;  // position in idle_ while refs == 0
  };

  // Forgets the least recently released idle block and frees its page.
  void ReclaimOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the page of a block not in idle_ and forgets the block (noting its removal).
  void EraseLocked(absl::flat_hash_map<BlockKey, Block>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block whose last holder let go: idle, or gone if it was forgotten meanwhile.
  void LetGoLocked(BlockKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteLocked(Change change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  runtime::KvPool& pool_;
  const bool enabled_;
  mutable std::mutex mu_;
  absl::flat_hash_map<BlockKey, Block> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, BlockKey> by_page_ ABSL_GUARDED_BY(mu_);
  // Idle blocks, the next to reclaim first. A released chain enters tail first, so its head,
  // which every longer prompt with that prefix needs, is reclaimed last.
  std::list<BlockKey> idle_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  Changes changes_ ABSL_GUARDED_BY(mu_);
  bool track_touches_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<BlockKey> touched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::worker
