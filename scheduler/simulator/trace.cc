#include "scheduler/simulator/trace.h"

#include <algorithm>
#include <fstream>

#include "absl/container/flat_hash_set.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler::sim {

absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("cannot open trace file ", path));
  std::vector<TraceRequest> trace;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (StripWhitespace(line).empty()) continue;
    const auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(StrCat(path, ":", line_number, ": ", why));
    };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("timestamp") || !j["timestamp"].is_number()) return bad("missing timestamp");
    if (!j.contains("input_length") || !j["input_length"].is_number_unsigned()) {
      return bad("missing input_length");
    }
    if (!j.contains("output_length") || !j["output_length"].is_number_unsigned()) {
      return bad("missing output_length");
    }
    if (!j.contains("hash_ids") || !j["hash_ids"].is_array()) return bad("missing hash_ids");
    TraceRequest r;
    r.arrival_s = j["timestamp"].get<double>() / 1000.0;
    r.input_tokens = j["input_length"].get<uint32_t>();
    r.output_tokens = j["output_length"].get<uint32_t>();
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_unsigned()) return bad("hash_ids must be non-negative integers");
      r.hash_ids.push_back(id.get<uint64_t>());
    }
    trace.push_back(std::move(r));
  }
  std::stable_sort(trace.begin(), trace.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_s < b.arrival_s;
  });
  return trace;
}

BlockKey TraceBlockKey(uint64_t hash_id) {
  BlockKey key;
  for (int i = 0; i < 8; ++i) key.bytes[i] = uint8_t(hash_id >> (8 * i));
  key.bytes[15] = 0x5a;  // never the all-zero chain root
  return key;
}

std::vector<BlockKey> FullBlockKeys(const TraceRequest& request, uint32_t block_tokens) {
  const size_t full =
      std::min<size_t>(request.hash_ids.size(), request.input_tokens / block_tokens);
  std::vector<BlockKey> keys;
  keys.reserve(full);
  for (size_t i = 0; i < full; ++i) keys.push_back(TraceBlockKey(request.hash_ids[i]));
  return keys;
}

double UnlimitedCacheHitRatio(const std::vector<TraceRequest>& trace, uint32_t block_tokens) {
  absl::flat_hash_set<uint64_t> seen;
  double hit = 0, total = 0;
  for (const TraceRequest& r : trace) {
    const size_t full = std::min<size_t>(r.hash_ids.size(), r.input_tokens / block_tokens);
    size_t prefix = 0;
    while (prefix < full && seen.contains(r.hash_ids[prefix])) ++prefix;
    hit += double(prefix) * block_tokens;
    total += r.input_tokens;
    for (size_t i = 0; i < full; ++i) seen.insert(r.hash_ids[i]);
  }
  return total > 0 ? hit / total : 0;
}

}  // namespace strata::scheduler::sim
