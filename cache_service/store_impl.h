// The one BlockStore implementation (block_store.h). Data path and eviction in store_impl.cc,
// administration in store_admin.cc.
//
// Locking: one mutex (mu_) guards all block, lease and tenant bookkeeping. Payload I/O on the
// hot paths (Commit's checksum and write-through, Lookup's promotion) runs outside it; the blocks
// involved are held in place meanwhile (`readers`, or the lease marked busy), so eviction skips
// them. Administrative bulk moves (flush, drain, demotion on eviction) do their SSD I/O under the
// mutex: rare, batched, and simpler to reason about.
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
    uint32_t readers = 0;  // read leases and in-flight I/O that need the block to stay put
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

  // A DRAM slot, evicting (and demoting) to make room when the arena is full.
  absl::StatusOr<SlotId> AllocateLocked(TierKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts up to `count` blocks from `kind` (LRU tails first). DRAM blocks without an SSD copy
  // are demoted first when the policy says so. Returns how many left the tier.
  size_t EvictLocked(TierKind kind, size_t count, const std::string* tenant = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Above the high watermark: evict down to the low one.
  void ApplyWatermarkLocked(TierKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies DRAM-only blocks to SSD (write, sync, then index). Returns the keys that made it.
  std::vector<BlockKey> CopyToSsdLocked(const std::vector<BlockKey>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the block from one tier (or all with kGpu used as "every tier": see .cc), updating
  // the index and publishing `evicted`. False when the index write failed (nothing changed).
  bool RemoveFromTierLocked(const BlockKey& key, std::optional<TierKind> tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
