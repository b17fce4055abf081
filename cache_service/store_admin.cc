// Administration of the block store: stats, capacity, listing, evict, pin, flush, verify, drain.
#include <algorithm>
#include <cstring>

#include "cache_service/store_impl.h"
#include "common/checksum.h"
#include "common/hex.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

void StoreImpl::FillInfo(const Entry& e, v1::BlockInfo* info) const {
  info->set_key(std::string(e.rec.key.View()));
  if (e.rec.has_parent()) info->set_parent_key(std::string(e.rec.parent.View()));
  info->set_namespace_id(std::string(e.rec.ns.View()));
  info->set_tenant(e.rec.tenant);
  if (e.rec.dram_slot) info->add_tiers(v1::TIER_DRAM);
  if (e.rec.ssd_slot) info->add_tiers(v1::TIER_SSD);
  info->set_payload_bytes(e.rec.payload_bytes);
  info->set_checksum(e.rec.checksum);
  info->set_created_unix_ms(e.rec.created_ms);
  info->set_last_access_unix_ms(e.rec.last_access_ms);
  info->set_hits(e.rec.hits);
  info->set_pin(static_cast<v1::PinKind>(e.rec.pin));
  info->set_pin_expires_unix_ms(e.rec.pin_expires_ms);
}

void StoreImpl::GetStats(v1::GetStatsResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  resp->set_server_id(options_.server_id);
  uint64_t dram_blocks = 0, ssd_blocks = 0;
  for (const auto& [k, e] : blocks_) {
    dram_blocks += e.rec.dram_slot.has_value();
    ssd_blocks += e.rec.ssd_slot.has_value();
  }
  for (Tier* t : {static_cast<Tier*>(dram_.get()), static_cast<Tier*>(ssd_.get())}) {
    if (t == nullptr) continue;
    const bool ssd = t->kind() == TierKind::kSsd;
    const TierCounters& c = CountersOf(t->kind());
    auto* ts = resp->add_tiers();
    ts->set_tier(static_cast<v1::Tier>(t->kind()));
    ts->set_capacity_bytes(uint64_t{t->capacity_slots()} * t->slot_bytes());
    ts->set_used_bytes(uint64_t{t->used_slots()} * t->slot_bytes());
    ts->set_blocks(ssd ? ssd_blocks : dram_blocks);
    ts->set_hits(c.hits);
    ts->set_misses(c.misses);
    ts->set_bytes_in(c.bytes_in);
    ts->set_bytes_out(c.bytes_out);
    ts->set_evictions(c.evictions);
    ts->set_promotions(c.promotions);
    ts->set_high_watermark(ssd ? options_.ssd_high_watermark : options_.dram_high_watermark);
    ts->set_low_watermark(ssd ? options_.ssd_low_watermark : options_.dram_low_watermark);
  }
  resp->set_blocks(blocks_.size());
  resp->set_quarantined(quarantined_);
  resp->set_active_leases(leases_.size());
  resp->set_lease_expiries(lease_expiries_);
  resp->set_uptime_ms(absl::ToUnixMillis(absl::Now()) - start_ms_);
}

absl::Status StoreImpl::SetTierCapacity(const v1::SetTierCapacityRequest& req,
                                        v1::SetTierCapacityResponse* resp) {
  const auto kind = static_cast<TierKind>(req.tier());
  std::unique_lock<std::mutex> lock(mu_);
  Tier* tier = req.tier() == v1::TIER_DRAM || req.tier() == v1::TIER_SSD ? TierOf(kind) : nullptr;
  if (tier == nullptr) {
    return absl::FailedPreconditionError(
        StrCat("tier ", v1::Tier_Name(req.tier()), " is not configured on this server"));
  }
  const uint64_t slots64 = req.capacity_bytes() / tier->slot_bytes();
  if (slots64 > tier->max_slots()) {
    return absl::InvalidArgumentError(
        StrCat("capacity ", req.capacity_bytes(), " exceeds the tier's maximum of ",
               uint64_t{tier->max_slots()} * tier->slot_bytes(), " bytes (set *_max at start)"));
  }
  const uint32_t slots = static_cast<uint32_t>(slots64);
  const uint64_t used_before = tier->used_slots();
  ShrinkTo(lock, kind, slots);  // demotions copy outside the lock
  const uint64_t evicted = used_before > tier->used_slots() ? used_before - tier->used_slots() : 0;
  if (tier->used_slots() > slots) {
    return absl::FailedPreconditionError(
        StrCat(tier->used_slots(),
               " slots stay in use (pinned or leased blocks); cannot shrink to ", slots, " slots"));
  }
  RETURN_IF_ERROR(tier->SetCapacitySlots(slots));
  UpdateGaugesLocked();
  resp->set_evicted_blocks(evicted);
  auto* ts = resp->mutable_tier();
  ts->set_tier(req.tier());
  ts->set_capacity_bytes(uint64_t{tier->capacity_slots()} * tier->slot_bytes());
  ts->set_used_bytes(uint64_t{tier->used_slots()} * tier->slot_bytes());
  return absl::OkStatus();
}

