// Progress of a `strata batch` run: counters updated by the worker threads, and the line shown
// on stderr (a redrawn bar on a terminal, periodic plain lines otherwise, a final summary).
//
//   [##########..........] 100/200  50.0% | 3.1 req/s | 2,345 tok/s | ETA 0:32 | cache hit 93.5%
//
// tok/s counts prompt and completion tokens the run processed; the cache hit ratio is
// sum(usage.prompt_tokens_details.cached_tokens) / sum(usage.prompt_tokens).
// Thread safety: BatchStats is guarded by its own mutex; the render functions are pure.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "nlohmann/json.hpp"

namespace strata::scheduler::batch {

struct ProgressSnapshot {
  uint64_t total = 0;    // requests this run has to do (not counting those skipped on resume)
  uint64_t skipped = 0;  // already in the output
  uint64_t succeeded = 0;
  uint64_t failed = 0;
  uint64_t retries = 0;  // extra attempts (429/503/transport errors)
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t completion_tokens = 0;
  double elapsed_s = 0;

  uint64_t done() const { return succeeded + failed; }
  double hit_ratio() const {
    return prompt_tokens == 0 ? 0.0 : double(cached_tokens) / double(prompt_tokens);
  }
  double tokens_per_s() const {
    return elapsed_s <= 0 ? 0.0 : double(prompt_tokens + completion_tokens) / elapsed_s;
  }
  double requests_per_s() const { return elapsed_s <= 0 ? 0.0 : double(done()) / elapsed_s; }
  // Seconds left at the current rate; negative when unknown.
  double eta_s() const;
};

class BatchStats {
 public:
  void SetTotal(uint64_t total, uint64_t skipped);
  void AddRetry();
  // A request finished; `usage` is the reply's "usage" object (null when none or failed).
  void AddResult(bool ok, const nlohmann::json& usage);
  ProgressSnapshot Snapshot(double elapsed_s) const;

 private:
  mutable std::mutex mu_;
  ProgressSnapshot s_;  // guarded by mu_ (elapsed_s unused)
};

// One progress line. `bar`: with the [####....] bar (terminals).
std::string RenderProgress(const ProgressSnapshot& s, bool bar);
// The final summary line.
std::string RenderSummary(const ProgressSnapshot& s, bool interrupted);
// The --summary-json object.
nlohmann::json SummaryJson(const ProgressSnapshot& s, bool interrupted);

}  // namespace strata::scheduler::batch
