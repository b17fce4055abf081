#include "scheduler/kv_events.h"

#include <vector>

#include "common/status.h"
#include "common/strings.h"

namespace strata::scheduler {

namespace {

absl::Status ParseKeys(const google::protobuf::RepeatedPtrField<std::string>& raw,
                       std::vector<BlockKey>& keys) {
  keys.clear();
  keys.reserve(raw.size());
  for (const std::string& bytes : raw) {
    std::optional<BlockKey> key = BlockKey::FromBytes(bytes);
    if (!key.has_value()) {
      return absl::InvalidArgumentError(
          StrCat("block key of ", bytes.size(), " bytes (expected ", sizeof(BlockKey), ")"));
    }
    keys.push_back(*key);
  }
  return absl::OkStatus();
}

absl::StatusOr<CacheTier> RequireTier(int proto_tier, std::string_view what) {
  std::optional<CacheTier> tier = TierFromProto(proto_tier);
  if (!tier.has_value()) {
    return absl::InvalidArgumentError(StrCat(what, ": unknown or unspecified tier ", proto_tier));
  }
  return *tier;
}

}  // namespace

absl::Status KvEventSink::Apply(NodeIndex node, const v1::KvEvent& event) {
  // Parsed and checked first: a malformed event changes nothing.
  std::vector<BlockKey> keys;
  std::optional<CacheTier> tier, to;  // to: a move's destination
  switch (event.event_case()) {
    case v1::KvEvent::kStored: {
      RETURN_IF_ERROR_WITH(ParseKeys(event.stored().keys(), keys), "stored event");
      ASSIGN_OR_RETURN(tier, RequireTier(static_cast<int>(event.stored().tier()), "stored event"));
      break;
    }
    case v1::KvEvent::kMoved: {
      RETURN_IF_ERROR_WITH(ParseKeys(event.moved().keys(), keys), "moved event");
      ASSIGN_OR_RETURN(tier,
                       RequireTier(static_cast<int>(event.moved().from_tier()), "moved event"));
      ASSIGN_OR_RETURN(to, RequireTier(static_cast<int>(event.moved().to_tier()), "moved event"));
      break;
    }
    case v1::KvEvent::kEvicted: {
      RETURN_IF_ERROR_WITH(ParseKeys(event.evicted().keys(), keys), "evicted event");
      // TIER_UNSPECIFIED means every tier of the source.
      tier = TierFromProto(event.evicted().tier());
      if (!tier.has_value() && event.evicted().tier() != v1::TIER_UNSPECIFIED) {
        return absl::InvalidArgumentError(
            StrCat("evicted event: unknown tier ", static_cast<int>(event.evicted().tier())));
      }
      break;
    }
    case v1::KvEvent::kQuarantined: {
      google::protobuf::RepeatedPtrField<std::string> one;
      *one.Add() = event.quarantined().key();
      RETURN_IF_ERROR_WITH(ParseKeys(one, keys), "quarantined event");
      break;
    }
    case v1::KvEvent::kDigest: {
      RETURN_IF_ERROR_WITH(ParseKeys(event.digest().keys(), keys), "digest page");
      ASSIGN_OR_RETURN(tier, RequireTier(static_cast<int>(event.digest().tier()), "digest page"));
      break;
    }
    case v1::KvEvent::EVENT_NOT_SET:
      return absl::InvalidArgumentError("KV event without a payload");
  }

  // The source's state, in one update: the tiers it has named and its sequence (a complete
  // digest brings it back in sync).
  uint32_t named = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    SourceState& s = sources_[{node, event.source()}];
    for (const std::optional<CacheTier>& t : {tier, to}) {
      if (t.has_value()) s.tiers |= 1u << static_cast<uint32_t>(*t);
    }
    named = s.tiers;
    if (event.has_digest() && event.digest().last_page()) {
      s.out_of_sync = false;
    } else if (s.seen && event.sequence() != s.last_sequence + 1) {
      s.out_of_sync = true;
    }
    s.seen = true;
    s.last_sequence = event.sequence();
  }

  switch (event.event_case()) {
    case v1::KvEvent::kStored:
      index_->Stored(node, *tier, keys);
      break;
    case v1::KvEvent::kMoved:
      index_->Moved(node, *tier, *to, keys);
      break;
    case v1::KvEvent::kEvicted:
      if (tier.has_value() || named == 0) {
        index_->Evicted(node, tier, keys);
      } else {
        for (int t = 0; t < kNumTiers; ++t) {
          if (named >> t & 1) index_->Evicted(node, static_cast<CacheTier>(t), keys);
        }
      }
      break;
    case v1::KvEvent::kQuarantined:
      index_->Quarantined(keys.front());
      break;
    case v1::KvEvent::kDigest:
      index_->DigestPage(node, event.source(), event.digest().digest_id(), *tier, keys,
                         event.digest().last_page());
      break;
    case v1::KvEvent::EVENT_NOT_SET:
      break;
  }
  return absl::OkStatus();
}

bool KvEventSink::OutOfSync(NodeIndex node) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, state] : sources_) {
    if (id.first == node && state.out_of_sync) return true;
  }
  return false;
}

}  // namespace strata::scheduler