absl::Status StoreImpl::ListBlocks(const v1::ListBlocksRequest& req, v1::ListBlocksResponse* resp) {
  const uint32_t page = req.page_size() == 0 ? 100 : std::min<uint32_t>(req.page_size(), 10000);
  BlockKey after;
  const bool has_token = !req.page_token().empty();
  if (has_token) {
    ASSIGN_OR_RETURN_WITH(after, ParseBlockKey(req.page_token()), "page_token");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Entry*> matches;
  for (const auto& [k, e] : blocks_) {
    if (has_token && !(after < k)) continue;
    if (!req.namespace_id().empty() && e.rec.ns.View() != req.namespace_id()) continue;
    if (!req.tenant().empty() && e.rec.tenant != req.tenant()) continue;
    if (req.tier() == v1::TIER_DRAM && !e.rec.dram_slot) continue;
    if (req.tier() == v1::TIER_SSD && !e.rec.ssd_slot) continue;
    if (req.tier() == v1::TIER_GPU) continue;
    matches.push_back(&e);
  }
  const size_t n = std::min<size_t>(page, matches.size());
  std::partial_sort(matches.begin(), matches.begin() + n, matches.end(),
                    [](const Entry* a, const Entry* b) { return a->rec.key < b->rec.key; });
  for (size_t i = 0; i < n; ++i) FillInfo(*matches[i], resp->add_blocks());
  if (matches.size() > n) resp->set_next_page_token(matches[n - 1]->rec.key.Hex());
  return absl::OkStatus();
}

std::vector<BlockKey> StoreImpl::SelectLocked(const v1::BlockSelector& selector,
                                              uint64_t* missing) {
  std::vector<BlockKey> out;
  switch (selector.selector_case()) {
    case v1::BlockSelector::kKeys:
      for (const auto& bytes : selector.keys().keys()) {
        if (std::optional<BlockKey> key = BlockKey::FromBytes(bytes);
            key.has_value() && blocks_.contains(*key)) {
          out.push_back(*key);
        } else if (missing) {
          ++*missing;
        }
      }
      break;
    case v1::BlockSelector::kTokenPrefix: {
      const auto& tp = selector.token_prefix();
      const std::optional<Namespace> parsed = Namespace::FromBytes(tp.namespace_id());
      if (!parsed.has_value()) break;
      const Namespace& ns = *parsed;
      // The chain's blocks are keyed by the namespace's block size; find it from any block of
      // the namespace is not possible, so try the default and every power of two that fits.
      std::vector<uint32_t> tokens(tp.tokens().begin(), tp.tokens().end());
      absl::flat_hash_set<BlockKey> roots;
      for (uint32_t b = 16; b <= tokens.size(); b *= 2) {
        const auto keys = ComputeBlockKeys(ns, tokens, b);
        bool all = !keys.empty();
        for (const auto& k : keys) all = all && blocks_.contains(k);
        if (!all) continue;
        for (const auto& k : keys) out.push_back(k);
        roots.insert(keys.back());
      }
      // Every block whose chain runs through the prefix: its descendants too.
      absl::flat_hash_map<BlockKey, std::vector<BlockKey>> children;
      for (const auto& [k, e] : blocks_) {
        if (e.rec.has_parent()) children[e.rec.parent].push_back(k);
      }
      std::vector<BlockKey> stack(roots.begin(), roots.end());
      while (!stack.empty()) {
        const BlockKey k = stack.back();
        stack.pop_back();
        for (const BlockKey& c : children[k]) {
          out.push_back(c);
          stack.push_back(c);
        }
      }
      break;
    }
    case v1::BlockSelector::kTenant:
      for (const auto& [k, e] : blocks_) {
        if (e.rec.tenant == selector.tenant()) out.push_back(k);
      }
      break;
    case v1::BlockSelector::kAll:
      if (selector.all()) {
        for (const auto& [k, e] : blocks_) out.push_back(k);
      }
      break;
    case v1::BlockSelector::SELECTOR_NOT_SET:
      break;
  }
  return out;
}

absl::Status StoreImpl::Evict(const v1::EvictRequest& req, v1::EvictResponse* resp) {
  if (req.selector().selector_case() == v1::BlockSelector::SELECTOR_NOT_SET) {
    return absl::InvalidArgumentError("evict needs a selector (keys, token prefix, tenant, all)");
  }
  std::optional<TierKind> tier;
  if (req.tier() == v1::TIER_DRAM) tier = TierKind::kDram;
  if (req.tier() == v1::TIER_SSD) tier = TierKind::kSsd;
  if (req.tier() == v1::TIER_GPU) return absl::FailedPreconditionError("no GPU tier");
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  for (const BlockKey& k : SelectLocked(req.selector(), nullptr)) {
    auto it = blocks_.find(k);
    if (it == blocks_.end()) continue;
    const Entry& e = it->second;
    if ((e.rec.pinned(now) && !req.include_pinned()) || e.readers > 0) {
      resp->set_skipped_pinned(resp->skipped_pinned() + 1);
      continue;
    }
    const uint64_t bytes = e.rec.payload_bytes;
    if (RemoveFromTierLocked(k, tier, /*by_operator=*/true)) {
      resp->set_evicted_blocks(resp->evicted_blocks() + 1);
      resp->set_freed_bytes(resp->freed_bytes() + bytes);
    }
  }
  UpdateGaugesLocked();
  return absl::OkStatus();
}

absl::Status StoreImpl::Pin(const v1::PinRequest& req, v1::PinResponse* resp) {
  if (req.selector().selector_case() == v1::BlockSelector::SELECTOR_NOT_SET) {
    return absl::InvalidArgumentError("pin needs a selector");
  }
  if (req.kind() == v1::PIN_NONE) return absl::InvalidArgumentError("pin kind is PIN_NONE");
  if (req.kind() == v1::PIN_TTL && req.ttl_seconds() == 0) {
    return absl::InvalidArgumentError("a TTL pin needs ttl_seconds > 0");
  }
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t missing = 0;
  const std::vector<BlockKey> keys = SelectLocked(req.selector(), &missing);
  std::vector<BlockRecord> records;
  for (const BlockKey& k : keys) {
    BlockRecord rec = blocks_[k].rec;
    rec.pin = static_cast<PinKind>(req.kind());
    rec.pin_expires_ms =
        req.kind() == v1::PIN_TTL ? NowMs() + int64_t{req.ttl_seconds()} * 1000 : 0;
    records.push_back(std::move(rec));
  }
  BlockIndex::Batch batch;
  for (const auto& r : records) batch.puts.push_back(&r);
  RETURN_IF_ERROR_WITH(index_->Write(batch, /*sync=*/true), "recording pins");
  for (auto& r : records) blocks_[r.key].rec = std::move(r);
  resp->set_pinned_blocks(records.size());
  resp->set_missing_blocks(missing);
  return absl::OkStatus();
}

absl::Status StoreImpl::Unpin(const v1::UnpinRequest& req, v1::UnpinResponse* resp) {
  if (req.selector().selector_case() == v1::BlockSelector::SELECTOR_NOT_SET) {
    return absl::InvalidArgumentError("unpin needs a selector");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockRecord> records;
  for (const BlockKey& k : SelectLocked(req.selector(), nullptr)) {
    BlockRecord rec = blocks_[k].rec;
    if (rec.pin == PinKind::kNone) continue;
    rec.pin = PinKind::kNone;
    rec.pin_expires_ms = 0;
    records.push_back(std::move(rec));
  }
  BlockIndex::Batch batch;
  for (const auto& r : records) batch.puts.push_back(&r);
  RETURN_IF_ERROR_WITH(index_->Write(batch, /*sync=*/true), "recording unpins");
  for (auto& r : records) blocks_[r.key].rec = std::move(r);
  resp->set_unpinned_blocks(records.size());
  return absl::OkStatus();
}

absl::Status StoreImpl::Flush(v1::FlushResponse* resp) {
  if (!ssd_) return absl::FailedPreconditionError("no SSD tier to flush to");
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<BlockKey> dram_only;
  for (const auto& [k, e] : blocks_) {
    if (e.rec.dram_slot && !e.rec.ssd_slot) dram_only.push_back(k);
  }
  const std::vector<BlockKey> done = CopyToSsd(lock, dram_only);  // unlocks for the I/O
  uint64_t bytes = 0;
  for (const BlockKey& k : done) bytes += blocks_[k].rec.payload_bytes;
  resp->set_flushed_blocks(done.size());
  resp->set_flushed_bytes(bytes);
  UpdateGaugesLocked();
  if (done.size() < dram_only.size()) {
    return absl::ResourceExhaustedError(StrCat("flushed ", done.size(), " of ", dram_only.size(),
                                               " blocks; the SSD tier has no more room"));
  }
  return absl::OkStatus();
}

absl::Status StoreImpl::Verify(const v1::VerifyRequest& req, v1::VerifyResponse* resp) {
  struct Check {
    BlockKey key;
    TierKind tier;
    SlotId slot;
    uint64_t length;
    uint64_t checksum;
  };
  std::vector<Check> checks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, e] : blocks_) {
      if (req.max_blocks() != 0 && checks.size() >= req.max_blocks()) break;
      bool any = false;
      if (e.rec.dram_slot && req.tier() != v1::TIER_SSD) {
        checks.push_back(
            {k, TierKind::kDram, *e.rec.dram_slot, e.rec.payload_bytes, e.rec.checksum});
        any = true;
      }
      if (e.rec.ssd_slot && req.tier() != v1::TIER_DRAM) {
        checks.push_back({k, TierKind::kSsd, *e.rec.ssd_slot, e.rec.payload_bytes, e.rec.checksum});
        any = true;
      }
      if (any) ++e.readers;  // held in place while checked
    }
  }
  std::vector<std::string> reasons(checks.size());
  std::vector<std::byte> buffer(options_.slot_bytes);
  for (size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    if (c.tier == TierKind::kDram) {
      if (Checksum64(dram_->SlotSpan(c.slot).data(), c.length) != c.checksum) {
        reasons[i] = "dram payload checksum mismatch";
      }
      continue;
    }
    const SsdTier::Io io{.slot = c.slot, .buffer = buffer.data(), .length = c.length};
    const absl::Status st = ssd_->ReadBatch({&io, 1})[0];
    if (!st.ok()) {
      reasons[i] = std::string(ToStd(st.message()));
    } else if (Checksum64(buffer.data(), c.length) != c.checksum) {
      reasons[i] = "ssd payload checksum mismatch";
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::flat_hash_set<BlockKey> released;
  for (const Check& c : checks) {
    if (!released.insert(c.key).second) continue;
    if (auto it = blocks_.find(c.key); it != blocks_.end() && it->second.readers > 0) {
      --it->second.readers;
    }
  }
  absl::flat_hash_set<BlockKey> checked;
  for (size_t i = 0; i < checks.size(); ++i) {
    checked.insert(checks[i].key);
    if (reasons[i].empty() || !blocks_.contains(checks[i].key)) continue;
    QuarantineLocked(checks[i].key, StrCat("verify: ", reasons[i]));
    resp->set_corrupt_blocks(resp->corrupt_blocks() + 1);
    resp->add_quarantined_keys(std::string(checks[i].key.View()));
  }
  resp->set_checked_blocks(checked.size());
  UpdateGaugesLocked();
  return absl::OkStatus();
}

absl::Status StoreImpl::Drain(const v1::DrainRequest& req, v1::DrainResponse* resp) {
  if (!req.target_address().empty()) {
    return absl::UnimplementedError(
        "drain to another cache server needs the transfer engine; drain to local SSD instead");
  }
  if (!ssd_) return absl::FailedPreconditionError("no SSD tier to drain to");
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<BlockKey> dram_only;
  std::vector<BlockKey> in_dram;
  for (const auto& [k, e] : blocks_) {
    if (!e.rec.dram_slot) continue;
    in_dram.push_back(k);
    if (!e.rec.ssd_slot) dram_only.push_back(k);
  }
  const std::vector<BlockKey> copied = CopyToSsd(lock, dram_only);  // unlocks for the I/O
  for (const BlockKey& k : in_dram) {
    auto it = blocks_.find(k);
    if (it == blocks_.end()) continue;
    const uint64_t bytes = it->second.rec.payload_bytes;
    // Only blocks safely on SSD leave DRAM; blocks being read stay until released.
    if (!it->second.rec.ssd_slot || it->second.readers > 0 ||
        !RemoveFromTierLocked(k, TierKind::kDram)) {
      resp->set_failed_blocks(resp->failed_blocks() + 1);
      continue;
    }
    resp->set_moved_blocks(resp->moved_blocks() + 1);
    resp->set_moved_bytes(resp->moved_bytes() + bytes);
  }
  UpdateGaugesLocked();
  return absl::OkStatus();
}

std::map<TierKind, std::vector<BlockKey>> StoreImpl::ResidentKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<TierKind, std::vector<BlockKey>> out;
  for (const auto& [k, e] : blocks_) {
    if (e.rec.dram_slot) out[TierKind::kDram].push_back(k);
    if (e.rec.ssd_slot) out[TierKind::kSsd].push_back(k);
  }
  return out;
}

}  // namespace strata::cache
