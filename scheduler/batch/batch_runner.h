// RunBatch: the engine of `strata batch` — OpenAI Batch API JSONL in, results JSONL out, through
// an OpenAI-compatible HTTP endpoint (Strata's gateway).
//
//   1. Validate the whole input (batch_input.h); nothing is sent when a line is bad.
//   2. Resume: skip custom_ids already in the output (a torn last line is cut off, its request
//      runs again); requests in the errors file of an earlier run are tried again and the errors
//      file is started afresh (batch_output.h).
//   3. Order by prompt so shared prefixes run together, each group's first request before the
//      rest (batch_plan.h); `concurrency` threads, each with its own OpenAiClient.
//   4. Each request gets "priority": options.priority unless its body sets one. 429 / 502 / 503 /
//      504 replies and transport failures are retried with exponential backoff (honouring
//      Retry-After, capped at max_backoff) up to max_attempts; a request that still fails, or gets
//      another error status, is written to the errors file — never dropped.
//   5. Every result line is written (one write(2)) as soon as it completes.
//
// Interruption: when `*stop` becomes true, no new request starts and none is retried; requests in
// flight finish (each bounded by endpoint.timeout) and are written; RunBatch then returns with
// `interrupted` set. Requests not run are in neither file, so a resume picks them up.
//
// Thread safety: RunBatch may run on any thread; `stop` may be set from a signal handler.
// Failure: bad input, unreadable / unwritable files, an endpoint that cannot be reached or
// refuses the key, a model it does not serve → an error status, and no request is sent. Request
// failures are results, not errors.
#pragma once

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/batch/batch_plan.h"
#include "scheduler/batch/batch_progress.h"
#include "scheduler/client/openai_client.h"

namespace strata::scheduler::batch {

// Batch requests run below interactive traffic (the gateway's default priority is 0; negative
// priorities are background work that workers preempt first).
constexpr int kLowPriority = -10;

enum class ProgressMode { kAuto, kBar, kLines, kNone };

// kPrefix: the prefix-grouped, leader-first order of batch_plan.h. kInput: the file's order, all
// requests independent (for outputs that must follow the input, and as a baseline).
enum class RunOrder { kPrefix, kInput };

struct BatchOptions {
  std::string input_path;
  std::string output_path;
  std::string errors_path;        // empty: output_path + ".errors.jsonl"
  std::string summary_json_path;  // empty: none; else the SummaryJson object, written at the end
  OpenAiEndpoint endpoint;        // endpoint.timeout bounds each attempt
  int concurrency = 8;
  int priority = kLowPriority;  // for bodies without "priority"
  std::string default_model;    // for bodies without "model"
  int max_attempts = 8;
  absl::Duration initial_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(60);
  RunOrder order = RunOrder::kPrefix;
  size_t min_shared_prefix = kDefaultMinSharedPrefix;
  // GET /v1/models first: an unreachable endpoint, a refused key or a model the endpoint does
  // not serve fails the run before any request is sent.
  bool preflight = true;
  ProgressMode progress = ProgressMode::kAuto;           // kAuto: a bar on a terminal, else lines
  absl::Duration progress_interval = absl::Seconds(10);  // for plain lines
  FILE* progress_out = stderr;
};

struct BatchResult {
  ProgressSnapshot stats;
  bool interrupted = false;
  bool truncated_last_line = false;  // the output had a torn last line (cut off)
  std::string errors_path;
};

absl::StatusOr<BatchResult> RunBatch(const BatchOptions& options,
                                     const std::atomic<bool>* stop = nullptr);

}  // namespace strata::scheduler::batch
