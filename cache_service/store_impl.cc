#include "cache_service/store_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "cache_service/store_internal.h"
#include "common/checksum.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

using store_internal::ToProto;

absl::StatusOr<WritePolicy> ParseWritePolicy(std::string_view name) {
  if (name == "write_through") return WritePolicy::kWriteThrough;
  if (name == "on_evict") return WritePolicy::kOnEvict;
  if (name == "never") return WritePolicy::kNever;
  return absl::InvalidArgumentError(
      StrCat("unknown write policy '", name, "' (write_through | on_evict | never)"));
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(StoreOptions options) {
  auto store = std::make_unique<StoreImpl>(std::move(options));
  RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<BlockStore>(std::move(store));
}

StoreImpl::StoreImpl(StoreOptions options)
    : options_(std::move(options)),
      events_(options_.server_id, options_.event_capacity),
      metrics_(std::make_unique<Metrics>()),
      start_ms_(absl::ToUnixMillis(absl::Now())) {
  if (!options_.now_ms) options_.now_ms = [] { return absl::ToUnixMillis(absl::Now()); };
}

StoreImpl::~StoreImpl() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
    stop_cv_.notify_all();
  }
  if (sweeper_.joinable()) sweeper_.join();
  events_.Close();
}

absl::Status StoreImpl::Init() {
  if (options_.data_dir.empty()) return absl::InvalidArgumentError("cache data_dir is empty");
  if (!(options_.dram_low_watermark <= options_.dram_high_watermark &&
        options_.dram_high_watermark <= 1.0 &&
        options_.ssd_low_watermark <= options_.ssd_high_watermark &&
        options_.ssd_high_watermark <= 1.0 && options_.dram_low_watermark >= 0 &&
        options_.ssd_low_watermark >= 0)) {
    return absl::InvalidArgumentError("watermarks must satisfy 0 <= low <= high <= 1");
  }
  ASSIGN_OR_RETURN(dram_, DramTier::Create({.slot_bytes = options_.slot_bytes,
                                            .capacity_bytes = options_.dram_capacity_bytes,
                                            .max_bytes = options_.dram_max_bytes,
                                            .name = StrCat("strata-", options_.server_id),
                                            .prefault = options_.dram_prefault}));
  if (options_.ssd_capacity_bytes > 0) {
    const std::string dir =
        options_.ssd_dir.empty() ? StrCat(options_.data_dir, "/ssd") : options_.ssd_dir;
    ASSIGN_OR_RETURN(ssd_, SsdTier::Open({.dir = dir,
                                          .slot_bytes = options_.slot_bytes,
                                          .capacity_bytes = options_.ssd_capacity_bytes,
                                          .max_bytes = options_.ssd_max_bytes,
                                          .slots_per_file = options_.ssd_slots_per_file}));
  }
  // A fresh host has no data directory yet: create it (and its parents) rather than fail.
  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir, ec);
  if (ec) {
    return ErrnoToStatus(ec.value(), StrCat("creating cache data_dir ", options_.data_dir));
  }
  ASSIGN_OR_RETURN(index_, BlockIndex::Open(StrCat(options_.data_dir, "/index")));

  // Warm restart: every record with an SSD slot comes back; DRAM residency is gone.
  BlockIndex::Batch cleanup;
  std::vector<BlockRecord> rewrite;
  size_t restored = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(index_->ForEach(
        [&](BlockRecord rec) -> absl::Status {
          rec.dram_slot.reset();
          if (!rec.ssd_slot || !ssd_ || rec.payload_bytes > options_.slot_bytes ||
              !ssd_->Claim(*rec.ssd_slot).ok()) {
            cleanup.deletes.push_back(rec.key);
            return absl::OkStatus();
          }
          tenant_bytes_[rec.tenant] += rec.payload_bytes;
          const BlockKey key = rec.key;
          blocks_[key].rec = std::move(rec);
          ++restored;
          return absl::OkStatus();
        },
        [&](const BlockKey& key, absl::Status st) {
          spdlog::warn("cache index: dropping unreadable record {}: {}", key.Hex(),
                       ToStd(st.message()));
          cleanup.deletes.push_back(key);
        }));
    UpdateGaugesLocked();
  }
  if (!cleanup.deletes.empty()) RETURN_IF_ERROR(index_->Write(cleanup, /*sync=*/true));
  spdlog::info("cache store: {} SSD blocks restored, {} volatile records dropped", restored,
               cleanup.deletes.size());
  if (options_.background_sweeper) sweeper_ = std::thread([this] { SweeperLoop(); });
  return absl::OkStatus();
}

