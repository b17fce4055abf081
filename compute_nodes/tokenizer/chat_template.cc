#include "compute_nodes/tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata::tokenizer {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";

// SHA-256 of the chat_template string of DeepSeek-V3's tokenizer_config.json.
constexpr std::string_view kDeepSeekV3TemplateSha256 =
    "3b8267e54b67df6500f231ffa969955cc9d26b3444a291ced4eb96ca7d3ca1ea";

}  // namespace

absl::StatusOr<std::string> RenderChat(std::span<const ChatMessage> messages,
                                       bool add_generation_prompt, std::string_view bos_token) {
  std::string system_prompt;
  bool first_system = true;
  size_t size = bos_token.size() + kAssistant.size();
  for (const ChatMessage& m : messages) {
    size += m.content.size() + kAssistant.size() + kEndOfSentence.size();
    if (m.role == "system") {
      if (!first_system) system_prompt.append("\n\n");
      system_prompt.append(m.content);
      first_system = false;
    } else if (m.role == "tool") {
      return absl::UnimplementedError("chat messages with role \"tool\" are not supported");
    } else if (m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(StrCat("unknown chat role \"", m.role, "\""));
    }
  }
  std::string out;
  out.reserve(size);
  out.append(bos_token);
  out.append(system_prompt);
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      StrAppend(&out, kUser, m.content);
    } else if (m.role == "assistant") {
      StrAppend(&out, kAssistant, m.content, kEndOfSentence);
    }
  }
  if (add_generation_prompt) out.append(kAssistant);
  return out;
}

absl::Status CheckDeepSeekV3ChatTemplate(std::string_view jinja_template) {
  const std::string digest = HexEncode(Sha256::Hash(jinja_template));
  if (digest != kDeepSeekV3TemplateSha256) {
    return absl::FailedPreconditionError(
        StrCat("chat template (sha256 ", digest,
               ") is not the DeepSeek-V3 template, the only one implemented"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("chat messages are not valid JSON");
  if (!doc.is_array()) return absl::InvalidArgumentError("chat messages must be a JSON array");
  std::vector<ChatMessage> messages;
  messages.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& m = doc[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(StrCat("message ", i, " needs a string \"role\""));
    }
    const std::string role = m["role"].get<std::string>();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return absl::UnimplementedError(StrCat("message ", i, ": tool calls are not supported"));
    }
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return absl::InvalidArgumentError(StrCat("message ", i, " has no content"));
    }
    if (!content->is_string()) {
      return absl::UnimplementedError(
          StrCat("message ", i, ": only string contents are supported"));
    }
    messages.push_back({role, content->get<std::string>()});
  }
  return messages;
}

}  // namespace strata::tokenizer
