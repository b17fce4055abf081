// The one BlockStore implementation (block_store.h). Data path and eviction in store_impl.cc,
// administration in store_admin.cc.
//
// Locking: one mutex (mu_) guards all block, lease and tenant bookkeeping (and the RocksDB index
// writes that must stay ordered with it). No payload I/O runs under it: Commit's checksum and
// write-through, Lookup's promotion, and every DRAM -> SSD copy (flush, drain, demotion when
// eviction needs room) follow one pattern: reserve slots and mark the blocks under the mutex,
// release it for the SSD reads/writes, take it again to commit (index first, then memory). The
// blocks involved are held in place meanwhile (`readers`, a busy lease, or a block's
// `move_token`), so eviction, drain and admin evict skip them; a block quarantined meanwhile
// invalidates the move (its token no longer matches), and the copy's slot goes back. A
// concurrent reader of a block being moved keeps reading its DRAM copy, which the move does not
// touch: it gets that block or (once it has left) a miss, never another block's bytes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "cache_service/block_index.h"
#include "cache_service/block_store.h"
#include "cache_service/eviction_policy.h"
#include "cache_service/ssd_tier.h"
#include "common/metrics.h"

namespace strata::cache {

class StoreImpl final : public BlockStore {
 public:
  explicit StoreImpl(StoreOptions options);
  ~StoreImpl() override;
  absl::Status Init();

  absl::Status Reserve(const v1::ReserveRequest& req, v1::ReserveResponse* resp) override;
  absl::Status Commit(const v1::CommitRequest& req, v1::CommitResponse* resp) override;
  absl::Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) override;
  absl::Status Release(uint64_t lease_id) override;
  std::vector<int64_t> KeepAlive(const std::vector<uint64_t>& lease_ids) override;
  absl::Status Touch(const v1::TouchRequest& req, v1::TouchResponse* resp) override;
  size_t SweepLeases() override;

  void GetStats(v1::GetStatsResponse* resp) override;
  absl::Status SetTierCapacity(const v1::SetTierCapacityRequest& req,
                               v1::SetTierCapacityResponse* resp) override;
  absl::Status ListBlocks(const v1::ListBlocksRequest& req, v1::ListBlocksResponse* resp) override;
  absl::Status Evict(const v1::EvictRequest& req, v1::EvictResponse* resp) override;
  absl::Status Pin(const v1::PinRequest& req, v1::PinResponse* resp) override;
  absl::Status Unpin(const v1::UnpinRequest& req, v1::UnpinResponse* resp) override;
  absl::Status Flush(v1::FlushResponse* resp) override;
  absl::Status Verify(const v1::VerifyRequest& req, v1::VerifyResponse* resp) override;
  absl::Status Drain(const v1::DrainRequest& req, v1::DrainResponse* resp) override;
  std::map<TierKind, std::vector<BlockKey>> ResidentKeys() override;

  EventBus& events() override { return events_; }
  DramTier& dram() override { return *dram_; }
  const StoreOptions& options() const override { return options_; }

 private:
  struct Entry {
    BlockRecord rec;
    uint32_t readers = 0;     // read leases and in-flight I/O that need the block to stay put
    uint64_t move_token = 0;  // nonzero while a DRAM -> SSD copy of it runs outside mu_
  };
  struct Pending {
    BlockKey key;
    BlockKey parent;
    Namespace ns;
    std::string tenant;
    uint64_t payload_bytes = 0;
    SlotId dram_slot = 0;
  };
  struct Lease {
    uint64_t id = 0;
    int64_t expires_ms = 0;
    bool write = false;
    bool busy = false;              // a Commit is using it; not expired meanwhile
    std::vector<Pending> pending;   // write leases
    std::vector<BlockKey> readers;  // read leases: blocks whose `readers` it holds
  };
  struct TierCounters {
    uint64_t hits = 0, misses = 0, bytes_in = 0, bytes_out = 0, evictions = 0, promotions = 0;
  };
  struct Metrics;

