// What the cache server knows about one block: the value of the index's `blocks` column family.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache_service/tier.h"
#include "common/block_key.h"

namespace strata::cache {

enum class PinKind : uint8_t { kNone = 0, kTtl = 1, kHard = 2 };  // = proto v1::PinKind

struct BlockRecord {
  BlockKey key;
  BlockKey parent;  // all zero for the first block of a chain
  Namespace ns;
  std::string tenant;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // xxh3-64 of the payload
  // Residency. SSD is durable (the data was synced before the record was written); DRAM is
  // volatile and dropped when the server starts.
  std::optional<SlotId> dram_slot;
  std::optional<SlotId> ssd_slot;
  int64_t created_ms = 0;
  int64_t last_access_ms = 0;
  uint64_t hits = 0;
  PinKind pin = PinKind::kNone;
  int64_t pin_expires_ms = 0;  // kTtl only

  bool has_parent() const { return parent != BlockKey{}; }
  bool resident() const { return dram_slot.has_value() || ssd_slot.has_value(); }
  // Pinned now: hard, or TTL not yet expired at `now_ms`.
  bool pinned(int64_t now_ms) const {
    return pin == PinKind::kHard || (pin == PinKind::kTtl && pin_expires_ms > now_ms);
  }
};

// A versioned little-endian encoding (the key is not part of it: it is the RocksDB key).
std::string EncodeBlockRecord(const BlockRecord& record);
// DataLoss when `bytes` is not a record this version can read.
absl::StatusOr<BlockRecord> DecodeBlockRecord(const BlockKey& key, std::string_view bytes);

}  // namespace strata::cache
