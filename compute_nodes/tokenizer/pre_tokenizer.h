// The DeepSeek-V3 pre-tokenizer: three regex splits (behaviour "Isolated"), each applied to every
// piece the previous one produced, before byte-level BPE. From tokenizer.json:
//
//   1. \p{N}{1,3}
//   2. [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//      | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//      | ?[\p{P}\p{S}]+[\r\n]*
//      | \s*[\r\n]+
//      | \s+(?!\S)
//      | \s+
//
// "Isolated" keeps both the matches and the text between them as pieces. The matcher below is
// hand-written, not a regex engine: at each position it tries the alternatives in order with the
// result leftmost-first backtracking would give (Oniguruma in HF tokenizers, V8 in the JS port),
// and it treats every piece as a whole subject (so `(?!\S)` sees the end of the piece).
// `\s` is Unicode White_Space, as in Oniguruma; the JS port's `\s` differs on exactly two code
// points (it includes U+FEFF and excludes U+0085), see docs/tokenizer.md.
//
// Thread-safe (no state).
#pragma once

#include <string_view>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace strata::tokenizer {

// True when `pre_tokenizer` (the tokenizer.json section) is exactly the one implemented here.
bool IsDeepSeekV3PreTokenizer(const nlohmann::json& pre_tokenizer);

// Appends the pieces of `text` (valid UTF-8) to `pieces`, in order; they point into `text` and
// concatenate to it.
void PreTokenize(std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace strata::tokenizer
