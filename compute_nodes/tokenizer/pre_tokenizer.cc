#include "compute_nodes/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "compute_nodes/tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

// The pre_tokenizer section of DeepSeek-V3's tokenizer.json, verbatim.
constexpr const char* kDeepSeekV3PreTokenizer = R"json({
  "type": "Sequence",
  "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
     "behavior": "Isolated", "invert": false},
    {"type": "Split",
     "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
  ]
})json";

// One decoded code point of the text being split.
struct Char {
  char32_t cp;
  uint32_t offset;  // byte offset in the text
  uint8_t cls;      // CharClass bits
};

bool IsCjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) ||
         (c >= 0x30A0 && c <= 0x30FF);
}

bool IsAsciiPunct(char32_t c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
         (c >= '{' && c <= '~');
}

bool IsAsciiAlpha(char32_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool IsCrLf(char32_t c) { return c == '\r' || c == '\n'; }

class Splitter {
 public:
  Splitter(std::string_view text, std::vector<std::string_view>* pieces)
      : text_(text), pieces_(pieces) {
    chars_.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      int len;
      const char32_t cp = DecodeValidUtf8(text, pos, &len);
      chars_.push_back({cp, static_cast<uint32_t>(pos), ClassOf(cp)});
      pos += len;
    }
    chars_.push_back({0, static_cast<uint32_t>(text.size()), 0});  // sentinel for offsets
  }

  void Run() { SplitDigits(0, chars_.size() - 1); }

 private:
  // Stage 1: \p{N}{1,3}.
  void SplitDigits(size_t begin, size_t end) {
    size_t gap = begin;
    for (size_t i = begin; i < end;) {
      if (!(chars_[i].cls & kNumber)) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < end && j - i < 3 && (chars_[j].cls & kNumber)) ++j;
      if (gap < i) SplitCjk(gap, i);
      SplitCjk(i, j);
      i = gap = j;
    }
    if (gap < end) SplitCjk(gap, end);
  }

  // Stage 2: [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+.
  void SplitCjk(size_t begin, size_t end) {
    size_t gap = begin;
    for (size_t i = begin; i < end;) {
      if (!IsCjk(chars_[i].cp)) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < end && IsCjk(chars_[j].cp)) ++j;
      if (gap < i) SplitWords(gap, i);
      SplitWords(i, j);
      i = gap = j;
    }
    if (gap < end) SplitWords(gap, end);
  }

  // Stage 3: the word/punctuation/whitespace alternation.
  void SplitWords(size_t begin, size_t end) {
    size_t gap = begin;
    for (size_t i = begin; i < end;) {
      const size_t j = MatchWordAt(i, end);
      if (j == i) {
        ++i;
        continue;
      }
      if (gap < i) Emit(gap, i);
      Emit(i, j);
      i = gap = j;
    }
    if (gap < end) Emit(gap, end);
  }

  bool Is(size_t i, size_t end, uint8_t cls) const { return i < end && (chars_[i].cls & cls); }

  size_t RunOf(size_t i, size_t end, uint8_t cls) const {
    while (i < end && (chars_[i].cls & cls)) ++i;
    return i;
  }

  // End of the match of stage 3's alternation at `i` within [.., end), or `i` if none matches.
  size_t MatchWordAt(size_t i, size_t end) const {
    const Char& c = chars_[i];
    // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
    if (IsAsciiPunct(c.cp) && i + 1 < end && IsAsciiAlpha(chars_[i + 1].cp)) {
      size_t j = i + 1;
      while (j < end && IsAsciiAlpha(chars_[j].cp)) ++j;
      return j;
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the optional prefix is tried first; when it cannot
    // be followed by a letter or mark, backtracking drops it.
    constexpr uint8_t kLetterOrMark = kLetter | kMark;
    if (!IsCrLf(c.cp) && !(c.cls & (kLetter | kPunctuation | kSymbol)) &&
        Is(i + 1, end, kLetterOrMark)) {
      return RunOf(i + 1, end, kLetterOrMark);
    }
    if (c.cls & kLetterOrMark) return RunOf(i, end, kLetterOrMark);
    //  ?[\p{P}\p{S}]+[\r\n]*
    constexpr uint8_t kPunctOrSymbol = kPunctuation | kSymbol;
    size_t k = end;
    if (c.cp == ' ' && Is(i + 1, end, kPunctOrSymbol)) {
      k = i + 1;
    } else if (c.cls & kPunctOrSymbol) {
      k = i;
    }
    if (k != end) {
      k = RunOf(k, end, kPunctOrSymbol);
      while (k < end && IsCrLf(chars_[k].cp)) ++k;
      return k;
    }
    if (!(c.cls & kWhitespace)) return i;
    const size_t run_end = RunOf(i, end, kWhitespace);
    // \s*[\r\n]+ : \s* backs off to the last CR/LF of the run; [\r\n]+ then takes that one.
    for (size_t j = run_end; j > i; --j) {
      if (IsCrLf(chars_[j - 1].cp)) return j;
    }
    // \s+(?!\S) : the whole run at the end of the piece, else all of it but the last character
    // (which is followed by whitespace); a single space before a non-space falls to \s+.
    if (run_end == end || run_end - i == 1) return run_end;
    return run_end - 1;
  }

  void Emit(size_t begin, size_t end) {
    const uint32_t from = chars_[begin].offset;
    pieces_->push_back(text_.substr(from, chars_[end].offset - from));
  }

  std::string_view text_;
  std::vector<std::string_view>* pieces_;
  std::vector<Char> chars_;
};

}  // namespace

bool IsDeepSeekV3PreTokenizer(const nlohmann::json& pre_tokenizer) {
  static const nlohmann::json expected = nlohmann::json::parse(kDeepSeekV3PreTokenizer);
  return pre_tokenizer == expected;
}

void PreTokenize(std::string_view text, std::vector<std::string_view>* pieces) {
  if (text.empty()) return;
  Splitter(text, pieces).Run();
}

}  // namespace strata::tokenizer