void StoreImpl::SweeperLoop() {
  const absl::Duration period =
      std::clamp(options_.lease_ttl / 4, absl::Milliseconds(10), absl::Seconds(1));
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [&] { return stop_; })) {
    lock.unlock();
    SweepLeases();
    lock.lock();
  }
}

Tier* StoreImpl::TierOf(TierKind kind) {
  switch (kind) {
    case TierKind::kDram:
      return dram_.get();
    case TierKind::kSsd:
      return ssd_.get();
    case TierKind::kGpu:
      return nullptr;
  }
  return nullptr;
}

StoreImpl::TierCounters& StoreImpl::CountersOf(TierKind kind) {
  return kind == TierKind::kSsd ? ssd_counters_ : dram_counters_;
}

// ---------------------------------------------------------------- eviction

absl::StatusOr<SlotId> StoreImpl::AllocateLocked(TierKind kind) {
  Tier* tier = TierOf(kind);
  if (tier == nullptr) return absl::FailedPreconditionError(StrCat(TierName(kind), " tier is off"));
  absl::StatusOr<SlotId> slot = tier->Allocate();
  if (slot.ok()) return slot;
  // Full: make room down to the low watermark (at least one slot), then retry once.
  const double low =
      kind == TierKind::kSsd ? options_.ssd_low_watermark : options_.dram_low_watermark;
  const uint64_t target = static_cast<uint64_t>(std::floor(low * tier->capacity_slots()));
  const size_t want =
      std::max<size_t>(1, tier->used_slots() > target ? tier->used_slots() - target : 1);
  EvictLocked(kind, want);
  return tier->Allocate();
}

bool StoreImpl::NeedsDemotionLocked(const Entry& e) const {
  return ssd_ && options_.write_policy != WritePolicy::kNever && e.rec.dram_slot && !e.rec.ssd_slot;
}

void StoreImpl::AddBytesLocked(TierKind kind, bool in, uint64_t bytes) {
  TierCounters& c = CountersOf(kind);
  (in ? c.bytes_in : c.bytes_out) += bytes;
  metrics_->tier_bytes.Labels({std::string(TierName(kind)), in ? "in" : "out"}).Increment(bytes);
}

void StoreImpl::CountEvictionsLocked(TierKind kind, size_t n) {
  if (n == 0) return;
  CountersOf(kind).evictions += n;
  metrics_->evictions.Labels({std::string(TierName(kind))}).Increment(n);
}

void StoreImpl::ShrinkTo(std::unique_lock<std::mutex>& lock, TierKind kind, uint64_t target_used,
                         const absl::flat_hash_set<BlockKey>* keep) {
  Tier* tier = TierOf(kind);
  if (tier == nullptr || tier->used_slots() <= target_used) return;
  std::vector<BlockKey> dirty;
  EvictLocked(kind, tier->used_slots() - target_used, nullptr,
              kind == TierKind::kDram ? &dirty : nullptr, keep);
  if (dirty.empty()) return;
  const std::vector<BlockKey> moved = CopyToSsd(lock, dirty);  // unlocks for the I/O
  if (!moved.empty()) {
    v1::KvEvent ev;
    ev.set_namespace_id(std::string(blocks_[moved[0]].rec.ns.View()));
    auto* m = ev.mutable_moved();
    for (const BlockKey& k : moved) m->add_keys(std::string(k.View()));
    m->set_from_tier(v1::TIER_DRAM);
    m->set_to_tier(v1::TIER_SSD);
    events_.Publish(std::move(ev));
  }
  // The victims leave DRAM now, copied or not, unless somebody started reading or pinned them
  // while the lock was released.
  const int64_t now = NowMs();
  size_t evicted = 0;
  for (const BlockKey& k : dirty) {
    auto it = blocks_.find(k);
    if (it == blocks_.end() || !it->second.rec.dram_slot || it->second.readers > 0 ||
        it->second.move_token != 0 || it->second.rec.pinned(now)) {
      continue;
    }
    if (RemoveFromTierLocked(k, kind)) ++evicted;
  }
  CountEvictionsLocked(kind, evicted);
}

