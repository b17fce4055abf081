// The real DeepSeek-V3 tokenizer for tests, loaded once per test binary from
// strata::DeepSeekV3TokenizerDir() (installed by scripts/fetch-npm.sh).
#pragma once

#include <gtest/gtest.h>

#include "common/paths.h"
#include "compute_nodes/tokenizer/tokenizer.h"

namespace strata::tokenizer {

// nullptr (with the reason in `*why`) when the files are not installed.
inline const Tokenizer* RealTokenizer(std::string* why = nullptr) {
  static const auto* loaded =
      new absl::StatusOr<std::unique_ptr<Tokenizer>>(Tokenizer::Load(DeepSeekV3TokenizerDir()));
  if (!loaded->ok()) {
    if (why != nullptr) *why = loaded->status().ToString();
    return nullptr;
  }
  return loaded->value().get();
}

}  // namespace strata::tokenizer

// Skips the test when the tokenizer files are absent; fails it when they exist but do not load.
#define STRATA_REQUIRE_REAL_TOKENIZER(var)                                                         \
  std::string var##_why;                                                                           \
  const ::strata::tokenizer::Tokenizer* var = ::strata::tokenizer::RealTokenizer(&var##_why);      \
  if (var == nullptr) {                                                                            \
    if (var##_why.find("NOT_FOUND") != std::string::npos) {                                        \
      GTEST_SKIP() << "DeepSeek-V3 tokenizer not installed (scripts/fetch-npm.sh): " << var##_why; \
    }                                                                                              \
    FAIL() << var##_why;                                                                           \
  }
