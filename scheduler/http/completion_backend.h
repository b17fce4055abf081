// CompletionBackend: what the OpenAI gateway asks to run a request (tokenize → place → run on
// workers → stream tokens). The production backend (gRPC to the workers) comes with the workers
// issue; tests drive the gateway through a test-only backend in tests/scheduler/.
//
// Lifecycle of one request: the gateway calls Generate() once; the backend then calls the sink's
// OnText() zero or more times and OnDone() exactly once, from any thread, possibly before
// Generate() returns. After the client goes away the sink reports Cancelled() and the backend
// should stop early (it must still call OnDone()).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/types.h"

namespace strata::scheduler {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct CompletionRequest {
  std::string model;
  bool chat = true;
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  uint32_t max_tokens = 256;
  double temperature = 1.0;
  double top_p = 1.0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Tenant isolation: goes into the KV namespace (MakeNamespace's salt), so requests with
  // different salts never share cached blocks.
  std::string cache_salt;
  int priority = 0;  // higher first; negative = background (batch)
  std::string user;
};

struct CompletionUsage {
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint64_t cached_tokens = 0;
  std::array<uint64_t, kNumTiers> cached_tokens_by_tier{};  // Strata extension
};

enum class FinishReason { kStop, kLength };

class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  virtual void OnText(std::string text) = 0;
  // `status` not OK: the request failed; ResourceExhausted with a retry-after (see
  // WithRetryAfter) becomes HTTP 429 + Retry-After.
  virtual void OnDone(absl::Status status, FinishReason finish, CompletionUsage usage) = 0;
  virtual bool Cancelled() const = 0;
};

class CompletionBackend {
 public:
  virtual ~CompletionBackend() = default;
  // Model ids served (for /v1/models and request validation).
  virtual std::vector<std::string> Models() const = 0;
  virtual void Generate(const CompletionRequest& request, std::shared_ptr<CompletionSink> sink) = 0;
};

// Attaches / reads a Retry-After hint (seconds) on a status.
absl::Status WithRetryAfter(absl::Status status, double seconds);
double RetryAfterSeconds(const absl::Status& status);  // 0 when absent

}  // namespace strata::scheduler
