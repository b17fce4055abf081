// The DeepSeek-V3 chat template, rendered in C++ (no Jinja engine).
//
// tokenizer_config.json's Jinja template, for the messages Strata supports, comes down to:
//
//   bos_token + S + for each message:  user       -> "<｜User｜>" + content
//                                      assistant  -> "<｜Assistant｜>" + content + eos_token
//                                      system     -> nothing here (part of S)
//   + (add_generation_prompt ? "<｜Assistant｜>" : "")
//
// where S is the contents of all system messages, wherever they are, joined by "\n\n". The
// eos token is written literally as "<｜end▁of▁sentence｜>" by the template.
//
// Not supported (kUnimplemented): tool calls (assistant messages with tool_calls / null
// content) and tool results (role "tool"), whose rendering depends on state this renderer does
// not model. Other roles are kInvalidArgument (Jinja would silently drop them). Contents must
// be strings (OpenAI-style arrays of parts are kUnimplemented in ParseChatMessages).
//
// The rendered text is tokenized with add_special_tokens = false (it already holds the BOS), as
// transformers' apply_chat_template does. Thread-safe (no state).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

inline constexpr std::string_view kDeepSeekV3Bos = "<｜begin▁of▁sentence｜>";

// Renders `messages` with the DeepSeek-V3 template; `bos_token` is tokenizer_config.json's.
absl::StatusOr<std::string> RenderChat(std::span<const ChatMessage> messages,
                                       bool add_generation_prompt,
                                       std::string_view bos_token = kDeepSeekV3Bos);

// OK if `jinja_template` (tokenizer_config.json's chat_template) is the DeepSeek-V3 template
// RenderChat implements; FailedPrecondition otherwise (another template would render
// differently, so callers must not use RenderChat for it).
absl::Status CheckDeepSeekV3ChatTemplate(std::string_view jinja_template);

// Parses OpenAI-style messages: a JSON array of {"role": ..., "content": "..."}. Tool calls,
// tool messages and non-string contents are kUnimplemented; other malformed input
// kInvalidArgument.
absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json);

}  // namespace strata::tokenizer
