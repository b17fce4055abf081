// The input of `strata batch`: OpenAI Batch API lines, one JSON object per line:
//   {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
// `url` is /v1/chat/completions or /v1/completions; `method` (optional) must be POST.
//
// The whole file is validated before anything is sent: malformed JSON, a missing or empty
// custom_id, a missing body, an unsupported url or method, a streaming body, a body without
// messages / prompt (or model, unless a default model is given) and duplicate custom_ids are
// errors naming the line (the first 20 problems are listed; the count of the rest is given).
// Blank lines are ignored.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler::batch {

struct BatchRequest {
  size_t line = 0;  // 1-based line in the input file
  std::string custom_id;
  std::string url;  // "/v1/chat/completions" or "/v1/completions"
  nlohmann::json body;
  // What decides cache reuse, in order: model, cache_salt, url, then the prompt text (chat:
  // every message's role and content in order). Sorting by it puts shared prefixes together.
  std::string prompt_key;
};

struct InputOptions {
  std::string default_model;  // filled into bodies without "model"; empty: "model" is required
};

// Parses and validates JSONL text; `name` (the file name) prefixes error messages.
absl::StatusOr<std::vector<BatchRequest>> ParseBatchInput(std::string_view text,
                                                          std::string_view name,
                                                          const InputOptions& options = {});
absl::StatusOr<std::vector<BatchRequest>> ReadBatchInput(const std::string& path,
                                                         const InputOptions& options = {});

// The prompt key of a body (see BatchRequest::prompt_key); the body is assumed valid.
std::string PromptKey(std::string_view url, const nlohmann::json& body);

}  // namespace strata::scheduler::batch
