// UTF-8 and Unicode character classes for the tokenizer.
//
// Classes come from ICU (Debian libicu, Unicode 15.0 in Debian 12): General_Category for
// letters, marks, numbers, punctuation and symbols, and the White_Space property for `\s`, which
// is what Oniguruma (the regex engine of Hugging Face `tokenizers`) uses for `\s` in Unicode mode.
// All functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

// Bit set of the classes the DeepSeek-V3 pre-tokenizer tests (\p{L}, \p{M}, \p{N}, \p{P},
// \p{S}, \s).
enum CharClass : uint8_t {
  kLetter = 1 << 0,       // \p{L}: Lu Ll Lt Lm Lo
  kMark = 1 << 1,         // \p{M}: Mn Mc Me
  kNumber = 1 << 2,       // \p{N}: Nd Nl No
  kPunctuation = 1 << 3,  // \p{P}: Pc Pd Ps Pe Pi Pf Po
  kSymbol = 1 << 4,       // \p{S}: Sm Sc Sk So
  kWhitespace = 1 << 5,   // \s: the White_Space property
};

uint8_t ClassOf(char32_t c);

// Decodes the code point at s[pos] of a string already known to be valid UTF-8 and sets `*len`
// to its byte length.
inline char32_t DecodeValidUtf8(std::string_view s, size_t pos, int* len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  auto cont = [&](size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i]) & 0x3F);
  };
  if (b0 < 0xE0) {
    *len = 2;
    return (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(pos + 1);
  }
  if (b0 < 0xF0) {
    *len = 3;
    return (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(pos + 1) << 6) | cont(pos + 2);
  }
  *len = 4;
  return (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(pos + 1) << 12) | (cont(pos + 2) << 6) |
         cont(pos + 3);
}

// Byte offset of the first byte that is not part of well-formed UTF-8, or npos if `s` is valid.
size_t FindInvalidUtf8(std::string_view s);

// Appends `bytes` to `out` as UTF-8, replacing every maximal ill-formed subsequence by U+FFFD
// (the Unicode "maximal subpart" practice, which both Rust's from_utf8_lossy and the WHATWG
// TextDecoder follow). When `final` is false, a trailing sequence that is incomplete but could
// still become valid is left unconsumed. Returns the number of bytes consumed.
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

}  // namespace strata::tokenizer
