#include "scheduler/batch/batch_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "scheduler/batch/batch_input.h"
#include "scheduler/batch/batch_output.h"

namespace strata::scheduler::batch {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

enum class Outcome { kSucceeded, kFailed, kNotRun };

struct Shared {
  Shared(const BatchOptions& o, const std::vector<BatchRequest>& r, const std::atomic<bool>* s,
         BatchQueue& q, BatchStats& st, JsonlAppender& out, JsonlAppender& err, std::string prefix)
      : options(o),
        requests(r),
        stop(s),
        queue(q),
        stats(st),
        output(out),
        errors(err),
        id_prefix(std::move(prefix)) {}

  const BatchOptions& options;
  const std::vector<BatchRequest>& requests;
  const std::atomic<bool>* stop;
  BatchQueue& queue;
  BatchStats& stats;
  JsonlAppender& output;
  JsonlAppender& errors;
  std::string id_prefix;
  std::atomic<uint64_t> next_id{0};
  std::mutex error_mu;
  absl::Status write_error;  // the first failed write; guarded by error_mu
  std::atomic<bool> aborted{false};

  bool Stopping() const {
    return aborted.load() || (stop != nullptr && stop->load(std::memory_order_relaxed));
  }
};

std::string ErrorCodeOf(int status, const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("code") && j["error"]["code"].is_string()) {
    return j["error"]["code"].get<std::string>();
  }
  return StrCat("http_", status);
}

bool RetryableHttp(int status) {
  return status == 429 || status == 502 || status == 503 || status == 504;
}

// Sleeps `d`, waking early (false) when the run is stopping.
bool SleepUnlessStopping(const Shared& shared, absl::Duration d) {
  const auto until = Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  while (Clock::now() < until) {
    if (shared.Stopping()) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
  }
  return !shared.Stopping();
}

void RecordWriteError(Shared& shared, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(shared.error_mu);
  if (shared.write_error.ok()) shared.write_error = status;
  shared.aborted = true;
  shared.queue.Close();
}

Outcome RunOne(Shared& shared, OpenAiClient& client, std::mt19937& rng, const BatchRequest& r) {
  const BatchOptions& o = shared.options;
  json body = r.body;
  if (!body.contains("priority")) body["priority"] = o.priority;
  const std::string id = StrCat(shared.id_prefix, shared.next_id.fetch_add(1));
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<HttpReply> reply = client.Post(r.url, body);
    bool retryable = false;
    double retry_after_s = 0;
    int status_code = 0;
    std::string reply_body, code, message;
    if (!reply.ok()) {
      retryable = absl::IsUnavailable(reply.status()) || absl::IsDeadlineExceeded(reply.status());
      code = absl::IsDeadlineExceeded(reply.status()) ? "timeout" : "unavailable";
      message = std::string(ToStd(reply.status().message()));
    } else if (reply->status == 200) {
      json parsed = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) {
        const absl::Status written = shared.output.Append(SuccessLine(id, r.custom_id, parsed));
        if (!written.ok()) {
          RecordWriteError(shared, written);
          return Outcome::kNotRun;
        }
        shared.stats.AddResult(true, parsed.is_object() ? parsed.value("usage", json()) : json());
        return Outcome::kSucceeded;
      }
      status_code = 200;
      reply_body = reply->body;
      code = "invalid_response";
      message = "the reply body is not JSON";
    } else {
      status_code = reply->status;
      reply_body = reply->body;
      retryable = RetryableHttp(reply->status);
      retry_after_s = ParseDouble(reply->retry_after).value_or(0);
      code = ErrorCodeOf(reply->status, reply->body);
      message = std::string(ToStd(StatusFromHttp(*reply).message()));
    }
    if (retryable && attempt < o.max_attempts && !shared.Stopping()) {
      // Exponential backoff with jitter, at least the server's Retry-After, at most max_backoff.
      const double backoff_s =
          absl::ToDoubleSeconds(o.initial_backoff) * std::ldexp(1.0, attempt - 1);
      std::uniform_real_distribution<double> jitter(0.8, 1.2);
      double delay_s = std::max(retry_after_s, backoff_s * jitter(rng));
      delay_s = std::min(delay_s, absl::ToDoubleSeconds(o.max_backoff));
      shared.stats.AddRetry();
      if (SleepUnlessStopping(shared, absl::Seconds(delay_s))) continue;
    }
    if (retryable && shared.Stopping()) return Outcome::kNotRun;  // a resume tries it again
    if (attempt > 1) StrAppend(&message, " (after ", attempt, " attempts)");
    const absl::Status written =
        shared.errors.Append(ErrorLine(id, r.custom_id, status_code, reply_body, code, message));
    if (!written.ok()) {
      RecordWriteError(shared, written);
      return Outcome::kNotRun;
    }
    shared.stats.AddResult(false, json());
    return Outcome::kFailed;
  }
}

