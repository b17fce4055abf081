// The block store's write path: Reserve (slots + lease) and Commit (checksum, index, events).
#include <algorithm>
#include <cstring>

#include "cache_service/store_impl.h"
#include "cache_service/store_internal.h"
#include "common/checksum.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

using store_internal::SetItem;
using store_internal::ToKey;
using store_internal::ToNamespace;

// ---------------------------------------------------------------- write path

absl::Status StoreImpl::Reserve(const v1::ReserveRequest& req, v1::ReserveResponse* resp) {
  ASSIGN_OR_RETURN(const Namespace ns, ToNamespace(req.namespace_id()));
  if (req.blocks().empty()) return absl::InvalidArgumentError("Reserve with no blocks");
  std::vector<std::pair<BlockKey, BlockKey>> keys;
  for (const auto& b : req.blocks()) {
    ASSIGN_OR_RETURN(const BlockKey key, ToKey(b.key()));
    BlockKey parent;
    if (!b.parent_key().empty()) {
      ASSIGN_OR_RETURN(parent, ToKey(b.parent_key()));
    }
    if (b.payload_bytes() == 0 || b.payload_bytes() > options_.slot_bytes) {
      return absl::InvalidArgumentError(
          StrCat("payload of ", b.payload_bytes(), " bytes; slots hold 1..", options_.slot_bytes));
    }
    keys.emplace_back(key, parent);
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Room for the whole batch first (demotions copy outside the lock); the loop below then only
  // takes free slots or evicts blocks that need no I/O.
  MakeRoom(lock, TierKind::kDram, keys.size());
  Lease lease;
  lease.write = true;
  const auto quota = options_.tenant_quota_bytes.find(req.tenant());
  for (int i = 0; i < req.blocks_size(); ++i) {
    const auto& [key, parent] = keys[i];
    const uint64_t bytes = req.blocks(i).payload_bytes();
    auto* slot = resp->add_slots();
    if (auto it = blocks_.find(key); it != blocks_.end()) {
      SetItem(slot->mutable_status(),
              it->second.rec.ns == ns
                  ? absl::AlreadyExistsError("block is present")
                  : absl::FailedPreconditionError("key is taken in another namespace"));
      continue;
    }
    if (pending_keys_.contains(key)) {
      SetItem(slot->mutable_status(), absl::AlreadyExistsError("block is being written"));
      continue;
    }
    if (quota != options_.tenant_quota_bytes.end()) {
      // Over quota: the tenant's own least recently used chains make room, nobody else's.
      while (tenant_bytes_[req.tenant()] + bytes > quota->second &&
             EvictLocked(TierKind::kDram, 1, &req.tenant()) > 0) {
      }
      if (tenant_bytes_[req.tenant()] + bytes > quota->second) {
        SetItem(slot->mutable_status(),
                absl::ResourceExhaustedError(StrCat("tenant '", req.tenant(), "' quota of ",
                                                    quota->second, " bytes is used up")));
        continue;
      }
    }
    absl::StatusOr<SlotId> dram_slot = AllocateLocked(TierKind::kDram);
    if (!dram_slot.ok()) {
      SetItem(slot->mutable_status(), dram_slot.status());
      continue;
    }
    lease.pending.push_back({.key = key,
                             .parent = parent,
                             .ns = ns,
                             .tenant = req.tenant(),
                             .payload_bytes = bytes,
                             .dram_slot = *dram_slot});
    pending_keys_.insert(key);
    tenant_bytes_[req.tenant()] += bytes;
    SetItem(slot->mutable_status(), absl::OkStatus());
    auto* loc = slot->mutable_location();
    loc->set_key(std::string(key.View()));
    loc->set_tier(v1::TIER_DRAM);
    loc->set_segment(kDramSegment);
    loc->set_offset(dram_->SlotOffset(*dram_slot));
    loc->set_length(bytes);
    if (options_.issue_capability) {
      loc->set_capability(
          options_.issue_capability(loc->offset(), bytes, /*write=*/true, CapabilityExpiryMs()));
    }
  }
  if (!lease.pending.empty()) NewLeaseLocked(std::move(lease), resp->mutable_lease());
  UpdateGaugesLocked();
  return absl::OkStatus();
}

absl::Status StoreImpl::Commit(const v1::CommitRequest& req, v1::CommitResponse* resp) {
  // 1. Claim the lease and pair each committed key with its reserved slot.
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leases_.find(req.lease_id());
    if (it == leases_.end() || !it->second.write) {
      return absl::NotFoundError(StrCat("no write lease ", req.lease_id(), " (expired?)"));
    }
    if (it->second.busy) return absl::FailedPreconditionError("lease is already committing");
    it->second.busy = true;
    pending = it->second.pending;
  }
  const int n = req.blocks_size();
  std::vector<absl::Status> results(n);
  std::vector<std::optional<size_t>> slot_of(n);  // index into `pending`
  std::vector<bool> used(pending.size(), false);
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<BlockKey> key = ToKey(req.blocks(i).key());
    if (!key.ok()) {
      results[i] = key.status();
      continue;
    }
    size_t p = 0;
    while (p < pending.size() && (pending[p].key != *key || used[p])) ++p;
    if (p == pending.size()) {
      results[i] = absl::NotFoundError("block is not part of this lease");
      continue;
    }
    used[p] = true;
    slot_of[i] = p;
    // 2. Verify what the client wrote (outside the lock: the slot belongs to the busy lease).
    const uint64_t actual =
        Checksum64(dram_->SlotSpan(pending[p].dram_slot).data(), pending[p].payload_bytes);
    if (actual != req.blocks(i).checksum()) {
      results[i] = absl::DataLossError(StrCat("checksum mismatch: stored bytes hash to ", actual,
                                              ", commit says ", req.blocks(i).checksum()));
    }
  }
  // 3. Write through to SSD: data written and synced before any index entry names it.
  std::vector<std::optional<SlotId>> ssd_slots(pending.size());
  const bool write_through = ssd_ && options_.write_policy == WritePolicy::kWriteThrough;
  if (write_through) {
    std::vector<SsdTier::Io> ios;
    std::vector<size_t> io_pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < n; ++i) {
        if (!results[i].ok()) continue;
        const size_t p = *slot_of[i];
        absl::StatusOr<SlotId> slot = AllocateLocked(TierKind::kSsd);
        if (!slot.ok()) continue;  // stays DRAM-only: not durable
        ios.push_back({.slot = *slot,
                       .buffer = dram_->SlotSpan(pending[p].dram_slot).data(),
                       .length = pending[p].payload_bytes});
        io_pending.push_back(p);
      }
    }
    if (!ios.empty()) {
      const std::vector<absl::Status> written = ssd_->WriteBatch(ios);
      const absl::Status synced = ssd_->Sync();
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t j = 0; j < ios.size(); ++j) {
        if (written[j].ok() && synced.ok()) {
          ssd_slots[io_pending[j]] = ios[j].slot;
        } else {
          spdlog::warn("cache: write-through of {} failed: {}", pending[io_pending[j]].key.Hex(),
                       ToStd((written[j].ok() ? synced : written[j]).message()));
          ssd_->Free(ios[j].slot);
        }
      }
    }
  }
  // 4. Index, then memory, then events.
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  std::vector<BlockRecord> records;
  for (int i = 0; i < n; ++i) {
    if (!results[i].ok()) continue;
    const Pending& pd = pending[*slot_of[i]];
    BlockRecord rec;
    rec.key = pd.key;
    rec.parent = pd.parent;
    rec.ns = pd.ns;
    rec.tenant = pd.tenant;
    rec.payload_bytes = pd.payload_bytes;
    rec.checksum = req.blocks(i).checksum();
    rec.dram_slot = pd.dram_slot;
    rec.ssd_slot = ssd_slots[*slot_of[i]];
    rec.created_ms = now;
    rec.last_access_ms = now;
    records.push_back(std::move(rec));
  }
  BlockIndex::Batch batch;
  bool any_ssd = false;
  for (const auto& r : records) {
    batch.puts.push_back(&r);
    any_ssd |= r.ssd_slot.has_value();
  }
  const absl::Status indexed = records.empty() ? absl::OkStatus() : index_->Write(batch, any_ssd);
  bool durable = write_through && !records.empty();
  if (indexed.ok() && !records.empty()) {
    v1::KvEvent dram_ev, ssd_ev;
    for (const auto& r : records) {
      const std::string parent = r.has_parent() ? std::string(r.parent.View()) : "";
      dram_ev.mutable_stored()->add_keys(std::string(r.key.View()));
      dram_ev.mutable_stored()->add_parent_keys(parent);
      AddBytesLocked(TierKind::kDram, /*in=*/true, r.payload_bytes);
      if (r.ssd_slot) {
        ssd_ev.mutable_stored()->add_keys(std::string(r.key.View()));
        ssd_ev.mutable_stored()->add_parent_keys(parent);
        AddBytesLocked(TierKind::kSsd, /*in=*/true, r.payload_bytes);
      } else {
        durable = false;
      }
    }
    dram_ev.set_namespace_id(std::string(records[0].ns.View()));
    dram_ev.mutable_stored()->set_tier(v1::TIER_DRAM);
    events_.Publish(std::move(dram_ev));
    if (ssd_ev.stored().keys_size() > 0) {
      ssd_ev.set_namespace_id(std::string(records[0].ns.View()));
      ssd_ev.mutable_stored()->set_tier(v1::TIER_SSD);
      events_.Publish(std::move(ssd_ev));
    }
  } else if (!indexed.ok()) {
    spdlog::error("cache index: commit: {}", ToStd(indexed.message()));
    durable = false;
    for (const auto& r : records) {
      if (r.ssd_slot) ssd_->Free(*r.ssd_slot);
    }
  }
  std::vector<bool> committed(pending.size(), false);
  for (int i = 0; i < n; ++i) {
    if (results[i].ok() && !indexed.ok()) results[i] = indexed;
    if (results[i].ok()) committed[*slot_of[i]] = true;
    SetItem(resp->add_results(), results[i]);
  }
  if (indexed.ok()) {
    for (auto& r : records) {
      pending_keys_.erase(r.key);
      const BlockKey key = r.key;
      blocks_[key].rec = std::move(r);
    }
  }
  // The lease ends: slots of blocks not committed go back.
  if (auto it = leases_.find(req.lease_id()); it != leases_.end()) {
    std::vector<Pending> rest;
    for (size_t p = 0; p < it->second.pending.size(); ++p) {
      if (!committed[p]) rest.push_back(it->second.pending[p]);
    }
    it->second.pending = std::move(rest);
    EndLeaseLocked(it->second);
    leases_.erase(it);
  }
  resp->set_durable(durable);
  ApplyWatermark(lock, TierKind::kSsd);
  UpdateGaugesLocked();
  return absl::OkStatus();
}

}  // namespace strata::cache
