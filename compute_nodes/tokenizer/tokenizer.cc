#include "compute_nodes/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/tokenizer/pre_tokenizer.h"
#include "compute_nodes/tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(StrCat(path, " is not valid JSON"));
  return json;
}

// tokenizer_config.json names tokens either as a string or as {"__type": "AddedToken",
// "content": ...}.
std::string TokenContent(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

bool IsEmptyNormalizer(const nlohmann::json& normalizer) {
  if (normalizer.is_null()) return true;
  return normalizer.is_object() && normalizer.value("type", "") == "Sequence" &&
         normalizer.contains("normalizers") && normalizer["normalizers"].is_array() &&
         normalizer["normalizers"].empty();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  RETURN_IF_ERROR(tok->LoadTokenizerJson(dir + "/tokenizer.json"));
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) RETURN_IF_ERROR(tok->LoadConfigJson(config_path));
  return tok;
}

absl::Status Tokenizer::LoadTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(const nlohmann::json json, ReadJson(path));
  if (!json.is_object()) return absl::InvalidArgumentError(StrCat(path, ": not an object"));
  if (!IsEmptyNormalizer(json.value("normalizer", nlohmann::json()))) {
    return absl::UnimplementedError(StrCat(path, ": only an empty normalizer is supported"));
  }
  if (!IsDeepSeekV3PreTokenizer(json.value("pre_tokenizer", nlohmann::json()))) {
    return absl::UnimplementedError(
        StrCat(path, ": pre_tokenizer is not DeepSeek-V3's, the only one implemented"));
  }
  const nlohmann::json decoder = json.value("decoder", nlohmann::json());
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
    return absl::UnimplementedError(StrCat(path, ": only the ByteLevel decoder is supported"));
  }
  ASSIGN_OR_RETURN_WITH(bpe_, BpeModel::Build(json.value("model", nlohmann::json())), path);

  token_bytes_ = bpe_.token_bytes();
  flags_.assign(token_bytes_.size(), 0);
  const auto& tokens = bpe_.tokens();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) continue;
    flags_[id] = kKnown;
    vocab_.emplace(tokens[id], static_cast<int32_t>(id));
  }

  const nlohmann::json added = json.value("added_tokens", nlohmann::json::array());
  if (!added.is_array()) return absl::InvalidArgumentError(StrCat(path, ": bad added_tokens"));
  for (const auto& entry : added) {
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        !entry.contains("content") || !entry["content"].is_string()) {
      return absl::InvalidArgumentError(StrCat(path, ": malformed added token ", entry.dump()));
    }
    const int64_t id = entry["id"].get<int64_t>();
    const std::string content = entry["content"].get<std::string>();
    if (id < 0 || id > (1 << 30) || content.empty() ||
        FindInvalidUtf8(content) != std::string::npos) {
      return absl::InvalidArgumentError(StrCat(path, ": bad added token ", entry.dump()));
    }
    for (const char* option : {"lstrip", "rstrip", "single_word"}) {
      if (entry.value(option, false)) {
        return absl::UnimplementedError(
            StrCat(path, ": added token option ", option, " is not supported: ", entry.dump()));
      }
    }
    if (id >= static_cast<int64_t>(flags_.size())) {
      flags_.resize(id + 1, 0);
      token_bytes_.resize(id + 1);
    }
    flags_[id] = kKnown | kAdded | (entry.value("special", false) ? kSpecial : 0);
    token_bytes_[id] = content;
    added_[content] = static_cast<int32_t>(id);
    added_first_byte_[static_cast<uint8_t>(content[0])] = true;
    if (std::find(added_lengths_.begin(), added_lengths_.end(), content.size()) ==
        added_lengths_.end()) {
      added_lengths_.push_back(content.size());
    }
  }
  std::sort(added_lengths_.rbegin(), added_lengths_.rend());
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadConfigJson(const std::string& path) {
  ASSIGN_OR_RETURN(const nlohmann::json config, ReadJson(path));
  if (!config.is_object()) return absl::InvalidArgumentError(StrCat(path, ": not an object"));
  bos_token_ = TokenContent(config, "bos_token");
  eos_token_ = TokenContent(config, "eos_token");
  if (!bos_token_.empty()) {
    const auto id = TokenToId(bos_token_);
    if (!id) return absl::InvalidArgumentError(StrCat(path, ": unknown bos_token ", bos_token_));
    bos_id_ = *id;
  }
  if (!eos_token_.empty()) {
    const auto id = TokenToId(eos_token_);
    if (!id) return absl::InvalidArgumentError(StrCat(path, ": unknown eos_token ", eos_token_));
    eos_id_ = *id;
  }
  add_bos_token_ = config.value("add_bos_token", false) && bos_id_ >= 0;
  add_eos_token_ = config.value("add_eos_token", false) && eos_id_ >= 0;
  if (config.contains("chat_template")) {
    if (!config["chat_template"].is_string()) {
      return absl::UnimplementedError(StrCat(path, ": only a single string chat_template"));
    }
    chat_template_ = config["chat_template"].get<std::string>();
  }
  return absl::OkStatus();
}

size_t Tokenizer::MatchAddedToken(std::string_view text, size_t pos, int32_t* id) const {
  if (!added_first_byte_[static_cast<uint8_t>(text[pos])]) return 0;
  for (const size_t len : added_lengths_) {
    if (len > text.size() - pos) continue;
    const auto it = added_.find(text.substr(pos, len));
    if (it != added_.end()) {
      *id = it->second;
      return len;
    }
  }
  return 0;
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids,
                               BpeModel::Scratch* scratch) const {
  std::vector<std::string_view> pieces;
  PreTokenize(text, &pieces);
  for (const std::string_view piece : pieces) bpe_.Encode(piece, ids, scratch);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat("text is not valid UTF-8 at byte ", bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special_tokens && add_bos_token_) ids.push_back(bos_id_);
  BpeModel::Scratch scratch;
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id;
    const size_t len = MatchAddedToken(text, pos, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    if (start < pos) EncodeOrdinary(text.substr(start, pos - start), &ids, &scratch);
    ids.push_back(id);
    pos += len;
    start = pos;
  }
  if (start < text.size()) EncodeOrdinary(text.substr(start), &ids, &scratch);
  if (add_special_tokens && add_eos_token_) ids.push_back(eos_id_);
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (!IsKnown(id) || (skip_special_tokens && IsSpecial(id))) continue;
    bytes.append(token_bytes_[id]);
  }
  std::string text;
  text.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*final=*/true, &text);
  return text;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (!IsKnown(id)) return std::nullopt;
  if (flags_[id] & kAdded) return token_bytes_[id];
  return bpe_.tokens()[id];
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const auto it = added_.find(token); it != added_.end()) return it->second;
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (!IsKnown(id)) return {};
  return token_bytes_[id];
}

std::string StreamDecoder::Add(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->IsSpecial(id)) return "";
  pending_.append(tokenizer_->TokenBytes(id));
  std::string text;
  const size_t consumed = AppendUtf8Lossy(pending_, /*final=*/false, &text);
  pending_.erase(0, consumed);
  return text;
}

std::string StreamDecoder::Flush() {
  std::string text;
  AppendUtf8Lossy(pending_, /*final=*/true, &text);
  pending_.clear();
  return text;
}

}  // namespace strata::tokenizer
