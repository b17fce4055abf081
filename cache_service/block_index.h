// The cache server's persistent index: RocksDB, the only file of Strata that includes it.
//
// Column families: `blocks` (16-byte block key → EncodeBlockRecord) and `quarantine` (block key →
// reason). A write with `sync` is durable when it returns (WAL fsync'ed); the store uses that for
// every record that names an SSD slot, after the slot's data was synced, so the index never points
// at garbage after a crash.
//
// Thread safety: every method may be called concurrently (RocksDB is thread-safe).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_service/block_record.h"

namespace strata::cache {

class BlockIndex {
 public:
  // Opens (creating if missing) the database in directory `path`.
  static absl::StatusOr<std::unique_ptr<BlockIndex>> Open(const std::string& path);
  ~BlockIndex();

  // One atomic batch of puts and deletes.
  struct Batch {
    std::vector<const BlockRecord*> puts;
    std::vector<BlockKey> deletes;
    std::vector<std::pair<BlockKey, std::string>> quarantines;  // key, reason
  };
  absl::Status Write(const Batch& batch, bool sync);
  absl::Status Put(const BlockRecord& record, bool sync);
  absl::Status Delete(const BlockKey& key, bool sync);

  // Calls `fn` for every record, in key order. Stops at the first error `fn` returns; a record
  // that does not decode is passed to `corrupt` (and skipped) instead.
  absl::Status ForEach(const std::function<absl::Status(BlockRecord)>& fn,
                       const std::function<void(const BlockKey&, absl::Status)>& corrupt);
  // Quarantined keys with their reasons.
  absl::StatusOr<std::vector<std::pair<BlockKey, std::string>>> Quarantined();

 private:
  class Impl;
  explicit BlockIndex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cache
