// Byte-level BPE (the "model" section of a tokenizer.json of type BPE, as GPT-2 and DeepSeek use):
// every piece is first split into single bytes, each byte is the vocabulary token spelled by its
// GPT-2 byte-to-unicode character, then the adjacent pair with the lowest merge rank is merged,
// leftmost first among equal ranks, until no pair has a merge. A min-heap over candidate pairs
// with lazy invalidation makes a piece of n bytes cost O(n log n).
//
// Immutable after Build(); Encode is thread-safe when every thread passes its own scratch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::tokenizer {

// The GPT-2 byte-to-unicode character of `b`, as UTF-8 ("Ġ" for the space byte).
std::string ByteLevelChar(uint8_t b);

// Maps a vocabulary token spelled in byte-level characters back to its bytes. Returns false
// (and leaves `out` unspecified) if a character is not one of the 256 byte-level characters.
bool ByteLevelToBytes(std::string_view token, std::string* out);

class BpeModel {
 public:
  // Reusable buffers of one encoding thread.
  struct Scratch {
    struct Candidate {
      uint32_t rank;
      uint32_t pos;  // index of the left symbol
      int32_t left;  // ids of the pair when it was queued (stale entries no longer match)
      int32_t right;
      int32_t merged;
    };
    std::vector<int32_t> id, next, prev;
    std::vector<Candidate> heap;
  };

  // `model` is tokenizer.json's "model": {"type": "BPE", "vocab": {...}, "merges": [...]}.
  static absl::StatusOr<BpeModel> Build(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized piece (its raw bytes, not byte-level characters).
  void Encode(std::string_view piece, std::vector<int32_t>* ids, Scratch* scratch) const;

  // Vocabulary tokens in their tokenizer.json spelling (byte-level characters), by id; ids
  // without a token are empty. The bytes each id stands for, by id.
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<std::string>& token_bytes() const { return token_bytes_; }

 private:
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::vector<std::string> tokens_;
  std::vector<std::string> token_bytes_;
  int32_t byte_to_id_[256];
  struct Merge {
    uint32_t rank;
    int32_t merged;
  };
  absl::flat_hash_map<uint64_t, Merge> merges_;
};

}  // namespace strata::tokenizer
