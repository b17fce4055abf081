#include "cache_service/block_index.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstring>

#include "common/status.h"

namespace strata::cache {
namespace {

constexpr char kBlocksFamily[] = "blocks";
constexpr char kQuarantineFamily[] = "quarantine";

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = StrCat("rocksdb ", what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

rocksdb::Slice KeySlice(const BlockKey& key) {
  return {reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size()};
}

}  // namespace

class BlockIndex::Impl {
 public:
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::ColumnFamilyHandle* blocks = nullptr;
  rocksdb::ColumnFamilyHandle* quarantine = nullptr;
  rocksdb::ColumnFamilyHandle* default_cf = nullptr;

  ~Impl() {
    if (db) {
      for (auto* h : {blocks, quarantine, default_cf}) {
        if (h) db->DestroyColumnFamilyHandle(h);
      }
      db->Close();
    }
  }
};

BlockIndex::BlockIndex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockIndex::~BlockIndex() = default;

absl::StatusOr<std::unique_ptr<BlockIndex>> BlockIndex::Open(const std::string& path) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.max_background_jobs = 2;
  rocksdb::ColumnFamilyOptions cf_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, cf_options},
      {kBlocksFamily, cf_options},
      {kQuarantineFamily, cf_options}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(options, path, families, &handles, &db),
                            StrCat("opening index ", path)));
  auto impl = std::make_unique<Impl>();
  impl->db.reset(db);
  impl->default_cf = handles[0];
  impl->blocks = handles[1];
  impl->quarantine = handles[2];
  return std::unique_ptr<BlockIndex>(new BlockIndex(std::move(impl)));
}

absl::Status BlockIndex::Write(const Batch& batch, bool sync) {
  rocksdb::WriteBatch wb;
  for (const BlockRecord* r : batch.puts) {
    RETURN_IF_ERROR(
        FromRocks(wb.Put(impl_->blocks, KeySlice(r->key), EncodeBlockRecord(*r)), "batch put"));
  }
  for (const BlockKey& k : batch.deletes) {
    RETURN_IF_ERROR(FromRocks(wb.Delete(impl_->blocks, KeySlice(k)), "batch delete"));
  }
  for (const auto& [k, reason] : batch.quarantines) {
    RETURN_IF_ERROR(FromRocks(wb.Put(impl_->quarantine, KeySlice(k), reason), "batch put"));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(impl_->db->Write(wo, &wb), "write");
}

absl::Status BlockIndex::Put(const BlockRecord& record, bool sync) {
  Batch b;
  b.puts.push_back(&record);
  return Write(b, sync);
}

absl::Status BlockIndex::Delete(const BlockKey& key, bool sync) {
  Batch b;
  b.deletes.push_back(key);
  return Write(b, sync);
}

absl::Status BlockIndex::ForEach(
    const std::function<absl::Status(BlockRecord)>& fn,
    const std::function<void(const BlockKey&, absl::Status)>& corrupt) {
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->blocks));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::optional<BlockKey> key = BlockKey::FromBytes(it->key().ToStringView());
    if (!key.has_value()) {
      corrupt(BlockKey{}, absl::DataLossError("index key of the wrong length"));
      continue;
    }
    absl::StatusOr<BlockRecord> record =
        DecodeBlockRecord(*key, std::string_view(it->value().data(), it->value().size()));
    if (!record.ok()) {
      corrupt(*key, record.status());
      continue;
    }
    RETURN_IF_ERROR(fn(*std::move(record)));
  }
  return FromRocks(it->status(), "iterating blocks");
}

absl::StatusOr<std::vector<std::pair<BlockKey, std::string>>> BlockIndex::Quarantined() {
  std::vector<std::pair<BlockKey, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->quarantine));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::optional<BlockKey> key = BlockKey::FromBytes(it->key().ToStringView());
    if (!key.has_value()) continue;
    out.emplace_back(*key, it->value().ToString());
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "iterating quarantine"));
  return out;
}

}  // namespace strata::cache
