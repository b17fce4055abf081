#include "scheduler/batch/batch_input.h"

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "common/strings.h"

namespace strata::scheduler::batch {

namespace {

using nlohmann::json;

constexpr size_t kMaxListedProblems = 20;
constexpr std::string_view kChat = "/v1/chat/completions";
constexpr std::string_view kCompletions = "/v1/completions";

// Separators that do not occur in ordinary text keep "ab"+"c" and "a"+"bc" apart.
constexpr char kFieldSep = '\x1f';
constexpr char kRecordSep = '\x1e';

void AppendContent(std::string& out, const json& content) {
  if (content.is_string()) {
    out += content.get<std::string>();
  } else if (content.is_array()) {
    for (const json& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) {
        out += part["text"].get<std::string>();
      }
    }
  }
}

// Why a line is not a valid request ("" when it is).
std::string Problem(const json& j, const InputOptions& options) {
  if (!j.is_object()) return "not a JSON object";
  if (!j.contains("custom_id") || !j["custom_id"].is_string() ||
      j["custom_id"].get<std::string>().empty()) {
    return "'custom_id' is missing or not a non-empty string";
  }
  if (j.contains("method") && !(j["method"].is_string() && j["method"] == "POST")) {
    return "'method' must be \"POST\"";
  }
  if (!j.contains("url") || !j["url"].is_string()) return "'url' is missing";
  const std::string url = j["url"].get<std::string>();
  if (url != kChat && url != kCompletions) {
    return StrCat("unsupported url '", url, "' (use ", kChat, " or ", kCompletions, ")");
  }
  if (!j.contains("body") || !j["body"].is_object()) return "'body' is missing or not an object";
  const json& body = j["body"];
  if (!body.contains("model") && options.default_model.empty()) {
    return "the body has no 'model' (or pass --model)";
  }
  if (body.contains("model") && !body["model"].is_string()) return "'body.model' is not a string";
  if (body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>()) {
    return "'body.stream' is true; batch requests cannot stream";
  }
  if (url == kChat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
      return "'body.messages' is missing or empty";
    }
  } else if (!body.contains("prompt")) {
    return "'body.prompt' is missing";
  }
  return "";
}

}  // namespace

std::string PromptKey(std::string_view url, const json& body) {
  std::string key;
  if (body.contains("model") && body["model"].is_string()) key += body["model"].get<std::string>();
  key += kRecordSep;
  if (body.contains("cache_salt") && body["cache_salt"].is_string()) {
    key += body["cache_salt"].get<std::string>();
  }
  key += kRecordSep;
  key += url;
  key += kRecordSep;
  if (url == kChat) {
    for (const json& m : body["messages"]) {
      if (!m.is_object()) continue;
      if (m.contains("role") && m["role"].is_string()) key += m["role"].get<std::string>();
      key += kFieldSep;
      if (m.contains("content")) AppendContent(key, m["content"]);
      key += kRecordSep;
    }
  } else if (body["prompt"].is_string()) {
    key += body["prompt"].get<std::string>();
  } else if (body["prompt"].is_array()) {
    for (const json& p : body["prompt"]) {
      if (p.is_string()) key += p.get<std::string>();
    }
  }
  return key;
}

absl::StatusOr<std::vector<BatchRequest>> ParseBatchInput(std::string_view text,
                                                          std::string_view name,
                                                          const InputOptions& options) {
  std::vector<BatchRequest> requests;
  std::vector<std::string> problems;
  size_t num_problems = 0;
  auto problem = [&](size_t line, std::string_view what) {
    if (++num_problems <= kMaxListedProblems)
      problems.push_back(StrCat(name, ":", line, ": ", what));
  };
  absl::flat_hash_map<std::string, size_t> line_of_id;
  size_t line = 0;
  for (std::string_view raw : StrSplit(text, '\n')) {
    ++line;
    const std::string_view trimmed = StripWhitespace(raw);
    if (trimmed.empty()) continue;
    json j = json::parse(trimmed.begin(), trimmed.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      problem(line, "malformed JSON");
      continue;
    }
    if (const std::string why = Problem(j, options); !why.empty()) {
      problem(line, why);
      continue;
    }
    BatchRequest r;
    r.line = line;
    r.custom_id = j["custom_id"].get<std::string>();
    r.url = j["url"].get<std::string>();
    r.body = std::move(j["body"]);
    if (!r.body.contains("model")) r.body["model"] = options.default_model;
    const auto [it, inserted] = line_of_id.emplace(r.custom_id, line);
    if (!inserted) {
      problem(line,
              StrCat("duplicate custom_id '", r.custom_id, "' (first on line ", it->second, ")"));
      continue;
    }
    r.prompt_key = PromptKey(r.url, r.body);
    requests.push_back(std::move(r));
  }
  if (num_problems > 0) {
    std::string message =
        StrCat(name, ": ", num_problems, " invalid line", num_problems == 1 ? "" : "s",
               "; nothing was sent:\n  ", StrJoin(problems, "\n  "));
    if (num_problems > problems.size()) {
      StrAppend(&message, "\n  ... and ", num_problems - problems.size(), " more");
    }
    return absl::InvalidArgumentError(message);
  }
  if (requests.empty()) return absl::InvalidArgumentError(StrCat(name, ": no requests"));
  return requests;
}

absl::StatusOr<std::vector<BatchRequest>> ReadBatchInput(const std::string& path,
                                                         const InputOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open the batch input ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(StrCat("reading ", path, " failed"));
  return ParseBatchInput(text.str(), path, options);
}

}  // namespace strata::scheduler::batch
