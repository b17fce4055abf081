// libFuzzer target for the OpenAI request parser (scheduler/http/openai_protocol.h).
// With clang: built as scheduler_openai_request_fuzzer (-fsanitize=fuzzer). With any compiler:
// linked into scheduler_openai_request_fuzz_replay_test, which replays the corpus in
// tests/scheduler/fuzz_corpus/ plus deterministic mutations of it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/strings.h"
#include "scheduler/http/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::scheduler;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(body, chat);
    if (!request.ok()) {
      // Every rejection is a client error with a message.
      if (!absl::IsInvalidArgument(request.status()) || request.status().message().empty()) {
        std::abort();
      }
      (void)ErrorBody(strata::ToStd(request.status().message()), "invalid_request_error", "");
      continue;
    }
    if (request->model.empty() || request->max_tokens == 0) std::abort();
    if (chat && request->messages.empty()) std::abort();
    // Responses built from parsed (possibly invalid UTF-8) input must not throw.
    ResponseMeta meta{"id", request->model, 0, chat};
    CompletionUsage usage;
    (void)CompletionResponse(meta, request->prompt, FinishReason::kStop, usage);
    (void)StreamTextEvent(meta, request->cache_salt, true);
    (void)StreamFinalEvents(meta, FinishReason::kLength, &usage);
  }
  return 0;
}
