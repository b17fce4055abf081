// Logging for every Strata process: spdlog, human text by default, JSON lines when asked, and the
// current request id on every line logged while a ScopedRequestId is alive on that thread.
//
//   InitLogging({.level = "info", .format = LogFormat::kJson, .component = "cache"});
//   ScopedRequestId rid(request.id());
//   spdlog::info("lookup {} keys", n);
//   // {"ts":"2026-11-29T21:00:00.123456Z","level":"info","component":"cache",
//   //  "rid":"9f3a...","msg":"lookup 12 keys"}
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace strata {

enum class LogFormat { kText, kJson };

struct LogOptions {
  std::string level = "info";  // trace | debug | info | warn | error | critical | off
  LogFormat format = LogFormat::kText;
  std::string file;       // empty: stderr
  std::string component;  // e.g. "cache", "worker", "scheduler"
};

// Replaces the default spdlog logger. InvalidArgument for an unknown level; an error if the
// file cannot be opened. Safe to call again (tests do).
absl::Status InitLogging(const LogOptions& options);

absl::Status ParseLogFormat(std::string_view name, LogFormat* out);

// Sets the request id of this thread for the scope's lifetime; restores the previous one after.
class ScopedRequestId {
 public:
  explicit ScopedRequestId(std::string_view id);
  ~ScopedRequestId();
  ScopedRequestId(const ScopedRequestId&) = delete;
  ScopedRequestId& operator=(const ScopedRequestId&) = delete;

 private:
  std::string previous_;
};

// The request id of this thread ("" when none).
std::string_view CurrentRequestId();

// A fresh random request id: 16 lower-case hex digits.
std::string NewRequestId();

}  // namespace strata
