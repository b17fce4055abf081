#include "compute_nodes/tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <array>

namespace strata::tokenizer {
namespace {

uint8_t ComputeClass(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  const uint32_t mask = U_MASK(u_charType(cp));
  uint8_t cls = 0;
  if (mask & U_GC_L_MASK) cls |= kLetter;
  if (mask & U_GC_M_MASK) cls |= kMark;
  if (mask & U_GC_N_MASK) cls |= kNumber;
  if (mask & U_GC_P_MASK) cls |= kPunctuation;
  if (mask & U_GC_S_MASK) cls |= kSymbol;
  if (u_isUWhiteSpace(cp)) cls |= kWhitespace;
  return cls;
}

// The Basic Multilingual Plane is looked up in a table built once (64 KiB); other planes ask ICU.
const std::array<uint8_t, 0x10000>& BmpTable() {
  static const auto* table = [] {
    auto* t = new std::array<uint8_t, 0x10000>();
    for (char32_t c = 0; c < 0x10000; ++c) (*t)[c] = ComputeClass(c);
    return t;
  }();
  return *table;
}

// Returns the expected length of the sequence led by `b0` (0 if it cannot lead one) and the
// allowed range of the second byte, which excludes overlongs, surrogates and > U+10FFFF.
int LeadInfo(unsigned char b0, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (b0 == 0xE0) *lo = 0xA0;
    if (b0 == 0xED) *hi = 0x9F;
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (b0 == 0xF0) *lo = 0x90;
    if (b0 == 0xF4) *hi = 0x8F;
    return 4;
  }
  return 0;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

uint8_t ClassOf(char32_t c) {
  if (c < 0x10000) return BmpTable()[c];
  return ComputeClass(c);
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    unsigned char lo, hi;
    const int len = LeadInfo(b0, &lo, &hi);
    if (len == 0 || i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    if (b0 < 0x80) {
      out->push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    unsigned char lo, hi;
    const int len = LeadInfo(b0, &lo, &hi);
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ill_formed = false;
    for (int k = 1; k < len; ++k, ++j) {
      if (j >= n) {
        if (!final) return i;  // may still complete with the next bytes
        out->append(kReplacement);
        return n;
      }
      const auto b = static_cast<unsigned char>(bytes[j]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
        ill_formed = true;
        break;
      }
    }
    if (ill_formed) {
      out->append(kReplacement);  // the maximal subpart [i, j); bytes[j] starts afresh
      i = j;
      continue;
    }
    out->append(bytes.substr(i, len));
    i += len;
  }
  return n;
}

}  // namespace strata::tokenizer
