// String helpers that take std::string_view.
//
// Debian 12's Abseil is built in C++14 mode, where absl::string_view is its own type and
// absl::StrCat & co. do not accept std::string_view. Strata uses Abseil for Status, StatusOr,
// time and hashing only, and these helpers for strings.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"

namespace strata {

namespace strings_internal {

inline void AppendPiece(std::string& out, std::string_view s) { out.append(s); }
inline void AppendPiece(std::string& out, const std::string& s) { out.append(s); }
inline void AppendPiece(std::string& out, const char* s) { out.append(s); }
inline void AppendPiece(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
inline void AppendPiece(std::string& out, char c) { out.push_back(c); }
inline void AppendPiece(std::string& out, bool b) { out.append(b ? "true" : "false"); }

template <typename T>
requires(std::is_arithmetic_v<T> && !std::is_same_v<T, char> &&
         !std::is_same_v<T, bool>) void AppendPiece(std::string& out, T v) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, result.ptr);
}

}  // namespace strings_internal

// Concatenates strings (std:: or absl:: views, std::string, C strings), chars and numbers.
// Floating-point numbers print in their shortest round-trip form.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (strings_internal::AppendPiece(out, args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (strings_internal::AppendPiece(*out, args), ...);
}

inline std::string_view ToStd(absl::string_view s) { return {s.data(), s.size()}; }
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Splits on `sep`; with `skip_empty`, empty pieces are dropped. Views point into `s`.
std::vector<std::string_view> StrSplit(std::string_view s, char sep, bool skip_empty = false);

template <typename Range>
std::string StrJoin(const Range& parts, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& p : parts) {
    if (!first) out.append(sep);
    first = false;
    strings_internal::AppendPiece(out, p);
  }
  return out;
}

std::string_view StripWhitespace(std::string_view s);
std::string AsciiToLower(std::string_view s);
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// Whole-string numeric parsing: nullopt on trailing characters, overflow or empty input.
std::optional<int64_t> ParseInt64(std::string_view s);
std::optional<uint64_t> ParseUint64(std::string_view s);
std::optional<double> ParseDouble(std::string_view s);

}  // namespace strata
