// The block store's read path: Lookup (longest present prefix, promotion of SSD hits, leases).
#include <algorithm>
#include <cstring>

#include "cache_service/store_impl.h"
#include "cache_service/store_internal.h"
#include "common/checksum.h"
#include "common/status.h"

namespace strata::cache {

using store_internal::ToKey;
using store_internal::ToNamespace;

// ---------------------------------------------------------------- read path

absl::Status StoreImpl::Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) {
  ASSIGN_OR_RETURN(const Namespace ns, ToNamespace(req.namespace_id()));
  std::vector<BlockKey> keys;
  for (const auto& k : req.keys()) {
    ASSIGN_OR_RETURN(const BlockKey key, ToKey(k));
    keys.push_back(key);
  }
  const bool need_data = req.promote() || req.lease();
  struct Promotion {
    size_t index;
    SlotId dram_slot;
    SlotId ssd_slot;
    uint64_t length;
    uint64_t checksum;
  };
  std::vector<Promotion> promotions;
  size_t hits = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (need_data) {
      // SSD hits of the present prefix need DRAM slots: make room before taking any (demotions
      // copy outside the lock), so the loop below never waits on I/O.
      size_t to_promote = 0;
      absl::flat_hash_set<BlockKey> prefix;
      for (const BlockKey& k : keys) {
        auto it = blocks_.find(k);
        if (it == blocks_.end() || it->second.rec.ns != ns) break;
        to_promote += !it->second.rec.dram_slot;
        prefix.insert(k);
      }
      // The blocks asked for are not the ones to make room with.
      if (to_promote > 0) MakeRoom(lock, TierKind::kDram, to_promote, &prefix);
    }
    const int64_t now = NowMs();
    for (; hits < keys.size(); ++hits) {
      auto it = blocks_.find(keys[hits]);
      // Another namespace's block is a miss, never an answer.
      if (it == blocks_.end() || it->second.rec.ns != ns) break;
      Entry& e = it->second;
      if (!e.rec.dram_slot && need_data) {
        ++e.readers;  // keeps it (and its SSD slot) in place while the DRAM tier makes room
        absl::StatusOr<SlotId> slot = AllocateLocked(TierKind::kDram);
        if (!slot.ok()) {
          --e.readers;
          break;
        }
        promotions.push_back({hits, *slot, *e.rec.ssd_slot, e.rec.payload_bytes, e.rec.checksum});
      } else {
        ++e.readers;
      }
      e.rec.last_access_ms = now;
      ++e.rec.hits;
    }
    uint64_t dram_hits = 0, dram_misses = 0, ssd_hits = 0, ssd_misses = 0;
    for (size_t i = 0; i < hits; ++i) {
      const bool in_dram = blocks_[keys[i]].rec.dram_slot.has_value();
      dram_hits += in_dram;
      dram_misses += !in_dram;
      ssd_hits += !in_dram;
    }
    if (hits < keys.size()) {
      ++dram_misses;
      if (ssd_) ++ssd_misses;
    }
    dram_counters_.hits += dram_hits;
    dram_counters_.misses += dram_misses;
    ssd_counters_.hits += ssd_hits;
    ssd_counters_.misses += ssd_misses;
    metrics_->hits.Labels({"dram"}).Increment(dram_hits);
    metrics_->misses.Labels({"dram"}).Increment(dram_misses);
    if (ssd_) {
      metrics_->hits.Labels({"ssd"}).Increment(ssd_hits);
      metrics_->misses.Labels({"ssd"}).Increment(ssd_misses);
    }
  }
  std::vector<bool> from_ssd(hits, false);
  for (const auto& p : promotions) from_ssd[p.index] = true;
  // Promote SSD hits: one batched read straight into the arena slots, every checksum verified.
  size_t valid = hits;
  std::vector<bool> promoted_ok(promotions.size(), false);
  if (!promotions.empty()) {
    std::vector<SsdTier::Io> ios;
    for (const auto& p : promotions) {
      ios.push_back(
          {.slot = p.ssd_slot, .buffer = dram_->SlotSpan(p.dram_slot).data(), .length = p.length});
    }
    // Each block is verified as soon as its read completes, while the rest are still in flight,
    // and all of it outside the store lock.
    std::vector<std::string> reasons(promotions.size());
    ssd_->ReadBatch(ios, [&](size_t j, const absl::Status& st) {
      const Promotion& p = promotions[j];
      if (!st.ok()) {
        reasons[j] = std::string(ToStd(st.message()));
      } else if (Checksum64(dram_->SlotSpan(p.dram_slot).data(), p.length) != p.checksum) {
        reasons[j] = "ssd payload checksum mismatch";
      }
    });
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t j = 0; j < promotions.size(); ++j) {
      const Promotion& p = promotions[j];
      const std::string& reason = reasons[j];
      auto eit = blocks_.find(keys[p.index]);
      if (eit == blocks_.end()) {  // quarantined meanwhile by a scrub
        dram_->Free(p.dram_slot);
        valid = std::min(valid, p.index);
        continue;
      }
      Entry& e = eit->second;
      if (!reason.empty()) {
        dram_->Free(p.dram_slot);
        QuarantineLocked(keys[p.index], reason);
        valid = std::min(valid, p.index);
        continue;
      }
      if (e.rec.dram_slot) {
        dram_->Free(p.dram_slot);  // promoted meanwhile by another reader
      } else {
        e.rec.dram_slot = p.dram_slot;
        ++ssd_counters_.promotions;
        AddBytesLocked(TierKind::kSsd, /*in=*/false, p.length);
        AddBytesLocked(TierKind::kDram, /*in=*/true, p.length);
        metrics_->promotions.Increment();
        v1::KvEvent ev;
        ev.set_namespace_id(std::string(ns.View()));
        ev.mutable_stored()->add_keys(std::string(keys[p.index].View()));
        ev.mutable_stored()->add_parent_keys(e.rec.has_parent() ? std::string(e.rec.parent.View())
                                                                : "");
        ev.mutable_stored()->set_tier(v1::TIER_DRAM);
        events_.Publish(std::move(ev));
      }
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  Lease lease;
  for (size_t i = 0; i < hits; ++i) {
    auto it = blocks_.find(keys[i]);
    if (it == blocks_.end()) continue;  // quarantined above
    Entry& e = it->second;
    if (i >= valid || !(req.lease() && valid > 0)) {
      if (e.readers > 0) --e.readers;
    } else {
      lease.readers.push_back(keys[i]);
    }
    if (i >= valid) continue;
    auto* loc = resp->add_locations();
    loc->set_key(std::string(keys[i].View()));
    loc->set_length(e.rec.payload_bytes);
    loc->set_checksum(e.rec.checksum);
    if (e.rec.dram_slot) {
      loc->set_tier(v1::TIER_DRAM);
      loc->set_segment(kDramSegment);
      loc->set_offset(dram_->SlotOffset(*e.rec.dram_slot));
      AddBytesLocked(TierKind::kDram, /*in=*/false, e.rec.payload_bytes);
      if (options_.issue_capability) {
        loc->set_capability(options_.issue_capability(loc->offset(), e.rec.payload_bytes,
                                                      /*write=*/false, CapabilityExpiryMs()));
      }
    } else {
      loc->set_tier(v1::TIER_SSD);
      loc->set_segment("ssd");
      loc->set_offset(uint64_t{*e.rec.ssd_slot} * options_.slot_bytes);
    }
    loc->set_found_in(from_ssd[i] ? v1::TIER_SSD : loc->tier());
  }
  resp->set_hit_blocks(static_cast<uint32_t>(resp->locations_size()));
  metrics_->hits.Labels({"all"}).Increment(resp->hit_blocks());
  metrics_->misses.Labels({"all"}).Increment(keys.size() - resp->hit_blocks());
  if (!lease.readers.empty()) NewLeaseLocked(std::move(lease), resp->mutable_lease());
  ApplyWatermark(lock, TierKind::kDram);
  UpdateGaugesLocked();
  return absl::OkStatus();
}

}  // namespace strata::cache