void Worker(Shared& shared, uint32_t seed) {
  OpenAiClient client(shared.options.endpoint);
  std::mt19937 rng(seed);
  while (!shared.Stopping()) {
    std::optional<size_t> index = shared.queue.Next();
    if (!index.has_value()) break;
    RunOne(shared, client, rng, shared.requests[*index]);
    shared.queue.Done(*index);
  }
}

size_t CountLines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) n += StripWhitespace(line).empty() ? 0 : 1;
  return n;
}

absl::Status WriteSummary(const std::string& path, const json& summary) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary.dump(2) << "\n";
    if (!out) return absl::UnavailableError(StrCat("writing ", tmp, " failed"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(StrCat("renaming ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

// Before anything is sent: the endpoint answers, accepts the key, and serves every model the
// input names.
absl::Status Preflight(const BatchOptions& options, const std::vector<BatchRequest>& requests) {
  OpenAiClient client(options.endpoint);
  ASSIGN_OR_RETURN_WITH(const HttpReply reply, client.Get("/v1/models"),
                        "GET /v1/models (nothing was sent)");
  if (const absl::Status s = StatusFromHttp(reply); !s.ok()) {
    return Annotate(s, StrCat("GET /v1/models on http://", options.endpoint.host, ":",
                              options.endpoint.port, "; nothing was sent"));
  }
  const json models = json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array()) {
    return absl::OkStatus();  // not a list we understand: let the requests find out
  }
  std::vector<std::string> served;
  for (const json& m : models["data"]) {
    if (m.is_object() && m.contains("id") && m["id"].is_string()) {
      served.push_back(m["id"].get<std::string>());
    }
  }
  std::vector<std::string> problems;
  size_t num_problems = 0;
  for (const BatchRequest& r : requests) {
    const std::string model = r.body.value("model", std::string());
    if (std::find(served.begin(), served.end(), model) != served.end()) continue;
    if (++num_problems <= 20) {
      problems.push_back(
          StrCat(options.input_path, ":", r.line, ": model '", model, "' is not served"));
    }
  }
  if (num_problems == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(num_problems,
                                           " requests name a model the endpoint "
                                           "does not serve (it serves: ",
                                           StrJoin(served, ", "), "); nothing was sent:\n  ",
                                           StrJoin(problems, "\n  ")));
}

}  // namespace

absl::StatusOr<BatchResult> RunBatch(const BatchOptions& options, const std::atomic<bool>* stop) {
  if (options.concurrency < 1) return absl::InvalidArgumentError("concurrency must be >= 1");
  if (options.max_attempts < 1) return absl::InvalidArgumentError("max_attempts must be >= 1");
  if (options.output_path.empty()) return absl::InvalidArgumentError("no output path");
  BatchResult result;
  result.errors_path =
      options.errors_path.empty() ? options.output_path + ".errors.jsonl" : options.errors_path;
  std::error_code ec;
  if (std::filesystem::exists(options.output_path, ec) &&
      std::filesystem::equivalent(options.input_path, options.output_path, ec)) {
    return absl::InvalidArgumentError("the output file is the input file");
  }
  InputOptions input_options;
  input_options.default_model = options.default_model;
  ASSIGN_OR_RETURN(const std::vector<BatchRequest> requests,
                   ReadBatchInput(options.input_path, input_options));
  if (options.preflight) RETURN_IF_ERROR(Preflight(options, requests));
  ASSIGN_OR_RETURN(const ResumeState resume, LoadOutput(options.output_path));
  result.truncated_last_line = resume.truncated_last_line;
  FILE* log = options.progress_out;
  const bool show = options.progress != ProgressMode::kNone && log != nullptr;
  if (show && resume.truncated_last_line) {
    std::fprintf(log, "batch: cut a torn last line off %s (its request runs again)\n",
                 options.output_path.c_str());
  }
  const size_t failed_before = CountLines(result.errors_path);

  std::vector<size_t> todo;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!resume.done.contains(requests[i].custom_id)) todo.push_back(i);
  }
  JsonlAppender output, errors;
  RETURN_IF_ERROR(output.Open(options.output_path, /*truncate=*/false));
  RETURN_IF_ERROR(errors.Open(result.errors_path, /*truncate=*/true));
  if (show && (resume.lines > 0 || failed_before > 0)) {
    std::fprintf(log,
                 "batch: resuming: %zu of %zu requests already in %s; retrying %zu that failed "
                 "before\n",
                 requests.size() - todo.size(), requests.size(), options.output_path.c_str(),
                 failed_before);
  }

  std::vector<BatchGroup> groups;
  if (options.order == RunOrder::kPrefix) {
    groups = PlanGroups(requests, todo, options.min_shared_prefix);
  } else {
    for (size_t index : todo) groups.push_back(BatchGroup{index, {}});
  }
  BatchQueue queue(std::move(groups));
  BatchStats stats;
  stats.SetTotal(todo.size(), requests.size() - todo.size());
  std::random_device seed_source;
  const uint32_t seed = seed_source();
  Shared shared(options, requests, stop, queue, stats, output, errors,
                StrCat("batch_req_", std::to_string(seed), "_"));

  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const size_t num_workers = std::min<size_t>(size_t(options.concurrency), todo.size());
  std::atomic<size_t> running{num_workers};
  std::vector<std::thread> workers;
  for (size_t i = 0; i < num_workers; ++i) {
    workers.emplace_back([&, i] {
      Worker(shared, seed + uint32_t(i));
      --running;
    });
  }

  const bool bar =
      options.progress == ProgressMode::kBar ||
      (options.progress == ProgressMode::kAuto && log != nullptr && isatty(fileno(log)) == 1);
  const auto interval = bar ? std::chrono::milliseconds(200)
                            : std::chrono::milliseconds(std::max<int64_t>(
                                  1, absl::ToInt64Milliseconds(options.progress_interval)));
  auto next_report = Clock::now() + interval;
  bool stop_noticed = false;
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!stop_noticed && stop != nullptr && stop->load()) {
      stop_noticed = true;
      queue.Close();
      if (show) {
        std::fprintf(log, "%sbatch: stopping: no new requests; waiting for those in flight\n",
                     bar ? "\n" : "");
      }
    }
    if (show && Clock::now() >= next_report) {
      next_report = Clock::now() + interval;
      const std::string line = RenderProgress(stats.Snapshot(elapsed()), bar);
      if (bar) {
        std::fprintf(log, "\r%s\x1b[K", line.c_str());
      } else {
        std::fprintf(log, "batch: %s\n", line.c_str());
      }
      std::fflush(log);
    }
  }
  for (std::thread& t : workers) t.join();
  {
    std::lock_guard<std::mutex> lock(shared.error_mu);
    if (!shared.write_error.ok()) return shared.write_error;
  }
  result.stats = stats.Snapshot(elapsed());
  result.interrupted = result.stats.done() < result.stats.total;
  if (show) {
    if (bar) std::fprintf(log, "\r%s\x1b[K\n", RenderProgress(result.stats, true).c_str());
    std::fprintf(log, "%s\n", RenderSummary(result.stats, result.interrupted).c_str());
    if (result.stats.failed > 0) {
      std::fprintf(log, "batch: %llu failed requests are in %s (a rerun retries them)\n",
                   static_cast<unsigned long long>(result.stats.failed),
                   result.errors_path.c_str());
    }
    std::fflush(log);
  }
  if (!options.summary_json_path.empty()) {
    json summary = SummaryJson(result.stats, result.interrupted);
    summary["output"] = options.output_path;
    summary["errors"] = result.errors_path;
    RETURN_IF_ERROR(WriteSummary(options.summary_json_path, summary));
  }
  return result;
}

}  // namespace strata::scheduler::batch
