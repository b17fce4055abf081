#include "scheduler/http/openai_protocol.h"

#include <cmath>

#include "absl/strings/cord.h"
#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler {

namespace {

using nlohmann::json;

constexpr char kRetryAfterUrl[] = "type.strata.dev/retry_after_seconds";

// Invalid UTF-8 (from clients or model output) is replaced, never thrown on.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::Status Invalid(std::string_view message) {
  return absl::InvalidArgumentError(std::string(message));
}

// Chat content: a string, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> ContentText(const json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) {
    return Invalid(StrCat("messages[", index, "].content must be a string or an array"));
  }
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Invalid(StrCat("messages[", index, "].content parts need a type"));
    }
    if (part["type"].get<std::string>() != "text") {
      return Invalid(StrCat("messages[", index, "]: only text content is supported"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Invalid(StrCat("messages[", index, "].content text part needs text"));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::StatusOr<double> NumberIn(const json& j, const char* name, double lo, double hi,
                                double fallback) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  if (!j[name].is_number()) return Invalid(StrCat("'", name, "' must be a number"));
  const double v = j[name].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Invalid(StrCat("'", name, "' must be between ", lo, " and ", hi));
  }
  return v;
}

}  // namespace

absl::Status WithRetryAfter(absl::Status status, double seconds) {
  status.SetPayload(kRetryAfterUrl, absl::Cord(StrCat(seconds)));
  return status;
}

double RetryAfterSeconds(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterUrl);
  if (!payload.has_value()) return 0;
  return ParseDouble(std::string(*payload)).value_or(0);
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, bool chat,
                                                         const RequestLimits& limits) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid("the request body is not valid JSON");
  if (!j.is_object()) return Invalid("the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) {
    return Invalid("'model' is required and must be a string");
  }
  r.model = j["model"].get<std::string>();
  if (chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      return Invalid("'messages' is required and must be a non-empty array");
    }
    if (j["messages"].size() > limits.max_messages) {
      return Invalid(StrCat("too many messages (limit ", limits.max_messages, ")"));
    }
    size_t i = 0;
    for (const json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return Invalid(StrCat("messages[", i, "] needs a string 'role'"));
      }
      ChatMessage message;
      message.role = m["role"].get<std::string>();
      if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
          message.role != "developer" && message.role != "tool") {
        return Invalid(StrCat("messages[", i, "].role '", message.role, "' is not supported"));
      }
      ASSIGN_OR_RETURN(message.content, ContentText(m.value("content", json()), i));
      r.messages.push_back(std::move(message));
      ++i;
    }
  } else {
    if (!j.contains("prompt")) return Invalid("'prompt' is required");
    const json& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else {
      return Invalid("'prompt' must be a string (or an array of one string)");
    }
  }
  const char* max_name =
      j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(max_name) && !j[max_name].is_null()) {
    if (!j[max_name].is_number_integer() || j[max_name].get<int64_t>() < 1 ||
        j[max_name].get<int64_t>() > limits.max_tokens) {
      return Invalid(
          StrCat("'", max_name, "' must be an integer between 1 and ", limits.max_tokens));
    }
    r.max_tokens = uint32_t(j[max_name].get<int64_t>());
  } else if (!chat) {
    r.max_tokens = 16;  // the completions API's default
  }
  ASSIGN_OR_RETURN(r.temperature, NumberIn(j, "temperature", 0, 2, 1));
  ASSIGN_OR_RETURN(r.top_p, NumberIn(j, "top_p", 0, 1, 1));
  if (j.contains("n") && !j["n"].is_null() &&
      (!j["n"].is_number_integer() || j["n"].get<int64_t>() != 1)) {
    return Invalid("only 'n' = 1 is supported");
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return Invalid("'stream' must be a boolean");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && j["stream_options"].is_object()) {
    const json& so = j["stream_options"];
    if (so.contains("include_usage") && so["include_usage"].is_boolean()) {
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4 &&
               std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : s) r.stop.push_back(x.get<std::string>());
    } else {
      return Invalid("'stop' must be a string or an array of up to 4 strings");
    }
  }
  if (j.contains("cache_salt") && !j["cache_salt"].is_null()) {
    if (!j["cache_salt"].is_string()) return Invalid("'cache_salt' must be a string");
    r.cache_salt = j["cache_salt"].get<std::string>();
    if (r.cache_salt.size() > limits.max_cache_salt) {
      return Invalid(StrCat("'cache_salt' is longer than ", limits.max_cache_salt, " bytes"));
    }
  }
  if (j.contains("priority") && !j["priority"].is_null()) {
    if (!j["priority"].is_number_integer() || j["priority"].get<int64_t>() < -1000 ||
        j["priority"].get<int64_t>() > 1000) {
      return Invalid("'priority' must be an integer between -1000 and 1000");
    }
    r.priority = int(j["priority"].get<int64_t>());
  }
  if (j.contains("user") && j["user"].is_string()) r.user = j["user"].get<std::string>();
  return r;
}

std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code,
                      std::string_view param) {
  json e = {{"message", std::string(message)},
            {"type", std::string(type)},
            {"param", param.empty() ? json() : json(std::string(param))},
            {"code", code.empty() ? json() : json(std::string(code))}};
  return Dump(json{{"error", e}});
}

namespace {

json UsageObject(const CompletionUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"strata",
           {{"cached_tokens_by_tier",
             {{"gpu", u.cached_tokens_by_tier[0]},
              {"dram", u.cached_tokens_by_tier[1]},
              {"ssd", u.cached_tokens_by_tier[2]}}}}}};
}

json Base(const ResponseMeta& meta, bool chunk) {
  return {{"id", meta.id},
          {"object",
           meta.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", meta.created},
          {"model", meta.model}};
}

std::string Event(const json& j) { return StrCat("data: ", Dump(j), "\n\n"); }

}  // namespace

std::string UsageJson(const CompletionUsage& usage) { return Dump(UsageObject(usage)); }

std::string FinishReasonName(FinishReason finish) {
  return finish == FinishReason::kLength ? "length" : "stop";
}

std::string CompletionResponse(const ResponseMeta& meta, std::string_view text, FinishReason finish,
                               const CompletionUsage& usage) {
  json j = Base(meta, false);
  json choice = {{"index", 0}, {"finish_reason", FinishReasonName(finish)}};
  if (meta.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", std::string(text)}};
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageObject(usage);
  return Dump(j);
}

std::string StreamTextEvent(const ResponseMeta& meta, std::string_view text, bool first) {
  json j = Base(meta, true);
  json choice = {{"index", 0}, {"finish_reason", nullptr}};
  if (meta.chat) {
    json delta = {{"content", std::string(text)}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
  }
  j["choices"] = json::array({choice});
  return Event(j);
}

std::string StreamFinalEvents(const ResponseMeta& meta, FinishReason finish,
                              const CompletionUsage* usage) {
  json j = Base(meta, true);
  json choice = {{"index", 0}, {"finish_reason", FinishReasonName(finish)}};
  if (meta.chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
    choice["logprobs"] = nullptr;
  }
  j["choices"] = json::array({choice});
  std::string out = Event(j);
  if (usage != nullptr) {
    json u = Base(meta, true);
    u["choices"] = json::array();
    u["usage"] = UsageObject(*usage);
    out += Event(u);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ModelsResponse(const std::vector<std::string>& models, int64_t created) {
  json data = json::array();
  for (const std::string& m : models) {
    data.push_back({{"id", m}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}});
  }
  return Dump(json{{"object", "list"}, {"data", data}});
}

}  // namespace strata::scheduler
