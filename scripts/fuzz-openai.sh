#!/usr/bin/env bash
# Runs the OpenAI request-parser fuzz target (tests/scheduler/openai_request_fuzz.cc) under
# libFuzzer + AddressSanitizer with clang, outside the gcc build: the parser and its two common
# sources are compiled straight into the fuzzer. Needs clang-14 (Debian) and a configured build dir
# (for generated headers). Usage: scripts/fuzz-openai.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
build=${2:-build}
work=$(mktemp -d /tmp/strata-fuzz.XXXXXX)
clang++-14 -std=c++20 -O1 -g -fsanitize=fuzzer,address -I. -I"$build" \
  tests/scheduler/openai_request_fuzz.cc scheduler/http/openai_protocol.cc common/strings.cc \
  common/status.cc -o "$work/fuzzer" \
  $(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format)
mkdir -p "$work/corpus"
cp tests/scheduler/fuzz_corpus/* "$work/corpus/"
"$work/fuzzer" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 "$work/corpus"
echo "corpus and any crash inputs: $work"
