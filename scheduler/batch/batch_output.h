// The output side of `strata batch`: resuming from an existing output file and appending result
// lines (OpenAI Batch API output format):
//   {"id": "batch_req_...", "custom_id": "...",
//    "response": {"status_code": 200, "request_id": "cmpl-...", "body": {...}}, "error": null}
//
// Successes go to the output file; requests that finally failed go to the errors file
// (`<output>.errors.jsonl` by default) with "error": {"code", "message"} and, when the server
// answered, its "response". On resume the output's custom_ids are skipped and every failed
// request is tried again (the errors file is started afresh), so a resumed run ends with each
// custom_id in the output at most once and nothing dropped.
//
// Crash safety: each line is one write(2) on an O_APPEND file descriptor, so a crash leaves at
// most a torn last line; LoadOutput() cuts such a line off (a torn line in the middle of the
// file, which this writer cannot produce, is an error rather than silently dropped).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler::batch {

struct ResumeState {
  absl::flat_hash_set<std::string> done;  // custom_ids already in the output
  size_t lines = 0;                       // complete lines kept
  bool truncated_last_line = false;       // a torn last line was cut off
};

// Reads `path` (a missing file is an empty state) and cuts a torn last line off the file.
absl::StatusOr<ResumeState> LoadOutput(const std::string& path);

// Appends whole lines to a file; thread-safe (one write(2) per line, O_APPEND).
class JsonlAppender {
 public:
  JsonlAppender() = default;
  ~JsonlAppender();
  JsonlAppender(const JsonlAppender&) = delete;
  JsonlAppender& operator=(const JsonlAppender&) = delete;

  // Opens for appending (created if missing); `truncate` starts the file afresh.
  absl::Status Open(const std::string& path, bool truncate);
  absl::Status Append(const nlohmann::json& line);
  const std::string& path() const { return path_; }
  size_t lines_written() const { return lines_written_; }

 private:
  int fd_ = -1;
  std::string path_;
  std::atomic<size_t> lines_written_{0};
};

// The output line of a request that got a 200 reply (`body`: the parsed reply).
nlohmann::json SuccessLine(const std::string& id, const std::string& custom_id,
                           const nlohmann::json& body);
// The errors-file line of a request that failed: `status_code` 0 when no HTTP reply came.
nlohmann::json ErrorLine(const std::string& id, const std::string& custom_id, int status_code,
                         const std::string& reply_body, const std::string& code,
                         const std::string& message);

}  // namespace strata::scheduler::batch