  int64_t NowMs() const { return options_.now_ms(); }
  int64_t CapabilityExpiryMs() const;
  Tier* TierOf(TierKind kind);
  TierCounters& CountersOf(TierKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A free slot of `kind`, evicting blocks that need no I/O to leave (LRU tails first) when the
  // tier is full. Never writes payloads: room that needs demotion comes from MakeRoom().
  absl::StatusOr<SlotId> AllocateLocked(TierKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts up to `count` blocks from `kind` (LRU tails first); returns how many left the tier.
  // DRAM blocks that must be demoted first (no SSD copy yet and the policy keeps them) are not
  // evicted: with `dirty` they are chosen as victims like any other and returned there (the
  // caller copies them, then evicts them); without it they are passed over.
  // `keep`: blocks that must not be chosen (a Lookup making room for its own promotions).
  size_t EvictLocked(TierKind kind, size_t count, const std::string* tenant = nullptr,
                     std::vector<BlockKey>* dirty = nullptr,
                     const absl::flat_hash_set<BlockKey>* keep = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings `kind` down to `target_used` slots: evicts clean victims, copies dirty ones to SSD
  // (releasing `lock` for the I/O), then evicts them too (a block whose copy failed is dropped
  // from DRAM, as a cache may). `lock` holds mu_ on entry and on return.
  void ShrinkTo(std::unique_lock<std::mutex>& lock, TierKind kind, uint64_t target_used,
                const absl::flat_hash_set<BlockKey>* keep = nullptr);
  // At least `need` free slots in `kind` if eviction can make them (down to the low watermark),
  // evicting none of `keep`.
  void MakeRoom(std::unique_lock<std::mutex>& lock, TierKind kind, size_t need,
                const absl::flat_hash_set<BlockKey>* keep = nullptr);
  // Above the high watermark: evict down to the low one.
  void ApplyWatermark(std::unique_lock<std::mutex>& lock, TierKind kind);
  bool NeedsDemotionLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountEvictionsLocked(TierKind kind, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddBytesLocked(TierKind kind, bool in, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies DRAM-only blocks to SSD (write, sync, then index). `lock` holds mu_ on entry and on
  // return; it is released for the SSD writes. Returns the keys that made it.
  std::vector<BlockKey> CopyToSsd(std::unique_lock<std::mutex>& lock,
                                  const std::vector<BlockKey>& keys);
  // Removes the block from one tier (or all with kGpu used as "every tier": see .cc), updating
  // the index and publishing `evicted` (`by_operator`: for an admin Evict). False when the index
  // write failed (nothing changed).
  bool RemoveFromTierLocked(const BlockKey& key, std::optional<TierKind> tier,
                            bool by_operator = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QuarantineLocked(const BlockKey& key, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLeaseLocked(Lease& lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewLeaseLocked(Lease lease, v1::Lease* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetBytesLocked(const std::string& tenant, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keys a selector names (only blocks that exist; `missing` counts named keys that do not).
  std::vector<BlockKey> SelectLocked(const v1::BlockSelector& selector, uint64_t* missing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillInfo(const Entry& e, v1::BlockInfo* info) const;
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SweeperLoop();

  StoreOptions options_;
  std::unique_ptr<DramTier> dram_;
  std::unique_ptr<SsdTier> ssd_;
  std::unique_ptr<BlockIndex> index_;
  EventBus events_;
  std::unique_ptr<Metrics> metrics_;
  const int64_t start_ms_;

  std::mutex mu_;
  absl::flat_hash_map<BlockKey, Entry> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<BlockKey> pending_keys_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> tenant_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_move_token_ ABSL_GUARDED_BY(mu_) = 1;
  TierCounters dram_counters_ ABSL_GUARDED_BY(mu_);
  TierCounters ssd_counters_ ABSL_GUARDED_BY(mu_);
  uint64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lease_expiries_ ABSL_GUARDED_BY(mu_) = 0;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread sweeper_;
};

}  // namespace strata::cache
