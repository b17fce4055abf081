// The OpenAI wire format: parsing /v1/chat/completions and /v1/completions request bodies, and
// building responses, stream chunks and error bodies. Pure functions, no I/O (fuzzed by
// tests/scheduler/openai_request_fuzz.cc).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler/http/completion_backend.h"

namespace strata::scheduler {

struct RequestLimits {
  uint32_t max_tokens = 32768;
  size_t max_messages = 4096;
  size_t max_cache_salt = 256;
};

// InvalidArgument with an OpenAI-style message for malformed or out-of-range fields.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, bool chat,
                                                         const RequestLimits& limits = {});

// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code,
                      std::string_view param = "");

struct ResponseMeta {
  std::string id;
  std::string model;
  int64_t created = 0;
  bool chat = true;
};

std::string UsageJson(const CompletionUsage& usage);
std::string FinishReasonName(FinishReason finish);
// The whole non-streaming response.
std::string CompletionResponse(const ResponseMeta& meta, std::string_view text, FinishReason finish,
                               const CompletionUsage& usage);
// One SSE event ("data: {...}\n\n") carrying `text` (first: the chat role delta too).
std::string StreamTextEvent(const ResponseMeta& meta, std::string_view text, bool first);
// The final chunk with the finish reason, then (if `usage`) the usage chunk, then [DONE].
std::string StreamFinalEvents(const ResponseMeta& meta, FinishReason finish,
                              const CompletionUsage* usage);
std::string ModelsResponse(const std::vector<std::string>& models, int64_t created);

}  // namespace strata::scheduler
