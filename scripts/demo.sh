#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata and shows what runs today, piece by piece:
# the build, a random-weight DeepSeek-V3-shaped model generating text on the CPU backend, the real
# DeepSeek-V3 tokenizer, a cache server with its admin CLI, and the prefix-aware scheduler replaying
# the Mooncake trace against the baseline policies.
# The one-command local cluster with a streaming multi-turn chat (`strata up`) arrives with issue #8.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then bash scripts/install-deps.sh; fi
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
strata=build/cli/strata
run=$(mktemp -d /tmp/strata-demo.XXXXXX)
cache_pid=""
trap '[[ -n "$cache_pid" ]] && kill "$cache_pid" 2>/dev/null; rm -rf "$run"' EXIT

step() { echo; echo "== $*"; }

step "strata info"
$strata info

step "a random small-v3 checkpoint (sigmoid MoE routing, YaRN RoPE, q_lora) in Hugging Face format"
$strata model make-random --preset small-v3 --seed 1 --out "$run/small-v3"
ls -la "$run/small-v3"

step "generate on the cpu backend (random weights: the text is noise, the pipeline is real)"
$strata generate --model "$run/small-v3" --prompt "The capital of France is" --max-tokens 24

step "the real DeepSeek-V3 tokenizer"
$strata tokenize --text "Strata caches KV blocks: 안녕하세요, 世界! 🚀 12345"

step "a cache server (DRAM + SSD tiers, RocksDB index) and its admin CLI"
head -c 24 /dev/urandom | base64 > "$run/admin.token"
$strata cache --ready-file "$run/ready" \
  --set cache.listen=127.0.0.1:0 --set cache.http_listen=127.0.0.1:0 \
  --set cache.transfer_listen=127.0.0.1:0 --set cache.data_dir="$run/cache" \
  --set cache.dram.capacity=256MiB --set cache.ssd.dir="$run/ssd" \
  --set cache.ssd.capacity=512MiB --set cluster.admin_token_file="$run/admin.token" \
  --set log.file="$run/cache.log" &
cache_pid=$!
for _ in $(seq 100); do [[ -s "$run/ready" ]] && break; sleep 0.1; done
grpc_port=$(sed -n 's/.*grpc=\([0-9]*\).*/\1/p' "$run/ready")
$strata admin cache --address "127.0.0.1:$grpc_port" --token-file "$run/admin.token" tiers
kill "$cache_pid"; wait "$cache_pid" 2>/dev/null || true; cache_pid=""

step "the scheduler's placement policies replaying the Mooncake trace (simulated 8+4-node cluster)"
trace=../shared/data/traces/synthetic_trace.jsonl
if [[ -f "$trace" ]]; then
  $strata bench replay --trace "$trace" --policy all
else
  echo "(trace not found at $trace: skipped)"
fi

echo
echo "Not yet here: the local cluster with a streaming multi-turn chat through the OpenAI API"
echo "(strata up, issue #8), which needs the prefill/decode workers (issue #6)."
