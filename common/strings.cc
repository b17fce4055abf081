#include "common/strings.h"

#include <cctype>

namespace strata {

std::vector<std::string_view> StrSplit(std::string_view s, char sep, bool skip_empty) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    const std::string_view piece =
        s.substr(start, end == std::string_view::npos ? s.npos : end - start);
    if (!(skip_empty && StripWhitespace(piece).empty())) parts.push_back(piece);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

std::string_view StripWhitespace(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string AsciiToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

namespace {
template <typename T>
std::optional<T> ParseWhole(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  T v{};
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}
}  // namespace

std::optional<int64_t> ParseInt64(std::string_view s) { return ParseWhole<int64_t>(s); }
std::optional<uint64_t> ParseUint64(std::string_view s) { return ParseWhole<uint64_t>(s); }
std::optional<double> ParseDouble(std::string_view s) { return ParseWhole<double>(s); }

}  // namespace strata