void StoreImpl::MakeRoom(std::unique_lock<std::mutex>& lock, TierKind kind, size_t need,
                         const absl::flat_hash_set<BlockKey>* keep) {
  Tier* tier = TierOf(kind);
  if (tier == nullptr) return;
  const uint64_t cap = tier->capacity_slots();
  const uint64_t used = tier->used_slots();
  if (cap >= used && cap - used >= need) return;
  const double low =
      kind == TierKind::kSsd ? options_.ssd_low_watermark : options_.dram_low_watermark;
  const uint64_t low_target = static_cast<uint64_t>(std::floor(low * cap));
  ShrinkTo(lock, kind, std::min<uint64_t>(low_target, cap > need ? cap - need : 0), keep);
}

void StoreImpl::ApplyWatermark(std::unique_lock<std::mutex>& lock, TierKind kind) {
  Tier* tier = TierOf(kind);
  if (tier == nullptr) return;
  const bool ssd = kind == TierKind::kSsd;
  const double high = ssd ? options_.ssd_high_watermark : options_.dram_high_watermark;
  const double low = ssd ? options_.ssd_low_watermark : options_.dram_low_watermark;
  const double cap = tier->capacity_slots();
  if (tier->used_slots() <= high * cap) return;
  ShrinkTo(lock, kind, static_cast<uint64_t>(std::floor(low * cap)));
}

size_t StoreImpl::EvictLocked(TierKind kind, size_t count, const std::string* tenant,
                              std::vector<BlockKey>* dirty,
                              const absl::flat_hash_set<BlockKey>* keep) {
  const int64_t now = NowMs();
  std::vector<EvictionCandidate> resident;
  for (const auto& [key, e] : blocks_) {
    const bool in_tier = tenant != nullptr        ? e.rec.tenant == *tenant
                         : kind == TierKind::kSsd ? e.rec.ssd_slot.has_value()
                                                  : e.rec.dram_slot.has_value();
    if (!in_tier || (keep != nullptr && keep->contains(key))) continue;
    // Leaving DRAM may need a copy first; only a caller that can do it outside the lock
    // (`dirty`) gets such victims.
    const bool needs_copy = tenant == nullptr && kind == TierKind::kDram && NeedsDemotionLocked(e);
    resident.push_back({.key = key,
                        .parent = e.rec.parent,
                        .last_access_ms = e.rec.last_access_ms,
                        .evictable = e.readers == 0 && e.move_token == 0 && !e.rec.pinned(now) &&
                                     (dirty != nullptr || !needs_copy)});
  }
  const std::vector<BlockKey> victims = SelectVictims(resident, count);
  size_t evicted = 0;
  for (const BlockKey& k : victims) {
    if (tenant == nullptr && kind == TierKind::kDram && NeedsDemotionLocked(blocks_[k])) {
      if (dirty != nullptr) dirty->push_back(k);
      continue;
    }
    const std::optional<TierKind> tier =
        tenant != nullptr ? std::nullopt : std::optional<TierKind>(kind);
    if (RemoveFromTierLocked(k, tier)) ++evicted;
  }
  if (tenant == nullptr) CountEvictionsLocked(kind, evicted);
  return evicted;
}

bool StoreImpl::RemoveFromTierLocked(const BlockKey& key, std::optional<TierKind> tier,
                                     bool by_operator) {
  auto it = blocks_.find(key);
  if (it == blocks_.end()) return false;
  Entry& e = it->second;
  BlockRecord after = e.rec;
  const bool drop_dram = !tier || *tier == TierKind::kDram;
  const bool drop_ssd = !tier || *tier == TierKind::kSsd;
  if (drop_dram) after.dram_slot.reset();
  if (drop_ssd) after.ssd_slot.reset();
  if (after.dram_slot == e.rec.dram_slot && after.ssd_slot == e.rec.ssd_slot) return false;
  // The index must stop naming an SSD slot before the slot can be reused: synced.
  const bool ssd_changed = after.ssd_slot != e.rec.ssd_slot;
  absl::Status st =
      after.resident() ? index_->Put(after, ssd_changed) : index_->Delete(key, ssd_changed);
  if (!st.ok()) {
    spdlog::error("cache index: evicting {}: {}", key.Hex(), ToStd(st.message()));
    return false;
  }
  if (e.rec.dram_slot && !after.dram_slot) dram_->Free(*e.rec.dram_slot);
  if (e.rec.ssd_slot && !after.ssd_slot) ssd_->Free(*e.rec.ssd_slot);
  v1::KvEvent ev;
  ev.set_namespace_id(std::string(e.rec.ns.View()));
  ev.mutable_evicted()->add_keys(std::string(key.View()));
  ev.mutable_evicted()->set_tier(after.resident() ? ToProto(tier.value_or(TierKind::kDram))
                                                  : v1::TIER_UNSPECIFIED);
  ev.mutable_evicted()->set_by_operator(by_operator);
  events_.Publish(std::move(ev));
  if (after.resident()) {
    e.rec = std::move(after);
  } else {
    ForgetBytesLocked(e.rec.tenant, e.rec.payload_bytes);
    blocks_.erase(it);
  }
  return true;
}

