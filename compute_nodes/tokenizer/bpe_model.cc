#include "compute_nodes/tokenizer/bpe_model.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 onwards, in byte order.
const std::array<char32_t, 256>& ByteToCodePoint() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

void AppendCodePoint(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

struct CandidateAfter {
  bool operator()(const BpeModel::Scratch::Candidate& a,
                  const BpeModel::Scratch::Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

std::string ByteLevelChar(uint8_t b) {
  std::string s;
  AppendCodePoint(ByteToCodePoint()[b], &s);
  return s;
}

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  static const auto* inverse = [] {
    auto* m = new std::array<int16_t, 512>();
    m->fill(-1);
    for (int b = 0; b < 256; ++b) (*m)[ByteToCodePoint()[b]] = static_cast<int16_t>(b);
    return m;
  }();
  out->clear();
  if (FindInvalidUtf8(token) != std::string_view::npos) return false;
  for (size_t pos = 0; pos < token.size();) {
    int len;
    const char32_t c = DecodeValidUtf8(token, pos, &len);
    if (c >= inverse->size() || (*inverse)[c] < 0) return false;
    out->push_back(static_cast<char>((*inverse)[c]));
    pos += len;
  }
  return true;
}

absl::StatusOr<BpeModel> BpeModel::Build(const nlohmann::json& model) {
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return absl::InvalidArgumentError("model.type is not \"BPE\"");
  }
  // Options this implementation does not have must be off.
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (model.contains(key) && !model[key].is_null()) {
      return absl::UnimplementedError(StrCat("BPE option model.", key, " is not supported"));
    }
  }
  for (const char* key : {"byte_fallback", "ignore_merges"}) {
    if (model.contains(key) && !(model[key].is_boolean() && !model[key].get<bool>())) {
      return absl::UnimplementedError(StrCat("BPE option model.", key, " is not supported"));
    }
  }
  const auto vocab = model.find("vocab");
  const auto merges = model.find("merges");
  if (vocab == model.end() || !vocab->is_object() || merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("model needs an object \"vocab\" and an array \"merges\"");
  }

  BpeModel bpe;
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(vocab->size());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30)) {
      return absl::InvalidArgumentError(StrCat("vocab entry \"", token, "\" has a bad id"));
    }
    ids.emplace(token, id.get<int32_t>());
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  bpe.tokens_.resize(max_id + 1);
  bpe.token_bytes_.resize(max_id + 1);
  for (const auto& [token, id] : ids) {
    if (!bpe.tokens_[id].empty()) {
      return absl::InvalidArgumentError(StrCat("vocab id ", id, " is used twice"));
    }
    bpe.tokens_[id] = token;
    // Like HF's ByteLevel decoder, a token that is not spelled in byte-level characters decodes
    // to its own UTF-8.
    if (!ByteLevelToBytes(token, &bpe.token_bytes_[id])) bpe.token_bytes_[id] = token;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = ids.find(ByteLevelChar(static_cast<uint8_t>(b)));
    if (it == ids.end()) {
      return absl::InvalidArgumentError(StrCat("vocab has no token for byte ", b));
    }
    bpe.byte_to_id_[b] = it->second;
  }

  bpe.merges_.reserve(merges->size());
  uint32_t rank = 0;
  std::string left, right;
  for (const auto& merge : *merges) {
    // Two spellings: "a b" (tokenizers < 0.20) and ["a", "b"].
    if (merge.is_string()) {
      const std::string& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(StrCat("merge ", rank, " \"", s, "\" is not \"a b\""));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(StrCat("merge ", rank, " is malformed"));
    }
    const auto l = ids.find(left);
    const auto r = ids.find(right);
    const auto m = ids.find(left + right);
    if (l == ids.end() || r == ids.end() || m == ids.end()) {
      return absl::InvalidArgumentError(
          StrCat("merge ", rank, " (\"", left, "\", \"", right, "\") uses tokens not in vocab"));
    }
    // A pair listed twice keeps its first (lowest) rank, as in HF tokenizers.
    bpe.merges_.try_emplace(PairKey(l->second, r->second), Merge{rank, m->second});
    ++rank;
  }
  return bpe;
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* ids, Scratch* s) const {
  const size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    ids->push_back(byte_to_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  s->id.resize(n);
  s->next.resize(n);
  s->prev.resize(n);
  s->heap.clear();
  const auto end = static_cast<int32_t>(n);
  for (int32_t i = 0; i < end; ++i) {
    s->id[i] = byte_to_id_[static_cast<uint8_t>(piece[i])];
    s->prev[i] = i - 1;
    s->next[i] = i + 1;
  }
  auto queue = [&](int32_t left_pos) {
    if (left_pos < 0) return;
    const int32_t right_pos = s->next[left_pos];
    if (right_pos >= end) return;
    const auto it = merges_.find(PairKey(s->id[left_pos], s->id[right_pos]));
    if (it == merges_.end()) return;
    s->heap.push_back({it->second.rank, static_cast<uint32_t>(left_pos), s->id[left_pos],
                       s->id[right_pos], it->second.merged});
    std::push_heap(s->heap.begin(), s->heap.end(), CandidateAfter{});
  };
  for (int32_t i = 0; i + 1 < end; ++i) queue(i);

  while (!s->heap.empty()) {
    std::pop_heap(s->heap.begin(), s->heap.end(), CandidateAfter{});
    const Scratch::Candidate c = s->heap.back();
    s->heap.pop_back();
    const auto pos = static_cast<int32_t>(c.pos);
    const int32_t right_pos = s->next[pos];
    if (s->id[pos] != c.left || right_pos >= end || s->id[right_pos] != c.right) continue;
    s->id[pos] = c.merged;
    s->id[right_pos] = -1;  // dead: no candidate can name it as its left symbol again
    s->next[pos] = s->next[right_pos];
    if (s->next[pos] < end) s->prev[s->next[pos]] = pos;
    queue(s->prev[pos]);
    queue(pos);
  }
  for (int32_t i = 0; i < end; i = s->next[i]) ids->push_back(s->id[i]);
}

}  // namespace strata::tokenizer
