#include "scheduler/batch/batch_progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/strings.h"

namespace strata::scheduler::batch {

namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// 1234567 -> "1,234,567".
std::string Thousands(uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string Clock(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

}  // namespace

double ProgressSnapshot::eta_s() const {
  if (done() == 0 || elapsed_s <= 0) return -1;
  return double(total - std::min(total, done())) * elapsed_s / double(done());
}

void BatchStats::SetTotal(uint64_t total, uint64_t skipped) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.total = total;
  s_.skipped = skipped;
}

void BatchStats::AddRetry() {
  std::lock_guard<std::mutex> lock(mu_);
  ++s_.retries;
}

void BatchStats::AddResult(bool ok, const nlohmann::json& usage) {
  auto number = [](const nlohmann::json& j, const char* key) -> uint64_t {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return 0;
    return static_cast<uint64_t>(std::max<int64_t>(0, j[key].get<int64_t>()));
  };
  const uint64_t prompt = number(usage, "prompt_tokens");
  const uint64_t completion = number(usage, "completion_tokens");
  uint64_t cached = 0;
  if (usage.is_object() && usage.contains("prompt_tokens_details")) {
    cached = number(usage["prompt_tokens_details"], "cached_tokens");
  }
  std::lock_guard<std::mutex> lock(mu_);
  (ok ? s_.succeeded : s_.failed) += 1;
  s_.prompt_tokens += prompt;
  s_.cached_tokens += std::min(cached, prompt);
  s_.completion_tokens += completion;
}

ProgressSnapshot BatchStats::Snapshot(double elapsed_s) const {
  std::lock_guard<std::mutex> lock(mu_);
  ProgressSnapshot s = s_;
  s.elapsed_s = elapsed_s;
  return s;
}

std::string RenderProgress(const ProgressSnapshot& s, bool bar) {
  const double fraction = s.total == 0 ? 1.0 : double(s.done()) / double(s.total);
  std::string line;
  if (bar) {
    constexpr int kWidth = 24;
    const int filled = std::min(kWidth, static_cast<int>(fraction * kWidth));
    line = StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ");
  }
  StrAppend(&line, s.done(), "/", s.total, " ", Fixed(100 * fraction, 1), "% | ",
            Fixed(s.requests_per_s(), 1), " req/s | ", Thousands(uint64_t(s.tokens_per_s())),
            " tok/s | ETA ", Clock(s.eta_s()), " | cache hit ", Fixed(100 * s.hit_ratio(), 1), "%");
  if (s.failed > 0) StrAppend(&line, " | ", s.failed, " failed");
  if (s.retries > 0) StrAppend(&line, " | ", s.retries, " retries");
  return line;
}

std::string RenderSummary(const ProgressSnapshot& s, bool interrupted) {
  return StrCat(interrupted ? "batch interrupted: " : "batch done: ", s.succeeded, " succeeded, ",
                s.failed, " failed, ", s.total - std::min(s.total, s.done()), " not run, ",
                s.skipped, " skipped (already in the output) in ", Fixed(s.elapsed_s, 1), " s | ",
                Fixed(s.requests_per_s(), 2), " req/s | ", Thousands(uint64_t(s.tokens_per_s())),
                " tok/s | cache hit ratio ", Fixed(s.hit_ratio(), 3), " (",
                Thousands(s.cached_tokens), " of ", Thousands(s.prompt_tokens),
                " prompt tokens cached)");
}

nlohmann::json SummaryJson(const ProgressSnapshot& s, bool interrupted) {
  return {{"total", s.total + s.skipped},
          {"to_run", s.total},
          {"skipped", s.skipped},
          {"succeeded", s.succeeded},
          {"failed", s.failed},
          {"not_run", s.total - std::min(s.total, s.done())},
          {"retries", s.retries},
          {"interrupted", interrupted},
          {"prompt_tokens", s.prompt_tokens},
          {"cached_tokens", s.cached_tokens},
          {"completion_tokens", s.completion_tokens},
          {"cache_hit_ratio", s.hit_ratio()},
          {"elapsed_s", s.elapsed_s},
          {"tokens_per_s", s.tokens_per_s()},
          {"requests_per_s", s.requests_per_s()}};
}

}  // namespace strata::scheduler::batch
