// Lower-case hexadecimal encoding of byte strings (block keys, namespaces, checksums).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

std::string HexEncode(std::span<const uint8_t> bytes);
inline std::string HexEncode(std::string_view bytes) {
  return HexEncode({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

// Accepts upper- and lower-case digits; an odd length or a non-hex character is InvalidArgument.
absl::StatusOr<std::vector<uint8_t>> HexDecode(std::string_view hex);

}  // namespace strata
