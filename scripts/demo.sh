#!/usr/bin/env bash
# The main job: installs what is missing, builds Strata, starts a whole local cluster with one
# command (`strata up`: a cache server, the scheduler and its OpenAI API, a prefill and a decode
# worker, on the cpu backend and a random-weight small-v3 model made on first run), then shows
# what it is for:
#   1. a multi-turn chat through the HTTP API: each answer streams, with its TTFT and how much of
#      the prompt was already cached (turn 2 on: most of it, and a much lower TTFT);
#   2. an offline batch sharing one system prompt, with its cache hit ratio;
#   3. the cache tiers, through the admin API.
# The weights are random, so the words are noise; the serving path is real.
# Options: --keep leaves the cluster running at the end (until Ctrl-C). STRATA_BUILD_DIR picks the
# build directory (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then bash scripts/install-deps.sh; fi
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
keep=0; [[ ${1:-} == --keep ]] && keep=1
build=${STRATA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target strata
strata=$build/cli/strata
run=$(mktemp -d /tmp/strata-demo.XXXXXX)
up_pid=
cleanup() {
  if [[ -n $up_pid ]]; then kill -TERM "$up_pid" 2>/dev/null; wait "$up_pid" 2>/dev/null || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
step() { echo; echo "== $*"; }

step "strata up: the whole cluster from deploy/local/cluster.yaml (logs in strata-run/logs/)"
# Port 8000 may be taken on a shared machine: any free port, printed below.
$strata up --config deploy/local/cluster.yaml --set up.http_port=0 --ready-file "$run/ready" &
up_pid=$!
for _ in $(seq 600); do [[ -s $run/ready ]] && break; kill -0 "$up_pid" || exit 1; sleep 0.2; done
[[ -s $run/ready ]] || { echo "strata up did not become ready" >&2; exit 1; }
url=$(sed -n 's/.*url=\([^ ]*\).*/\1/p' "$run/ready")
config=$(sed -n 's/.*config=\([^ ]*\).*/\1/p' "$run/ready")
model=$(sed -n 's/.*model=\([^ ]*\).*/\1/p' "$run/ready")

step "a multi-turn chat through the OpenAI API (each turn sends the whole conversation)"
policy='answer in one short paragraph, cite the documentation, never recompute a cached prefix.'
system="You are the support assistant of Strata, a serving system that keeps the KV cache of every \
conversation in a tiered store of GPU, DRAM and SSD. $(for i in $(seq 40); do
  printf 'Policy %d: %s ' "$i" "$policy"; done)"
$strata chat --url "$url" --system "$system" --max-tokens 32 --cache-salt "demo-$$" \
  --say "What does the cache server store?" \
  --say "And how does the scheduler use it?" \
  --say "Thanks. One last question: what survives a restart?"

step "an offline batch: 40 requests sharing one system prompt (strata batch)"
for i in $(seq 40); do
  printf '{"custom_id":"q-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"%s","max_tokens":8,"cache_salt":"batch-%d","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question %d about the tiers."}]}}\n' \
    "$i" "$model" "$$" "$system" "$i"
done > "$run/batch.jsonl"
$strata batch --input "$run/batch.jsonl" --output "$run/batch.out.jsonl" --url "$url" \
  --concurrency 4 --progress lines --summary-json "$run/batch.summary.json"
echo "batch output: $(wc -l < "$run/batch.out.jsonl") lines in the OpenAI batch format"

step "the cache tiers (strata admin cache stats)"
$strata admin cache --config "$config" stats
$strata admin scheduler --config "$config" nodes

echo
if [[ $keep == 1 ]]; then
  echo "The cluster keeps running until Ctrl-C; try: $strata chat --url $url"
  wait "$up_pid"
else
  echo "Done; stopping the cluster. Run it yourself with: $strata up   (then: $strata chat)"
fi
