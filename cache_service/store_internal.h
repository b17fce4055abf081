// Internal to the block store's implementation files (store_impl.cc, store_write.cc,
// store_read.cc): its metrics and the conversions from request fields.
#pragma once

#include <cstring>
#include <string>

#include "cache_service/store_impl.h"
#include "common/metrics.h"
#include "common/strings.h"

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

namespace store_internal {

inline absl::StatusOr<BlockKey> ToKey(const std::string& bytes) {
  std::optional<BlockKey> key = BlockKey::FromBytes(bytes);
  if (!key.has_value()) {
    return absl::InvalidArgumentError(StrCat("block key of ", bytes.size(), " bytes, want 16"));
  }
  return *key;
}

inline absl::StatusOr<Namespace> ToNamespace(const std::string& bytes) {
  std::optional<Namespace> ns = Namespace::FromBytes(bytes);
  if (!ns.has_value()) {
    return absl::InvalidArgumentError(StrCat("namespace of ", bytes.size(), " bytes, want 32"));
  }
  return *ns;
}

inline void SetItem(v1::ItemStatus* item, const absl::Status& st) {
  item->set_code(static_cast<int>(st.code()));
  item->set_message(std::string(ToStd(st.message())));
}

inline v1::Tier ToProto(TierKind kind) { return static_cast<v1::Tier>(kind); }

}  // namespace store_internal
}  // namespace strata::cache
