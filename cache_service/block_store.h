// The cache server's block store: tiers (DRAM arena, SSD slot files; GPU later), the RocksDB
// index, leases, eviction and KV events, behind one interface. The gRPC services
// (cache_control_service.h, cache_admin_service.h) are thin adapters over it, which is why the
// methods speak the v1 protocol messages.
//
// Lifecycle: Open() creates the DRAM arena, opens the SSD slot files and the index, and
// re-admits every block the index lists on SSD (warm restart; DRAM residency is volatile and
// dropped). A background thread expires leases. Destroying the store stops it; blocks on SSD
// stay for the next Open().
//
// Data path: Reserve() hands out DRAM slots under a write lease; the client writes each payload
// into its slot (through the transfer engine, or directly into the shared arena), then Commit()
// verifies the checksums, writes through to SSD per policy, records the blocks in the index and
// publishes `stored`. Lookup() answers the longest present prefix of a chain (promoting SSD hits
// to DRAM, checksum-verified), optionally under a read lease that keeps the blocks in place until
// Release() or expiry.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache_service/dram_tier.h"
#include "cache_service/event_bus.h"
#include "common/block_key.h"
#include "strata/v1/cache.pb.h"
#include "strata/v1/cache_admin.pb.h"

namespace strata::cache {

enum class WritePolicy { kWriteThrough, kOnEvict, kNever };
absl::StatusOr<WritePolicy> ParseWritePolicy(std::string_view name);

struct StoreOptions {
  std::string server_id = "cache";
  std::string data_dir;  // the index lives in data_dir/index
  uint64_t slot_bytes = 4 << 20;
  uint64_t dram_capacity_bytes = 1ull << 30;
  uint64_t dram_max_bytes = 0;      // 0: dram_capacity_bytes
  bool dram_prefault = false;       // back the DRAM capacity's pages at Open (dram_tier.h)
  std::string ssd_dir;              // empty: data_dir/ssd
  uint64_t ssd_capacity_bytes = 0;  // 0: no SSD tier
  uint64_t ssd_max_bytes = 0;
  uint32_t ssd_slots_per_file = 256;
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  double dram_high_watermark = 0.95;
  double dram_low_watermark = 0.85;
  double ssd_high_watermark = 0.95;
  double ssd_low_watermark = 0.85;
  absl::Duration lease_ttl = absl::Seconds(10);
  // KV events kept for subscribers that resume from a sequence (SubscribeEvents.from_sequence);
  // one that falls further behind sees a gap and resyncs from the digest.
  size_t event_capacity = 65536;
  std::map<std::string, uint64_t> tenant_quota_bytes;  // absent: unlimited
  // The clock, in Unix milliseconds (tests substitute their own).
  std::function<int64_t()> now_ms;
  // Mints a transfer capability for [offset, offset + length) of the DRAM segment (write or
  // read access) valid until `expires_ms`; unset: locations carry no capability.
  std::function<std::string(uint64_t offset, uint64_t length, bool write, int64_t expires_ms)>
      issue_capability;
  // Run the lease-expiry thread (tests with a fake clock call SweepLeases() themselves).
  bool background_sweeper = true;
  // Tests: runs in every DRAM -> SSD copy (flush, drain, demotion) after the store's lock is
  // released and before the SSD writes start.
  std::function<void()> before_ssd_copy_io;
};

class BlockStore {
 public:
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(StoreOptions options);
  virtual ~BlockStore() = default;

  // Control (cache.proto). Per-item outcomes travel inside the responses; a returned error
  // means the whole call failed (bad arguments, unknown lease).
  virtual absl::Status Reserve(const v1::ReserveRequest& req, v1::ReserveResponse* resp) = 0;
  virtual absl::Status Commit(const v1::CommitRequest& req, v1::CommitResponse* resp) = 0;
  virtual absl::Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) = 0;
  virtual absl::Status Release(uint64_t lease_id) = 0;
  // New expiry per lease (0 for an unknown or expired one).
  virtual std::vector<int64_t> KeepAlive(const std::vector<uint64_t>& lease_ids) = 0;
  // Marks the held blocks among the keys used now (eviction recency only: no lease, no hit
  // counted). InvalidArgument for a malformed key (nothing touched).
  virtual absl::Status Touch(const v1::TouchRequest& req, v1::TouchResponse* resp) = 0;
  // Expires overdue leases now; returns how many expired.
  virtual size_t SweepLeases() = 0;

  // Administration (cache_admin.proto).
  virtual void GetStats(v1::GetStatsResponse* resp) = 0;
  virtual absl::Status SetTierCapacity(const v1::SetTierCapacityRequest& req,
                                       v1::SetTierCapacityResponse* resp) = 0;
  virtual absl::Status ListBlocks(const v1::ListBlocksRequest& req,
                                  v1::ListBlocksResponse* resp) = 0;
  virtual absl::Status Evict(const v1::EvictRequest& req, v1::EvictResponse* resp) = 0;
  virtual absl::Status Pin(const v1::PinRequest& req, v1::PinResponse* resp) = 0;
  virtual absl::Status Unpin(const v1::UnpinRequest& req, v1::UnpinResponse* resp) = 0;
  virtual absl::Status Flush(v1::FlushResponse* resp) = 0;
  virtual absl::Status Verify(const v1::VerifyRequest& req, v1::VerifyResponse* resp) = 0;
  virtual absl::Status Drain(const v1::DrainRequest& req, v1::DrainResponse* resp) = 0;

  // Keys resident per tier, for digests.
  virtual std::map<TierKind, std::vector<BlockKey>> ResidentKeys() = 0;

  virtual EventBus& events() = 0;
  // The DRAM arena (the segment clients write into and read from).
  virtual DramTier& dram() = 0;
  virtual const StoreOptions& options() const = 0;
  // The segment name of the DRAM arena in BlockLocation.segment.
  static constexpr char kDramSegment[] = "dram";
};

}  // namespace strata::cache
