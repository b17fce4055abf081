// strata batch: offline batch inference over an OpenAI Batch API JSONL file, through the
// gateway of `strata scheduler` (scheduler/batch/batch_runner.h has the whole behaviour).
//
//   strata batch --input in.jsonl --output out.jsonl --url http://127.0.0.1:8000
//                [--api-key K] [--concurrency 8] [--priority low|normal|high|N]
//                [--model M] [--summary-json FILE] [--progress auto|bar|lines|none]
//                [--order prefix|input]
//
// Exit codes: 0 every request succeeded; 1 some failed (listed in <output>.errors.jsonl; a rerun
// with the same arguments retries them); 2 bad arguments or input (nothing sent); 3 files or
// the endpoint could not be used; 130 interrupted (SIGINT/SIGTERM; rerun to resume).
// The first SIGINT/SIGTERM stops sending and waits for the requests in flight; a second one exits
// at once (every finished line is already on disk).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/strings.h"
#include "scheduler/batch/batch_runner.h"

namespace strata::cli {
namespace {

struct BatchFlags {
  std::string input;
  std::string output;
  std::string errors;
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string api_key_env = "OPENAI_API_KEY";
  int concurrency = 8;
  std::string priority = "low";
  std::string model;
  std::string summary_json;
  std::string progress = "auto";
  std::string order = "prefix";
  double timeout_s = 600;
  int max_attempts = 8;
  double progress_interval_s = 10;
};

std::atomic<bool> g_stop{false};
std::atomic<int> g_signals{0};

void OnSignal(int) {
  if (g_signals.fetch_add(1) == 0) {
    g_stop.store(true);
    return;
  }
  static const char kMessage[] =
      "\nstrata batch: second signal, exiting now; rerun the same command to resume\n";
  (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  _exit(130);
}

int ParsePriorityOrFail(const std::string& text) {
  if (text == "low") return scheduler::batch::kLowPriority;
  if (text == "normal") return 0;
  if (text == "high") return 10;
  const std::optional<int64_t> n = ParseInt64(text);
  if (!n.has_value() || *n < -1000 || *n > 1000) {
    Fail(2, StrCat("batch: --priority '", text,
                   "' is not low, normal, high or an integer in [-1000, 1000]"));
  }
  return static_cast<int>(*n);
}

std::string Quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t'\"$\\`!*?&;|<>()") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void Run(const BatchFlags& f) {
  scheduler::batch::BatchOptions o;
  o.input_path = f.input;
  o.output_path = f.output;
  o.errors_path = f.errors;
  o.summary_json_path = f.summary_json;
  auto endpoint = scheduler::ParseOpenAiUrl(f.url);
  if (!endpoint.ok()) Fail(2, StrCat("batch: --url: ", endpoint.status().message()));
  o.endpoint = *endpoint;
  o.endpoint.api_key = f.api_key;
  if (o.endpoint.api_key.empty() && !f.api_key_env.empty()) {
    if (const char* key = std::getenv(f.api_key_env.c_str()); key != nullptr) {
      o.endpoint.api_key = key;
    }
  }
  if (f.timeout_s <= 0) Fail(2, "batch: --timeout must be positive");
  o.endpoint.timeout = absl::Seconds(f.timeout_s);
  if (f.concurrency < 1 || f.concurrency > 4096) Fail(2, "batch: --concurrency must be 1..4096");
  o.concurrency = f.concurrency;
  o.priority = ParsePriorityOrFail(f.priority);
  o.default_model = f.model;
  if (f.max_attempts < 1) Fail(2, "batch: --max-attempts must be >= 1");
  o.max_attempts = f.max_attempts;
  o.progress_interval = absl::Seconds(f.progress_interval_s);
  if (f.order == "prefix") {
    o.order = scheduler::batch::RunOrder::kPrefix;
  } else if (f.order == "input") {
    o.order = scheduler::batch::RunOrder::kInput;
  } else {
    Fail(2, StrCat("batch: --order '", f.order, "' is not prefix or input"));
  }
  using scheduler::batch::ProgressMode;
  if (f.progress == "auto") {
    o.progress = ProgressMode::kAuto;
  } else if (f.progress == "bar") {
    o.progress = ProgressMode::kBar;
  } else if (f.progress == "lines") {
    o.progress = ProgressMode::kLines;
  } else if (f.progress == "none") {
    o.progress = ProgressMode::kNone;
  } else {
    Fail(2, StrCat("batch: --progress '", f.progress, "' is not auto, bar, lines or none"));
  }

  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  absl::StatusOr<scheduler::batch::BatchResult> result = scheduler::batch::RunBatch(o, &g_stop);
  if (!result.ok()) {
    Fail(absl::IsInvalidArgument(result.status()) ? 2 : 3,
         StrCat("batch: ", result.status().message()));
  }
  if (result->interrupted) {
    std::string command = StrCat("strata batch --input ", Quote(f.input), " --output ",
                                 Quote(f.output), " --url ", Quote(f.url));
    if (!f.errors.empty()) StrAppend(&command, " --errors ", Quote(f.errors));
    if (f.concurrency != 8) StrAppend(&command, " --concurrency ", f.concurrency);
    if (f.priority != "low") StrAppend(&command, " --priority ", Quote(f.priority));
    if (!f.model.empty()) StrAppend(&command, " --model ", Quote(f.model));
    if (f.order != "prefix") StrAppend(&command, " --order ", Quote(f.order));
    if (!f.summary_json.empty()) StrAppend(&command, " --summary-json ", Quote(f.summary_json));
    Fail(130, StrCat("batch: interrupted; finished results are in ", f.output, ". Resume with:\n  ",
                     command));
  }
  if (result->stats.failed > 0) {
    Fail(1, StrCat("batch: ", result->stats.failed, " requests failed (see ", result->errors_path,
                   "); rerun the same command to retry them"));
  }
}

}  // namespace

void RegisterBatchCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "batch",
      "Offline batch inference: OpenAI Batch API JSONL in, results out, prefix-ordered, resumable");
  auto f = std::make_shared<BatchFlags>();
  cmd->add_option("--input,-i", f->input,
                  "JSONL of {custom_id, method, url, body} (url /v1/chat/completions or "
                  "/v1/completions)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output,-o", f->output,
                  "JSONL of results; custom_ids already in it are skipped (resume)")
      ->required();
  cmd->add_option("--errors", f->errors,
                  "JSONL of failed requests (default <output>.errors.jsonl); retried on rerun");
  cmd->add_option("--url", f->url, "The OpenAI-compatible endpoint (strata scheduler's HTTP)")
      ->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "Bearer API key (default: $OPENAI_API_KEY)");
  cmd->add_option("--concurrency,-c", f->concurrency, "Requests in flight")->capture_default_str();
  cmd->add_option("--priority", f->priority,
                  "Priority for bodies without one: low (-10), normal (0), high (10) or an "
                  "integer in [-1000, 1000]")
      ->capture_default_str();
  cmd->add_option("--model", f->model, "Model for bodies without \"model\"");
  cmd->add_option("--summary-json", f->summary_json,
                  "Write totals (succeeded, failed, tokens, cache_hit_ratio, ...) as JSON here");
  cmd->add_option("--order", f->order,
                  "prefix: shared prefixes together, each group's first request before the rest; "
                  "input: the file's order")
      ->capture_default_str();
  cmd->add_option("--progress", f->progress,
                  "auto (a bar on a terminal, else lines), bar, lines or none")
      ->capture_default_str();
  cmd->add_option("--progress-interval", f->progress_interval_s,
                  "Seconds between plain progress lines")
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Seconds one attempt of a request may take")
      ->capture_default_str();
  cmd->add_option("--max-attempts", f->max_attempts,
                  "Attempts per request on 429/503/transport errors")
      ->capture_default_str();
  cmd->callback([f] { Run(*f); });
}

}  // namespace strata::cli
