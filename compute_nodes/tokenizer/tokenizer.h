// The DeepSeek-V3 tokenizer: Hugging Face tokenizer.json + tokenizer_config.json, in C++.
//
//   ASSIGN_OR_RETURN(auto tok, Tokenizer::Load(strata::DeepSeekV3TokenizerDir()));
//   ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello", /*add_special_tokens=*/true));
//   std::string text = tok->Decode(ids);
//
// Encoding, in Hugging Face's order: added tokens (special or not) are cut out first, longest
// match leftmost; the text between them goes through the DeepSeek-V3 pre-tokenizer
// (pre_tokenizer.h) and byte-level BPE (bpe_model.h). With add_special_tokens, BOS/EOS are
// added as tokenizer_config.json's add_bos_token/add_eos_token say (as transformers'
// LlamaTokenizerFast does; the transformers.js port adds none).
//
// Supported: tokenizer.json with a BPE model without dropout, byte fallback or suffixes, an
// empty normalizer, the DeepSeek-V3 pre-tokenizer and a ByteLevel decoder. Anything else is
// refused by Load with kUnimplemented rather than tokenized differently.
//
// Thread safety: a loaded Tokenizer is immutable; every const method may be called from many
// threads at once. A StreamDecoder belongs to one sequence and is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "compute_nodes/tokenizer/bpe_model.h"

namespace strata::tokenizer {

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json and `dir`/tokenizer_config.json (the latter optional: without
  // it there is no BOS/EOS and no chat template). NotFound if tokenizer.json is missing,
  // InvalidArgument if malformed, Unimplemented for features this tokenizer lacks.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);

  // Token ids of `text`. InvalidArgument if `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens = false) const;

  // Text of `ids`: byte-level tokens become their bytes, added tokens their content; the bytes
  // are read as UTF-8 with every ill-formed subsequence replaced by U+FFFD. Ids that name no
  // token (e.g. the padding rows 128815..129279 of DeepSeek-V3's embedding) are skipped, as HF
  // tokenizers does. With skip_special_tokens, special added tokens are dropped too.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The token as tokenizer.json spells it (byte-level characters for BPE tokens, the content
  // for added tokens), and back. nullopt for unknown tokens / ids.
  std::optional<std::string> IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;

  // The bytes `id` stands for (empty for an unknown id).
  std::string_view TokenBytes(int32_t id) const;
  bool IsKnown(int32_t id) const { return id >= 0 && id < num_ids() && (flags_[id] & kKnown); }
  bool IsSpecial(int32_t id) const { return id >= 0 && id < num_ids() && (flags_[id] & kSpecial); }

  // One past the largest id of any token (128815 for DeepSeek-V3; the model's embedding has
  // 129280 rows).
  int32_t num_ids() const { return static_cast<int32_t>(flags_.size()); }

  // -1 when tokenizer_config.json names none.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }
  bool add_eos_token() const { return add_eos_token_; }

  // The Jinja chat template of tokenizer_config.json, verbatim ("" if none); chat_template.h
  // renders the DeepSeek-V3 one.
  const std::string& chat_template() const { return chat_template_; }

 private:
  enum Flag : uint8_t { kKnown = 1, kAdded = 2, kSpecial = 4 };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  Tokenizer() = default;
  absl::Status LoadTokenizerJson(const std::string& path);
  absl::Status LoadConfigJson(const std::string& path);
  // Length of the longest added token at text[pos], or 0.
  size_t MatchAddedToken(std::string_view text, size_t pos, int32_t* id) const;
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids,
                      BpeModel::Scratch* scratch) const;

  BpeModel bpe_;
  std::vector<std::string> token_bytes_;  // by id
  std::vector<uint8_t> flags_;            // Flag bits, by id
  StringMap vocab_;                       // tokenizer.json spelling -> id
  StringMap added_;                       // added token content -> id
  std::vector<size_t> added_lengths_;     // distinct content lengths, longest first
  bool added_first_byte_[256] = {};
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::string bos_token_, eos_token_;
  bool add_bos_token_ = false;
  bool add_eos_token_ = false;
  std::string chat_template_;
};

// Turns generated ids into text as they arrive without ever cutting a UTF-8 sequence: bytes of
// a character split over several tokens are held back until it is complete. The concatenation
// of every Add() and the final Flush() equals Tokenizer::Decode of all the ids.
// The tokenizer must outlive the decoder. Not thread-safe (one per sequence).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // The text that `id` completes (possibly empty); always whole UTF-8 characters.
  std::string Add(int32_t id);
  // The end of the stream: held bytes that can no longer complete become U+FFFD.
  std::string Flush();
  // Bytes held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace strata::tokenizer
