#!/usr/bin/env bash
# Installs what is missing, builds Strata and runs its tests. This is what CI runs.
#
#   scripts/test.sh                          # unit + integration tests (gpu/rdma ones when hardware exists)
#   scripts/test.sh --label=unit             # only one label (repeatable)
#   scripts/test.sh --sanitize=address,undefined   # in build-asan/ ; --sanitize=thread in build-tsan/
#   scripts/test.sh --no-deps -- -R config   # skip apt; pass the rest to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
build_dir=""
labels=()
deps=1
ctest_args=()
while (($#)); do
  case "$1" in
    --sanitize=*) sanitize="${1#*=}" ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --label=*) labels+=("${1#*=}") ;;
    --no-deps) deps=0 ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [[ -z "$build_dir" ]]; then
  case "$sanitize" in
    "") build_dir=build ;;
    thread) build_dir=build-tsan ;;
    *) build_dir=build-asan ;;
  esac
fi

if ((deps)); then
  if [[ $(id -u) -eq 0 ]] || command -v sudo >/dev/null; then
    bash scripts/install-deps.sh
  else
    echo "test.sh: not root and no sudo; assuming dependencies are installed" >&2
  fi
fi

# Share the compiler cache between checkouts (CI builds a fresh clone).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_SANITIZE="$sanitize"
cmake --build "$build_dir" -j "$(nproc)"

# Hardware labels run only where the hardware is.
exclude=()
if ! nvidia-smi -L >/dev/null 2>&1; then exclude+=(gpu); fi
if [[ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]]; then exclude+=(rdma); fi

args=(--test-dir "$build_dir" --output-on-failure -j "$(nproc)")
if ((${#labels[@]})); then args+=(-L "^($(IFS='|'; echo "${labels[*]}"))\$"); fi
if ((${#exclude[@]})); then
  args+=(-LE "^($(IFS='|'; echo "${exclude[*]}"))\$")
  echo "test.sh: not running labels without hardware here: ${exclude[*]}"
fi

case "$sanitize" in
  # OpenBLAS synchronizes its own thread pool in ways TSan cannot see: run it single-threaded.
  thread) export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" OPENBLAS_NUM_THREADS=1 ;;
  "") ;;
  *) export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" ;;
esac

ctest "${args[@]}" "${ctest_args[@]}"
