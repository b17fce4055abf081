// KvEventSink: applies proto KV events (proto/strata/v1/events.proto) from cache servers and
// workers to the PrefixIndex.
//
// Each source's events carry a sequence number increasing by one. A gap means events were lost:
// the sink marks the source out of sync (its state in the index may be stale) until the next
// complete digest replaces it. A node may be fed by several sources (a worker: its cache
// server's stream and its own, for its resident blocks); each has its own sequence, keyed by
// event.source(), and an eviction from "every tier" (TIER_UNSPECIFIED) means every tier that
// source has named, not the other sources' copies. Malformed events (bad key sizes, unknown tiers)
// are rejected with InvalidArgument and change nothing.
//
// Thread safety: safe to call concurrently (the index locks; the sequence map has its own mutex).
#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "scheduler/prefix_index.h"
#include "strata/v1/events.pb.h"

namespace strata::scheduler {

class KvEventSink {
 public:
  explicit KvEventSink(PrefixIndex* index) : index_(index) {}

  // `node` is the registry index of event.source().
  absl::Status Apply(NodeIndex node, const v1::KvEvent& event);

  // True when a sequence gap was seen for a source of `node` and no complete digest from that
  // source has arrived since.
  bool OutOfSync(NodeIndex node) const;

 private:
  struct SourceState {
    uint64_t last_sequence = 0;
    bool seen = false;
    bool out_of_sync = false;
    uint32_t tiers = 0;  // bit t: the source has named CacheTier t (its "every tier")
  };

  PrefixIndex* index_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::pair<NodeIndex, std::string>, SourceState> sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::scheduler
