#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata and shows what runs today, piece by piece:
# the build, a random-weight DeepSeek-V3-shaped model generating text on the CPU backend, the real
# DeepSeek-V3 tokenizer, a cache server with its admin CLI, disaggregated prefill and decode workers
# handing a request over through the cache (and a second turn hitting it), the scheduler's OpenAI
# API running a streamed chat on them, and the prefix-aware placement policies replaying the
# Mooncake trace.
# One command for the whole local cluster (`strata up`) arrives with issue #8.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then bash scripts/install-deps.sh; fi
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
strata=build/cli/strata
run=$(mktemp -d /tmp/strata-demo.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$run"' EXIT

step() { echo; echo "== $*"; }
# Waits for a daemon's ready file and prints its gRPC port.
ready_port() {
  for _ in $(seq 300); do [[ -s "$1" ]] && break; sleep 0.1; done
  sed -n 's/.*grpc=\([0-9]*\).*/\1/p' "$1"
}

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
pids+=($!)
cache=127.0.0.1:$(ready_port "$run/ready")
$strata admin cache --address "$cache" --token-file "$run/admin.token" tiers

step "the scheduler (OpenAI API in front), a prefill worker and a decode worker on that cache"
$strata scheduler --model "$run/small-v3" --ready-file "$run/scheduler.ready" \
  --set scheduler.listen=127.0.0.1:0 --set scheduler.http_listen=127.0.0.1:0 \
  --set log.file="$run/scheduler.log" &
pids+=($!)
scheduler=127.0.0.1:$(ready_port "$run/scheduler.ready")
gateway=127.0.0.1:$(sed -n 's/.*http=\([0-9]*\).*/\1/p' "$run/scheduler.ready")
for role in prefill decode; do
  $strata worker --role $role --model "$run/small-v3" --ready-file "$run/$role.ready" \
    --set worker.node_id=$role-0 --set worker.listen=127.0.0.1:0 --set worker.http_listen= \
    --set worker.cache_address="$cache" --set worker.scheduler_address="$scheduler" \
    --set log.file="$run/$role.log" &
  pids+=($!)
done
prefill=127.0.0.1:$(ready_port "$run/prefill.ready")
decode=127.0.0.1:$(ready_port "$run/decode.ready")
story="Strata keeps the latent KV cache of every prompt it has seen in a tiered store, so that a \
chat platform serving many turns of the same conversation never recomputes what it already knows. \
Prefill nodes write blocks of sixty-four tokens into the store while they compute; decode nodes read \
them back, verify every checksum and token, and continue the conversation from there. When a \
decode node runs out of pages it swaps a sequence out to the store instead of dropping it, and when \
a conversation ends it writes the blocks of the answer too, so that the next turn finds the whole \
history already computed. A scheduler in front of all this sends each request to the node that \
holds the longest cached prefix of its prompt, unless that node is too busy to answer in time."
echo "turn 1: prefill computes the prompt and publishes its blocks; decode loads them"
$strata generate --model "$run/small-v3" --prefill "$prefill" --decode "$decode" --max-tokens 24 \
  --prompt "$story Question one: what do prefill nodes write?"
echo
echo "turn 2 shares the first blocks: prefill loads them from the cache and computes only the rest"
$strata generate --model "$run/small-v3" --prefill "$prefill" --decode "$decode" --max-tokens 24 \
  --prompt "$story Question two: what do decode nodes verify?"
$strata admin cache --address "$cache" --token-file "$run/admin.token" stats

step "a chat through the scheduler's OpenAI API (streamed), then a second turn on the same history"
chat() {  # $1: the user's message; prints the streamed events, then the usage
  local body="{\"model\":\"small-v3\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\
\"max_tokens\":16,\"messages\":[{\"role\":\"system\",\"content\":\"$story\"},\
{\"role\":\"user\",\"content\":\"$1\"}]}"
  for _ in $(seq 50); do  # until the workers have registered
    if curl -sfN "http://$gateway/v1/chat/completions" -H 'Content-Type: application/json' \
      -d "$body"; then return; fi
    sleep 0.2
  done
  echo "the gateway did not answer" >&2; return 1
}
chat "What do prefill nodes write?" > "$run/turn1.sse"
grep '^data' "$run/turn1.sse" | head -n 3
grep -o '"usage":{.*}}' "$run/turn1.sse" || true
echo "second turn:"
chat "And what do decode nodes verify?" | grep -o '"usage":{.*}}' || true

step "the scheduler's placement policies replaying the Mooncake trace (simulated 8+4-node cluster)"
trace=../shared/data/traces/synthetic_trace.jsonl
if [[ -f "$trace" ]]; then
  $strata bench replay --trace "$trace" --policy all
else
  echo "(trace not found at $trace: skipped)"
fi

echo
echo "Not yet here: one command for all of this (strata up, issue #8)."
