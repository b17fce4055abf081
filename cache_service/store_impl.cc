#include "cache_service/store_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/checksum.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

struct StoreImpl::Metrics {
  MetricFamily<Counter>& hits;
  MetricFamily<Counter>& misses;
  MetricFamily<Counter>& evictions;
  Counter& promotions;
  Counter& demotions;
  Counter& quarantines;
  Counter& lease_expiries;
  MetricFamily<Counter>& tier_bytes;
  MetricFamily<Gauge>& used_bytes;
  MetricFamily<Gauge>& capacity_bytes;
  MetricFamily<Gauge>& blocks;

  Metrics()
      : hits(MetricsRegistry::Default().AddCounter("strata_cache_hits_total",
                                                   "Blocks found by Lookup, per tier", {"tier"})),
        misses(MetricsRegistry::Default().AddCounter(
            "strata_cache_misses_total",
            "Lookup misses: per tier (dram: not in DRAM; ssd: in no tier, counted once per "
            "Lookup as dram is) and tier=all (keys asked for and not found)",
            {"tier"})),
        evictions(MetricsRegistry::Default().AddCounter(
            "strata_cache_evictions_total", "Blocks that left a tier to make room", {"tier"})),
        promotions(MetricsRegistry::Default()
                       .AddCounter("strata_cache_promotions_total", "SSD hits copied to DRAM")
                       .Labels({})),
        demotions(MetricsRegistry::Default()
                      .AddCounter("strata_cache_demotions_total",
                                  "DRAM blocks written to SSD on eviction, flush or drain")
                      .Labels({})),
        quarantines(MetricsRegistry::Default()
                        .AddCounter("strata_cache_quarantined_total",
                                    "Blocks whose stored bytes failed their checksum")
                        .Labels({})),
        lease_expiries(MetricsRegistry::Default()
                           .AddCounter("strata_cache_lease_expiries_total",
                                       "Leases that expired without Release")
                           .Labels({})),
        tier_bytes(MetricsRegistry::Default().AddCounter(
            "strata_cache_tier_bytes_total",
            "Payload bytes into a tier (committed, demoted, promoted) and out of it (handed to "
            "readers, promoted from SSD)",
            {"tier", "direction"})),
        used_bytes(MetricsRegistry::Default().AddGauge("strata_cache_tier_used_bytes",
                                                       "Bytes of slots in use", {"tier"})),
        capacity_bytes(MetricsRegistry::Default().AddGauge("strata_cache_tier_capacity_bytes",
                                                           "Configured tier capacity", {"tier"})),
        blocks(MetricsRegistry::Default().AddGauge("strata_cache_tier_blocks",
                                                   "Blocks resident per tier", {"tier"})) {}
};

namespace {

absl::StatusOr<BlockKey> ToKey(const std::string& bytes) {
  BlockKey key;
  if (bytes.size() != key.bytes.size()) {
    return absl::InvalidArgumentError(StrCat("block key of ", bytes.size(), " bytes, want 16"));
  }
  std::memcpy(key.bytes.data(), bytes.data(), bytes.size());
  return key;
}

absl::StatusOr<Namespace> ToNamespace(const std::string& bytes) {
  Namespace ns;
  if (bytes.size() != ns.bytes.size()) {
    return absl::InvalidArgumentError(StrCat("namespace of ", bytes.size(), " bytes, want 32"));
  }
  std::memcpy(ns.bytes.data(), bytes.data(), bytes.size());
  return ns;
}

void SetItem(v1::ItemStatus* item, const absl::Status& st) {
  item->set_code(static_cast<int>(st.code()));
  item->set_message(std::string(ToStd(st.message())));
}

v1::Tier ToProto(TierKind kind) { return static_cast<v1::Tier>(kind); }

}  // namespace

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
      events_(options_.server_id),
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

bool StoreImpl::RemoveFromTierLocked(const BlockKey& key, std::optional<TierKind> tier) {
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

void StoreImpl::UpdateGaugesLocked() {
  for (Tier* t : {static_cast<Tier*>(dram_.get()), static_cast<Tier*>(ssd_.get())}) {
    if (t == nullptr) continue;
    const std::string name(TierName(t->kind()));
    metrics_->used_bytes.Labels({name}).Set(double(t->used_slots()) * t->slot_bytes());
    metrics_->capacity_bytes.Labels({name}).Set(double(t->capacity_slots()) * t->slot_bytes());
  }
}

}  // namespace strata::cache
