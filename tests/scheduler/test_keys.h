// Helpers for scheduler tests: distinct, readable block keys.
#pragma once

#include <vector>

#include "common/block_key.h"

namespace strata::scheduler::testing_keys {

// Key number `id` (any id gives a distinct key).
inline BlockKey Key(uint64_t id) {
  BlockKey key;
  for (int i = 0; i < 8; ++i) key.bytes[i] = uint8_t(id >> (8 * i));
  key.bytes[15] = 0xa5;
  return key;
}

// Keys [first, first + n).
inline std::vector<BlockKey> Chain(uint64_t first, uint32_t n) {
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < n; ++i) keys.push_back(Key(first + i));
  return keys;
}

}  // namespace strata::scheduler::testing_keys