std::vector<BlockKey> StoreImpl::CopyToSsd(std::unique_lock<std::mutex>& lock,
                                           const std::vector<BlockKey>& keys) {
  std::vector<BlockKey> done;
  if (!ssd_) return done;
  struct Move {
    BlockKey key;
    uint64_t token;
    SlotId ssd_slot;
  };
  // 1. Under the lock: an SSD slot per block, and the block held in place and marked.
  std::vector<Move> moves;
  std::vector<SsdTier::Io> ios;
  for (const BlockKey& k : keys) {
    auto it = blocks_.find(k);
    if (it == blocks_.end()) continue;
    Entry& e = it->second;
    if (e.rec.ssd_slot || !e.rec.dram_slot || e.move_token != 0) continue;
    ++e.readers;  // not evicted, drained or dropped while its bytes are being copied
    absl::StatusOr<SlotId> slot = AllocateLocked(TierKind::kSsd);
    if (!slot.ok()) {
      --e.readers;
      break;
    }
    e.move_token = next_move_token_++;
    moves.push_back({.key = k, .token = e.move_token, .ssd_slot = *slot});
    ios.push_back({.slot = *slot,
                   .buffer = dram_->SlotSpan(*e.rec.dram_slot).data(),
                   .length = e.rec.payload_bytes});
  }
  if (moves.empty()) return done;
  // 2. The I/O, without the lock: one io_uring batch, then one fdatasync per file.
  lock.unlock();
  if (options_.before_ssd_copy_io) options_.before_ssd_copy_io();
  const std::vector<absl::Status> results = ssd_->WriteBatch(ios);
  const absl::Status synced = ssd_->Sync();
  lock.lock();
  // 3. Commit what was written to a block that is still the one marked: index first.
  std::vector<BlockRecord> records;
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    auto it = blocks_.find(m.key);
    const bool same = it != blocks_.end() && it->second.move_token == m.token;
    if (same) {
      it->second.move_token = 0;
      if (it->second.readers > 0) --it->second.readers;
    }
    const absl::Status& st = results[i].ok() ? synced : results[i];
    if (!st.ok()) {
      spdlog::warn("cache: writing block {} to ssd: {}", m.key.Hex(), ToStd(st.message()));
    }
    if (!same || !st.ok() || it->second.rec.ssd_slot) {  // failed, or quarantined meanwhile
      ssd_->Free(m.ssd_slot);
      continue;
    }
    BlockRecord rec = it->second.rec;
    rec.ssd_slot = m.ssd_slot;
    records.push_back(std::move(rec));
  }
  BlockIndex::Batch batch;
  for (const auto& r : records) batch.puts.push_back(&r);
  if (const absl::Status st = records.empty() ? absl::OkStatus() : index_->Write(batch, true);
      !st.ok()) {
    spdlog::error("cache index: recording ssd copies: {}", ToStd(st.message()));
    for (const auto& r : records) ssd_->Free(*r.ssd_slot);
    return done;
  }
  for (const auto& r : records) {
    blocks_[r.key].rec.ssd_slot = r.ssd_slot;
    AddBytesLocked(TierKind::kSsd, /*in=*/true, r.payload_bytes);
    done.push_back(r.key);
  }
  metrics_->demotions.Increment(done.size());
  return done;
}

void StoreImpl::QuarantineLocked(const BlockKey& key, const std::string& reason) {
  auto it = blocks_.find(key);
  if (it == blocks_.end()) return;
  BlockIndex::Batch batch;
  batch.deletes.push_back(key);
  batch.quarantines.emplace_back(key, reason);
  if (const absl::Status st = index_->Write(batch, /*sync=*/true); !st.ok()) {
    spdlog::error("cache index: quarantining {}: {}", key.Hex(), ToStd(st.message()));
  }
  Entry& e = it->second;
  if (e.rec.dram_slot) dram_->Free(*e.rec.dram_slot);
  if (e.rec.ssd_slot) ssd_->Free(*e.rec.ssd_slot);
  spdlog::warn("cache: quarantined block {}: {}", key.Hex(), reason);
  v1::KvEvent ev;
  ev.set_namespace_id(std::string(e.rec.ns.View()));
  ev.mutable_quarantined()->set_key(std::string(key.View()));
  ev.mutable_quarantined()->set_reason(reason);
  events_.Publish(std::move(ev));
  ForgetBytesLocked(e.rec.tenant, e.rec.payload_bytes);
  blocks_.erase(it);
  ++quarantined_;
  metrics_->quarantines.Increment();
}

void StoreImpl::ForgetBytesLocked(const std::string& tenant, uint64_t bytes) {
  auto it = tenant_bytes_.find(tenant);
  if (it == tenant_bytes_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) tenant_bytes_.erase(it);
}

// ---------------------------------------------------------------- leases

int64_t StoreImpl::CapabilityExpiryMs() const {
  // KeepAlive cannot hand out new tokens, so a token outlives the first lease period by a grace
  // of a few renewals; the lease itself still decides how long a slot stays reserved.
  return NowMs() + 6 * absl::ToInt64Milliseconds(options_.lease_ttl);
}

uint64_t StoreImpl::NewLeaseLocked(Lease lease, v1::Lease* out) {
  lease.id = next_lease_id_++;
  lease.expires_ms = NowMs() + absl::ToInt64Milliseconds(options_.lease_ttl);
  out->set_lease_id(lease.id);
  out->set_expires_unix_ms(lease.expires_ms);
  const uint64_t id = lease.id;
  leases_.emplace(id, std::move(lease));
  return id;
}

void StoreImpl::EndLeaseLocked(Lease& lease) {
  for (const Pending& p : lease.pending) {
    dram_->Free(p.dram_slot);
    pending_keys_.erase(p.key);
    ForgetBytesLocked(p.tenant, p.payload_bytes);
  }
  lease.pending.clear();
  for (const BlockKey& k : lease.readers) {
    if (auto it = blocks_.find(k); it != blocks_.end() && it->second.readers > 0) {
      --it->second.readers;
    }
  }
  lease.readers.clear();
}

absl::Status StoreImpl::Release(uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return absl::NotFoundError(StrCat("no lease ", lease_id));
  if (it->second.busy) return absl::FailedPreconditionError("lease is being committed");
  EndLeaseLocked(it->second);
  leases_.erase(it);
  return absl::OkStatus();
}

std::vector<int64_t> StoreImpl::KeepAlive(const std::vector<uint64_t>& lease_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  std::vector<int64_t> out;
  for (uint64_t id : lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.expires_ms < now) {
      out.push_back(0);
      continue;
    }
    it->second.expires_ms = now + absl::ToInt64Milliseconds(options_.lease_ttl);
    out.push_back(it->second.expires_ms);
  }
  return out;
}

absl::Status StoreImpl::Touch(const v1::TouchRequest& req, v1::TouchResponse* resp) {
  std::vector<BlockKey> keys;
  keys.reserve(req.keys_size());
  for (const std::string& bytes : req.keys()) {
    ASSIGN_OR_RETURN(BlockKey key, store_internal::ToKey(bytes));
    keys.push_back(key);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  uint32_t touched = 0;
  for (const BlockKey& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) continue;
    it->second.rec.last_access_ms = now;
    ++touched;
  }
  resp->set_touched(touched);
  return absl::OkStatus();
}

size_t StoreImpl::SweepLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowMs();
  size_t expired = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_ms < now && !it->second.busy) {
      EndLeaseLocked(it->second);
      leases_.erase(it++);
      ++expired;
    } else {
      ++it;
    }
  }
  lease_expiries_ += expired;
  metrics_->lease_expiries.Increment(expired);
  return expired;
}

void StoreImpl::UpdateGaugesLocked() {
  for (Tier* t : {static_cast<Tier*>(dram_.get()), static_cast<Tier*>(ssd_.get())}) {
    if (t == nullptr) continue;
    const std::string name(TierName(t->kind()));
    metrics_->used_bytes.Labels({name}).Set(double(t->used_slots()) * t->slot_bytes());
    metrics_->capacity_bytes.Labels({name}).Set(double(t->capacity_slots()) * t->slot_bytes());
  }
}

}  // namespace strata::cache
